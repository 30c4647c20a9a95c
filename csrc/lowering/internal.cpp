// Internal ops the device layer records itself: dtype conversion, broadcast, zeros.
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

LOWERING("torchtpu::convert", lower_convert);
LOWERING("torchtpu::broadcast", lower_broadcast);
LOWERING("torchtpu::zeros", lower_zeros);

}  // namespace
}  // namespace torchtpu
