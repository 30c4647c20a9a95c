// Shape lowerings: the *_copy view ops functionalization emits, concatenation.
#include <algorithm>
#include <string>

#include "lowering/common.h"

namespace torchtpu {
namespace {

// The parameters of this file's families: which view op a view_copy / view_scatter /
// view_backward rule is of, which split, and how a pad reads beyond the edge.
enum class ViewKind : uint8_t { AsStrided, Slice, Select, Diagonal, Unfold };
enum class Split : uint8_t { Split, Unbind, Narrow };
enum class Pad : uint8_t { Reflect, Replicate };

// view_copy / _unsafe_view / reshape-like ops: same elements, new shape (from PyTorch).
void lower_reshape(LoweringContext& ctx, const Node& node) {
  ctx.set_result(ctx.reshape(ctx.input(node, 0), ctx.out(node).shape));
}

// expand_copy(self, size): broadcast to the output shape.
void lower_expand(LoweringContext& ctx, const Node& node) {
  ctx.set_result(ctx.broadcast_to(ctx.input(node, 0), ctx.out(node).shape));
}

// permute_copy(self, dims)
void lower_permute(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  ctx.set_result(ctx.transpose(x, wrap_dims(node.args[1].ints, x.type.rank())));
}

// transpose_copy.int(self, dim0, dim1) and t_copy(self)
void lower_transpose(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  int64_t rank = x.type.rank();
  std::vector<int64_t> perm(rank);
  for (int64_t i = 0; i < rank; ++i) perm[i] = i;
  if (rank >= 2) {
    int64_t a = node.args.size() > 1 ? wrap_dim(node.args[1].i, rank) : 0;
    int64_t b = node.args.size() > 2 ? wrap_dim(node.args[2].i, rank) : 1;
    std::swap(perm[a], perm[b]);
  }
  ctx.set_result(ctx.transpose(x, perm));
}

// slice_copy.Tensor(self, dim, start, end, step)
void lower_slice(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  int64_t rank = x.type.rank();
  int64_t dim = wrap_dim(node.args[1].i, rank);
  int64_t size = x.type.shape[dim];
  int64_t step = node.args[4].is_none() ? 1 : node.args[4].i;
  int64_t start = node.args[2].is_none() ? 0 : node.args[2].i;
  int64_t end = node.args[3].is_none() ? size : node.args[3].i;
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::min(std::max<int64_t>(start, 0), size);
  end = std::min(std::max<int64_t>(end, start), size);
  std::vector<int64_t> starts(rank, 0), limits = x.type.shape, strides(rank, 1);
  starts[dim] = start;
  limits[dim] = end;
  strides[dim] = step;
  ctx.set_result(ctx.slice(x, starts, limits, strides));
}

// select_copy.int(self, dim, index)
void lower_select(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  int64_t rank = x.type.rank();
  int64_t dim = wrap_dim(node.args[1].i, rank);
  int64_t index = node.args[2].i;
  if (index < 0) index += x.type.shape[dim];
  std::vector<int64_t> starts(rank, 0), limits = x.type.shape, strides(rank, 1);
  starts[dim] = index;
  limits[dim] = index + 1;
  ctx.set_result(ctx.reshape(ctx.slice(x, starts, limits, strides), ctx.out(node).shape));
}

// cat(tensors, dim): zero-size 1-d inputs are skipped as PyTorch does.
void lower_cat(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  std::vector<V> parts;
  int64_t dim = wrap_dim(node.args[1].i, out.rank());
  for (const V& v : ctx.inputs(node, 0)) {
    if (v.type.rank() == 1 && v.type.shape[0] == 0 && out.rank() != 1) continue;
    if (v.type.numel() == 0 && v.type.rank() == out.rank() && v.type.shape[dim] == 0) continue;
    parts.push_back(ctx.convert(v, out.dtype));
  }
  if (parts.empty()) {
    ctx.set_result(ctx.constant(0, out.dtype, out.shape));
    return;
  }
  ctx.set_result(ctx.concatenate(parts, dim));
}

// ---------------------------------------------------------------------------------------
// Views as affine maps over the row-major positions of their (contiguous) base:
// element (i_0, ..., i_k) of the view is base[offset + sum_d i_d * coefs[d]].
struct Geometry {
  std::vector<int64_t> shape, coefs;
  int64_t offset = 0;
};

Geometry slice_geometry(const std::vector<int64_t>& base, int64_t dim, const Arg& start_arg, const Arg& end_arg,
                        int64_t step) {
  std::vector<int64_t> strides = contiguous_strides(base);
  dim = wrap_dim(dim, static_cast<int64_t>(base.size()));
  int64_t size = base[dim];
  int64_t start = start_arg.is_none() ? 0 : start_arg.i;
  int64_t end = end_arg.is_none() ? size : end_arg.i;
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::min(std::max<int64_t>(start, 0), size);
  end = std::min(std::max<int64_t>(end, start), size);
  Geometry g{base, strides, start * strides[dim]};
  g.shape[dim] = (end - start + step - 1) / step;
  g.coefs[dim] = strides[dim] * step;
  return g;
}

Geometry select_geometry(const std::vector<int64_t>& base, int64_t dim, int64_t index) {
  std::vector<int64_t> strides = contiguous_strides(base);
  dim = wrap_dim(dim, static_cast<int64_t>(base.size()));
  if (index < 0) index += base[dim];
  Geometry g{base, strides, index * strides[dim]};
  g.shape.erase(g.shape.begin() + dim);
  g.coefs.erase(g.coefs.begin() + dim);
  return g;
}

Geometry diagonal_geometry(const std::vector<int64_t>& base, int64_t offset, int64_t dim1, int64_t dim2) {
  std::vector<int64_t> strides = contiguous_strides(base);
  int64_t rank = static_cast<int64_t>(base.size());
  dim1 = wrap_dim(dim1, rank);
  dim2 = wrap_dim(dim2, rank);
  Geometry g;
  for (int64_t d = 0; d < rank; ++d) {
    if (d == dim1 || d == dim2) continue;
    g.shape.push_back(base[d]);
    g.coefs.push_back(strides[d]);
  }
  int64_t length = std::max<int64_t>(
      0, std::min(base[dim1] - std::max<int64_t>(0, -offset), base[dim2] - std::max<int64_t>(0, offset)));
  g.shape.push_back(length);
  g.coefs.push_back(strides[dim1] + strides[dim2]);
  if (length > 0) g.offset = offset >= 0 ? offset * strides[dim2] : -offset * strides[dim1];
  return g;
}

Geometry unfold_geometry(const std::vector<int64_t>& base, int64_t dim, int64_t size, int64_t step) {
  std::vector<int64_t> strides = contiguous_strides(base);
  if (base.empty()) return Geometry{{size}, {0}, 0};  // 0-d: unfold gives a 1-element vector
  dim = wrap_dim(dim, static_cast<int64_t>(base.size()));
  Geometry g{base, strides, 0};
  g.shape[dim] = (base[dim] - size) / step + 1;
  g.coefs[dim] = strides[dim] * step;
  g.shape.push_back(size);
  g.coefs.push_back(strides[dim]);
  return g;
}

Geometry as_strided_geometry(const Node& node, int size_arg) {
  const Arg& off = node.args[size_arg + 2];
  return Geometry{node.args[size_arg].ints, node.args[size_arg + 1].ints, off.is_none() ? 0 : off.i};
}

// The geometry of a view op's node, given the shape of its base; `first` is the index of the
// first argument after the tensor(s).
Geometry view_geometry(const Node& node, const std::vector<int64_t>& base, int first) {
  ViewKind kind = rule_param<ViewKind>(node);
  const auto& a = node.args;
  if (kind == ViewKind::Slice)
    return slice_geometry(base, a[first].i, a[first + 1], a[first + 2], a[first + 3].is_none() ? 1 : a[first + 3].i);
  if (kind == ViewKind::Select) return select_geometry(base, a[first].i, a[first + 1].i);
  if (kind == ViewKind::Diagonal) return diagonal_geometry(base, a[first].i, a[first + 1].i, a[first + 2].i);
  if (kind == ViewKind::Unfold) return unfold_geometry(base, a[first].i, a[first + 1].i, a[first + 2].i);
  return as_strided_geometry(node, first);
}

V view_index(LoweringContext& ctx, const Geometry& g, int64_t base_numel) {
  return affine_index(ctx, g.shape, g.coefs, g.offset, index_dtype(base_numel));
}

// diagonal_copy / unfold_copy / as_strided_copy(self, ...): gather the view's elements.
void lower_view_copy(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  Geometry g = view_geometry(node, x.type.shape, 1);
  ctx.set_result(ctx.reshape(gather_linear(ctx, x, view_index(ctx, g, x.type.numel())), ctx.out(node).shape));
}

// slice_scatter / select_scatter / diagonal_scatter / as_strided_scatter(self, src, ...):
// self with the view's elements replaced by src.
void lower_view_scatter(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  V src = ctx.input(node, 1);
  Geometry g = view_geometry(node, x.type.shape, 2);
  V idx = view_index(ctx, g, x.type.numel());
  ctx.set_result(scatter_linear(ctx, x, idx, ctx.reshape(src, g.shape), std::nullopt));
}

// select_backward / slice_backward / diagonal_backward / unfold_backward(grad, input_sizes, ...):
// zeros of input_sizes with grad added at the view's positions (windows of unfold overlap).
void lower_view_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V grad = ctx.input(node, 0);
  Geometry g = view_geometry(node, out.shape, 2);
  V idx = view_index(ctx, g, out.numel());
  V zeros = ctx.constant(0, out.dtype, out.shape);
  ctx.set_result(scatter_linear(ctx, zeros, idx, ctx.reshape(grad, g.shape), Hlo::Add));
}

// split_copy.Tensor / split_with_sizes_copy / unbind_copy.int / narrow_copy: consecutive
// slices along dim with the output sizes PyTorch computed.
void lower_split(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  int64_t rank = x.type.rank();
  Split kind = rule_param<Split>(node);
  int dim_arg = kind == Split::Unbind || kind == Split::Narrow ? 1 : 2;
  int64_t dim = wrap_dim(node.args[dim_arg].i, rank);
  int64_t start = 0;
  if (kind == Split::Narrow) {
    start = node.args[2].i;
    if (start < 0) start += x.type.shape[dim];
  }
  std::vector<V> results;
  for (const TensorType& out : node.outputs) {
    int64_t length = kind == Split::Unbind ? 1 : out.shape[dim];
    std::vector<int64_t> starts(rank, 0), limits = x.type.shape, strides(rank, 1);
    starts[dim] = start;
    limits[dim] = start + length;
    results.push_back(ctx.reshape(ctx.slice(x, starts, limits, strides), out.shape));
    start += length;
  }
  ctx.set_results(results);
}

// stack(tensors, dim)
void lower_stack(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  int64_t dim = wrap_dim(node.args[1].i, out.rank());
  std::vector<V> parts;
  for (const V& v : ctx.inputs(node, 0)) {
    std::vector<int64_t> shape = v.type.shape;
    shape.insert(shape.begin() + dim, 1);
    parts.push_back(ctx.reshape(ctx.convert(v, out.dtype), shape));
  }
  ctx.set_result(ctx.concatenate(parts, dim));
}

// flip(self, dims)
void lower_flip(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  std::vector<int64_t> dims = wrap_dims(node.args[1].ints, x.type.rank());
  if (dims.empty() || x.type.rank() == 0) {
    ctx.set_result(x);
    return;
  }
  ctx.set_result(ctx.emit(Hlo::Reverse, {x}, x.type, "dimensions = " + format_dims(dims)));
}

V roll_dim(LoweringContext& ctx, const V& x, int64_t dim, int64_t shift) {
  int64_t size = x.type.shape[dim];
  if (size == 0) return x;
  shift = ((shift % size) + size) % size;
  if (shift == 0) return x;
  int64_t rank = x.type.rank();
  std::vector<int64_t> s1(rank, 0), l1 = x.type.shape, s2(rank, 0), l2 = x.type.shape, one(rank, 1);
  s1[dim] = size - shift;  // the last `shift` elements move to the front
  l2[dim] = size - shift;
  return ctx.concatenate({ctx.slice(x, s1, l1, one), ctx.slice(x, s2, l2, one)}, dim);
}

// roll(self, shifts, dims): no dims rolls the flattened tensor.
void lower_roll(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  const auto& shifts = node.args[1].ints;
  const auto& dims = node.args[2].ints;
  if (dims.empty()) {
    V flat = ctx.reshape(x, {x.type.numel()});
    ctx.set_result(ctx.reshape(roll_dim(ctx, flat, 0, shifts.at(0)), x.type.shape));
    return;
  }
  for (size_t i = 0; i < dims.size(); ++i) x = roll_dim(ctx, x, wrap_dim(dims[i], x.type.rank()), shifts.at(i));
  ctx.set_result(x);
}

// repeat(self, repeats): broadcast into [r0, s0, r1, s1, ...] and merge pairs.
void lower_repeat(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  const auto& reps = node.args[1].ints;
  std::vector<int64_t> shape(reps.size() - x.type.rank(), 1);
  shape.insert(shape.end(), x.type.shape.begin(), x.type.shape.end());
  x = ctx.reshape(x, shape);
  std::vector<int64_t> wide, dims;
  for (size_t i = 0; i < reps.size(); ++i) {
    wide.push_back(reps[i]);
    wide.push_back(shape[i]);
    dims.push_back(static_cast<int64_t>(2 * i + 1));
  }
  if (out.numel() == 0) {
    ctx.set_result(ctx.constant(0, out.dtype, out.shape));
    return;
  }
  ctx.set_result(ctx.reshape(ctx.broadcast_in_dim(x, wide, dims), out.shape));
}

// tril / triu(self, diagonal): keep col - row <= k (tril) or >= k (triu) on the last two dims.
void lower_tri(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  const auto& shape = x.type.shape;
  int64_t rank = x.type.rank();
  int64_t k = node.args.size() > 1 ? node.args[1].i : 0;
  TensorType it{shape, DType::Int64};
  V diff = ctx.binary(Hlo::Subtract, ctx.iota(it, rank - 1), ctx.iota(it, rank - 2));
  V keep = ctx.compare(rule_param<Cmp>(node), diff, ctx.constant_int(k, DType::Int64, shape));
  ctx.set_result(ctx.select(keep, x, ctx.constant(0, x.type.dtype, shape)));
}

// constant_pad_nd(self, pad, value): pairs from the last dim; negative pads crop.
void lower_constant_pad(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  int64_t rank = x.type.rank();
  const auto& pad = node.args[1].ints;
  std::vector<int64_t> low(rank, 0), high(rank, 0), interior(rank, 0);
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    low[rank - 1 - i] = pad[2 * i];
    high[rank - 1 - i] = pad[2 * i + 1];
  }
  V value = node.args.size() > 2 && !node.args[2].is_none() ? ctx.scalar(node, 2, out.dtype)
                                                              : ctx.constant(0, out.dtype);
  if (x.type.numel() == 0 || out.numel() == 0) {
    ctx.set_result(ctx.broadcast_to(value, out.shape));
    return;
  }
  ctx.set_result(ctx.emit(Hlo::Pad, {x, value}, out,
                          "edge_padding_high = " + format_dims(high) + ", edge_padding_low = " + format_dims(low) +
                              ", interior_padding = " + format_dims(interior)));
}

// reflection_pad / replication_pad: each output element reads one input element; the
// positions come from a per-dimension table.
V pad_index(LoweringContext& ctx, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& pad,
            bool reflect, std::vector<int64_t>* out_shape) {
  int64_t rank = static_cast<int64_t>(in_shape.size());
  std::vector<int64_t> strides = contiguous_strides(in_shape);
  *out_shape = in_shape;
  size_t padded = pad.size() / 2;
  for (size_t i = 0; i < padded; ++i) (*out_shape)[rank - 1 - i] += pad[2 * i] + pad[2 * i + 1];
  DType it = index_dtype(TensorType{in_shape, DType::Float32}.numel());
  std::vector<int64_t> affine_coefs(rank, 0);
  for (int64_t d = 0; d < rank - static_cast<int64_t>(padded); ++d) affine_coefs[d] = strides[d];
  V total = affine_index(ctx, *out_shape, affine_coefs, 0, it);
  for (size_t i = 0; i < padded; ++i) {
    int64_t d = rank - 1 - static_cast<int64_t>(i);
    int64_t n = in_shape[d], left = pad[2 * i], len = (*out_shape)[d];
    std::string table;
    for (int64_t j = 0; j < len; ++j) {
      int64_t s = j - left;
      if (reflect) {
        if (n == 1) s = 0;
        else {
          int64_t period = 2 * (n - 1);
          s = ((s % period) + period) % period;
          if (s >= n) s = period - s;
        }
      } else {
        s = std::min(std::max<int64_t>(s, 0), n - 1);
      }
      table += (j ? ", " : "") + std::to_string(s * strides[d]);
    }
    TensorType tt{{len}, it};
    V t = ctx.emit(Hlo::Constant, {}, tt, "value = dense<[" + table + "]> : " + tt.mlir());
    total = ctx.binary(Hlo::Add, total, ctx.broadcast_in_dim(t, *out_shape, {d}));
  }
  return total;
}

// reflection_pad{1,2,3}d / replication_pad{1,2,3}d(self, padding)
void lower_index_pad(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  std::vector<int64_t> shape;
  V idx = pad_index(ctx, x.type.shape, node.args[1].ints, rule_param<Pad>(node) == Pad::Reflect, &shape);
  ctx.set_result(gather_linear(ctx, x, idx));
}

// *_pad{1,2,3}d_backward(grad_output, self, padding): grads added back to their sources.
void lower_index_pad_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V grad = ctx.input(node, 0);
  std::vector<int64_t> shape;
  V idx = pad_index(ctx, out.shape, node.args[2].ints, rule_param<Pad>(node) == Pad::Reflect, &shape);
  ctx.set_result(scatter_linear(ctx, ctx.constant(0, out.dtype, out.shape), idx, grad, Hlo::Add));
}

// channel_shuffle / native_channel_shuffle(self, groups): channels [g, C/g] -> [C/g, g].
void lower_channel_shuffle(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  int64_t groups = node.args[1].i, channels = x.type.shape[1];
  std::vector<int64_t> split{x.type.shape[0], groups, channels / groups};
  for (int64_t d = 2; d < x.type.rank(); ++d) split.push_back(x.type.shape[d]);
  std::vector<int64_t> perm{0, 2, 1};
  for (int64_t d = 3; d < static_cast<int64_t>(split.size()); ++d) perm.push_back(d);
  ctx.set_result(ctx.reshape(ctx.transpose(ctx.reshape(x, split), perm), out.shape));
}

LOWERING("aten::view_copy", lower_reshape, nullptr, kTakesComplex);
LOWERING("aten::channel_shuffle", lower_channel_shuffle);
LOWERING("aten::native_channel_shuffle", lower_channel_shuffle);
LOWERING("aten::_unsafe_view", lower_reshape, nullptr, kTakesComplex);
LOWERING("aten::_reshape_alias_copy", lower_reshape, nullptr, kTakesComplex);
LOWERING("aten::unsqueeze_copy", lower_reshape, nullptr, kTakesComplex);
LOWERING("aten::squeeze_copy", lower_reshape, nullptr, kTakesComplex);
LOWERING("aten::squeeze_copy.dim", lower_reshape, nullptr, kTakesComplex);
LOWERING("aten::squeeze_copy.dims", lower_reshape, nullptr, kTakesComplex);
LOWERING("aten::expand_copy", lower_expand, nullptr, kTakesComplex);
LOWERING("aten::permute_copy", lower_permute, nullptr, kTakesComplex);
LOWERING("aten::transpose_copy.int", lower_transpose, nullptr, kTakesComplex);
LOWERING("aten::t_copy", lower_transpose, nullptr, kTakesComplex);
LOWERING("aten::slice_copy.Tensor", lower_slice, nullptr, kTakesComplex);
LOWERING("aten::select_copy.int", lower_select, nullptr, kTakesComplex);
LOWERING("aten::cat", lower_cat, nullptr, kTakesComplex);
LOWERING("aten::stack", lower_stack, nullptr, kTakesComplex);
LOWERING("aten::as_strided_copy", lower_view_copy, ViewKind::AsStrided, kTakesComplex);
LOWERING("aten::diagonal_copy", lower_view_copy, ViewKind::Diagonal, kTakesComplex);
LOWERING("aten::unfold_copy", lower_view_copy, ViewKind::Unfold, kTakesComplex);
LOWERING("aten::slice_scatter", lower_view_scatter, ViewKind::Slice, kTakesComplex);
LOWERING("aten::select_scatter", lower_view_scatter, ViewKind::Select, kTakesComplex);
LOWERING("aten::diagonal_scatter", lower_view_scatter, ViewKind::Diagonal, kTakesComplex);
LOWERING("aten::as_strided_scatter", lower_view_scatter, ViewKind::AsStrided, kTakesComplex);
LOWERING("aten::slice_backward", lower_view_backward, ViewKind::Slice, kTakesComplex);
LOWERING("aten::select_backward", lower_view_backward, ViewKind::Select, kTakesComplex);
LOWERING("aten::diagonal_backward", lower_view_backward, ViewKind::Diagonal, kTakesComplex);
LOWERING("aten::unfold_backward", lower_view_backward, ViewKind::Unfold, kTakesComplex);
LOWERING("aten::split_copy.Tensor", lower_split, Split::Split, kTakesComplex);
LOWERING("aten::split_with_sizes_copy", lower_split, Split::Split, kTakesComplex);
LOWERING("aten::unbind_copy.int", lower_split, Split::Unbind, kTakesComplex);
LOWERING("aten::narrow_copy", lower_split, Split::Narrow, kTakesComplex);
LOWERING("aten::flip", lower_flip, nullptr, kTakesComplex);
LOWERING("aten::roll", lower_roll, nullptr, kTakesComplex);
LOWERING("aten::repeat", lower_repeat, nullptr, kTakesComplex);
LOWERING("aten::tril", lower_tri, Cmp::LE, kTakesComplex);
LOWERING("aten::triu", lower_tri, Cmp::GE, kTakesComplex);
LOWERING("aten::constant_pad_nd", lower_constant_pad, nullptr, kTakesComplex);
LOWERING("aten::reflection_pad1d", lower_index_pad, Pad::Reflect, kComplexNoBool);
LOWERING("aten::reflection_pad2d", lower_index_pad, Pad::Reflect, kComplexNoBool);
LOWERING("aten::replication_pad1d", lower_index_pad, Pad::Replicate, kTakesComplex);
LOWERING("aten::replication_pad2d", lower_index_pad, Pad::Replicate, kTakesComplex);
LOWERING("aten::reflection_pad3d", lower_index_pad, Pad::Reflect, kComplexNoBool);
LOWERING("aten::replication_pad3d", lower_index_pad, Pad::Replicate, kTakesComplex);
LOWERING("aten::reflection_pad1d_backward", lower_index_pad_backward, Pad::Reflect, kTakesComplex);
LOWERING("aten::reflection_pad2d_backward", lower_index_pad_backward, Pad::Reflect, kTakesComplex);
LOWERING("aten::replication_pad1d_backward", lower_index_pad_backward, Pad::Replicate, kTakesComplex);
LOWERING("aten::replication_pad2d_backward", lower_index_pad_backward, Pad::Replicate, kTakesComplex);
LOWERING("aten::reflection_pad3d_backward", lower_index_pad_backward, Pad::Reflect, kTakesComplex);
LOWERING("aten::replication_pad3d_backward", lower_index_pad_backward, Pad::Replicate, kTakesComplex);

}  // namespace
}  // namespace torchtpu
