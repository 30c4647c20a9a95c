"""torchtpu: TPUs and other XLA devices as a native PyTorch device named "tpu".

    import torch
    x = torch.randn(4, 4, device="tpu")

Every aten op on a tpu tensor is lowered to StableHLO and compiled by XLA (through
jaxlib's client), on the platform chosen by TORCHTPU_PLATFORM (tpu, cuda or cpu).
"""
import contextlib
import os

import torch

__version__ = "0.1.0"
__all__ = ["device", "platform", "set_mode", "get_mode", "mode", "sync", "metrics", "data", "profiler",
           "export", "Exported", "to_jax", "from_jax", "jax_op", "register_jax_op",
           "scan_layers", "StackedLayers", "explain", "spmd"]

from torchtpu import _report, _settings, _versions  # noqa: E402  (they import nothing heavy)

# Before anything loads _C: a torch or jax/jaxlib this build cannot use is an ImportError
# that says how to fix it, never an undefined-symbol error.
_versions.check_versions()


def _initialize():
    __import__("torchtpu.integrations", fromlist=["_"]).adapters_enabled()  # a bad setting fails before any change
    settings = _settings.read()  # every other setting, checked before anything starts
    _C = _versions.load_core(torch.__version__)  # the glue compiled for this torch minor

    local_rank, local_world_size = _process_layout()
    # The runtime (jaxlib's client or a PJRT plugin's, TORCHTPU_RUNTIME) starts at the first
    # tpu use, so that a torchrun process can join the job's distributed runtime first
    # (torchtpu.distributed).
    from torchtpu import _pjrt

    _pjrt.configure(_C, settings, local_rank, local_world_size)
    _C.set_fallback_policy(settings.fallback)
    _C.set_cache_dir(settings.cache_dir)
    _C.set_dump_dir(settings.dump_dir)
    if settings.max_pending_ops is not None:
        _C.set_max_pending_ops(settings.max_pending_ops)
    if settings.executable_cache_size is not None:
        _C.set_executable_cache_size(settings.executable_cache_size)
    _C.set_mode(settings.mode)
    if settings.explain:
        _C.explain_print(list(settings.explain))
    from torchtpu import _patches

    _patches.install()  # a torch it cannot patch raises PatchError, leaving torch as it was

    # Only now, with the runtime up and torch patched, does PyTorch learn the device name
    # (unless torchtpu_autoload named it for a stand-in after a failed start).
    if torch._C._get_privateuse1_backend_name() != "tpu":
        torch.utils.rename_privateuse1_backend("tpu")

    from torchtpu import device_module

    if getattr(torch, "tpu", None) is not device_module:
        if hasattr(torch, "tpu"):  # the stand-in of a failed start
            delattr(torch, "tpu")
        torch._register_device_module("tpu", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=False
    )
    __import__("torchtpu.integrations", fromlist=["_"]).install()  # torch fixes; library adapters on import
    __import__("torchtpu.distributed", fromlist=["_"]).install()  # torch.distributed's "tpu" backend
    from torchtpu import _exit

    _exit.install(_C)  # a tpu backward's last reference dropped before Python finalizes
    # torch.compile(backend="tpu") finds torchtpu.compiler through the torch_dynamo_backends
    # entry point (pyproject.toml): nothing to register here, and Dynamo stays unimported.


def _process_layout():
    """(LOCAL_RANK, LOCAL_WORLD_SIZE) in a multi-process torchrun job, else (0, 0).

    One process per device: the node's devices are tpu:0..LOCAL_WORLD_SIZE-1 and this
    process drives tpu:LOCAL_RANK, which is also its current device."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ["LOCAL_RANK"])
        local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return 0, 0
    if world <= 1 or not 0 <= local_rank < local_world:
        return 0, 0
    return local_rank, local_world


try:
    _initialize()
except Exception as error:
    _report.exit_if_reporting([str(error)])  # `python -m torchtpu` reports instead of raising
    raise

from torchtpu import _C  # noqa: E402
from torchtpu import data  # noqa: E402
from torchtpu import metrics  # noqa: E402
from torchtpu.jax_interop import from_jax, jax_op, register_jax_op, to_jax  # noqa: E402
from torchtpu import profiler  # noqa: E402
from torchtpu import spmd  # noqa: E402
from torchtpu._export import Exported, export  # noqa: E402

__import__("torchtpu._linalg", fromlist=["_"]).install()  # tpu kernels of the JAX-lowered linalg ops
from torchtpu.scan import scan_layers  # noqa: E402
from torchtpu.stacked import StackedLayers  # noqa: E402
from torchtpu._explain import explain  # noqa: E402


def platform() -> str:
    """The XLA platform tpu tensors run on: "cpu", "cuda" or "tpu"."""
    return _C.platform()


def device(index: int | None = None) -> torch.device:
    """torch.device("tpu:N"), the current device when index is None."""
    return torch.device("tpu", _C.current_device() if index is None else index)


def set_mode(name: str) -> None:
    """Selects the eager mode: "debug", "strict" or "fused" (the default)."""
    _C.set_mode(name)


def get_mode() -> str:
    return _C.get_mode()


@contextlib.contextmanager
def mode(name: str):
    """Runs the block in the given eager mode, then restores the previous one."""
    previous = _C.get_mode()
    _C.set_mode(name)
    try:
        yield
    finally:
        _C.set_mode(previous)


def sync(wait: bool = False) -> None:
    """Runs all pending device work now; with wait=True, also waits for it to finish."""
    _C.sync(wait)
