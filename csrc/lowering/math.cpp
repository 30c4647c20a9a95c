// Elementwise math: float unary functions (exp2, erf, asin, ...), rounding, sign, activations
// (gelu, silu, softplus, elu, ...) and their backward ops, pow, remainder/fmod, lerp,
// addcmul/addcdiv, clamp, fmax/fmin, nan/inf tests, bitwise ops.
// Half-precision inputs are computed in f32 and rounded once, as PyTorch's CPU kernels do.
#include <cmath>
#include <limits>
#include <string>

#include "lowering/common.h"

namespace torchtpu {
namespace {


// ---------------------------------------------------------------------------------------
// Float unary functions: out = f(x) computed in compute_dtype(out).

// x / d for a real d; a complex x is divided part by part, as std::complex / T does (a
// complex division would turn log(0) = -inf + 0i into NaNs).
V divide_by_real(const Ex& e, const V& x, double d) {
  if (!is_complex(e.dt)) return e.div(x, e.k(d));
  DType part = real_part_type(e.dt);
  V divisor = e.c.constant(d, part, e.shape);
  return e.c.make_complex(e.c.binary(Hlo::Divide, e.c.real_part(x), divisor),
                          e.c.binary(Hlo::Divide, e.c.imag_part(x), divisor));
}

// Whether the sign bit of a real value is set (true for -0.0).
V sign_bit(LoweringContext& ctx, const V& x) {
  DType bits = dtype_size(x.type.dtype) == 8 ? DType::Int64 : DType::Int32;
  V as_int = ctx.emit(Hlo::BitcastConvert, {x}, TensorType{x.type.shape, bits});
  return ctx.compare(Cmp::LT, as_int, ctx.constant_int(0, bits, x.type.shape));
}

// The float functions of lower_float_unary, one per aten op.
enum class FloatFn : uint8_t {
  Exp, Exp2, Expm1, Log, Log2, Log10, Log1p, Sqrt, Rsqrt, Reciprocal, Sin, Cos, Tan, Tanh, Atan, Asin, Acos,
  Sinh, Cosh, Asinh, Acosh, Atanh, Erf, Erfc, Erfinv, Lgamma, Sigmoid, Silu, Mish, Hardswish, Hardsigmoid, Frac
};

V float_fn(const Ex& e, FloatFn f, const V& x);

// Complex functions with a branch cut along an axis: XLA's ignore the sign of a zero part on
// the cut, C99 (PyTorch's std::complex) keeps it. They are conjugate-symmetric,
// f(conj z) = conj f(z), so f is computed with a non-negative imaginary part and conjugated
// back; asinh's cut runs along the imaginary axis, and as an odd function
// f(z) = -conj f(-conj z) moves the real part's sign the same way.
V complex_on_cut(const Ex& e, FloatFn f, const V& x) {
  LoweringContext& ctx = e.c;
  V re = ctx.real_part(x), im = ctx.imag_part(x);
  if (f == FloatFn::Asinh) {
    V w = float_fn(e, f, ctx.make_complex(ctx.unary(Hlo::Abs, re), im));
    return ctx.select(sign_bit(ctx, re), ctx.unary(Hlo::Negate, ctx.conj(w)), w);
  }
  V w = float_fn(e, f, ctx.make_complex(re, ctx.unary(Hlo::Abs, im)));
  return ctx.select(sign_bit(ctx, im), ctx.conj(w), w);
}

bool has_cut_on_axis(FloatFn f) {
  return f == FloatFn::Sqrt || f == FloatFn::Asin || f == FloatFn::Acos || f == FloatFn::Acosh || f == FloatFn::Asinh;
}

V float_fn(const Ex& e, FloatFn f, const V& x) {
  const double ln2 = 0.69314718055994530942, ln10 = 2.30258509299404568402;
  if (f == FloatFn::Exp) return e.un(Hlo::Exponential, x);
  if (f == FloatFn::Exp2) return e.c.binary(Hlo::Power, e.k(2.0), x);
  if (f == FloatFn::Expm1) return e.un(Hlo::ExponentialMinusOne, x);
  if (f == FloatFn::Log) return e.un(Hlo::Log, x);
  if (f == FloatFn::Log2) return divide_by_real(e, e.un(Hlo::Log, x), ln2);
  if (f == FloatFn::Log10) return divide_by_real(e, e.un(Hlo::Log, x), ln10);
  if (f == FloatFn::Log1p) return e.un(Hlo::LogPlusOne, x);
  if (f == FloatFn::Sqrt) return e.un(Hlo::Sqrt, x);
  if (f == FloatFn::Rsqrt) return e.un(Hlo::Rsqrt, x);
  if (f == FloatFn::Reciprocal) return e.div(e.k(1.0), x);
  if (f == FloatFn::Sin) return e.un(Hlo::Sine, x);
  if (f == FloatFn::Cos) return e.un(Hlo::Cosine, x);
  if (f == FloatFn::Tan) return e.un(Hlo::Tan, x);
  if (f == FloatFn::Tanh) return e.un(Hlo::Tanh, x);
  if (f == FloatFn::Atan) return is_complex(e.dt) ? e.un(Hlo::ChloAtan, x) : e.c.binary(Hlo::Atan2, x, e.k(1.0));
  if (f == FloatFn::Asin) return e.un(Hlo::ChloAsin, x);
  if (f == FloatFn::Acos) return e.un(Hlo::ChloAcos, x);
  if (f == FloatFn::Sinh) return e.un(Hlo::ChloSinh, x);
  if (f == FloatFn::Cosh) return e.un(Hlo::ChloCosh, x);
  if (f == FloatFn::Asinh) return e.un(Hlo::ChloAsinh, x);
  if (f == FloatFn::Acosh) return e.un(Hlo::ChloAcosh, x);
  if (f == FloatFn::Atanh) return e.un(Hlo::ChloAtanh, x);
  if (f == FloatFn::Erf) return e.un(Hlo::ChloErf, x);
  if (f == FloatFn::Erfc) return e.un(Hlo::ChloErfc, x);
  if (f == FloatFn::Erfinv) return e.un(Hlo::ChloErfInv, x);
  if (f == FloatFn::Lgamma) return e.un(Hlo::ChloLgamma, x);
  if (f == FloatFn::Sigmoid) return e.un(Hlo::Logistic, x);
  if (f == FloatFn::Silu) return e.mul(x, e.un(Hlo::Logistic, x));
  if (f == FloatFn::Mish) {
    // x * tanh(softplus(x)), softplus = log1p(exp(x)) (PyTorch's mish uses threshold 20).
    V sp = e.sel(e.cmp(Cmp::GT, x, e.k(20.0)), x, e.un(Hlo::LogPlusOne, e.un(Hlo::Exponential, x)));
    return e.mul(x, e.un(Hlo::Tanh, sp));
  }
  if (f == FloatFn::Hardswish) return e.div(e.mul(x, e.min(e.max(e.add(x, e.k(3.0)), e.k(0.0)), e.k(6.0))), e.k(6.0));
  if (f == FloatFn::Hardsigmoid) return e.div(e.min(e.max(e.add(x, e.k(3.0)), e.k(0.0)), e.k(6.0)), e.k(6.0));
  if (f == FloatFn::Frac) {
    V t = e.sel(e.cmp(Cmp::LT, x, e.k(0.0)), e.un(Hlo::Ceil, x), e.un(Hlo::Floor, x));
    return e.sub(x, t);
  }
  throw std::logic_error("torchtpu: unknown float function " + std::to_string(static_cast<int>(f)));
}

void lower_float_unary(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V x = ctx.convert(ctx.input(node, 0), e.dt);
  FloatFn f = rule_param<FloatFn>(node);
  V r = is_complex(e.dt) && has_cut_on_axis(f) ? complex_on_cut(e, f, x) : float_fn(e, f, x);
  ctx.set_result(ctx.convert(r, out.dtype));
}

// gelu(self, approximate="none"|"tanh")
V gelu_forward(const Ex& e, const V& x, bool tanh_approx) {
  if (!tanh_approx) {
    V cdf = e.mul(e.k(0.5), e.add(e.k(1.0), e.un(Hlo::ChloErf, e.mul(x, e.k(M_SQRT1_2)))));
    return e.mul(x, cdf);
  }
  const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
  V cube = e.mul(e.mul(x, x), x);
  V inner = e.mul(e.k(beta), e.add(x, e.mul(e.k(kappa), cube)));
  return e.mul(e.mul(e.k(0.5), x), e.add(e.k(1.0), e.un(Hlo::Tanh, inner)));
}

bool approximate_tanh(const Node& node, int arg) {
  return arg < static_cast<int>(node.args.size()) && node.args[arg].kind == Arg::Kind::String &&
         node.args[arg].s == "tanh";
}

void lower_gelu(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V x = ctx.convert(ctx.input(node, 0), e.dt);
  ctx.set_result(ctx.convert(gelu_forward(e, x, approximate_tanh(node, 1)), out.dtype));
}

// gelu_backward(grad_output, self, approximate)
void lower_gelu_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V g = e.arg(node, 0), x = e.arg(node, 1);
  V d;
  if (!approximate_tanh(node, 2)) {
    const double alpha = M_2_SQRTPI * M_SQRT1_2 * 0.5;
    V cdf = e.mul(e.k(0.5), e.add(e.k(1.0), e.un(Hlo::ChloErf, e.mul(x, e.k(M_SQRT1_2)))));
    V pdf = e.mul(e.k(alpha), e.un(Hlo::Exponential, e.mul(e.mul(e.k(-0.5), x), x)));
    d = e.add(cdf, e.mul(x, pdf));
  } else {
    const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
    V sq = e.mul(x, x);
    V cube = e.mul(sq, x);
    V inner = e.mul(e.k(beta), e.add(x, e.mul(e.k(kappa), cube)));
    V t = e.un(Hlo::Tanh, inner);
    V left = e.mul(e.k(0.5), x);
    V right = e.add(e.k(1.0), t);
    V left_d = e.mul(e.k(0.5), right);
    V right_d = e.sub(e.k(1.0), e.mul(t, t));
    V inner_d = e.mul(e.k(beta), e.add(e.k(1.0), e.mul(e.k(3.0 * kappa), sq)));
    d = e.add(left_d, e.mul(e.mul(left, right_d), inner_d));
  }
  ctx.set_result(ctx.convert(e.mul(g, d), out.dtype));
}

// Backward ops of the form grad_input = f(grad, x, scalars...), computed in compute_dtype.
enum class BackwardFn : uint8_t {
  Sigmoid, Tanh, Silu, Mish, Softplus, Hardtanh, LeakyRelu, Elu, Hardswish, Hardsigmoid, Logit
};

void lower_pointwise_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  BackwardFn f = rule_param<BackwardFn>(node);
  V g = e.arg(node, 0);
  V zero = e.k(0.0);
  V r;
  // Complex: grad times the conjugate derivative (PyTorch's convention for holomorphic f).
  if (f == BackwardFn::Sigmoid) {  // (grad, output)
    V y = e.arg(node, 1);
    r = e.mul(g, ctx.conj(e.mul(e.sub(e.k(1.0), y), y)));
  } else if (f == BackwardFn::Tanh) {  // (grad, output)
    V y = e.arg(node, 1);
    r = e.mul(g, ctx.conj(e.sub(e.k(1.0), e.mul(y, y))));
  } else if (f == BackwardFn::Silu) {  // (grad, self)
    V x = e.arg(node, 1);
    V s = e.un(Hlo::Logistic, x);
    r = e.mul(g, e.mul(s, e.add(e.k(1.0), e.mul(x, e.sub(e.k(1.0), s)))));
  } else if (f == BackwardFn::Mish) {  // (grad, self)
    V x = e.arg(node, 1);
    V s = e.un(Hlo::Logistic, x);
    V sp = e.sel(e.cmp(Cmp::GT, x, e.k(20.0)), x, e.un(Hlo::LogPlusOne, e.un(Hlo::Exponential, x)));
    V t = e.un(Hlo::Tanh, sp);
    r = e.mul(g, e.add(t, e.mul(e.mul(x, s), e.sub(e.k(1.0), e.mul(t, t)))));
  } else if (f == BackwardFn::Softplus) {  // (grad, self, beta, threshold)
    V x = e.arg(node, 1), beta = e.arg(node, 2), threshold = e.arg(node, 3);
    V bx = e.mul(x, beta);
    V z = e.un(Hlo::Exponential, bx);
    r = e.sel(e.cmp(Cmp::GT, bx, threshold), g, e.mul(g, e.div(z, e.add(z, e.k(1.0)))));
  } else if (f == BackwardFn::Hardtanh) {  // (grad, self, min_val, max_val)
    V x = e.arg(node, 1), lo = e.arg(node, 2), hi = e.arg(node, 3);
    r = e.sel(e.bor(e.cmp(Cmp::LE, x, lo), e.cmp(Cmp::GE, x, hi)), zero, g);
  } else if (f == BackwardFn::LeakyRelu) {  // (grad, self, negative_slope, self_is_result)
    V x = e.arg(node, 1), slope = e.arg(node, 2);
    r = e.sel(e.cmp(Cmp::GT, x, zero), g, e.mul(g, slope));
  } else if (f == BackwardFn::Elu) {  // (grad, alpha, scale, input_scale, is_result, self_or_result)
    V alpha = e.arg(node, 1), scale = e.arg(node, 2), input_scale = e.arg(node, 3);
    bool is_result = node.args[4].as_bool();
    V x = e.arg(node, 5);
    V neg;
    if (is_result) {
      neg = e.mul(e.mul(g, input_scale), e.add(x, e.mul(alpha, scale)));
    } else {
      neg = e.mul(e.mul(e.mul(g, input_scale), e.mul(alpha, scale)),
                  e.un(Hlo::Exponential, e.mul(x, input_scale)));
    }
    r = e.sel(e.cmp(Cmp::LE, x, zero), neg, e.mul(g, scale));
  } else if (f == BackwardFn::Hardswish) {  // (grad, self)
    V x = e.arg(node, 1);
    // CPU: 0 for x <= -3, grad for x >= 3 (and NaN), grad * (x / 3 + 0.5) between.
    V mid = e.mul(g, e.add(e.div(x, e.k(3.0)), e.k(0.5)));
    r = e.sel(e.cmp(Cmp::LE, x, e.k(-3.0)), zero, e.sel(e.cmp(Cmp::LT, x, e.k(3.0)), mid, g));
  } else if (f == BackwardFn::Hardsigmoid) {  // (grad, self)
    V x = e.arg(node, 1);
    V inside = e.band(e.cmp(Cmp::GT, x, e.k(-3.0)), e.cmp(Cmp::LT, x, e.k(3.0)));
    // CPU multiplies by 1/6 taken in float32, whatever the dtype (float64 included).
    r = e.sel(inside, e.mul(g, e.k(static_cast<double>(1.0f / 6.0f))), zero);
  } else if (f == BackwardFn::Logit) {  // (grad, self, eps?)
    V x = e.arg(node, 1);
    V d = e.div(g, e.mul(x, e.sub(e.k(1.0), x)));
    if (node.args.size() > 2 && !node.args[2].is_none()) {
      double eps = node.args[2].as_double();
      V outside = e.bor(e.cmp(Cmp::LT, x, e.k(eps)), e.cmp(Cmp::GT, x, e.k(1.0 - eps)));
      r = e.sel(outside, zero, d);
    } else {
      V outside = e.bor(e.cmp(Cmp::LT, x, zero), e.cmp(Cmp::GT, x, e.k(1.0)));
      r = e.sel(outside, e.k(NAN), d);
    }
  } else {
    throw std::logic_error("torchtpu: unknown backward function " + std::to_string(static_cast<int>(f)));
  }
  ctx.set_result(ctx.convert(r, out.dtype));
}

// Forward activations with scalar parameters, computed in compute_dtype.
enum class Activation : uint8_t { Softplus, Hardtanh, LeakyRelu, Elu, Logit, Threshold };

void lower_activation(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  Activation f = rule_param<Activation>(node);
  V x = e.arg(node, 0);
  V zero = e.k(0.0);
  V r;
  if (f == Activation::Softplus) {  // (self, beta, threshold)
    V beta = e.arg(node, 1), threshold = e.arg(node, 2);
    V bx = e.mul(x, beta);
    r = e.sel(e.cmp(Cmp::GT, bx, threshold), x,
              e.div(e.un(Hlo::LogPlusOne, e.un(Hlo::Exponential, bx)), beta));
  } else if (f == Activation::Hardtanh) {  // (self, min_val, max_val)
    r = e.min(e.max(x, e.arg(node, 1)), e.arg(node, 2));
  } else if (f == Activation::LeakyRelu) {  // (self, negative_slope)
    r = e.sel(e.cmp(Cmp::GT, x, zero), x, e.mul(x, e.arg(node, 1)));
  } else if (f == Activation::Elu) {  // (self, alpha, scale, input_scale)
    V alpha = e.arg(node, 1), scale = e.arg(node, 2), input_scale = e.arg(node, 3);
    V neg = e.mul(e.mul(e.un(Hlo::ExponentialMinusOne, e.mul(x, input_scale)), alpha), scale);
    r = e.sel(e.cmp(Cmp::GT, x, zero), e.mul(x, scale), neg);
  } else if (f == Activation::Logit) {  // (self, eps?)
    V z = x;
    if (node.args.size() > 1 && !node.args[1].is_none()) {
      double eps = node.args[1].as_double();
      z = e.min(e.max(x, e.k(eps)), e.k(1.0 - eps));
      // PyTorch clamps with x < lo ? lo : x > hi ? hi : x, which keeps NaN.
      z = e.sel(e.isnan(x), x, z);
    }
    r = e.un(Hlo::Log, e.div(z, e.sub(e.k(1.0), z)));
  } else if (f == Activation::Threshold) {  // (self, threshold, value): x <= threshold ? value : x
    r = e.sel(e.cmp(Cmp::LE, x, e.arg(node, 1)), e.arg(node, 2), x);
  } else {
    throw std::logic_error("torchtpu: unknown activation " + std::to_string(static_cast<int>(f)));
  }
  ctx.set_result(ctx.convert(r, out.dtype));
}

// ---------------------------------------------------------------------------------------
// Ops that also take integer (and bool) inputs.
enum class IntUnary : uint8_t { Abs, Neg, Sign, Sgn, Relu, Floor, Ceil, Round, Trunc };

// abs, neg and sgn of a complex value (abs is real).
V complex_unary(LoweringContext& ctx, IntUnary f, const V& x) {
  if (f == IntUnary::Neg) return ctx.unary(Hlo::Negate, x);
  V magnitude = ctx.emit(Hlo::Abs, {x}, TensorType{x.type.shape, real_part_type(x.type.dtype)});
  if (f == IntUnary::Abs) return magnitude;
  if (f != IntUnary::Sgn) throw std::logic_error("torchtpu: no complex unary " + std::to_string(static_cast<int>(f)));
  // x / |x|, and 0 where x is 0 (PyTorch's sgn).
  V zero = ctx.constant(0, magnitude.type.dtype, x.type.shape);
  V is_zero = ctx.compare(Cmp::EQ, magnitude, zero);
  V unit = ctx.binary(Hlo::Divide, x, ctx.make_complex(magnitude, zero));
  return ctx.select(is_zero, ctx.constant(0, x.type.dtype, x.type.shape), unit);
}

void lower_int_unary(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  IntUnary f = rule_param<IntUnary>(node);
  V x0 = ctx.input(node, 0);
  if (is_complex(x0.type.dtype)) {
    ctx.set_result(complex_unary(ctx, f, x0));
    return;
  }
  if (!is_floating(out.dtype)) {
    V x = ctx.convert(x0, out.dtype);
    Ex e = make_ex(ctx, out.dtype, out.shape);
    if (f == IntUnary::Abs) {
      ctx.set_result(out.dtype == DType::Bool || out.dtype == DType::UInt8 ? x : e.un(Hlo::Abs, x));
    } else if (f == IntUnary::Neg) {
      ctx.set_result(e.un(Hlo::Negate, x));
    } else if (f == IntUnary::Sign || f == IntUnary::Sgn) {
      if (out.dtype == DType::Bool) ctx.set_result(x);
      else if (out.dtype == DType::UInt8) ctx.set_result(ctx.convert(e.cmp(Cmp::GT, x, e.k(0)), out.dtype));
      else ctx.set_result(e.un(Hlo::Sign, x));
    } else if (f == IntUnary::Relu) {
      ctx.set_result(out.dtype == DType::UInt8 ? x : e.max(x, e.k(0)));
    } else {  // floor, ceil, round, trunc: identity on integers
      ctx.set_result(x);
    }
    return;
  }
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V x = ctx.convert(x0, e.dt);
  V r;
  if (f == IntUnary::Abs) r = e.un(Hlo::Abs, x);
  else if (f == IntUnary::Neg) r = e.un(Hlo::Negate, x);
  else if (f == IntUnary::Sign || f == IntUnary::Sgn) r = e.sel(e.isnan(x), e.k(0.0), e.un(Hlo::Sign, x));
  else if (f == IntUnary::Relu) r = e.sel(e.cmp(Cmp::GT, x, e.k(0.0)), x, e.sel(e.isnan(x), x, e.k(0.0)));
  else if (f == IntUnary::Floor) r = e.un(Hlo::Floor, x);
  else if (f == IntUnary::Ceil) r = e.un(Hlo::Ceil, x);
  else if (f == IntUnary::Round) r = e.un(Hlo::RoundNearestEven, x);
  else if (f == IntUnary::Trunc) r = e.sel(e.cmp(Cmp::LT, x, e.k(0.0)), e.un(Hlo::Ceil, x), e.un(Hlo::Floor, x));
  else throw std::logic_error("torchtpu: unknown unary " + std::to_string(static_cast<int>(f)));
  ctx.set_result(ctx.convert(r, out.dtype));
}

// round.decimals(self, decimals)
void lower_round_decimals(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  int64_t decimals = node.args[1].as_int();
  if (!is_floating(out.dtype)) {
    ctx.set_result(ctx.convert(ctx.input(node, 0), out.dtype));
    return;
  }
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V x = ctx.convert(ctx.input(node, 0), e.dt);
  bool neg = decimals < 0;
  double p = std::pow(10.0, static_cast<double>(neg ? -decimals : decimals));
  if (e.dt == DType::Float32) p = static_cast<float>(p);
  V ten = e.k(p);
  V r = neg ? e.mul(e.un(Hlo::RoundNearestEven, e.div(x, ten)), ten)
            : e.div(e.un(Hlo::RoundNearestEven, e.mul(x, ten)), ten);
  ctx.set_result(ctx.convert(r, out.dtype));
}

// _efficientzerotensor(size, dtype, ...): plain zeros (sgn's derivative for real inputs).
void lower_zero_tensor(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  ctx.set_result(ctx.constant(0, out.dtype, out.shape));
}

// ---------------------------------------------------------------------------------------
// Binary ops

// pow.Tensor_Tensor(self, exponent) / pow.Tensor_Scalar(self, exponent) / pow.Scalar(self, exponent)
void lower_pow(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  if (is_complex(out.dtype)) {
    Ex e = make_ex(ctx, out.dtype, out.shape);
    ctx.set_result(ctx.binary(Hlo::Power, e.arg(node, 0), e.arg(node, 1)));
    return;
  }
  if (!is_floating(out.dtype)) {
    if (out.dtype == DType::Bool) {
      // bool ** bool: x or not y.
      Ex e = make_ex(ctx, DType::Bool, out.shape);
      V a = e.arg(node, 0), b = e.arg(node, 1);
      ctx.set_result(e.bor(a, e.un(Hlo::Not, b)));
      return;
    }
    Ex e = make_ex(ctx, out.dtype, out.shape);
    V a = e.arg(node, 0), b = e.arg(node, 1);
    if (out.dtype == DType::UInt8) {
      // Square and multiply over the exponent's 8 bits, wrapping mod 256 as CPU does (a negative
      // int8 exponent is converted to uint8 first: 5 ** -1 is 5 ** 255 = 205). XLA's power gives 0.
      V result = e.k(1), base = a, zero = e.k(0);
      for (int bit = 0; bit < 8; ++bit) {
        V set = e.cmp(Cmp::NE, ctx.binary(Hlo::And, b, e.k(1 << bit)), zero);
        result = e.sel(set, e.mul(result, base), result);
        base = e.mul(base, base);
      }
      ctx.set_result(result);
      return;
    }
    V p = ctx.binary(Hlo::Power, a, b);
    if (is_signed_integer(out.dtype)) {
      // Negative exponents: 1 for base 1, +-1 for base -1, else 0 (PyTorch's powi).
      V zero = e.k(0), one = e.k(1), minus_one = e.k(-1);
      V odd = e.cmp(Cmp::NE, ctx.binary(Hlo::And, b, one), zero);
      V neg_result = e.sel(e.cmp(Cmp::EQ, a, one), one,
                           e.sel(e.cmp(Cmp::EQ, a, minus_one), e.sel(odd, minus_one, one), zero));
      p = e.sel(e.cmp(Cmp::LT, b, zero), neg_result, p);
    }
    ctx.set_result(p);
    return;
  }
  Ex e = operands_ex(ctx, out);
  V a = e.arg(node, 0), b = e.arg(node, 1);
  ctx.set_result(ctx.convert(ctx.binary(Hlo::Power, a, b), out.dtype));
}

// atan2(self, other)
void lower_atan2(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = operands_ex(ctx, out);
  ctx.set_result(ctx.convert(ctx.binary(Hlo::Atan2, e.arg(node, 0), e.arg(node, 1)), out.dtype));
}

enum class LogBase : uint8_t { E, Two };

// logaddexp(a, b) = max + log1p(exp(-|a - b|)); logaddexp2 in base 2. Equal infinities
// give that infinity (the difference would be NaN).
void lower_logaddexp(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = operands_ex(ctx, out);
  V a = e.arg(node, 0), b = e.arg(node, 1);
  V hi = e.max(a, b);
  V d = e.un(Hlo::Negate, e.un(Hlo::Abs, e.sub(a, b)));
  V r;
  if (rule_param<LogBase>(node) == LogBase::Two) {
    const double ln2 = M_LN2;
    V t = e.un(Hlo::LogPlusOne, e.un(Hlo::Exponential, e.mul(d, e.k(ln2))));
    r = e.add(hi, e.div(t, e.k(ln2)));
  } else {
    r = e.add(hi, e.un(Hlo::LogPlusOne, e.un(Hlo::Exponential, d)));
  }
  V same_inf = e.band(e.cmp(Cmp::EQ, a, b), e.cmp(Cmp::EQ, e.un(Hlo::Abs, a), e.k(INFINITY)));
  r = e.sel(same_inf, a, r);
  ctx.set_result(ctx.convert(r, out.dtype));
}

// log_sigmoid_forward(self) -> (output, buffer): log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)).
// The buffer is CPU's scratch for its backward; torchtpu's backward recomputes from x, so
// it is filled with zeros of the type the meta kernel gives.
void lower_log_sigmoid_forward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V x = e.arg(node, 0);
  V r = e.sub(e.min(x, e.k(0.0)),
              e.un(Hlo::LogPlusOne, e.un(Hlo::Exponential,
                                                  e.un(Hlo::Negate, e.un(Hlo::Abs, x)))));
  const TensorType& buffer = node.outputs.at(1);
  ctx.set_results({ctx.convert(r, out.dtype), ctx.constant(0.0, buffer.dtype, buffer.shape)});
}

// log_sigmoid_backward(grad_output, self, buffer) = grad * sigmoid(-x).
void lower_log_sigmoid_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V g = e.arg(node, 0), x = e.arg(node, 1);
  ctx.set_result(ctx.convert(e.mul(g, e.un(Hlo::Logistic, e.un(Hlo::Negate, x))), out.dtype));
}

// remainder (Python sign: result has the divisor's sign) and fmod (C sign).
enum class Modulo : uint8_t { Remainder, Fmod };

void lower_remainder(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = operands_ex(ctx, out);
  V a = e.arg(node, 0), b = e.arg(node, 1);
  if (!is_floating(out.dtype)) check_integer_divisor(ctx, node, 1, b);
  V mod = ctx.binary(Hlo::Remainder, a, b);
  if (rule_param<Modulo>(node) == Modulo::Remainder) {
    V zero = e.k(0);
    V fix = e.band(e.cmp(Cmp::NE, mod, zero), e.cmp(Cmp::NE, e.cmp(Cmp::LT, b, zero), e.cmp(Cmp::LT, mod, zero)));
    mod = e.sel(fix, e.add(mod, b), mod);
  }
  ctx.set_result(ctx.convert(mod, out.dtype));
}

// gcd / lcm of integers: CPU's Euclid loop on |a| and |b| (calc_gcd), run for every element
// at once until each one's divisor is 0; lcm is |a / g * b| (0 where g is 0). CPU computes
// 8- and 16-bit values in C++'s int (integer promotion) and narrows the result, so they are
// computed in int32 here too: lcm's product may exceed the narrow type before its abs.
// `narrow`: the type CPU stores |a| and |b| in (abs(-128) stays -128 in int8, as in C++).
V gcd_of(const Ex& e, V a, V b, DType narrow) {
  LoweringContext& ctx = e.c;
  V zero = e.k(0), one = e.k(1);
  auto magnitude = [&](const V& x) {
    if (narrow == DType::UInt8) return x;
    return ctx.convert(ctx.convert(e.un(Hlo::Abs, x), narrow), e.dt);
  };
  std::vector<V> init{magnitude(a), magnitude(b)};
  std::vector<V> done = ctx.while_loop(
      init, [&](const std::vector<V>& s) { return any_true(ctx, e.cmp(Cmp::NE, s[0], zero)); },
      [&](const std::vector<V>& s) {
        V going = e.cmp(Cmp::NE, s[0], zero);
        V r = ctx.binary(Hlo::Remainder, s[1], e.sel(going, s[0], one));
        return std::vector<V>{e.sel(going, r, s[0]), e.sel(going, s[0], s[1])};
      });
  return done[1];
}

enum class GcdLcm : uint8_t { Gcd, Lcm };

void lower_gcd_lcm(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  bool narrow = out.dtype == DType::UInt8 || out.dtype == DType::Int8 || out.dtype == DType::Int16;
  DType dt = narrow ? DType::Int32 : out.dtype;
  Ex e = make_ex(ctx, dt, out.shape);
  V a = ctx.convert(tensor_or_scalar(ctx, node, 0, out.dtype, out.shape), dt);
  V b = ctx.convert(tensor_or_scalar(ctx, node, 1, out.dtype, out.shape), dt);
  V g = gcd_of(e, a, b, out.dtype);
  if (rule_param<GcdLcm>(node) == GcdLcm::Gcd) {
    ctx.set_result(ctx.convert(g, out.dtype));
    return;
  }
  V zero = e.k(0);
  V g_zero = e.cmp(Cmp::EQ, g, zero);
  V lcm = e.un(Hlo::Abs, e.mul(e.div(a, e.sel(g_zero, e.k(1), g)), b));
  ctx.set_result(ctx.convert(e.sel(g_zero, zero, lcm), out.dtype));
}

// fmax/fmin: NaN only when both are NaN.
void lower_fmax_fmin(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, out.dtype, out.shape);
  V a = e.arg(node, 0), b = e.arg(node, 1);
  bool is_max = rule_param<Extremum>(node) == Extremum::Max;
  V m = is_max ? e.max(a, b) : e.min(a, b);
  if (is_floating(out.dtype)) m = e.sel(e.isnan(a), b, e.sel(e.isnan(b), a, m));
  ctx.set_result(m);
}

// lerp.Scalar / lerp.Tensor (self, end, weight), PyTorch's two-sided formula.
void lower_lerp(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V a = e.arg(node, 0), b = e.arg(node, 1), w = e.arg(node, 2);
  V diff = e.sub(b, a);
  V small = e.cmp(Cmp::LT, e.un(Hlo::Abs, w), e.k(0.5));
  V r = e.sel(small, e.add(a, e.mul(w, diff)), e.sub(b, e.mul(diff, e.sub(e.k(1.0), w))));
  ctx.set_result(ctx.convert(r, out.dtype));
}

// addcmul / addcdiv (self, tensor1, tensor2, value)
enum class Addc : uint8_t { Mul, Div };

void lower_addc(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V s = e.arg(node, 0), t1 = e.arg(node, 1), t2 = e.arg(node, 2), v = e.arg(node, 3);
  V r = rule_param<Addc>(node) == Addc::Mul ? e.add(s, e.mul(e.mul(v, t1), t2)) : e.add(s, e.mul(v, e.div(t1, t2)));
  ctx.set_result(ctx.convert(r, out.dtype));
}

// clamp(self, min?, max?) with Scalar or Tensor bounds; clamp_min / clamp_max.
enum class Clamp : uint8_t { Both, Min, Max };

void lower_clamp(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, out.dtype, out.shape);
  Clamp f = rule_param<Clamp>(node);
  V x = e.arg(node, 0);
  V r = x;
  auto present = [&](int i) { return i < static_cast<int>(node.args.size()) && !node.args[i].is_none(); };
  if (f == Clamp::Both) {
    if (present(1)) r = e.max(r, e.arg(node, 1));
    if (present(2)) r = e.min(r, e.arg(node, 2));
  } else if (f == Clamp::Min) {
    r = e.max(r, e.arg(node, 1));
  } else {
    r = e.min(r, e.arg(node, 1));
  }
  if (is_floating(out.dtype)) r = e.sel(e.isnan(x), x, r);  // a NaN input stays NaN
  ctx.set_result(r);
}

// isnan / isinf / isfinite / isposinf / isneginf
enum class FloatClass : uint8_t { IsNan, IsInf, IsFinite, IsPosInf, IsNegInf };

void lower_float_class(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  FloatClass f = rule_param<FloatClass>(node);
  V x = ctx.input(node, 0);
  if (is_complex(x.type.dtype)) {
    // Either part NaN / infinite; finite when both parts are.
    Ex e = make_ex(ctx, real_part_type(x.type.dtype), out.shape);
    V re = ctx.real_part(x), im = ctx.imag_part(x);
    const double inf = std::numeric_limits<double>::infinity();
    auto inf_part = [&](const V& p) { return e.cmp(Cmp::EQ, e.un(Hlo::Abs, p), e.k(inf)); };
    auto finite_part = [&](const V& p) { return e.cmp(Cmp::LT, e.un(Hlo::Abs, p), e.k(inf)); };
    if (f == FloatClass::IsNan) ctx.set_result(e.bor(e.isnan(re), e.isnan(im)));
    else if (f == FloatClass::IsInf) ctx.set_result(e.bor(inf_part(re), inf_part(im)));
    else ctx.set_result(e.band(finite_part(re), finite_part(im)));  // isfinite
    return;
  }
  if (!is_floating(x.type.dtype)) {
    ctx.set_result(ctx.constant(f == FloatClass::IsFinite ? 1 : 0, DType::Bool, out.shape));
    return;
  }
  Ex e = make_ex(ctx, x.type.dtype, out.shape);
  const double inf = std::numeric_limits<double>::infinity();
  V r;
  if (f == FloatClass::IsNan) r = e.isnan(x);
  else if (f == FloatClass::IsInf) r = e.cmp(Cmp::EQ, e.un(Hlo::Abs, x), e.k(inf));
  else if (f == FloatClass::IsPosInf) r = e.cmp(Cmp::EQ, x, e.k(inf));
  else if (f == FloatClass::IsNegInf) r = e.cmp(Cmp::EQ, x, e.k(-inf));
  else r = e.cmp(Cmp::LT, e.un(Hlo::Abs, x), e.k(inf));  // isfinite (false for NaN)
  ctx.set_result(r);
}

double largest_finite(DType dtype) {
  switch (dtype) {
    case DType::Float16: return 65504.0;
    case DType::BFloat16: return 3.3895313892515355e38;
    case DType::Float64: return std::numeric_limits<double>::max();
    default: return std::numeric_limits<float>::max();
  }
}

// nan_to_num(self, nan?, posinf?, neginf?)
void lower_nan_to_num(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  if (!is_floating(out.dtype)) {
    ctx.set_result(ctx.convert(x, out.dtype));
    return;
  }
  Ex e = make_ex(ctx, out.dtype, out.shape);
  auto value = [&](int i, double fallback) {
    return i < static_cast<int>(node.args.size()) && !node.args[i].is_none() ? node.args[i].as_double() : fallback;
  };
  double big = largest_finite(out.dtype);
  double nan = value(1, 0.0), posinf = value(2, big), neginf = value(3, -big);
  const double inf = std::numeric_limits<double>::infinity();
  V r = e.sel(e.cmp(Cmp::EQ, x, e.k(inf)), e.k(posinf), x);
  r = e.sel(e.cmp(Cmp::EQ, x, e.k(-inf)), e.k(neginf), r);
  r = e.sel(e.isnan(x), e.k(nan), r);
  ctx.set_result(r);
}

// bitwise_and/or/xor (.Tensor, .Scalar, .Scalar_Tensor) and bitwise_not.
void lower_bitwise(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, out.dtype, out.shape);
  Hlo op = rule_param<Hlo>(node);
  if (op == Hlo::Not) {
    ctx.set_result(e.un(Hlo::Not, e.arg(node, 0)));
    return;
  }
  ctx.set_result(ctx.emit(op, {e.arg(node, 0), e.arg(node, 1)}, TensorType{out.shape, out.dtype}));
}

#define FLOAT_UNARY(name, fn) LOWERING("aten::" #name, lower_float_unary, FloatFn::fn)
// The same functions of complex values (StableHLO and CHLO take complex operands for these).
#define COMPLEX_FLOAT_UNARY(name, fn) LOWERING("aten::" #name, lower_float_unary, FloatFn::fn, kTakesComplex)
COMPLEX_FLOAT_UNARY(exp, Exp);
COMPLEX_FLOAT_UNARY(exp2, Exp2);
COMPLEX_FLOAT_UNARY(expm1, Expm1);
COMPLEX_FLOAT_UNARY(log, Log);
COMPLEX_FLOAT_UNARY(log2, Log2);
COMPLEX_FLOAT_UNARY(log10, Log10);
COMPLEX_FLOAT_UNARY(log1p, Log1p);
COMPLEX_FLOAT_UNARY(sqrt, Sqrt);
COMPLEX_FLOAT_UNARY(rsqrt, Rsqrt);
COMPLEX_FLOAT_UNARY(reciprocal, Reciprocal);
COMPLEX_FLOAT_UNARY(sin, Sin);
COMPLEX_FLOAT_UNARY(cos, Cos);
COMPLEX_FLOAT_UNARY(tan, Tan);
COMPLEX_FLOAT_UNARY(tanh, Tanh);
COMPLEX_FLOAT_UNARY(atan, Atan);
COMPLEX_FLOAT_UNARY(asin, Asin);
COMPLEX_FLOAT_UNARY(acos, Acos);
COMPLEX_FLOAT_UNARY(sinh, Sinh);
COMPLEX_FLOAT_UNARY(cosh, Cosh);
COMPLEX_FLOAT_UNARY(asinh, Asinh);
COMPLEX_FLOAT_UNARY(acosh, Acosh);
COMPLEX_FLOAT_UNARY(atanh, Atanh);
FLOAT_UNARY(erf, Erf);
FLOAT_UNARY(erfc, Erfc);
FLOAT_UNARY(erfinv, Erfinv);
FLOAT_UNARY(lgamma, Lgamma);
COMPLEX_FLOAT_UNARY(sigmoid, Sigmoid);
LOWERING("aten::silu", lower_float_unary, FloatFn::Silu, RuleFlags{.complex = true, .refuses = kBoolDTypes | kIntegerDTypes});
LOWERING("aten::mish", lower_float_unary, FloatFn::Mish, kFloatOnly);
LOWERING("aten::hardswish", lower_float_unary, FloatFn::Hardswish, kFloatOnly);
LOWERING("aten::hardsigmoid", lower_float_unary, FloatFn::Hardsigmoid, kFloatOnly);
LOWERING("aten::frac", lower_float_unary, FloatFn::Frac, kFloatOnly);
#undef FLOAT_UNARY
#undef COMPLEX_FLOAT_UNARY

LOWERING("aten::gelu", lower_gelu, nullptr, kFloatOnly);
LOWERING("aten::gelu_backward", lower_gelu_backward);
LOWERING("aten::sigmoid_backward", lower_pointwise_backward, BackwardFn::Sigmoid, kTakesComplex);
LOWERING("aten::tanh_backward", lower_pointwise_backward, BackwardFn::Tanh, kTakesComplex);
LOWERING("aten::silu_backward", lower_pointwise_backward, BackwardFn::Silu);
LOWERING("aten::mish_backward", lower_pointwise_backward, BackwardFn::Mish);
LOWERING("aten::softplus_backward", lower_pointwise_backward, BackwardFn::Softplus);
LOWERING("aten::hardtanh_backward", lower_pointwise_backward, BackwardFn::Hardtanh);
LOWERING("aten::leaky_relu_backward", lower_pointwise_backward, BackwardFn::LeakyRelu);
LOWERING("aten::elu_backward", lower_pointwise_backward, BackwardFn::Elu);
LOWERING("aten::hardswish_backward", lower_pointwise_backward, BackwardFn::Hardswish);
LOWERING("aten::hardsigmoid_backward", lower_pointwise_backward, BackwardFn::Hardsigmoid);
LOWERING("aten::logit_backward", lower_pointwise_backward, BackwardFn::Logit);
LOWERING("aten::softplus", lower_activation, Activation::Softplus, kFloatOnly);
LOWERING("aten::hardtanh", lower_activation, Activation::Hardtanh);
LOWERING("aten::leaky_relu", lower_activation, Activation::LeakyRelu);
LOWERING("aten::elu", lower_activation, Activation::Elu);
LOWERING("aten::logit", lower_activation, Activation::Logit);
LOWERING("aten::threshold", lower_activation, Activation::Threshold, kNoBool);

LOWERING("aten::abs", lower_int_unary, IntUnary::Abs, kComplexNoBool);
LOWERING("aten::neg", lower_int_unary, IntUnary::Neg, kTakesComplex);
LOWERING("aten::sign", lower_int_unary, IntUnary::Sign);
LOWERING("aten::sgn", lower_int_unary, IntUnary::Sgn, kTakesComplex);
LOWERING("aten::relu", lower_int_unary, IntUnary::Relu, kNoBool);
LOWERING("aten::floor", lower_int_unary, IntUnary::Floor, kNoBool);
LOWERING("aten::ceil", lower_int_unary, IntUnary::Ceil, kNoBool);
LOWERING("aten::round", lower_int_unary, IntUnary::Round, kNoBool);
LOWERING("aten::trunc", lower_int_unary, IntUnary::Trunc, kNoBool);
LOWERING("aten::round.decimals", lower_round_decimals, nullptr, kFloatOnly);
LOWERING("aten::_efficientzerotensor", lower_zero_tensor);

// pow computes in its arguments' promoted dtype, and CPU refuses bool there: pow of two bools
// raises although its meta kernel gives int64 (bool ** 2 is an int64 pow and runs).
// An integer base to a negative Python int raises on CPU ("Integers to negative integer powers
// are not allowed"); a negative exponent tensor computes.
DTypeSet pow_refuses(const std::vector<Arg>& args) {
  return args.size() > 1 && args[1].kind == Arg::Kind::Int && args[1].i < 0 ? kIntegerDTypes : 0;
}
constexpr RuleFlags kPow{.complex = true, .refuses = kBoolDTypes, .judged_on = Judged::Promoted};
constexpr RuleFlags kPowScalar{.complex = true, .refuses = kBoolDTypes, .judged_on = Judged::Promoted,
                               .refuses_for = pow_refuses};
LOWERING("aten::pow.Tensor_Tensor", lower_pow, nullptr, kPow);
LOWERING("aten::pow.Tensor_Scalar", lower_pow, nullptr, kPowScalar);
LOWERING("aten::pow.Scalar", lower_pow, nullptr, kPow);
LOWERING("aten::atan2", lower_atan2);
LOWERING("aten::logaddexp", lower_logaddexp, LogBase::E, kFloatOnly);
LOWERING("aten::logaddexp2", lower_logaddexp, LogBase::Two, kFloatOnly);
LOWERING("aten::log_sigmoid_forward", lower_log_sigmoid_forward, nullptr, kFloatOnly);
LOWERING("aten::log_sigmoid_backward", lower_log_sigmoid_backward);
LOWERING("aten::remainder.Tensor", lower_remainder, Modulo::Remainder, kNoBool);
LOWERING("aten::remainder.Scalar", lower_remainder, Modulo::Remainder, kNoBool);
LOWERING("aten::remainder.Scalar_Tensor", lower_remainder, Modulo::Remainder, kNoBool);
LOWERING("aten::fmod.Tensor", lower_remainder, Modulo::Fmod, kNoBool);
LOWERING("aten::fmod.Scalar", lower_remainder, Modulo::Fmod, kNoBool);
LOWERING("aten::gcd", lower_gcd_lcm, GcdLcm::Gcd, kIntegerOnly);
LOWERING("aten::lcm", lower_gcd_lcm, GcdLcm::Lcm, kIntegerOnly);
LOWERING("aten::fmax", lower_fmax_fmin, Extremum::Max);
LOWERING("aten::fmin", lower_fmax_fmin, Extremum::Min);
LOWERING("aten::lerp.Scalar", lower_lerp, nullptr, kFloatOnly);
LOWERING("aten::lerp.Tensor", lower_lerp, nullptr, kFloatOnly);
LOWERING("aten::addcmul", lower_addc, Addc::Mul, kComplexNoBool);
LOWERING("aten::addcdiv", lower_addc, Addc::Div, kTakesComplex);
LOWERING("aten::clamp", lower_clamp, Clamp::Both, kNoBool);
LOWERING("aten::clamp.Tensor", lower_clamp, Clamp::Both, kNoBool);
LOWERING("aten::clamp_min", lower_clamp, Clamp::Min, kNoBool);
LOWERING("aten::clamp_min.Tensor", lower_clamp, Clamp::Min, kNoBool);
LOWERING("aten::clamp_max", lower_clamp, Clamp::Max, kNoBool);
LOWERING("aten::clamp_max.Tensor", lower_clamp, Clamp::Max, kNoBool);
LOWERING("aten::isnan", lower_float_class, FloatClass::IsNan, kTakesComplex);
LOWERING("aten::isinf", lower_float_class, FloatClass::IsInf, kTakesComplex);
LOWERING("aten::isfinite", lower_float_class, FloatClass::IsFinite, kTakesComplex);
LOWERING("aten::isposinf", lower_float_class, FloatClass::IsPosInf);
LOWERING("aten::isneginf", lower_float_class, FloatClass::IsNegInf);
LOWERING("aten::nan_to_num", lower_nan_to_num);
LOWERING("aten::bitwise_and.Tensor", lower_bitwise, Hlo::And, kIntegerOrBool);
LOWERING("aten::bitwise_and.Scalar", lower_bitwise, Hlo::And, kIntegerOrBool);
LOWERING("aten::bitwise_and.Scalar_Tensor", lower_bitwise, Hlo::And, kIntegerOrBool);
LOWERING("aten::bitwise_or.Tensor", lower_bitwise, Hlo::Or, kIntegerOrBool);
LOWERING("aten::bitwise_or.Scalar", lower_bitwise, Hlo::Or, kIntegerOrBool);
LOWERING("aten::bitwise_or.Scalar_Tensor", lower_bitwise, Hlo::Or, kIntegerOrBool);
LOWERING("aten::bitwise_xor.Tensor", lower_bitwise, Hlo::Xor, kIntegerOrBool);
LOWERING("aten::bitwise_xor.Scalar", lower_bitwise, Hlo::Xor, kIntegerOrBool);
LOWERING("aten::bitwise_xor.Scalar_Tensor", lower_bitwise, Hlo::Xor, kIntegerOrBool);
LOWERING("aten::bitwise_not", lower_bitwise, Hlo::Not, kIntegerOrBool);

}  // namespace
}  // namespace torchtpu
