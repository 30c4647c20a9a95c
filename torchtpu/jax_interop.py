"""JAX interop: tpu tensors as jax.Arrays, and JAX (or Pallas) functions as torch ops.

- `to_jax(t)` / `from_jax(a)` share the device buffer (no copy, nothing crosses the host).
- `jax_op(fn)` / `register_jax_op(name, fn, vjp=None)` make a torch op `torch.ops.torchtpu.<name>`
  out of a JAX function. Per input signature its StableHLO (`jax.jit(fn).lower(...)` for
  torchtpu's platform) is registered once with the core, and each call records one node
  that the lowering inlines into the graph around it: in fused mode the function joins the
  pending graph like any aten op (no launch of its own, no host trip), in strict/debug mode
  it is one cached executable, under torch.compile it is part of the captured graph.
  Autograd goes through `jax.vjp` (itself a jax op, so the backward is inlined too) unless a
  custom backward (a JAX function) is given.

Lowering happens under JAX's 64-bit mode when an input is 64-bit, so float64 / int64
tensors keep their types (without it JAX would silently compute them in 32 bits).
"""
from __future__ import annotations

import contextlib
import inspect
import re
import threading
from typing import Callable, NamedTuple, Sequence

import numpy
import torch
import torch.utils._pytree as torch_pytree

from torchtpu import _C, _lazy, _pjrt

jax = _lazy.module("jax")  # imported at the first use: a plain model needs no jax

__all__ = ["to_jax", "from_jax", "jax_op", "register_jax_op", "JaxOp"]

# torch dtype <-> the numpy/jax dtype name (the names torchtpu's core uses too).
_JAX_DTYPE_NAMES = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8",
    torch.uint8: "uint8", torch.bool: "bool",
}
# torchtpu's DType codes are c10::ScalarType's.
_TORCH_DTYPE_OF_CODE = {
    0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
    6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16,
}
_WIDE = (torch.float64, torch.int64)


def _require_jax() -> None:
    """Imports jax now; without it, an ImportError naming the fix (under TORCHTPU_RUNTIME=pjrt a
    plain model runs without jax, these features do not)."""
    try:
        import jax  # noqa: F401
    except ImportError as error:
        from torchtpu import _versions

        raise ImportError(f"{error}; torchtpu's JAX interop, jax_op and linear algebra need jax. "
                          f"Fix: {_versions.jax_install_command()}") from error


def to_jax(tensor: torch.Tensor) -> jax.Array:
    """The jax.Array sharing `tensor`'s device buffer (pending work for it runs first).

    JAX arrays are immutable: later in-place updates of `tensor` go to a new buffer and do
    not show in the array (torchtpu never reuses a buffer JAX holds).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"torchtpu.to_jax expects a torch.Tensor, got {type(tensor).__name__}")
    _require_jax()
    if tensor.requires_grad:
        tensor = tensor.detach()
    return _C.to_jax(tensor)


def from_jax(array: jax.Array) -> torch.Tensor:
    """A tpu tensor sharing the device buffer of `array` (a single-device jax.Array on one
    of torchtpu's devices): no copy."""
    _require_jax()
    if not isinstance(array, jax.Array):
        raise TypeError(f"torchtpu.from_jax expects a jax.Array, got {type(array).__name__}")
    if array.dtype.name not in _JAX_DTYPE_NAMES.values():
        raise TypeError(f"torchtpu.from_jax: dtype {array.dtype.name} has no tpu tensor dtype (supported: "
                        f"{', '.join(_JAX_DTYPE_NAMES.values())})")
    return _C.from_jax(array)


# ---------------------------------------------------------------------------------------
# Lowering JAX functions for torchtpu's platform.


class Lowered(NamedTuple):
    key: str                  # the core's key of the registered StableHLO module
    out_tree: object          # jax treedef of the function's outputs
    out_types: tuple          # ((shape, torch dtype), ...) of the flat outputs


def jax_dtype(dtype: torch.dtype):
    try:
        return jax.numpy.dtype(_JAX_DTYPE_NAMES[dtype])
    except KeyError:
        raise TypeError(f"torchtpu: dtype {dtype} has no JAX counterpart that tpu tensors support") from None


def _x64(enabled: bool):
    """JAX's 64-bit mode for one lowering (jax.enable_x64 is a context manager in 0.10+)."""
    return jax.enable_x64(True) if enabled else contextlib.nullcontext()


def lower(name: str, fn: Callable, types: Sequence[tuple], x64: bool = False) -> Lowered:
    """Lowers `fn` for inputs of `types` ((shape, torch dtype), ...) on torchtpu's platform
    and registers the StableHLO with the core. JAX's 64-bit mode is on with `x64` or when an
    input is 64-bit. No caching here: callers cache per signature."""
    _require_jax()
    specs = [jax.ShapeDtypeStruct(tuple(shape), jax_dtype(dtype)) for shape, dtype in types]
    with _x64(x64 or any(dtype in _WIDE for _, dtype in types)):
        # keep_unused: the module takes every input, in order, as the call node passes them.
        traced = jax.jit(fn, keep_unused=True).trace(*specs)
        text = traced.lower(lowering_platforms=(_C.platform(),)).as_text()
    _pjrt.register_custom_calls(text)
    key = _C.register_stablehlo(name, text)
    out_types = tuple((tuple(shape), _TORCH_DTYPE_OF_CODE[code]) for shape, code in _C.stablehlo_results(key))
    return Lowered(key, traced.out_tree, out_types)


# ---------------------------------------------------------------------------------------
# JAX functions as torch ops.

_NAMESPACE = "torchtpu"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class JaxOp:
    """A JAX function as the torch op `torch.ops.torchtpu.<name>` (schema
    `(Tensor[] inputs) -> Tensor[]`); calling the JaxOp takes and returns tensors in the
    function's own structure (positional tensors in, its output pytree out)."""

    def __init__(self, name: str, fn: Callable, vjp: Callable | None = None, hint: str = ""):
        if not _NAME.match(name):
            raise ValueError(f"torchtpu.jax_op: {name!r} is not a valid op name (letters, digits, _)")
        if hasattr(torch.ops, _NAMESPACE) and hasattr(getattr(torch.ops, _NAMESPACE), name):
            raise RuntimeError(
                f"torchtpu.jax_op: torch.ops.{_NAMESPACE}.{name} is already defined; pass another name="
            )
        self.name = name
        self.fn = fn
        self._custom_vjp = vjp
        self._hint = hint  # added to lowering errors
        self._lowered: dict[tuple, Lowered] = {}
        self._lock = threading.Lock()
        self._out_spec = None      # torch pytree spec of the outputs (same for every signature)
        self._backward_ops: dict[int, JaxOp] = {}
        self.op = torch.library.custom_op(
            f"{_NAMESPACE}::{name}", self._run, mutates_args=(), device_types="tpu",
            schema="(Tensor[] inputs) -> Tensor[]",
        )
        self.op.register_kernel("cpu")(self._run_on_host)
        self.op.register_fake(self._fake)
        self.op.register_autograd(self._backward, setup_context=self._setup_context)

    def __repr__(self):
        return f"<torchtpu.JaxOp torch.ops.{_NAMESPACE}.{self.name}>"

    def __call__(self, *tensors):
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"torchtpu op {self.name}: argument {i} is a {type(t).__name__}; jax ops take tensors only "
                    "(bind other arguments with functools.partial before registering the function)"
                )
        outputs = self.op(list(tensors))
        return torch_pytree.tree_unflatten(outputs, self._out_spec)

    # --- lowering, once per input signature -----------------------------------------------

    def lowered(self, types: tuple) -> Lowered:
        with self._lock:
            found = self._lowered.get(types)
            if found is None:
                try:
                    found = lower(self.name, self.fn, types)
                except Exception as error:
                    if hasattr(error, "add_note"):  # Python 3.11+
                        error.add_note(f"(while lowering torchtpu op {self.name} for inputs "
                                       f"{', '.join(f'{d}{list(s)}' for s, d in types)}){self._hint}")
                    raise
                self._lowered[types] = found
                self._note_out_structure(found.out_tree)
            return found

    def _note_out_structure(self, out_tree):
        # torch's pytree spec of the outputs, so that __call__ (traced by Dynamo too) can
        # rebuild the function's output structure with torch's own pytree functions.
        skeleton = jax.tree.unflatten(out_tree, list(range(out_tree.num_leaves)))
        spec = torch_pytree.tree_structure(skeleton)
        if self._out_spec is not None and spec != self._out_spec:
            raise RuntimeError(f"torchtpu op {self.name}: the output structure changed with the input shapes")
        self._out_spec = spec

    @staticmethod
    def _types(tensors) -> tuple:
        return tuple((tuple(int(s) for s in t.shape), t.dtype) for t in tensors)

    # --- the op's kernels -------------------------------------------------------------------

    def _run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return _C.call_stablehlo(self.lowered(self._types(inputs)).key, inputs)

    def _run_on_host(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        # CPU tensors: the function runs with JAX on the host (a reference for the tpu path).
        with _x64(any(t.dtype in _WIDE for t in inputs)):
            cpu = jax.devices("cpu")[0]
            arrays = [jax.device_put(jax.dlpack.from_dlpack(t.detach().contiguous()), cpu) for t in inputs]
            outputs = jax.tree.leaves(jax.jit(self.fn, keep_unused=True)(*arrays))
        # Copies: JAX may reuse its arrays' memory, torch may write into the results.
        return [torch.from_dlpack(o).clone() for o in outputs]

    def _fake(self, inputs):
        lowered = self.lowered(self._types(inputs))
        device = inputs[0].device if inputs else torch.device("tpu")
        return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in lowered.out_types]

    # --- autograd: the backward is another jax op ------------------------------------------

    @staticmethod
    def _setup_context(ctx, inputs, output):
        (tensors,) = inputs
        ctx.save_for_backward(*tensors)
        ctx.float_outputs = [t.is_floating_point() for t in output]
        ctx.output_types = [(tuple(t.shape), t.dtype) for t in output]

    def _backward(self, ctx, grads):
        primals = ctx.saved_tensors
        cotangents = []
        for g, is_float, (shape, dtype) in zip(grads, ctx.float_outputs, ctx.output_types):
            if is_float:
                cotangents.append(g if g is not None else torch.zeros(shape, dtype=dtype, device=primals[0].device))
        input_grads = iter(self.backward_op(len(primals))(*primals, *cotangents))
        return [next(input_grads) if t.is_floating_point() else None for t in primals]

    def backward_op(self, arity: int) -> "JaxOp":
        """The jax op computing the gradients of the float inputs (in order) from the `arity`
        inputs and the cotangents of the float outputs: `<name>_backward` (with the arity
        appended for functions that take *args)."""
        with self._lock:
            op = self._backward_ops.get(arity)
            if op is None:
                name = f"{self.name}_backward" if _fixed_arity(self.fn) else f"{self.name}_backward{arity}"
                hint = "" if self._custom_vjp else (
                    f"; jax.vjp cannot differentiate {self.name} (Pallas kernels, for one): give its backward "
                    "as vjp= to torchtpu.jax_op / register_jax_op")
                op = JaxOp(name, _vjp_function(self.fn, arity, self._custom_vjp), hint=hint)
                self._backward_ops[arity] = op
            return op


def _fixed_arity(fn: Callable) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)


def _vjp_function(fn: Callable, arity: int, custom_vjp: Callable | None) -> Callable:
    """A JAX function (*primals, *cotangents of the float outputs) -> tuple of the float
    inputs' gradients, through jax.vjp or the custom backward `custom_vjp(primals, cotangent)`
    (which returns one gradient per input, None where there is none)."""
    jnp = jax.numpy

    def is_float(x):
        return jnp.issubdtype(x.dtype, jnp.floating)

    def backward(*args):
        primals, float_cotangents = args[:arity], list(args[arity:])
        leaves, tree = jax.tree.flatten(jax.eval_shape(fn, *primals))
        # Integer outputs have no cotangent on the torch side; JAX wants float0 zeros there.
        cotangent = jax.tree.unflatten(tree, [
            float_cotangents.pop(0) if is_float(leaf) else numpy.zeros(leaf.shape, dtype=jax.dtypes.float0)
            for leaf in leaves
        ])
        float_inputs = [i for i, p in enumerate(primals) if is_float(p)]
        if custom_vjp is not None:
            grads = custom_vjp(tuple(primals), cotangent)
            if not isinstance(grads, (tuple, list)) or len(grads) != len(primals):
                raise TypeError(f"the backward of {getattr(fn, '__name__', 'the function')} must return one "
                                f"gradient per input ({len(primals)}), None where there is none")
            return tuple(jnp.zeros_like(primals[i]) if grads[i] is None else grads[i] for i in float_inputs)

        def of_float_inputs(*values):
            full = list(primals)
            for i, value in zip(float_inputs, values):
                full[i] = value
            return fn(*full)

        _, pullback = jax.vjp(of_float_inputs, *[primals[i] for i in float_inputs])
        return tuple(pullback(cotangent))

    return backward


def register_jax_op(name: str, fn: Callable, vjp: Callable | None = None) -> JaxOp:
    """Makes the JAX function `fn` (tensors in, a pytree of arrays out) the torch op
    `torch.ops.torchtpu.<name>` and returns it as a callable. `vjp(primals, cotangent)`, a JAX
    function returning one gradient per input (None for none), replaces jax.vjp in the
    backward; the cotangent has the structure of fn's output."""
    return JaxOp(name, fn, vjp)


def jax_op(fn: Callable | None = None, *, name: str | None = None, vjp: Callable | None = None):
    """Decorator form of register_jax_op: `@torchtpu.jax_op` or `@torchtpu.jax_op(name=..., vjp=...)`;
    the op is named after the function unless `name` is given."""

    def make(f):
        return register_jax_op(name or f.__name__, f, vjp)

    return make(fn) if fn is not None else make
