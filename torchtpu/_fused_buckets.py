"""Fused eager graphs at varying sizes run padded to buckets, as torch.compile's graphs do.

The engine (csrc/engine/buckets.h) notices a flush whose graph differs from an earlier graph
of the same structure only in its sizes, works out which sizes are dynamic (symbols, and
simple functions of them in views, slices and factories) and calls run() here with the
graph written with those sizes as expressions. This module

- renders that graph once per structure as an FX graph of aten ops whose values have
  symbolic shapes (fake tensors over one ShapeEnv), so that `_buckets.DynamicGraph` sees
  what it sees under torch.compile;
- rewrites it once per bucket with `_buckets`' rules (padding specs, masks, real lengths);
- on each flush, pads the inputs (`Padded.prepare`) and runs the rewritten graph on the tpu
  tensors in place of the flush: the first time, its ops are recorded into a pending graph at
  the bucket's sizes, which the engine compiles once per bucket (lengths are a small input)
  and which is kept as a capture (as torch.compile graphs are, torchtpu/compiler.py); later
  flushes at that bucket replay the captured executable without recording the ops again.

Outputs keep their padding on the device, with their real sizes (the engine slices them when
an exact-size graph or the user reads them); `run` reports each output's padding layout.
A flush that cannot run padded gets a string saying why and runs at its exact sizes.
"""
from __future__ import annotations

import operator

import torch

from torchtpu import _buckets

__all__ = ["run"]

# Per structure id (the engine's): its rendered graph, or why it cannot be bucketed.
_structures: dict = {}

# c10::ScalarType codes of the dtypes tpu supports, and the enum arguments ops take as ints.
_DTYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
           6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16}
_MEMORY_FORMATS = {0: torch.contiguous_format, 1: torch.preserve_format, 2: torch.channels_last,
                   3: torch.channels_last_3d}
_LAYOUTS = {0: torch.strided}

# Ops the engine records itself, as the aten calls that mean the same (their results'
# types come from the description, so only the rewrite rules see the difference).
_INTERNAL = {
    "torchtpu::zeros": lambda size, dtype, x: ((size,), {"dtype": dtype}, torch.ops.aten.zeros.default),
    "torchtpu::convert": lambda size, dtype, x: ((x,), {"dtype": dtype}, torch.ops.aten._to_copy.default),
    "torchtpu::broadcast": lambda size, dtype, x: ((x, size), {}, torch.ops.aten.expand_copy.default),
}


def run(structure: int, device: int, symbols, params, layouts, scalars, describe, donatable=()):
    """Records the flush's graph padded to the bucket of its sizes. Returns (bucket per
    symbol, outputs, padding layout per output), or a string: why it runs at exact sizes.

    symbols: each symbol's real value; params: the graph's inputs (tpu tensors; a padded
    input as its padded tensor, with its layout in `layouts`; Python numbers used as tensor
    operands as numbers); scalars: the lifted scalar arguments; describe(): the graph with
    its sizes as expressions (called the first time a structure is seen); donatable: per
    parameter, whether nothing but the flush holds it (its buffer may go to a result)."""
    pol = _buckets.policy()
    if pol is None:
        return "TORCHTPU_BUCKETS=off"
    found = _structures.get(structure)
    if found is None:
        try:
            found = _Structure(describe(), device, params, scalars)
        except _buckets.NoBucket as e:
            found = str(e)
        _structures[structure] = found
    if isinstance(found, str):
        return found
    return found.run(symbols, params, layouts, scalars, pol, donatable)


def _dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


def _schema_kind(arg) -> str:
    text = str(arg.type)
    for kind in ("ScalarType", "MemoryFormat", "Layout", "Device"):
        if kind in text:
            return kind
    return ""


class _Structure:
    """One structure's graph rendered as FX with symbolic shapes, and its bucketed variants."""

    def __init__(self, desc: dict, device: int, params, scalars):
        from torch._dynamo.source import ConstantSource
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        self.device = torch.device("tpu", device)
        env = ShapeEnv(specialize_zero_one=False, duck_shape=False)
        self.fake_mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
        self.syms = []
        for i, first in enumerate(desc["first_values"]):
            hint = max(int(first), 2)  # the rules read expressions only; a hint never guards
            self.syms.append(env.create_symintnode(env.create_symbol(hint, ConstantSource(f"torchtpu_size{i}")), hint=hint))
        self.names = [s.node.expr.name for s in self.syms]
        self.g = torch.fx.Graph()
        self.size_nodes: dict = {}
        self.sym_nodes = []
        for i, s in enumerate(self.syms):
            node = self.g.placeholder(f"size{i}")
            node.meta["val"] = s
            self.sym_nodes.append(node)
        self.param_nodes = []
        for p, ((dims, _), value) in enumerate(zip(desc["params"], params)):
            node = self.g.placeholder(f"input{p}")
            # A Python number used as a tensor operand stays a number (it promotes as one).
            node.meta["val"] = self.fake(value.dtype, dims) if isinstance(value, torch.Tensor) else value
            self.param_nodes.append(node)
        self.scalar_nodes = []
        for i, value in enumerate(scalars):
            node = self.g.placeholder(f"scalar{i}")
            node.meta["val"] = value
            self.scalar_nodes.append(node)
        self.outputs = []  # per op: the FX node of each of its (defined) outputs
        for op in desc["ops"]:
            self.outputs.append(self.render(*op))
        self.g.output([self.outputs[n][k] if n >= 0 else self.param_nodes[k] for n, k in desc["roots"]])
        gm = torch.fx.GraphModule(torch.nn.Module(), self.g)
        self.graph = _buckets.DynamicGraph(gm)
        self.variants: dict = {}  # (bucket key, padded inputs' specs) -> Padded, or why not
        self.specs: dict = {}  # (layout, bucket key or None) -> layout_spec()

    # --- rendering ----------------------------------------------------------------------
    def size_value(self, e):
        """A size expression's value: an int, or a SymInt of the symbols."""
        if isinstance(e, int):
            return e
        coeff, a, b, offset = e
        v = self.syms[a] * (self.syms[b] if b >= 0 else 1) * coeff
        return v + offset

    def size(self, e):
        """A size expression as an FX argument: an int, or a node computing it from the symbols."""
        if isinstance(e, int):
            return e
        key = tuple(e)
        if key not in self.size_nodes:
            coeff, a, b, offset = e
            node = self.sym_nodes[a]
            for op, other in ((operator.mul, self.sym_nodes[b] if b >= 0 else None),
                              (operator.mul, coeff if coeff != 1 else None), (operator.add, offset or None)):
                if other is not None:
                    val = op(node.meta["val"], other.meta["val"] if isinstance(other, torch.fx.Node) else other)
                    node = self.g.call_function(op, (node, other))
                    node.meta["val"] = val
            self.size_nodes[key] = node
        return self.size_nodes[key]

    def fake(self, dtype, dims):
        with self.fake_mode:
            return torch.empty([self.size_value(e) for e in dims], dtype=dtype, device=self.device)

    def render(self, name, args, operands, outputs):
        """Adds one recorded op to the FX graph; returns the FX node of each of its outputs."""
        operand_nodes = [self.outputs[n][k] if n >= 0 else self.param_nodes[k] for n, k in operands]
        if name == "torchtpu::scalar":  # a Python number used as a tensor: its 0-dim tensor
            kind, payload = args[0]
            value = self.scalar_nodes[payload] if kind == "scalar" else self.size(payload) if kind == "int" else payload
            target = torch.ops.aten.full.default
            fx_args, fx_kwargs = ([], value), {"dtype": _dtype_of(outputs[0][0]), "device": self.device}
        elif name in _INTERNAL:
            out_dtype, out_dims = outputs[0]
            x = operand_nodes[0] if operand_nodes else None
            dtype = _DTYPES.get(args[1][1]) if name == "torchtpu::convert" else _dtype_of(out_dtype)
            size = [self.size(e) for e in out_dims] if name == "torchtpu::zeros" else \
                [self.size(e) for e in args[1][1]] if name == "torchtpu::broadcast" else None
            fx_args, fx_kwargs, target = _INTERNAL[name](size, dtype, x)
            if name == "torchtpu::zeros":
                fx_kwargs["device"] = self.device
        else:
            try:
                target = _buckets._op_from_name(name)
            except AttributeError:
                raise _buckets.NoBucket(f"{name} has no aten form") from None
            fx_args, fx_kwargs = self.render_args(target, args, operand_nodes)
        node = self.g.call_function(target, tuple(fx_args), fx_kwargs)
        fakes = [self.fake(_dtype_of(dtype), dims) for dtype, dims in outputs]
        returns = target._schema.returns
        if len(returns) == 1 and str(returns[0].type) != "List[Tensor]":
            node.meta["val"] = fakes[0]
            return [node]
        if len(returns) == 1:  # Tensor[]: one output per element
            node.meta["val"] = fakes
            positions = list(range(len(fakes)))
        else:
            positions = self.defined_returns(target, args, len(returns), len(fakes))
            val = [None] * len(returns)
            for k, pos in enumerate(positions):
                val[pos] = fakes[k]
            node.meta["val"] = tuple(val)
        out = []
        for k, pos in enumerate(positions):
            item = self.g.call_function(operator.getitem, (node, pos))
            item.meta["val"] = fakes[k]
            out.append(item)
        return out

    @staticmethod
    def defined_returns(target, args, returns, defined):
        """The return positions of an op's defined outputs (a backward op's output_mask)."""
        if defined == returns:
            return list(range(returns))
        names = [a.name for a in target._schema.arguments]
        if "output_mask" in names:
            kind, mask = args[names.index("output_mask")]
            if kind == "bools" and sum(mask) == defined:
                return [i for i, m in enumerate(mask) if m]
        raise _buckets.NoBucket(f"{target.name()}: which outputs are defined is unknown")

    def render_args(self, target, args, operand_nodes):
        fx_args, fx_kwargs = [], {}
        for i, sarg in enumerate(target._schema.arguments):
            kind, payload = args[i] if i < len(args) else ("none", None)
            value = self.arg_value(kind, payload, sarg, operand_nodes)
            if sarg.kwarg_only:
                fx_kwargs[sarg.name] = value
            else:
                fx_args.append(value)
        return fx_args, fx_kwargs

    def arg_value(self, kind, payload, sarg, operand_nodes):
        enum = _schema_kind(sarg)
        if kind == "none":
            return self.device if enum == "Device" else None
        if kind == "tensor":
            return operand_nodes[payload]
        if kind == "tensors":
            return [operand_nodes[i] if i >= 0 else None for i in payload]
        if kind == "scalar":
            return self.scalar_nodes[payload]
        if kind == "int":
            if enum:
                table = {"ScalarType": _DTYPES, "MemoryFormat": _MEMORY_FORMATS, "Layout": _LAYOUTS}.get(enum, {})
                if not isinstance(payload, int) or payload not in table:
                    raise _buckets.NoBucket(f"an argument {sarg.name}={payload!r} of an unknown kind")
                return table[payload]
            return self.size(payload)
        if kind == "ints":
            return [self.size(e) for e in payload]
        return payload  # float, complex, bool, str, floats, bools

    # --- running ------------------------------------------------------------------------
    def layout_spec(self, layout, sizes=None):
        """A padded input's layout as a padding spec at this bucket (its known_specs entry), or
        as it is held now (sizes None). Worked out once per layout (the engine passes tuples)."""
        key = (layout, sizes.key if sizes else None)
        try:
            return self.specs[key]
        except KeyError:
            spec = self.specs[key] = self._layout_spec(layout, sizes)
            return spec
        except TypeError:  # a layout given as lists
            return self._layout_spec(layout, sizes)

    def _layout_spec(self, layout, sizes):
        return tuple(tuple(((sizes.bucket[self.names[sym]] if sizes else bucket),
                            _buckets._length_key(self.names[sym], offset)) if sym >= 0 else (bucket, None)
                           for bucket, sym, offset in dim) for dim in layout)

    def variant(self, sizes, layouts):
        """The graph rewritten for this bucket and these padded inputs (a decode step's cache
        arrives exact once, then padded: the same padded graph, rewritten once per form), with
        its runner: the rewritten graph's ops are recorded once and then replayed as one
        captured executable (compiler._CompiledGraph), not recorded again each flush."""
        known = {f"input{p}": self.layout_spec(layout, sizes) for p, layout in enumerate(layouts) if layout}
        key = (sizes.key, tuple(sorted(known.items())))
        if key not in self.variants:
            from torchtpu.compiler import _CompiledGraph

            try:
                padded = self.graph.rewrite(sizes, known)
                self.variants[key] = (padded, _CompiledGraph(padded.gm, "bucketed", in_flush=True),
                                      self.out_layouts(padded))
            except _buckets.NoBucket as e:
                self.variants[key] = str(e)
        return self.variants[key], known

    def out_layouts(self, padded):
        """Each output's padding layout as the engine takes it (per dim: (size, symbol index,
        offset) per factor), or None for an output with no padded dim."""
        index = {name: i for i, name in enumerate(self.names)}
        layouts = []
        for spec in padded.output_specs:
            padded_dims = spec is not None and any(sym for dim in spec for _, sym in dim)
            layouts.append([[(size, index[_buckets._split_length(key)[0]], _buckets._split_length(key)[1])
                             if key else (size, -1, 0) for size, key in dim] for dim in spec]
                           if padded_dims else None)
        return layouts

    def run(self, symbols, params, layouts, scalars, pol, donatable=()):
        args = [*symbols, *params, *scalars]
        sizes = self.graph.sizes(args, pol)
        if sizes is None:
            return "a size is above the largest bucket of TORCHTPU_BUCKETS"
        found, known = self.variant(sizes, layouts)
        if isinstance(found, str):
            return found
        padded, replay, out_layouts = found
        for p, layout in enumerate(layouts):
            if layout and self.layout_spec(layout) != known[f"input{p}"]:  # kept from a smaller bucket
                i = len(symbols) + p
                args[i] = _buckets.pad(args[i], known[f"input{p}"], sizes.real, current=self.layout_spec(layout),
                                       pol=pol)
        # Padding is recorded here, apart from the flush's pending work: a large tensor whose
        # sizes are buckets is padded on the device, as a small graph run when the replay
        # reads it (one per pair of buckets), any other on the host (_buckets.pad says why).
        inputs = padded.prepare(args, sizes, pol=pol)
        # The flush's parameters only it holds give their buffers to results of their padded
        # type, as when the padded graph is recorded and run (a training step's weights and
        # AdamW state, a grown token row): the capture donates them on every replay.
        vouched = tuple(len(symbols) + p for p, free in enumerate(donatable)
                        if free and isinstance(inputs[len(symbols) + p], torch.Tensor))
        del args, params
        with torch.no_grad():
            outputs = replay(*inputs, vouched=vouched)
        del inputs
        return [sizes.bucket[name] for name in self.names], list(outputs), out_layouts
