"""huggingface_hub: save_torch_state_dict / save_torch_model (transformers' save_pretrained
shards through it) of tpu tensors. The hub carries its own copy of safetensors'
shared-tensor helpers; they learn the tpu device the same way (see safetensors.py)."""
from torchtpu import _patches
from torchtpu.integrations import check_version
from torchtpu.integrations.safetensors import SHARED_TENSOR_HELPERS, patch_shared_tensor_checks

SUPPORTED = ("0.30", "2.5")
TESTED = "2.4.0"


def install(module) -> None:
    import huggingface_hub

    check_version("huggingface_hub", huggingface_hub.__version__, SUPPORTED, TESTED)
    _patches.apply("huggingface_hub shared tensors", module)


@_patches.patch("huggingface_hub shared tensors", when="import of huggingface_hub.serialization._torch",
                library="huggingface_hub",
                targets=tuple(f"huggingface_hub.serialization._torch.{name}" for name in SHARED_TENSOR_HELPERS))
def _patch_shared_tensors(module):
    patch_shared_tensor_checks("huggingface_hub shared tensors", module, module.get_torch_storage_size)
