"""JAX interop (issue 19.2, 19.3): to_jax / from_jax share device buffers (no bytes cross the
host), and JAX functions and Pallas kernels run as torch ops whose StableHLO is inlined into
torchtpu's graphs, in every mode and under torch.compile, with autograd through jax.vjp or a
custom backward. The oracle is PyTorch on CPU."""
import functools
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.experimental import pallas as pl

import torchtpu

ROOT = pathlib.Path(__file__).resolve().parent.parent


def traffic():
    c = torchtpu.metrics.counters()
    return c["bytes_to_host"], c["bytes_to_device"]


def launches():
    return torchtpu.metrics.counters()["execute_count"]


# ---- to_jax / from_jax ------------------------------------------------------------------


def test_to_jax_shares_the_buffer_without_host_traffic(mode):
    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    y = x * 2 + 1  # pending in fused mode: to_jax runs it first
    before = traffic()
    array = torchtpu.to_jax(y)
    assert traffic() == before
    assert isinstance(array, jax.Array) and array.shape == (3, 4) and array.dtype == jnp.float32
    assert torchtpu.to_jax(y) is array  # the very array that holds y's buffer
    back = torchtpu.from_jax(array)
    assert traffic() == before
    assert torchtpu.to_jax(back).unsafe_buffer_pointer() == array.unsafe_buffer_pointer()
    np.testing.assert_array_equal(np.asarray(array), (torch.arange(12.0).reshape(3, 4) * 2 + 1).numpy())


def test_from_jax_shares_the_buffer_and_computes(mode):
    array = jnp.arange(6, dtype=jnp.float32).reshape(2, 3) + 1
    before = traffic()
    t = torchtpu.from_jax(array)
    assert traffic() == before
    assert t.device.type == "tpu" and t.shape == (2, 3) and t.dtype == torch.float32
    assert torchtpu.to_jax(t).unsafe_buffer_pointer() == array.unsafe_buffer_pointer()
    t.mul_(10)  # writes a new buffer: the jax.Array is immutable and stays valid
    torchtpu.sync(wait=True)
    assert t.cpu().tolist() == [[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]]
    assert np.asarray(array).tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]


@pytest.mark.modes("fused")
def test_shared_buffer_is_never_donated():
    # An in-place update of a tensor nothing else holds would donate its buffer to the
    # result (deleting the jax.Array on it); sharing must prevent that.
    p = torch.zeros(4, device="tpu")
    array = torchtpu.to_jax(p)
    p.add_(1)
    torchtpu.sync(wait=True)
    assert not array.is_deleted() and np.asarray(array).tolist() == [0.0] * 4
    assert p.cpu().tolist() == [1.0] * 4


@pytest.mark.parametrize("dtype", [torch.int64, torch.bfloat16, torch.bool, torch.uint8, torch.float64])
def test_round_trip_keeps_dtype_and_values(dtype):
    source = torch.tensor([2**40 + 3, -7, 0, 1]).to(dtype)
    array = torchtpu.to_jax(source.to("tpu"))
    assert array.dtype.name == str(dtype).removeprefix("torch.")
    back = torchtpu.from_jax(array)
    assert back.dtype == dtype and torch.equal(back.cpu(), source)


def test_interop_errors_say_what_to_do():
    with pytest.raises(TypeError, match="expects a jax.Array, got ndarray"):
        torchtpu.from_jax(np.zeros(3))
    with pytest.raises(TypeError, match="dtype uint32 has no tpu tensor dtype"):
        torchtpu.from_jax(jnp.zeros(3, dtype=jnp.uint32))
    gone = jnp.ones(3)
    gone.delete()
    with pytest.raises(ValueError, match="has been deleted"):
        torchtpu.from_jax(gone)
    with pytest.raises(RuntimeError, match="expects a tpu tensor"):
        torchtpu.to_jax(torch.ones(3))


# ---- JAX functions as torch ops ---------------------------------------------------------


def rms_norm_jax(x, w):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def rms_norm_torch(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


rms_norm_op = torchtpu.register_jax_op("test_rms_norm", rms_norm_jax)


def leaves(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    cpu = [torch.randn(s, generator=g).requires_grad_() for s in shapes]
    tpu = [t.detach().to("tpu").requires_grad_() for t in cpu]
    return cpu, tpu


def test_jax_op_matches_pytorch_forward_and_backward(mode):
    (x, w), (tx, tw) = leaves((4, 16), (16,))
    expected = rms_norm_torch(x, w)
    out = rms_norm_op(tx, tw)
    assert torch.ops.torchtpu.test_rms_norm.default is not None
    torch.testing.assert_close(out.cpu(), expected)
    (expected * expected.detach()).sum().backward()
    (out * out.detach()).sum().backward()
    torch.testing.assert_close(tx.grad.cpu(), x.grad)
    torch.testing.assert_close(tw.grad.cpu(), w.grad)


@pytest.mark.modes("fused")
def test_jax_op_is_inlined_into_the_fused_graph():
    (x, w), (tx, tw) = leaves((8, 32), (32,), seed=1)
    torchtpu.sync(wait=True)
    start, before = launches(), traffic()
    loss = rms_norm_op(tx.tanh(), tw).relu().sum()  # aten ops on both sides of the jax op
    value = loss.item()
    assert launches() - start == 1  # one executable for the whole expression
    assert traffic()[0] - before[0] == 4 and traffic()[1] == before[1]  # only the float .item() read
    assert value == pytest.approx(rms_norm_torch(x.tanh(), w).relu().sum().item(), rel=1e-5)


def test_jax_op_with_custom_backward(mode):
    # Clamp whose backward lets every gradient through (straight-through estimator): the
    # given vjp, not jax.vjp (which would zero the clamped elements), must be used.
    @torchtpu.jax_op(name=f"test_straight_through_{mode}", vjp=lambda primals, g: (g,))
    def straight_through(x):
        return jnp.clip(x, -0.5, 0.5)

    (x,), (tx,) = leaves((6,), seed=2)
    out = straight_through(tx)
    torch.testing.assert_close(out.cpu(), x.detach().clamp(-0.5, 0.5))
    (out * torch.arange(6.0, device="tpu")).sum().backward()
    assert tx.grad.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_jax_op_with_several_and_integer_outputs(mode):
    @torchtpu.jax_op(name=f"test_scaled_and_argmax_{mode}")
    def scaled_and_argmax(x, scale):
        return {"scaled": x * scale, "argmax": jnp.argmax(x, axis=-1)}

    (x, s), (tx, ts) = leaves((3, 5), (5,), seed=3)
    out = scaled_and_argmax(tx, ts)
    assert set(out) == {"scaled", "argmax"}
    torch.testing.assert_close(out["scaled"].cpu(), x * s)
    assert out["argmax"].cpu().tolist() == x.argmax(-1).tolist()
    out["scaled"].sum().backward()  # the integer output has no gradient
    (x * s).sum().backward()
    torch.testing.assert_close(tx.grad.cpu(), x.grad)
    torch.testing.assert_close(ts.grad.cpu(), s.grad)


def test_jax_op_keeps_64_bit_types(mode):
    @torchtpu.jax_op(name=f"test_triple_{mode}")
    def triple(x):
        return x * 3

    big = torch.tensor([2**40 + 1, -5])  # beyond int32: JAX's 32-bit default would wrap it
    assert torch.equal(triple(big.to("tpu")).cpu(), big * 3)
    third = torch.tensor([1 / 3], dtype=torch.float64)
    out = triple(third.to("tpu"))
    assert out.dtype == torch.float64 and out.cpu().item() == (third * 3).item()


def test_jax_op_under_torch_compile():
    model = torch.nn.Linear(16, 16)
    weight = torch.randn(16, generator=torch.Generator().manual_seed(4))

    def step(layer, w, x, norm=rms_norm_op):
        return norm(layer(x), w).square().mean()

    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(5))
    expected = step(model, weight.requires_grad_(), x, norm=rms_norm_torch)
    expected.backward()
    tpu_model = torch.nn.Linear(16, 16)
    tpu_model.load_state_dict(model.state_dict())
    tpu_model.to("tpu")
    tw = weight.detach().to("tpu").requires_grad_()
    compiled = torch.compile(step, backend="tpu", fullgraph=True)  # the jax op is no graph break
    for _ in range(2):  # capture, then replay
        tw.grad = None
        tpu_model.zero_grad()
        loss = compiled(tpu_model, tw, x.to("tpu"))
        loss.backward()
        torch.testing.assert_close(loss.cpu(), expected.detach())
        torch.testing.assert_close(tw.grad.cpu(), weight.grad)
        torch.testing.assert_close(tpu_model.weight.grad.cpu(), model.weight.grad)


def test_jax_op_runs_on_cpu_tensors_through_jax():
    # The same op on CPU tensors runs the function with JAX on the host (a reference path).
    (x, w), _ = leaves((3, 8), (8,), seed=8)
    out = rms_norm_op(x, w)
    torch.testing.assert_close(out, rms_norm_torch(x, w))
    out.sum().backward()
    expected = [t.grad.clone() for t in (x, w)]
    x.grad = w.grad = None
    rms_norm_torch(x, w).sum().backward()
    torch.testing.assert_close(expected, [x.grad, w.grad])


def test_jax_op_errors():
    with pytest.raises(TypeError, match="argument 1 is a float; jax ops take tensors only"):
        rms_norm_op(torch.ones(2, 4, device="tpu"), 1.0)
    with pytest.raises(RuntimeError, match="torch.ops.torchtpu.test_rms_norm is already defined"):
        torchtpu.register_jax_op("test_rms_norm", rms_norm_jax)
    with pytest.raises(ValueError, match="not a valid op name"):
        torchtpu.register_jax_op("no spaces", rms_norm_jax)


# ---- Pallas kernels (interpret mode on CPU; native on TPU) -------------------------------


def readme_example() -> dict:
    """Runs the README's RMSNorm block (the one after "## JAX and Pallas kernels")."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## JAX and Pallas kernels"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    return namespace


README = readme_example()


def test_readme_pallas_rms_norm_replaces_the_pytorch_module(mode):
    g = torch.Generator().manual_seed(6)
    reference = torch.nn.RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        reference.weight.copy_(torch.rand(32, generator=g) + 0.5)
    fused = README["RMSNorm"](32)
    fused.load_state_dict(reference.state_dict())
    fused.to("tpu")
    x = torch.randn(4, 8, 32, generator=g, requires_grad=True)
    tx = x.detach().to("tpu").requires_grad_()
    expected, out = reference(x), fused(tx)
    torch.testing.assert_close(out.cpu(), expected)
    grad = torch.randn(4, 8, 32, generator=g)
    expected.backward(grad)
    out.backward(grad.to("tpu"))
    torch.testing.assert_close(tx.grad.cpu(), x.grad)
    torch.testing.assert_close(fused.weight.grad.cpu(), reference.weight.grad)


def test_pallas_kernel_without_a_backward_says_so():
    def double_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    @torchtpu.jax_op(name="test_pallas_double")
    def pallas_double(x):
        return pl.pallas_call(double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x)

    x = torch.arange(8.0, device="tpu").requires_grad_()
    out = pallas_double(x)
    assert out.cpu().tolist() == [2.0 * i for i in range(8)]
    with pytest.raises(Exception) as error:
        out.sum().backward()
    assert "give its backward as vjp=" in "".join(getattr(error.value, "__notes__", [])) + str(error.value)


def test_pallas_kernel_in_a_compiled_model():
    rms_norm = functools.partial(README["rms_norm"])
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(7))
    w = torch.ones(32)
    compiled = torch.compile(lambda a, b: rms_norm(a, b) * 2, backend="tpu", fullgraph=True)
    expected = torch.nn.functional.rms_norm(x, (32,), w, eps=1e-6) * 2
    torch.testing.assert_close(compiled(x.to("tpu"), w.to("tpu")).cpu(), expected)
