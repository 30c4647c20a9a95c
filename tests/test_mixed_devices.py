"""Ops mixing a tpu tensor with a tensor of another device raise CUDA's RuntimeError (a cuda
tensor there, a tpu tensor here); what CUDA accepts (0-dim CPU tensors as scalars, CPU
indices for advanced indexing) keeps working and equals CPU. The user's tensors are
untouched by a rejected op."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu
import utils
from utils import assert_close

# TensorIterator's wording (elementwise ops, in-place and out= ones included).
ELEMENTWISE = r"^Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu!$"


def same_device_error(argument):
    """The generated wrappers' wording (PyTorch's own function writes it) naming the argument."""
    return rf"^Expected all tensors to be on the same device, but got {argument} is on cpu, different from other " \
           rf"tensors on tpu:0 \(when checking argument in method wrapper_PrivateUse1_"


def inputs():
    torch.manual_seed(0)
    return torch.randn(4, 3), torch.randn(4, 3)


def test_elementwise_rejects_a_cpu_tensor(mode):
    a, b = inputs()
    x = a.to("tpu")
    for op in (lambda: x + b, lambda: b + x, lambda: torch.where(x > 0, x, b), lambda: torch.maximum(b, x)):
        with pytest.raises(RuntimeError, match=ELEMENTWISE):
            op()
    assert_close(x, a)


def test_zero_dim_cpu_tensors_are_scalars(mode):
    a, _ = inputs()
    x = a.to("tpu")
    s = torch.tensor(2.5)
    assert_close(x * s, a * s)
    assert_close(s - x, s - a)
    assert_close(torch.where(x > 0, x, torch.tensor(0.0)), torch.where(a > 0, a, torch.tensor(0.0)))
    assert_close(x.masked_fill(x > 0, torch.tensor(-1.0)), a.masked_fill(a > 0, torch.tensor(-1.0)))
    y = x.clone()
    y.add_(s)
    assert_close(y, a + s)


def test_matmul_and_cat_and_losses_name_the_argument(mode):
    a, b = inputs()
    x = a.to("tpu")
    with pytest.raises(RuntimeError, match=same_device_error("mat2")):
        torch.mm(x, b.t())
    with pytest.raises(RuntimeError, match=same_device_error("tensors")):
        torch.cat([x, b])
    with pytest.raises(RuntimeError, match=same_device_error("target")):
        F.cross_entropy(x, torch.tensor([0, 1, 2, 0]))
    with pytest.raises(RuntimeError, match=same_device_error("indices")):
        F.embedding(torch.tensor([0, 2]), x)
    with pytest.raises(RuntimeError, match=same_device_error("index")):
        torch.index_select(x, 0, torch.tensor([1, 3]))
    with pytest.raises(RuntimeError, match=same_device_error("min")):  # checked strictly on CUDA too
        x.clamp(min=torch.tensor(0.0))
    with pytest.raises(RuntimeError, match=ELEMENTWISE):  # only masked_fill's value may be a CPU scalar
        x.masked_fill(torch.tensor(True), 1.0)
    assert_close(x, a)


def test_cpu_indices_index_a_tpu_tensor(mode):
    a, _ = inputs()
    x = a.to("tpu")
    rows = torch.tensor([3, 0, 3])
    assert_close(x[rows], a[rows])
    assert_close(x[rows, torch.tensor([2, 1, 0])], a[rows, torch.tensor([2, 1, 0])])
    y, z = x.clone(), a.clone()
    y[rows] = torch.tensor(7.0)
    z[rows] = torch.tensor(7.0)
    assert_close(y, z)
    y.index_put_((torch.tensor([1]),), torch.tensor(-2.0), accumulate=True)
    z.index_put_((torch.tensor([1]),), torch.tensor(-2.0), accumulate=True)
    assert_close(y, z)
    with pytest.raises(RuntimeError, match=ELEMENTWISE):  # the values are not indices
        y[rows] = torch.ones(3, 3)
    assert_close(y, z)


def test_tpu_indices_of_a_cpu_tensor_are_rejected(mode):
    a, _ = inputs()
    with pytest.raises(RuntimeError, match=r"^indices should be either on cpu or on the same device as the "
                                           r"indexed tensor \(cpu\)$"):
        a[torch.tensor([0, 1], device="tpu")]


def test_in_place_either_way(mode):
    a, b = inputs()
    x, c = a.to("tpu"), b.clone()
    with pytest.raises(RuntimeError, match=ELEMENTWISE):
        x.add_(b)
    with pytest.raises(RuntimeError, match=ELEMENTWISE):
        c.mul_(x)
    with pytest.raises(RuntimeError, match=ELEMENTWISE):  # a CPU destination takes no tpu scalar either
        c.add_(x.sum())
    assert_close(x, a)
    assert torch.equal(c, b)


def test_out_arguments_either_way(mode):
    a, b = inputs()
    x = a.to("tpu")
    out_cpu, out_tpu = torch.zeros(4, 3), torch.zeros(4, 3, device="tpu")
    with pytest.raises(RuntimeError, match=ELEMENTWISE):
        torch.add(x, x, out=out_cpu)
    with pytest.raises(RuntimeError, match=ELEMENTWISE):
        torch.add(a, b, out=out_tpu)  # all inputs on CPU: still the wrong device for out
    with pytest.raises(RuntimeError, match=ELEMENTWISE):
        torch.add(x, b, out=out_tpu)
    assert torch.equal(out_cpu, torch.zeros(4, 3))
    assert_close(out_tpu, torch.zeros(4, 3))
    torch.add(x, x, out=out_tpu)
    assert_close(out_tpu, a + a)


def test_foreach_lists_are_checked_per_tensor(mode):
    a, b = inputs()
    x = a.to("tpu")
    with pytest.raises(RuntimeError, match=ELEMENTWISE):
        torch._foreach_add([x], [b])
    assert_close(torch._foreach_mul([x], torch.tensor(3.0))[0], a * 3)


def test_copies_between_devices_still_work(mode):
    a, _ = inputs()
    x = torch.zeros(4, 3, device="tpu")
    x.copy_(a)
    c = torch.zeros(4, 3)
    c.copy_(x)
    assert torch.equal(c, a)
    x[1:3] = a[0:2]
    assert_close(x[1:3], a[0:2])


def test_a_rejected_op_leaves_pending_work_intact():
    a, b = inputs()
    with torchtpu.mode("fused"):
        x = a.to("tpu")
        y = x * 2
        with pytest.raises(RuntimeError, match=ELEMENTWISE):
            y + b
        assert_close(y + 1, a * 2 + 1)


def test_two_tpu_devices_raise_the_same_runtime_error():
    result = utils.run_python("""
        import torch, torchtpu
        a, b = torch.ones(3, device="tpu:0"), torch.ones(3, device="tpu:1")
        for name, op in [("add", lambda: a + b), ("mm", lambda: a.view(3, 1) @ b.view(1, 3)),
                         ("inplace", lambda: b.add_(a))]:
            try:
                op()
                print(name, "no error")
            except RuntimeError as e:
                print(name, e)
    """, timeout=300, TORCHTPU_NUM_DEVICES="2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "add Expected all tensors to be on the same device, but found at least two devices, tpu:0 and tpu:1!"
    assert lines[1].startswith("mm Expected all tensors to be on the same device, but got mat2 is on tpu:1, "
                               "different from other tensors on tpu:0")
    assert lines[2] == "inplace Expected all tensors to be on the same device, but found at least two devices, tpu:1 and tpu:0!"
