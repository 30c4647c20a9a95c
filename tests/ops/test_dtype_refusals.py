"""Dtypes PyTorch refuses for an op raise PyTorch's error on tpu too, never compute a value.

Found by sweeping OpInfo samples of unsupported dtypes: the lowerings computed bool matmuls,
integer activations, integer uniform_ fills, float gcd, ..., where CPU and CUDA raise
NotImplementedError ("addmm_impl_cpu_" not implemented for 'Bool'), and a bool
`F.linear` aborted the process inside XLA:CPU's compiler. Such calls now run through the
CPU fallback, whose kernel raises the same exception as on CPU."""
import warnings

import pytest
import torch
import torch.nn.functional as F

B = torch.tensor([[True, False], [False, True]])
I = torch.tensor([[1, -2], [3, 4]])
U8 = torch.tensor([[1, 2], [3, 4]], dtype=torch.uint8)
X = torch.tensor([[0.5, -1.5], [2.0, 3.0]])

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
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refused_dtype_raises_cpu_error(mode, case):
    name, fn, *given = case
    x = given[0] if given else B
    with pytest.raises((NotImplementedError, RuntimeError)) as on_cpu:
        fn(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU fallback's "runs on CPU" warning
        with pytest.raises(type(on_cpu.value)) as on_tpu:
            out = fn(x.to("tpu"))
            out.cpu()  # fused mode: the error, if any, comes at the latest when read
    assert str(on_tpu.value) == str(on_cpu.value)


def test_accepted_dtypes_still_run_on_tpu(mode):
    # The classes refused above stay on tpu where PyTorch accepts them.
    cases = [(lambda i: i @ i, I), (lambda i: torch.gcd(i, i), I), (lambda b: b & b, B), (torch.abs, I),
             (lambda i: F.relu(i), I), (lambda x: F.gelu(x), X), (lambda i: torch.argmax(i), I),
             (lambda i: i.float().uniform_(), I),
             (lambda b: b ** 2, B), (lambda b: 2 ** b, B), (lambda b: b.clamp(min=0), B), (torch.round, I)]
    import torchtpu
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    for fn, x in cases:
        expected, actual = fn(x), fn(x.to("tpu")).cpu()
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
    after = torchtpu.metrics.counters()["fallback_ops"]
    assert {k: v for k, v in after.items() if v != before.get(k, 0)} == {}
