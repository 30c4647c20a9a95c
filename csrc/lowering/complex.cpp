// Complex numbers: conjugation, the real <-> complex views functionalization turns into
// copies (view_as_real / view_as_complex), building complex values (complex, polar) and
// angle. Elementwise math on complex values lives with its real siblings (kTakesComplex).
#include <cmath>

#include "lowering/common.h"

namespace torchtpu {
namespace {

// _conj_physical(self), _conj_copy(self): the conjugate, materialized.
void lower_conj(LoweringContext& ctx, const Node& node) { ctx.set_result(ctx.conj(ctx.input(node, 0))); }

// _neg_view_copy(self): the negation a neg-bit view stands for.
void lower_neg_view(LoweringContext& ctx, const Node& node) {
  ctx.set_result(ctx.unary(Hlo::Negate, ctx.input(node, 0)));
}

// view_as_real_copy(self): complex [..] -> real [.., 2] holding (real, imag).
void lower_view_as_real(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  std::vector<int64_t> shape = x.type.shape;
  shape.push_back(1);
  V re = ctx.reshape(ctx.real_part(x), shape);
  V im = ctx.reshape(ctx.imag_part(x), shape);
  ctx.set_result(ctx.concatenate({re, im}, x.type.rank()));
}

// view_as_complex_copy(self): real [.., 2] -> complex [..].
void lower_view_as_complex(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  int64_t last = x.type.rank() - 1;
  std::vector<int64_t> start(x.type.rank(), 0), limit = x.type.shape, strides(x.type.rank(), 1);
  std::vector<int64_t> shape(x.type.shape.begin(), x.type.shape.end() - 1);
  limit[last] = 1;
  V re = ctx.reshape(ctx.slice(x, start, limit, strides), shape);
  start[last] = 1;
  limit[last] = 2;
  V im = ctx.reshape(ctx.slice(x, start, limit, strides), shape);
  ctx.set_result(ctx.make_complex(re, im));
}

enum class MakeComplex : uint8_t { FromParts, Polar };

// complex(real, imag) and polar(abs, angle): the parts broadcast to the output's shape.
void lower_make_complex(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType part = real_part_type(out.dtype);
  V a = to_type(ctx, ctx.input(node, 0), part, out.shape);
  V b = to_type(ctx, ctx.input(node, 1), part, out.shape);
  if (rule_param<MakeComplex>(node) == MakeComplex::Polar) {
    V magnitude = a;
    a = ctx.binary(Hlo::Multiply, magnitude, ctx.unary(Hlo::Cosine, b));
    b = ctx.binary(Hlo::Multiply, magnitude, ctx.unary(Hlo::Sine, b));
  }
  ctx.set_result(ctx.make_complex(a, b));
}

// angle(self): atan2(imag, real) for complex values; for real ones pi below zero, else 0
// (NaN stays NaN), as PyTorch's CPU kernel does.
void lower_angle(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  if (is_complex(x.type.dtype)) {
    V r = ctx.binary(Hlo::Atan2, ctx.imag_part(x), ctx.real_part(x));
    ctx.set_result(ctx.convert(r, out.dtype));
    return;
  }
  DType compute = out.dtype == DType::Float64 ? DType::Float64 : DType::Float32;
  V v = ctx.convert(x, compute);
  V zero = ctx.constant(0, compute, out.shape);
  V r = ctx.select(ctx.compare(Cmp::LT, v, zero), ctx.constant(M_PI, compute, out.shape), zero);
  r = ctx.select(ctx.compare(Cmp::NE, v, v), v, r);
  ctx.set_result(ctx.convert(r, out.dtype));
}

LOWERING("aten::_conj_physical", lower_conj, nullptr, kTakesComplex);
LOWERING("aten::_conj_copy", lower_conj, nullptr, kTakesComplex);
LOWERING("aten::_neg_view_copy", lower_neg_view, nullptr, kTakesComplex);
LOWERING("aten::view_as_real_copy", lower_view_as_real, nullptr, kTakesComplex);
LOWERING("aten::view_as_complex_copy", lower_view_as_complex, nullptr, kTakesComplex);
LOWERING("aten::complex", lower_make_complex, MakeComplex::FromParts, kTakesComplex);
LOWERING("aten::polar", lower_make_complex, MakeComplex::Polar, kTakesComplex);
LOWERING("aten::angle", lower_angle, nullptr, kTakesComplex);

}  // namespace
}  // namespace torchtpu
