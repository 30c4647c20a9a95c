"""Loss lowerings (forward and backward) against CPU."""
import pytest
import torch
import torch.nn.functional as F

from utils import check


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
