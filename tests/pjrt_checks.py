"""Worker for tests/test_pjrt_runtime.py: runs under TORCHTPU_RUNTIME=pjrt in a fresh process
(the runtime is chosen when torchtpu loads) and prints one JSON line of findings, which the
tests assert on. Everything is seeded; comparisons are against PyTorch on CPU."""
import json
import sys

import torch

import torchtpu
from torchtpu import _C

found = {}
found["info"] = _C.runtime_info()

# A plain model's training step, in fused mode: jax stays unimported.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
reference.load_state_dict(model.state_dict())
model.to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
donated_before = torchtpu.metrics.counters()["donated_buffers"]
for step in range(3):
    x = torch.randn(4, 8)
    for m, opt, inputs in ((model, optimizer, x.to("tpu")), (reference, reference_optimizer, x)):
        loss = m(inputs).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
found["training_matches"] = all(torch.allclose(p.cpu(), q, atol=1e-6)
                                for p, q in zip(model.parameters(), reference.parameters()))
found["donated_buffers"] = torchtpu.metrics.counters()["donated_buffers"] - donated_before
found["jax_imported_by_a_model"] = "jax" in sys.modules

# int64 beyond 32 bits and bfloat16 survive the round trip.
found["int64"] = (torch.tensor([2**40, -3], device="tpu") * 2).cpu().tolist()
found["bf16"] = (torch.tensor([1.5, 2.25], dtype=torch.bfloat16, device="tpu") * 2).cpu().float().tolist()

# No GIL on the launch path: this thread holds it while a native thread launches.
found["launches_while_gil_held"] = _C.launches_while_gil_held(torch.ones(16, device="tpu"), 50, 20.0)

# Memory numbers: the CPU plugin keeps no allocator statistics, the byte count still works.
big = torch.ones(1024, 1024, device="tpu")
torch.tpu.synchronize()  # fused mode: the buffer exists once its graph ran
found["memory_allocated"] = torch.tpu.memory_allocated()
found["device_stats"] = sorted(k for k in torch.tpu.memory_stats() if k.startswith("device."))
del big

# The disk cache holds this module's executable (the test runs the worker twice).
found["disk_cache_hits_before"] = torchtpu.metrics.counters()["cache_hits_disk"]
cached = (torch.arange(7.0, device="tpu") * 3.5 - 1).cpu().tolist()
found["disk_cached_result"] = cached
found["disk_cache_hits"] = torchtpu.metrics.counters()["cache_hits_disk"] - found["disk_cache_hits_before"]

# A compile error carries the plugin's message.
try:
    key = _C.register_stablehlo("bad_call", """
module @m {
  func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.custom_call @torchtpu_no_such_target(%x) : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}""")
    _C.call_stablehlo(key, [torch.ones(4, device="tpu")])[0].cpu()
    found["compile_error"] = None
except Exception as error:
    found["compile_error"] = f"{type(error).__name__}: {error}"

# Single-process SPMD is the jaxlib runtime's: a Mesh says so, and so does the runtime when a
# mesh gets past it (built without its check).
import torchtpu.spmd  # noqa: E402


def mesh_without_check():
    mesh = object.__new__(torchtpu.spmd.Mesh)
    mesh.shape, mesh.axis_names, mesh.devices = (1,), ("data",), [0]
    mesh._c = _C._Mesh([0], [1], ["data"])
    return mesh


for name, make in (("mesh", lambda: torchtpu.spmd.Mesh(1, "data")),
                   ("runtime", lambda: torchtpu.spmd.shard(torch.ones(4), mesh_without_check(), (None,)).cpu())):
    try:
        make()
        found[f"spmd_{name}_error"] = None
    except Exception as error:
        found[f"spmd_{name}_error"] = f"{type(error).__name__}: {error}"

# JAX interop, zero-copy both ways, and the linear algebra JAX lowers (LAPACK custom calls).
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

a = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
t = torchtpu.from_jax(a)
back = torchtpu.to_jax(t)
found["from_jax_to_jax_same_memory"] = back.unsafe_buffer_pointer() == a.unsafe_buffer_pointer()
found["from_jax_values"] = (t * 2).cpu().tolist() == (torch.arange(12.0).reshape(3, 4) * 2).tolist()
wide = torchtpu.to_jax(torch.tensor([2**40, 5], device="tpu"))
found["to_jax_int64"] = [str(wide.dtype), [int(v) for v in wide]]
y = torch.arange(6.0, device="tpu") + 1
found["to_jax_twice_same_array"] = torchtpu.to_jax(y) is torchtpu.to_jax(y)
torch.manual_seed(1)
m = torch.randn(5, 5, dtype=torch.float64)
spd = m @ m.T + 5 * torch.eye(5, dtype=torch.float64)
on_tpu = spd.to("tpu")


def same_as_cpu(fn):
    """Whether fn gives CPU's result on tpu, or the RuntimeError's text (a jaxlib whose LAPACK
    handlers the plugin does not take: _pjrt.lapack_handlers_problem)."""
    try:
        return torch.allclose(fn(on_tpu).cpu(), fn(spd))
    except RuntimeError as error:
        return str(error)


found["linalg"] = {name: same_as_cpu(fn) for name, fn in (
    ("inv", torch.linalg.inv), ("eigvalsh", torch.linalg.eigvalsh), ("svdvals", torch.linalg.svdvals),
    ("det", torch.linalg.det))}
print("PJRT_CHECKS " + json.dumps(found))
