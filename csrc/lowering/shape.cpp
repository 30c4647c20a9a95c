// Shape lowerings: the *_copy view ops functionalization emits, concatenation.
#include "lowering/common.h"

namespace torchtpu {
namespace {

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

LOWERING("aten::view_copy", lower_reshape);
LOWERING("aten::_unsafe_view", lower_reshape);
LOWERING("aten::_reshape_alias_copy", lower_reshape);
LOWERING("aten::unsqueeze_copy", lower_reshape);
LOWERING("aten::squeeze_copy", lower_reshape);
LOWERING("aten::squeeze_copy.dim", lower_reshape);
LOWERING("aten::squeeze_copy.dims", lower_reshape);
LOWERING("aten::expand_copy", lower_expand);
LOWERING("aten::permute_copy", lower_permute);
LOWERING("aten::transpose_copy.int", lower_transpose);
LOWERING("aten::t_copy", lower_transpose);
LOWERING("aten::slice_copy.Tensor", lower_slice);
LOWERING("aten::select_copy.int", lower_select);
LOWERING("aten::cat", lower_cat);

}  // namespace
}  // namespace torchtpu
