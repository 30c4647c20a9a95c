"""Convolution and pooling lowerings (forward and backward) against CPU."""
import torch
import torch.nn.functional as F

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
