"""Shape buckets: a graph with symbolic sizes runs padded to a bucket of its sizes.

A graph Dynamo traced with symbolic sizes (`dynamic=True`, `torch._dynamo.mark_dynamic`, or
Dynamo's automatic dynamic shapes after a second input shape) would need one XLA executable
per concrete size. Instead each symbol is rounded up to a bucket (the next power of two by
default) and the graph runs at the bucket's sizes on zero-padded inputs:

- The FX graph is rewritten once per bucket. Every tensor carries a *padding spec*: per
  dimension, its factors (outermost first) and which of them are padded, so a dimension
  that merges a padded one (`view(B*T, C)`) stays exact. A padded factor's real size is a
  *length*: a symbol plus a constant ("s0", "s0+1", "s0-1"), so the tensors of a generation
  step (a cache of T tokens, the cache grown to T + 1 by a cat, a sequence shortened by a
  slice) share one padded size: each symbol's bucket holds its largest length in the graph
  (`headroom`), and every length of that symbol is padded to it. A mask of the real elements is
  built inside the graph from `iota < real length`; the real lengths are one small int64
  input, so every length in a bucket replays the same executable.
- Invariant: padded elements hold zeros. Ops that could write something else there
  (a bias add, exp, an embedding lookup of padded token 0) are followed by
  `where(mask, out, 0)`. Sums and matmuls that contract a padded dimension are then exact;
  mean divides by the real count; max/softmax/logsumexp see -inf in the padding;
  nll_loss sees ignore_index for padded targets.
- Positions that move with a length are read at the real sizes inside the graph: a slice
  from the end (`x[:, -1:]`) gathers at `T - 1`, a cat along a padded dimension writes
  the later pieces at `T` (index_copy), `x[:, :-1]` re-zeros the dropped element.
- An op the rules do not cover touching a padded dimension (a sort along it, a variance
  over it, an index by a padded tensor, ...) turns bucketing off for that graph, which
  then compiles once per size as before (`metrics.report()` says why).

Outputs the user sees are sliced back to the real sizes; tensors the forward saves for the
backward stay padded (the backward graph is rewritten for the same bucket and gets the
real sizes from them). Inputs are padded on the host (they are usually fresh uploads), so
nothing is compiled per real size.

The public API (all that compiler.py uses; fused eager mode can use the same, issue 16):

    policy(), bucket_of(n, policy)       the bucket a size runs at (TORCHTPU_BUCKETS)
    at_least(n)                          within it, no bucket is below bucket_of(n)
    DynamicGraph(gm)                     an FX graph with symbolic sizes
        .symbols                         its size symbols, sorted
        .sizes(args)                     a call's real and bucket sizes (None: run exact)
        .rewrite(sizes, known_specs)     -> Padded, or raises NoBucket
    Padded                               the graph rewritten for one bucket
        .gm, .output_specs_by_name       the latter: known_specs of the backward's rewrite
        .prepare(args, sizes)            the arguments of .gm: padded inputs, real lengths
        .finish(outputs, sizes, users)   outputs sliced back; the rest stay padded
    carries_sizes(args)                  whether a padded tensor is among args
    NoBucket                             the graph cannot run padded

Rewrite rules live in a table filled by `@rule("aten::op", ...)`, one small function per
aten op or op family, as the C++ lowerings do (`LOWERING("aten::op", fn)`).

TORCHTPU_BUCKETS: "pow2" (default), "off", or increasing sizes "64,128,256" (a size above
the largest one runs unbucketed).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import operator
import os
from typing import Callable

import torch

from torchtpu import _settings

aten = torch.ops.aten

_REAL_ATTR = "_torchtpu_real_sizes"  # on padded tensors kept for a later graph
_INF = float("inf")


class NoBucket(Exception):
    """The graph cannot run padded; it runs at its exact sizes."""


# ---------------------------------------------------------------------------------------
# Bucket policy.


def policy():
    """TORCHTPU_BUCKETS as None (off), "pow2" or a sorted list of sizes."""
    return _settings.bucket_policy(os.environ.get("TORCHTPU_BUCKETS", "pow2"))


def bucket_of(n: int, pol) -> int:
    """The size n runs at: the next power of two, the next listed size, or n itself."""
    if n <= 1 or pol is None:
        return n
    if pol == "pow2":
        return 1 << (n - 1).bit_length()
    for size in pol:
        if size >= n:
            return size
    return n


_FLOORS: list = []  # sizes at_least() keeps every bucket at or above


@contextlib.contextmanager
def at_least(size: int):
    """Within: every symbol's bucket is at least bucket_of(size). A generation loop whose longest
    sequence is known (a static KV cache of max_length) runs its growing graphs in that one
    bucket from the start, so nothing compiles as the sequence grows."""
    _FLOORS.append(int(size))
    try:
        yield
    finally:
        _FLOORS.pop()


# ---------------------------------------------------------------------------------------
# Symbolic sizes.


def _expr(x):
    import sympy

    if isinstance(x, torch.SymInt):
        return x.node.expr
    if isinstance(x, int):
        return sympy.Integer(x)
    return None


def _eval(expr, values) -> int:
    return int(expr.xreplace({s: values[s.name] for s in expr.free_symbols}))


def _val(node):
    return node.meta.get("val") if hasattr(node, "meta") else None


def graph_symbols(gm) -> list[str]:
    """The size symbols of gm's inputs, sorted (empty for a static graph)."""
    names = set()
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        v = _val(node)
        exprs = [_expr(v)] if isinstance(v, torch.SymInt) else [_expr(s) for s in v.shape] if isinstance(v, torch.Tensor) else []
        for e in exprs:
            if e is not None:
                names.update(s.name for s in e.free_symbols)
    return sorted(names)


# ---------------------------------------------------------------------------------------
# Padding specs: per dimension a tuple of (size, symbol or None) factors, outermost first.


def _length_key(symbol: str, offset: int) -> str:
    """A padded factor's real size as a name: the symbol plus a constant ("s0", "s0+1")."""
    return symbol if offset == 0 else f"{symbol}{offset:+d}"


def _split_length(key: str):
    """(symbol, offset) of a length key (symbol names hold no sign)."""
    for i, ch in enumerate(key):
        if ch in "+-":
            return key[:i], int(key[i:])
    return key, 0


def _length(key: str, values: dict) -> int:
    """A length's value given each symbol's value (real sizes or buckets)."""
    symbol, offset = _split_length(key)
    return values[symbol] + offset


def _symbol_plus_offset(e):
    """(symbol name, offset) when the size expression e is a symbol plus an integer, else None."""
    if e is None or not e.free_symbols:
        return None
    if e.is_Symbol:
        return e.name, 0
    if e.is_Add and len(e.args) == 2:
        const = [a for a in e.args if a.is_Integer]
        sym = [a for a in e.args if a.is_Symbol]
        if len(const) == 1 and len(sym) == 1:
            return sym[0].name, int(const[0])
    return None


def _padded(dim) -> bool:
    return any(sym for _, sym in dim)


def _plain(size):
    return ((size, None),)


def _unpadded_spec(shape):
    return tuple(_plain(s) for s in shape)


def _any_padded(spec) -> bool:
    if isinstance(spec, list):  # a multi-output op's specs
        return any(_any_padded(s) for s in spec)
    return spec is not None and any(_padded(d) for d in spec)


def _dim_size(dim, values=None) -> int:
    """A dimension's size: at the bucket's sizes, or at the real ones given `values`."""
    size = 1
    for factor, sym in dim:
        size *= _length(sym, values) if values is not None and sym else factor
    return size


def _regroup(spec, out_shape):
    """The spec of a view of a tensor with `spec` as `out_shape` (row-major regrouping)."""
    factors = [f for d in spec for f in d if f[0] != 1]
    out, i = [], 0
    for size in out_shape:
        if size == 1:
            out.append(_plain(1))
            continue
        dim, prod = [], 1
        while prod < size:
            if i >= len(factors):
                raise NoBucket("a view changes the number of elements")
            fsize, sym = factors[i]
            if size % (prod * fsize) == 0:
                dim.append(factors[i])
                prod *= fsize
                i += 1
            elif sym is None and size % prod == 0 and fsize % (size // prod) == 0:
                need = size // prod
                dim.append((need, None))
                factors[i] = (fsize // need, None)
                prod *= need
            else:
                raise NoBucket("a view splits a padded dimension")
        out.append(tuple(dim))
    while i < len(factors) and factors[i][0] == 1:
        i += 1
    if i != len(factors):
        raise NoBucket("a view changes the number of elements")
    return tuple(out)


def _broadcast(specs, out_shape):
    """The spec of an elementwise result of tensors with `specs` (None: not a tensor)."""
    out = []
    n = len(out_shape)
    for k in range(n):
        chosen = None
        for spec in specs:
            if spec is None:
                continue
            j = len(spec) - n + k
            if j < 0:
                continue
            dim = spec[j]
            if _padded(dim):
                if chosen is not None and chosen != dim:
                    raise NoBucket("an op combines differently padded dimensions")
                chosen = dim
        out.append(chosen if chosen is not None else _plain(out_shape[k]))
    return tuple(out)


def _reduce_fill(fill, dtype):
    """The identity `fill` of a reduction (0, 1, +-inf) as a value of `dtype`."""
    if dtype == torch.bool:
        return bool(fill)
    if not dtype.is_floating_point and fill in (_INF, -_INF):
        info = torch.iinfo(dtype)
        return info.max if fill > 0 else info.min
    return fill


# ---------------------------------------------------------------------------------------
# The rule table.

Rule = Callable[["_Rewrite", torch.fx.Node, object], object]
_RULES: dict[str, Rule] = {}


def _op_from_name(name: str):
    """The OpOverload for "aten::op" (default overload) or "aten::op.overload"."""
    namespace, _, rest = name.partition("::")
    packet_name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), packet_name)
    return getattr(packet, overload or "default")


def rule(*names: str):
    """Registers a rewrite rule for the aten ops named like the C++ LOWERING table:
    "aten::view" (the default overload) or "aten::sum.dim_IntList".

    A rule gets the rewrite (its helpers), the node and the node's value (meta "val"), and
    returns the node's padding spec (a list of them for an op with several outputs). It may
    edit the graph around the node (fill its inputs' padding, re-zero its output) and raises
    NoBucket when the op cannot run padded."""

    def register(fn: Rule) -> Rule:
        for name in names:
            try:
                _op_from_name(name)
            except AttributeError:  # a misspelt name, or an op this torch no longer has
                raise ValueError(f"torchtpu bucket rule {fn.__name__}: no aten op {name!r} in torch "
                                 f"{torch.__version__}") from None
            if name in _RULES:
                raise ValueError(f"two bucket rules for {name}: {_RULES[name].__name__} and {fn.__name__}")
            _RULES[name] = fn
        return fn

    return register


def rule_for(op) -> Rule | None:
    """The rule of an OpOverload: registered by name, else the elementwise rule for ops
    PyTorch tags pointwise, else None (the op cannot run padded)."""
    found = _RULES.get(op.name())
    if found is None and torch.Tag.pointwise in op.tags:
        found = _elementwise
    return found


# Ops whose SymInt arguments are sizes (computed at the bucket's sizes), never values.
_FACTORIES = ("aten::full", "aten::zeros", "aten::ones", "aten::empty.memory_format", "aten::arange",
              "aten::arange.start", "aten::arange.start_step", "aten::new_zeros", "aten::new_ones",
              "aten::new_full", "aten::new_empty", "aten::scalar_tensor", "aten::empty_strided",
              "aten::full_like", "aten::zeros_like", "aten::ones_like", "aten::empty_like")
_VIEWS = ("aten::view", "aten::_unsafe_view", "aten::reshape", "aten::view_copy")
_SIZE_ARGS = {_op_from_name(name) for name in _VIEWS + _FACTORIES + (
    "aten::expand", "aten::slice.Tensor", "aten::narrow", "aten::split_with_sizes", "aten::split.Tensor",
    "aten::embedding_dense_backward", "aten::sym_size.int", "aten::sym_numel", "aten::sym_stride.int",
    "aten::as_strided", "aten::native_layer_norm", "aten::native_layer_norm_backward",
    "aten::new_empty_strided", "aten::expand_copy", "aten::slice_copy.Tensor", "aten::narrow_copy",
    "aten::split_with_sizes_copy", "aten::split_copy.Tensor", "aten::as_strided_copy", "aten::select_backward",
    "aten::slice_backward")}
# Factories whose listed arguments are values (start of a range, fill value), not sizes.
_VALUE_FIRST_ARGS = {_op_from_name(name): args for name, args in (
    ("aten::arange.start", (0,)), ("aten::arange.start_step", (0, 2)), ("aten::full", (1,)),
    ("aten::new_full", (2,)), ("aten::full_like", (1,)), ("aten::scalar_tensor", (0,)))}
# Ops whose int argument is a position, read at the real sizes (x[:, T - 1]) by their rule.
_SELECTS = ("aten::select.int", "aten::select_copy.int")
# Slices: their SymInt arguments are positions too (_slice reads them).
_SLICES = {aten.slice.Tensor, aten.slice_copy.Tensor}
# Arithmetic that may take a size as a value (x * s0, grad / s0): it gets the real size.
_SIZE_AS_VALUE_OPS = (aten.add, aten.sub, aten.mul, aten.div, aten.true_divide, aten.rsub)


# ---------------------------------------------------------------------------------------
# The rewrite of one graph for one bucket.


class _Rewrite:
    """Walks an FX graph once, giving each tensor a padding spec through the rule table and
    inserting masks and fills; the helpers below are what rules use."""

    def __init__(self, gm, buckets: dict, symbols: list, known_specs: dict):
        self.gm = gm
        self.graph = gm.graph
        self.buckets = buckets
        self.symbols = symbols
        self.known = known_specs
        self.spec = {}
        self.device = None
        self.lens = None
        self.real_nodes = {}
        self.dim_masks = {}
        self.masks = {}
        self.placeholder_specs = {}
        self.limits = []  # (symbol, max bucket) from slices of fixed-size tensors

    # --- shapes -------------------------------------------------------------------------
    def shape(self, v):
        """A (symbolic) value's shape at the bucket's sizes (a length: its symbol's bucket)."""
        return tuple(self.size_at_bucket(_expr(s)) for s in v.shape)

    def size_at_bucket(self, e) -> int:
        length = _symbol_plus_offset(e)
        if length is not None:
            return self.buckets[length[0]]
        return _eval(e, self.buckets)

    def spec_from_exprs(self, v):
        """The spec of a fresh tensor: each dimension whose size is a symbol plus a constant is
        padded to that symbol's bucket."""
        dims = []
        for s in v.shape:
            e = _expr(s)
            if not e.free_symbols:
                dims.append(_plain(int(e)))
                continue
            length = _symbol_plus_offset(e)
            if length is None:
                raise NoBucket(f"a dimension of size {e} (only a symbol plus a constant is padded)")
            dims.append(((self.buckets[length[0]], _length_key(*length)),))
        return tuple(dims)

    def at_bucket(self, x):
        """A size argument (an int or a SymInt node) at the bucket: a length is its symbol's
        bucket (every length of a symbol is padded to it), a product the product of buckets."""
        if not isinstance(x, torch.fx.Node) or not isinstance(_val(x), torch.SymInt):
            return x
        return self.size_at_bucket(_expr(_val(x)))

    def arg_spec(self, a):
        return self.spec.get(a) if isinstance(a, torch.fx.Node) else None

    # --- masks --------------------------------------------------------------------------
    def call(self, op, *args, **kwargs):
        return self.graph.call_function(op, args, kwargs)

    def real(self, key):
        """A 0-d int64 node: the real value of a length (a symbol plus a constant)."""
        if key not in self.real_nodes:
            symbol, offset = _split_length(key)
            if offset:
                self.real_nodes[key] = self.call(aten.add.Scalar, self.real(symbol), offset)
            else:
                self.real_nodes[key] = self.call(aten.select.int, self.lens, 0, self.symbols.index(symbol))
        return self.real_nodes[key]

    def dim_mask(self, dim, ndim, pos):
        key = (dim, ndim, pos)
        if key in self.dim_masks:
            return self.dim_masks[key]
        size = _dim_size(dim)
        idx = self.call(aten.arange.default, size, dtype=torch.int64, device=self.device)
        valid, inner = None, 1
        for k in range(len(dim) - 1, -1, -1):
            fsize, sym = dim[k]
            if sym:
                f = idx if inner == 1 else self.call(aten.div.Tensor_mode, idx, inner, rounding_mode="floor")
                if k > 0:
                    f = self.call(aten.remainder.Scalar, f, fsize)
                c = self.call(aten.lt.Tensor, f, self.real(sym))
                valid = c if valid is None else self.call(aten.logical_and.default, valid, c)
            inner *= fsize
        shape = [1] * ndim
        shape[pos] = size
        out = self.call(aten.view.default, valid, shape)
        self.dim_masks[key] = out
        return out

    def mask(self, spec):
        """A bool tensor broadcastable to a tensor with `spec`: True at real elements."""
        if spec in self.masks:
            return self.masks[spec]
        m = None
        for pos, dim in enumerate(spec):
            if _padded(dim):
                d = self.dim_mask(dim, len(spec), pos)
                m = d if m is None else self.call(aten.logical_and.default, m, d)
        self.masks[spec] = m
        return m

    def fill(self, x, spec, value, dtype):
        m = self.mask(spec)
        if m is None:
            return x
        v = self.call(aten.scalar_tensor.default, value, dtype=dtype, device=self.device)
        return self.call(aten.where.self, m, x, v)

    # --- edits rules make ---------------------------------------------------------------
    def rezero(self, n, spec, dtype):
        """Makes the padding of n's value zero again; later users read the fixed value."""
        if not _any_padded(spec):
            return n
        with self.graph.inserting_before(n.next):
            zeroed = self.fill(n, spec, False if dtype == torch.bool else 0, dtype)
        n.replace_all_uses_with(zeroed, delete_user_cb=lambda u: u is not zeroed)
        zeroed.meta["val"] = n.meta.get("val")  # same type and (symbolic) shape
        self.spec[zeroed] = spec
        return zeroed

    def rezero_outputs(self, n, specs, v):
        """rezero for each output of a multi-output op (its getitem users)."""
        for u in [u for u in n.users if u.target is operator.getitem]:
            i = u.args[1]
            if specs[i] is not None and isinstance(v[i], torch.Tensor):
                self.spec[u] = specs[i]
                self.rezero(u, specs[i], v[i].dtype)

    def fill_arg(self, n, index, value):
        """Sets the padding of n's argument `index` to `value` (for n only)."""
        x = n.args[index]
        with self.graph.inserting_before(n):
            filled = self.fill(x, self.spec[x], value, _val(x).dtype)
        self.replace_arg(n, index, filled)

    def replace_arg(self, n, index, new):
        args = list(n.args)
        args[index] = new
        n.args = tuple(args)

    def replace_outputs(self, n, values, specs):
        """Replaces a multi-output op by one node per output (a rule's masked version of it):
        its getitem users read values[i] instead, and the op goes."""
        for u in [u for u in n.users if u.target is operator.getitem]:
            new = values[u.args[1]]
            new.meta["val"] = u.meta.get("val")
            self.spec[new] = specs[u.args[1]]
            u.replace_all_uses_with(new)
            self.graph.erase_node(u)
        self.graph.erase_node(n)

    def count(self, x, spec, dims, keep, dtype):
        """The number of real elements of x (padding spec `spec`) in each reduction over dims."""
        ones = self.call(aten._to_copy.default, self.mask(spec), dtype=dtype)
        ones = self.call(aten.expand.default, ones, list(self.shape(_val(x))))
        return self.call(aten.sum.dim_IntList, ones, dims, keep)

    # --- the pass -----------------------------------------------------------------------
    def run(self):
        nodes = list(self.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        for n in placeholders:
            v = _val(n)
            if isinstance(v, torch.Tensor) and self.device is None:
                self.device = v.device
        if self.device is None:
            raise NoBucket("no tensor input")
        with self.graph.inserting_after(placeholders[-1]):
            self.lens = self.graph.placeholder("_torchtpu_real_lengths")
        for n in placeholders:
            v = _val(n)
            if isinstance(v, torch.Tensor):
                spec = self.known.get(n.name)
                if spec is None or len(spec) != v.dim():
                    spec = self.spec_from_exprs(v)
                self.spec[n] = spec
                self.placeholder_specs[n.name] = spec
        for n in nodes:
            if n.op == "call_function" and not getattr(n, "_erased", False):  # rules may replace later nodes
                with self.graph.inserting_before(n.next):
                    self.visit(n)
        self.graph.lint()
        return torch.fx.GraphModule(self.gm, self.graph)

    def visit(self, n):
        op = n.target
        v = _val(n)
        flat = [a for a in n.args if isinstance(a, torch.fx.Node)] + [
            x for a in n.args if isinstance(a, (list, tuple)) for x in a if isinstance(x, torch.fx.Node)]
        padded_in = any(_any_padded(self.spec[a]) for a in flat if a in self.spec)

        if op is operator.getitem:
            parent = self.spec.get(n.args[0])
            if isinstance(parent, list):
                self.spec[n] = parent[n.args[1]]
            return
        if not isinstance(op, torch._ops.OpOverload):
            if padded_in:
                raise NoBucket(f"{op} reads a padded tensor")
            return  # SymInt arithmetic: computed at the bucket's sizes
        name = op.name()
        sym_args = [a for a in flat if isinstance(_val(a), (torch.SymInt, torch.SymFloat))]
        if sym_args and op in _VALUE_FIRST_ARGS and any(
                isinstance(_val(n.args[i]), (torch.SymInt, torch.SymFloat))
                for i in _VALUE_FIRST_ARGS[op] if i < len(n.args) and isinstance(n.args[i], torch.fx.Node)):
            raise NoBucket(f"{name} takes a size as a value")  # arange(T, 2T), full(.., T)
        if sym_args and name in _SELECTS:
            self.spec[n] = _select(self, n, v)
            return
        if sym_args and op not in _SIZE_ARGS:
            self.size_as_value(n, op, name)
            op = n.target
        elif sym_args and op not in _SLICES:
            # Sizes computed from the symbols at run time would give s + 1 at the bucket where
            # the tensor of length s + 1 has its symbol's bucket: the rewrite fixes them.
            n.args = tuple([self.at_bucket(x) for x in a] if isinstance(a, (list, tuple)) else self.at_bucket(a)
                           for a in n.args)
        outs = v if isinstance(v, (list, tuple)) else [v]
        symbolic_out = any(isinstance(o, torch.Tensor) and any(_expr(s).free_symbols for s in o.shape) for o in outs)
        if not padded_in and not symbolic_out:
            specs = [_unpadded_spec(self.shape(o)) if isinstance(o, torch.Tensor) else None for o in outs]
            self.spec[n] = specs if isinstance(v, (list, tuple)) else specs[0]
            return
        if not isinstance(v, (list, tuple)) and not isinstance(v, torch.Tensor):
            raise NoBucket(f"{name} returns a non-tensor from a padded tensor")
        found = rule_for(op)
        if found is None:
            raise NoBucket(f"{name} on a padded tensor")
        self.spec[n] = found(self, n, v)

    def size_as_value(self, n, op, name):
        """x * s0, grad / s0 (mean's backward): the real size, as a tensor, not the bucket's."""
        packet = op.overloadpacket
        if packet not in _SIZE_AS_VALUE_OPS or \
                len(n.args) < 2 or not isinstance(_val(n.args[1]), torch.SymInt) or \
                isinstance(_val(n.args[0]), (torch.SymInt, torch.SymFloat)) or not hasattr(packet, "Tensor"):
            raise NoBucket(f"{name} takes a size as a value")
        with self.graph.inserting_before(n):
            value = self.sym_tensor(_val(n.args[1]).node.expr)
        n.target = packet.Tensor
        self.replace_arg(n, 1, value)

    def sym_tensor(self, expr):
        """A 0-d int64 tensor holding the value of a size expression at the real sizes."""
        if expr.is_Integer:
            return self.call(aten.scalar_tensor.default, int(expr), dtype=torch.int64, device=self.device)
        if expr.is_Symbol:
            return self.real(expr.name)
        if expr.is_Add or expr.is_Mul:
            op = aten.add.Tensor if expr.is_Add else aten.mul.Tensor
            terms = [self.sym_tensor(t) for t in expr.args]
            out = terms[0]
            for t in terms[1:]:
                out = self.call(op, out, t)
            return out
        raise NoBucket(f"a size expression {expr} used as a value")


# ---------------------------------------------------------------------------------------
# Rules: views and layout.


def _input_spec(rw, n):
    return rw.arg_spec(n.args[0])


def _dim_arg(n, index, ndim, default=0):
    d = n.args[index] if len(n.args) > index else n.kwargs.get("dim", default)
    return d % ndim


# Fused eager graphs (_fused_buckets.py) hold the *_copy forms of views (functionalization's).
@rule(*_VIEWS, "aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims", "aten::squeeze_copy",
      "aten::squeeze_copy.dim", "aten::squeeze_copy.dims")
def _view(rw, n, v):
    return _regroup(_input_spec(rw, n), rw.shape(v))


@rule("aten::permute", "aten::permute_copy")
def _permute(rw, n, v):
    s0 = _input_spec(rw, n)
    return tuple(s0[d] for d in n.args[1])


@rule("aten::transpose.int", "aten::transpose_copy.int")
def _transpose(rw, n, v):
    s0 = _input_spec(rw, n)
    d0, d1 = n.args[1] % len(s0), n.args[2] % len(s0)
    out = list(s0)
    out[d0], out[d1] = out[d1], out[d0]
    return tuple(out)


@rule("aten::t", "aten::t_copy")
def _t(rw, n, v):
    return tuple(reversed(_input_spec(rw, n)))


@rule("aten::unsqueeze", "aten::unsqueeze_copy")
def _unsqueeze(rw, n, v):
    s0 = _input_spec(rw, n)
    d = n.args[1] % (len(s0) + 1)
    return s0[:d] + (_plain(1),) + s0[d:]


@rule("aten::expand", "aten::expand_copy")
def _expand(rw, n, v):
    s0 = _input_spec(rw, n)
    out_shape = rw.shape(v)
    k = len(out_shape) - len(s0)
    dims, out_specs = [], None
    for i, size in enumerate(out_shape):
        if i < k or (s0[i - k] == _plain(1) and size != 1):  # a new or broadcast dimension
            out_specs = out_specs or rw.spec_from_exprs(v)
            dims.append(out_specs[i])
        else:
            dims.append(s0[i - k])
    spec = tuple(dims)
    if any(_padded(d) and (i < k or s0[i - k] == _plain(1)) for i, d in enumerate(spec)):
        rw.rezero(n, spec, v.dtype)  # copies of real data landed in the padding
    return spec


@rule("aten::alias", "aten::clone", "aten::detach", "aten::lift_fresh_copy", "aten::_to_copy", "aten::contiguous",
      "aten::alias_copy", "aten::detach_copy")
def _same(rw, n, v):
    return _input_spec(rw, n)


@rule("aten::split_with_sizes", "aten::split.Tensor", "aten::chunk", "aten::split_with_sizes_copy",
      "aten::split_copy.Tensor")
def _split(rw, n, v):
    s0 = _input_spec(rw, n)
    d = _dim_arg(n, 2, len(s0))
    if _padded(s0[d]):
        raise NoBucket(f"{n.target.name()} splits a padded dimension")
    return [s0[:d] + (_plain(rw.shape(o)[d]),) + s0[d + 1:] for o in v]


@rule("aten::unbind.int", "aten::unbind_copy.int")
def _unbind(rw, n, v):
    s0 = _input_spec(rw, n)
    d = _dim_arg(n, 1, len(s0))
    if _padded(s0[d]):
        raise NoBucket(f"{n.target.name()} splits a padded dimension")
    return [s0[:d] + s0[d + 1:] for _ in v]


@rule("aten::slice.Tensor", "aten::slice_copy.Tensor")
def _slice(rw, n, v):
    s0 = _input_spec(rw, n)
    d = _dim_arg(n, 1, len(s0))
    out_shape = rw.shape(v)
    in_shape = rw.shape(_val(n.args[0]))
    if _padded(s0[d]):
        return _slice_padded(rw, n, v, s0, d)
    spec = rw.spec_from_exprs(v)
    if _padded(spec[d]):  # x[:, :T] of a fixed-size tensor (a causal mask buffer)
        sym = _split_length(spec[d][0][1])[0]
        rw.limits.append((sym, in_shape[d]))
        spec = s0[:d] + (spec[d],) + s0[d + 1:]
        rw.rezero(n, spec, v.dtype)
        return spec
    return s0[:d] + (_plain(out_shape[d]),) + s0[d + 1:]


def _position(rw, x, length_expr):
    """A slice bound (int, None or a SymInt node) as an expression of the real sizes; a
    negative number counts from the end of a dimension of length length_expr."""
    import sympy

    if x is None:
        return sympy.Integer(0)
    if isinstance(x, torch.fx.Node):
        return _expr(_val(x))
    return length_expr + x if x < 0 else sympy.Integer(x)


def _slice_padded(rw, n, v, s0, d):
    """x[..., a:b] along a padded dimension, at the real sizes: a window of fixed size at a
    moving start (x[:, -1:]) is gathered there; a window of a length's size from a fixed start
    (x[:, 1:], x[:, :-1]) is shifted to the front and its tail re-zeroed."""
    args = list(n.args) + [None] * (5 - len(n.args))
    step = args[4] if len(n.args) > 4 else 1
    in_expr, out_expr = _expr(_val(n.args[0]).shape[d]), _expr(v.shape[d])
    if out_expr == in_expr:
        return s0
    if step != 1 or len(s0[d]) != 1:
        raise NoBucket("a strided slice, or a slice of a merged padded dimension")
    start = _position(rw, args[2], in_expr)
    x = n.args[0]
    bucket = s0[d][0][0]
    with rw.graph.inserting_before(n):
        if not out_expr.free_symbols:  # a fixed-size window
            size = int(out_expr)
            if start.free_symbols:
                index = rw.call(aten.add.Tensor, rw.sym_tensor(start),
                                rw.call(aten.arange.default, size, dtype=torch.int64, device=rw.device))
                out = rw.call(aten.index_select.default, x, d, index)
            else:
                out = rw.call(aten.slice.Tensor, x, d, int(start), int(start) + size)
            spec = s0[:d] + (_plain(size),) + s0[d + 1:]
        else:
            if start.free_symbols:
                raise NoBucket("a slice of a length's size at a moving start")
            out_spec = rw.spec_from_exprs(v)
            if out_spec[d][0][0] != bucket:
                raise NoBucket("a slice of a padded dimension to another symbol's length")
            out = x
            if int(start):
                out = rw.call(aten.slice.Tensor, x, d, int(start), bucket)
                pad = [0, 0] * (len(s0) - 1 - d) + [0, int(start)]
                out = rw.call(aten.constant_pad_nd.default, out, pad, 0)
            spec = s0[:d] + (out_spec[d],) + s0[d + 1:]
            out = rw.fill(out, spec, False if v.dtype == torch.bool else 0, v.dtype)
    out.meta["val"] = v
    n.replace_all_uses_with(out)
    rw.graph.erase_node(n)
    rw.spec[out] = spec
    return spec


@rule(*_SELECTS)
def _select(rw, n, v):
    """x.select(d, i): i counts from the real end when negative (x[:, -1]) and is read at
    the real sizes when it is a size (x[:, T - 1]); both pick the row with index_select."""
    s0 = _input_spec(rw, n)
    d = n.args[1] % len(s0)
    spec = s0[:d] + s0[d + 1:]
    index = n.args[2]
    symbolic = isinstance(index, torch.fx.Node)
    if not symbolic and (not _padded(s0[d]) or index >= 0):  # recorded at the real sizes: valid as it is
        return spec
    if not symbolic and len(s0[d]) != 1:
        raise NoBucket("a select from the end of a merged padded dimension")
    with rw.graph.inserting_before(n):
        if symbolic:
            real_index = rw.sym_tensor(_val(index).node.expr)
        else:
            real_index = rw.call(aten.add.Scalar, rw.real(s0[d][0][1]), index)
        picked = rw.call(aten.index_select.default, n.args[0], d, rw.call(aten.view.default, real_index, [1]))
        out = rw.call(aten.squeeze.dim, picked, d)
    out.meta["val"] = v
    n.replace_all_uses_with(out)
    rw.graph.erase_node(n)
    rw.spec[out] = spec
    return spec


@rule("aten::cat")
def _cat(rw, n, v):
    """A cat along a padded dimension (a KV cache or a token row growing by a step): the
    padded piece keeps its place and the fixed-size pieces after it are written at its real
    end (index_copy at T, T + k, ...); fixed pieces before it shift it by a constant."""
    tensors = list(n.args[0])
    specs = [rw.spec[t] for t in tensors]
    d = _dim_arg(n, 1, len(specs[0]))
    out_shape = rw.shape(v)
    rest = _broadcast([s[:d] + (_plain(1),) + s[d + 1:] for s in specs], out_shape[:d] + (1,) + out_shape[d + 1:])
    padded = [i for i, s in enumerate(specs) if _padded(s[d])]
    if not padded:
        return rest[:d] + (_plain(out_shape[d]),) + rest[d + 1:]
    if len(padded) > 1 or len(specs[padded[0]][d]) != 1:
        raise NoBucket("a cat of several padded pieces along a dimension")
    p = padded[0]
    bucket, key = specs[p][d][0]
    out_dim = rw.spec_from_exprs(v)[d]
    if out_dim[0][0] != bucket:
        raise NoBucket("a cat along a padded dimension to another symbol's length")
    spec = rest[:d] + (out_dim,) + rest[d + 1:]
    with rw.graph.inserting_before(n):
        base = tensors[p]
        before = sum(rw.shape(_val(t))[d] for t in tensors[:p])
        if before:  # fixed pieces first: the padded piece moves right by their size
            base = rw.call(aten.cat.default, tensors[:p + 1], d)
            base = rw.call(aten.slice.Tensor, base, d, 0, bucket)
        end = rw.call(aten.add.Scalar, rw.real(key), before) if before else rw.real(key)
        for t in tensors[p + 1:]:
            size = rw.shape(_val(t))[d]
            if size == 0:
                continue
            index = rw.call(aten.add.Tensor, end, rw.call(aten.arange.default, size, dtype=torch.int64, device=rw.device))
            base = rw.call(aten.index_copy.default, base, d, index, t)
            end = rw.call(aten.add.Scalar, end, size)
    base.meta["val"] = v
    n.replace_all_uses_with(base)
    rw.graph.erase_node(n)
    rw.spec[base] = spec
    return spec


@rule("aten::select_backward")
def _select_backward(rw, n, v):
    """x.select(d, i)'s gradient: zeros shaped like x, the gradient at index i of d."""
    s0 = _input_spec(rw, n)
    d = n.args[2] % v.dim()
    if _expr(v.shape[d]).free_symbols:
        raise NoBucket("a select on a padded dimension")
    return s0[:d] + (_plain(rw.shape(v)[d]),) + s0[d:]


@rule("aten::slice_backward")
def _slice_backward(rw, n, v):
    """x[..., a:b]'s gradient: zeros shaped like x, the gradient in the slice of d."""
    s0 = _input_spec(rw, n)
    d = n.args[2] % v.dim()
    if _padded(s0[d]) or _expr(v.shape[d]).free_symbols:
        raise NoBucket("a slice of a padded dimension")
    return s0[:d] + (_plain(rw.shape(v)[d]),) + s0[d + 1:]


# ---------------------------------------------------------------------------------------
# Rules: elementwise ops and factories (their padding is set to zero afterwards).


@rule(*_FACTORIES)
def _factory(rw, n, v):
    spec = rw.spec_from_exprs(v)
    rw.rezero(n, spec, v.dtype)
    return spec


@rule("aten::tril", "aten::triu", "aten::fill.Scalar", "aten::fill.Tensor", "aten::zero")  # elementwise for the padding
def _elementwise(rw, n, v):
    """Also the rule of every op PyTorch tags pointwise (rule_for)."""
    spec = _broadcast([rw.arg_spec(x) for x in n.args], rw.shape(v))
    rw.rezero(n, spec, v.dtype)
    return spec


@rule("aten::native_dropout")
def _dropout(rw, n, v):
    s0 = _input_spec(rw, n)
    specs = [s0, s0]
    rw.rezero_outputs(n, specs, v)
    return specs


# ---------------------------------------------------------------------------------------
# Rules: reductions (the padding holds the reduction's identity first).


def _reduced_dims(n, ndim):
    """The dimensions a reduction node reduces, and its keepdim."""
    a = n.args
    if n.target in (aten.sum.default, aten.mean.default, aten.any.default):
        dims, keep = None, False
    else:
        dims = a[1] if len(a) > 1 else n.kwargs.get("dim")
        keep = a[2] if len(a) > 2 else n.kwargs.get("keepdim", False)
    if isinstance(dims, int):
        dims = [dims]
    if not dims:  # None, or an empty list: amax(x, []) and sum(x, []) reduce every dimension
        dims = range(ndim)
    return sorted({d % ndim for d in dims}) if ndim else [], keep


def _reduced_spec(s0, dims, keep):
    return tuple(_plain(1) if i in dims else d for i, d in enumerate(s0) if keep or i not in dims)


def _reduction(rw, n, v, fill):
    s0 = _input_spec(rw, n)
    dims, keep = _reduced_dims(n, len(s0))
    out_spec = _reduced_spec(s0, dims, keep)
    if any(_padded(s0[d]) for d in dims):
        fill = _reduce_fill(fill, _val(n.args[0]).dtype)
        if fill != 0:  # zero: the padding already holds it
            rw.fill_arg(n, 0, fill)
    if isinstance(v, (list, tuple)):  # max.dim, min.dim: values and indices
        specs = [out_spec for _ in v]
        rw.rezero_outputs(n, specs, v)
        return specs
    rw.rezero(n, out_spec, v.dtype)
    return out_spec


@rule("aten::sum", "aten::sum.dim_IntList", "aten::any", "aten::any.dim")
def _sum(rw, n, v):
    return _reduction(rw, n, v, 0.0)


@rule("aten::amax", "aten::max.dim", "aten::argmax", "aten::logsumexp")
def _max(rw, n, v):
    return _reduction(rw, n, v, -_INF)


@rule("aten::amin", "aten::min.dim", "aten::argmin")
def _min(rw, n, v):
    return _reduction(rw, n, v, _INF)


@rule("aten::all.dim", "aten::prod.dim_int")
def _product(rw, n, v):
    return _reduction(rw, n, v, 1.0)


@rule("aten::mean", "aten::mean.dim")
def _mean(rw, n, v):
    s0 = _input_spec(rw, n)
    dims, keep = _reduced_dims(n, len(s0))
    out_spec = _reduced_spec(s0, dims, keep)
    if not any(_padded(s0[d]) for d in dims):
        rw.rezero(n, out_spec, v.dtype)
        return out_spec
    # Over a padded dimension: the sum (the padding holds zeros) over the real count.
    x = n.args[0]
    dtype = n.kwargs.get("dtype") or v.dtype
    with rw.graph.inserting_before(n):
        total = rw.call(aten.sum.dim_IntList, x, dims, keep, dtype=dtype)
        count = rw.count(x, s0, dims, keep, dtype)
        mean = rw.call(aten.div.Tensor, total, count)
    mean.meta["val"] = v
    n.replace_all_uses_with(mean)
    rw.graph.erase_node(n)
    rw.spec[mean] = out_spec
    rw.rezero(mean, out_spec, dtype)  # rows with no real element: 0/0
    return out_spec


@rule("aten::_softmax", "aten::_log_softmax", "aten::_safe_softmax", "aten::softmax.int", "aten::log_softmax.int")
def _softmax(rw, n, v):
    s0 = _input_spec(rw, n)
    if _padded(s0[n.args[1] % len(s0)]):
        rw.fill_arg(n, 0, -_INF)  # the padding gets no probability
    rw.rezero(n, s0, v.dtype)
    return s0


@rule("aten::_softmax_backward_data", "aten::_log_softmax_backward_data")
def _softmax_backward(rw, n, v):
    s0 = _input_spec(rw, n)
    rw.rezero(n, s0, v.dtype)
    return s0


# ---------------------------------------------------------------------------------------
# Rules: matrix products (zeros in a contracted padded dimension add nothing).


@rule("aten::mm")
def _mm(rw, n, v):
    s0, s1 = _input_spec(rw, n), rw.arg_spec(n.args[1])
    return (s0[0], s1[1])


@rule("aten::bmm")
def _bmm(rw, n, v):
    s0, s1 = _input_spec(rw, n), rw.arg_spec(n.args[1])
    return (_broadcast([s0[:1], s1[:1]], rw.shape(v)[:1])[0], s0[1], s1[2])


@rule("aten::addmm", "aten::baddbmm")
def _add_product(rw, n, v):
    s0, s1, s2 = _input_spec(rw, n), rw.arg_spec(n.args[1]), rw.arg_spec(n.args[2])
    prod = (s1[0], s2[1]) if n.target is aten.addmm.default else (s1[0], s1[1], s2[2])
    spec = _broadcast([s0, prod], rw.shape(v))
    rw.rezero(n, spec, v.dtype)
    return spec


# ---------------------------------------------------------------------------------------
# Rules: layers of language models (layer norm, embedding, cross-entropy).


@rule("aten::native_layer_norm")
def _layer_norm(rw, n, v):
    s0 = _input_spec(rw, n)
    k = len(n.args[1])
    if any(_padded(d) for d in s0[-k:]):
        raise NoBucket("a layer norm over a padded dimension")
    stat = s0[:-k] + (_plain(1),) * k
    specs = [s0, stat, stat]
    rw.rezero_outputs(n, specs, v)
    return specs


@rule("aten::native_layer_norm_backward")
def _layer_norm_backward(rw, n, v):
    specs = [rw.arg_spec(n.args[1]), _unpadded_spec(rw.shape(v[1])) if v[1] is not None else None,
             _unpadded_spec(rw.shape(v[2])) if v[2] is not None else None]
    rw.rezero_outputs(n, specs, v)
    return specs


@rule("aten::gather")
def _gather(rw, n, v):
    """x.gather(d, index) by a padded index (a repetition penalty reads the scores of the
    tokens so far): padded index entries (0) read a real element, re-zeroed after."""
    if _any_padded(_input_spec(rw, n)):
        raise NoBucket("aten::gather from a padded tensor")
    spec = rw.arg_spec(n.args[2])
    rw.rezero(n, spec, v.dtype)
    return spec


def _first_real(rw, x, spec):
    """x with each padded element replaced by the element at position 0 of its padded
    dimensions (a real one)."""
    first = x
    for d, dim in enumerate(spec):
        if _padded(dim):
            first = rw.call(aten.slice.Tensor, first, d, 0, 1)
    first = rw.call(aten.expand.default, first, list(rw.shape(_val(x))))
    return rw.call(aten.where.self, rw.mask(spec), x, first)


@rule("aten::scatter.src", "aten::scatter.value", "aten::scatter_add")
def _scatter(rw, n, v):
    """x.scatter(d, index, src) by a padded index (the penalized scores written back): padded
    entries repeat a real entry's (index, src) pair, which writes what that entry writes;
    scatter_add's padded src adds zeros."""
    s0 = _input_spec(rw, n)
    if _any_padded(s0):
        raise NoBucket(f"{n.target.name()} into a padded tensor")
    index, index_spec = n.args[2], rw.arg_spec(n.args[2])
    if n.target is not aten.scatter_add.default and _any_padded(index_spec):
        src = n.args[3]
        if isinstance(src, torch.fx.Node) and rw.arg_spec(src) != index_spec:
            raise NoBucket(f"{n.target.name()} with a source padded unlike its index")
        with rw.graph.inserting_before(n):
            rw.replace_arg(n, 2, _first_real(rw, index, index_spec))
            if isinstance(src, torch.fx.Node):
                rw.replace_arg(n, 3, _first_real(rw, src, index_spec))
    return s0


@rule("aten::embedding")
def _embedding(rw, n, v):
    table = _input_spec(rw, n)
    if _any_padded(table):
        raise NoBucket("an embedding table is padded")
    spec = rw.arg_spec(n.args[1]) + (table[-1],)
    rw.rezero(n, spec, v.dtype)  # padded token ids (0) looked up real rows
    return spec


@rule("aten::embedding_dense_backward")
def _embedding_backward(rw, n, v):
    if len(n.args) > 4 and n.args[4]:
        raise NoBucket("embedding with scale_grad_by_freq")
    return _unpadded_spec(rw.shape(v))  # padded positions carry zero gradients


@rule("aten::nll_loss_forward")
def _nll_loss(rw, n, v):
    s0 = _input_spec(rw, n)
    if _padded(s0[-1] if len(s0) == 1 else s0[1]):
        raise NoBucket("nll_loss over padded classes")
    target = rw.arg_spec(n.args[1])
    rw.fill_arg(n, 1, n.args[4])  # padded targets are ignore_index
    reduction = n.args[3]
    return [target if reduction == 0 else (), ()]


@rule("aten::nll_loss_backward")
def _nll_loss_backward(rw, n, v):
    rw.fill_arg(n, 2, n.args[5])  # padded targets are ignore_index
    spec = rw.arg_spec(n.args[1])
    rw.rezero(n, spec, v.dtype)
    return spec


# ---------------------------------------------------------------------------------------
# Rules: convolutional networks (a padded batch; channels and space stay exact).


def _batch_only(rw, n, what):
    """The padded dimension of n's tensor arguments may only be the batch (dimension 0)."""
    for a in n.args:
        spec = rw.arg_spec(a)
        if spec is not None and any(_padded(d) for d in spec[1:]):
            raise NoBucket(f"{what} along a padded dimension")


def _batch_spec(s0, out):
    """The spec of a tensor shaped `out` whose batch is that of s0 (the rest exact)."""
    return (s0[0],) + tuple(_plain(size) for size in out[1:])


@rule("aten::convolution")
def _convolution(rw, n, v):
    _batch_only(rw, n, "a convolution")
    spec = _batch_spec(_input_spec(rw, n), rw.shape(v))
    rw.rezero(n, spec, v.dtype)  # the bias landed in padded rows
    return spec


@rule("aten::convolution_backward")
def _convolution_backward(rw, n, v):
    _batch_only(rw, n, "a convolution")  # zero rows of the gradient add nothing to the weight's
    specs = [_batch_spec(rw.arg_spec(n.args[1]), rw.shape(v[0])) if v[0] is not None else None,
             _unpadded_spec(rw.shape(v[1])) if v[1] is not None else None,
             _unpadded_spec(rw.shape(v[2])) if v[2] is not None else None]
    rw.rezero_outputs(n, specs, v)
    return specs


@rule("aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices")
def _max_pool(rw, n, v):
    _batch_only(rw, n, "a pooling")
    spec = _batch_spec(_input_spec(rw, n), rw.shape(v[0]))
    specs = [spec, spec]
    rw.rezero_outputs(n, specs, v)
    return specs


@rule("aten::max_pool2d_with_indices_backward", "aten::max_pool3d_with_indices_backward", "aten::avg_pool2d",
      "aten::avg_pool2d_backward", "aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d_backward",
      "aten::_native_batch_norm_legit_no_training")
def _per_sample(rw, n, v):
    """Ops that treat each sample of the batch apart (eval-mode batch norm: per channel)."""
    _batch_only(rw, n, f"{n.target.name()}")
    outs = v if isinstance(v, (list, tuple)) else [v]
    s0 = _input_spec(rw, n)
    specs = [_batch_spec(s0, rw.shape(o)) if o is not None and o.dim() == len(s0) else
             _unpadded_spec(rw.shape(o)) if o is not None else None for o in outs]
    if isinstance(v, (list, tuple)):
        rw.rezero_outputs(n, specs, v)
        return specs
    rw.rezero(n, specs[0], v.dtype)
    return specs[0]


def _channel_view(rw, t, ndim):
    """A per-channel vector [C] as [1, C, 1, ...] (broadcast against an NC... tensor)."""
    return rw.call(aten.view.default, t, [1, -1] + [1] * (ndim - 2))


@rule("aten::_native_batch_norm_legit_functional")
def _batch_norm(rw, n, v):
    """Training batch norm over a padded batch: statistics over the real elements only."""
    x, weight, bias, running_mean, running_var, training, momentum, eps = n.args
    s0 = rw.arg_spec(x)
    if _padded(s0[1]):
        raise NoBucket("a batch norm over padded channels")
    if not training:
        return _per_sample(rw, n, v)
    ndim = len(s0)
    dims = [d for d in range(ndim) if d != 1]
    dtype = v[0].dtype
    with rw.graph.inserting_before(n):
        count = rw.call(aten.view.default, rw.count(x, s0, dims, False, dtype), [-1])
        mean = rw.call(aten.div.Tensor, rw.call(aten.sum.dim_IntList, x, dims), count)
        centered = rw.fill(rw.call(aten.sub.Tensor, x, _channel_view(rw, mean, ndim)), s0, 0, dtype)
        var = rw.call(aten.div.Tensor, rw.call(aten.sum.dim_IntList, rw.call(aten.mul.Tensor, centered, centered), dims),
                      count)
        invstd = rw.call(aten.rsqrt.default, rw.call(aten.add.Scalar, var, eps))
        out = rw.call(aten.mul.Tensor, centered, _channel_view(rw, invstd, ndim))
        if weight is not None:
            out = rw.call(aten.mul.Tensor, out, _channel_view(rw, weight, ndim))
        if bias is not None:
            out = rw.fill(rw.call(aten.add.Tensor, out, _channel_view(rw, bias, ndim)), s0, 0, dtype)
        unbiased = rw.call(aten.div.Tensor, rw.call(aten.mul.Tensor, var, count),
                           rw.call(aten.clamp_min.default, rw.call(aten.sub.Scalar, count, 1), 1))
        new_mean = rw.call(aten.add.Tensor, rw.call(aten.mul.Scalar, running_mean, 1 - momentum),
                           rw.call(aten.mul.Scalar, mean, momentum))
        new_var = rw.call(aten.add.Tensor, rw.call(aten.mul.Scalar, running_var, 1 - momentum),
                          rw.call(aten.mul.Scalar, unbiased, momentum))
    stat = _unpadded_spec(rw.shape(v[1]))
    specs = [s0, stat, stat, stat, stat]
    rw.replace_outputs(n, [out, mean, invstd, new_mean, new_var], specs)
    return specs


@rule("aten::native_batch_norm_backward")
def _batch_norm_backward(rw, n, v):
    grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, mask = n.args
    s0 = rw.arg_spec(x)
    if _padded(s0[1]):
        raise NoBucket("a batch norm over padded channels")
    stat = _unpadded_spec(rw.shape(v[1])) if v[1] is not None else _unpadded_spec(rw.shape(v[2])) \
        if v[2] is not None else None
    specs = [s0 if v[0] is not None else None, stat if v[1] is not None else None, stat if v[2] is not None else None]
    if not train:  # per channel: zero rows of the gradient give zero rows and add nothing
        rw.rezero_outputs(n, specs, v)
        return specs
    ndim = len(s0)
    dims = [d for d in range(ndim) if d != 1]
    dtype = _val(x).dtype
    with rw.graph.inserting_before(n):
        count = rw.call(aten.view.default, rw.count(x, s0, dims, False, dtype), [-1])
        invstd = _channel_view(rw, save_invstd, ndim)
        xhat = rw.fill(rw.call(aten.mul.Tensor, rw.call(aten.sub.Tensor, x, _channel_view(rw, save_mean, ndim)), invstd),
                       s0, 0, dtype)
        g = grad if weight is None else rw.call(aten.mul.Tensor, grad, _channel_view(rw, weight, ndim))
        sum_g = _channel_view(rw, rw.call(aten.sum.dim_IntList, g, dims), ndim)
        sum_gx = _channel_view(rw, rw.call(aten.sum.dim_IntList, rw.call(aten.mul.Tensor, g, xhat), dims), ndim)
        t = rw.call(aten.sub.Tensor, rw.call(aten.mul.Tensor, g, _channel_view(rw, count, ndim)), sum_g)
        t = rw.call(aten.sub.Tensor, t, rw.call(aten.mul.Tensor, xhat, sum_gx))
        dx = rw.fill(rw.call(aten.mul.Tensor, t, rw.call(aten.div.Tensor, invstd, _channel_view(rw, count, ndim))),
                     s0, 0, dtype)
        dw = rw.call(aten.sum.dim_IntList, rw.call(aten.mul.Tensor, grad, xhat), dims)
        db = rw.call(aten.sum.dim_IntList, grad, dims)
    rw.replace_outputs(n, [dx, dw, db], specs)
    return specs


# ---------------------------------------------------------------------------------------
# Padding and slicing real tensors.


def _factor_sizes(spec, values):
    real, padded = [], []
    for dim in spec:
        for size, sym in dim:
            padded.append(size)
            real.append(_length(sym, values) if sym else size)
    return real, padded


# Tensors at least this large move to a larger bucket on the device (pad() says why): 16 MiB
# through host memory and back takes milliseconds over PCIe; a small pad graph compiles in
# tens of milliseconds once per pair of buckets. Smaller ones keep the compile count of a
# generate() at one per doubling (issue 27).
DEVICE_PAD_BYTES = 16 << 20


def pad(t: torch.Tensor, spec, reals: dict, current=None, pol=None) -> torch.Tensor:
    """t (real sizes, or padded as the spec `current` says) zero-padded to the bucket sizes
    of `spec`; a value kept padded from a smaller bucket is moved to the next one this way
    once per bucket.

    On the host by default: no compile, whatever the real sizes. Given the bucket policy
    `pol`, for a caller whose recorded ops run before its graph (a fused flush padded to a
    bucket, torchtpu/_fused_buckets.py), a tensor whose sizes are all buckets is padded on
    its device instead: a value held at a smaller bucket (`current`), or one that fills its
    bucket exactly (the KV cache a decode step hands over when its length crosses a bucket).
    That is a constant_pad_nd from one bucket to the next, one small executable per pair of
    buckets, where the host path moves the whole tensor to host memory and back; so only for
    tensors of DEVICE_PAD_BYTES or more (a large model's KV cache), where the round trip
    costs more than the compile. Its padding need not be zero: padded graphs mask what lies
    past the real lengths."""
    real, padded = _factor_sizes(spec, reals)
    bucket_shape = [_dim_size(dim) for dim in spec]
    moved = current is not None and current != spec
    if not moved and (real == padded or list(t.shape) == bucket_shape):  # nothing to pad, or already padded
        return t
    if moved:
        held_real, held = _factor_sizes(current, reals)
    else:
        held_real = held = real
    # Device padding compiles per (held shape, padded shape): only when each grown factor is a
    # bucket, and only for a tensor whose round trip costs more than a small compile.
    if (pol is not None and t.numel() * t.element_size() >= DEVICE_PAD_BYTES
            and all(bucket_of(h, pol) == h for h, p in zip(held, padded) if h != p)):
        widths = [w for h, p in zip(reversed(held), reversed(padded)) for w in (0, p - h)]
        return torch.constant_pad_nd(t.detach().reshape(held), widths, 0).reshape(bucket_shape)
    host = t.detach().to("cpu").reshape(held)[tuple(slice(0, r) for r in held_real)]
    out = torch.zeros(padded, dtype=host.dtype)
    out[tuple(slice(0, r) for r in real)] = host
    return out.reshape(bucket_shape).to(t.device)


def unpad(t: torch.Tensor, spec, reals: dict) -> torch.Tensor:
    """The real elements of a padded tensor (a view when only outer factors are padded)."""
    real, padded = _factor_sizes(spec, reals)
    if real == padded:
        return t
    x = t.reshape(padded)[tuple(slice(0, r) for r in real)]
    return x.reshape([_dim_size(dim, reals) for dim in spec])


def carries_sizes(args) -> bool:
    """Whether a padded tensor kept by an earlier graph (saved for the backward) is in args."""
    return any(isinstance(a, torch.Tensor) and hasattr(a, _REAL_ATTR) for a in args)


# ---------------------------------------------------------------------------------------
# The public face: a graph, a call's sizes, the graph padded for one bucket.


@dataclasses.dataclass(frozen=True)
class Sizes:
    """One call's sizes: the real value of each symbol and the bucket it runs at."""

    real: dict
    bucket: dict
    key: tuple  # the bucket sizes in symbol order: one padded graph per key


class DynamicGraph:
    """An FX graph whose inputs have symbolic sizes."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.symbols = graph_symbols(gm)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.input_names = [n.name for n in placeholders]
        self.inputs = [_val(n) for n in placeholders]  # tensors and SymInts (symbolic)
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self.output_names = [o.name if isinstance(o, torch.fx.Node) else None for o in outputs]
        self.outputs = [_val(o) if isinstance(o, torch.fx.Node) else None for o in outputs]
        # Where real_sizes reads each symbol, found once (it runs on every call): the inputs
        # that are a plain symbol, and the (input, dim) sizes that are one.
        self._symbol_args = [(i, v.node.expr.name) for i, v in enumerate(self.inputs)
                             if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol]
        self._symbol_dims = [(i, d, e.name) for i, v in enumerate(self.inputs) if isinstance(v, torch.Tensor)
                             for d, e in enumerate(map(_expr, v.shape)) if e is not None and e.is_Symbol]
        # Per symbol, the largest constant its lengths add (a cat to T + 1): its bucket holds them all.
        self.headroom = {s: 0 for s in self.symbols}
        for node in gm.graph.nodes:
            v = _val(node)
            for t in v if isinstance(v, (list, tuple)) else [v]:
                if not isinstance(t, torch.Tensor):
                    continue
                for size in t.shape:
                    length = _symbol_plus_offset(_expr(size))
                    if length is not None and length[0] in self.headroom:
                        self.headroom[length[0]] = max(self.headroom[length[0]], length[1])

    def real_sizes(self, args) -> dict:
        """The real value of each symbol that args show."""
        for a in args:  # tensors a padded forward saved for this backward know the sizes
            real = getattr(a, _REAL_ATTR, None) if isinstance(a, torch.Tensor) else None
            if real is not None:
                return dict(real)
        reals = {}
        for i, name in self._symbol_args:
            if i < len(args) and isinstance(args[i], int):
                reals[name] = args[i]
        seen = {}
        if any(s not in reals for s in self.symbols):
            for i, d, name in self._symbol_dims:  # the smallest size seen: the real one
                a = args[i] if i < len(args) else None
                if name not in reals and isinstance(a, torch.Tensor) and d < a.dim():
                    size = a.shape[d]
                    seen[name] = min(size, seen.get(name, size))
        return {**seen, **reals}

    def sizes(self, args, pol="env") -> Sizes | None:
        """The sizes a call with args runs at; None when it runs at its exact sizes
        (bucketing off, a size args do not show, a size above the largest bucket).
        pol: a policy() value; by default TORCHTPU_BUCKETS now."""
        pol = policy() if pol == "env" else pol
        if pol is None or not self.symbols:
            return None
        reals = self.real_sizes(args)
        if any(s not in reals for s in self.symbols):
            return None
        if isinstance(pol, list) and any(reals[s] + self.headroom[s] > pol[-1] for s in self.symbols):
            return None
        floor = bucket_of(max(_FLOORS), pol) if _FLOORS else 0
        buckets = {s: max(bucket_of(reals[s] + self.headroom[s], pol), floor) for s in self.symbols}
        return Sizes(reals, buckets, tuple(buckets[s] for s in self.symbols))

    def rewrite(self, sizes: Sizes, known_specs: dict | None = None) -> "Padded":
        """The graph rewritten to run at sizes.bucket; raises NoBucket. known_specs: padding
        specs of inputs by placeholder name (a backward's saved tensors)."""
        rw = _Rewrite(copy.deepcopy(self.gm), sizes.bucket, self.symbols, known_specs or {})
        gm = rw.run()
        for sym, limit in rw.limits:
            if sizes.bucket[sym] > limit:
                raise NoBucket(f"bucket {sizes.bucket[sym]} of {sym} exceeds a sliced size {limit}")
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        out_specs = [rw.spec.get(o) if isinstance(o, torch.fx.Node) else None for o in outputs]
        return Padded(gm, self, rw.placeholder_specs, out_specs)


@dataclasses.dataclass
class Padded:
    """A graph rewritten for one bucket: its extra last input is the real lengths."""

    gm: torch.fx.GraphModule
    source: DynamicGraph
    input_specs: dict  # placeholder name -> padding spec
    output_specs: list  # per output: padding spec, or None
    plans: dict = dataclasses.field(default_factory=dict, repr=False)  # bucket key -> _plan()

    @property
    def output_specs_by_name(self) -> dict:
        """Padded outputs' specs by the source graph's output names: a forward's saved
        tensors are its backward's inputs of the same names (known_specs of its rewrite)."""
        return {name: spec for name, spec in zip(self.source.output_names, self.output_specs)
                if name and spec is not None}

    def prepare(self, args, sizes: Sizes, pol=None) -> list:
        """The arguments of self.gm for a call with args: tensors padded to the bucket (those
        whose sizes are buckets of `pol` on their device, see pad()), sizes at the bucket's
        values, and the real lengths last."""
        plan = self._plan(sizes)
        out = []
        for (kind, what), a in zip(plan, args):
            if kind == "size":
                out.append(what)
            elif kind == "pad" and isinstance(a, torch.Tensor):
                spec, bucket_shape = what
                # Already padded (a cache kept padded by the last call): the common case.
                out.append(a if list(a.shape) == bucket_shape else pad(a, spec, sizes.real, pol=pol))
            else:
                out.append(a)
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        out.append(torch.tensor([sizes.real[s] for s in self.source.symbols], dtype=torch.int64).to(device))
        return out

    def _plan(self, sizes: Sizes) -> list:
        """Per input, what prepare does with it at these buckets, worked out once: ("size",
        its value at the bucket), ("pad", (spec, the padded shape)) or ("keep", None)."""
        plan = self.plans.get(sizes.key)
        if plan is None:
            plan = []
            for name, v in zip(self.source.input_names, self.source.inputs):
                if isinstance(v, torch.SymInt):
                    plan.append(("size", _eval(v.node.expr, sizes.bucket)))
                elif name in self.input_specs:
                    spec = self.input_specs[name]
                    plan.append(("pad", (spec, [_dim_size(dim) for dim in spec])))
                else:
                    plan.append(("keep", None))
            self.plans[sizes.key] = plan
        return plan

    def finish(self, outputs, sizes: Sizes, users: int | None = None) -> list:
        """The outputs as the unpadded graph gives them: the first `users` (all when None)
        sliced to the real sizes; the others stay padded and carry the real sizes (tensors a
        forward saves for its backward)."""
        out = list(outputs)
        users = len(out) if users is None else users
        for i, (o, v) in enumerate(zip(out, self.source.outputs)):
            if isinstance(v, torch.SymInt):
                out[i] = _eval(v.node.expr, sizes.real)
            elif isinstance(o, torch.Tensor) and _any_padded(self.output_specs[i]):
                if i < users:
                    out[i] = unpad(o, self.output_specs[i], sizes.real)
                else:
                    setattr(o, _REAL_ATTR, sizes.real)
        return out
