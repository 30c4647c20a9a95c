"""torchtpu.export: a model as a StableHLO module and its weights, for XLA serving.

    exported = torchtpu.export(model.eval(), (x,))
    exported.text                  # StableHLO: @main(*weights, *inputs) -> outputs
    exported.weights               # CPU tensors, in argument order (names in weight_names)
    exported.run(x)                # the outputs, computed by XLA through JAX (not torchtpu)
    blob = exported.jax().serialize()   # a jax.export.Exported: JAX's serving format

The graph comes from torch.export; its ops are lowered by torchtpu's own rules, so the
module computes what tpu computes. A dimension torch.export marks dynamic
(`dynamic_shapes=`) gets a module per size: `exported.stablehlo(x)`, `exported.jax(x)` and
`exported.run(x)` lower the graph for x's shapes; a size the export fixed is refused by
torch.export's guard, with its message.
"""
from __future__ import annotations

import copy
import dataclasses
import operator
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from torchtpu import _C

__all__ = ["export", "Exported"]


def export(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
           dynamic_shapes: Any = None, strict: bool = False) -> "Exported":
    """Exports `model` called on (args, kwargs) through torch.export and lowers it to
    StableHLO with torchtpu's rules. The model and inputs may be on CPU or tpu; a CPU model
    is copied to tpu for the export (the model itself is not moved). dynamic_shapes and
    strict go to torch.export.export."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"torchtpu.export takes a torch.nn.Module, got {type(model).__name__}")
    tpu_model = _on_tpu(model)
    tpu_args, tpu_kwargs = _to_tpu((tuple(args), dict(kwargs or {})))
    program = torch.export.export(tpu_model, tpu_args, tpu_kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    # Functional form (no decompositions): state the model writes shows as outputs.
    program = program.run_decompositions({})
    exported = Exported(program)
    exported._example = exported._lower(tpu_args, tpu_kwargs)  # fails here if a part cannot be exported
    return exported


class Exported:
    """A model exported by torchtpu.export: per input shapes, a StableHLO module taking
    (*weights, *inputs), the model's flattened tensor inputs in torch.export's order."""

    def __init__(self, program: ExportedProgram):
        _refuse_mutations(program)
        self.program = program
        self._module = program.module()
        specs = [s for s in program.graph_signature.input_specs if s.kind != InputKind.USER_INPUT]
        self._state_names = [s.target for s in specs]
        self._state = [operator.attrgetter(name)(self._module) for name in self._state_names]
        self._state_on_cpu = [t.detach().cpu() for t in self._state]  # a snapshot: training may go on
        self._lowered: dict[Any, _Lowered] = {}
        self._example: _Lowered | None = None

    @property
    def text(self) -> str:
        """The StableHLO module for the example inputs."""
        return self._example.text

    @property
    def weights(self) -> list[torch.Tensor]:
        """The module's leading arguments for the example inputs (CPU tensors)."""
        return self._example.weights

    @property
    def weight_names(self) -> list[str]:
        return self._example.weight_names

    def stablehlo(self, *args, **kwargs) -> str:
        """The module for these inputs' shapes (the example's when called without inputs)."""
        return self._for(args, kwargs).text

    def jax(self, *args, **kwargs):
        """A jax.export.Exported of the module for these inputs' shapes (the example's
        without inputs): `.call(*weights, *inputs)` inside JAX programs, `.serialize()`
        for serving (jax.export.deserialize reads it back)."""
        return self._for(args, kwargs).jax_exported()

    def run(self, *args, **kwargs):
        """The model's outputs for these inputs, computed by XLA through JAX from the module
        and its weights (CPU tensors, in the model's output structure)."""
        lowered = self._for(args, kwargs)
        inputs = [t.detach().cpu() for t in _tensor_leaves((args, kwargs))]
        return lowered.call(inputs)

    def __repr__(self) -> str:
        shapes = ", ".join(str(a) for a in self._example.input_types)
        return f"torchtpu.Exported({len(self.weights)} weights, inputs ({shapes}), {len(self._lowered)} module(s))"

    # -- lowering --------------------------------------------------------------------------

    def _for(self, args, kwargs) -> "_Lowered":
        if not args and not kwargs:
            return self._example
        return self._lower(*_to_tpu((tuple(args), dict(kwargs))))

    def _lower(self, args: tuple, kwargs: dict) -> "_Lowered":
        inputs = _tensor_leaves((args, kwargs))
        key = (pytree.tree_structure((args, kwargs)), tuple((tuple(t.shape), t.dtype) for t in inputs))
        if key in self._lowered:
            return self._lowered[key]
        self._check_fixed_sizes(pytree.tree_leaves((args, kwargs)))
        previous = _C.get_mode()
        _C.set_mode("fused")
        try:
            _C.export_begin()
            # The unlifted module checks torch.export's guards (fixed sizes, dynamic ranges).
            outputs = self._module(*args, **kwargs)
            leaves, out_spec = pytree.tree_flatten(outputs)
            tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
            text, constants = _C.export_end(self._state, inputs, tensors)
        finally:
            _C.set_mode(previous)
        lowered = _Lowered(
            text=text,
            weights=self._state_on_cpu + [c.cpu() for c in constants],
            weight_names=self._state_names + [f"constant{i}" for i in range(len(constants))],
            input_types=[_type_of(t) for t in inputs],
            output_types=[_type_of(t) for t in tensors],
            output_leaves=[None if isinstance(t, torch.Tensor) else t for t in leaves],
            out_spec=out_spec,
        )
        self._lowered[key] = lowered
        return lowered

    def _check_fixed_sizes(self, leaves: list) -> None:
        """A size the export did not mark dynamic must be the example's (torch.export's guard
        would say so too, without saying what to do)."""
        placeholders = [n for n in self.program.graph.nodes if n.op == "placeholder"]
        specs = self.program.graph_signature.input_specs
        user = [n for n, s in zip(placeholders, specs) if s.kind == InputKind.USER_INPUT]
        if len(user) != len(leaves):
            return  # (torch.export's guard checks these inputs)
        for i, (node, leaf) in enumerate(zip(user, leaves)):
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor) or not isinstance(leaf, torch.Tensor):
                continue
            if val.dim() != leaf.dim():
                raise ValueError(f"torchtpu.export: input {i} has {leaf.dim()} dimensions, the program was exported "
                                 f"with {val.dim()}")
            for d, (want, got) in enumerate(zip(val.shape, leaf.shape)):
                if isinstance(want, int) and want != got:
                    raise ValueError(
                        f"torchtpu.export: input {i} has size {got} in dimension {d}, but the model was exported with "
                        f"{want} there and that size is fixed; export with dynamic_shapes (torch.export.Dim) to "
                        "run other sizes")


@dataclasses.dataclass
class _TensorType:
    shape: tuple
    dtype: torch.dtype

    def __str__(self) -> str:
        return f"{str(self.dtype).replace('torch.', '')}{list(self.shape)}"


@dataclasses.dataclass
class _Lowered:
    """One module: its text, weights and the types of its inputs and outputs."""
    text: str
    weights: list
    weight_names: list
    input_types: list
    output_types: list
    output_leaves: list  # per output leaf: None for a tensor (in order), else the constant
    out_spec: Any
    _jax: Any = None

    def jax_exported(self):
        if self._jax is None:
            from torchtpu import _jax_export

            self._jax = _jax_export.exported(
                self.text, [_type_of(w) for w in self.weights] + self.input_types, self.output_types)
        return self._jax

    def call(self, inputs: list):
        from torchtpu import _jax_export

        results = iter(_jax_export.call(self.jax_exported(), self.weights + inputs))
        leaves = [next(results) if leaf is None else leaf for leaf in self.output_leaves]
        return pytree.tree_unflatten(leaves, self.out_spec)


def _type_of(t: torch.Tensor) -> _TensorType:
    return _TensorType(tuple(t.shape), t.dtype)


def _tensor_leaves(tree) -> list:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _to_tpu(tree):
    return pytree.tree_map(lambda t: t.to("tpu") if isinstance(t, torch.Tensor) and t.device.type != "tpu" else t, tree)


def _on_tpu(model: torch.nn.Module) -> torch.nn.Module:
    """The model if its state is on tpu, else a copy whose parameters and buffers are (the
    module structure is copied; each tensor goes to the device once, without a host copy)."""
    tensors = list(model.parameters()) + list(model.buffers())
    devices = {t.device.type for t in tensors}
    if devices <= {"tpu"}:
        return model
    if not devices <= {"tpu", "cpu"}:
        raise ValueError(f"torchtpu.export: the model has tensors on {sorted(devices)}; move it to cpu or tpu first")
    memo = {}
    for t in tensors:
        if id(t) in memo:
            continue
        moved = t.detach().to("tpu")
        memo[id(t)] = torch.nn.Parameter(moved, t.requires_grad) if isinstance(t, torch.nn.Parameter) else moved
    return copy.deepcopy(model, memo)


def _refuse_mutations(program: ExportedProgram) -> None:
    mutated = [s for s in program.graph_signature.output_specs
               if s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION)]
    if mutated:
        names = ", ".join(str(s.target) for s in mutated)
        raise ValueError(f"torchtpu.export: the model writes {names} when it runs (a BatchNorm in training mode "
                         "updates its running statistics); call model.eval() before exporting, or export a "
                         "model that keeps its state unchanged")
