"""Entry point for PyTorch's backend autoloading (`import torch` loads torchtpu).

Kept outside the torchtpu package so that a failure (no jax, a bad setting such as
TORCHTPU_MODE=fast) becomes a warning here instead of breaking `import torch`. The error is
not lost: `import torchtpu` raises it, and so does the first use of the tpu device
(`torch.ones(1, device="tpu")`, `.to("tpu")`) through a stand-in `torch.tpu`, instead of
PyTorch's "Expected one of cpu, cuda, ... device type".

Google's TorchTPU (`torch_tpu`, PyPI torch-tpu) also renames PrivateUse1 to "tpu", registers
`torch.tpu` and autoloads through the same entry-point group, in an order PyTorch does not
define. Two backends on one device key would leave it half-registered, so with torch_tpu
installed torchtpu never autoloads: it says so once, with how to pick one. TORCHTPU_AUTOLOAD=0
turns torchtpu's autoload off (no message); `import torchtpu` still works where no other
package has claimed the device.
"""
import importlib.util
import os
import sys
import warnings

AUTOLOAD_VARIABLE = "TORCHTPU_AUTOLOAD"
# The other package that names PrivateUse1 "tpu": Google's TorchTPU (module, PyPI name).
RIVAL_MODULE, RIVAL_DISTRIBUTION = "torch_tpu", "torch-tpu"


class DeviceClaimedWarning(UserWarning):
    """Another installed package claims the "tpu" device, so torchtpu did not autoload."""


def autoload_enabled() -> bool:
    return os.environ.get(AUTOLOAD_VARIABLE, "1").strip() != "0"


def _rival_spec():
    try:
        return importlib.util.find_spec(RIVAL_MODULE)  # finds it without importing it
    except (ImportError, ValueError):
        return None


def rival_installed() -> bool:
    """Whether torch_tpu is imported or importable."""
    return RIVAL_MODULE in sys.modules or _rival_spec() is not None


def device_claimed_elsewhere() -> str | None:
    """The name another package gave PrivateUse1 ("tpu" for torch_tpu), or None when the key is
    free or torchtpu's own (torchtpu loaded, or its stand-in after a failed start)."""
    import torch

    name = torch._C._get_privateuse1_backend_name()
    if name == "privateuseone" or "torchtpu._C" in sys.modules:
        return None
    if getattr(getattr(torch, name, None), "_torchtpu_stand_in", False):
        return None
    return name


def claim_message(claimed: str | None) -> str:
    """Says which packages claim the device and how to pick one."""
    spec = _rival_spec()
    rival = f"{RIVAL_MODULE} ({os.path.dirname(spec.origin)})" if spec is not None and spec.origin else RIVAL_MODULE
    if claimed == "tpu" and rival_installed():
        state = f"{rival} has registered it"
    elif claimed is not None:
        state = f"another package has registered PrivateUse1 as {claimed!r}"
    else:
        state = f"{rival} is installed and registers it when it autoloads"
    return (f'Two packages claim the "tpu" device: torchtpu and {RIVAL_MODULE} (Google\'s TorchTPU); '
            f"{state}, so torchtpu is not loaded. To use {RIVAL_MODULE}: set {AUTOLOAD_VARIABLE}=0 "
            f"(or pip uninstall torchtpu) and this message goes away. To use torchtpu: pip uninstall "
            f"{RIVAL_DISTRIBUTION}, or set TORCH_DEVICE_BACKEND_AUTOLOAD=0 and `import torchtpu` yourself.")


def load():
    if not autoload_enabled() or "torchtpu" in sys.modules:
        return  # turned off, or `import torchtpu` is under way (it makes its own checks)
    claimed = device_claimed_elsewhere()
    if claimed is not None or rival_installed():
        warnings.warn(claim_message(claimed), DeviceClaimedWarning, stacklevel=2)
        return
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
    module._torchtpu_stand_in = True
    module._lazy_init = _lazy_init
    module.is_available = lambda: False
    module.is_initialized = lambda: False
    module.device_count = lambda: 0
    module._is_in_bad_fork = lambda: False
    torch._register_device_module("tpu", module)
