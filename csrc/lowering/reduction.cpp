// Reductions: sum, mean.
#include "lowering/common.h"

namespace torchtpu {
namespace {

std::vector<int64_t> reduced_dims(const Node& node, int arg, int64_t rank) {
  if (arg >= static_cast<int>(node.args.size()) || node.args[arg].is_none() || node.args[arg].ints.empty()) {
    std::vector<int64_t> all(rank);
    for (int64_t i = 0; i < rank; ++i) all[i] = i;
    return all;
  }
  return wrap_dims(node.args[arg].ints, rank);
}

// sum(self, dtype) / sum.dim_IntList(self, dim, keepdim, dtype) / mean.dim
void lower_sum_mean(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  bool has_dims = node.args.size() >= 3 && node.args[1].kind != Arg::Kind::Int;
  std::vector<int64_t> dims = has_dims ? reduced_dims(node, 1, x.type.rank()) : reduced_dims(node, 99, x.type.rank());
  // Accumulate low-precision floats in f32 as PyTorch does.
  DType acc = out.dtype == DType::BFloat16 || out.dtype == DType::Float16 ? DType::Float32 : out.dtype;
  V total = sum_dims(ctx, ctx.convert(x, acc), dims);
  if (node.rule->data && std::string(node.rule->data) == "mean") {
    int64_t count = 1;
    for (int64_t d : dims) count *= x.type.shape[d];
    total = ctx.binary("stablehlo.divide", total, ctx.constant(static_cast<double>(count), acc, total.type.shape));
  }
  ctx.set_result(ctx.reshape(ctx.convert(total, out.dtype), out.shape));
}

LOWERING("aten::sum", lower_sum_mean);
LOWERING("aten::sum.dim_IntList", lower_sum_mean);
LOWERING("aten::mean.dim", lower_sum_mean, "mean");
LOWERING("aten::mean", lower_sum_mean, "mean");

}  // namespace
}  // namespace torchtpu
