"""safetensors: save_file/save/save_model of tpu tensors, load_file(device="tpu").

safetensors finds tensors that share memory through their storage's data pointer, which a
tpu tensor does not have (its storage lives on the device). A tpu tensor's storage is named
by its identity instead, and a tensor is "complete" when it covers all of its storage, so
tied weights are refused by save_file and deduplicated by save_model exactly as on CPU.
(Two disjoint slices of one tpu storage count as overlapping: refused, never written twice.)
The bytes themselves already go through a CPU copy (safetensors' _to_ndarray).
The Rust loader knows no "tpu" device: load to the host, then move.
"""
import functools

import torch

from torchtpu import _patches
from torchtpu.integrations import check_version

SUPPORTED = ("0.4", "0.9")
TESTED = "0.8.0"


def _is_tpu(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "tpu"


def _tpu_device(device):
    if isinstance(device, int):
        return None
    device = torch.device(device)
    return device if device.type == "tpu" else None


SHARED_TENSOR_HELPERS = ("storage_ptr", "_end_ptr", "_is_complete")


def patch_shared_tensor_checks(patch_name: str, module, storage_size) -> None:
    """Teaches a module with safetensors' shared-tensor helpers (storage_ptr, _end_ptr,
    _is_complete) the tpu device; huggingface_hub carries a copy of them."""
    storage_ptr, end_ptr, is_complete = (_patches.checked(patch_name, module, name, params=["tensor"])
                                         for name in SHARED_TENSOR_HELPERS)

    @functools.wraps(storage_ptr)
    def tpu_storage_ptr(tensor):
        if _is_tpu(tensor):
            return tensor.untyped_storage()._cdata
        return storage_ptr(tensor)

    @functools.wraps(end_ptr)
    def tpu_end_ptr(tensor):
        if _is_tpu(tensor):
            return tpu_storage_ptr(tensor) + tensor.nelement() * tensor.element_size()
        return end_ptr(tensor)

    @functools.wraps(is_complete)
    def tpu_is_complete(tensor):
        if _is_tpu(tensor):
            return tensor.nelement() * tensor.element_size() == storage_size(tensor)
        return is_complete(tensor)

    _patches._replace(module, "storage_ptr", tpu_storage_ptr)
    _patches._replace(module, "_end_ptr", tpu_end_ptr)
    _patches._replace(module, "_is_complete", tpu_is_complete)


def install(module) -> None:
    import safetensors

    check_version("safetensors", safetensors.__version__, SUPPORTED, TESTED)
    _patches.apply("safetensors shared tensors", module)
    _patches.apply("safetensors load_file", module)


@_patches.patch("safetensors shared tensors", when="import of safetensors.torch", library="safetensors",
                targets=tuple(f"safetensors.torch.{name}" for name in SHARED_TENSOR_HELPERS))
def _patch_shared_tensors(module):
    patch_shared_tensor_checks("safetensors shared tensors", module, module.storage_size)


@_patches.patch("safetensors load_file", when="import of safetensors.torch", library="safetensors",
                targets=("safetensors.torch.load_file",))
def _patch_load_file(module):
    load_file = _patches.checked("safetensors load_file", module, "load_file", params=["filename", "device"])

    @functools.wraps(load_file)
    def tpu_load_file(filename, device="cpu", **kwargs):
        target = _tpu_device(device)
        if target is None:
            return load_file(filename, device=device, **kwargs)
        return {name: tensor.to(target) for name, tensor in load_file(filename, device="cpu", **kwargs).items()}

    _patches._replace(module, "load_file", tpu_load_file)
