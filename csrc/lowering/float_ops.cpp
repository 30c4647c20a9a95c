// Elementwise ops on the parts of a float: copysign, signbit, frexp and nextafter read and
// write the IEEE bits (bitcast to the integer of the same width); heaviside and hypot.
#include <limits>
#include <string>

#include "lowering/common.h"

namespace torchtpu {
namespace {

// The signed integer type of a float type's width.
DType bits_dtype(DType dt) {
  switch (dt) {
    case DType::Float64: return DType::Int64;
    case DType::Float32: return DType::Int32;
    default: return DType::Int16;  // float16, bfloat16
  }
}

int bit_width(DType dt) { return dt == DType::Float64 ? 64 : dt == DType::Float32 ? 32 : 16; }

V to_bits(LoweringContext& ctx, const V& x) {
  return ctx.emit(Hlo::BitcastConvert, {x}, TensorType{x.type.shape, bits_dtype(x.type.dtype)});
}

V from_bits(LoweringContext& ctx, const V& bits, DType dt) {
  return ctx.emit(Hlo::BitcastConvert, {bits}, TensorType{bits.type.shape, dt});
}

// The sign bit as a mask of the integer type (its lowest value).
V sign_mask(LoweringContext& ctx, DType bits, const std::vector<int64_t>& shape) {
  int64_t lowest = bits == DType::Int64 ? std::numeric_limits<int64_t>::min()
                   : bits == DType::Int32 ? std::numeric_limits<int32_t>::min()
                                          : std::numeric_limits<int16_t>::min();
  return ctx.constant_int(lowest, bits, shape);
}

// copysign(self, other): |self| with other's sign bit (so -0.0 and -NaN count as negative).
void lower_copysign(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V a = tensor_or_scalar(ctx, node, 0, out.dtype, out.shape);
  V b = tensor_or_scalar(ctx, node, 1, out.dtype, out.shape);
  DType it = bits_dtype(out.dtype);
  V mask = sign_mask(ctx, it, out.shape);
  V magnitude = ctx.binary(Hlo::And, to_bits(ctx, a), ctx.unary(Hlo::Not, mask));
  V sign = ctx.binary(Hlo::And, to_bits(ctx, b), mask);
  ctx.set_result(from_bits(ctx, ctx.binary(Hlo::Or, magnitude, sign), out.dtype));
}

// signbit(self): the sign bit of floats; x < 0 for integers.
void lower_signbit(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  if (!is_floating(x.type.dtype)) {
    ctx.set_result(ctx.compare(Cmp::LT, x, ctx.constant_int(0, x.type.dtype, x.type.shape)));
    return;
  }
  V bits = to_bits(ctx, x);
  ctx.set_result(ctx.compare(Cmp::LT, bits, ctx.constant_int(0, bits.type.dtype, out.shape)));
}

// The bit layout of a float type.
struct Layout {
  int width, mantissa_bits;
  int64_t exponent_mask;  // of the exponent field, after shifting it down
};

Layout layout_of(DType dt) {
  switch (dt) {
    case DType::Float64: return {64, 52, 0x7ff};
    case DType::Float32: return {32, 23, 0xff};
    case DType::Float16: return {16, 10, 0x1f};
    default: return {16, 7, 0xff};  // bfloat16
  }
}

// Integer-only views of a float's bits, so that subnormals count even where the device
// flushes them to zero in float arithmetic (XLA's CPU backend does).
struct Bits {
  LoweringContext& ctx;
  DType it;
  std::vector<int64_t> shape;
  Layout layout;

  V k(int64_t v) const { return ctx.constant_int(v, it, shape); }
  V op(Hlo name, const V& a, const V& b) const { return ctx.binary(name, a, b); }
  int64_t magnitude_mask() const { return layout.width == 64 ? std::numeric_limits<int64_t>::max()
                                          : (int64_t(1) << (layout.width - 1)) - 1; }
  V magnitude(const V& bits) const { return op(Hlo::And, bits, k(magnitude_mask())); }
  V is_zero(const V& bits) const { return ctx.compare(Cmp::EQ, magnitude(bits), k(0)); }
  V is_nan(const V& bits) const {
    return ctx.compare(Cmp::GT, magnitude(bits), k(layout.exponent_mask << layout.mantissa_bits));
  }
  V is_inf_or_nan(const V& bits) const {
    return ctx.compare(Cmp::GE, magnitude(bits), k(layout.exponent_mask << layout.mantissa_bits));
  }
  // Bits reordered so that integer order is float order (-0 just below +0).
  V ordered(const V& bits) const {
    V sign_fill = op(Hlo::ShiftRightArithmetic, bits, k(layout.width - 1));
    return op(Hlo::Xor, bits, op(Hlo::And, sign_fill, k(magnitude_mask())));
  }
};

Bits bits_of(LoweringContext& ctx, DType dt, const std::vector<int64_t>& shape) {
  return Bits{ctx, bits_dtype(dt), shape, layout_of(dt)};
}

// frexp(self) -> (mantissa, exponent): x = mantissa * 2^exponent with 0.5 <= |mantissa| < 1;
// zero, inf and NaN give (x, 0). Integer arithmetic on the bits of x's own type.
void lower_frexp(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node, 0);
  V x = to_type(ctx, ctx.input(node, 0), out.dtype, out.shape);
  Bits b = bits_of(ctx, out.dtype, out.shape);
  const Layout& l = b.layout;
  int64_t bias = (l.exponent_mask >> 1) - 1;  // frexp's: 0.5 <= |m| < 1
  V bits = to_bits(ctx, x);
  V field = b.op(Hlo::And, b.op(Hlo::ShiftRightLogical, bits, b.k(l.mantissa_bits)), b.k(l.exponent_mask));
  int64_t fraction_mask = (int64_t(1) << l.mantissa_bits) - 1;
  V fraction = b.op(Hlo::And, bits, b.k(fraction_mask));
  V sign = b.op(Hlo::And, bits, b.k(~b.magnitude_mask()));
  // Normal: exponent = field - bias, fraction kept.
  V exponent = b.op(Hlo::Subtract, field, b.k(bias));
  // Subnormal (field 0): the highest set fraction bit p becomes the implicit one.
  V leading = ctx.unary(Hlo::CountLeadingZeros, fraction);
  V p = b.op(Hlo::Subtract, b.k(l.width - 1), leading);
  V sub_exponent = b.op(Hlo::Subtract, p, b.k(l.mantissa_bits + bias - 1));
  V shift = b.op(Hlo::Subtract, b.k(l.mantissa_bits), p);
  V sub_fraction = b.op(Hlo::And, b.op(Hlo::ShiftLeft, fraction, shift), b.k(fraction_mask));
  V subnormal = ctx.compare(Cmp::EQ, field, b.k(0));
  exponent = ctx.select(subnormal, sub_exponent, exponent);
  fraction = ctx.select(subnormal, sub_fraction, fraction);
  V mantissa_bits = b.op(Hlo::Or, b.op(Hlo::Or, sign, b.k(bias << l.mantissa_bits)), fraction);
  V special = ctx.binary(Hlo::Or, b.is_zero(bits), b.is_inf_or_nan(bits));
  V mantissa = ctx.select(special, x, from_bits(ctx, mantissa_bits, out.dtype));
  exponent = ctx.select(special, b.k(0), exponent);
  ctx.set_results({mantissa, ctx.convert(exponent, ctx.out(node, 1).dtype)});
}

// nextafter(self, other): the next representable value after self towards other, in
// self's own type: one step of the ordered bits (from zero: the smallest subnormal with
// other's sign).
void lower_nextafter(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V a = tensor_or_scalar(ctx, node, 0, out.dtype, out.shape);
  V c = tensor_or_scalar(ctx, node, 1, out.dtype, out.shape);
  Bits b = bits_of(ctx, out.dtype, out.shape);
  V a_bits = to_bits(ctx, a), c_bits = to_bits(ctx, c);
  V a_order = b.ordered(a_bits), c_order = b.ordered(c_bits);
  V up = ctx.compare(Cmp::LT, a_order, c_order);
  V stepped = ctx.select(up, b.op(Hlo::Add, a_order, b.k(1)), b.op(Hlo::Subtract, a_order, b.k(1)));
  V r = b.ordered(stepped);  // the reordering is its own inverse
  V tiny = ctx.select(ctx.compare(Cmp::LT, c_bits, b.k(0)), b.k(~b.magnitude_mask() | 1), b.k(1));
  r = ctx.select(b.is_zero(a_bits), tiny, r);
  V equal = ctx.binary(Hlo::Or, ctx.compare(Cmp::EQ, a_bits, c_bits),
                       ctx.binary(Hlo::And, b.is_zero(a_bits), b.is_zero(c_bits)));
  r = ctx.select(equal, c_bits, r);
  V result = from_bits(ctx, r, out.dtype);
  V nan = ctx.binary(Hlo::Or, b.is_nan(a_bits), b.is_nan(c_bits));
  ctx.set_result(ctx.select(nan, ctx.binary(Hlo::Add, a, c), result));
}

// heaviside(self, values): values where self == 0, else self > 0 (by the bits, so a
// subnormal self is not zero).
void lower_heaviside(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = to_type(ctx, ctx.input(node, 0), out.dtype, out.shape);
  V values = to_type(ctx, ctx.input(node, 1), out.dtype, out.shape);
  if (!is_floating(out.dtype)) {
    V zero = ctx.constant(0, out.dtype, out.shape);
    ctx.set_result(ctx.select(ctx.compare(Cmp::EQ, x, zero), values, ctx.convert(ctx.compare(Cmp::GT, x, zero), out.dtype)));
    return;
  }
  Bits b = bits_of(ctx, out.dtype, out.shape);
  V bits = to_bits(ctx, x);
  V positive = ctx.binary(Hlo::And, ctx.compare(Cmp::GT, bits, b.k(0)), ctx.unary(Hlo::Not, b.is_nan(bits)));
  ctx.set_result(ctx.select(b.is_zero(bits), values, ctx.convert(positive, out.dtype)));
}

// hypot(self, other) = sqrt(a^2 + b^2) without overflow: max * sqrt(1 + (min/max)^2);
// inf if either is infinite (even with a NaN), as C's hypot. Computed in float64 where the
// platform has it, so float results round once as CPU's.
void lower_hypot(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType dt = compute_dtype(out.dtype);
  if (dt == DType::Float32 && ctx.has_float64()) dt = DType::Float64;
  Ex e = operands_ex(ctx, out, dt);
  V a = e.un(Hlo::Abs, e.arg(node, 0)), b = e.un(Hlo::Abs, e.arg(node, 1));
  V hi = e.max(a, b), lo = e.min(a, b);
  V ratio = e.div(lo, hi);
  V r = e.mul(hi, e.un(Hlo::Sqrt, e.add(e.k(1.0), e.mul(ratio, ratio))));
  r = e.sel(e.cmp(Cmp::EQ, hi, e.k(0.0)), e.k(0.0), r);
  V inf = e.k(std::numeric_limits<double>::infinity());
  r = e.sel(e.bor(e.cmp(Cmp::EQ, a, inf), e.cmp(Cmp::EQ, b, inf)), inf, r);
  ctx.set_result(ctx.convert(r, out.dtype));
}

LOWERING("aten::copysign.Tensor", lower_copysign);
LOWERING("aten::copysign.Scalar", lower_copysign);
LOWERING("aten::signbit", lower_signbit);
LOWERING("aten::frexp.Tensor", lower_frexp);
LOWERING("aten::nextafter", lower_nextafter, nullptr, kFloatOnly);
LOWERING("aten::heaviside", lower_heaviside);
LOWERING("aten::hypot", lower_hypot, nullptr, kFloatOnly);

}  // namespace
}  // namespace torchtpu
