"""NaN and infinities through the families that average or mask: pooling, upsampling,
reductions, activations and their backward, norms, losses. Inputs and upstream gradients hold
NaN, +inf and -inf at seeded positions; outputs and input gradients must equal CPU's, NaN where
CPU has NaN and nowhere else (a lowering that multiplies by a 0/1 matrix, or masks by
multiplying, spreads a NaN to neighbours CPU keeps clean)."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from utils import assert_close, to_cpu, to_tpu

NAN, INF = float("nan"), float("inf")


def nonfinite(*shape, seed, dtype=torch.float32, share=0.06, lo=-2.0, hi=2.0):
    """Uniform values in [lo, hi) with NaN, +inf and -inf, each at about `share` of the positions."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo
    pick = torch.rand(shape, generator=g)
    x[pick < share] = NAN
    x[(pick >= share) & (pick < 2 * share)] = INF
    x[(pick >= 2 * share) & (pick < 3 * share)] = -INF
    return x.to(dtype)


def finite(*shape, seed, dtype=torch.float32, lo=-2.0, hi=2.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def run(cases, tol=None):
    """cases: (label, fn, inputs, grad_seed). Every input that is a float tensor needs a
    gradient; the outputs' upstream gradient holds NaN and infinities too when grad_seed is not
    None (finite ones otherwise). All cases of a list run as one fused graph in fused mode."""
    tol = tol or {}
    failures = []
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    results = {}
    for device in ("cpu", "tpu"):
        for label, fn, inputs, grad_seed in cases:
            ins = [a.detach().clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a
                   for a in inputs]
            if device == "tpu":
                ins = [to_tpu(a) for a in ins]
            out = fn(*ins)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
            wrt = [a for a in ins if isinstance(a, torch.Tensor) and a.requires_grad]
            grads = []
            if diff and wrt:
                upstream = [nonfinite(*o.shape, seed=grad_seed + k, dtype=o.dtype, share=0.03) if grad_seed is not None
                            else finite(*o.shape, seed=1000 + k, dtype=o.dtype) for k, o in enumerate(diff)]
                if device == "tpu":
                    upstream = [u.to("tpu") for u in upstream]
                grads = torch.autograd.grad(diff, wrt, upstream, allow_unused=True)
            results.setdefault(label, []).append((to_cpu(list(outs)), to_cpu(list(grads))))
    for label, _, _, _ in cases:
        (out_c, grad_c), (out_t, grad_t) = results[label]
        try:
            assert_close(out_t, out_c, **tol)
            assert len(grad_t) == len(grad_c)
            for gt, gc in zip(grad_t, grad_c):
                assert (gt is None) == (gc is None), "a gradient is missing on one side"
                if gc is not None:
                    assert_close(gt, gc, **tol)
        except AssertionError as error:
            failures.append(f"{label}: {str(error).splitlines()[0]}")
    assert not failures, "\n".join(failures)
    after = torchtpu.metrics.counters()["fallback_ops"]
    new = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert not new, f"ops fell back to CPU: {new}"


# -- pooling and upsampling ------------------------------------------------------------------

def pooling_cases():
    x1, x2, x3 = nonfinite(2, 3, 11, seed=1), nonfinite(2, 3, 9, 10, seed=2), nonfinite(1, 2, 5, 6, 7, seed=3)
    cases = []
    for i, (k, s, p, ceil, include, div) in enumerate([
            (2, None, 0, False, True, None), (3, 2, 1, False, True, None), (3, 2, 1, True, False, None),
            ((2, 3), (1, 2), (1, 1), True, True, None), (4, 3, 2, True, False, None), ((3, 2), 1, (1, 0), False, True, 5),
            (5, 5, 0, False, True, None), (9, 1, 0, False, True, None)]):
        cases.append((f"avg_pool2d-{i}", lambda x, k=k, s=s, p=p, c=ceil, n=include, d=div:
                      F.avg_pool2d(x, k, s, p, c, n, d), [x2], 10 + i))
        if isinstance(k, int):
            cases.append((f"avg_pool1d-{i}", lambda x, k=k, s=s, p=p, c=ceil, n=include:
                          F.avg_pool1d(x, k, s, p, c, n), [x1], 20 + i))
    for i, (k, s, p, ceil, include, div) in enumerate([
            (2, None, 0, False, True, None), (3, 2, 1, True, False, None), ((2, 3, 2), (1, 2, 2), (1, 1, 0), True, True, 3),
            ((5, 6, 7), 1, 0, False, True, None)]):
        cases.append((f"avg_pool3d-{i}", lambda x, k=k, s=s, p=p, c=ceil, n=include, d=div:
                      F.avg_pool3d(x, k, s, p, c, n, d), [x3], 30 + i))
    for size in (1, 3, 4, 7, 13):  # whole plane, even windows, uneven ones, more outputs than inputs
        cases.append((f"adaptive_avg_pool1d-{size}", lambda x, s=size: F.adaptive_avg_pool1d(x, s), [x1], 40 + size))
    for size in ((1, 1), (3, 5), (4, 3), (9, 10), (2, 13)):
        cases.append((f"adaptive_avg_pool2d-{size}", lambda x, s=size: F.adaptive_avg_pool2d(x, s), [x2], 60))
    for size in ((1, 1, 1), (5, 3, 7), (2, 4, 3), (3, 8, 2)):
        cases.append((f"adaptive_avg_pool3d-{size}", lambda x, s=size: F.adaptive_avg_pool3d(x, s), [x3], 70))
    for p in (1, 2, 3):
        for k in (2, 3):
            cases.append((f"lp_pool1d-{p}-{k}", lambda x, p=p, k=k: F.lp_pool1d(x.abs(), p, k), [x1], 80))
            cases.append((f"lp_pool2d-{p}-{k}", lambda x, p=p, k=k: F.lp_pool2d(x.abs(), p, k, ceil_mode=True), [x2], 81))
    cases.append(("lp_pool3d", lambda x: F.lp_pool3d(x.abs(), 2, 2), [x3], 82))
    return cases


def upsampling_cases():
    x = nonfinite(2, 3, 5, 6, seed=4)
    cases = []
    for i, kw in enumerate([dict(scale_factor=2), dict(scale_factor=3), dict(size=(7, 9)), dict(size=(3, 4)),
                            dict(size=(5, 6)), dict(scale_factor=0.5), dict(size=(10, 3))]):
        cases.append((f"nearest-{i}", lambda x, kw=kw: F.interpolate(x, mode="nearest", **kw), [x], 90 + i))
        for ac in (False, True):
            cases.append((f"bilinear-{i}-{ac}", lambda x, kw=kw, ac=ac:
                          F.interpolate(x, mode="bilinear", align_corners=ac, **kw), [x], 100 + i))
    return cases


def test_pooling_keeps_nonfinite_in_its_windows(mode):
    run(pooling_cases())


def test_upsampling_keeps_nonfinite_in_its_taps(mode):
    run(upsampling_cases())


def test_pooling_half_precision_and_double(mode):
    # Sums accumulate in float32 for half types, in float64 for double, as CPU's kernels do.
    cases = []
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        x = nonfinite(2, 3, 8, 9, seed=5, dtype=dtype)
        cases += [(f"avg_pool2d-{dtype}", lambda x: F.avg_pool2d(x, 3, 2, 1), [x], 110),
                  (f"adaptive-{dtype}", lambda x: F.adaptive_avg_pool2d(x, (3, 4)), [x], 111),
                  (f"bilinear-{dtype}", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), [x], 112),
                  (f"nearest-{dtype}", lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), [x], 113)]
    run(cases, tol=dict(rtol=1e-2, atol=1e-2))  # one bfloat16 step is 0.8% of the value
