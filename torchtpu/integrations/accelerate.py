"""accelerate: Accelerator() and transformers' Trainer place work on tpu, as they do on CUDA.

accelerate chooses its device in PartialState.default_device from a fixed list of device
types (mps, npu, cuda, xpu, ...) and falls back to CPU; its only other hook,
ACCELERATE_TORCH_DEVICE, would override use_cpu=True as well. So the adapter wraps that one
property: where accelerate would fall back to CPU and a tpu is available, the device is the
current tpu. cpu=True / use_cpu=True never consult it (accelerate then takes the CPU itself),
so they keep the CPU. Everything else (autocast("tpu") for bf16, moving batches, optimizer
state, save_model through safetensors) is accelerate's own code on the device it was given.
"""
import functools

import torch

from torchtpu import _patches
from torchtpu.integrations import check_version

SUPPORTED = ("1.0", "1.16")
TESTED = "1.15.0"


def install(module) -> None:
    import accelerate

    check_version("accelerate", accelerate.__version__, SUPPORTED, TESTED)
    _patches.apply("accelerate default device", module)


@_patches.patch("accelerate default device", when="import of accelerate.state", library="accelerate",
                targets=("accelerate.state.PartialState.default_device",))
def _patch_default_device(module):
    chooser = _patches.checked("accelerate default device", module.PartialState, "default_device", params=["self"],
                               is_property=True)

    @functools.wraps(chooser.fget)
    def default_device(self) -> torch.device:
        device = chooser.fget(self)
        if device.type == "cpu" and torch.tpu.is_available():
            return torch.device("tpu", torch.tpu.current_device())
        return device

    _patches._replace(module.PartialState, "default_device", property(default_device, doc=chooser.__doc__))
