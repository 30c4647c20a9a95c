"""Elementwise ops on tpu vs CPU: forward, gradients, dtypes and edge cases."""
import math

import pytest
import torch
import torch.nn.functional as F

from utils import check, check_error, run_cases

torch.manual_seed(0)

NAN, INF = float("nan"), float("inf")


def rand(*shape, lo=-2.0, hi=2.0, dtype=torch.float32, grad=False):
    t = (torch.rand(shape, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    return t.requires_grad_(grad)


# name -> (fn, domain (lo, hi)); every op is checked with gradients in f32, forward in f64,
# bf16, on 0-d and empty tensors, and on int64 inputs where PyTorch allows them.
ANY, POS, UNIT, GE1 = (-2.0, 2.0), (0.1, 3.0), (-0.9, 0.9), (1.1, 3.0)
UNARY = {
    "exp": (torch.exp, ANY), "exp2": (torch.exp2, ANY), "expm1": (torch.expm1, ANY),
    "log": (torch.log, POS), "log2": (torch.log2, POS), "log10": (torch.log10, POS),
    "log1p": (torch.log1p, POS), "sqrt": (torch.sqrt, POS), "rsqrt": (torch.rsqrt, POS),
    "reciprocal": (torch.reciprocal, POS), "abs": (torch.abs, ANY), "neg": (torch.neg, ANY),
    "sign": (torch.sign, ANY), "sgn": (torch.sgn, ANY), "floor": (torch.floor, ANY),
    "ceil": (torch.ceil, ANY), "round": (torch.round, ANY), "trunc": (torch.trunc, ANY),
    "frac": (torch.frac, ANY), "sin": (torch.sin, ANY), "cos": (torch.cos, ANY), "tan": (torch.tan, UNIT),
    "asin": (torch.asin, UNIT), "acos": (torch.acos, UNIT), "atan": (torch.atan, ANY),
    "sinh": (torch.sinh, ANY), "cosh": (torch.cosh, ANY), "tanh": (torch.tanh, ANY),
    "asinh": (torch.asinh, ANY), "acosh": (torch.acosh, GE1), "atanh": (torch.atanh, UNIT),
    "erf": (torch.erf, ANY), "erfc": (torch.erfc, ANY), "erfinv": (torch.erfinv, UNIT),
    "lgamma": (torch.lgamma, POS), "digamma": (torch.digamma, POS),
    "sigmoid": (torch.sigmoid, ANY), "logit": (torch.logit, (0.05, 0.95)),
    "logit_eps": (lambda x: torch.logit(x, eps=0.2), (0.05, 0.95)),
    "relu": (torch.relu, ANY), "gelu": (F.gelu, ANY), "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), ANY),
    "silu": (F.silu, ANY), "softplus": (F.softplus, ANY), "logsigmoid": (lambda x: F.logsigmoid(x * 8), ANY),
    "softplus_beta": (lambda x: F.softplus(x, beta=2.0, threshold=1.5), ANY),
    "mish": (F.mish, ANY), "hardtanh": (F.hardtanh, ANY),
    "hardtanh_args": (lambda x: F.hardtanh(x, -0.5, 0.7), ANY),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), ANY), "elu": (F.elu, ANY),
    "elu_args": (lambda x: torch.ops.aten.elu(x, 0.7, 1.3, 0.9), ANY), "selu": (F.selu, ANY),
    "celu": (lambda x: F.celu(x, 0.6), ANY),
    "hardswish": (F.hardswish, (-4.0, 4.0)), "hardsigmoid": (F.hardsigmoid, (-4.0, 4.0)),
    "threshold": (lambda x: F.threshold(x, 0.1, 2.0), ANY),
    "clamp": (lambda x: x.clamp(-0.5, 0.5), ANY), "clamp_min": (lambda x: x.clamp(min=0.3), ANY),
    "clamp_max": (lambda x: x.clamp(max=0.3), ANY), "clamp_min_op": (lambda x: torch.clamp_min(x, -0.1), ANY),
    "clamp_max_op": (lambda x: torch.clamp_max(x, -0.1), ANY),
    "round_dec": (lambda x: torch.round(x * 10, decimals=2), ANY),
    "round_negdec": (lambda x: torch.round(x * 100, decimals=-1), ANY),
    "pow_scalar": (lambda x: x.pow(2.5), POS), "pow_2": (lambda x: x.pow(2), ANY),
    "pow_neg": (lambda x: x ** -1.5, POS), "rpow": (lambda x: 2.0 ** x, ANY), "rpow_int": (lambda x: 3 ** x, ANY),
    "remainder_s": (lambda x: x.remainder(0.7), ANY), "fmod_s": (lambda x: x.fmod(-0.7), ANY),
    "rsub_s": (lambda x: 2.0 - x, ANY), "rsub_alpha": (lambda x: torch.rsub(x, 2.0, alpha=3), ANY),
    "mul_s": (lambda x: x * 3, ANY), "div_s": (lambda x: x / 3, ANY), "add_s": (lambda x: torch.ops.aten.add.Scalar(x, 1.5), ANY),
    "nan_to_num": (torch.nan_to_num, ANY), "square": (torch.square, ANY),
}
# Ops PyTorch rejects on integer inputs (or that are float-only by definition).
INT_OK = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "abs", "neg",
          "sign", "sgn", "floor", "ceil", "round", "trunc", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
          "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "lgamma", "digamma", "sigmoid",
          "logit", "relu", "clamp", "clamp_min", "clamp_max", "clamp_min_op", "clamp_max_op", "pow_2",
          "rpow", "rpow_int", "remainder_s", "fmod_s", "rsub_s", "rsub_alpha", "mul_s", "div_s", "add_s",
          "nan_to_num", "square", "pow_scalar", "pow_neg", "threshold"}
# bf16 tolerance: one bf16 ulp is 2**-8 relative.
# bfloat16 results (and reductions of them, test_reduction) against CPU's, which compute some
# ops or sums in bfloat16 steps: measured one bfloat16 step apart at most (1.6e-2 on sums of
# size ~2), 0.23 of this tolerance.
BF16 = dict(rtol=2e-2, atol=2e-2)


def chunks(names, n):
    names = sorted(names)
    return [names[i:i + n] for i in range(0, len(names), n)]


def int_input(name, lo, hi):
    if name in ("log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "lgamma", "digamma", "acosh",
                "pow_scalar", "pow_neg"):
        return torch.randint(1, 4, (6,))
    if name in ("asin", "acos", "atanh", "erfinv", "tan", "logit"):
        return torch.tensor([0, 0, 0, 0])
    return torch.randint(int(math.ceil(lo)), int(math.floor(hi)) + 1, (6,))


UNARY_CHUNKS = chunks(UNARY, 12)


@pytest.mark.parametrize("chunk", range(len(UNARY_CHUNKS)))
def test_unary_grad(mode, chunk):
    """Forward and gradient in f32, every mode; the ops of a chunk share one fused graph."""
    cases = []
    for name in UNARY_CHUNKS[chunk]:
        fn, (lo, hi) = UNARY[name]
        cases.append((name, fn, [rand(3, 4, lo=lo, hi=hi, grad=True)], None))
    run_cases(cases, grad=True)


SPECIAL = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 0.5, -0.5, 3.5, 1e-30, 1e30])
NO_SPECIAL = {"gelu", "lgamma", "digamma", "erfinv", "pow_neg", "logit_eps"}


@pytest.mark.parametrize("chunk", range(len(UNARY_CHUNKS)))
@pytest.mark.modes("fused")
def test_unary_dtypes(mode, chunk):
    """f64, bf16, 0-d, empty, integer inputs and NaN/inf/signed zeros/halfway values."""
    cases = []
    for name in UNARY_CHUNKS[chunk]:
        fn, (lo, hi) = UNARY[name]
        cases += [(name + "/f64", fn, [rand(5, lo=lo, hi=hi, dtype=torch.float64)], dict(rtol=1e-7, atol=1e-7)),
                  (name + "/bf16", fn, [rand(2, 3, lo=lo, hi=hi, dtype=torch.bfloat16)], BF16),
                  (name + "/0d", fn, [rand(lo=lo, hi=hi)], None),
                  (name + "/empty", fn, [torch.empty(0, 3)], None)]
        if name in INT_OK:
            cases.append((name + "/int", fn, [int_input(name, lo, hi)], dict(rtol=1e-6, atol=1e-6)))
        if name not in NO_SPECIAL:
            cases.append((name + "/special", fn, [SPECIAL.clone()], None))
    run_cases(cases)


def test_nan_to_num_args(mode):
    x = torch.tensor([NAN, INF, -INF, 1.0])
    check(lambda x: torch.nan_to_num(x, nan=1.5, posinf=7.0, neginf=-3.0), x)
    check(torch.nan_to_num, x.to(torch.bfloat16))
    check(torch.nan_to_num, x.to(torch.float16))
    check(torch.nan_to_num, x.double())


def test_isnan_family(mode):
    x = torch.tensor([NAN, INF, -INF, 0.0, 1.0])
    for fn in (torch.isnan, torch.isinf, torch.isfinite, torch.isposinf, torch.isneginf):
        check(fn, x)
        check(fn, x.to(torch.bfloat16))
        check(fn, torch.arange(3))
        check(fn, torch.tensor([True, False]))


# Binary ops with gradients: name -> (fn, domain of the second operand)
BINARY = {
    "add": (torch.add, ANY), "add_alpha": (lambda a, b: torch.add(a, b, alpha=0.5), ANY),
    "sub": (torch.sub, ANY), "sub_alpha": (lambda a, b: torch.sub(a, b, alpha=2), ANY),
    "rsub": (torch.rsub, ANY), "rsub_alpha": (lambda a, b: torch.rsub(a, b, alpha=3), ANY),
    "mul": (torch.mul, ANY), "div": (torch.div, POS),
    "div_floor": (lambda a, b: torch.div(a, b, rounding_mode="floor"), POS),
    "div_trunc": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), POS),
    "pow": (lambda a, b: a.abs().add(0.1).pow(b), ANY), "atan2": (torch.atan2, ANY),
    "maximum": (torch.maximum, ANY), "minimum": (torch.minimum, ANY),
    "fmax": (torch.fmax, ANY), "fmin": (torch.fmin, ANY),
    "max_other": (torch.max, ANY), "min_other": (torch.min, ANY),
    "remainder": (torch.remainder, POS), "remainder_neg": (lambda a, b: torch.remainder(a, -b), POS),
    "fmod": (torch.fmod, POS), "fmod_neg": (lambda a, b: torch.fmod(a, -b), POS),
    "lerp": (lambda a, b: torch.lerp(a, b, 0.3), ANY), "lerp_hi": (lambda a, b: torch.lerp(a, b, 0.8), ANY),
        "clamp_tensor": (lambda a, b: a.clamp(b - 1, b + 1), ANY),
    "clamp_min_tensor": (lambda a, b: a.clamp(min=b), ANY), "clamp_max_tensor": (lambda a, b: a.clamp(max=b), ANY),
    "where": (lambda a, b: torch.where(a > 0, a, b), ANY),
    "logaddexp": (lambda a, b: torch.logaddexp(a * 5, b), ANY), "logaddexp2": (torch.logaddexp2, ANY),
}
INT_BINARY = {"add", "sub", "sub_alpha", "rsub", "rsub_alpha", "mul", "div", "div_floor", "div_trunc",
              "maximum", "minimum", "fmax", "fmin", "max_other", "min_other", "remainder", "remainder_neg",
              "fmod", "fmod_neg", "clamp_tensor", "clamp_min_tensor", "clamp_max_tensor", "where", "atan2"}


BINARY_CHUNKS = chunks(BINARY, 10)


@pytest.mark.parametrize("chunk", range(len(BINARY_CHUNKS)))
def test_binary_grad(mode, chunk):
    cases = []
    for name in BINARY_CHUNKS[chunk]:
        fn, (lo, hi) = BINARY[name]
        cases.append((name, fn, [rand(3, 4, grad=True), rand(3, 4, lo=lo, hi=hi, grad=True)], None))
    # masked_fill (owned elsewhere) is used by the backward of maximum/atan2/clamp/pow.
    run_cases(cases, grad=True, allow={"aten::masked_fill_.Scalar"})


@pytest.mark.parametrize("chunk", range(len(BINARY_CHUNKS)))
@pytest.mark.modes("fused")
def test_binary_dtypes(mode, chunk):
    """Broadcasting, 0-d operands, mixed dtypes, bf16, empty and integer operands."""
    cases = []
    for name in BINARY_CHUNKS[chunk]:
        fn, (lo, hi) = BINARY[name]
        f64 = torch.float64 if not name.startswith("lerp") else torch.float32
        cases += [(name + "/bcast", fn, [rand(2, 1, 3, dtype=f64), rand(4, 1, lo=lo, hi=hi)], dict(rtol=1e-6, atol=1e-6)),
                  (name + "/0d", fn, [rand(2, 3), rand(lo=lo, hi=hi, dtype=f64)], None),
                  (name + "/bf16", fn, [rand(2, 3, dtype=torch.bfloat16), rand(2, 3, lo=lo, hi=hi, dtype=torch.bfloat16)], BF16),
                  (name + "/empty", fn, [torch.empty(0, 3), rand(3, lo=lo, hi=hi)], None)]
        if name in INT_BINARY:
            lo_i = 1 if lo > 0 else -5
            ia, ib = torch.randint(-7, 8, (12,)), torch.randint(lo_i, 6, (12,))
            if lo <= 0 and name.startswith(("div", "remainder", "fmod")):
                ib[ib == 0] = 1
            cases += [(name + "/int", fn, [ia, ib], None), (name + "/i32i8", fn, [ia.int(), ib.to(torch.int8)], None),
                      (name + "/int-float", fn, [ia, rand(12, lo=lo, hi=hi)], None),
                      (name + "/float-0d-int", fn, [rand(12), torch.tensor(2)], None)]
    run_cases(cases)


def test_binary_special_values(mode):
    a = SPECIAL.clone()
    b = SPECIAL.flip(0).clone()
    for fn in (torch.maximum, torch.minimum, torch.fmax, torch.fmin, torch.atan2, torch.remainder, torch.fmod,
               torch.pow, torch.add, torch.mul, torch.div, torch.logaddexp, torch.logaddexp2):
        check(fn, a, b)


def test_mul_by_bool_keeps_nan_inf_and_sign(mode):
    # x * mask is x * 1.0 or x * 0.0: inf * False is NaN, NaN stays NaN (XLA's simplifier would
    # make it a select giving 0). amax's backward, grad / count * mask, relies on it.
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), -1.0, 2.0, float("inf")])
    mask = torch.tensor([False, False, False, False, True, True])
    check(lambda x, m: (x * m, m * x, x * m.to(torch.float64), torch.mul(x, m[0])), x, mask)


def test_int_pow(mode):
    base = torch.tensor([-3, -2, -1, 0, 1, 2, 3, 4])
    exp = torch.tensor([3, 2, -3, 2, -5, 5, -1, 0])
    check(torch.pow, base, exp)
    check(lambda b: b ** 3, base)
    check(lambda b: b.pow(2), base.to(torch.int8))
    check(lambda e: 2 ** e, exp.clamp(min=0))
    check(lambda b: b ** 2.0, base)  # int tensor ** float -> float


def test_uint8_pow_wraps_like_cpu(mode):
    # CPU converts the exponent to uint8 (-1 is 255) and wraps mod 256: 5 ** 255 = 205.
    base = torch.tensor([5, 4, 3, 255, 0, 1, 2, 7], dtype=torch.uint8)
    check(torch.pow, base, torch.tensor(-1, dtype=torch.int8))
    check(torch.pow, base, torch.tensor([255, 3, 200, 7, 0, 9, 8, 129], dtype=torch.uint8))
    check(lambda b: b ** 3, base)


@pytest.mark.parametrize("case", [
    "float - bool", "bool - float", "bool - int", "float - True", "bool - True", "rsub(bool, 1.0)",
    "rsub(float, True)", "sub(alpha=True)", "add(alpha=True)", "int ** -1", "bool ** -1", "int8 ** -2"])
def test_refused_arithmetic_raises_like_cpu(mode, case):
    f, b, i = torch.ones(3), torch.tensor([True, False, True]), torch.tensor([5, 4, -1])
    fn, args = {
        "float - bool": (lambda x, y: x - y, (f, b)),
        "bool - float": (lambda x, y: x - y, (b, f)),
        "bool - int": (lambda x: x - 1, (b,)),
        "float - True": (lambda x: x - True, (f,)),
        "bool - True": (lambda x: x - True, (b,)),
        "rsub(bool, 1.0)": (lambda x: torch.rsub(x, 1.0), (b,)),
        "rsub(float, True)": (lambda x: torch.rsub(x, True), (f,)),
        "sub(alpha=True)": (lambda x: torch.sub(x, x, alpha=True), (f,)),
        "add(alpha=True)": (lambda x: torch.add(x, x, alpha=True), (f,)),
        "int ** -1": (lambda x: x ** -1, (i,)),
        "bool ** -1": (lambda x: x ** -1, (b,)),
        "int8 ** -2": (lambda x: x.pow(-2), (i.to(torch.int8),)),
    }[case]
    check_error(fn, *args)


def test_bool_alpha_and_negative_powers_still_compute_where_cpu_does(mode):
    b, i = torch.tensor([True, False, True]), torch.tensor([5, 1, -1, 2])
    check(lambda x: torch.add(x, x, alpha=True), b)
    check(lambda x: (x ** torch.tensor(-1), x ** -1.0, x - 1, x ** 0), i)


# Reduced-precision results with a float32 0-d tensor or a Python float: CPU converts the operand
# to the result dtype first (5.3241 becomes 5.3125 in bfloat16), then computes in float32; tpu
# used to compute with the unrounded operand (5.3241 // -2.6562 gave -3, CPU -2).
REDUCED_OPERAND_OPS = {
    "floor_divide": torch.floor_divide, "remainder": torch.remainder, "fmod": torch.fmod,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "pow": torch.pow, "atan2": torch.atan2, "logaddexp": torch.logaddexp, "xlogy": torch.xlogy,
    "hypot": torch.hypot,
}


@pytest.mark.parametrize("op", list(REDUCED_OPERAND_OPS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_operands_round_to_the_result_dtype_first(mode, op, dtype):
    fn = REDUCED_OPERAND_OPS[op]
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(16, generator=g) * 8 - 4).to(dtype)
    if op in ("pow", "xlogy"):
        x = x.abs() + 0.5
    wide = torch.tensor(2.0557768, dtype=torch.float32)  # 2.0625 in bfloat16, 2.0566 in float16
    # Exact for the rounding ops; 1e-3 (a quarter of a bfloat16 step) for the others, whose float32
    # results differ from CPU's in the last bits only.
    # xlogy: CPU's bfloat16/float16 kernel rounds log(y) before the product (one step, 1e-2).
    tol = dict(rtol=0, atol=0) if op in ("floor_divide", "remainder", "fmod", "div_floor", "div_trunc") else \
        dict(rtol=1e-2, atol=1e-2) if op == "xlogy" else dict(rtol=1e-3, atol=1e-3)
    check(lambda a, s: (fn(a, s), fn(s, a.abs() + 0.5 if op in ("pow", "xlogy") else a)), x, wide, **tol)
    if op not in ("atan2", "logaddexp", "hypot"):  # these take no Python number
        check(lambda a: fn(a, 2.0557768), x, **tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_reduced_precision_chain_rounds_each_op_as_eager(mode, dtype):
    # One graph in fused mode: XLA would keep the intermediates in float32 (excess precision)
    # and differ from CPU, which rounds every op's result; 1 of 16 pow results did.
    g = torch.Generator().manual_seed(2)
    x, y = [(torch.rand(4096, generator=g) * 6 - 3).to(dtype) for _ in range(2)]
    check(lambda x, y: ((x * 1.37 + 0.5).abs() + 0.25) * y - x / (y.abs() + 1), x, y, rtol=0, atol=0)


# Products consumed by an add or subtract (directly, negated, through rsub, after an activation),
# and reductions and matmuls of computed values. On a CPU with float16 FMA (avx512_fp16) XLA's LLVM
# backend fused a float16 product into the add and rounded once; XLA:CPU's YNNPACK fusions summed
# bfloat16 products unrounded. Eager rounds each op's result (docs/ARCHITECTURE.md, rounding).
PRODUCT_CHAINS = {
    "mul_add": lambda x, y, z: x * y + z,
    "sub_mul": lambda x, y, z: z - x * y,
    "neg_mul_add": lambda x, y, z: -(x * y) + z,
    "rsub": lambda x, y, z: torch.rsub(x * y, z),
    "mul_sub_mul": lambda x, y, z: x * y - y * z,
    "sigmoid": lambda x, y, z: torch.sigmoid(x) * y + z,
    "silu": lambda x, y, z: F.silu(x) * y - z,
    "tanh": lambda x, y, z: torch.tanh(x) * y + z,
    "gelu": lambda x, y, z: F.gelu(x * y + z) * z - x,
    "exp": lambda x, y, z: torch.exp(x) * y - z,
    "relu": lambda x, y, z: F.relu(x * y) - z * y,
    "mean_of_product": lambda x, y, z: (x * y).mean(-1),
    "scaled_matmul": lambda x, y, z: x @ y.T * 0.1 + z,
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_products_feeding_adds_and_reductions_round_as_eager(mode, dtype):
    g = torch.Generator().manual_seed(3)
    x, y, z = [(torch.rand(64, 64, generator=g) * 6 - 3).to(dtype) for _ in range(3)]
    differ = set()
    for name, fn in PRODUCT_CHAINS.items():
        if not torch.equal(fn(x.to("tpu"), y.to("tpu"), z.to("tpu")).cpu(), fn(x, y, z)):
            differ.add(name)
    assert differ == set()


def test_remainder_scalar_tensor(mode):
    check(lambda b: torch.remainder(5.5, b), rand(6, lo=0.5, hi=3.0))
    check(lambda b: torch.remainder(-7, b), torch.tensor([2, -3, 4, -5]))
    check(lambda b: torch.remainder(b, -3), torch.tensor([2, -3, 4, -5, 7]))


def test_lerp_tensor_weight(mode):
    a, b, w = rand(3, 4, grad=True), rand(3, 4, grad=True), rand(3, 4, lo=-0.5, hi=1.5, grad=True)
    check(torch.lerp, a, b, w, grad=True)
    check(torch.lerp, rand(2, 3, dtype=torch.bfloat16), rand(2, 3, dtype=torch.bfloat16), rand(3).bfloat16(), **BF16)
    check(torch.lerp, rand(2, 3, dtype=torch.float64), rand(3, dtype=torch.float64), rand(dtype=torch.float64))


def test_addcmul_addcdiv(mode):
    a, b, c = rand(3, 4, grad=True), rand(3, 4, grad=True), rand(3, 4, lo=0.5, hi=2.0, grad=True)
    check(lambda a, b, c: torch.addcmul(a, b, c, value=0.5), a, b, c, grad=True)
    check(lambda a, b, c: torch.addcdiv(a, b, c, value=-1.5), a, b, c, grad=True)
    check(lambda a, b, c: torch.addcmul(a, b, c), rand(3, 1), rand(4), rand(1, 4))
    check(lambda a, b, c: torch.addcmul(a, b, c, value=2), torch.arange(4), torch.arange(4), torch.arange(4))
    check(lambda a, b, c: torch.addcdiv(a, b, c), rand(2, 3, dtype=torch.bfloat16), rand(2, 3, dtype=torch.bfloat16),
          rand(2, 3, lo=0.5, hi=2.0, dtype=torch.bfloat16), **BF16)


def test_clamp_variants(mode):
    x = torch.tensor([NAN, -INF, INF, -1.0, 0.0, 2.0])
    check(lambda x: x.clamp(-0.5, 0.5), x)
    check(lambda x: x.clamp(0.5, -0.5), x)  # min > max -> max
    check(lambda x: x.clamp(min=torch.tensor(0.1, device=x.device)), x)
    check(lambda x: torch.clamp(x, torch.full((6,), -0.3, device=x.device), None), x)
    check(lambda x: x.clamp(-2, 3), torch.arange(-5, 5))
    check(lambda x: x.clamp(-2.5, 3.5), torch.arange(-5, 5))  # int tensor, float bounds -> float
    check(lambda x: x.clamp(1, 2), torch.arange(6, dtype=torch.uint8))
    check(lambda x, y: x.clamp(max=y), torch.arange(6), torch.tensor([3, 1, 4, 1, 5, 9]))


def test_hardtanh_leaky_relu_ints_and_inplace(mode):
    check(lambda x: F.relu(x), torch.arange(-3, 3))
    check(lambda x: F.relu(x, inplace=False), torch.arange(0, 5, dtype=torch.uint8))
    check(lambda x: F.hardtanh(x.clone(), inplace=True), rand(3, 4))
    check(lambda x: F.leaky_relu(x.clone(), 0.1, inplace=True), rand(3, 4))
    check(lambda x: F.elu(x.clone(), inplace=True), rand(3, 4))
    check(lambda x: torch.sigmoid(x).mul(2).tanh(), rand(3, 4, grad=True), grad=True)


COMPARE = [torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge]


@pytest.mark.modes("fused")
def test_compare():
    f = torch.tensor([NAN, -1.0, 0.0, 1.0, 1.5, 2.0])
    i = torch.tensor([-1, 0, 1, 1, 2, 2])
    b = torch.tensor([True, False, True, True, False, True])
    cases = []
    for op in COMPARE:
        n = op.__name__
        cases += [(n + "/f-i", op, [f, i], None), (n + "/i-i8", op, [i, i.flip(0).to(torch.int8)], None),
                  (n + "/i-1.5", lambda t, op=op: op(t, 1.5), [i], None), (n + "/i-1", lambda t, op=op: op(t, 1), [i], None),
                  (n + "/b-2", lambda t, op=op: op(t, 2), [b], None), (n + "/b-True", lambda t, op=op: op(t, True), [b], None),
                  (n + "/b-0.5", lambda t, op=op: op(t, 0.5), [b], None), (n + "/f-0d-int", op, [f, torch.tensor(1)], None),
                  (n + "/i-0d-float", op, [i, torch.tensor(1.5)], None),
                  (n + "/bf16-f16", op, [f.bfloat16(), f.half()], None),
                  (n + "/u8-neg", lambda t, op=op: op(t, -1), [torch.arange(6, dtype=torch.uint8)], None),
                  (n + "/bcast", op, [rand(2, 1, 3), rand(4, 1)], None)]
    run_cases(cases)


LOGICAL = [torch.logical_and, torch.logical_or, torch.logical_xor]
BITWISE = [torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor]


@pytest.mark.modes("fused")
def test_logical_bitwise():
    i = torch.tensor([-3, 0, 5, 12, 7, -1])
    j = torch.tensor([6, 0, -5, 10, 1, 0])
    b = torch.tensor([True, False, True, False, True, False])
    c = torch.tensor([True, True, False, False, True, False])
    cases = []
    for op in LOGICAL + BITWISE:
        n = op.__name__
        cases += [(n + "/bool", op, [b, c], None), (n + "/int", op, [i, j], None),
                  (n + "/u8-i16", op, [i.to(torch.uint8), j.to(torch.int16)], None),
                  (n + "/0d-first", lambda t, op=op: op(torch.tensor(6), t), [j], None),
                  (n + "/bcast", op, [i.reshape(2, 3), torch.tensor([1, 2, 4])], None)]
        if op in LOGICAL:
            cases.append((n + "/float", op, [torch.tensor([NAN, 0.0, 1.0]), torch.tensor([1.0, 0.0, 0.0])], None))
        else:
            cases += [(n + "/scalar", lambda t, op=op: op(t, 3), [i], None),
                      (n + "/bool-scalar", lambda t, op=op: op(t, True), [b], None)]
    run_cases(cases)


def test_bitwise_scalar_forms(mode):
    i = torch.tensor([-3, 0, 5, 12])
    run_cases([("and", lambda t: t & 6, [i], None), ("or", lambda t: t | 6, [i], None),
               ("xor", lambda t: t ^ 6, [i], None), ("rand", lambda t: 6 & t, [i], None),
               ("and-st", lambda t: torch.bitwise_and(5, t), [i], None), ("not", torch.bitwise_not, [i], None),
               ("not-u8", torch.bitwise_not, [i.to(torch.uint8)], None),
               ("not-bool", torch.bitwise_not, [torch.tensor([True, False])], None),
               ("lnot", torch.logical_not, [torch.tensor([NAN, 0.0, 2.0])], None)])



def test_gcd_lcm(mode):
    # Zeros, negatives, the narrow types' limits, and lcm products that overflow int8/int16
    # before the abs (CPU computes those in C++'s int and narrows the result).
    g = torch.Generator().manual_seed(5)
    cases = []
    for dt in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        lo = 0 if dt == torch.uint8 else -60
        a = torch.randint(lo, 60, (40,), generator=g).to(dt)
        b = torch.randint(lo, 60, (40,), generator=g).to(dt)
        a[:3], b[1:4] = 0, 0
        if dt == torch.int8:
            a[5], b[6] = -128, -128
        for op in (torch.gcd, torch.lcm):
            cases.append((f"{op.__name__}/{dt}", op, [a, b], None))
    x = torch.tensor([12, -18, 0, 7])
    cases += [("gcd/bcast", torch.gcd, [x, torch.tensor([[8], [3]])], None),
              ("lcm/0d", torch.lcm, [x, torch.tensor(4)], None),
              ("gcd_/in-place", lambda t: t.clone().gcd_(torch.full_like(t, 8)), [x], None)]
    run_cases(cases)


DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]


@pytest.mark.parametrize("src", DTYPES, ids=str)
@pytest.mark.modes("fused")
def test_to_dtype(mode, src):
    values = torch.tensor([0.0, 1.0, -1.0, 2.7, -2.7, 100.0, 0.5])
    if src.is_floating_point:
        x = values.to(src)
    else:
        x = values.clamp(min=0 if src in (torch.uint8, torch.bool) else -128).to(src)
    cases = []
    for dst in DTYPES:
        # float -> uint8 of negative values is undefined in C++ (PyTorch CPU wraps, XLA saturates).
        src_x = x.abs() if dst == torch.uint8 and src.is_floating_point else x
        cases.append((str(dst), lambda t, dst=dst: t.to(dst), [src_x], None))
    cases.append(("empty", lambda t: t.float(), [torch.empty(0, dtype=src)], None))
    run_cases(cases)


def test_python_scalar_promotion(mode):
    check(lambda t: t + 1.5, torch.arange(3))
    check(lambda t: t * 2.5, torch.tensor(1.0))


def test_hardsigmoid_backward_takes_a_sixth_in_float32(mode):
    # CPU multiplies by 1.0f / 6.0f in every dtype, so a float64 gradient is 0.1666666716...
    # (The forward's division by 6 may differ in the last bit: XLA multiplies by 1/6.)
    x = torch.tensor([-4.0, -3.0, -1.0, 0.5, 2.9, 3.0, float("nan")], dtype=torch.float64)
    g = torch.tensor([1.0, 2.0, 3.0, -1.0, 0.7, 5.0, 1.0], dtype=torch.float64)
    check(torch.ops.aten.hardsigmoid_backward, g, x, rtol=0, atol=0)
    check(torch.ops.aten.hardsigmoid_backward, g.float(), x.float(), rtol=0, atol=0)
