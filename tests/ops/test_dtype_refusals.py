"""Dtypes PyTorch refuses for an op raise PyTorch's error on tpu too, never compute a value.

Found by sweeping OpInfo samples of unsupported dtypes: the lowerings computed bool matmuls,
integer activations, integer uniform_ fills, float gcd, ..., where CPU and CUDA raise
NotImplementedError ("addmm_impl_cpu_" not implemented for 'Bool'), and a bool
`F.linear` aborted the process inside XLA:CPU's compiler. Such calls now run through the
CPU fallback, whose kernel raises the same exception as on CPU. Where PyTorch decides before
the tpu kernel sees the call (max_pool1d decomposes into max_pool2d, which takes integers;
functionalization checks normal_ on meta tensors, which raise another error), the op's autograd
kernel on tpu asks CPU's kernel. Nothing of this counts as a fallback or warns of one."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import torchtpu

B = torch.tensor([[True, False], [False, True]])
I = torch.tensor([[1, -2], [3, 4]])
U8 = torch.tensor([[1, 2], [3, 4]], dtype=torch.uint8)
X = torch.tensor([[0.5, -1.5], [2.0, 3.0]])
I32 = torch.tensor([[1, -2, 5], [3, 4, -6], [7, 0, 2]], dtype=torch.int32)

CASES = [
    ("linear-bool", lambda b: F.linear(b, b)),  # XLA:CPU aborted on this one
    ("mm-bool", lambda b: b @ b),
    ("bmm-bool", lambda b: torch.bmm(b[None], b[None])),
    ("dot-bool", lambda b: torch.dot(b[0], b[1])),
    ("conv-bool", lambda b: F.conv2d(b[None, None], b[None, None])),
    ("relu-bool", lambda b: F.relu(b)),
    ("abs-bool", torch.abs),
    ("clamp-bool", lambda b: b.clamp(min=False)),
    ("argmax-bool", torch.argmax),
    ("softmax-int", lambda i: F.softmax(i, -1), I),
    ("log_softmax-int", lambda i: F.log_softmax(i, -1), I),
    ("gelu-int", F.gelu, I),
    ("silu-int", F.silu, I),
    ("hardswish-int", F.hardswish, I),
    ("hardshrink-int", F.hardshrink, I),
    ("round-int", lambda i: torch.round(i, decimals=1), I),
    ("lerp-int", lambda i: torch.lerp(i, i, 0.5), I),
    ("uniform_-int", lambda i: i.clone().uniform_(), I),
    ("bernoulli-int", torch.bernoulli, I),
    ("adaptive_max_pool-int", lambda i: F.adaptive_max_pool2d(i[None], 1), I),
    ("unfold-int", lambda i: F.unfold(i[None, None], 1), I),
    ("smooth_l1-int", lambda i: F.smooth_l1_loss(i, i), I),
    ("nll_loss-int", lambda i: F.nll_loss(i, torch.tensor([0, 1], device=i.device)), I),
    ("gcd-float", lambda x: torch.gcd(x, x), X),
    ("gcd-bool", lambda b: torch.gcd(b, b)),
    ("lcm-float", lambda x: torch.lcm(x, x), X),
    ("bitwise_and-float", lambda x: x & x, X),
    ("bitwise_or-float", lambda x: x | x, X),
    ("bitwise_xor-float", lambda x: x ^ x, X),
    ("logaddexp-uint8", lambda u: torch.logaddexp(u, u), U8),
    # Refused by exact dtype, not class: CPU's avg_pool2d takes int64 but not int32.
    ("avg_pool2d-int32", lambda i: F.avg_pool2d(i[None, None], 2), I32),
    ("avg_pool1d-int8", lambda i: F.avg_pool1d(i[None], 2), I32.to(torch.int8)),
    ("avg_pool2d_backward-int32", lambda i: torch.ops.aten.avg_pool2d_backward(
        i[None, None, :2, :2], i[None, None], [2, 2], [1, 1], [0, 0], False, True, None), I32),
    # Convolutions: the transposed and dilated ones refuse int32 (the direct one takes it).
    ("conv_transpose2d-int32", lambda i: F.conv_transpose2d(i[None, None], i[None, None, :2, :2]), I32),
    ("conv2d_dilated-int32", lambda i: F.conv2d(i[None, None], i[None, None, :2, :2], dilation=2), I32),
    ("glu-int", lambda i: F.glu(i, -1), I),
    # CPU's error type depends on torch's release (RuntimeError to 2.14, NotImplementedError from
    # 2.15): the tpu call gives whichever this torch's CPU gives.
    ("std-int", torch.std, I),
    ("var-bool", lambda b: torch.var(b, 0)),
    ("var_mean-int32", lambda i: torch.var_mean(i, 1), I32),
    ("std_mean-uint8", lambda u: torch.std_mean(u, 0, correction=0), U8),
    ("pow-bool", lambda b: torch.pow(b, b)),
    ("pow_scalar-bool", lambda b: True ** b),
    ("normal-int_mean", lambda i: torch.normal(i, 1.5), I),  # the meta kernel says float32
    # Decided before the tpu kernel: max_pool1d decomposes into max_pool2d, which takes
    # integers; functionalization checks the in-place draws on meta tensors first.
    ("max_pool1d-int", lambda i: F.max_pool1d(i[None], 1), I),
    ("max_pool1d-bool", lambda b: F.max_pool1d(b[None], 1)),
    ("normal_-int", lambda i: i.clone().normal_(), I),
    ("log_normal_-int", lambda i: i.clone().log_normal_(), I),
    ("cauchy_-int", lambda i: i.clone().cauchy_(), I),
    ("exponential_-int", lambda i: i.clone().exponential_(), I),
    ("geometric_-bool", lambda b: b.clone().geometric_(0.5)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refused_dtype_raises_cpu_error(mode, case):
    name, fn, *given = case
    x = given[0] if given else B
    with pytest.raises((NotImplementedError, RuntimeError)) as on_cpu:
        fn(x)
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(type(on_cpu.value)) as on_tpu:
            out = fn(x.to("tpu"))
            out.cpu()  # fused mode: the error, if any, comes at the latest when read
    assert str(on_tpu.value) == str(on_cpu.value)
    # CPU's kernel only said no: nothing fell back, nothing claims a missing lowering.
    assert [str(w.message) for w in caught if "no tpu lowering" in str(w.message)] == []
    assert torchtpu.metrics.counters()["fallback_ops"] == before


def test_accepted_dtypes_still_run_on_tpu(mode):
    # The classes refused above stay on tpu where PyTorch accepts them.
    cases = [(lambda i: i @ i, I), (lambda i: torch.gcd(i, i), I), (lambda b: b & b, B), (torch.abs, I),
             (lambda i: F.relu(i), I), (lambda x: F.gelu(x), X), (lambda i: torch.argmax(i), I),
             (lambda i: i.float().uniform_(), I),
             (lambda b: b ** 2, B), (lambda b: 2 ** b, B), (lambda b: b.clamp(min=0), B), (torch.round, I),
             (lambda i: F.avg_pool2d(i[None, None], 2, 1), I32.long()),
             (lambda i: F.conv2d(i[None, None], i[None, None, :2, :2]), I32),
             (lambda i: F.conv_transpose2d(i[None, None], i[None, None, :2, :2], dilation=2), I32.long()),
             (lambda i: F.max_pool2d(i[None], 2, 1), I32), (lambda x: F.max_pool1d(x[None], 1), X),
             (lambda x: F.glu(x, -1), X)]
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    for fn, x in cases:
        expected, actual = fn(x), fn(x.to("tpu")).cpu()
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
    after = torchtpu.metrics.counters()["fallback_ops"]
    assert {k: v for k, v in after.items() if v != before.get(k, 0)} == {}


@pytest.mark.parametrize("divisor", [None, 3, -2])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_int64_avg_pool_runs_on_tpu_like_cpu(mode, count_include_pad, divisor):
    # CPU sums each window in int64 and divides, truncating toward zero; the backward divides
    # each gradient before spreading it. The tpu lowering once emitted float matrices into an
    # int64 module (a failed compile) and read a negative divisor_override as none.
    torch.manual_seed(0)
    x = torch.randint(-50, 50, (2, 3, 5, 7))
    args = ([3, 2], [2, 1], [1, 1], True, count_include_pad, divisor)
    expected = torch.ops.aten.avg_pool2d(x, *args)
    grad = torch.randint(-50, 50, expected.shape)
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    assert torch.equal(torch.ops.aten.avg_pool2d(x.to("tpu"), *args).cpu(), expected)
    assert torch.equal(torch.ops.aten.avg_pool2d_backward(grad.to("tpu"), x.to("tpu"), *args).cpu(),
                       torch.ops.aten.avg_pool2d_backward(grad, x, *args))
    assert torch.allclose(torch.ops.aten.avg_pool2d(x.float().to("tpu"), *args).cpu(),
                          torch.ops.aten.avg_pool2d(x.float(), *args))
    assert torchtpu.metrics.counters()["fallback_ops"] == before
