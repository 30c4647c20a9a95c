"""torchtpu's C++ meta kernels for in-place ops (add_/sub_, fill_, relu_; csrc/device/overrides.cpp)
replace PyTorch's Python ones: same results and same errors as PyTorch's Python meta on a sweep
of dtypes, shapes and scalar kinds, and the in-place ops behave as on CPU on tpu tensors."""
import itertools

import pytest
import torch
import torch._meta_registrations as py_meta

DTYPES = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64, torch.complex64]
SHAPE_PAIRS = [((), ()), ((3,), ()), ((), (3,)), ((2, 3), (3,)), ((2, 3), (1, 3)), ((2, 3), (2, 1)),
               ((3,), (2, 3)), ((2, 3), (4, 3)), ((2, 3), (3, 2)), ((2, 1), (2, 3)), ((4, 2, 3), (2, 1)),
               ((2, 3), (5, 2, 3)), ((0, 3), (3,)), ((0, 3), (2, 3))]
SCALARS = [True, 0, 2, 2.5, 1 + 2j]


def outcome(fn, *args, **kwargs):
    """What a meta kernel does with these arguments: the result's geometry, or its error."""
    self = args[0]
    try:
        out = fn(*args, **kwargs)
    except Exception as e:  # the type and words are compared
        return type(e).__name__, str(e)
    return "ok", out is self, tuple(out.shape), out.dtype


def meta(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_kernels_are_torchtpus():
    # Otherwise the comparisons below would compare PyTorch's Python meta with itself.
    for op in ("add_.Tensor", "add_.Scalar", "sub_.Tensor", "sub_.Scalar", "fill_.Scalar", "fill_.Tensor",
               "relu_"):
        meta_line = [line for line in torch._C._dispatch_dump(f"aten::{op}").splitlines()
                     if line.startswith("Meta:")]
        assert meta_line and "kernel_overrides.cpp" in meta_line[0], (op, meta_line)


@pytest.mark.parametrize("name", ["add_", "sub_"])
def test_add_sub_tensor_matches_python_meta(name):
    op = getattr(torch.ops.aten, name).Tensor
    checked = 0
    for (s1, s2), d1, d2 in itertools.product(SHAPE_PAIRS, DTYPES, DTYPES):
        if name == "sub_" and torch.bool in (d1, d2):
            continue  # sub_ of bools raises earlier, in PyTorch's native check, either way
        for alpha in (1, 2):
            want = outcome(py_meta.meta_binop_inplace_alpha, meta(s1, d1), meta(s2, d2), alpha=alpha)
            got = outcome(op, meta(s1, d1), meta(s2, d2), alpha=alpha)
            assert got == want, (name, s1, d1, s2, d2, alpha)
            checked += 1
    assert checked > 1000


@pytest.mark.parametrize("name", ["add_", "sub_"])
def test_add_sub_scalar_matches_python_meta(name):
    op = getattr(torch.ops.aten, name).Scalar
    for shape, dtype, other in itertools.product([(), (2, 3)], DTYPES, SCALARS):
        want = outcome(py_meta.meta_binop_inplace_alpha, meta(shape, dtype), other)
        assert outcome(op, meta(shape, dtype), other) == want, (name, shape, dtype, other)


def test_fill_relu_match_python_meta():
    for shape, dtype in itertools.product([(), (2, 3)], DTYPES):
        for value in SCALARS:
            want = outcome(py_meta.meta_fill_, meta(shape, dtype), value)
            assert outcome(torch.ops.aten.fill_.Scalar, meta(shape, dtype), value) == want
        for vshape in [(), (1,), (2, 3)]:
            want = outcome(py_meta.meta_fill_, meta(shape, dtype), meta(vshape, torch.float32))
            assert outcome(torch.ops.aten.fill_.Tensor, meta(shape, dtype), meta(vshape, torch.float32)) == want
        assert outcome(torch.ops.aten.relu_, meta(shape, dtype)) == outcome(py_meta.meta_relu_, meta(shape, dtype))


def test_inplace_ops_on_tpu_match_cpu(mode):
    # What functionalization's meta check passes or rejects on tpu tensors, as on CPU.
    torch.manual_seed(0)
    x = torch.randn(2, 3)
    n = torch.zeros((), dtype=torch.long)
    t = {k: v.to("tpu") for k, v in dict(x=x, n=n).items()}
    for ref, dev in ((dict(x=x, n=n), "cpu"), (t, "tpu")):
        ref["x"].add_(torch.ones(3, device=dev), alpha=2).sub_(0.5).relu_()
        ref["n"].add_(1)
        ref["n"].add_(True)
        ref["n"].add_(2)
    torch.testing.assert_close(t["x"].cpu(), x)
    assert t["n"].item() == n.item() == 4
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape|Attempting to broadcast"):
        t["x"].add_(torch.ones(4, 3, device="tpu"))
    with pytest.raises(RuntimeError):
        t["n"].add_(1.5)
    f = t["x"].clone()
    f.fill_(torch.tensor(3.0, device="tpu"))
    assert f.cpu().eq(3).all()
