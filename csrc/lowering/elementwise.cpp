// Elementwise lowerings: unary math, binary arithmetic, comparisons, logical ops, where.
// Each family is one function; the rule's parameter names the StableHLO op (Hlo) or direction (Cmp).
#include <cmath>

#include "lowering/common.h"

namespace torchtpu {
namespace {

// CPU's mul and true division of a float16/bfloat16 tensor by a scalar `other` (a Python number
// or a 0-d tensor) read the scalar unrounded, in float32 (original_scalar_value), where the
// other binary ops first round it to the result dtype: bf16 * 0.3 multiplies by 0.3f, not by
// bfloat16(0.3) = 0.30078125. Then `self`, rounded to the result dtype, and the scalar are
// computed in float32 and the result rounded once.
bool scalar_other_kept_unrounded(LoweringContext& ctx, const Node& node, const TensorType& out) {
  if (out.dtype != DType::BFloat16 && out.dtype != DType::Float16) return false;
  return !ctx.has_input(node, 1) || ctx.input(node, 1).type.rank() == 0;
}

V binary_with_unrounded_scalar(LoweringContext& ctx, const Node& node, const TensorType& out, Hlo op) {
  V a = ctx.convert(tensor_or_scalar(ctx, node, 0, out.dtype, out.shape), DType::Float32);
  V b = tensor_or_scalar(ctx, node, 1, DType::Float32, out.shape);
  return ctx.convert(ctx.binary(op, a, b), out.dtype);
}

// Binary arithmetic computed in the result dtype: op(self, other) with Tensor or Scalar other.
void lower_binary(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V a = tensor_or_scalar(ctx, node, 0, out.dtype, out.shape);
  V b = tensor_or_scalar(ctx, node, 1, out.dtype, out.shape);
  ctx.set_result(ctx.binary(rule_param<Hlo>(node), a, b));
}

// mul: as lower_binary, but a scalar `other` of a float16/bfloat16 product stays unrounded.
void lower_mul(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  if (scalar_other_kept_unrounded(ctx, node, out))
    ctx.set_result(binary_with_unrounded_scalar(ctx, node, out, Hlo::Multiply));
  else
    lower_binary(ctx, node);
}

// x * alpha, where alpha is the optional Scalar argument 2 of add/sub/rsub (skipped when it
// is a constant 1).
bool times_alpha_is_identity(const Node& node) {
  return node.args.size() <= 2 || node.args[2].is_none() || node.args[2].is_constant(1.0);
}

V times_alpha(LoweringContext& ctx, const Node& node, const V& x, const TensorType& out) {
  if (times_alpha_is_identity(node)) return x;
  return ctx.binary(Hlo::Multiply, x, ctx.broadcast_to(ctx.scalar(node, 2, out.dtype), out.shape));
}

// A float16/bfloat16 operand of an add or subtract, in float32 behind a reduce_precision to
// its own mantissa width: an identity on it (the exponent keeps float32's 8 bits, so subnormals,
// infinities and NaNs pass unchanged), but one XLA emits as integer bit operations. XLA:CPU's
// LLVM backend always allows FMA contraction, and LLVM narrows convert(op(convert(a), convert(b)))
// back to the float16 op; on a CPU with float16 FMA (avx512_fp16) a product was then fused into
// the add or subtract that consumed it and rounded once, where eager rounds the product first
// (bfloat16 FMA comes with AVX10.2). LLVM cannot see through the bit operations, so the product
// stays a rounded value of its own.
V kept_from_contraction(LoweringContext& ctx, const V& x) {
  V wide = ctx.convert(x, DType::Float32);
  int mantissa_bits = x.type.dtype == DType::Float16 ? 10 : 7;
  return ctx.emit(Hlo::ReducePrecision, {wide}, wide.type,
                  "exponent_bits = 8 : i32, mantissa_bits = " + std::to_string(mantissa_bits) + " : i32");
}

// a op b for add/sub/rsub, a and b of the result dtype. A float16/bfloat16 result is computed
// in float32 and rounded once (exact: float32 holds the sum of two float16/bfloat16 values to
// within half an ulp of the result), from its tensor operands kept from contraction; a Python
// number cannot be a product and is only widened.
V add_or_subtract(LoweringContext& ctx, Hlo op, const V& a, bool a_is_tensor, const V& b,
                  bool b_is_tensor, const TensorType& out) {
  if (out.dtype != DType::Float16 && out.dtype != DType::BFloat16) return ctx.binary(op, a, b);
  auto widened = [&](const V& x, bool is_tensor) {
    return is_tensor ? kept_from_contraction(ctx, x) : ctx.convert(x, DType::Float32);
  };
  return ctx.convert(ctx.binary(op, widened(a, a_is_tensor), widened(b, b_is_tensor)), out.dtype);
}

// add/sub with alpha: self op alpha * other.
void lower_add_sub(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V a = tensor_or_scalar(ctx, node, 0, out.dtype, out.shape);
  V b = tensor_or_scalar(ctx, node, 1, out.dtype, out.shape);
  // alpha * other is a product of its own: kept from contraction as a tensor operand is.
  bool b_is_product = ctx.has_input(node, 1) || !times_alpha_is_identity(node);
  ctx.set_result(add_or_subtract(ctx, rule_param<Hlo>(node), a, ctx.has_input(node, 0), times_alpha(ctx, node, b, out),
                                 b_is_product, out));
}

// rsub(self, other, alpha): other - alpha * self.
void lower_rsub(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V a = tensor_or_scalar(ctx, node, 0, out.dtype, out.shape);
  V b = tensor_or_scalar(ctx, node, 1, out.dtype, out.shape);
  bool a_is_product = ctx.has_input(node, 0) || !times_alpha_is_identity(node);
  ctx.set_result(add_or_subtract(ctx, Hlo::Subtract, b, ctx.has_input(node, 1), times_alpha(ctx, node, a, out),
                                 a_is_product, out));
}

// Floor division of floats as PyTorch computes it: from fmod, so that a // b is consistent
// with a % b (floor(a / b) can be off by one where a / b rounds to an integer).
V floor_divide_float(const Ex& e, const V& a, const V& b) {
  V zero = e.k(0.0);
  V mod = e.c.binary(Hlo::Remainder, a, b);
  V div = e.div(e.sub(a, mod), b);
  V adjust = e.band(e.cmp(Cmp::NE, mod, zero), e.cmp(Cmp::NE, e.cmp(Cmp::LT, b, zero), e.cmp(Cmp::LT, mod, zero)));
  div = e.sel(adjust, e.sub(div, e.k(1.0)), div);
  V floored = e.un(Hlo::Floor, div);
  floored = e.sel(e.cmp(Cmp::GT, e.sub(div, floored), e.k(0.5)), e.add(floored, e.k(1.0)), floored);
  // A zero quotient takes the sign of a / b (1 / -0 is -inf).
  V quotient = e.div(a, b);
  V signed_zero = e.sel(e.cmp(Cmp::LT, e.div(e.k(1.0), quotient), zero), e.k(-0.0), zero);
  V r = e.sel(e.cmp(Cmp::NE, div, zero), floored, signed_zero);
  return e.sel(e.cmp(Cmp::EQ, b, zero), quotient, r);
}

// How a division rounds: as its rounding_mode argument says (None, "trunc", "floor"), or
// always down (floor_divide).
enum class Rounding : uint8_t { FromArgument, Floor };

// div with rounding_mode; floor_divide.
void lower_div(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  std::string mode = rule_param<Rounding>(node) == Rounding::Floor ? "floor" : "";
  if (node.args.size() > 2 && node.args[2].kind == Arg::Kind::String) mode = node.args[2].s;
  if (mode.empty() && scalar_other_kept_unrounded(ctx, node, out)) {
    ctx.set_result(binary_with_unrounded_scalar(ctx, node, out, Hlo::Divide));
    return;
  }
  if (is_floating(out.dtype) || is_complex(out.dtype)) {  // complex: no rounding modes (not registered)
    Ex e = operands_ex(ctx, out);
    V a = e.arg(node, 0), b = e.arg(node, 1);
    V q = ctx.binary(Hlo::Divide, a, b);
    if (mode == "trunc") {
      V zero = e.k(0);
      q = ctx.select(ctx.compare(Cmp::LT, q, zero), ctx.unary(Hlo::Ceil, q), ctx.unary(Hlo::Floor, q));
    } else if (mode == "floor") {
      q = floor_divide_float(e, a, b);
    }
    ctx.set_result(ctx.convert(q, out.dtype));
    return;
  }
  // Integer division: stablehlo.divide truncates; floor mode adjusts when signs differ.
  V a = tensor_or_scalar(ctx, node, 0, out.dtype, out.shape);
  V b = tensor_or_scalar(ctx, node, 1, out.dtype, out.shape);
  check_integer_divisor(ctx, node, 1, b);
  V q = ctx.binary(Hlo::Divide, a, b);
  if (mode == "floor" && out.dtype != DType::UInt8) {
    V r = ctx.binary(Hlo::Remainder, a, b);
    V zero = ctx.constant(0, out.dtype, out.shape);
    V nonzero = ctx.compare(Cmp::NE, r, zero);
    V signs_differ = ctx.compare(Cmp::NE, ctx.compare(Cmp::LT, r, zero), ctx.compare(Cmp::LT, b, zero));
    V adjust = ctx.emit(Hlo::And, {nonzero, signs_differ}, nonzero.type);
    q = ctx.select(adjust, ctx.binary(Hlo::Subtract, q, ctx.constant(1, out.dtype, out.shape)), q);
  }
  ctx.set_result(q);
}

// Comparisons: inputs promoted together, result bool.
void lower_compare(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  std::vector<V> tensors;
  for (int i = 0; i < 2; ++i)
    if (ctx.has_input(node, i)) tensors.push_back(ctx.input(node, i));
  DType compute = result_type(tensors);
  // A Scalar other only raises the category: float vs int/bool -> float32 (default dtype),
  // int vs bool -> int64.
  if (!ctx.has_input(node, 1)) {
    Arg::Kind k = node.args[1].kind;
    if (k == Arg::Kind::Complex && !is_complex(compute)) compute = complex_type_of(compute);
    else if (k == Arg::Kind::Double && !is_floating(compute) && !is_complex(compute)) compute = DType::Float32;
    else if (k == Arg::Kind::Int && compute == DType::Bool) compute = DType::Int64;
  }
  V a = tensor_or_scalar(ctx, node, 0, compute, out.shape);
  V b = tensor_or_scalar(ctx, node, 1, compute, out.shape);
  ctx.set_result(ctx.compare(rule_param<Cmp>(node), a, b));
}

// logical_and/or/xor: operands as bools.
void lower_logical(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V a = to_type(ctx, ctx.input(node, 0), DType::Bool, out.shape);
  V b = to_type(ctx, ctx.input(node, 1), DType::Bool, out.shape);
  ctx.set_result(ctx.convert(ctx.binary(rule_param<Hlo>(node), a, b), out.dtype));
}

void lower_logical_not(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V a = ctx.convert(ctx.input(node, 0), DType::Bool);
  ctx.set_result(ctx.convert(ctx.unary(Hlo::Not, a), out.dtype));
}

// where(condition, self, other)
void lower_where(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V c = to_type(ctx, ctx.input(node, 0), DType::Bool, out.shape);
  V a = tensor_or_scalar(ctx, node, 1, out.dtype, out.shape);
  V b = tensor_or_scalar(ctx, node, 2, out.dtype, out.shape);
  ctx.set_result(ctx.select(c, a, b));
}

// threshold_backward(grad, self, threshold): 0 where self <= threshold, else grad (a NaN self
// passes its gradient, as CPU's `x <= threshold ? 0 : grad` does).
void lower_threshold_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V grad = to_type(ctx, ctx.input(node, 0), out.dtype, out.shape);
  V self = ctx.input(node, 1);
  V threshold = ctx.broadcast_to(ctx.scalar(node, 2, self.type.dtype), self.type.shape);
  V drop = ctx.broadcast_to(ctx.compare(Cmp::LE, self, threshold), out.shape);
  ctx.set_result(ctx.select(drop, ctx.constant(0, out.dtype, out.shape), grad));
}

// fill(self, value) / zero(self)
void lower_fill(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  if (node.args.size() < 2) {
    ctx.set_result(ctx.constant(0, out.dtype, out.shape));
    return;
  }
  V value = ctx.has_input(node, 1) ? ctx.convert(ctx.input(node, 1), out.dtype) : ctx.scalar(node, 1, out.dtype);
  ctx.set_result(ctx.broadcast_to(ctx.reshape(value, {}), out.shape));
}

// clone / alias_copy / lift_fresh_copy / detach_copy: the value itself.
void lower_identity(LoweringContext& ctx, const Node& node) {
  ctx.set_result(ctx.convert(ctx.input(node, 0), ctx.out(node).dtype));
}

// A bool alpha takes bool results only ("Boolean alpha only supported for Boolean results").
DTypeSet alpha_refuses(const std::vector<Arg>& args) {
  return args.size() > 2 && args[2].kind == Arg::Kind::Bool ? kAllDTypes & ~kBoolDTypes : 0;
}
constexpr RuleFlags kIdentity{.complex = true, .identity = true};
constexpr RuleFlags kAdd{.complex = true, .refuses_for = alpha_refuses};
LOWERING("aten::add.Tensor", lower_add_sub, Hlo::Add, kAdd);
LOWERING("aten::add.Scalar", lower_add_sub, Hlo::Add, kAdd);
// CPU's sub refuses a bool operand, tensor or Python bool ("Subtraction, the `-` operator, with
// a bool tensor is not supported"); PyTorch's meta kernel refuses two bools only.
constexpr RuleFlags kSub{.complex = true, .refuses = kBoolDTypes, .judged_on = Judged::Operands,
                         .refuses_for = alpha_refuses};
LOWERING("aten::sub.Tensor", lower_add_sub, Hlo::Subtract, kSub);
LOWERING("aten::sub.Scalar", lower_add_sub, Hlo::Subtract, kSub);
LOWERING("aten::rsub.Tensor", lower_rsub, nullptr, kSub);
LOWERING("aten::rsub.Scalar", lower_rsub, nullptr, kSub);
LOWERING("aten::mul.Tensor", lower_mul, Hlo::Multiply, kTakesComplex);
LOWERING("aten::mul.Scalar", lower_mul, Hlo::Multiply, kTakesComplex);
LOWERING("aten::div.Tensor", lower_div, Rounding::FromArgument, kTakesComplex);
LOWERING("aten::div.Scalar", lower_div, Rounding::FromArgument, kTakesComplex);
LOWERING("aten::div.Tensor_mode", lower_div, Rounding::FromArgument, kNoBool);
LOWERING("aten::div.Scalar_mode", lower_div, Rounding::FromArgument, kNoBool);
LOWERING("aten::floor_divide", lower_div, Rounding::Floor);
LOWERING("aten::floor_divide.Scalar", lower_div, Rounding::Floor);
LOWERING("aten::maximum", lower_binary, Hlo::Maximum);
LOWERING("aten::minimum", lower_binary, Hlo::Minimum);

LOWERING("aten::eq.Tensor", lower_compare, Cmp::EQ, kTakesComplex);
LOWERING("aten::eq.Scalar", lower_compare, Cmp::EQ, kTakesComplex);
LOWERING("aten::ne.Tensor", lower_compare, Cmp::NE, kTakesComplex);
LOWERING("aten::ne.Scalar", lower_compare, Cmp::NE, kTakesComplex);
LOWERING("aten::lt.Tensor", lower_compare, Cmp::LT);
LOWERING("aten::lt.Scalar", lower_compare, Cmp::LT);
LOWERING("aten::le.Tensor", lower_compare, Cmp::LE);
LOWERING("aten::le.Scalar", lower_compare, Cmp::LE);
LOWERING("aten::gt.Tensor", lower_compare, Cmp::GT);
LOWERING("aten::gt.Scalar", lower_compare, Cmp::GT);
LOWERING("aten::ge.Tensor", lower_compare, Cmp::GE);
LOWERING("aten::ge.Scalar", lower_compare, Cmp::GE);

LOWERING("aten::logical_and", lower_logical, Hlo::And, kTakesComplex);
LOWERING("aten::logical_or", lower_logical, Hlo::Or, kTakesComplex);
LOWERING("aten::logical_xor", lower_logical, Hlo::Xor, kTakesComplex);
LOWERING("aten::logical_not", lower_logical_not, nullptr, kTakesComplex);
LOWERING("aten::where.self", lower_where, nullptr, kTakesComplex);

LOWERING("aten::threshold_backward", lower_threshold_backward);
LOWERING("aten::fill.Scalar", lower_fill, nullptr, kTakesComplex);
LOWERING("aten::fill.Tensor", lower_fill, nullptr, kTakesComplex);
LOWERING("aten::zero", lower_fill, nullptr, kTakesComplex);
LOWERING("aten::clone", lower_identity, nullptr, kIdentity);
LOWERING("aten::alias_copy", lower_identity, nullptr, kIdentity);
LOWERING("aten::lift_fresh_copy", lower_identity, nullptr, kIdentity);
LOWERING("aten::detach_copy", lower_identity, nullptr, kIdentity);

}  // namespace
}  // namespace torchtpu
