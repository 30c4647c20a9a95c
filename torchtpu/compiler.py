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

Fakeification: tpu tensors are FunctionalTensorWrappers around a storage-less TensorImpl.
PyTorch's MetaConverter unwraps functional tensors unless their device is xla or lazy, which
produces functional-wrapped fakes that Dynamo cannot use (parameters fail its leaf check).
`_patch_fakeification` makes tpu tensors take the xla/lazy path: they are described as the
plain dense tensors they are to the user, and become ordinary FakeTensors on device "tpu".
"""
from __future__ import annotations

import functools
import os
import threading
import weakref

import torch

from torchtpu import _C, _buckets

__all__ = ["tpu_backend"]

# Ops that keep their own aten form even though PyTorch has a decomposition for them: the
# tpu lowering table is the one source of semantics, so an op with a lowering is never
# decomposed here. Everything without a lowering is decomposed when PyTorch can.


def _lowered_aten_ops() -> set[str]:
    return {name for name in _C.lowered_ops() if name.startswith("aten::")}


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
# Fakeification of tpu tensors.

_fake_patch_lock = threading.Lock()
_fake_patched = False


def _patch_fakeification() -> None:
    global _fake_patched
    with _fake_patch_lock:
        if _fake_patched:
            return
        import dataclasses

        from torch._subclasses import meta_utils

        original = meta_utils.MetaTensorDescriber.describe_tensor

        @functools.wraps(original)
        def describe_tensor(self, t, *, recurse=True, trace=False):
            if t.device.type != "tpu" or not torch._is_functional_tensor(t):
                return original(self, t, recurse=recurse, trace=trace)
            # As for xla/lazy tensors (meta_utils special-cases those by device name): the
            # functional wrapper is the tensor; its inner TpuTensorImpl is an implementation
            # detail. Describe the wrapper as a plain dense tensor.
            is_functional = torch._is_functional_tensor
            torch._is_functional_tensor = lambda x: False if x is t else is_functional(x)
            try:
                desc = original(self, t, recurse=recurse, trace=trace)
            finally:
                torch._is_functional_tensor = is_functional
            return dataclasses.replace(desc, is_functional=False)

        meta_utils.MetaTensorDescriber.describe_tensor = describe_tensor
        _fake_patched = True


# ---------------------------------------------------------------------------------------
# Running one AOT graph (forward, backward or inference).

_MAX_CAPTURES_PER_GRAPH = 16


class _CompiledGraph:
    """Runs an FX graph of aten ops on tpu tensors as one XLA executable."""

    def __init__(self, gm: torch.fx.GraphModule, name: str):
        self.gm = gm
        self.name = name
        self.captures: dict[tuple, list] = {}
        self.replay = os.environ.get("TORCHTPU_COMPILE_REPLAY", "1") != "0"
        self.uncapturable: set[tuple] = set()
        self.stats = {"captured": 0, "replayed": 0, "interpreted": 0}

    def _key(self, args) -> tuple:
        # Non-tensor inputs (SymInts of dynamic graphs, lifted Python scalars) are part of the
        # key: they are baked into the captured graph. Tensor types are checked in C++.
        return tuple(a for a in args if not isinstance(a, torch.Tensor))

    def __call__(self, *args):
        if not self.replay or _C.get_mode() != "fused":
            return self._interpret(args)
        key = self._key(args)
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
        if key in self.uncapturable:
            return self._interpret(args)
        return self._capture(args, key)

    def _interpret(self, args):
        self.stats["interpreted"] += 1
        _C.sync(False)  # the inputs' pending work is its own graph
        out = self.gm(*args)
        if _C.get_mode() == "fused":
            _C.sync(False)  # the whole FX graph: one executable
        return out

    def _capture(self, args, key):
        args = list(args)
        _C.capture_begin(args)  # runs the inputs' pending work; notes the engine's state
        try:
            out = self.gm(*args)
        except BaseException:
            _C.capture_abort()
            raise
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        captured = _C.capture_end(args, outs)  # compiles (or finds) and runs the graph
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

    def __init__(self, gm: torch.fx.GraphModule, name: str, symbols: list, saved_specs: dict, num_user_outputs):
        self.gm = gm
        self.name = name
        self.exact = _CompiledGraph(gm, name)
        self.stats = self.exact.stats
        self.symbols = symbols
        self.saved_specs = saved_specs  # bucket key -> {forward output name: padding spec}
        self.num_user_outputs = num_user_outputs
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.outputs = list(next(n for n in gm.graph.nodes if n.op == "output").args[0])
        self.variants: dict[tuple, object] = {}
        self.reasons: dict[tuple, str] = {}

    def _reals(self, args) -> dict:
        for a in args:  # tensors a bucketed forward saved for this backward know the sizes
            real = getattr(a, _buckets._REAL_ATTR, None) if isinstance(a, torch.Tensor) else None
            if real is not None:
                return dict(real)
        reals = {}
        for p, a in zip(self.placeholders, args):
            v = _buckets._val(p)
            if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol and isinstance(a, int):
                reals[v.node.expr.name] = a
        seen = {}
        for p, a in zip(self.placeholders, args):  # the smallest size seen: the real one
            v = _buckets._val(p)
            if isinstance(v, torch.Tensor) and isinstance(a, torch.Tensor):
                for e, size in zip(v.shape, a.shape):
                    e = _buckets._expr(e)
                    if e is not None and e.is_Symbol and e.name not in reals:
                        seen[e.name] = min(size, seen.get(e.name, size))
        return {**seen, **reals}

    def _variant(self, key, buckets):
        if key not in self.variants:
            try:
                names = [o.name if isinstance(o, torch.fx.Node) else None for o in self.outputs]
                gm, specs, out_specs = _buckets.rewrite(self.gm, buckets, self.symbols,
                                                            self.saved_specs.get(key, {}))
                if self.name == "forward":
                    self.saved_specs[key] = {nm: sp for nm, sp in zip(names, out_specs) if nm and sp is not None}
                self.variants[key] = (_CompiledGraph(gm, self.name), specs, out_specs)
            except _buckets.NoBucket as e:
                self.variants[key] = None
                self.reasons[key] = str(e)
                bucket_fallbacks.append(f"{self.name} graph at sizes {buckets}: {e}")
        return self.variants[key]

    def __call__(self, *args):
        pol = _buckets.policy()
        if pol is None or not self.symbols or _C.get_mode() != "fused":
            return self.exact(*args)
        reals = self._reals(args)
        if any(s not in reals for s in self.symbols):
            return self.exact(*args)
        if isinstance(pol, list) and any(reals[s] > pol[-1] for s in self.symbols):
            return self.exact(*args)  # above the largest configured bucket
        buckets = {s: _buckets.bucket_of(reals[s], pol) for s in self.symbols}
        key = tuple(buckets[s] for s in self.symbols)
        variant = self._variant(key, buckets)
        if variant is None:
            if any(isinstance(a, torch.Tensor) and hasattr(a, _buckets._REAL_ATTR) for a in args):
                raise RuntimeError(
                    f"torchtpu: the {self.name} graph cannot run padded ({self.reasons[key]}) but its forward "
                    "did; set TORCHTPU_BUCKETS=off to compile each size exactly")
            return self.exact(*args)
        compiled, specs, out_specs = variant
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        new_args = []
        for p, a in zip(self.placeholders, args):
            v = _buckets._val(p)
            if isinstance(v, torch.SymInt):
                new_args.append(_buckets._eval(v.node.expr, buckets))
            elif isinstance(a, torch.Tensor) and p.name in specs:
                new_args.append(_buckets.pad(a, specs[p.name], reals))
            else:
                new_args.append(a)
        new_args.append(torch.tensor([reals[s] for s in self.symbols], dtype=torch.int64).to(device))
        out = list(compiled(*new_args))
        users = len(out) if self.num_user_outputs is None else self.num_user_outputs
        for i, (o, node) in enumerate(zip(out, self.outputs)):
            v = _buckets._val(node)
            if isinstance(v, torch.SymInt):
                out[i] = _buckets._eval(v.node.expr, reals)
            elif isinstance(o, torch.Tensor) and _buckets._any_padded(out_specs[i]):
                if i < users:
                    out[i] = _buckets.unpad(o, out_specs[i], reals)
                else:
                    setattr(o, _buckets._REAL_ATTR, reals)
        return out


def _make_compiler(name: str, saved_specs: dict):
    def compile_fx(gm: torch.fx.GraphModule, example_inputs):
        global fx_graphs_compiled
        symbols = _buckets.graph_symbols(gm)
        if symbols:
            users = None
            if name == "forward":
                ctx = torch._guards.TracingContext.try_get()
                meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
                users = getattr(meta, "num_forward", None)
            compiled = _BucketedGraph(gm, name, symbols, saved_specs, users)
        else:
            compiled = _CompiledGraph(gm, name)
        fx_graphs_compiled += 1
        _compiled_graphs.add(compiled)
        return compiled

    return compile_fx


# For tests and debugging: how many FX graphs (forward, backward, inference) the backend
# received, and the live ones (their .stats say how often each was captured/replayed).
fx_graphs_compiled = 0
_compiled_graphs = weakref.WeakSet()
# Dynamic graphs that could not run padded at some sizes, and why (metrics.report()).
bucket_fallbacks: list[str] = []


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The "tpu" torch.compile backend (AOTAutograd: forward and backward graphs)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    _patch_fakeification()

    saved_specs: dict = {}  # the forward's saved tensors' padding, for the backward

    def boxed(name):
        inner = _make_compiler(name, saved_specs)

        def compiler(gm, example_inputs):
            return make_boxed_func(inner(gm, example_inputs))

        return compiler

    backend = aot_autograd(
        fw_compiler=boxed("forward"),
        bw_compiler=boxed("backward"),
        inference_compiler=boxed("inference"),
        decompositions=decompositions(),
        keep_inference_input_mutations=False,
    )
    return backend(gm, example_inputs, **kwargs)


# Importing this module (torch.compile(backend="tpu") does, through the entry point) also
# prepares fakeification, which Dynamo needs before it traces (the backend runs after).
_patch_fakeification()


# ---------------------------------------------------------------------------------------
# Registration by name, without importing Dynamo eagerly (it takes seconds to import):
# torchtpu's import installs a finder that registers the backend when Dynamo's backend
# registry is imported, or registers it at once when Dynamo is already imported.

_REGISTRY = "torch._dynamo.backends.registry"


def _on_registry_loaded(registry) -> None:
    _patch_fakeification()
    if "tpu" not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=tpu_backend, name="tpu")


class _RegistryHook:
    """A meta path finder that only wraps the loader of Dynamo's backend registry."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _REGISTRY:
            return None
        import importlib.machinery
        import sys

        sys.meta_path.remove(self)  # one-shot; also avoids finding ourselves below
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            _on_registry_loaded(module)

        loader.exec_module = exec_and_register
        return spec


def install_dynamo_hook() -> None:
    """Makes torch.compile(backend="tpu") resolve without importing Dynamo now."""
    import sys

    registry = sys.modules.get(_REGISTRY)
    if registry is not None:
        _on_registry_loaded(registry)
    elif not any(isinstance(f, _RegistryHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegistryHook())
