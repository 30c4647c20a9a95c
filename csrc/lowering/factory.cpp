// Factory lowerings: arange, linspace, logspace, eye. Their Scalar bounds decide the output shape, so
// they are registered with static_scalars (compile-time constants).
#include <cmath>

#include "lowering/common.h"

namespace torchtpu {
namespace {

// Which arange overload: arange(end), arange(start, end), arange(start, end, step).
enum class Arange : uint8_t { End, Start, StartStep };
// The bounds of arange, linspace and logspace decide the result's shape: compile-time constants.
constexpr RuleFlags kStaticScalars{.static_scalars = true};

// Float math for a factory: f64 outputs compute in f64, everything else in f32.
DType compute_type(DType out) { return out == DType::Float64 ? DType::Float64 : DType::Float32; }

// arange(end) / arange.start(start, end) / arange.start_step(start, end, step)
void lower_arange(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Arange kind = rule_param<Arange>(node);
  const Arg* start = kind == Arange::End ? nullptr : &node.args[0];
  const Arg* step = kind == Arange::StartStep ? &node.args[2] : nullptr;
  if (out.numel() == 0) {
    ctx.set_result(ctx.constant(0, out.dtype, out.shape));
    return;
  }
  bool integral = !is_floating(out.dtype) && (!start || start->kind != Arg::Kind::Double) &&
                  (!step || step->kind != Arg::Kind::Double);
  DType ct = integral ? DType::Int64 : compute_type(out.dtype);
  V i = ctx.iota(TensorType{out.shape, ct}, 0);
  if (step) {
    V s = integral ? ctx.constant_int(step->as_int(), ct, out.shape) : ctx.constant(step->as_double(), ct, out.shape);
    i = ctx.binary(Hlo::Multiply, i, s);
  }
  if (start) {
    V s = integral ? ctx.constant_int(start->as_int(), ct, out.shape) : ctx.constant(start->as_double(), ct, out.shape);
    i = ctx.binary(Hlo::Add, i, s);
  }
  if (!integral && !is_floating(out.dtype)) i = ctx.unary(Hlo::Floor, i);
  ctx.set_result(ctx.convert(i, out.dtype));
}

// linspace(start, end, steps): PyTorch's symmetric formula (the second half counts back
// from end).
void lower_linspace(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  int64_t steps = node.args[2].i;
  if (steps == 0) {
    ctx.set_result(ctx.constant(0, out.dtype, out.shape));
    return;
  }
  double start = node.args[0].as_double(), end = node.args[1].as_double();
  if (steps == 1) {
    ctx.set_result(ctx.constant(start, out.dtype, out.shape));
    return;
  }
  if (!is_floating(out.dtype)) {
    // Integer linspace: PyTorch computes start + step * i in double and truncates.
    std::string values;
    double step = (end - start) / static_cast<double>(steps - 1);
    for (int64_t k = 0; k < steps; ++k)
      values += (k ? ", " : "") + std::to_string(static_cast<int64_t>(start + step * static_cast<double>(k)));
    TensorType t{{steps}, DType::Int64};
    V c = ctx.emit(Hlo::Constant, {}, t, "value = dense<[" + values + "]> : " + t.mlir());
    ctx.set_result(ctx.convert(c, out.dtype));
    return;
  }
  DType ct = compute_type(out.dtype);
  double step = (end - start) / static_cast<double>(steps - 1);
  int64_t halfway = steps / 2;
  V i = ctx.iota(TensorType{out.shape, ct}, 0);
  V s = ctx.constant(step, ct, out.shape);
  V low = ctx.binary(Hlo::Add, ctx.constant(start, ct, out.shape), ctx.binary(Hlo::Multiply, s, i));
  V back = ctx.binary(Hlo::Subtract, ctx.constant(static_cast<double>(steps - 1), ct, out.shape), i);
  V high = ctx.binary(Hlo::Subtract, ctx.constant(end, ct, out.shape), ctx.binary(Hlo::Multiply, s, back));
  V first_half = ctx.compare(Cmp::LT, i, ctx.constant(static_cast<double>(halfway), ct, out.shape));
  ctx.set_result(ctx.convert(ctx.select(first_half, low, high), out.dtype));
}

// logspace(start, end, steps, base): base ** linspace's exponents, as PyTorch's CPU kernel
// forms them (the second half counts back from end); integer results are computed on the
// host in double, as CPU does, and truncated.
void lower_logspace(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  int64_t steps = node.args[2].i;
  double start = node.args[0].as_double(), end = node.args[1].as_double(), base = node.args[3].as_double();
  if (steps == 0) {
    ctx.set_result(ctx.constant(0, out.dtype, out.shape));
    return;
  }
  double step = steps == 1 ? 0.0 : (end - start) / static_cast<double>(steps - 1);
  int64_t halfway = steps / 2;
  if (!is_floating(out.dtype)) {
    std::string values;
    double int_base = static_cast<double>(static_cast<int64_t>(base));
    int64_t int_start = static_cast<int64_t>(start), int_end = static_cast<int64_t>(end);
    for (int64_t k = 0; k < steps; ++k) {
      double exponent = k < halfway ? int_start + step * static_cast<double>(k)
                                    : int_end - step * static_cast<double>(steps - k - 1);
      values += (k ? ", " : "") + std::to_string(static_cast<int64_t>(std::pow(int_base, exponent)));
    }
    TensorType t{{steps}, DType::Int64};
    V c = ctx.emit(Hlo::Constant, {}, t, "value = dense<[" + values + "]> : " + t.mlir());
    ctx.set_result(ctx.convert(c, out.dtype));
    return;
  }
  DType ct = compute_type(out.dtype);
  auto k = [&](double v) { return ctx.constant(v, ct, out.shape); };
  V i = ctx.iota(TensorType{out.shape, ct}, 0);
  V s = k(step);
  V low = ctx.binary(Hlo::Add, k(start), ctx.binary(Hlo::Multiply, s, i));
  V back = ctx.binary(Hlo::Subtract, k(static_cast<double>(steps - 1)), i);
  V high = ctx.binary(Hlo::Subtract, k(end), ctx.binary(Hlo::Multiply, s, back));
  V exponent = ctx.select(ctx.compare(Cmp::LT, i, k(static_cast<double>(halfway))), low, high);
  if (steps == 1) exponent = k(start);
  ctx.set_result(ctx.convert(ctx.binary(Hlo::Power, k(base), exponent), out.dtype));
}

// eye(n) / eye.m(n, m)
void lower_eye(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  TensorType it{out.shape, DType::Int32};
  V diag = ctx.compare(Cmp::EQ, ctx.iota(it, 0), ctx.iota(it, 1));
  ctx.set_result(ctx.convert(diag, out.dtype));
}

LOWERING("aten::arange", lower_arange, Arange::End, kStaticScalars);
LOWERING("aten::arange.start", lower_arange, Arange::Start, kStaticScalars);
LOWERING("aten::arange.start_step", lower_arange, Arange::StartStep, kStaticScalars);
LOWERING("aten::linspace", lower_linspace, nullptr, kStaticScalars);
LOWERING("aten::logspace", lower_logspace, nullptr, kStaticScalars);
LOWERING("aten::eye", lower_eye);
LOWERING("aten::eye.m", lower_eye);

}  // namespace
}  // namespace torchtpu
