// Internal ops the device layer and the engine record themselves: dtype conversion, broadcast,
// zeros, Python numbers taken as tensors, and the slice that reads a value computed padded to
// a bucket.
#include "lowering/common.h"

namespace torchtpu {
namespace {

// torchtpu::convert(Tensor, int dtype)
void lower_convert(LoweringContext& ctx, const Node& node) {
  ctx.set_result(ctx.convert(ctx.input(node, 0), ctx.out(node).dtype));
}

// torchtpu::broadcast(Tensor, int[] shape)
void lower_broadcast(LoweringContext& ctx, const Node& node) {
  ctx.set_result(ctx.broadcast_to(ctx.input(node, 0), ctx.out(node).shape));
}

// torchtpu::zeros(): the contents of a fresh (empty) tensor.
void lower_zeros(LoweringContext& ctx, const Node& node) {
  ctx.set_result(ctx.constant(0, ctx.out(node).dtype, ctx.out(node).shape));
}

// torchtpu::scalar(Scalar number): a Python number an op takes as a 0-dim tensor.
void lower_scalar(LoweringContext& ctx, const Node& node) { ctx.set_result(ctx.scalar(node, 0, ctx.out(node).dtype)); }

// torchtpu::unpad(Tensor, int[] bucket_factors, int[] real_factors): the real elements of a
// value a bucketed graph computed padded (engine/buckets.h): its dims split into factors,
// each factor sliced to its real size.
void lower_unpad(LoweringContext& ctx, const Node& node) {
  const std::vector<int64_t>& bucket = node.args[1].ints;
  const std::vector<int64_t>& real = node.args[2].ints;
  V x = ctx.reshape(ctx.input(node, 0), bucket);
  x = ctx.slice(x, std::vector<int64_t>(bucket.size(), 0), real, std::vector<int64_t>(bucket.size(), 1));
  ctx.set_result(ctx.reshape(x, ctx.out(node).shape));
}

LOWERING("torchtpu::convert", lower_convert, nullptr, kTakesComplex);
LOWERING("torchtpu::unpad", lower_unpad, nullptr, kTakesComplex);
LOWERING("torchtpu::broadcast", lower_broadcast, nullptr, kTakesComplex);
LOWERING("torchtpu::zeros", lower_zeros, nullptr, kTakesComplex);
LOWERING("torchtpu::scalar", lower_scalar);

}  // namespace
}  // namespace torchtpu
