"""transformers: generate() on tpu compiles nothing per token.

- A static (compileable) KV cache fixes the longest sequence before decoding starts
  (generation_config.max_length). The fused graphs around the model that grow the token row
  and the attention mask then run in the bucket of that length from the first padded step
  (torchtpu._buckets.at_least), so nothing compiles after the second generated token, whatever
  max_new_tokens is. A dynamic cache grows through the power-of-two buckets instead (one
  compile per doubling of the sequence), as any fused loop over growing sizes does.
- generate()'s own compile path: with a static cache on an accelerator, transformers compiles
  the forward with generation_config.compile_config. For a tpu model its default is already
  backend "tpu"; a compile_config that names Inductor (no tpu code generator) is compiled with
  the tpu backend instead, with a warning saying to set CompileConfig(backend="tpu").
- The stopping check without a wait per token: transformers' DeferredStopCheck copies each
  step's "all finished?" flag to pinned host memory without blocking and reads it one step
  later, so the host queues step t+1 while the device runs step t (one extra step is computed
  and undone at the end). transformers enables it on "mps" only; tpu has the same non-blocking
  copies and events (csrc/device/host_copies.h), so it is enabled there too. Where
  transformers has no DeferredStopCheck (before 5.2x) the loop waits for the flag each token.
"""
import dataclasses
import functools
import warnings

from torchtpu import _patches
from torchtpu.integrations import check_version

SUPPORTED = ("5.0", "6.0")
TESTED = "5.24.0"


def install(module) -> None:
    """Runs twice: for transformers.generation.utils (the decode loop) and for
    transformers.modeling_utils (the compile path), whichever loads first."""
    import transformers

    check_version("transformers", transformers.__version__, SUPPORTED, TESTED)
    if module.__name__.endswith("generation.utils"):
        _patches.apply("transformers decode loop", module)
        if hasattr(module, "DeferredStopCheck"):
            _patches.apply("transformers deferred stop check", module)
    else:
        _patches.apply("transformers compile config", module)


@_patches.patch("transformers decode loop", when="import of transformers.generation.utils",
                library="transformers", targets=("transformers.generation.utils.GenerationMixin._sample",))
def _adapt_decode_loop(module) -> None:
    mixin = module.GenerationMixin
    sample = _patches.checked("transformers decode loop", mixin, "_sample",
                              params=["self", "input_ids", "logits_processor", "stopping_criteria",
                                      "generation_config"])

    @functools.wraps(sample)
    def _sample(self, input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if input_ids.device.type != "tpu" or not getattr(cache, "is_compileable", False):
            return sample(self, input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs)
        from torchtpu import _buckets

        with _buckets.at_least(generation_config.max_length):
            return sample(self, input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs)

    _patches._replace(mixin, "_sample", _sample)


@_patches.patch("transformers deferred stop check", when="import of transformers.generation.utils",
                library="transformers",
                targets=("transformers.generation.utils.DeferredStopCheck.is_supported",
                         "transformers.generation.utils.DeferredStopCheck.__init__"))
def _defer_stop_check_on_tpu(module) -> None:
    import torch

    check = module.DeferredStopCheck
    is_supported = _patches.checked("transformers deferred stop check", check, "is_supported",
                                    params=["device", "cache", "cache_is_returned", "is_assistant"], reads=("type",))
    init = _patches.checked("transformers deferred stop check", check, "__init__",
                            params=["self", "input_ids", "max_length", "cache", "cache_is_returned"],
                            reads=("slots", "deque"))
    mps = torch.device("mps")  # only compared by type: transformers' rules for a device that defers

    @functools.wraps(is_supported)
    def supported(device, cache, cache_is_returned, is_assistant):
        if torch.device(device).type == "tpu":
            device = mps
        return is_supported(device, cache, cache_is_returned, is_assistant)

    @functools.wraps(init)
    def __init__(self, input_ids, max_length, cache, cache_is_returned, *args, **kwargs):
        init(self, input_ids, max_length, cache, cache_is_returned, *args, **kwargs)
        if input_ids.device.type == "tpu":
            # transformers pins its host slots for cuda only; a non-blocking copy into pageable
            # memory waits (as on CUDA), which would undo the deferral.
            self.slots = type(self.slots)((flag.pin_memory(), tokens.pin_memory(), event)
                                          for flag, tokens, event in self.slots)

    _patches._replace(check, "is_supported", supported)
    _patches._replace(check, "__init__", __init__)


@_patches.patch("transformers compile config", when="import of transformers.modeling_utils",
                library="transformers", targets=("transformers.modeling_utils.PreTrainedModel.get_compiled_call",))
def _adapt_compile_path(module) -> None:
    model_class = module.PreTrainedModel
    compiled_call = _patches.checked("transformers compile config", model_class, "get_compiled_call",
                                     params=["self", "compile_config"])

    @functools.wraps(compiled_call)
    def get_compiled_call(self, compile_config):
        if compile_config is not None and self.device.type == "tpu" and compile_config.backend == "inductor":
            warnings.warn("torchtpu: generation_config.compile_config asks for Inductor, which has no tpu code "
                          "generator; the forward is compiled with torch.compile(backend=\"tpu\") instead. Set "
                          "compile_config=CompileConfig(backend=\"tpu\") to say so.", stacklevel=3)
            compile_config = dataclasses.replace(compile_config, backend="tpu", mode="default")
        return compiled_call(self, compile_config)

    _patches._replace(model_class, "get_compiled_call", get_compiled_call)
