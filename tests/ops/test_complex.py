"""Complex dtypes on tpu vs CPU: transfer, printing, elementwise math, views, reductions,
matmul, type promotion and autograd (PyTorch's conjugate Wirtinger convention)."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from utils import assert_close, crand, rrand, run_cases, to_tpu, total

# XLA's complex functions and PyTorch's (std::complex / Sleef) agree to about 4e-7 relative
# on these inputs (measured: largest 3.5e-7, pow); 1e-5 leaves a wide margin.
TOL = dict(rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Storage, transfer, printing


def test_transfer_round_trip(mode):
    x = crand(3, 5)
    t = x.to("tpu")
    assert t.dtype == torch.complex64 and t.device.type == "tpu"
    assert torch.equal(t.cpu(), x)
    assert torch.equal(x.t().to("tpu").cpu(), x.t())  # non-contiguous source
    assert torch.equal(x.conj().to("tpu").cpu(), x.conj())  # a conj-bit CPU tensor arrives resolved
    assert torch.equal(torch.tensor([1 + 2j, -3j], device="tpu").cpu(), torch.tensor([1 + 2j, -3j]))
    assert t[1, 2].item() == x[1, 2].item() and isinstance(t[1, 2].item(), complex)
    back = torch.from_dlpack(t.cpu())  # the host copy is an ordinary complex tensor
    assert back.dtype == torch.complex64


def test_complex128_round_trip(mode):
    x = crand(4, dtype=torch.complex128)
    t = x.to("tpu")
    assert torch.equal(t.cpu(), x)
    assert torch.equal((t * 2).cpu(), x * 2)
    assert_close(t.to(torch.complex64), x.to(torch.complex64))


def test_printing(mode):
    x = torch.tensor([1.5 - 2j, 0.25j])
    text = repr(x.to("tpu"))
    assert text == repr(x).replace(")", ", device='tpu:0')")


def test_zeros_full_and_casts(mode):
    assert torch.equal(torch.full((2,), 1 - 2j, device="tpu").cpu(), torch.full((2,), 1 - 2j))
    assert torch.equal(torch.ones(3, dtype=torch.complex64, device="tpu").cpu(), torch.ones(3, dtype=torch.complex64))
    x = crand(6)
    cases = [("to_f32", lambda z: z.real.to(torch.complex64) + z.to(torch.float32), [x]),  # complex -> real keeps the real part
             ("to_bool", lambda z: (z * torch.tensor([0, 1, 1j, 0, 1, 0], device=z.device)).to(torch.bool), [x]),
             ("to_int", lambda z: (z * 3).to(torch.int64), [x]),
             ("from_int", lambda i: i.to(torch.complex64), [torch.arange(-3, 3)]),
             ("from_bf16", lambda r: r.to(torch.bfloat16).to(torch.complex64), [rrand(5)]),
             ("c64_c128", lambda z: z.to(torch.complex128).to(torch.complex64) * 2, [x])]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Casting complex values to real discards the imaginary part"
        run_cases(cases)


# ---------------------------------------------------------------------------------------
# Elementwise math, forward and backward

UNARY = {
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log, "log2": torch.log2,
    "log10": torch.log10, "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh,
    "atan": torch.atan, "asin": torch.asin, "acos": torch.acos, "sinh": torch.sinh, "cosh": torch.cosh,
    "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "sigmoid": torch.sigmoid,
    "abs": torch.abs, "neg": torch.neg, "sgn": torch.sgn, "angle": torch.angle, "conj": lambda z: z.conj() * 1,
    "conj_physical": torch.conj_physical, "resolve_conj": lambda z: z.conj().resolve_conj(),
    "real_imag": lambda z: z.real * 2 + z.imag, "square": torch.square, "pow_int": lambda z: z ** 3,
    "pow_float": lambda z: z.pow(0.7), "pow_complex": lambda z: z ** (0.5 - 0.25j), "rpow": lambda z: 2 ** z,
    "mul_complex": lambda z: z * (1 - 2j), "add_complex": lambda z: (2j + z) - 1j, "div_real": lambda z: z / 3,
    "rsub": lambda z: 1j - z,
}


def unary_chunks(n=13):
    names = sorted(UNARY)
    return [names[i:i + n] for i in range(0, len(names), n)]


@pytest.mark.parametrize("chunk", range(len(unary_chunks())))
def test_unary_grad(mode, chunk):
    run_cases([(name, UNARY[name], [crand(3, 4, grad=True, seed=i)]) for i, name in enumerate(unary_chunks()[chunk])],
              grad=True)


def test_branch_cuts_keep_the_sign_of_zero(mode):
    """C99 (and PyTorch) put a zero part's sign on the branch cut: sqrt(-4 - 0j) = -2j."""
    parts = [0.0, -0.0, 2.0, -2.0, 0.5, -0.5]
    z = torch.tensor([complex(a, b) for a in parts for b in parts], dtype=torch.complex64)
    names = ["sqrt", "asin", "acos", "acosh", "asinh", "atanh", "atan", "log", "log2", "log10", "rsqrt"]
    # Parts compared separately: results with an infinite part (log(0)) keep a finite other part.
    run_cases([(n, lambda x, f=getattr(torch, n): torch.view_as_real(f(x)), [z]) for n in names])


def test_binary_grad(mode):
    a, b, r = crand(3, 4, grad=True, seed=1), crand(3, 4, grad=True, seed=2), rrand(3, 4, grad=True)
    run_cases([
        ("add", lambda x, y: torch.add(x, y, alpha=2 - 1j), [a, b]),
        ("sub", lambda x, y: x - y, [a, b]),
        ("mul", lambda x, y: x * y, [a, b]),
        ("div", lambda x, y: x / y, [a, b]),
        ("pow", lambda x, y: x ** y, [a, b]),
        ("mixed_real", lambda x, y: x * y + y / x, [a, r]),
        ("addcmul", lambda x, y, w: torch.addcmul(x, y, w, value=0.5), [a, b, r]),
        ("addcdiv", lambda x, y, w: torch.addcdiv(x, y, w + 3), [a, b, r]),
        ("where", lambda x, y, w: torch.where(w > 0, x, y), [a, b, r]),
        ("complex", lambda re, im: torch.complex(re, im * 2), [r, rrand(3, 4, grad=True, seed=3)]),
        ("polar", lambda m, phi: torch.polar(m.abs() + 0.1, phi), [r, rrand(3, 4, grad=True, seed=4)]),
    ], grad=True)


def test_comparisons_and_tests(mode):
    a = crand(8)
    b = a.clone()
    b[::2] += 1j
    special = torch.tensor([complex("nan"), complex(float("inf"), 1), complex(1, float("-inf")), 1 + 1j])
    run_cases([("eq", torch.eq, [a, b]), ("ne", torch.ne, [a, b]), ("eq_scalar", lambda x: x == 1 + 1j, [special]),
               ("isnan", torch.isnan, [special]), ("isinf", torch.isinf, [special]),
               ("isfinite", torch.isfinite, [special]), ("logical", torch.logical_and, [a, b * 0]),
               ("logical_not", torch.logical_not, [special * 0]),
               ("silu", F.silu, [a])])  # PyTorch has no complex autograd for silu


# ---------------------------------------------------------------------------------------
# Views between real and complex


def test_views_grad(mode):
    z, r = crand(3, 4, grad=True), rrand(3, 4, 2, grad=True)
    run_cases([
        ("view_as_real", lambda x: torch.view_as_real(x) ** 2, [z]),
        ("view_as_complex", lambda x: torch.view_as_complex(x) * (1 + 1j), [r]),
        ("real_imag_slices", lambda x: x.real[:, 1:] * x.imag[:, :-1], [z]),
        ("round_trip", lambda x: torch.view_as_complex(torch.view_as_real(x).flip(-1)), [z]),
    ], grad=True)


def test_writing_through_real_and_imag_views(mode):
    def write(z):
        z = z.clone()
        z.real.mul_(2)  # functionalization scatters these back through view_as_real
        z.imag[1:] = -1.0
        torch.view_as_real(z)[0, 1] = 7.0
        return z
    run_cases([("write", write, [crand(4)])])


# ---------------------------------------------------------------------------------------
# Reductions, matmul, shape and indexing


def test_reductions_grad(mode):
    z = crand(3, 4, grad=True, lo=-1, hi=1)
    run_cases([("sum", lambda x: x.sum(0), [z]), ("mean", lambda x: x.mean(), [z]), ("prod", lambda x: x.prod(1), [z]),
               ("var", lambda x: x.var(1), [z]), ("std", lambda x: x.std(), [z]),
               ("norm", lambda x: torch.linalg.vector_norm(x, dim=1), [z]), ("norm1", lambda x: x.norm(p=1), [z]),
               ("cumsum", lambda x: x.cumsum(1), [z]), ("cumprod", lambda x: x.cumprod(0), [z])], grad=True)
    run_cases([("any", lambda x: (x * torch.tensor([0, 1, 0, 0], device=x.device)).any(1), [crand(3, 4)]),
               ("all", lambda x: x.all(), [crand(3, 4)])])


def test_matmul_grad(mode):
    a, b, c = crand(2, 3, 4, grad=True, seed=1), crand(2, 4, 5, grad=True, seed=2), crand(3, 5, grad=True, seed=3)
    v, w = crand(4, grad=True, seed=4), crand(4, grad=True, seed=5)
    run_cases([("mm", lambda x, y: x[0] @ y[0], [a, b]), ("bmm", torch.bmm, [a, b]),
               ("addmm", lambda s, x, y: torch.addmm(s, x[1], y[1], beta=0.5j, alpha=2 - 1j), [c, a, b]),
               ("mv", lambda x, y: x[0] @ y, [a, v]), ("dot", torch.dot, [v, w]), ("vdot", torch.vdot, [v, w]),
               ("einsum", lambda x, y: torch.einsum("bij,bjk->ik", x, y), [a, b]),
               ("hermitian", lambda x: x[0] @ x[0].mH, [a])], grad=True)


def test_shape_and_indexing(mode):
    z = crand(3, 4, grad=True)
    idx = torch.tensor([2, 0, 2])
    run_cases([("cat", lambda x: torch.cat([x, x * 1j]), [z]), ("stack", lambda x: torch.stack([x, x.conj()]), [z]),
               ("transpose", lambda x: x.t() * 1, [z]), ("flip_roll", lambda x: x.flip(0).roll(1, 1), [z]),
               ("index", lambda x: x[idx], [z]), ("gather", lambda x: x.gather(1, torch.tensor([[0], [3], [1]], device=x.device)), [z]),
               ("index_put", lambda x: x.index_put((idx,), torch.tensor(2j), accumulate=True), [z]),
               ("masked_fill", lambda x: x.masked_fill(x.real > 0, 1 - 1j), [z]),
               ("tril", lambda x: x.tril(), [z]), ("pad", lambda x: F.pad(x, (1, 2)), [z]),
               ("scatter_add", lambda x: x.scatter_add(0, torch.zeros(1, 4, dtype=torch.long, device=x.device), x[:1] * 2), [z])],
              grad=True)


# ---------------------------------------------------------------------------------------
# Type promotion (PyTorch's rules, checked by dtype and value against CPU)


def test_type_promotion(mode):
    z, r = crand(4), rrand(4)
    run_cases([
        ("c64+f64", lambda x, y: x + y, [z, r.double()]),  # complex128
        ("c64+c128_0d", lambda x, y: x + y, [z, torch.tensor(1 + 1j, dtype=torch.complex128)]),  # complex64
        ("f32+c128_0d", lambda y, x: y + x, [r, torch.tensor(2j, dtype=torch.complex128)]),  # complex64
        ("f32*1j", lambda y: y * 1j, [r]),
        ("int*complex", lambda i: i * (1 + 1j), [torch.arange(4)]),
        ("bool*complex", lambda b: b * 2j, [torch.tensor([True, False, True, False])]),
        ("c64+f16", lambda x, y: x + y, [z, r.half()]),
        ("c128+f32", lambda x, y: x + y, [z.to(torch.complex128), r]),
        ("eq_mixed", lambda x, y: x == y, [z, r]),
    ])


# ---------------------------------------------------------------------------------------
# What tpu does not lower runs on CPU (same result or same error); never in the wrong dtype


def test_ops_without_complex_lowering_match_cpu():
    z = crand(5)
    with pytest.warns(UserWarning, match="runs on CPU"):
        # torch.randn with a complex dtype draws both parts; no lowering covers it, so CPU does
        out = torch.randn(3, dtype=torch.complex64, device="tpu")
    assert out.dtype == torch.complex64 and out.device.type == "tpu"
    for fn in (torch.max, lambda x: x < x, torch.sort, torch.floor, lambda x: x.clamp(0, 1), torch.erf):
        with pytest.raises(Exception) as cpu_error:
            fn(z)
        with pytest.raises(type(cpu_error.value)) as tpu_error:
            fn(z.to("tpu"))
        assert str(tpu_error.value) == str(cpu_error.value)


def test_compiled_complex_function():
    def f(x, y):
        return (x * y.conj()).exp().sum(), torch.view_as_real(x @ y.mT)
    x, y = crand(3, 4, grad=True, seed=1), crand(3, 4, grad=True, seed=2)
    compiled = torch.compile(f, backend="tpu")
    tx, ty = to_tpu(x), to_tpu(y)
    actual, expected = compiled(tx, ty), f(x, y)
    assert_close(actual, expected, **TOL)
    total(actual).backward()
    total(expected).backward()
    assert_close(tx.grad, x.grad, **TOL)
    assert_close(ty.grad, y.grad, **TOL)
