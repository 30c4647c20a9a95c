"""Convolution and pooling lowerings (forward and backward) against CPU."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu
from utils import check


def r(*shape, grad=True):
    return torch.randn(*shape, requires_grad=grad)


def test_conv2d(mode):
    check(lambda x, w, b: F.conv2d(x, w, b, padding=1), r(2, 2, 5, 5), r(3, 2, 3, 3), r(3), grad=True)
    check(lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2),
          r(2, 4, 6, 7), r(6, 2, 3, 2), r(6), grad=True)
    # weight-only gradient (first layer): output_mask [False, True, True]
    check(lambda x, w, b: F.conv2d(x, w, b), r(1, 2, 5, 5, grad=False), r(3, 2, 3, 3), r(3), grad=True)


def test_conv1d(mode):
    check(lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=2, dilation=2, groups=2), r(2, 4, 9), r(4, 2, 3), r(4),
          grad=True)


def test_conv_transpose(mode):
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1), r(1, 2, 4, 4),
          r(2, 3, 3, 3), r(3), grad=True)
    check(lambda x, w: F.conv_transpose2d(x, w, stride=(2, 3), padding=(0, 1), output_padding=(1, 2), groups=2,
                                          dilation=(1, 2)), r(2, 4, 3, 4), r(4, 3, 2, 3), grad=True)
    check(lambda x, w: F.conv_transpose1d(x, w, stride=3), r(1, 2, 4), r(2, 3, 3), grad=True)


def test_max_pool2d(mode):
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), r(2, 2, 4, 5), grad=True)
    check(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, return_indices=True), r(1, 2, 7, 6),
          grad=True)
    check(lambda x: F.max_pool2d(x, (2, 3), stride=(1, 2), padding=(1, 1), dilation=(2, 1), return_indices=True),
          r(2, 7, 6), grad=True)
    # ties: CPU picks the first element of the window
    check(lambda x: F.max_pool2d(x, 2, stride=1, return_indices=True), torch.zeros(1, 1, 3, 3, requires_grad=True),
          grad=True)


def _pool_input(seed, shape, dtype=torch.float32):
    """Small integers (so windows hold ties), with NaNs and -infs sprinkled in for floats."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 3, shape, generator=g).to(dtype)
    if dtype.is_floating_point:
        pick = torch.rand(shape, generator=g)
        x[pick < 0.08] = float("nan")
        x[(pick >= 0.08) & (pick < 0.16)] = float("-inf")
    return x


def test_max_pool2d_ties_nans_and_padding(mode):
    # Values and indices exactly as CPU's loop picks them: the first of equal values, the last NaN
    # of a window, a window of -infs points at its first position inside the image, padding never.
    # Windows up to 5x5 take the unrolled lowering, larger ones the reduce_window: both here.
    configs = [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2), dict(kernel_size=(2, 3), stride=1),
               dict(kernel_size=3, stride=1, padding=1, dilation=2), dict(kernel_size=3, stride=2, ceil_mode=True),
               dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1), ceil_mode=True), dict(kernel_size=(7, 7)),
               dict(kernel_size=6, stride=3, padding=3)]
    for i, cfg in enumerate(configs):
        for dtype in (torch.float32, torch.int64):
            x = _pool_input(i, (2, 3, 9, 10), dtype)
            check(lambda x: F.max_pool2d(x, return_indices=True, **cfg), x)
    # Gradients follow the indices (overlapping windows add up), in every geometry above, for
    # bfloat16 too (accumulated in float32, as CPU does).
    for i, cfg in enumerate(configs):
        for dtype in (torch.float32, torch.bfloat16):
            x = _pool_input(40 + i, (2, 3, 9, 10), dtype).requires_grad_()
            check(lambda x: F.max_pool2d(x, **cfg).nan_to_num(0.0, 0.0, 0.0), x, grad=True)
    check(lambda x: F.adaptive_max_pool2d(x, (3, 4), return_indices=True), _pool_input(21, (2, 3, 7, 9)))
    for size in ((3, 5), (2, 3), (1, 1)):  # even windows (3x2, 1x1, 7x10) and uneven ones
        x = _pool_input(22, (2, 3, 6, 10)).requires_grad_()
        check(lambda x: F.adaptive_max_pool2d(x, size).nan_to_num(0.0, 0.0, 0.0), x, grad=True)


def test_max_pool3d_ties_nans_and_padding(mode):
    # 3-d windows take the reduce_window over (value, d*H*W + h*W + w) pairs: values, indices and
    # gradients as CPU's loop (ties, NaNs, -infs, padding, dilation, ceil_mode), unbatched too.
    configs = [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
               dict(kernel_size=(2, 3, 2), stride=(1, 2, 2), dilation=(2, 1, 1), ceil_mode=True)]
    for i, cfg in enumerate(configs):
        for dtype in (torch.float32, torch.int64):
            x = _pool_input(60 + i, (2, 2, 5, 6, 7), dtype)
            check(lambda x: F.max_pool3d(x, return_indices=True, **cfg), x)
        x = _pool_input(70 + i, (2, 2, 5, 6, 7)).requires_grad_()
        check(lambda x: F.max_pool3d(x, **cfg).nan_to_num(0.0, 0.0, 0.0), x, grad=True)
    check(lambda x: F.max_pool3d(x, 2, return_indices=True), r(2, 4, 4, 5), grad=True)


def test_adaptive_max_pool3d_ties_nans(mode):
    # Uneven windows gather each cell's window [floor(o*in/out), ceil((o+1)*in/out)) and reduce
    # it over (value, d*H*W + h*W + w) pairs; even ones take the reduce_window: values, indices
    # and gradients as CPU's loop (ties, NaNs, -infs), unbatched too.
    for i, size in enumerate(((3, 4, 2), (5, 3, 7), (1, 1, 1), (2, 6, 3))):
        check(lambda x: F.adaptive_max_pool3d(x, size, return_indices=True), _pool_input(80 + i, (2, 3, 5, 6, 7)))
        x = _pool_input(90 + i, (2, 3, 5, 6, 7)).requires_grad_()
        check(lambda x: F.adaptive_max_pool3d(x, size).nan_to_num(0.0, 0.0, 0.0), x, grad=True)
    check(lambda x: F.adaptive_max_pool3d(x, (2, 3, 4), return_indices=True), r(3, 5, 4, 6), grad=True)


def _samples(seed, *shape, dtype=torch.float32):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_fractional_max_pool_ties_nans(mode):
    # Windows start where CPU's generate_intervals puts them, from the given samples (sample 0
    # drives the width of a 2-d pool, the depth of a 3-d one), computed in the input's dtype.
    x2 = _pool_input(100, (2, 3, 9, 7))
    for i, (kernel, size) in enumerate((((3, 2), (5, 4)), (2, (8, 6)), ((4, 3), (1, 2)), (2, (4, 3)))):
        u = _samples(110 + i, 2, 3, 2)
        check(lambda x, u: F.fractional_max_pool2d(x, kernel, output_size=size, return_indices=True, _random_samples=u),
              x2, u)
        x = _pool_input(120 + i, (2, 3, 9, 7)).requires_grad_()
        check(lambda x, u: F.fractional_max_pool2d(x, kernel, output_size=size, _random_samples=u).nan_to_num(0.0, 0.0, 0.0),
              x, u, grad=True)
    check(lambda x, u: F.fractional_max_pool2d(x, 2, output_ratio=(0.5, 0.5), return_indices=True, _random_samples=u),
          r(3, 8, 9), _samples(130, 2, 3, 2), grad=True)  # unbatched: item 0 of the samples
    x3 = _pool_input(140, (2, 2, 7, 8, 6))
    for i, (kernel, size) in enumerate((((2, 3, 2), (4, 5, 3)), (3, (1, 2, 3)), (2, (5, 6, 4)))):
        u = _samples(150 + i, 2, 2, 3)
        check(lambda x, u: F.fractional_max_pool3d(x, kernel, output_size=size, return_indices=True, _random_samples=u),
              x3, u)
        x = _pool_input(160 + i, (2, 2, 7, 8, 6)).requires_grad_()
        check(lambda x, u: F.fractional_max_pool3d(x, kernel, output_size=size, _random_samples=u).nan_to_num(0.0, 0.0, 0.0),
              x, u, grad=True)
    x64 = torch.randn(2, 5, 6, 7, dtype=torch.float64, requires_grad=True)
    check(lambda x, u: F.fractional_max_pool3d(x, 2, output_size=(3, 4, 5), return_indices=True, _random_samples=u),
          x64, _samples(170, 2, 2, 3, dtype=torch.float64), grad=True)


@pytest.mark.modes("fused")
def test_compiled_pools_with_indices(mode):
    x = torch.randn(2, 3, 6, 7, 5, generator=torch.Generator().manual_seed(7))
    u2, u3 = _samples(180, 2, 3, 2), _samples(181, 2, 3, 3)
    modules = [(nn.AdaptiveMaxPool3d((3, 4, 2)), x), (nn.FractionalMaxPool2d(2, output_size=(4, 3), _random_samples=u2), x[:, :, 0]),
               (nn.FractionalMaxPool3d(2, output_size=(3, 4, 3), _random_samples=u3), x)]
    for module, inp in modules:
        expected = inp.clone().requires_grad_()
        module(expected).square().sum().backward()
        tpu_module = copy.deepcopy(module)
        if hasattr(tpu_module, "_random_samples") and tpu_module._random_samples is not None:
            tpu_module._random_samples = tpu_module._random_samples.to("tpu")
        compiled = torch.compile(tpu_module, backend="tpu")
        actual = inp.to("tpu").requires_grad_()
        before = dict(torchtpu.metrics.counters()["fallback_ops"])
        out = compiled(actual)
        out.square().sum().backward()
        assert torch.equal(out.cpu(), module(inp))
        assert torch.equal(actual.grad.cpu(), expected.grad)
        assert torchtpu.metrics.counters()["fallback_ops"] == before


def test_max_pool2d_backward_takes_any_index(mode):
    # A direct call of the backward op may pass indices that are not the forward's: like CPU's
    # kernel, tpu adds each cell's gradient wherever its index points in its own plane; an index
    # outside the plane (undefined on CPU) adds nothing, never to a neighbouring plane.
    grad = torch.arange(1.0, 9.0).reshape(2, 1, 2, 2)
    x = torch.zeros(2, 1, 4, 4)
    indices = torch.tensor([[[[0, 15], [15, 3]]], [[[16, -1], [5, 5]]]])
    backward = torch.ops.aten.max_pool2d_with_indices_backward
    args = ([2, 2], [2, 2], [0, 0], [1, 1], False)
    out = backward(grad.to("tpu"), x.to("tpu"), *args, indices.to("tpu")).cpu()
    in_plane = indices.clamp(0, 15)
    assert torch.equal(out[0], backward(grad[:1], x[:1], *args, in_plane[:1])[0])
    expected = torch.zeros(16)
    expected[5] = 7.0 + 8.0
    assert torch.equal(out[1].flatten(), expected)


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
