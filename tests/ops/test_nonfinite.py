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


def where(t, c):
    """The first few positions where a float tpu result differs from CPU's, for the message."""
    if not isinstance(c, torch.Tensor) or not c.is_floating_point() or t is None or t.shape != c.shape:
        return ""
    t, c = t.double(), c.double()
    same = (t == c) | (t.isnan() & c.isnan()) | ((t - c).abs() <= 1e-4 * c.abs() + 1e-5)
    bad = (~same).nonzero()[:3].tolist()
    return "".join(f" at {tuple(i)} tpu {t[tuple(i)].item():.6g} cpu {c[tuple(i)].item():.6g};" for i in bad)


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
            results.setdefault(label, []).append((list(outs), list(grads)))
    for label, _, _, _ in cases:  # read back after every case is recorded: one graph in fused mode
        (out_c, grad_c), (out_t, grad_t) = [(to_cpu(outs), to_cpu(grads)) for outs, grads in results[label]]
        pairs = [(f"output {k}", t, c) for k, (t, c) in enumerate(zip(out_t, out_c))]
        pairs += [(f"gradient {k}", t, c) for k, (t, c) in enumerate(zip(grad_t, grad_c))]
        for what, t, c in pairs:
            try:
                assert (t is None) == (c is None), "missing on one side"
                if c is not None:
                    assert_close(t, c, **tol)
            except AssertionError as error:
                failures.append(f"{label}, {what}: {str(error).splitlines()[0]}{where(t, c)}")
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
    for size in (1, 4, 7, 13):  # whole plane, uneven windows, overlapping ones, more outputs than inputs
        cases.append((f"adaptive_avg_pool1d-{size}", lambda x, s=size: F.adaptive_avg_pool1d(x, s), [x1], 40 + size))
    for size in ((1, 1), (3, 5), (4, 3), (9, 10), (2, 13)):
        cases.append((f"adaptive_avg_pool2d-{size}", lambda x, s=size: F.adaptive_avg_pool2d(x, s), [x2], 60))
    for size in ((1, 1, 1), (5, 3, 7), (2, 4, 3), (3, 8, 2)):
        cases.append((f"adaptive_avg_pool3d-{size}", lambda x, s=size: F.adaptive_avg_pool3d(x, s), [x3], 70))
    # LPPool is pow, an average pool (geometries above) and a root: each power once, each
    # window shape of the 2-d form once.
    for p in (1, 2, 3):
        cases.append((f"lp_pool1d-{p}", lambda x, p=p: F.lp_pool1d(x.abs(), p, 3), [x1], 80))
    for k in (2, 3):
        cases.append((f"lp_pool2d-{k}", lambda x, k=k: F.lp_pool2d(x.abs(), 2, k, ceil_mode=True), [x2], 81))
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


# -- reductions, activations, norms, losses ------------------------------------------------------

def reduction_cases():
    x = nonfinite(4, 6, 5, seed=6)
    cases = []
    # Not here: prod's gradient (PyTorch's formula for tensor subclasses, which tpu tensors are,
    # multiplies the other elements, where CPU divides the product by the element: inf/inf),
    # topk among equal values (CPU's order is its partial sort's).
    for name, fn in [("sum", lambda x: x.sum(1)), ("mean", lambda x: x.mean((0, 2))), ("nansum", lambda x: x.nansum(1)),
                     ("nanmean", lambda x: x.nanmean(2)), ("amax", lambda x: x.amax(1)),
                     ("amin", lambda x: x.amin((1, 2))), ("max_dim", lambda x: x.max(2)), ("min_dim", lambda x: x.min(0)),
                     ("max", lambda x: x.max()), ("logsumexp", lambda x: x.logsumexp(1)), ("var", lambda x: x.var(1)),
                     # CPU's var_mean takes its mean from Welford's update, NaN after an infinity
                     # unless it comes last: NaN only here.
                     ("std", lambda x: x.std(2, correction=0)), ("var_mean", lambda x: torch.var_mean(x.clamp(-9, 9), 1)),
                     ("norm2", lambda x: x.norm(dim=1)), ("norm1", lambda x: x.norm(1, dim=2)),
                     ("norm_inf", lambda x: torch.linalg.vector_norm(x, float("inf"), dim=1)),
                     ("cumsum", lambda x: x.cumsum(1)), ("cumprod", lambda x: x.cumprod(2)),
                     ("logcumsumexp", lambda x: x.logcumsumexp(1)), ("cummax", lambda x: x.cummax(1)),
                     ("softmax", lambda x: x.softmax(1)), ("log_softmax", lambda x: x.log_softmax(2)),
                     ("median", lambda x: x.median(1)), ("nanmedian", lambda x: x.nanmedian(1)),
                     ("sort", lambda x: x.sort(1)),
                     ("argmax", lambda x: x.argmax(1)), ("count_nonzero", lambda x: x.count_nonzero(1)),
                     ("all", lambda x: x.bool().all(1)), ("aminmax", lambda x: torch.aminmax(x, dim=1))]:
        cases.append((name, fn, [x], 200))
    return cases


def activation_cases():
    # 15 elements: CPU's vectorized loops (16 and more) answer differently at a NaN input than
    # its scalar loop for hardtanh, elu, hardswish and shrink backward (0 or NaN, by position)
    # and at an infinite gelu input (NaN); tpu follows the scalar loop, which is also CUDA's.
    # (Not -1.5: XLA multiplies by 1/3 where hardswish's backward divides, and x / 3 + 0.5 is
    # then -1e-8, not 0, so an infinite gradient gives -inf where CPU has NaN.)
    x = torch.tensor([NAN, INF, -INF, -5.0, -3.0, -1.25, -0.5, -1e-3, 0.0, 0.3, 0.5, 1.5, 2.5, 3.0, 6.0])
    fns = {
        "relu": F.relu, "relu6": F.relu6, "leaky_relu": lambda x: F.leaky_relu(x, 0.1), "elu": F.elu, "selu": F.selu,
        "celu": lambda x: F.celu(x, 0.7), "gelu": lambda x: F.gelu(x.clamp(-1e4, 1e4)),
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "silu": F.silu, "mish": F.mish, "hardtanh": lambda x: F.hardtanh(x, -1.5, 2.0), "hardsigmoid": F.hardsigmoid,
        "hardswish": F.hardswish, "softplus": lambda x: F.softplus(x, 2.0, 3.0), "softshrink": F.softshrink,
        "hardshrink": F.hardshrink, "tanhshrink": F.tanhshrink, "threshold": lambda x: F.threshold(x, 0.5, -2.0),
        "sigmoid": torch.sigmoid, "tanh": torch.tanh, "logsigmoid": F.logsigmoid,
        "rrelu_eval": lambda x: F.rrelu(x, training=False), "softsign": F.softsign, "clamp": lambda x: x.clamp(-1, 1),
        "abs": torch.abs, "sign": torch.sign, "sqrt": lambda x: x.abs().sqrt(), "erf": torch.erf,
        "where": lambda x: torch.where(x > 0, x, x * 2), "masked_fill": lambda x: x.masked_fill(x < -1, 0.0),
        "glu": lambda x: F.glu(x[:14], 0),
        "nan_to_num": lambda x: torch.nan_to_num(x, 1.0, 2.0, -3.0), "dropout_eval": lambda x: F.dropout(x, 0.5, False),
    }
    cases = [(name, fn, [x], 300) for name, fn in fns.items()]
    cases.append(("prelu", lambda x, w: F.prelu(x, w), [x, torch.tensor([0.25])], 301))
    return cases


def norm_cases():
    x = nonfinite(4, 6, 5, seed=9, share=0.02)
    w, b = finite(6, seed=10), finite(6, seed=11)
    wl, bl = finite(5, seed=12), finite(5, seed=13)
    return [
        ("layer_norm", lambda x, w, b: F.layer_norm(x, (5,), w, b), [x, wl, bl], 400),
        ("rms_norm", lambda x, w: F.rms_norm(x, (5,), w), [x, wl], 401),
        ("group_norm", lambda x, w, b: F.group_norm(x, 3, w, b), [x, w, b], 402),
        ("batch_norm_train", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), [x, w, b], 403),
        ("batch_norm_eval", lambda x, w, b: F.batch_norm(x, torch.zeros(6, device=x.device), torch.ones(6, device=x.device),
                                                          w, b, training=False), [x, w, b], 404),
        ("instance_norm", lambda x: F.instance_norm(x), [x], 405),
        ("normalize", lambda x: F.normalize(x, dim=1), [x], 406),
        ("local_response_norm", lambda x: F.local_response_norm(x, 3), [x], 407),
    ]


def loss_cases():
    x, y = nonfinite(6, 5, seed=14, share=0.04), finite(6, 5, seed=15)
    p = torch.rand(6, 5, generator=torch.Generator().manual_seed(16))
    p[0, 0], p[1, 2] = NAN, 1.0
    target = torch.tensor([0, 4, 2, -100, 1, 3])
    cases = []
    for red in ("mean", "none"):
        cases += [
            (f"mse-{red}", lambda x, y, r=red: F.mse_loss(x, y, reduction=r), [x, y], 500),
            (f"l1-{red}", lambda x, y, r=red: F.l1_loss(x, y, reduction=r), [x, y], 501),
            (f"smooth_l1-{red}", lambda x, y, r=red: F.smooth_l1_loss(x, y, reduction=r, beta=0.5), [x, y], 502),
            (f"huber-{red}", lambda x, y, r=red: F.huber_loss(x, y, reduction=r, delta=0.7), [x, y], 503),
            (f"bce_logits-{red}", lambda x, p, r=red: F.binary_cross_entropy_with_logits(x, p, reduction=r), [x, p], 504),
            (f"cross_entropy-{red}", lambda x, r=red: F.cross_entropy(x, target.to(x.device), reduction=r), [x], 505),
            (f"cross_entropy_smooth-{red}", lambda x, r=red: F.cross_entropy(x, target.to(x.device), reduction=r,
                                                                             label_smoothing=0.1), [x], 506),
            (f"nll-{red}", lambda x, r=red: F.nll_loss(x, target.to(x.device), reduction=r), [x], 507),
            (f"kl_div-{red}", lambda x, p, r=red: F.kl_div(x, p, reduction=r), [x, p], 508),
            (f"poisson_nll-{red}", lambda x, y, r=red: F.poisson_nll_loss(x, y, reduction=r), [x, y], 509),
            (f"soft_margin-{red}", lambda x, y, r=red: F.soft_margin_loss(x, y.sign().detach(), reduction=r), [x, y], 510),
            (f"multilabel_soft_margin-{red}", lambda x, p, r=red: F.multilabel_soft_margin_loss(x, p, reduction=r),
             [x, p], 511),
            (f"hinge_embedding-{red}", lambda x, y, r=red: F.hinge_embedding_loss(x, y.sign(), reduction=r), [x, y], 512),
            (f"gaussian_nll-{red}", lambda x, y, r=red: F.gaussian_nll_loss(x, y, y.abs() + 0.1, reduction=r), [x, y], 513),
            (f"cosine_embedding-{red}", lambda x, y, r=red: F.cosine_embedding_loss(
                x, y, torch.tensor([1, -1, 1, -1, 1, 1], device=x.device), reduction=r), [x, y], 514),
            (f"margin_ranking-{red}", lambda x, y, r=red: F.margin_ranking_loss(x[:, 0], y[:, 0], y[:, 1].sign(),
                                                                                reduction=r), [x, y], 515),
            (f"triplet-{red}", lambda x, y, r=red: F.triplet_margin_loss(x, y, y.flip(0), reduction=r), [x, y], 516),
        ]
    cases.append(("bce", lambda p, y: F.binary_cross_entropy(p.nan_to_num(0.5), y.sigmoid()), [p, y], 517))
    return cases


def attention_cases():
    q, k, v = (nonfinite(2, 3, 4, 8, seed=20 + i, share=0.02) for i in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    mask[0] = False  # a row that attends to nothing: NaN on CPU
    bias = torch.zeros(4, 4).masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), -INF)
    # Not here: is_causal with a NaN in a later key. CPU's (and CUDA's) flash kernels never read
    # the masked keys; tpu runs PyTorch's math decomposition, whose -inf bias plus NaN is NaN.
    return [
        ("sdpa_bool_mask", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device)),
         [q, k, v], 601),
        ("sdpa_float_mask", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.device)),
         [q, k, v], 602),
        ("masked_softmax", lambda q: q.masked_fill(~mask.to(q.device), -INF).softmax(-1), [q[..., :4]], 603),
    ]


@pytest.mark.parametrize("family", ["reduction", "activation", "norm", "loss", "attention"])
def test_nonfinite_values_follow_cpu(mode, family):
    cases = {"reduction": reduction_cases, "activation": activation_cases, "norm": norm_cases, "loss": loss_cases,
             "attention": attention_cases}[family]()
    run(cases, tol=dict(rtol=1e-4, atol=1e-5))
