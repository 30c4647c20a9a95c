"""JAX's side of torchtpu.export: a StableHLO module as a jax.export.Exported (JAX's own
format for calling and serving a module), and calling one on torch tensors. Everything
it needs from jax's internals (the MLIR context, the portable-artifact serializer, the
fields of Exported) is in this file."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

_NUMPY_DTYPES = {
    torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
    torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
    torch.uint8: np.uint8, torch.bool: np.bool_,
}


def _numpy_dtype(dtype: torch.dtype):
    if dtype == torch.bfloat16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if dtype not in _NUMPY_DTYPES:
        raise TypeError(f"torchtpu.export: no JAX type for {dtype}")
    return np.dtype(_NUMPY_DTYPES[dtype])


def _serialized_module(text: str) -> bytes:
    """The module as a StableHLO portable artifact (versioned bytecode), as jax.export stores it."""
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import hlo

    with mlir.make_ir_context() as context, ir.Location.unknown(context):
        module = ir.Module.parse(text)
        # What jax.export targets: a StableHLO version at least 4 weeks old, which
        # consumers updated monthly can read.
        target = hlo.get_version_from_compatibility_requirement(hlo.StablehloCompatibilityRequirement.WEEK_4)
        return _jax.mlir.serialize_portable_artifact(module, target)


def exported(text: str, input_types: list, output_types: list):
    """A jax.export.Exported calling the module: flat positional inputs, a tuple of outputs,
    one device, any platform (the module has no platform-specific op)."""
    import jax
    import jax.export

    def avals(types):
        return tuple(jax.core.ShapedArray(tuple(t.shape), _numpy_dtype(t.dtype)) for t in types)

    n_in, n_out = len(input_types), len(output_types)
    values = dict(
        fun_name="torchtpu_export",
        in_tree=jax.tree_util.tree_structure((tuple(range(n_in)), {})),
        in_avals=avals(input_types),
        out_tree=jax.tree_util.tree_structure(tuple(range(n_out))),
        out_avals=avals(output_types),
        _has_named_shardings=True,  # none at all (one device); serialize() requires the flag
        _in_named_shardings=(None,) * n_in,
        _out_named_shardings=(None,) * n_out,
        in_shardings_hlo=(None,) * n_in,
        out_shardings_hlo=(None,) * n_out,
        nr_devices=1,
        platforms=(jax.default_backend(),),
        ordered_effects=(),
        unordered_effects=(),
        disabled_safety_checks=(jax.export.DisabledSafetyCheck.platform(),),
        mlir_module_serialized=_serialized_module(text),
        calling_convention_version=jax.export.maximum_supported_calling_convention_version,
        module_kept_var_idx=tuple(range(n_in)),
        uses_global_constants=False,
        _get_vjp=None,
    )
    fields = {f.name for f in dataclasses.fields(jax.export.Exported)}
    if fields - values.keys():
        raise RuntimeError(f"torchtpu.export does not know the fields {sorted(fields - values.keys())} of "
                           f"jax.export.Exported in jax {jax.__version__}")
    return jax.export.Exported(**{k: v for k, v in values.items() if k in fields})


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_numpy_dtype(torch.bfloat16))
    return t.numpy()


def _to_torch(a) -> torch.Tensor:
    a = np.asarray(a)
    if a.dtype == _numpy_dtype(torch.bfloat16):
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def call(exp, tensors: list) -> list:
    """Runs a jax.export.Exported on torch tensors; returns CPU tensors."""
    import jax

    # int64 and float64 cross the boundary as such (JAX would otherwise narrow them).
    with jax.enable_x64(True):
        results = exp.call(*[_to_numpy(t) for t in tensors])
    return [_to_torch(r) for r in results]
