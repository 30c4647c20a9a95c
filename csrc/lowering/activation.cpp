// Activations with more than one input or a random draw, and their backward ops: glu,
// prelu, softshrink, hardshrink, rrelu. Computed in compute_dtype (float for half types).
#include <string>

#include "lowering/common.h"

namespace torchtpu {
namespace {

enum class Shrink : uint8_t { Soft, Hard };

// The two halves of x along dim.
std::pair<V, V> halves(LoweringContext& ctx, const V& x, int64_t dim) {
  std::vector<int64_t> start(x.type.rank(), 0), limit = x.type.shape, mid_start(x.type.rank(), 0), ones(x.type.rank(), 1);
  int64_t half = x.type.shape[dim] / 2;
  limit[dim] = half;
  mid_start[dim] = half;
  return {ctx.slice(x, start, limit, ones), ctx.slice(x, mid_start, x.type.shape, ones)};
}

// glu(self, dim) = a * sigmoid(b) for the halves a, b of self along dim.
void lower_glu(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType dt = compute_dtype(out.dtype);
  V x = ctx.convert(ctx.input(node, 0), dt);
  auto [a, b] = halves(ctx, x, wrap_dim(node.args[1].i, x.type.rank()));
  ctx.set_result(ctx.convert(ctx.binary(Hlo::Multiply, a, ctx.unary(Hlo::Logistic, b)), out.dtype));
}

// glu_backward(grad_output, self, dim): (g sigmoid(b), g a sigmoid(b) (1 - sigmoid(b))).
void lower_glu_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType dt = compute_dtype(out.dtype);
  V x = ctx.convert(ctx.input(node, 1), dt);
  int64_t dim = wrap_dim(node.args[2].i, x.type.rank());
  auto [a, b] = halves(ctx, x, dim);
  Ex e = make_ex(ctx, dt, a.type.shape);
  V g = ctx.convert(ctx.input(node, 0), dt);
  V s = e.un(Hlo::Logistic, b);
  V grad_a = e.mul(g, s);
  V grad_b = e.mul(e.mul(e.mul(g, a), s), e.sub(e.k(1.0), s));
  ctx.set_result(ctx.convert(ctx.concatenate({grad_a, grad_b}, dim), out.dtype));
}

// _prelu_kernel(self, weight): x where x > 0, else weight * x (weight broadcasts).
void lower_prelu(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V x = e.arg(node, 0), w = e.arg(node, 1);
  ctx.set_result(ctx.convert(e.sel(e.cmp(Cmp::GT, x, e.k(0.0)), x, e.mul(w, x)), out.dtype));
}

// _prelu_kernel_backward(grad_output, self, weight) -> (grad_self, grad_weight), both
// self-shaped (autograd sums grad_weight down to weight's shape).
void lower_prelu_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V g = e.arg(node, 0), x = e.arg(node, 1), w = e.arg(node, 2);
  V positive = e.cmp(Cmp::GT, x, e.k(0.0));
  V grad_x = e.sel(positive, g, e.mul(w, g));
  V grad_w = e.sel(positive, e.k(0.0), e.mul(x, g));
  ctx.set_results({ctx.convert(grad_x, out.dtype), ctx.convert(grad_w, ctx.out(node, 1).dtype)});
}

// softshrink(self, lambd) / hardshrink(self, lambd), as CPU writes them (NaN passes through;
// softshrink's middle is x * 0, keeping the sign of zero).
void lower_shrink(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V x = e.arg(node, 0), l = e.arg(node, 1);
  V r;
  if (rule_param<Shrink>(node) == Shrink::Soft) {
    r = e.sel(e.cmp(Cmp::GT, x, l), e.sub(x, l),
              e.sel(e.cmp(Cmp::LT, x, e.un(Hlo::Negate, l)), e.add(x, l), e.mul(x, e.k(0.0))));
  } else {
    V inside = e.band(e.cmp(Cmp::GE, x, e.un(Hlo::Negate, l)), e.cmp(Cmp::LE, x, l));
    r = e.sel(inside, e.k(0.0), x);
  }
  ctx.set_result(ctx.convert(r, out.dtype));
}

// softshrink_backward / hardshrink_backward(grad, self, lambd): grad outside [-lambd, lambd].
void lower_shrink_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V g = e.arg(node, 0), x = e.arg(node, 1), l = e.arg(node, 2);
  V inside = e.band(e.cmp(Cmp::GE, x, e.un(Hlo::Negate, l)), e.cmp(Cmp::LE, x, l));
  ctx.set_result(ctx.convert(e.sel(inside, e.k(0.0), g), out.dtype));
}

// rrelu_with_noise_functional(self, noise, lower, upper, training, generator) -> (out, noise):
// in training, negative elements are scaled by a uniform draw from [lower, upper] (kept in
// noise; 1 elsewhere); in eval, by (lower + upper) / 2 and noise is unchanged.
void lower_rrelu(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V x = e.arg(node, 0), lower = e.arg(node, 2), upper = e.arg(node, 3);
  V negative = e.cmp(Cmp::LT, x, e.k(0.0));
  V noise = ctx.input(node, 1);
  if (node.args[4].as_bool()) {
    V u = ctx.convert(ctx.random_uniform(node, out.shape, e.dt == DType::Float64 ? DType::Float64 : DType::Float32), e.dt);
    V slope = e.add(lower, e.mul(u, e.sub(upper, lower)));
    V draw = e.sel(negative, slope, e.k(1.0));
    ctx.set_results({ctx.convert(e.mul(x, draw), out.dtype), ctx.convert(draw, ctx.out(node, 1).dtype)});
    return;
  }
  V slope = e.div(e.add(lower, upper), e.k(2.0));
  ctx.set_results({ctx.convert(e.sel(negative, e.mul(x, slope), x), out.dtype), noise});
}

// CPU draws rrelu's slopes in float32, float64 and bfloat16 only ("rrelu_with_noise_out_cpu" not
// implemented for 'Half'); in eval it is leaky_relu, which takes float16 too.
DTypeSet rrelu_refuses(const std::vector<Arg>& args) { return args[4].as_bool() ? dtype_set(DType::Float16) : 0; }

// rrelu_with_noise_backward(grad, self, noise, lower, upper, training, self_is_result): the
// drawn slopes in training (when upper - lower > 1e-6, as CPU decides), else leaky relu's.
void lower_rrelu_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V g = e.arg(node, 0), x = e.arg(node, 1), lower = e.arg(node, 3), upper = e.arg(node, 4);
  V slope = e.div(e.add(lower, upper), e.k(2.0));
  V r = e.sel(e.cmp(Cmp::GT, x, e.k(0.0)), g, e.mul(g, slope));
  if (node.args[5].as_bool()) r = e.sel(e.cmp(Cmp::GT, e.sub(upper, lower), e.k(1e-6)), e.mul(g, e.arg(node, 2)), r);
  ctx.set_result(ctx.convert(r, out.dtype));
}

LOWERING("aten::glu", lower_glu, nullptr, kFloatOnly);
LOWERING("aten::glu_backward", lower_glu_backward, nullptr, kFloatOnly);
LOWERING("aten::_prelu_kernel", lower_prelu);
LOWERING("aten::_prelu_kernel_backward", lower_prelu_backward);
LOWERING("aten::softshrink", lower_shrink, Shrink::Soft);
LOWERING("aten::hardshrink", lower_shrink, Shrink::Hard, kFloatOnly);
LOWERING("aten::softshrink_backward", lower_shrink_backward);
LOWERING("aten::hardshrink_backward", lower_shrink_backward);
LOWERING("aten::rrelu_with_noise_functional", lower_rrelu, nullptr,
         RuleFlags{.random = true, .refuses = kBoolDTypes | kIntegerDTypes, .refuses_for = rrelu_refuses});
LOWERING("aten::rrelu_with_noise_backward", lower_rrelu_backward);

}  // namespace
}  // namespace torchtpu
