"""Convolution and pooling lowerings (forward and backward) against CPU."""
import torch
import torch.nn.functional as F

from utils import check


def r(*shape, grad=True):
    return torch.randn(*shape, requires_grad=grad)


def test_conv2d(mode):
    check(lambda x, w, b: F.conv2d(x, w, b, padding=1), r(2, 2, 5, 5), r(3, 2, 3, 3), r(3), grad=True, atol=1e-4)
    check(lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2),
          r(2, 4, 6, 7), r(6, 2, 3, 2), r(6), grad=True, atol=1e-4)
    # weight-only gradient (first layer): output_mask [False, True, True]
    check(lambda x, w, b: F.conv2d(x, w, b), r(1, 2, 5, 5, grad=False), r(3, 2, 3, 3), r(3), grad=True, atol=1e-4)


def test_conv1d(mode):
    check(lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=2, dilation=2, groups=2), r(2, 4, 9), r(4, 2, 3), r(4),
          grad=True, atol=1e-4)


def test_conv_transpose(mode):
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1), r(1, 2, 4, 4),
          r(2, 3, 3, 3), r(3), grad=True, atol=1e-4)
    check(lambda x, w: F.conv_transpose2d(x, w, stride=(2, 3), padding=(0, 1), output_padding=(1, 2), groups=2,
                                          dilation=(1, 2)), r(2, 4, 3, 4), r(4, 3, 2, 3), grad=True, atol=1e-4)
    check(lambda x, w: F.conv_transpose1d(x, w, stride=3), r(1, 2, 4), r(2, 3, 3), grad=True, atol=1e-4)


def test_max_pool2d(mode):
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), r(2, 2, 4, 5), grad=True)
    check(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, return_indices=True), r(1, 2, 7, 6),
          grad=True)
    check(lambda x: F.max_pool2d(x, (2, 3), stride=(1, 2), padding=(1, 1), dilation=(2, 1), return_indices=True),
          r(2, 7, 6), grad=True)
    # ties: CPU picks the first element of the window
    check(lambda x: F.max_pool2d(x, 2, stride=1, return_indices=True), torch.zeros(1, 1, 3, 3, requires_grad=True),
          grad=True)


def test_avg_pool2d(mode):
    check(lambda x: F.avg_pool2d(x, 2), r(2, 2, 4, 5), grad=True)
    check(lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True), r(1, 2, 7, 6), grad=True)
    check(lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False), r(1, 2, 7, 6),
          grad=True)
    check(lambda x: F.avg_pool2d(x, (2, 3), stride=(2, 1), padding=(1, 1), divisor_override=5), r(2, 7, 6), grad=True)


def test_adaptive_pools(mode):
    check(lambda x: F.adaptive_avg_pool2d(x, (3, 2)), r(1, 2, 5, 7), grad=True)
    check(lambda x: F.adaptive_avg_pool2d(x, (4, 6)), r(2, 5, 7), grad=True)
    check(lambda x: F.adaptive_max_pool2d(x, (2, 3), return_indices=True), r(1, 2, 4, 6), grad=True)
    check(lambda x: F.adaptive_max_pool2d(x, (3, 2), return_indices=True), r(2, 2, 5, 7), grad=True)


def test_upsample(mode):
    check(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), r(1, 2, 3, 3), grad=True)
    check(lambda x: F.interpolate(x, scale_factor=(1.7, 0.6), mode="nearest"), r(1, 2, 4, 5), grad=True)
    check(lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=False), r(1, 2, 3, 3), grad=True)
    check(lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=True), r(1, 2, 3, 3), grad=True)
    check(lambda x: F.interpolate(x, scale_factor=0.6, mode="bilinear"), r(1, 2, 5, 7), grad=True)
