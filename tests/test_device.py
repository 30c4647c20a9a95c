"""The tpu device: transfers, dtypes, factories, printing, serialization, device module and
bad input. CPU is the oracle."""
import copy
import io
import os

import pytest
import torch

import torchtpu
import utils
from utils import assert_close, check

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]


def sample(dtype, shape=(3, 5)):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape) * 10).to(dtype)
    if dtype == torch.uint8:
        return torch.randint(0, 255, shape, dtype=dtype)
    return torch.randint(-100, 100, shape, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_every_dtype(mode, dtype):
    x = sample(dtype)
    t = x.to("tpu")
    assert t.device == torch.device("tpu:0") and t.dtype == dtype
    assert torch.equal(t.cpu(), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_conversion_on_device(mode, dtype):
    x = sample(torch.float32)
    assert_close(x.to("tpu").to(dtype), x.to(dtype), rtol=0, atol=0)


def test_non_contiguous_and_zero_size(mode):
    x = torch.randn(4, 6).t()
    assert torch.equal(x.to("tpu").cpu(), x)
    y = torch.randn(8, 8)[::2, 1::3]
    assert torch.equal(y.to("tpu").cpu(), y)
    for shape in [(0,), (3, 0), (0, 4, 2)]:
        z = torch.randn(shape)
        back = z.to("tpu").cpu()
        assert back.shape == z.shape
    scalar = torch.tensor(3.5)
    assert scalar.to("tpu").item() == 3.5


def test_source_tensor_mutation_does_not_leak(mode):
    x = torch.zeros(4)
    t = x.to("tpu")
    x.add_(1)
    assert torch.equal(t.cpu(), torch.zeros(4))


def test_copy_both_ways(mode):
    dst = torch.zeros(3, 4, device="tpu")
    src = torch.randn(3, 4)
    dst.copy_(src)
    assert torch.equal(dst.cpu(), src)
    back = torch.empty(3, 4)
    back.copy_(dst)
    assert torch.equal(back, src)
    ints = torch.zeros(3, 4, dtype=torch.int64, device="tpu")
    ints.copy_(src.to("tpu"))  # converting copy on device
    assert torch.equal(ints.cpu(), src.to(torch.int64))
    row = torch.zeros(3, 4, device="tpu")
    row.copy_(torch.arange(4.0))  # broadcasting copy
    assert torch.equal(row.cpu(), torch.arange(4.0).expand(3, 4))


def test_factories(mode):
    torch.manual_seed(0)
    assert torch.equal(torch.zeros(2, 3, device="tpu").cpu(), torch.zeros(2, 3))
    assert torch.equal(torch.ones(2, 3, dtype=torch.int32, device="tpu").cpu(), torch.ones(2, 3, dtype=torch.int32))
    assert torch.equal(torch.full((2, 2), 7.5, device="tpu").cpu(), torch.full((2, 2), 7.5))
    assert torch.empty(5, device="tpu").shape == (5,)
    assert torch.equal(torch.tensor([[1, 2], [3, 4]], device="tpu").cpu(), torch.tensor([[1, 2], [3, 4]]))
    t = torch.randn(3, device="tpu")
    assert torch.equal(torch.zeros_like(t).cpu(), torch.zeros(3))
    assert torch.equal(torch.ones_like(t).cpu(), torch.ones(3))
    assert torch.full_like(t, 2.0).cpu().tolist() == [2.0, 2.0, 2.0]


def test_item_tolist_bool(mode):
    t = torch.tensor([[1.5, 2.0], [3.0, 4.0]], device="tpu")
    assert t.sum().item() == 10.5
    assert t.tolist() == [[1.5, 2.0], [3.0, 4.0]]
    assert bool((t > 1).all()) is True
    if (t > 3).any():
        hit = True
    assert hit


def test_print_shows_device_and_values(mode):
    t = torch.tensor([1.0, 2.5], device="tpu")
    text = repr(t)
    assert text == "tensor([1.0000, 2.5000], device='tpu:0')"
    r = torch.tensor([1.0], device="tpu", requires_grad=True) * 2
    assert "grad_fn=<MulBackward0>" in repr(r) and "device='tpu:0'" in repr(r)
    assert "dtype=torch.int32" in repr(torch.tensor([1], dtype=torch.int32, device="tpu"))


def test_numpy_raises_like_cuda():
    t = torch.ones(2, device="tpu")
    with pytest.raises(TypeError, match="tpu"):
        t.numpy()


def test_model_to_and_state(mode):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    model.to("tpu")
    assert all(p.device.type == "tpu" for p in model.parameters())
    x = torch.randn(2, 4)
    expected = x @ ref["weight"].t() + ref["bias"]
    assert_close(model(x.to("tpu")), expected)
    model.cpu()
    assert torch.equal(model.weight, ref["weight"])


def test_save_and_load(mode, tmp_path):
    torch.manual_seed(0)
    t = torch.randn(3, 4, device="tpu")
    path = tmp_path / "t.pt"
    torch.save({"t": t, "list": [t * 2]}, path)
    loaded = torch.load(path)
    assert loaded["t"].device.type == "tpu"
    assert torch.equal(loaded["t"].cpu(), t.cpu())
    assert torch.equal(loaded["list"][0].cpu(), (t * 2).cpu())
    cpu_path = tmp_path / "c.pt"
    model = torch.nn.Linear(3, 2)
    torch.save(model.state_dict(), cpu_path)
    state = torch.load(cpu_path, map_location="tpu")
    assert all(v.device.type == "tpu" for v in state.values())
    assert torch.equal(state["weight"].cpu(), model.weight.detach())
    buffer = io.BytesIO()
    torch.save(model.to("tpu").state_dict(), buffer)
    buffer.seek(0)
    back = torch.load(buffer, map_location="cpu")
    assert back["weight"].device.type == "cpu"


def test_device_module_and_accelerator():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    torch.tpu.set_device(0)
    torch.tpu.synchronize()
    assert torchtpu.device() == torch.device("tpu:0")
    assert torchtpu.platform() in ("cpu", "cuda", "tpu")
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    before = torch.tpu.memory_allocated()
    t = torch.ones(1024, device="tpu")
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() >= before + 4096
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated()
    del t
    assert torch.tpu.memory_allocated() == before


def test_manual_seed_reproducible(mode):
    torch.tpu.manual_seed(123)
    a = torch.randn(16, device="tpu").cpu()
    b = torch.randn(16, device="tpu").cpu()
    torch.manual_seed(123)
    c = torch.randn(16, device="tpu").cpu()
    torch.tpu.manual_seed_all(7)
    d = torch.randn(16, device="tpu").cpu()
    assert torch.equal(a, c) and not torch.equal(a, b) and not torch.equal(a, d)


def test_device_index_out_of_range():
    count = torch.tpu.device_count()
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.zeros(2, device=f"tpu:{count}")
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.tpu.set_device(count + 3)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.ones(2).to(f"tpu:{count}")


def test_unsupported_dtype_is_a_type_error():
    with pytest.raises(TypeError, match="complex32 is not supported on tpu"):
        torch.zeros(2, dtype=torch.complex32, device="tpu")


def run_python(code, **env):
    return utils.run_python(code, timeout=300, **env)


def test_autoload_with_plain_import_torch():
    result = run_python("""
        import torch
        x = torch.randn(4, 4, device="tpu")
        y = (x @ x).relu()
        print(y.device, type(torch.tpu).__name__)
    """)
    assert result.returncode == 0, result.stderr
    assert "tpu:0" in result.stdout


def test_unknown_platform_is_a_value_error():
    result = run_python("import torchtpu", TORCHTPU_PLATFORM="gpu")
    assert result.returncode != 0
    assert "ValueError" in result.stderr
    assert "valid platforms are cpu, cuda, tpu" in result.stderr and "present here: " in result.stderr


def test_absent_platform_is_a_runtime_error():
    if torchtpu.platform() == "tpu":
        pytest.skip("this machine has a TPU")
    # The runtime starts at the first tpu use (torch.distributed may need to join a job first).
    result = run_python("import torch; torch.ones(1, device='tpu')", TORCHTPU_PLATFORM="tpu")
    assert result.returncode != 0
    assert "RuntimeError" in result.stderr and "'tpu' was requested" in result.stderr


def test_bad_platform_does_not_break_import_torch():
    result = run_python("import torch; print(torch.ones(1).item())", TORCHTPU_PLATFORM="gpu")
    assert result.returncode == 0, result.stderr
    assert "torchtpu was not loaded" in result.stderr


def test_missing_jax_is_an_import_error(tmp_path):
    blocker = tmp_path / "jax"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('No module named jax (test)')\n")
    result = run_python("import torchtpu", PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                        TORCHTPU_RUNTIME="jaxlib")  # the PJRT runtime needs no jax (tests/test_pjrt_runtime.py)
    assert result.returncode != 0
    assert "ImportError" in result.stderr and "pip install 'jax[cpu]" in result.stderr


def test_several_cpu_devices():
    result = run_python("""
        import torch, torchtpu
        print(torch.tpu.device_count())
        a = torch.ones(3, device="tpu:1") * 2
        b = a.to("tpu:2") + 1
        print(a.device, b.device, b.cpu().tolist())
    """, TORCHTPU_NUM_DEVICES="4")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[0] == "4"
    assert lines[1] == "tpu:1 tpu:2 [3.0, 3.0, 3.0]"


def test_model_to_keeps_tied_weights(mode):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    model = Tied().to("tpu")
    assert model.head.weight is model.embed.weight
    assert len(list(model.parameters())) == 1


@pytest.mark.parametrize("make, shape", [
    (lambda: torch.nn.LazyLinear(4), (2, 3)), (lambda: torch.nn.LazyConv1d(4, 2), (2, 3, 6)),
    (lambda: torch.nn.LazyConv2d(4, 3), (1, 2, 5, 5)), (lambda: torch.nn.LazyConv3d(2, 2), (1, 2, 3, 3, 3)),
    (lambda: torch.nn.LazyConvTranspose1d(4, 3), (1, 2, 5)), (lambda: torch.nn.LazyConvTranspose2d(3, 2), (1, 2, 4, 4)),
    (lambda: torch.nn.LazyConvTranspose3d(2, 2), (1, 2, 3, 3, 3)), (lambda: torch.nn.LazyBatchNorm1d(), (4, 3))],
    ids=["linear", "conv1d", "conv2d", "conv3d", "convt1d", "convt2d", "convt3d", "batchnorm1d"])
def test_lazy_modules_move_uninitialized_and_materialize_on_tpu(mode, make, shape):
    # A lazy module moved before its first forward keeps its uninitialized parameters (now on
    # tpu, in the dtype asked for) and materializes them there; it then computes as the
    # same module on CPU with its weights.
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter
    module = make().to("tpu", torch.float64)
    lazy = [t for t in list(module.parameters()) + list(module.buffers())
            if isinstance(t, (UninitializedParameter, UninitializedBuffer))]
    fresh = make()
    assert len(lazy) == len(list(fresh.parameters())) + sum(  # every one still uninitialized
        isinstance(b, UninitializedBuffer) for b in fresh.buffers())
    assert all(t.device.type == "tpu" and t.dtype == torch.float64 for t in lazy)
    x = torch.randn(shape, dtype=torch.float64)
    out = module(x.to("tpu"))
    assert type(module).__name__ == type(make()).__name__.replace("Lazy", "")  # materialized
    assert all(p.device.type == "tpu" and p.numel() > 0 for p in module.parameters())
    on_cpu = copy.deepcopy(module).to("cpu")
    assert_close(out, on_cpu(x), rtol=1e-6, atol=1e-6)


def test_inference_mode_runs_models_like_no_grad(mode):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 3))
    x = torch.randn(4, 6)
    tpu_model, xt = copy.deepcopy(model).to("tpu"), x.to("tpu")
    with torch.inference_mode():
        expected = model(x)[1:3].t()
        out = tpu_model(xt)[1:3].t()  # Linear's weight.t(), a slice, a transpose: views
        view = xt.view(24)
    assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert_close(view, x.view(24))
    assert not out.requires_grad


def test_inference_mode_untouched_without_tpu_tensors():
    result = run_python("""
import torch, torchtpu
with torch.inference_mode():
    t = torch.ones(3) * 2
print("INFERENCE", t.is_inference(), torch.is_inference_mode_enabled())
""")
    assert "INFERENCE True False" in result.stdout, result.stdout + result.stderr
