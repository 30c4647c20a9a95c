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
