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
           "scan_layers"]

_VALID_PLATFORMS = ("cpu", "cuda", "tpu")

from torchtpu import _report, _versions  # noqa: E402  (both import nothing heavy)

# Before anything loads _C: a torch or jax/jaxlib this build cannot use is an ImportError
# that says how to fix it, never an undefined-symbol error.
_versions.check_versions()


def _initialize():
    __import__("torchtpu.integrations", fromlist=["_"]).adapters_enabled()  # a bad setting fails before any change
    from torchtpu import _C

    requested = os.environ.get("TORCHTPU_PLATFORM", "").strip().lower()
    if requested and requested not in _VALID_PLATFORMS:
        present = _present_platforms()
        raise ValueError(
            f"TORCHTPU_PLATFORM={requested!r} is not a platform; valid platforms are "
            f"{', '.join(_VALID_PLATFORMS)} (present here: {', '.join(present) or 'none'})"
        )
    cpu_devices = int(os.environ.get("TORCHTPU_NUM_DEVICES", "1") or "1")
    _C.init(requested, cpu_devices)
    _C.set_fallback_policy(os.environ.get("TORCHTPU_FALLBACK", "warn").strip().lower() or "warn")
    cache_dir = os.environ.get("TORCHTPU_CACHE_DIR")
    if cache_dir is None:
        cache_dir = os.path.join(os.path.expanduser("~"), ".cache", "torchtpu")
    _C.set_cache_dir(cache_dir)
    _C.set_dump_dir(os.environ.get("TORCHTPU_DUMP_DIR", ""))
    if os.environ.get("TORCHTPU_MAX_PENDING_OPS"):
        _C.set_max_pending_ops(int(os.environ["TORCHTPU_MAX_PENDING_OPS"]))
    _C.set_mode(os.environ.get("TORCHTPU_MODE", "fused").strip().lower() or "fused")
    from torchtpu import _patches

    _patches.install()  # a torch it cannot patch raises PatchError, leaving torch as it was

    # Only now, with the runtime up and torch patched, does PyTorch learn the device name:
    # a failed start leaves torch exactly as it was.
    if torch._C._get_privateuse1_backend_name() != "tpu":
        torch.utils.rename_privateuse1_backend("tpu")

    from torchtpu import device_module

    if getattr(torch, "tpu", None) is not device_module:
        torch._register_device_module("tpu", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=False
    )
    __import__("torchtpu.integrations", fromlist=["_"]).install()  # torch fixes; library adapters on import
    # torch.compile(backend="tpu") finds torchtpu.compiler through the torch_dynamo_backends
    # entry point (pyproject.toml): nothing to register here, and Dynamo stays unimported.


def _present_platforms():
    present = []
    try:
        from jax._src import xla_bridge

        for name in _VALID_PLATFORMS:
            try:
                xla_bridge.get_backend(name)
                present.append(name)
            except Exception:
                pass
    except Exception:
        pass
    return present


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
from torchtpu._export import Exported, export  # noqa: E402

__import__("torchtpu._linalg", fromlist=["_"]).install()  # tpu kernels of the JAX-lowered linalg ops
from torchtpu.scan import scan_layers  # noqa: E402


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
