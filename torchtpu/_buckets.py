"""Shape buckets for dynamic graphs of torch.compile(backend="tpu").

A graph Dynamo traced with symbolic sizes (`dynamic=True`, `torch._dynamo.mark_dynamic`, or
Dynamo's automatic dynamic shapes after a second input shape) would need one XLA executable
per concrete size. Instead each symbol is rounded up to a bucket (the next power of two by
default) and the graph runs at the bucket's sizes on zero-padded inputs:

- The FX graph is rewritten once per bucket. Every tensor carries a *padding spec*: per
  dimension, its factors (outermost first) and which of them are padded, so a dimension
  that merges a padded one (`view(B*T, C)`) stays exact. A mask of the real elements is
  built inside the graph from `iota < real length`; the real lengths are one small int64
  input, so every length in a bucket replays the same executable.
- Invariant: padded elements hold zeros. Ops that could write something else there
  (a bias add, exp, an embedding lookup of padded token 0) are followed by
  `where(mask, out, 0)`. Sums and matmuls that contract a padded dimension are then exact;
  mean divides by the real count; max/softmax/logsumexp see -inf in the padding;
  nll_loss sees ignore_index for padded targets.
- An op the rules do not cover touching a padded dimension (a sort along it, a variance
  over it, an index by a padded tensor, ...) turns bucketing off for that graph, which
  then compiles once per size as before (`metrics.report()` says why).

Outputs the user sees are sliced back to the real sizes; tensors the forward saves for the
backward stay padded (the backward graph is rewritten for the same bucket and gets the
real sizes from them). Inputs are padded on the host (they are usually fresh uploads), so
nothing is compiled per real size.

TORCHTPU_BUCKETS: "pow2" (default), "off", or increasing sizes "64,128,256" (a size above
the largest one runs unbucketed).
"""
from __future__ import annotations

import operator
import os

import torch

aten = torch.ops.aten

_REAL_ATTR = "_torchtpu_real_sizes"


class NoBucket(Exception):
    """The graph cannot run padded; it runs at its exact sizes."""


# ---------------------------------------------------------------------------------------
# Bucket policy.


def policy():
    spec = os.environ.get("TORCHTPU_BUCKETS", "pow2").strip().lower()
    if spec in ("off", "0", "none", ""):
        return None
    if spec == "pow2":
        return "pow2"
    try:
        sizes = sorted({int(s) for s in spec.split(",")})
    except ValueError:
        raise ValueError(f'TORCHTPU_BUCKETS={spec!r}: use "pow2", "off" or increasing sizes like "64,128,256"') from None
    if not sizes or sizes[0] < 1:
        raise ValueError(f"TORCHTPU_BUCKETS={spec!r}: sizes must be positive")
    return sizes


def bucket_of(n: int, pol) -> int:
    if n <= 1 or pol is None:
        return n
    if pol == "pow2":
        return 1 << (n - 1).bit_length()
    for size in pol:
        if size >= n:
            return size
    return n


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


# ---------------------------------------------------------------------------------------
# The rewrite.

_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default}
_SAME = {aten.alias.default, aten.clone.default, aten.detach.default, aten.lift_fresh_copy.default,
         aten._to_copy.default, aten.contiguous.default}
_POSITIONAL = {aten.tril.default, aten.triu.default}
_FACTORIES = {aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format,
              aten.arange.default, aten.arange.start, aten.arange.start_step, aten.new_zeros.default,
              aten.new_ones.default, aten.new_full.default, aten.new_empty.default, aten.scalar_tensor.default,
              aten.empty_strided.default, aten.full_like.default, aten.zeros_like.default,
              aten.ones_like.default, aten.empty_like.default}
_REDUCE_FILL = {  # reductions over a padded dimension: what the padding must hold first
    aten.sum.dim_IntList: 0.0, aten.sum.default: 0.0, aten.any.dim: 0.0, aten.any.default: 0.0,
    aten.amax.default: float("-inf"), aten.max.dim: float("-inf"), aten.argmax.default: float("-inf"),
    aten.logsumexp.default: float("-inf"), aten.amin.default: float("inf"), aten.min.dim: float("inf"),
    aten.argmin.default: float("inf"), aten.all.dim: 1.0, aten.prod.dim_int: 1.0,
}
_SOFTMAX = {aten._softmax.default, aten._log_softmax.default, aten._safe_softmax.default,
            aten.softmax.int, aten.log_softmax.int}
_SOFTMAX_BACKWARD = {aten._softmax_backward_data.default, aten._log_softmax_backward_data.default}
# Ops whose SymInt arguments are sizes (computed at the bucket's sizes), never values.
_SIZE_ARGS = _VIEWS | _FACTORIES | {aten.expand.default, aten.slice.Tensor, aten.narrow.default,
                                    aten.split_with_sizes.default, aten.split.Tensor,
                                    aten.embedding_dense_backward.default, aten.sym_size.int,
                                    aten.sym_numel.default, aten.sym_stride.int, aten.as_strided.default,
                                    aten.native_layer_norm.default, aten.native_layer_norm_backward.default,
                                    aten.new_empty_strided.default}


# Factories whose listed arguments are values (start of a range, fill value), not sizes.
_VALUE_FIRST_ARGS = {aten.arange.start: (0,), aten.arange.start_step: (0, 2), aten.full.default: (1,),
                     aten.new_full.default: (2,), aten.full_like.default: (1,), aten.scalar_tensor.default: (0,)}


class _Rewriter:
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
        return tuple(_eval(_expr(s), self.buckets) for s in v.shape)

    def spec_from_exprs(self, v):
        dims = []
        for s in v.shape:
            e = _expr(s)
            if not e.free_symbols:
                dims.append(_plain(int(e)))
            elif len(e.free_symbols) == 1 and e == next(iter(e.free_symbols)):
                dims.append(((self.buckets[e.name], e.name),))
            else:
                raise NoBucket(f"a dimension of size {e} (only plain symbols are padded)")
        return tuple(dims)

    # --- masks --------------------------------------------------------------------------
    def _call(self, op, *args, **kwargs):
        return self.graph.call_function(op, args, kwargs)

    def real(self, sym):
        if sym not in self.real_nodes:
            self.real_nodes[sym] = self._call(aten.select.int, self.lens, 0, self.symbols.index(sym))
        return self.real_nodes[sym]

    def dim_mask(self, dim, ndim, pos):
        key = (dim, ndim, pos)
        if key in self.dim_masks:
            return self.dim_masks[key]
        size = 1
        for f, _ in dim:
            size *= f
        idx = self._call(aten.arange.default, size, dtype=torch.int64, device=self.device)
        valid, inner = None, 1
        for k in range(len(dim) - 1, -1, -1):
            fsize, sym = dim[k]
            if sym:
                f = idx if inner == 1 else self._call(aten.div.Tensor_mode, idx, inner, rounding_mode="floor")
                if k > 0:
                    f = self._call(aten.remainder.Scalar, f, fsize)
                c = self._call(aten.lt.Tensor, f, self.real(sym))
                valid = c if valid is None else self._call(aten.logical_and.default, valid, c)
            inner *= fsize
        shape = [1] * ndim
        shape[pos] = size
        out = self._call(aten.view.default, valid, shape)
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
                m = d if m is None else self._call(aten.logical_and.default, m, d)
        self.masks[spec] = m
        return m

    def fill(self, x, spec, value, dtype):
        m = self.mask(spec)
        if m is None:
            return x
        v = self._call(aten.scalar_tensor.default, value, dtype=dtype, device=self.device)
        return self._call(aten.where.self, m, x, v)

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
            if n.op == "call_function":
                with self.graph.inserting_before(n.next):
                    self.visit(n)
        self.graph.lint()
        return torch.fx.GraphModule(self.gm, self.graph)

    def arg_spec(self, a):
        return self.spec.get(a) if isinstance(a, torch.fx.Node) else None

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

    def fill_before(self, n, x, spec, value, dtype):
        with self.graph.inserting_before(n):
            return self.fill(x, spec, value, dtype)

    def replace_arg(self, n, index, new):
        args = list(n.args)
        args[index] = new
        n.args = tuple(args)

    def visit(self, n):
        op = n.target
        v = _val(n)
        flat = [a for a in n.args if isinstance(a, torch.fx.Node)] + [
            x for a in n.args if isinstance(a, (list, tuple)) for x in a if isinstance(x, torch.fx.Node)]
        tensor_specs = [self.spec[a] for a in flat if a in self.spec]
        padded_in = any(_any_padded(s) for s in tensor_specs)

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
        if sym_args and op not in _SIZE_ARGS:
            self.size_as_value(n, op, name)
            op = n.target
        outs = v if isinstance(v, (list, tuple)) else [v]
        symbolic_out = any(isinstance(o, torch.Tensor) and any(_expr(s).free_symbols for s in o.shape) for o in outs)
        if not padded_in and not symbolic_out:
            specs = [_unpadded_spec(self.shape(o)) if isinstance(o, torch.Tensor) else None for o in outs]
            self.spec[n] = specs if isinstance(v, (list, tuple)) else specs[0]
            return
        if not isinstance(v, (list, tuple)) and not isinstance(v, torch.Tensor):
            raise NoBucket(f"{name} returns a non-tensor from a padded tensor")
        self.spec[n] = self.rule(n, op, name, v)

    def size_as_value(self, n, op, name):
        """x * s0, grad / s0 (mean's backward): the real size, as a tensor, not the bucket's."""
        packet = op.overloadpacket
        if packet not in (aten.add, aten.sub, aten.mul, aten.div, aten.true_divide, aten.rsub) or \
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
            return self._call(aten.scalar_tensor.default, int(expr), dtype=torch.int64, device=self.device)
        if expr.is_Symbol:
            return self.real(expr.name)
        if expr.is_Add or expr.is_Mul:
            op = aten.add.Tensor if expr.is_Add else aten.mul.Tensor
            terms = [self.sym_tensor(t) for t in expr.args]
            out = terms[0]
            for t in terms[1:]:
                out = self._call(op, out, t)
            return out
        raise NoBucket(f"a size expression {expr} used as a value")

    def rule(self, n, op, name, v):
        a = n.args
        s0 = self.arg_spec(a[0]) if a else None
        packet = op.overloadpacket

        if op in _VIEWS:
            return _regroup(s0, self.shape(v))
        if packet in (aten.permute,):
            return tuple(s0[d] for d in a[1])
        if packet in (aten.transpose,):
            d0, d1 = a[1] % len(s0), a[2] % len(s0)
            out = list(s0)
            out[d0], out[d1] = out[d1], out[d0]
            return tuple(out)
        if packet in (aten.t,):
            return tuple(reversed(s0))
        if packet in (aten.unsqueeze,):
            d = a[1] % (len(s0) + 1)
            return s0[:d] + (_plain(1),) + s0[d:]
        if packet in (aten.squeeze,):
            return _regroup(s0, self.shape(v))
        if op is aten.expand.default:
            out_shape = self.shape(v)
            k = len(out_shape) - len(s0)
            dims, out_specs = [], None
            for i, size in enumerate(out_shape):
                if i < k or (s0[i - k] == _plain(1) and size != 1):  # a new or broadcast dimension
                    out_specs = out_specs or self.spec_from_exprs(v)
                    dims.append(out_specs[i])
                else:
                    dims.append(s0[i - k])
            spec = tuple(dims)
            if any(_padded(d) and (i < k or s0[i - k] == _plain(1)) for i, d in enumerate(spec)):
                self.rezero(n, spec, v.dtype)  # copies of real data landed in the padding
            return spec
        if op in _SAME or packet in (aten.clone,):
            return s0
        if op in (aten.split_with_sizes.default, aten.split.Tensor, aten.unbind.int, aten.chunk.default):
            d = (a[2] if len(a) > 2 else n.kwargs.get("dim", 0)) % len(s0)
            if _padded(s0[d]):
                raise NoBucket(f"{name} splits a padded dimension")
            return [s0[:d] + (_plain(self.shape(o)[d]),) + s0[d + 1:] if op is not aten.unbind.int else s0[:d] + s0[d + 1:]
                    for o in v]
        if op is aten.slice.Tensor:
            d = (a[1] if len(a) > 1 else 0) % len(s0)
            out_shape = self.shape(v)
            in_shape = self.shape(_val(a[0]))
            if _padded(s0[d]):
                if out_shape[d] == in_shape[d]:
                    return s0
                raise NoBucket("a slice of a padded dimension")
            spec = self.spec_from_exprs(v)
            if _padded(spec[d]):
                sym = spec[d][0][1]
                self.limits.append((sym, in_shape[d]))
                spec = s0[:d] + (spec[d],) + s0[d + 1:]
                self.rezero(n, spec, v.dtype)
                return spec
            return s0[:d] + (_plain(out_shape[d]),) + s0[d + 1:]
        if op is aten.select.int:
            d = a[1] % len(s0)
            if _padded(s0[d]):
                raise NoBucket("a select on a padded dimension")
            return s0[:d] + s0[d + 1:]
        if op is aten.cat.default:
            specs = [self.spec[t] for t in a[0]]
            d = (a[1] if len(a) > 1 else 0) % len(specs[0])
            if any(_padded(s[d]) for s in specs):
                raise NoBucket("a cat along a padded dimension")
            out_shape = self.shape(v)
            rest = _broadcast([s[:d] + (_plain(1),) + s[d + 1:] for s in specs], out_shape[:d] + (1,) + out_shape[d + 1:])
            return rest[:d] + (_plain(out_shape[d]),) + rest[d + 1:]
        if op in _FACTORIES:
            spec = self.spec_from_exprs(v)
            self.rezero(n, spec, v.dtype)
            return spec
        if torch.Tag.pointwise in op.tags or op in _POSITIONAL:
            spec = _broadcast([self.arg_spec(x) for x in a], self.shape(v))
            self.rezero(n, spec, v.dtype)
            return spec
        if op in _SOFTMAX:
            d = a[1] % len(s0)
            if _padded(s0[d]):
                self.replace_arg(n, 0, self.fill_before(n, a[0], s0, float("-inf"), _val(a[0]).dtype))
            self.rezero(n, s0, v.dtype)
            return s0
        if op in _SOFTMAX_BACKWARD:
            self.rezero(n, s0, v.dtype)
            return s0
        if op in _REDUCE_FILL or op in (aten.mean.dim, aten.mean.default):
            return self.reduction(n, op, name, v, s0)
        if op in (aten.mm.default, aten.bmm.default):
            s1 = self.arg_spec(a[1])
            if op is aten.mm.default:
                return (s0[0], s1[1])
            return (_broadcast([s0[:1], s1[:1]], self.shape(v)[:1])[0], s0[1], s1[2])
        if op in (aten.addmm.default, aten.baddbmm.default):
            s1, s2 = self.arg_spec(a[1]), self.arg_spec(a[2])
            shape = self.shape(v)
            prod = (s1[0], s2[1]) if op is aten.addmm.default else (s1[0], s1[1], s2[2])
            spec = _broadcast([s0, prod], shape)
            self.rezero(n, spec, v.dtype)
            return spec
        if op is aten.native_layer_norm.default:
            k = len(a[1])
            if any(_padded(d) for d in s0[-k:]):
                raise NoBucket("a layer norm over a padded dimension")
            stat = s0[:-k] + (_plain(1),) * k
            self._rezero_outputs(n, [s0, stat, stat], v)
            return [s0, stat, stat]
        if op is aten.native_layer_norm_backward.default:
            specs = [self.arg_spec(a[1]), _unpadded_spec(self.shape(v[1])) if v[1] is not None else None,
                     _unpadded_spec(self.shape(v[2])) if v[2] is not None else None]
            self._rezero_outputs(n, specs, v)
            return specs
        if op is aten.embedding.default:
            if _any_padded(s0):
                raise NoBucket("an embedding table is padded")
            spec = self.arg_spec(a[1]) + (s0[-1],)
            self.rezero(n, spec, v.dtype)
            return spec
        if op is aten.embedding_dense_backward.default:
            if len(a) > 4 and a[4]:
                raise NoBucket("embedding with scale_grad_by_freq")
            return _unpadded_spec(self.shape(v))
        if op is aten.nll_loss_forward.default:
            target = self.arg_spec(a[1])
            if _padded(s0[-1] if len(s0) == 1 else s0[1]):
                raise NoBucket("nll_loss over padded classes")
            self.replace_arg(n, 1, self.fill_before(n, a[1], target, a[4], _val(a[1]).dtype))
            reduction = a[3]
            specs = [target if reduction == 0 else (), ()]
            return specs
        if op is aten.nll_loss_backward.default:
            target = self.arg_spec(a[2])
            self.replace_arg(n, 2, self.fill_before(n, a[2], target, a[5], _val(a[2]).dtype))
            spec = self.arg_spec(a[1])
            self.rezero(n, spec, v.dtype)
            return spec
        if op is aten.native_dropout.default:
            specs = [s0, s0]
            self._rezero_outputs(n, specs, v)
            return specs
        raise NoBucket(f"{name} on a padded tensor")

    def _rezero_outputs(self, n, specs, v):
        users = [u for u in n.users if u.target is operator.getitem]
        for u in users:
            i = u.args[1]
            if specs[i] is not None and isinstance(v[i], torch.Tensor):
                self.spec[u] = specs[i]
                self.rezero(u, specs[i], v[i].dtype)

    def reduction(self, n, op, name, v, s0):
        a = n.args
        ndim = len(s0)
        if op in (aten.sum.default, aten.mean.default, aten.any.default):
            dims, keep = list(range(ndim)), False
        else:
            dims = a[1] if len(a) > 1 else n.kwargs.get("dim")
            dims = list(range(ndim)) if dims is None else [dims] if isinstance(dims, int) else list(dims)
            keep = a[2] if len(a) > 2 else n.kwargs.get("keepdim", False)
        dims = [d % ndim for d in dims] if ndim else []
        over_padded = any(_padded(s0[d]) for d in dims)
        out_spec = tuple(_plain(1) if i in dims else d for i, d in enumerate(s0) if keep or i not in dims)
        outs = v if isinstance(v, (list, tuple)) else [v]
        if over_padded:
            if op in (aten.mean.dim, aten.mean.default):
                # mean = sum / real count
                x = a[0]
                dtype = n.kwargs.get("dtype") or v.dtype
                with self.graph.inserting_before(n):
                    total = self._call(aten.sum.dim_IntList, x, dims, keep, dtype=dtype)
                    ones = self._call(aten._to_copy.default, self.mask(s0), dtype=dtype)
                    ones = self._call(aten.expand.default, ones, list(self.shape(_val(x))))
                    count = self._call(aten.sum.dim_IntList, ones, dims, keep)
                    mean = self._call(aten.div.Tensor, total, count)
                mean.meta["val"] = v
                n.replace_all_uses_with(mean)
                self.graph.erase_node(n)
                self.spec[mean] = out_spec
                self.rezero(mean, out_spec, dtype)  # rows with no real element: 0/0
                return out_spec
            fill = _REDUCE_FILL[op]
            x = a[0]
            dtype = _val(x).dtype
            if dtype == torch.bool:
                fill = bool(fill)
            elif not dtype.is_floating_point and fill in (float("inf"), float("-inf")):
                info = torch.iinfo(dtype)
                fill = info.max if fill > 0 else info.min
            if fill != 0:
                self.replace_arg(n, 0, self.fill_before(n, x, s0, fill, dtype))
        if isinstance(v, (list, tuple)):
            specs = [out_spec for _ in outs]
            self._rezero_outputs(n, specs, v)
            return specs
        self.rezero(n, out_spec, v.dtype)
        return out_spec


def rewrite(gm, buckets: dict, symbols: list, known_specs: dict):
    """A copy of gm that runs at the bucket's sizes with masks; raises NoBucket."""
    import copy

    gm = copy.deepcopy(gm)
    r = _Rewriter(gm, buckets, symbols, known_specs)
    new = r.run()
    for sym, limit in r.limits:
        if buckets[sym] > limit:
            raise NoBucket(f"bucket {buckets[sym]} of {sym} exceeds a sliced size {limit}")
    outputs = next(n for n in new.graph.nodes if n.op == "output").args[0]
    out_specs = [r.spec.get(o) if isinstance(o, torch.fx.Node) else None for o in outputs]
    return new, r.placeholder_specs, out_specs


# ---------------------------------------------------------------------------------------
# Padding and slicing real tensors.


def _factor_sizes(spec, values):
    real, padded = [], []
    for dim in spec:
        for size, sym in dim:
            padded.append(size)
            real.append(values[sym] if sym else size)
    return real, padded


def pad(t: torch.Tensor, spec, reals: dict) -> torch.Tensor:
    """t (real sizes) zero-padded to the bucket sizes of `spec` (on the host: no compile)."""
    real, padded = _factor_sizes(spec, reals)
    bucket_shape = []
    for dim in spec:
        p = 1
        for size, _ in dim:
            p *= size
        bucket_shape.append(p)
    if real == padded or list(t.shape) == bucket_shape:  # nothing to pad, or already padded
        return t
    host = t.detach().to("cpu").reshape(real)
    out = torch.zeros(padded, dtype=host.dtype)
    out[tuple(slice(0, r) for r in real)] = host
    return out.reshape(bucket_shape).to(t.device)


def unpad(t: torch.Tensor, spec, reals: dict) -> torch.Tensor:
    """The real elements of a padded tensor (a view when only outer factors are padded)."""
    real, padded = _factor_sizes(spec, reals)
    if real == padded:
        return t
    real_shape = []
    for dim in spec:
        p = 1
        for size, sym in dim:
            p *= reals[sym] if sym else size
        real_shape.append(p)
    x = t.reshape(padded)[tuple(slice(0, r) for r in real)]
    return x.reshape(real_shape)
