"""torch.compile(model, backend="tpu").

Dynamo captures FX graphs of tpu tensors; AOTAutograd turns each into a forward and (for
training) a backward graph of aten ops. Each of those graphs runs as ONE XLA executable,
lowered through the same lowering table as eager mode:

- First call with given input types: the FX graph's aten ops run on the real tpu tensors in
  fused mode (the eager kernels record them into the pending graph), and the pending graph
  that produced the outputs is compiled and run (memory and disk caches as for eager graphs).
  The engine remembers that graph as a *capture*: which executable parameter is which FX
  input (by value identity), which constants it holds, which results are which FX outputs.
- Later calls with the same input types run the captured executable directly on the input
  buffers (`_C.run_captured`): no per-op tracing, no hashing, no lowering.

Graphs that cannot be captured as one executable (an op ran on CPU, or something forced a
flush in the middle) keep running through the interpreter path, which is always correct.

A second process skips AOTAutograd for graphs an earlier one compiled: AOTAutograd's result
is cached on disk next to the executables (torchtpu/_compile_cache.py).

Dynamo finds this backend by name through the `torch_dynamo_backends` entry point
(pyproject.toml). Fakeification of tpu tensors needs a patch of PyTorch's MetaTensorDescriber
(torchtpu/_patches.py, installed when torchtpu loads).
"""
from __future__ import annotations

import dataclasses
import weakref

import torch
from torch._inductor.output_code import OutputCode

from torchtpu import _C, _buckets, _compile_cache, _patches, _settings

_patches.install_lazy("compile cache")

__all__ = ["tpu_backend"]

# Ops that keep their own aten form even though PyTorch has a decomposition for them: the
# tpu lowering table is the one source of semantics, so an op with a lowering is never
# decomposed here. Everything without a lowering is decomposed when PyTorch can.


def _lowered_aten_ops() -> set[str]:
    from torchtpu import _linalg

    return {name for name in _C.lowered_ops() if name.startswith("aten::")} | set(_linalg.lowered_ops())


def _op_key(op) -> str:
    name = op.name()  # "aten::add.Tensor" or "aten::relu"
    if name.endswith(".default"):
        name = name[: -len(".default")]
    return name


def decompositions() -> dict:
    """AOTAutograd's decomposition table for tpu: core ATen decompositions plus any
    decomposition of an op that has no tpu lowering, minus ops that do have one."""
    from torch._decomp import core_aten_decompositions, decomposition_table

    lowered = _lowered_aten_ops()
    table = dict(core_aten_decompositions())
    for op, fn in decomposition_table.items():
        if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten" and _op_key(op) not in lowered:
            # Only functional, non-view ops, and only PyTorch's aten-level decompositions
            # (torch._refs ones produce prims, which have no eager kernels on tpu).
            schema = op._schema
            if schema.is_mutable or any(r.alias_info is not None for r in schema.returns) or op in table:
                continue
            if getattr(fn, "__module__", "").startswith("torch._decomp"):
                table[op] = fn
    for op in list(table):
        if isinstance(op, torch._ops.OpOverload) and _op_key(op) in lowered:
            del table[op]
    return table


# ---------------------------------------------------------------------------------------
# Running one AOT graph (forward, backward or inference).

_MAX_CAPTURES_PER_GRAPH = 16
# Distinct non-tensor inputs (the capture key) one graph captures for; beyond, calls with new
# ones are interpreted (a Python number that changes every call would capture every call).
_MAX_KEYS_PER_GRAPH = 64


class _CompiledGraph:
    """Runs an FX graph of aten ops on tpu tensors as one XLA executable.

    `in_flush`: the graph runs while the engine flushes a pending graph (a fused graph padded
    to a bucket, torchtpu/_fused_buckets.py): interpreting it only records its ops, which that
    flush then runs, where a torch.compile graph runs its inputs' and its own work. Its calls
    name the inputs whose buffers it may donate (`vouched`, capture_end's): part of the key."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, updates=(), in_flush: bool = False):
        self.gm = gm
        self.name = name
        self.in_flush = in_flush
        # (input, output) pairs: the output is the input's new contents, which AOTAutograd's
        # epilogue copies into the input (a static KV cache's index_copy_). The capture gives
        # the input's buffer to that output, so the update copies nothing.
        self.updates = list(updates)
        self.captures: dict[tuple, list] = {}
        self.replay = _settings.compile_replay()
        self.uncapturable: set[tuple] = set()
        self.stats = {"captured": 0, "replayed": 0, "interpreted": 0}

    def _key(self, args) -> tuple:
        # Non-tensor inputs (SymInts of dynamic graphs, lifted Python scalars) are part of the
        # key: they are baked into the captured graph. Tensor types are checked in C++.
        return tuple(a for a in args if not isinstance(a, torch.Tensor))

    def __call__(self, *args, vouched=()):
        if not self.replay or _C.get_mode() != "fused":
            return self._interpret(args)
        key = (self._key(args) + (("vouched", vouched),)) if vouched else self._key(args)
        try:
            hash(key)
        except TypeError:  # an unhashable non-tensor input: no capture for it
            return self._interpret(args)
        handles = self.captures.get(key, ())
        for n, (handle, constants) in enumerate(handles):
            out = _C.run_captured(handle, list(args))
            if out is not None:
                if n:  # the capture that fits goes first (a capturing call's inputs can
                    handles.insert(0, handles.pop(n))  # differ from later calls' ones)
                # Non-tensor outputs (SymInts of dynamic graphs, None) are fixed by the key.
                for i, value in constants:
                    out[i] = value
                self.stats["replayed"] += 1
                return out
        if key in self.uncapturable or (not handles and len(self.captures) >= _MAX_KEYS_PER_GRAPH):
            return self._interpret(args)
        return self._capture(args, key, vouched)

    def _interpret(self, args):
        self.stats["interpreted"] += 1
        if self.in_flush:
            return self.gm(*args)
        _C.sync(False, "torch_compile")  # the inputs' pending work is its own graph
        out = self.gm(*args)
        if _C.get_mode() == "fused":
            _C.sync(False, "torch_compile")  # the whole FX graph: one executable
        return out

    def _capture(self, args, key, vouched=()):
        args = list(args)
        _C.capture_begin(args)  # runs the inputs' pending work; notes the engine's state
        try:
            out = self.gm(*args)
        except BaseException:
            _C.capture_abort()
            raise
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        captured = _C.capture_end(args, outs, self.updates, list(vouched))  # compiles (or finds) and runs it
        if captured is None:
            self.uncapturable.add(key)
            self.stats["interpreted"] += 1
            return out
        handle, first = captured
        # Return the outputs as replays will (not views of the inputs' storage), keeping
        # non-tensor outputs from the graph.
        out = [f if isinstance(o, torch.Tensor) else o for f, o in zip(first, outs)]
        constants = [(i, o) for i, o in enumerate(outs) if o is not None and not isinstance(o, torch.Tensor)]
        if any(isinstance(o, (torch.SymInt, torch.SymFloat, torch.SymBool)) for _, o in constants):
            self.uncapturable.add(key)  # symbolic outputs (unbacked) are not constants
        else:
            handles = self.captures.setdefault(key, [])
            if len(handles) < _MAX_CAPTURES_PER_GRAPH:
                handles.append((handle, constants))
        self.stats["captured"] += 1
        return out


class _BucketedGraph:
    """A graph with symbolic sizes: each call runs the graph rewritten for its sizes' bucket
    (torchtpu/_buckets.py), or the exact graph when the rewrite does not apply."""

    def __init__(self, graph: _buckets.DynamicGraph, name: str, saved_specs: dict, num_user_outputs):
        self.graph = graph
        self.name = name
        self.exact = _CompiledGraph(graph.gm, name)
        self.stats = self.exact.stats
        self.saved_specs = saved_specs  # bucket key -> {forward output name: padding spec}
        self.num_user_outputs = num_user_outputs
        self.variants: dict[tuple, tuple | None] = {}  # bucket key -> (_CompiledGraph, Padded)
        self.reasons: dict[tuple, str] = {}

    def _variant(self, sizes: _buckets.Sizes):
        key = sizes.key
        if key not in self.variants:
            try:
                padded = self.graph.rewrite(sizes, self.saved_specs.get(key, {}))
                if self.name == "forward":
                    self.saved_specs[key] = padded.output_specs_by_name
                self.variants[key] = (_CompiledGraph(padded.gm, self.name), padded)
            except _buckets.NoBucket as e:
                self.variants[key] = None
                self.reasons[key] = str(e)
                bucket_fallbacks.append(f"{self.name} graph at sizes {sizes.bucket}: {e}")
        return self.variants[key]

    def __call__(self, *args):
        sizes = self.graph.sizes(args) if _C.get_mode() == "fused" else None
        if sizes is None:
            return self.exact(*args)
        variant = self._variant(sizes)
        if variant is None:
            if _buckets.carries_sizes(args):
                raise RuntimeError(
                    f"torchtpu: the {self.name} graph cannot run padded ({self.reasons[sizes.key]}) but its "
                    "forward did; set TORCHTPU_BUCKETS=off to compile each size exactly")
            return self.exact(*args)
        compiled, padded = variant
        out = compiled(*padded.prepare(args, sizes))
        return padded.finish(out, sizes, self.num_user_outputs)


# ---------------------------------------------------------------------------------------
# The compiled form AOTAutograd caches (torchtpu/_compile_cache.py).


@dataclasses.dataclass
class TpuOutputCode(OutputCode):
    """One aot graph (forward, backward or inference) compiled for tpu: `runtime` runs it
    (compiler.py's _CompiledGraph or _BucketedGraph); on disk only the aten graph is kept
    and the runtime is rebuilt around it when the entry loads."""

    name: str = ""
    gm: torch.fx.GraphModule | None = None
    runtime: object = None
    cacheable: bool = True  # False for graphs with symbolic sizes
    # The graph's in-place updates of its inputs (_input_updates), kept with the entry: a warm
    # process rebuilds the runtime without AOTAutograd's metadata and must still donate them.
    updates: tuple = ()
    _serialized_gm: bytes | None = dataclasses.field(default=None, init=False)

    _boxed_call = True  # AOTAutograd calls it with one list of inputs

    def __call__(self, inputs):
        return self.runtime(*inputs)

    def prepare_for_serialization(self) -> None:
        # Called on a copy (BundledOutputCodeLoadable.pre_save): the live object keeps running.
        from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
        from torch.fx._graph_pickler import GraphPickler, Options

        if not self.cacheable:
            raise BypassAOTAutogradCache("torchtpu: graphs with symbolic sizes are not cached")
        for node in self.gm.graph.nodes:
            if node.op == "get_attr":
                value = getattr(self.gm, node.target, None)
                if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                    raise BypassAOTAutogradCache(f"torchtpu: the graph holds a {value.device.type} constant")
        # Nodes keep only their source line: the runtime reads no other metadata, and fake
        # values would cost a warm process their rebuilding. The live graph keeps its own.
        nodes = list(self.gm.graph.nodes)
        metas = [node.meta for node in nodes]
        try:
            for node in nodes:
                node.meta = {k: v for k, v in node.meta.items() if k == "stack_trace"}
            self._serialized_gm = GraphPickler.dumps(self.gm, Options(ops_filter=None))
        finally:
            for node, meta in zip(nodes, metas):
                node.meta = meta
        self.gm = None
        self.runtime = None

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        if self.runtime is not None:
            return  # the compiling process's own object
        from torch._subclasses import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        gm = GraphPickler.loads(self._serialized_gm, FakeTensorMode(shape_env=ShapeEnv()))
        if not isinstance(gm, torch.fx.GraphModule):
            raise TypeError(f"torchtpu: a cached torch.compile graph unpickled to {type(gm).__name__}")
        gm.recompile()  # the unpickled module has its graph but no generated forward yet
        self.gm = gm
        self._serialized_gm = None
        self.runtime = runtime_for_cached(gm, self.name, self.updates)

    def set_triton_bundle(self, triton_bundle) -> None:
        pass


def _make_compiler(name: str, saved_specs: dict):
    def compile_fx(gm: torch.fx.GraphModule, example_inputs):
        global fx_graphs_compiled
        graph = _buckets.DynamicGraph(gm)
        if graph.symbols:
            users = None
            if name == "forward":
                ctx = torch._guards.TracingContext.try_get()
                meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
                users = getattr(meta, "num_forward", None)
            compiled = _BucketedGraph(graph, name, saved_specs, users)
        else:
            compiled = _CompiledGraph(gm, name, _input_updates(name))
        fx_graphs_compiled += 1
        _compile_cache.count_traced()
        _compiled_graphs.add(compiled)
        return compiled

    return compile_fx


def _input_updates(name: str) -> list:
    """An inference graph's in-place updates of its inputs, as (input, output) pairs: AOTAutograd
    returns each mutated input's new contents first and copies them into the input after the
    call (only plain data mutations: no metadata change, no autograd)."""
    if name != "inference":
        return []
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    if meta is None:
        return []
    updates = []
    for k, i in enumerate(meta.mutated_inp_runtime_indices):
        info = meta.input_info[i]
        if info.mutates_data and not info.mutates_metadata and not info.mutates_storage_metadata:
            updates.append((i, k))
    return updates


def runtime_for_cached(gm: torch.fx.GraphModule, name: str, updates=()) -> _CompiledGraph:
    """The runtime of a graph loaded from the compile cache (never one with symbolic sizes:
    those are not cached)."""
    compiled = _CompiledGraph(gm, name, updates)
    _compiled_graphs.add(compiled)
    return compiled


# For tests and debugging: how many FX graphs (forward, backward, inference) the backend
# received, and the live ones (their .stats say how often each was captured/replayed).
fx_graphs_compiled = 0
_compiled_graphs = weakref.WeakSet()
# Dynamic graphs that could not run padded at some sizes, and why (metrics.report()).
bucket_fallbacks: list[str] = []


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The "tpu" torch.compile backend (AOTAutograd: forward and backward graphs)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    saved_specs: dict = {}  # the forward's saved tensors' padding, for the backward

    def boxed(name):
        # AOTAutograd gets an OutputCode it can cache (torchtpu/_compile_cache.py).
        inner = _make_compiler(name, saved_specs)

        def compiler(gm, example_inputs):
            runtime = inner(gm, example_inputs)
            cacheable = isinstance(runtime, _CompiledGraph)
            code = TpuOutputCode(name=name, gm=gm, runtime=runtime, cacheable=cacheable,
                                 updates=tuple(runtime.updates) if cacheable else ())
            code._boxed_call = True  # also on the instance: wrappers copy its __dict__
            return code

        return SerializableAOTDispatchCompiler(TpuOutputCode, compiler)

    backend = aot_autograd(
        fw_compiler=boxed("forward"),
        bw_compiler=boxed("backward"),
        inference_compiler=boxed("inference"),
        decompositions=decompositions(),
        keep_inference_input_mutations=False,
    )
    with _compile_cache.scope():
        return backend(gm, example_inputs, **kwargs)
