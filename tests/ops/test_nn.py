"""nn lowerings: matmul family, softmax, normalization, attention, and a tiny CNN training."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from utils import HALF_PRECISION, assert_close, check


def r(*shape, grad=True):
    return torch.randn(*shape, requires_grad=grad)


# -- matmul family -------------------------------------------------------------------------------

def test_mv_dot_addmv_addbmm(mode):
    check(torch.mv, r(3, 4), r(4), grad=True)
    check(torch.dot, r(4), r(4), grad=True)
    check(lambda a, b, c: torch.addmv(a, b, c, beta=0.5, alpha=2), r(3), r(3, 4), r(4), grad=True)
    check(lambda a, b, c: torch.addbmm(a, b, c, beta=0.5, alpha=2), r(3, 5), r(2, 3, 4), r(2, 4, 5), grad=True)


def test_matmul_broadcast_linear_einsum(mode):
    check(torch.matmul, r(4), r(2, 4, 3), grad=True)
    check(torch.matmul, r(2, 1, 3, 4), r(5, 4, 2), grad=True)
    check(F.linear, r(2, 3, 4), r(5, 4), r(5), grad=True)
    check(lambda a, b: torch.einsum("bij,bjk->bik", a, b), r(2, 3, 4), r(2, 4, 5), grad=True)


def test_matmul_bf16(mode):
    check(lambda a, b: a.bfloat16() @ b.bfloat16(), r(3, 4), r(4, 5), grad=True, **HALF_PRECISION)  # measured equal


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_add_family_rounds_once_in_half_types(mode, dtype):
    # CPU's gemm scales and adds the float32 product, then rounds once: bit-equal here (a
    # product rounded to bfloat16 first was 2x CPU's error against float64).
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randn(s, generator=g).to(dtype) for s in ((16, 64), (64, 8), (16, 8)))
    bb, cb, v = torch.randn(4, 64, 8, generator=g).to(dtype), torch.randn(4, 16, 8, generator=g).to(dtype), b[:, 0]
    check(lambda a, b, c, bb, cb, v: (torch.addmm(c, a, b, beta=0.5, alpha=2.0), torch.addmm(c, a, b),
                                      torch.baddbmm(cb, a.expand(4, 16, 64), bb, beta=0.25, alpha=-1.5),
                                      torch.addmv(c[:, 0], a, v, beta=2.0)),
          a, b, c, bb, cb, v, rtol=0, atol=0)
    # addbmm: CPU rounds after each batch's addmm_, tpu once at the end (closer to float64).
    check(lambda a, bb, c: torch.addbmm(c, a.expand(4, 16, 64), bb, alpha=0.5), a, bb, c, rtol=2e-2, atol=0.1)


# -- softmax ---------------------------------------------------------------------------------------

def test_softmax_log_softmax(mode):
    check(lambda x: F.softmax(x, -1), r(3, 4), grad=True)
    check(lambda x: F.log_softmax(x, 0), r(3, 4), grad=True)
    check(lambda x: F.softmax(x, 1), r(2, 3, 4), grad=True)


def test_softmax_bf16_and_dtype(mode):
    check(lambda x: F.softmax(x.bfloat16(), -1), r(3, 4), grad=True, **HALF_PRECISION)  # measured equal
    check(lambda x: F.log_softmax(x, -1, dtype=torch.float64), r(3, 4), grad=True)


def test_softmax_neg_inf(mode):
    x = torch.tensor([[0.0, float("-inf"), 1.0], [2.0, 3.0, float("-inf")]])
    check(lambda x: F.softmax(x, -1), x)
    check(lambda x: F.log_softmax(x, -1), x)


# -- normalization ---------------------------------------------------------------------------------

def test_layer_norm(mode):
    check(lambda x, w, b: F.layer_norm(x, (4,), w, b), r(3, 4), r(4), r(4), grad=True)
    check(lambda x: F.layer_norm(x, (3, 4)), r(2, 3, 4), grad=True)
    # partial output_mask: only some inputs need gradients
    check(lambda x, w, b: F.layer_norm(x, (4,), w, b), r(3, 4), r(4, grad=False), r(4, grad=False), grad=True)
    check(lambda x, w, b: F.layer_norm(x, (4,), w, b), r(3, 4, grad=False), r(4), r(4), grad=True)


def test_layer_norm_bf16(mode):
    # Gradients through bfloat16 layer norm sum several bfloat16-rounded terms: measured up to
    # 1.6e-2 (a bfloat16 step at |x| >= 2), 0.15 of this tolerance.
    check(lambda x, w: F.layer_norm(x.bfloat16(), (4,), w.bfloat16()), r(3, 4), r(4), grad=True, atol=3e-2,
          rtol=3e-2)


def test_group_norm(mode):
    check(lambda x, w, b: F.group_norm(x, 2, w, b), r(2, 4, 3, 3), r(4), r(4), grad=True)
    check(lambda x: F.group_norm(x, 3), r(2, 6, 5), grad=True)


def test_rms_norm(mode):
    # rms_norm is a composite; its pow/mean/rsqrt parts belong to the elementwise lowerings.
    check(lambda x, w: F.rms_norm(x, (4,), w, eps=1e-6), r(3, 4), r(4), grad=True, no_fallback=False)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(mode, training):
    x, w, b = r(4, 3, 2, 2), r(3), r(3)
    stats_cpu = [torch.randn(3), torch.rand(3) + 0.5]
    stats_tpu = [s.to("tpu") for s in stats_cpu]

    def fn(x, w, b):
        rm, rv = stats_tpu if x.device.type == "tpu" else stats_cpu
        return F.batch_norm(x, rm, rv, w, b, training=training, momentum=0.3, eps=1e-3)

    check(fn, x, w, b, grad=True)
    for t, c in zip(stats_tpu, stats_cpu):
        assert_close(t, c, atol=1e-5)


def test_batch_norm_no_stats_and_input_only_grad(mode):
    check(lambda x: F.batch_norm(x, None, None, training=True), r(4, 3, 5), grad=True)
    check(lambda x, w: F.batch_norm(x, None, None, w, None, training=True), r(4, 3), r(3, grad=False), grad=True)


def test_batch_norm_module_bf16(mode):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(3)
    x = torch.randn(2, 3, 2, 2)
    bn_t = torch.nn.BatchNorm2d(3).to("tpu")
    out_c = bn(x.bfloat16().float())
    out_t = bn_t(x.bfloat16().float().to("tpu"))
    assert_close(out_t, out_c)
    assert_close(bn_t.running_var, bn.running_var)
    assert int(bn_t.num_batches_tracked.cpu()) == 1


# -- attention -------------------------------------------------------------------------------------

def test_sdpa(mode):
    q, k, v = r(1, 2, 3, 4), r(1, 2, 5, 4), r(1, 2, 5, 4)
    check(F.scaled_dot_product_attention, q, k, v, grad=True)


def test_sdpa_masks(mode):
    q, k, v = r(2, 2, 3, 4), r(2, 2, 3, 4), r(2, 2, 3, 4)
    bool_mask = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, bool_mask, grad=True)
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3), q, k, v, r(3, 3),
          grad=True)


def test_sdpa_causal(mode):
    # is_causal builds its mask with tril (a shape op owned by the shape lowerings).
    q, k, v = r(1, 2, 4, 4), r(1, 2, 4, 4), r(1, 2, 4, 4)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, grad=True,
          no_fallback=False)


def test_sdpa_at_decode_shapes(mode):
    # One query against a static KV cache of 6 slots, 4 filled (a padding mask from the cache
    # position), grouped query heads (4 query heads on 2 key/value heads), and is_causal with
    # one query (PyTorch aligns it top-left: the first key only).
    q, k, v = r(2, 4, 1, 8, grad=False), r(2, 2, 6, 8, grad=False), r(2, 2, 6, 8, grad=False)
    filled = (torch.arange(6) <= 3).view(1, 1, 1, 6).expand(2, 1, 1, 6)
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True), q, k, v, filled,
          atol=1e-5)
    q2 = r(2, 2, 1, 8, grad=False)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q2, k, v, atol=1e-5)


# -- end to end --------------------------------------------------------------------------------------

# -- unfold / fold (im2col / col2im) ----------------------------------------------------------------

UNFOLD_CASES = [dict(kernel_size=3), dict(kernel_size=(2, 3), dilation=(2, 1), padding=(1, 2), stride=(2, 3)),
                dict(kernel_size=2, stride=2), dict(kernel_size=1)]


@pytest.mark.parametrize("batched", [True, False])
def test_unfold_fold(mode, batched):
    # Overlapping windows (kernel 3, stride 1) make fold and unfold's backward add several
    # columns into one pixel: the sums are compared with CPU's, in its order.
    torch.manual_seed(3)
    lead = (2,) if batched else ()
    for kw in UNFOLD_CASES:
        check(lambda x: F.unfold(x, **kw), r(*lead, 3, 7, 8), grad=True)
        cols = F.unfold(torch.zeros(*lead, 3, 7, 8), **kw).shape
        check(lambda c: F.fold(c, (7, 8), **kw), r(*cols), grad=True)


def test_unfold_keeps_inf_and_nan(mode):
    x = torch.randn(1, 2, 5, 5)
    x[0, 0, 1, 2], x[0, 1, 3, 3] = float("inf"), float("nan")
    check(lambda x: F.unfold(x, 3, padding=1), x)  # no product with a 0/1 kernel: inf stays local
    check(lambda c: F.fold(c, (5, 5), 3, padding=1), F.unfold(x, 3, padding=1))


def test_unfold_bf16_and_module(mode):
    check(lambda x: F.unfold(x.bfloat16(), 2, stride=2), r(2, 3, 6, 6), grad=True, **HALF_PRECISION)  # measured equal
    check(lambda x: torch.nn.Fold((4, 4), 2)(torch.nn.Unfold(2)(x)), r(1, 2, 4, 4), grad=True)

class TinyCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


@pytest.mark.modes("strict", "fused")
def test_tiny_cnn_trains(mode):
    torch.manual_seed(0)
    cpu = TinyCNN()
    tpu = TinyCNN()
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
    opt_t = torch.optim.SGD(tpu.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 3, 6, 6), torch.tensor([0, 1, 4, 2])
    xt, yt = x.to("tpu"), y.to("tpu")
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    for _ in range(3):
        opt_c.zero_grad()
        loss_c = F.cross_entropy(cpu(x), y)
        loss_c.backward()
        opt_c.step()
        opt_t.zero_grad()
        loss_t = F.cross_entropy(tpu(xt), yt)
        loss_t.backward()
        opt_t.step()
        assert_close(loss_t, loss_c)
    for (name, p_t), p_c in zip(tpu.state_dict().items(), cpu.state_dict().values()):
        assert_close(p_t, p_c)
    after = torchtpu.metrics.counters()["fallback_ops"]
    new = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert not new, f"ops fell back to CPU: {new}"
