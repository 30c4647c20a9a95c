// Ops whose result size depends on the data (nonzero, masked_select, x[mask], unique), in
// two stages the device layer (device/data_dependent.cpp) records one after the other: a
// count (a 0-d int64 it reads back), then the result at that size. Both stages run on the
// device; the second is an ordinary node of the pending graph. Also count_nonzero and
// nonzero_static, which have static shapes.
#include <string>

#include "lowering/common.h"

namespace torchtpu {
namespace {

std::vector<int64_t> all_dims(int64_t rank) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
  return dims;
}

// Number of true elements of a boolean tensor, as a 0-d int64.
V count_true(LoweringContext& ctx, const V& keep) {
  return sum_dims(ctx, ctx.convert(keep, DType::Int64), all_dims(keep.type.rank()));
}

// Where each element of the flat boolean `keep` lands when the kept elements are packed to
// the front of a vector of `size`: its rank among the kept ones, or `size` (out of range,
// which scatter drops) when it is not kept or does not fit.
V packed_positions(LoweringContext& ctx, const V& keep, int64_t size) {
  int64_t n = keep.type.numel();
  V rank = ctx.binary(Hlo::Subtract, cumsum_along(ctx, ctx.convert(keep, DType::Int64), 0),
                      ctx.constant_int(1, DType::Int64, {n}));
  return ctx.select(keep, rank, ctx.constant_int(size, DType::Int64, {n}));
}

// Linear (row-major) positions of the first `size` true elements of `keep` (any shape),
// -1 where there are fewer.
V true_positions(LoweringContext& ctx, const V& keep, int64_t size) {
  int64_t n = keep.type.numel();
  V flat = ctx.reshape(keep, {n});
  V unfilled = ctx.constant_int(-1, DType::Int64, {size});
  if (n == 0 || size == 0) return unfilled;
  return scatter_linear(ctx, unfilled, packed_positions(ctx, flat, size), ctx.iota(TensorType{{n}, DType::Int64}, 0),
                        std::nullopt);
}

// The coordinate along `dim` of each linear position into `shape` (-1 stays -1).
V coordinate(LoweringContext& ctx, const V& linear, const std::vector<int64_t>& shape, int64_t dim) {
  const auto& n = linear.type.shape;
  int64_t stride = contiguous_strides(shape)[dim];
  V c = ctx.binary(Hlo::Remainder, ctx.binary(Hlo::Divide, linear, ctx.constant_int(stride, DType::Int64, n)),
                   ctx.constant_int(shape[dim], DType::Int64, n));
  V missing = ctx.compare(Cmp::LT, linear, ctx.constant_int(0, DType::Int64, n));
  return ctx.select(missing, ctx.constant_int(-1, DType::Int64, n), c);
}

V nonzero_mask(LoweringContext& ctx, const V& x) { return ctx.convert(x, DType::Bool); }

// count_nonzero(self, dim?) / count_nonzero.dim_IntList(self, dim)
void lower_count_nonzero(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  std::vector<int64_t> dims;
  const Arg& dim = node.args[1];
  if (dim.kind == Arg::Kind::Int) dims = {wrap_dim(dim.i, x.type.rank())};
  else if (dim.kind == Arg::Kind::IntList && !dim.ints.empty()) dims = wrap_dims(dim.ints, x.type.rank());
  else dims = all_dims(x.type.rank());
  if (x.type.rank() == 0) dims = {};  // dim 0 of a 0-d tensor is the tensor itself
  V ones = ctx.convert(nonzero_mask(ctx, x), DType::Int64);
  ctx.set_result(ctx.reshape(sum_dims(ctx, ones, dims), out.shape));
}

// nonzero_static(self, size, fill_value): coordinates of the first `size` nonzero elements,
// rows past the count filled with fill_value.
void lower_nonzero_static(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  int64_t size = out.shape[0], rank = x.type.rank();
  if (out.numel() == 0) {
    ctx.set_result(ctx.constant_int(0, DType::Int64, out.shape));
    return;
  }
  V linear = true_positions(ctx, nonzero_mask(ctx, x), size);
  std::vector<V> columns;
  for (int64_t d = 0; d < rank; ++d) columns.push_back(ctx.reshape(coordinate(ctx, linear, x.type.shape, d), {size, 1}));
  V coords = ctx.concatenate(columns, 1);
  V missing = ctx.broadcast_in_dim(ctx.compare(Cmp::LT, linear, ctx.constant_int(0, DType::Int64, {size})), out.shape, {0});
  V fill = ctx.broadcast_to(ctx.scalar(node, 2, DType::Int64), out.shape);
  ctx.set_result(ctx.select(missing, fill, coords));
}

// torchtpu::mask_indices(mask, size): the coordinates of mask's true elements, one int64
// vector of `size` per mask dimension (what a boolean index means in x[mask]).
void lower_mask_indices(LoweringContext& ctx, const Node& node) {
  V mask = ctx.input(node, 0);
  int64_t size = node.args[1].i;
  V linear = true_positions(ctx, mask, size);
  std::vector<V> columns;
  for (int64_t d = 0; d < mask.type.rank(); ++d) columns.push_back(coordinate(ctx, linear, mask.type.shape, d));
  ctx.set_results(columns);
}

// torchtpu::masked_select(self, mask, size): the elements of self (broadcast with mask)
// where mask is true, in row-major order.
void lower_masked_select(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0), mask = ctx.input(node, 1);
  std::vector<int64_t> shape = node.args[3].ints;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (out.numel() == 0 || n == 0) {
    ctx.set_result(ctx.constant(0, out.dtype, out.shape));
    return;
  }
  V flat_x = ctx.reshape(ctx.broadcast_to(x, shape), {n});
  V flat_mask = ctx.reshape(ctx.broadcast_to(mask, shape), {n});
  V packed = ctx.constant(0, out.dtype, out.shape);
  ctx.set_result(scatter_linear(ctx, packed, packed_positions(ctx, flat_mask, out.shape[0]), flat_x, std::nullopt));
}

// torchtpu::masked_count(mask, shape): how many elements masked_select keeps.
void lower_masked_count(LoweringContext& ctx, const Node& node) {
  V mask = ctx.broadcast_to(ctx.input(node, 0), node.args[1].ints);
  ctx.set_result(count_true(ctx, mask));
}

// ---------------------------------------------------------------------------------------
// unique: the input's elements (or its slices along `dim`) as rows, sorted unless only
// consecutive duplicates are merged; a row starts a group when it differs from the one
// before it (NaN differs from everything, as on CPU).

struct Groups {
  V rows;       // [R, M]: the rows in their (sorted) order
  V order;      // [R]: original row of each
  V is_first;   // [R]: starts a group
  V group;      // [R]: group number
};

// The input as rows [R, M]: the flattened elements (one column) or the slices along dim.
V as_rows(LoweringContext& ctx, const V& x, const Arg& dim) {
  if (dim.kind != Arg::Kind::Int) return ctx.reshape(x, {x.type.numel(), 1});
  int64_t d = wrap_dim(dim.i, x.type.rank());
  std::vector<int64_t> perm{d};
  for (int64_t i = 0; i < x.type.rank(); ++i)
    if (i != d) perm.push_back(i);
  V moved = ctx.transpose(x, perm);
  int64_t rows = x.type.shape[d];
  return ctx.reshape(moved, {rows, rows ? x.type.numel() / rows : 0});
}

Groups group_rows(LoweringContext& ctx, const V& x, const Arg& dim, bool consecutive) {
  Groups g;
  V rows = as_rows(ctx, x, dim);
  int64_t R = rows.type.shape[0], M = rows.type.shape[1];
  V order = ctx.iota(TensorType{{R}, DType::Int64}, 0);
  if (!consecutive && R > 1) {
    std::vector<V> columns;
    for (int64_t j = 0; j < M; ++j) columns.push_back(ctx.reshape(ctx.slice(rows, {0, j}, {R, j + 1}, {1, 1}), {R}));
    std::vector<V> sorted = sort_stable(ctx, columns, {order}, 0);
    order = sorted.back();
    if (M == 1) {
      rows = ctx.reshape(sorted[0], {R, 1});
    } else {
      std::vector<V> cols;
      for (int64_t j = 0; j < M; ++j) cols.push_back(ctx.reshape(sorted[j], {R, 1}));
      rows = ctx.concatenate(cols, 1);
    }
  }
  V differs = ctx.compare(Cmp::NE, ctx.slice(rows, {1, 0}, {R, M}, {1, 1}), ctx.slice(rows, {0, 0}, {R - 1, M}, {1, 1}));
  V starts = ctx.reduce(differs, {1}, ctx.constant_int(0, DType::Bool), Hlo::Or);
  g.is_first = ctx.concatenate({ctx.constant_int(1, DType::Bool, {1}), starts}, 0);
  g.group = ctx.binary(Hlo::Subtract, cumsum_along(ctx, ctx.convert(g.is_first, DType::Int64), 0),
                       ctx.constant_int(1, DType::Int64, {R}));
  g.rows = rows;
  g.order = order;
  return g;
}

// torchtpu::unique_count(self, consecutive, dim?): the number of groups.
void lower_unique_count(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  const Arg& dim = node.args[2];
  int64_t rows = dim.kind == Arg::Kind::Int ? x.type.shape[wrap_dim(dim.i, x.type.rank())] : x.type.numel();
  if (rows == 0) {
    ctx.set_result(ctx.constant_int(0, DType::Int64));
    return;
  }
  Groups g = group_rows(ctx, x, dim, node.args[1].as_bool());
  ctx.set_result(count_true(ctx, g.is_first));
}

// torchtpu::unique(self, size, consecutive, dim?) -> (values, inverse, counts): `size`
// groups; values has the input's layout with `size` rows along dim (or `size` elements).
void lower_unique(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  int64_t size = node.args[1].i;
  const Arg& dim = node.args[3];
  const TensorType &values_type = ctx.out(node, 0), &inverse_type = ctx.out(node, 1), &counts_type = ctx.out(node, 2);
  if (size == 0) {
    ctx.set_results({ctx.constant(0, values_type.dtype, values_type.shape),
                     ctx.constant_int(0, DType::Int64, inverse_type.shape),
                     ctx.constant_int(0, DType::Int64, counts_type.shape)});
    return;
  }
  Groups g = group_rows(ctx, x, dim, node.args[2].as_bool());
  int64_t R = g.rows.type.shape[0], M = g.rows.type.shape[1];
  V first_slot = ctx.select(g.is_first, g.group, ctx.constant_int(size, DType::Int64, {R}));
  // The original row that represents each group (its first in sorted order).
  V representative = scatter_linear(ctx, ctx.constant_int(0, DType::Int64, {size}), first_slot, g.order, std::nullopt);
  V rows = as_rows(ctx, x, dim);
  V positions = ctx.binary(Hlo::Add,
                           ctx.binary(Hlo::Multiply, ctx.broadcast_in_dim(representative, {size, M}, {0}),
                                      ctx.constant_int(M, DType::Int64, {size, M})),
                           ctx.iota(TensorType{{size, M}, DType::Int64}, 1));
  V picked = gather_linear(ctx, rows, positions);
  V values;
  if (dim.kind == Arg::Kind::Int) {
    int64_t d = wrap_dim(dim.i, x.type.rank());
    std::vector<int64_t> moved_shape{size};
    std::vector<int64_t> inverse_perm(x.type.rank());
    for (int64_t i = 0; i < x.type.rank(); ++i)
      if (i != d) moved_shape.push_back(x.type.shape[i]);
    // moved dims are (d, others in order): put d back in place.
    for (int64_t i = 0, k = 1; i < x.type.rank(); ++i) inverse_perm[i] = i == d ? 0 : k++;
    values = ctx.transpose(ctx.reshape(picked, moved_shape), inverse_perm);
  } else {
    values = ctx.reshape(picked, values_type.shape);
  }
  V inverse = scatter_linear(ctx, ctx.constant_int(0, DType::Int64, {R}), g.order, g.group, std::nullopt);
  V counts = scatter_linear(ctx, ctx.constant_int(0, DType::Int64, {size}), g.group,
                            ctx.constant_int(1, DType::Int64, {R}), Hlo::Add);
  ctx.set_results({values, inverse_type.numel() ? ctx.reshape(inverse, inverse_type.shape)
                                                 : ctx.constant_int(0, DType::Int64, inverse_type.shape),
                   counts_type.numel() ? counts : ctx.constant_int(0, DType::Int64, counts_type.shape)});
}

LOWERING("aten::count_nonzero", lower_count_nonzero);
LOWERING("aten::count_nonzero.dim_IntList", lower_count_nonzero);
LOWERING("aten::nonzero_static", lower_nonzero_static);
LOWERING("torchtpu::mask_indices", lower_mask_indices);
LOWERING("torchtpu::masked_count", lower_masked_count);
LOWERING("torchtpu::masked_select", lower_masked_select);
LOWERING("torchtpu::unique_count", lower_unique_count);
LOWERING("torchtpu::unique", lower_unique);

}  // namespace
}  // namespace torchtpu
