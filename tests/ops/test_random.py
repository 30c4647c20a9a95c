"""Random ops: reproducible under torch.manual_seed, different per call and per seed, with
the right distributions; dropout forward/backward; multinomial against CPU's distribution."""
import pytest
import torch

import torchtpu

N = 10000


def no_fallback(fn):
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    out = fn()
    out = [o.cpu() for o in out] if isinstance(out, (list, tuple)) else out.cpu()
    after = torchtpu.metrics.counters()["fallback_ops"]
    assert after == before, f"fell back: {set(after.items()) - set(before.items())}"
    return out


SAMPLERS = {
    "rand": lambda: torch.rand(N, device="tpu"),
    "randn": lambda: torch.randn(N, device="tpu"),
    "randint": lambda: torch.randint(-3, 7, (N,), device="tpu"),
    "uniform_": lambda: torch.empty(N, device="tpu").uniform_(-2, 4),
    "normal_": lambda: torch.empty(N, device="tpu").normal_(3, 0.5),
    "normal_tensor": lambda: torch.normal(torch.full((N,), 2.0, device="tpu"), 0.25),
    "normal_tensors": lambda: torch.normal(torch.zeros(N, device="tpu"), torch.full((N,), 2.0, device="tpu")),
    "bernoulli": lambda: torch.bernoulli(torch.full((N,), 0.3, device="tpu")),
    "bernoulli_p": lambda: torch.empty(N, device="tpu").bernoulli_(0.7),
    "random_to": lambda: torch.empty(N, device="tpu", dtype=torch.int32).random_(5),
    "exponential": lambda: torch.empty(N, device="tpu").exponential_(2.0),
    "rand_f64": lambda: torch.rand(N, device="tpu", dtype=torch.float64),
    "rand_bf16": lambda: torch.rand(N, device="tpu", dtype=torch.bfloat16),
    "dropout": lambda: torch.nn.functional.dropout(torch.ones(N, device="tpu"), 0.25),
}

# (mean, std, min, max) of each sampler's distribution
STATS = {
    "rand": (0.5, 12 ** -0.5, 0, 1),
    "randn": (0.0, 1.0, None, None),
    "randint": (1.5, (100 / 12 - 1 / 12) ** 0.5 * 1.0, -3, 6),
    "uniform_": (1.0, 6 / 12 ** 0.5, -2, 4),
    "normal_": (3.0, 0.5, None, None),
    "normal_tensor": (2.0, 0.25, None, None),
    "normal_tensors": (0.0, 2.0, None, None),
    "bernoulli": (0.3, (0.3 * 0.7) ** 0.5, 0, 1),
    "bernoulli_p": (0.7, (0.3 * 0.7) ** 0.5, 0, 1),
    "random_to": (2.0, 2 ** 0.5, 0, 4),
    "exponential": (0.5, 0.5, 0, None),
    "rand_f64": (0.5, 12 ** -0.5, 0, 1),
    "rand_bf16": (0.5, 12 ** -0.5, 0, 1),
    "dropout": (1.0, (0.25 / 0.75) ** 0.5, 0, 4 / 3),
}


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_distribution_and_seeding(mode, name):
    fn = SAMPLERS[name]
    torch.manual_seed(123)
    a = no_fallback(fn)
    b = no_fallback(fn)
    torch.manual_seed(123)
    a2 = no_fallback(fn)
    torch.manual_seed(124)
    c = no_fallback(fn)
    assert torch.equal(a, a2), "same seed must give the same values"
    assert not torch.equal(a, b), "consecutive calls must differ"
    assert not torch.equal(a, c), "different seeds must differ"
    mean, std, lo, hi = STATS[name]
    f = a.double()
    assert abs(f.mean().item() - mean) < 4 * std / N ** 0.5 + 1e-3, f.mean()
    assert abs(f.std().item() - std) < 0.05 * std + 1e-3, f.std()
    if lo is not None:
        assert f.min().item() >= lo
    if hi is not None:
        assert f.max().item() <= hi + 1e-6 and (name != "rand" or f.max().item() < 1)


def test_randint_covers_range(mode):
    v = no_fallback(lambda: torch.randint(-3, 7, (N,), device="tpu"))
    assert v.dtype == torch.int64
    assert set(v.tolist()) == set(range(-3, 7))


def test_dropout_mask_and_backward(mode):
    torch.manual_seed(0)
    x = torch.randn(64, 64, device="tpu", requires_grad=True)
    y = torch.nn.functional.dropout(x, 0.4)
    y.sum().backward()
    xc, yc, g = x.detach().cpu(), y.detach().cpu(), x.grad.cpu()
    kept = yc != 0
    assert abs(kept.float().mean().item() - 0.6) < 0.04
    torch.testing.assert_close(yc[kept], xc[kept] / 0.6)
    torch.testing.assert_close(g, kept.float() / 0.6)
    # eval mode and p=0 are identity; p=1 drops everything
    torch.testing.assert_close(torch.nn.functional.dropout(x, 0.4, training=False).detach().cpu(), xc)
    assert (torch.nn.functional.dropout(x, 1.0).detach().cpu() == 0).all()


def test_generator_argument(mode):
    g = torch.Generator(device="tpu")
    g.manual_seed(7)
    a = torch.rand(100, device="tpu", generator=g).cpu()
    g.manual_seed(7)
    b = torch.rand(100, device="tpu", generator=g).cpu()
    assert torch.equal(a, b)


def test_consecutive_streams_do_not_overlap(mode):
    torch.manual_seed(0)
    a = torch.rand(8, device="tpu").cpu()
    b = torch.rand(8, device="tpu").cpu()
    assert not (set(a.tolist()) & set(b.tolist()))


def test_randperm_falls_back(mode):
    before = torchtpu.metrics.counters()["fallback_ops"].get("aten::randperm.generator_out", 0)
    p = torch.randperm(10, device="tpu")
    assert sorted(p.cpu().tolist()) == list(range(10))
    assert torchtpu.metrics.counters()["fallback_ops"]["aten::randperm.generator_out"] > before


FACTORIES = {
    "arange": lambda d: torch.arange(7, device=d),
    "arange_start": lambda d: torch.arange(-3, 4, device=d),
    "arange_step": lambda d: torch.arange(1, 5, 0.5, device=d),
    "arange_neg_step": lambda d: torch.arange(5, -2, -1.5, device=d, dtype=torch.float64),
    "arange_int32": lambda d: torch.arange(0, 10, 3, dtype=torch.int32, device=d),
    "arange_empty": lambda d: torch.arange(0, device=d),
    "linspace": lambda d: torch.linspace(-1, 1, 7, device=d),
    "linspace_int": lambda d: torch.linspace(0, 10, 6, dtype=torch.int64, device=d),
    "linspace_1": lambda d: torch.linspace(3, 4, 1, device=d),
    "eye": lambda d: torch.eye(3, device=d),
    "eye_m": lambda d: torch.eye(2, 4, dtype=torch.int32, device=d),
    "full": lambda d: torch.full((2, 3), 1.5, device=d),
    "full_int": lambda d: torch.full((2,), 7, device=d),
    "zeros": lambda d: torch.zeros(2, 3, dtype=torch.bool, device=d),
    "ones": lambda d: torch.ones(0, 4, device=d),
    "empty_shape": lambda d: torch.empty(3, 2, device=d).shape,
    "tensor": lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
    "tensor_scalar": lambda d: torch.tensor(2.5, device=d),
    "like": lambda d: [f(torch.ones(2, 3, device=d, dtype=torch.float16))
                       for f in (torch.zeros_like, torch.ones_like, lambda t: torch.full_like(t, 3))],
}


@pytest.mark.parametrize("name", list(FACTORIES))
def test_factories(mode, name):
    fn = FACTORIES[name]
    expected = fn("cpu")
    actual = no_fallback(lambda: fn("tpu")) if name != "empty_shape" else fn("tpu")
    if isinstance(expected, torch.Size):
        assert actual == expected
    elif isinstance(expected, list):
        for a, e in zip(actual, expected):
            assert a.dtype == e.dtype and torch.equal(a, e)
    else:
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        torch.testing.assert_close(actual, expected)


PROBS = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.0], [5.0, 0.0, 0.0, 0.0, 5.0], [1.0, 1.0, 1.0, 1.0, 1.0]])


def frequencies(draws, rows=3, categories=5):
    return torch.stack([torch.bincount(draws[r].flatten(), minlength=categories) for r in range(rows)]).double() / \
        draws[0].numel()


@pytest.mark.parametrize("replacement", [False, True], ids=["one_draw", "with_replacement"])
def test_multinomial_distribution_and_seeding(mode, replacement):
    # 4000 draws per row: frequencies within 4 binomial standard deviations of CPU's
    # (sampling noise of both sides); zero-probability categories are never drawn.
    n = 4000
    probs = PROBS.to("tpu")
    if replacement:
        draw = lambda: torch.multinomial(probs, n, replacement=True)  # noqa: E731
    else:
        draw = lambda: torch.multinomial(probs.repeat_interleave(n, 0), 1).view(3, n)  # noqa: E731
    torch.manual_seed(3)
    a = no_fallback(draw)
    b = no_fallback(draw)
    torch.manual_seed(3)
    assert torch.equal(a, no_fallback(draw)), "same seed must give the same draws"
    assert not torch.equal(a, b), "consecutive calls must differ"
    assert a.dtype == torch.int64 and a.shape == (3, n)
    cpu = torch.multinomial(PROBS.repeat_interleave(n, 0), 1).view(3, n)
    expected = PROBS / PROBS.sum(1, keepdim=True)
    bound = 4 * (expected * (1 - expected) / n).sqrt() + 1e-9
    for got in (frequencies(a), frequencies(cpu)):
        assert ((got - expected).abs() <= 2 * bound).all(), (got, expected)
    assert (a[1] != 1).all() and (a[1] != 2).all() and (a[0] != 4).all()


def test_multinomial_without_replacement_draws_distinct(mode):
    torch.manual_seed(0)
    d = no_fallback(lambda: torch.multinomial(torch.ones(64, 10, device="tpu"), 10))
    assert (d.sort(1).values == torch.arange(10)).all()
    d = no_fallback(lambda: torch.multinomial(PROBS[0].to("tpu"), 4))
    assert sorted(d.tolist()) == [0, 1, 2, 3], "the zero-probability category comes last"
    # The first draw without replacement follows p, as one draw does.
    torch.manual_seed(1)
    first = no_fallback(lambda: torch.multinomial(PROBS[0].to("tpu").expand(4000, 5), 3)[:, 0])
    freq = torch.bincount(first, minlength=5).double() / 4000
    assert (freq - PROBS[0]).abs().max() < 0.035, freq


@pytest.mark.parametrize("probs, samples, replacement, message", [
    ([0.5, -1.0], 1, False, "probability tensor contains either `inf`, `nan` or element < 0"),
    ([0.5, float("nan")], 1, False, "probability tensor contains either `inf`, `nan` or element < 0"),
    ([[1.0, 1.0], [0.0, 0.0]], 1, False, r"invalid multinomial distribution \(sum of probabilities <= 0\)"),
    ([0.5, -1.0], 2, True, r"invalid multinomial distribution \(encountering probability entry < 0\)"),
    ([0.5, float("inf")], 2, True, "encountering probability entry = infinity or NaN"),
    ([1.0, 1.0], 3, False, "cannot sample n_sample > prob_dist.size"),
    ([1.0, 1.0], 0, True, "cannot sample n_sample <= 0 samples"),
])
def test_multinomial_errors_as_cpu(mode, probs, samples, replacement, message):
    with pytest.raises(RuntimeError, match=message):
        torch.multinomial(torch.tensor(probs), samples, replacement)
    with pytest.raises(RuntimeError, match=message):
        torch.multinomial(torch.tensor(probs, device="tpu"), samples, replacement).cpu()
    with pytest.raises(RuntimeError, match="multinomial only supports floating-point dtypes for input, got: Long"):
        torch.multinomial(torch.tensor([1, 2], device="tpu"), 1)
