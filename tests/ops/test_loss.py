"""Loss lowerings (forward and backward) against CPU."""
import pytest
import torch
import torch.nn.functional as F

from utils import check, check_error


def r(*shape, grad=True):
    return torch.randn(*shape, requires_grad=grad)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss(mode, reduction):
    target = torch.tensor([0, 2, 1, 3])
    weight = torch.rand(4)
    check(lambda x, t, w: F.nll_loss(x, t, weight=w, ignore_index=1, reduction=reduction), r(4, 4), target, weight,
          grad=True)
    check(lambda x, t: F.nll_loss(x, t, reduction=reduction), r(4, 4), target, grad=True)


def test_nll_loss_1d_and_2d(mode):
    check(lambda x, t: F.nll_loss(x, t), r(5), torch.tensor(2), grad=True)
    check(lambda x, t, w: F.cross_entropy(x, t, weight=w, ignore_index=0), r(2, 4, 3, 3),
          torch.randint(0, 4, (2, 3, 3)), torch.rand(4), grad=True)


def test_cross_entropy(mode):
    target = torch.tensor([0, 2, 1, 3])
    check(lambda x, t: F.cross_entropy(x, t), r(4, 5), target, grad=True)
    check(lambda x, t: F.cross_entropy(x, t, ignore_index=2), r(4, 5), target, grad=True)
    check(lambda x, p: F.cross_entropy(x, p), r(4, 5), torch.rand(4, 5).softmax(-1), grad=True)


def test_cross_entropy_label_smoothing(mode):
    # label smoothing uses masked_fill/bitwise_not (elementwise and indexing lowerings).
    check(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1, ignore_index=1), r(4, 5),
          torch.tensor([0, 2, 1, 3]), grad=True, no_fallback=False)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_elementwise_losses(mode, reduction):
    check(lambda x, y: F.mse_loss(x, y, reduction=reduction), r(3, 4), r(3, 4), grad=True)
    check(lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.5), r(3, 4), r(3, 4), grad=True)
    check(lambda x, y: F.huber_loss(x, y, reduction=reduction, delta=0.7), r(3, 4), r(3, 4), grad=True)
    check(lambda x, y, w: F.binary_cross_entropy(x, y, weight=w, reduction=reduction),
          torch.rand(3, 4, requires_grad=True), torch.rand(3, 4), torch.rand(4), grad=True)


def test_l1_and_bce_with_logits(mode):
    # composites over abs/sgn and log_sigmoid (elementwise lowerings).
    check(lambda x, y: F.l1_loss(x, y), r(3, 4), r(3, 4), grad=True, no_fallback=False)
    check(lambda x, y: F.binary_cross_entropy_with_logits(x, y), r(3, 4), torch.rand(3, 4), grad=True,
          no_fallback=False)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.bool, torch.float32])
def test_nll_loss_target_dtype_refused_like_cpu(mode, dtype):
    # CPU takes int64 or uint8 class targets ("expected target dtype to be Long or Byte, but
    # got Int"); the lowering computed int32 and bool ones.
    target = torch.tensor([0, 2, 1, 1]).to(dtype)
    check_error(lambda x, t: F.nll_loss(x, t), r(4, 3, grad=False), target)
    check_error(lambda x, t: F.cross_entropy(x, t), r(4, 3, grad=False), target)
    check_error(lambda x, t: F.nll_loss(x, t), r(2, 3, 2, 2, grad=False), target.view(2, 2, 1).expand(2, 2, 2))
    # The backward op, called directly, checks its target too ("expected scalar type Long").
    check_error(lambda x, t: torch.ops.aten.nll_loss_backward(x.sum(), x, t, None, 1, -100, x.sum()),
                r(4, 3, grad=False), target)


def test_nll_loss_uint8_target(mode):
    # CPU takes uint8 targets; PyTorch's meta kernel refuses them (it gathers with them), so
    # they run on CPU (a fallback).
    check(lambda x, t: F.nll_loss(x, t), r(4, 3), torch.tensor([0, 2, 1, 1], dtype=torch.uint8), grad=True,
          no_fallback=False)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multi_margin_loss(mode, reduction):
    # p 1 and 2, a margin, class weights; a 1-d score vector (one sample); margins crossed both ways.
    target = torch.tensor([0, 3, 1, 3, 2])
    check(lambda x, t: F.multi_margin_loss(x, t, reduction=reduction), r(5, 4), target, grad=True)
    check(lambda x, t, w: F.multi_margin_loss(x, t, p=2, margin=0.7, weight=w, reduction=reduction), r(5, 4), target,
          torch.rand(4), grad=True)
    check(lambda x, t: F.multi_margin_loss(x, t, reduction=reduction), r(4), torch.tensor([2]), grad=True)
    check(lambda x, t: F.multi_margin_loss(x.double(), t, p=2, reduction=reduction), r(3, 6), torch.tensor([5, 0, 2]),
          grad=True)


def test_multi_margin_loss_errors_as_cpu(mode):
    x = torch.randn(3, 4)
    check_error(lambda x, t: F.multi_margin_loss(x, t, p=3), x, torch.tensor([0, 1, 2]))
    # A target out of range is a runtime check on tpu: CPU's words, then where the op was issued.
    with pytest.raises(RuntimeError, match=r"^target out of range \(checked on tpu by aten::multi_margin_loss"):
        F.multi_margin_loss(x.to("tpu"), torch.tensor([0, 4, 2], device="tpu")).cpu()
    check_error(lambda x, t: F.multi_margin_loss(x, t), x.bfloat16(), torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss(mode, reduction):
    # Targets end at the first -1 (later entries are ignored); repeated targets count twice; a row
    # without targets; a 1-d sample; margins crossed both ways.
    target = torch.tensor([[3, 0, -1, 1], [0, 1, 2, 3], [-1, 2, 0, 0], [2, 2, -1, -1], [1, -1, 3, 3]])
    check(lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction), r(5, 4), target, grad=True)
    check(lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction), r(5), torch.tensor([4, 1, -1, 0, 0]),
          grad=True)
    check(lambda x, t: F.multilabel_margin_loss(x.double(), t, reduction=reduction), r(5, 4), target, grad=True)
    # is_target, the forward's second result, as CPU's.
    check(lambda x, t: torch.ops.aten.multilabel_margin_loss_forward(x, t, 1)[1], r(5, 4, grad=False), target)


def test_multilabel_margin_loss_errors_as_cpu(mode):
    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match=r"^argument #2 'target' is out of range \(checked on tpu"):
        F.multilabel_margin_loss(x.to("tpu"), torch.tensor([[0, 3, -1], [1, -1, 0]], device="tpu")).cpu()
    with pytest.raises(RuntimeError, match=r"^argument #2 'target' is out of range"):
        F.multilabel_margin_loss(x, torch.tensor([[0, 3, -1], [1, -1, 0]]))
    check_error(lambda x, t: F.multilabel_margin_loss(x, t), x.bfloat16(), torch.tensor([[0, 2, -1], [1, -1, 0]]))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_every_target_ignored_gives_zero_gradients(mode, reduction):
    # The mean's total weight is 0 (the loss is NaN on CPU too), but CPU writes no gradient for an
    # ignored sample: 0, not NaN (ModuleInfo's CrossEntropyLoss sample 2d_ignore_index_mean).
    check(lambda x, t: F.cross_entropy(x, t, ignore_index=1, reduction=reduction), r(3, 4), torch.tensor([1, 1, 1]),
          grad=True)
    check(lambda x, t: F.nll_loss(x, t, ignore_index=2, reduction=reduction), r(2, 3, 2, 2),
          torch.full((2, 2, 2), 2), grad=True)


def _ctc_case(seed, steps=12, batch=4, classes=6, longest=5, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(steps, batch, classes, generator=g, dtype=dtype).log_softmax(2).requires_grad_()
    targets = torch.randint(1, classes, (batch, longest), generator=g)
    targets[0, 1] = targets[0, 0]  # a repeated label: the path must pass a blank between them
    return log_probs, targets


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_ctc_loss(mode, reduction):
    # The alpha/beta recursions run on device (one while loop over time each); padded (2-d) and
    # concatenated (1-d) targets, lengths as lists and as tensors (read on the host, as CUDA
    # does), an empty target, a short input, another blank index, float64.
    log_probs, targets = _ctc_case(0)
    input_lengths, target_lengths = [12, 10, 7, 4], [5, 3, 0, 3]
    check(lambda x, t, il, tl: F.ctc_loss(x, t, il, tl, reduction=reduction), log_probs, targets,
          torch.tensor(input_lengths), torch.tensor(target_lengths, dtype=torch.int32), grad=True)
    if reduction != "none":
        return  # the reduction is composite (ordinary ops): the variants below once suffice
    concatenated = torch.cat([targets[b, :n] for b, n in enumerate(target_lengths)])
    check(lambda x, t: F.ctc_loss(x, t, input_lengths, target_lengths, reduction=reduction), log_probs, concatenated,
          grad=True)
    check(lambda x, t, il, tl: F.ctc_loss(x, t, il, tl, reduction=reduction), log_probs, concatenated,
          torch.tensor(input_lengths), torch.tensor(target_lengths), grad=True)
    check(lambda x, t: F.ctc_loss(x, t, input_lengths, target_lengths, blank=5, reduction=reduction),
          log_probs, targets - 1, grad=True)
    log_probs64, targets64 = _ctc_case(1, dtype=torch.float64)
    check(lambda x, t: F.ctc_loss(x, t, [12, 12, 11, 6], [5, 5, 2, 1], reduction=reduction), log_probs64, targets64,
          grad=True, rtol=1e-12, atol=1e-12)
    # unbatched: [T, C] log-probabilities and one target
    check(lambda x, t: F.ctc_loss(x, t, [9], [4], reduction=reduction), log_probs[:9, 0].detach().requires_grad_(),
          targets[0, :4], grad=True)


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_impossible_alignments(mode, zero_infinity):
    # A target longer than its input (or than the steps its repeats need) and -inf
    # log-probabilities: an infinite loss and NaN gradients as on CPU, or zeros with zero_infinity.
    log_probs, targets = _ctc_case(2)
    log_probs = log_probs.detach().clone()
    log_probs[2:5, 1, 3] = float("-inf")
    log_probs[:, 2, 0] = float("-inf")
    targets[1, :3] = 3
    log_probs.requires_grad_()
    for reduction in ("none", "mean"):
        check(lambda x, t: F.ctc_loss(x, t, [12, 5, 2, 4], [5, 3, 3, 4], reduction=reduction,
                                      zero_infinity=zero_infinity), log_probs, targets, grad=True)


def test_ctc_loss_errors_as_cpu(mode):
    log_probs, targets = _ctc_case(3)
    log_probs = log_probs.detach()
    check_error(lambda x, t: F.ctc_loss(x, t, [12, 12, 12, 12], [5, 5, 5, 5], blank=6), log_probs, targets)
    check_error(lambda x, t: F.ctc_loss(x, t, [12, 13, 12, 12], [5, 5, 5, 5]), log_probs, targets)
    check_error(lambda x, t: F.ctc_loss(x, t, [12, 12, 12, 12], [5, 6, 5, 5]), log_probs, targets)


@pytest.mark.modes("fused")
def test_ctc_loss_compiled(mode):
    log_probs, targets = _ctc_case(4)
    loss = torch.nn.CTCLoss(zero_infinity=True)
    compiled = torch.compile(torch.nn.CTCLoss(zero_infinity=True), backend="tpu")
    check(lambda x, t, il, tl: compiled(x, t, il, tl) if x.device.type == "tpu" else loss(x, t, il, tl),
          log_probs, targets, torch.tensor([12, 10, 7, 4]), torch.tensor([5, 3, 0, 3]), grad=True)


@pytest.mark.modes("fused")
def test_ctc_loss_gradient_of_a_long_input_as_cpu(mode):
    # A long input (loss ~120): the gradient exp(collected + nll - lp) cancels, so float32
    # roundings of the recursions show in it at a few ulps of the loss (ulp(120) = 7.6e-6).
    # The per-class log-add of alpha*beta runs in CPU's order (a one-shot logsumexp was 2.4e-5
    # off CPU on OpInfo's sample, now 6e-8); exp/log still round unlike glibc's, measured here
    # 1.24e-5 from CPU, while CPU itself is 2.5e-5 from float64: atol 4e-5, and tpu's error
    # from float64 must stay within CPU's own (x 1.5).
    log_probs, targets = _ctc_case(5, steps=50, batch=16, classes=20, longest=30)
    lengths = torch.randint(10, 31, (16,), generator=torch.Generator().manual_seed(6))
    input_lengths = torch.full((16,), 50)
    check(lambda x, t, il, tl: F.ctc_loss(x, t, il, tl, reduction="none"), log_probs, targets,
          input_lengths, lengths, grad=True, rtol=1.3e-6, atol=4e-5)

    def gradient(x):
        x = x.detach().requires_grad_()
        F.ctc_loss(x, targets.to(x.device), input_lengths, lengths, reduction="none").sum().backward()
        return x.grad.cpu().double()
    exact = gradient(log_probs.double())
    cpu_error = (gradient(log_probs) - exact).abs().max()
    tpu_error = (gradient(log_probs.to("tpu")) - exact).abs().max()
    assert tpu_error <= 1.5 * cpu_error, (tpu_error, cpu_error)
