// Index-driven updates and reads beyond indexing.cpp's: take and put (flat positions),
// index_fill, index_copy and index_reduce (slices along a dim). Every index goes through
// `checked_index` (lowering/common.h) with the op's CPU error for an index out of range: scatter
// would drop it and gather clamp it, a silent wrong answer.
#include <string>

#include "lowering/common.h"

namespace torchtpu {
namespace {

// take and put: "out of range: tried to access index 10 on a tensor of 5 elements."
IndexCheck flat_check(int64_t numel) {
  return IndexCheck{RuntimeCheck::Error::Index,
                    "out of range: tried to access index {} on a tensor of " + std::to_string(numel) + " elements.",
                    true};
}

// take(self, index): self.flatten()[index], index's shape.
void lower_take(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  IndexCheck check = flat_check(x.type.numel());
  V pos = checked_index(ctx, ctx.input(node, 1), x.type.numel(), DType::Int64, &check);
  ctx.set_result(ctx.reshape(gather_linear(ctx, x, pos), out.shape));
}

// put(self, index, source, accumulate): self.flatten()[index] = source.flatten() (or +=).
void lower_put(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  V index = ctx.input(node, 1);
  int64_t n = index.type.numel();
  IndexCheck check = flat_check(x.type.numel());
  V pos = ctx.reshape(checked_index(ctx, index, x.type.numel(), DType::Int64, &check), {n});
  V source = ctx.reshape(ctx.convert(ctx.input(node, 2), x.type.dtype), {n});
  bool accumulate = node.args[3].as_bool();
  Hlo add = x.type.dtype == DType::Bool ? Hlo::Or : Hlo::Add;
  ctx.set_result(scatter_linear(ctx, x, pos, source, accumulate ? std::optional<Hlo>(add) : std::nullopt));
}

// Linear positions into `self_shape` of the elements of a source whose slices along dim go
// to the slices index[j] of self (the positions index_copy and index_reduce write).
V slice_positions(LoweringContext& ctx, const std::vector<int64_t>& self_shape, int64_t dim, const V& index,
                  const std::vector<int64_t>& source_shape, const IndexCheck& check) {
  std::vector<int64_t> strides = contiguous_strides(self_shape);
  std::vector<int64_t> coefs = strides;
  coefs[dim] = 0;
  V total = affine_index(ctx, source_shape, coefs, 0, DType::Int64);
  V along = checked_index(ctx, ctx.reshape(index, {source_shape[dim]}), self_shape[dim], DType::Int64, &check);
  along = ctx.binary(Hlo::Multiply, along, ctx.constant_int(strides[dim], DType::Int64, along.type.shape));
  return ctx.binary(Hlo::Add, total, ctx.broadcast_in_dim(along, source_shape, {dim}));
}

// A 0-d self or source is one slice of one element.
std::vector<int64_t> at_least_1d(const std::vector<int64_t>& shape) { return shape.empty() ? std::vector<int64_t>{1} : shape; }

// index_fill.int_Scalar / index_fill.int_Tensor(self, dim, index, value)
void lower_index_fill(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  std::vector<int64_t> shape = at_least_1d(x.type.shape);
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  V index = ctx.reshape(ctx.input(node, 2), {ctx.input(node, 2).type.numel()});
  int64_t size = shape[dim], k = index.type.numel();
  V value = ctx.has_input(node, 3) ? ctx.convert(ctx.reshape(ctx.input(node, 3), {}), out.dtype)
                                   : ctx.scalar(node, 3, out.dtype);
  if (k == 0) {
    ctx.set_result(x);
    return;
  }
  // selected[d]: some index names slice d.
  V slots = ctx.broadcast_in_dim(ctx.iota(TensorType{{size}, DType::Int64}, 0), {size, k}, {0});
  IndexCheck check = bounds_check(dim, size, true, RuntimeCheck::Error::Index);
  V named = ctx.broadcast_in_dim(checked_index(ctx, index, size, DType::Int64, &check), {size, k}, {1});
  V selected = ctx.reduce(ctx.compare(Cmp::EQ, slots, named), {1}, ctx.constant_int(0, DType::Bool), Hlo::Or);
  V mask = ctx.broadcast_in_dim(selected, shape, {dim});
  V filled = ctx.select(mask, ctx.broadcast_to(value, shape), ctx.reshape(x, shape));
  ctx.set_result(ctx.reshape(filled, out.shape));
}

// index_copy(self, dim, index, source): self's slices index[j] along dim become source's j-th.
void lower_index_copy(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  V source = ctx.convert(ctx.input(node, 3), out.dtype);
  std::vector<int64_t> shape = at_least_1d(x.type.shape), source_shape = at_least_1d(source.type.shape);
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  IndexCheck check = bounds_check(dim, shape[dim], false, RuntimeCheck::Error::Index);
  check.message = "index_copy_(): " + check.message;
  V pos = slice_positions(ctx, shape, dim, ctx.input(node, 2), source_shape, check);
  V r = scatter_linear(ctx, ctx.reshape(x, shape), pos, ctx.reshape(source, source_shape), std::nullopt);
  ctx.set_result(ctx.reshape(r, out.shape));
}

// index_reduce(self, dim, index, source, reduce, include_self): prod, mean, amax or amin of
// the source slices sent to each slice of self (and self's own value unless include_self is
// false; untouched slices keep self's). Integer means divide with floor, as CPU does.
void lower_index_reduce(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType dt = out.dtype;
  V x = ctx.input(node, 0);
  V source = ctx.convert(ctx.input(node, 3), dt);
  std::vector<int64_t> shape = at_least_1d(x.type.shape), source_shape = at_least_1d(source.type.shape);
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  std::string reduce = node.args[4].s;
  bool include_self = node.args[5].as_bool();
  V pos = slice_positions(ctx, shape, dim, ctx.input(node, 2), source_shape, range_check());
  V base = ctx.reshape(x, shape);
  V updates = ctx.reshape(source, source_shape);
  bool is_bool = dt == DType::Bool;
  Hlo combine = reduce == "prod" ? (is_bool ? Hlo::And : Hlo::Multiply)
                        : reduce == "amax" ? (is_bool ? Hlo::Or : Hlo::Maximum)
                        : reduce == "amin" ? (is_bool ? Hlo::And : Hlo::Minimum)
                                           : (is_bool ? Hlo::Or : Hlo::Add);
  if (!include_self) {
    V identity = reduce == "prod" ? ctx.constant(1, dt) : reduce == "amax" ? lowest_scalar(ctx, dt)
                 : reduce == "amin" ? highest_scalar(ctx, dt) : ctx.constant(0, dt);
    base = scatter_linear(ctx, base, pos, ctx.broadcast_to(identity, source_shape), std::nullopt);
  }
  V r = scatter_linear(ctx, base, pos, updates, combine);
  if (reduce == "mean") {
    V count = ctx.constant(include_self ? 1 : 0, dt, shape);
    count = scatter_linear(ctx, count, pos, ctx.constant(1, dt, source_shape), Hlo::Add);
    V zero = ctx.constant(0, dt, shape);
    count = ctx.select(ctx.compare(Cmp::EQ, count, zero), ctx.constant(1, dt, shape), count);
    V q = ctx.binary(Hlo::Divide, r, count);
    if (!is_floating(dt)) {
      V rem = ctx.binary(Hlo::Remainder, r, count);
      V adjust = ctx.binary(Hlo::And, ctx.compare(Cmp::NE, rem, zero), ctx.compare(Cmp::LT, rem, zero));
      q = ctx.select(adjust, ctx.binary(Hlo::Subtract, q, ctx.constant(1, dt, shape)), q);
    }
    r = q;
  }
  ctx.set_result(ctx.reshape(r, out.shape));
}

LOWERING("aten::take", lower_take);
// CPU's kernels check the index dtype, the meta kernels do not ("put_(): Expected a long tensor
// for index, but got Float"; index_fill raises IndexError).
LOWERING("aten::put", lower_put, nullptr, RuleFlags{.index_arg = 1, .index_refuses = kIndexNotInt64});
LOWERING("aten::index_fill.int_Scalar", lower_index_fill, nullptr, RuleFlags{.index_arg = 2, .index_refuses = kIndexNotInt64});
LOWERING("aten::index_fill.int_Tensor", lower_index_fill, nullptr, RuleFlags{.index_arg = 2, .index_refuses = kIndexNotInt64});
LOWERING("aten::index_copy", lower_index_copy, nullptr, RuleFlags{.index_arg = 2, .index_refuses = kIndexNotInt64});
LOWERING("aten::index_reduce", lower_index_reduce, nullptr,
         RuleFlags{.refuses = kBoolDTypes, .index_arg = 2, .index_refuses = kIndexNotInt});

}  // namespace
}  // namespace torchtpu
