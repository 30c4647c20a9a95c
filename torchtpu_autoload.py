"""Entry point for PyTorch's backend autoloading (`import torch` loads torchtpu).

Kept outside the torchtpu package so that a failure (no jax, a bad setting such as
TORCHTPU_MODE=fast) becomes a warning here instead of breaking `import torch`. The error is
not lost: `import torchtpu` raises it, and so does the first use of the tpu device
(`torch.ones(1, device="tpu")`, `.to("tpu")`) through a stand-in `torch.tpu`, instead of
PyTorch's "Expected one of cpu, cuda, ... device type".
"""
import warnings


def load():
    try:
        import torchtpu  # noqa: F401
    except Exception as error:  # pragma: no cover - exercised through a subprocess test
        warnings.warn(f"torchtpu was not loaded: {error}", stacklevel=2)
        _stand_in(error)


def _stand_in(error: Exception) -> None:
    """Names the device "tpu" and registers a torch.tpu whose _lazy_init (which PyTorch calls
    before it creates or moves a tensor to the device) raises the start-up error."""
    import types

    import torch

    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", "tpu") or hasattr(torch, "tpu"):
        return  # another backend owns PrivateUse1, or torch.tpu exists: leave them alone
    try:
        torch.utils.rename_privateuse1_backend("tpu")
    except RuntimeError:
        return
    message = f"torchtpu could not start, so the tpu device is unavailable: {error}"

    def _lazy_init():
        try:
            raised = type(error)(message)
        except Exception:
            raised = RuntimeError(message)
        raise raised from error

    module = types.ModuleType("torch.tpu", "Stand-in for torchtpu's device module: torchtpu could not start.")
    module._lazy_init = _lazy_init
    module.is_available = lambda: False
    module.is_initialized = lambda: False
    module.device_count = lambda: 0
    module._is_in_bad_fork = lambda: False
    torch._register_device_module("tpu", module)
