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
  return e.c.make_complex(e.c.binary("stablehlo.divide", e.c.real_part(x), divisor),
                          e.c.binary("stablehlo.divide", e.c.imag_part(x), divisor));
}

// Whether the sign bit of a real value is set (true for -0.0).
V sign_bit(LoweringContext& ctx, const V& x) {
  DType bits = dtype_size(x.type.dtype) == 8 ? DType::Int64 : DType::Int32;
  V as_int = ctx.emit("stablehlo.bitcast_convert", {x}, TensorType{x.type.shape, bits});
  return ctx.compare("LT", as_int, ctx.constant_int(0, bits, x.type.shape));
}

V float_fn(const Ex& e, const std::string& f, const V& x);

// Complex functions with a branch cut along an axis: XLA's ignore the sign of a zero part on
// the cut, C99 (PyTorch's std::complex) keeps it. They are conjugate-symmetric,
// f(conj z) = conj f(z), so f is computed with a non-negative imaginary part and conjugated
// back; asinh's cut runs along the imaginary axis, and as an odd function
// f(z) = -conj f(-conj z) moves the real part's sign the same way.
V complex_on_cut(const Ex& e, const std::string& f, const V& x) {
  LoweringContext& ctx = e.c;
  V re = ctx.real_part(x), im = ctx.imag_part(x);
  if (f == "asinh") {
    V w = float_fn(e, f, ctx.make_complex(ctx.unary("stablehlo.abs", re), im));
    return ctx.select(sign_bit(ctx, re), ctx.unary("stablehlo.negate", ctx.conj(w)), w);
  }
  V w = float_fn(e, f, ctx.make_complex(re, ctx.unary("stablehlo.abs", im)));
  return ctx.select(sign_bit(ctx, im), ctx.conj(w), w);
}

bool has_cut_on_axis(const std::string& f) {
  return f == "sqrt" || f == "asin" || f == "acos" || f == "acosh" || f == "asinh";
}

V float_fn(const Ex& e, const std::string& f, const V& x) {
  const double ln2 = 0.69314718055994530942, ln10 = 2.30258509299404568402;
  if (f == "exp") return e.un("stablehlo.exponential", x);
  if (f == "exp2") return e.c.binary("stablehlo.power", e.k(2.0), x);
  if (f == "expm1") return e.un("stablehlo.exponential_minus_one", x);
  if (f == "log") return e.un("stablehlo.log", x);
  if (f == "log2") return divide_by_real(e, e.un("stablehlo.log", x), ln2);
  if (f == "log10") return divide_by_real(e, e.un("stablehlo.log", x), ln10);
  if (f == "log1p") return e.un("stablehlo.log_plus_one", x);
  if (f == "sqrt") return e.un("stablehlo.sqrt", x);
  if (f == "rsqrt") return e.un("stablehlo.rsqrt", x);
  if (f == "reciprocal") return e.div(e.k(1.0), x);
  if (f == "sin") return e.un("stablehlo.sine", x);
  if (f == "cos") return e.un("stablehlo.cosine", x);
  if (f == "tan") return e.un("stablehlo.tan", x);
  if (f == "tanh") return e.un("stablehlo.tanh", x);
  if (f == "atan") return is_complex(e.dt) ? e.un("chlo.atan", x) : e.c.binary("stablehlo.atan2", x, e.k(1.0));
  if (f == "asin") return e.un("chlo.asin", x);
  if (f == "acos") return e.un("chlo.acos", x);
  if (f == "sinh") return e.un("chlo.sinh", x);
  if (f == "cosh") return e.un("chlo.cosh", x);
  if (f == "asinh") return e.un("chlo.asinh", x);
  if (f == "acosh") return e.un("chlo.acosh", x);
  if (f == "atanh") return e.un("chlo.atanh", x);
  if (f == "erf") return e.un("chlo.erf", x);
  if (f == "erfc") return e.un("chlo.erfc", x);
  if (f == "erfinv") return e.un("chlo.erf_inv", x);
  if (f == "lgamma") return e.un("chlo.lgamma", x);
  if (f == "sigmoid") return e.un("stablehlo.logistic", x);
  if (f == "silu") return e.mul(x, e.un("stablehlo.logistic", x));
  if (f == "mish") {
    // x * tanh(softplus(x)), softplus = log1p(exp(x)) (PyTorch's mish uses threshold 20).
    V sp = e.sel(e.cmp("GT", x, e.k(20.0)), x, e.un("stablehlo.log_plus_one", e.un("stablehlo.exponential", x)));
    return e.mul(x, e.un("stablehlo.tanh", sp));
  }
  if (f == "hardswish") return e.div(e.mul(x, e.min(e.max(e.add(x, e.k(3.0)), e.k(0.0)), e.k(6.0))), e.k(6.0));
  if (f == "hardsigmoid") return e.div(e.min(e.max(e.add(x, e.k(3.0)), e.k(0.0)), e.k(6.0)), e.k(6.0));
  if (f == "frac") {
    V t = e.sel(e.cmp("LT", x, e.k(0.0)), e.un("stablehlo.ceil", x), e.un("stablehlo.floor", x));
    return e.sub(x, t);
  }
  throw std::logic_error("torchtpu: unknown float function " + f);
}

void lower_float_unary(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V x = ctx.convert(ctx.input(node, 0), e.dt);
  std::string f = rule_data(node);
  V r = is_complex(e.dt) && has_cut_on_axis(f) ? complex_on_cut(e, f, x) : float_fn(e, f, x);
  ctx.set_result(ctx.convert(r, out.dtype));
}

// gelu(self, approximate="none"|"tanh")
V gelu_forward(const Ex& e, const V& x, bool tanh_approx) {
  if (!tanh_approx) {
    V cdf = e.mul(e.k(0.5), e.add(e.k(1.0), e.un("chlo.erf", e.mul(x, e.k(M_SQRT1_2)))));
    return e.mul(x, cdf);
  }
  const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
  V cube = e.mul(e.mul(x, x), x);
  V inner = e.mul(e.k(beta), e.add(x, e.mul(e.k(kappa), cube)));
  return e.mul(e.mul(e.k(0.5), x), e.add(e.k(1.0), e.un("stablehlo.tanh", inner)));
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
    V cdf = e.mul(e.k(0.5), e.add(e.k(1.0), e.un("chlo.erf", e.mul(x, e.k(M_SQRT1_2)))));
    V pdf = e.mul(e.k(alpha), e.un("stablehlo.exponential", e.mul(e.mul(e.k(-0.5), x), x)));
    d = e.add(cdf, e.mul(x, pdf));
  } else {
    const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
    V sq = e.mul(x, x);
    V cube = e.mul(sq, x);
    V inner = e.mul(e.k(beta), e.add(x, e.mul(e.k(kappa), cube)));
    V t = e.un("stablehlo.tanh", inner);
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
void lower_pointwise_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  std::string f = rule_data(node);
  V g = e.arg(node, 0);
  V zero = e.k(0.0);
  V r;
  // Complex: grad times the conjugate derivative (PyTorch's convention for holomorphic f).
  if (f == "sigmoid_backward") {  // (grad, output)
    V y = e.arg(node, 1);
    r = e.mul(g, ctx.conj(e.mul(e.sub(e.k(1.0), y), y)));
  } else if (f == "tanh_backward") {  // (grad, output)
    V y = e.arg(node, 1);
    r = e.mul(g, ctx.conj(e.sub(e.k(1.0), e.mul(y, y))));
  } else if (f == "silu_backward") {  // (grad, self)
    V x = e.arg(node, 1);
    V s = e.un("stablehlo.logistic", x);
    r = e.mul(g, e.mul(s, e.add(e.k(1.0), e.mul(x, e.sub(e.k(1.0), s)))));
  } else if (f == "mish_backward") {  // (grad, self)
    V x = e.arg(node, 1);
    V s = e.un("stablehlo.logistic", x);
    V sp = e.sel(e.cmp("GT", x, e.k(20.0)), x, e.un("stablehlo.log_plus_one", e.un("stablehlo.exponential", x)));
    V t = e.un("stablehlo.tanh", sp);
    r = e.mul(g, e.add(t, e.mul(e.mul(x, s), e.sub(e.k(1.0), e.mul(t, t)))));
  } else if (f == "softplus_backward") {  // (grad, self, beta, threshold)
    V x = e.arg(node, 1), beta = e.arg(node, 2), threshold = e.arg(node, 3);
    V bx = e.mul(x, beta);
    V z = e.un("stablehlo.exponential", bx);
    r = e.sel(e.cmp("GT", bx, threshold), g, e.mul(g, e.div(z, e.add(z, e.k(1.0)))));
  } else if (f == "hardtanh_backward") {  // (grad, self, min_val, max_val)
    V x = e.arg(node, 1), lo = e.arg(node, 2), hi = e.arg(node, 3);
    r = e.sel(e.bor(e.cmp("LE", x, lo), e.cmp("GE", x, hi)), zero, g);
  } else if (f == "leaky_relu_backward") {  // (grad, self, negative_slope, self_is_result)
    V x = e.arg(node, 1), slope = e.arg(node, 2);
    r = e.sel(e.cmp("GT", x, zero), g, e.mul(g, slope));
  } else if (f == "elu_backward") {  // (grad, alpha, scale, input_scale, is_result, self_or_result)
    V alpha = e.arg(node, 1), scale = e.arg(node, 2), input_scale = e.arg(node, 3);
    bool is_result = node.args[4].as_bool();
    V x = e.arg(node, 5);
    V neg;
    if (is_result) {
      neg = e.mul(e.mul(g, input_scale), e.add(x, e.mul(alpha, scale)));
    } else {
      neg = e.mul(e.mul(e.mul(g, input_scale), e.mul(alpha, scale)),
                  e.un("stablehlo.exponential", e.mul(x, input_scale)));
    }
    r = e.sel(e.cmp("LE", x, zero), neg, e.mul(g, scale));
  } else if (f == "hardswish_backward") {  // (grad, self)
    V x = e.arg(node, 1);
    // CPU: 0 for x <= -3, grad for x >= 3 (and NaN), grad * (x / 3 + 0.5) between.
    V mid = e.mul(g, e.add(e.div(x, e.k(3.0)), e.k(0.5)));
    r = e.sel(e.cmp("LE", x, e.k(-3.0)), zero, e.sel(e.cmp("LT", x, e.k(3.0)), mid, g));
  } else if (f == "hardsigmoid_backward") {  // (grad, self)
    V x = e.arg(node, 1);
    V inside = e.band(e.cmp("GT", x, e.k(-3.0)), e.cmp("LT", x, e.k(3.0)));
    // CPU multiplies by 1/6 taken in float32, whatever the dtype (float64 included).
    r = e.sel(inside, e.mul(g, e.k(static_cast<double>(1.0f / 6.0f))), zero);
  } else if (f == "logit_backward") {  // (grad, self, eps?)
    V x = e.arg(node, 1);
    V d = e.div(g, e.mul(x, e.sub(e.k(1.0), x)));
    if (node.args.size() > 2 && !node.args[2].is_none()) {
      double eps = node.args[2].as_double();
      V outside = e.bor(e.cmp("LT", x, e.k(eps)), e.cmp("GT", x, e.k(1.0 - eps)));
      r = e.sel(outside, zero, d);
    } else {
      V outside = e.bor(e.cmp("LT", x, zero), e.cmp("GT", x, e.k(1.0)));
      r = e.sel(outside, e.k(NAN), d);
    }
  } else {
    throw std::logic_error("torchtpu: unknown backward " + f);
  }
  ctx.set_result(ctx.convert(r, out.dtype));
}

// Forward activations with scalar parameters, computed in compute_dtype.
void lower_activation(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  std::string f = rule_data(node);
  V x = e.arg(node, 0);
  V zero = e.k(0.0);
  V r;
  if (f == "softplus") {  // (self, beta, threshold)
    V beta = e.arg(node, 1), threshold = e.arg(node, 2);
    V bx = e.mul(x, beta);
    r = e.sel(e.cmp("GT", bx, threshold), x,
              e.div(e.un("stablehlo.log_plus_one", e.un("stablehlo.exponential", bx)), beta));
  } else if (f == "hardtanh") {  // (self, min_val, max_val)
    r = e.min(e.max(x, e.arg(node, 1)), e.arg(node, 2));
  } else if (f == "leaky_relu") {  // (self, negative_slope)
    r = e.sel(e.cmp("GT", x, zero), x, e.mul(x, e.arg(node, 1)));
  } else if (f == "elu") {  // (self, alpha, scale, input_scale)
    V alpha = e.arg(node, 1), scale = e.arg(node, 2), input_scale = e.arg(node, 3);
    V neg = e.mul(e.mul(e.un("stablehlo.exponential_minus_one", e.mul(x, input_scale)), alpha), scale);
    r = e.sel(e.cmp("GT", x, zero), e.mul(x, scale), neg);
  } else if (f == "logit") {  // (self, eps?)
    V z = x;
    if (node.args.size() > 1 && !node.args[1].is_none()) {
      double eps = node.args[1].as_double();
      z = e.min(e.max(x, e.k(eps)), e.k(1.0 - eps));
      // PyTorch clamps with x < lo ? lo : x > hi ? hi : x, which keeps NaN.
      z = e.sel(e.isnan(x), x, z);
    }
    r = e.un("stablehlo.log", e.div(z, e.sub(e.k(1.0), z)));
  } else if (f == "threshold") {  // (self, threshold, value): x <= threshold ? value : x
    r = e.sel(e.cmp("LE", x, e.arg(node, 1)), e.arg(node, 2), x);
  } else {
    throw std::logic_error("torchtpu: unknown activation " + f);
  }
  ctx.set_result(ctx.convert(r, out.dtype));
}

// ---------------------------------------------------------------------------------------
// Ops that also take integer (and bool) inputs.

// abs, neg and sgn of a complex value (abs is real).
V complex_unary(LoweringContext& ctx, const std::string& f, const V& x) {
  if (f == "neg") return ctx.unary("stablehlo.negate", x);
  V magnitude = ctx.emit("stablehlo.abs", {x}, TensorType{x.type.shape, real_part_type(x.type.dtype)});
  if (f == "abs") return magnitude;
  if (f != "sgn") throw std::logic_error("torchtpu: no complex " + f);
  // x / |x|, and 0 where x is 0 (PyTorch's sgn).
  V zero = ctx.constant(0, magnitude.type.dtype, x.type.shape);
  V is_zero = ctx.compare("EQ", magnitude, zero);
  V unit = ctx.binary("stablehlo.divide", x, ctx.make_complex(magnitude, zero));
  return ctx.select(is_zero, ctx.constant(0, x.type.dtype, x.type.shape), unit);
}

void lower_int_unary(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  std::string f = rule_data(node);
  V x0 = ctx.input(node, 0);
  if (is_complex(x0.type.dtype)) {
    ctx.set_result(complex_unary(ctx, f, x0));
    return;
  }
  if (!is_floating(out.dtype)) {
    V x = ctx.convert(x0, out.dtype);
    Ex e = make_ex(ctx, out.dtype, out.shape);
    if (f == "abs") {
      ctx.set_result(out.dtype == DType::Bool || out.dtype == DType::UInt8 ? x : e.un("stablehlo.abs", x));
    } else if (f == "neg") {
      ctx.set_result(e.un("stablehlo.negate", x));
    } else if (f == "sign" || f == "sgn") {
      if (out.dtype == DType::Bool) ctx.set_result(x);
      else if (out.dtype == DType::UInt8) ctx.set_result(ctx.convert(e.cmp("GT", x, e.k(0)), out.dtype));
      else ctx.set_result(e.un("stablehlo.sign", x));
    } else if (f == "relu") {
      ctx.set_result(out.dtype == DType::UInt8 ? x : e.max(x, e.k(0)));
    } else {  // floor, ceil, round, trunc: identity on integers
      ctx.set_result(x);
    }
    return;
  }
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V x = ctx.convert(x0, e.dt);
  V r;
  if (f == "abs") r = e.un("stablehlo.abs", x);
  else if (f == "neg") r = e.un("stablehlo.negate", x);
  else if (f == "sign" || f == "sgn") r = e.sel(e.isnan(x), e.k(0.0), e.un("stablehlo.sign", x));
  else if (f == "relu") r = e.sel(e.cmp("GT", x, e.k(0.0)), x, e.sel(e.isnan(x), x, e.k(0.0)));
  else if (f == "floor") r = e.un("stablehlo.floor", x);
  else if (f == "ceil") r = e.un("stablehlo.ceil", x);
  else if (f == "round") r = e.un("stablehlo.round_nearest_even", x);
  else if (f == "trunc") r = e.sel(e.cmp("LT", x, e.k(0.0)), e.un("stablehlo.ceil", x), e.un("stablehlo.floor", x));
  else throw std::logic_error("torchtpu: unknown unary " + f);
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
  V r = neg ? e.mul(e.un("stablehlo.round_nearest_even", e.div(x, ten)), ten)
            : e.div(e.un("stablehlo.round_nearest_even", e.mul(x, ten)), ten);
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
    ctx.set_result(ctx.binary("stablehlo.power", e.arg(node, 0), e.arg(node, 1)));
    return;
  }
  if (!is_floating(out.dtype)) {
    if (out.dtype == DType::Bool) {
      // bool ** bool: x or not y.
      Ex e = make_ex(ctx, DType::Bool, out.shape);
      V a = e.arg(node, 0), b = e.arg(node, 1);
      ctx.set_result(e.bor(a, e.un("stablehlo.not", b)));
      return;
    }
    Ex e = make_ex(ctx, out.dtype, out.shape);
    V a = e.arg(node, 0), b = e.arg(node, 1);
    if (out.dtype == DType::UInt8) {
      // Square and multiply over the exponent's 8 bits, wrapping mod 256 as CPU does (a negative
      // int8 exponent is converted to uint8 first: 5 ** -1 is 5 ** 255 = 205). XLA's power gives 0.
      V result = e.k(1), base = a, zero = e.k(0);
      for (int bit = 0; bit < 8; ++bit) {
        V set = e.cmp("NE", ctx.binary("stablehlo.and", b, e.k(1 << bit)), zero);
        result = e.sel(set, e.mul(result, base), result);
        base = e.mul(base, base);
      }
      ctx.set_result(result);
      return;
    }
    V p = ctx.binary("stablehlo.power", a, b);
    if (is_signed_integer(out.dtype)) {
      // Negative exponents: 1 for base 1, +-1 for base -1, else 0 (PyTorch's powi).
      V zero = e.k(0), one = e.k(1), minus_one = e.k(-1);
      V odd = e.cmp("NE", ctx.binary("stablehlo.and", b, one), zero);
      V neg_result = e.sel(e.cmp("EQ", a, one), one,
                           e.sel(e.cmp("EQ", a, minus_one), e.sel(odd, minus_one, one), zero));
      p = e.sel(e.cmp("LT", b, zero), neg_result, p);
    }
    ctx.set_result(p);
    return;
  }
  Ex e = operands_ex(ctx, out);
  V a = e.arg(node, 0), b = e.arg(node, 1);
  ctx.set_result(ctx.convert(ctx.binary("stablehlo.power", a, b), out.dtype));
}

// atan2(self, other)
void lower_atan2(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = operands_ex(ctx, out);
  ctx.set_result(ctx.convert(ctx.binary("stablehlo.atan2", e.arg(node, 0), e.arg(node, 1)), out.dtype));
}

// logaddexp(a, b) = max + log1p(exp(-|a - b|)); logaddexp2 in base 2. Equal infinities
// give that infinity (the difference would be NaN).
void lower_logaddexp(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = operands_ex(ctx, out);
  V a = e.arg(node, 0), b = e.arg(node, 1);
  V hi = e.max(a, b);
  V d = e.un("stablehlo.negate", e.un("stablehlo.abs", e.sub(a, b)));
  V r;
  if (std::string(rule_data(node)) == "2") {
    const double ln2 = M_LN2;
    V t = e.un("stablehlo.log_plus_one", e.un("stablehlo.exponential", e.mul(d, e.k(ln2))));
    r = e.add(hi, e.div(t, e.k(ln2)));
  } else {
    r = e.add(hi, e.un("stablehlo.log_plus_one", e.un("stablehlo.exponential", d)));
  }
  V same_inf = e.band(e.cmp("EQ", a, b), e.cmp("EQ", e.un("stablehlo.abs", a), e.k(INFINITY)));
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
              e.un("stablehlo.log_plus_one", e.un("stablehlo.exponential",
                                                  e.un("stablehlo.negate", e.un("stablehlo.abs", x)))));
  const TensorType& buffer = node.outputs.at(1);
  ctx.set_results({ctx.convert(r, out.dtype), ctx.constant(0.0, buffer.dtype, buffer.shape)});
}

// log_sigmoid_backward(grad_output, self, buffer) = grad * sigmoid(-x).
void lower_log_sigmoid_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V g = e.arg(node, 0), x = e.arg(node, 1);
  ctx.set_result(ctx.convert(e.mul(g, e.un("stablehlo.logistic", e.un("stablehlo.negate", x))), out.dtype));
}

// remainder (Python sign: result has the divisor's sign) and fmod (C sign).
void lower_remainder(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = operands_ex(ctx, out);
  V a = e.arg(node, 0), b = e.arg(node, 1);
  if (!is_floating(out.dtype)) check_integer_divisor(ctx, node, 1, b);
  V mod = ctx.binary("stablehlo.remainder", a, b);
  if (std::string(rule_data(node)) == "remainder") {
    V zero = e.k(0);
    V fix = e.band(e.cmp("NE", mod, zero), e.cmp("NE", e.cmp("LT", b, zero), e.cmp("LT", mod, zero)));
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
    return ctx.convert(ctx.convert(e.un("stablehlo.abs", x), narrow), e.dt);
  };
  std::vector<V> init{magnitude(a), magnitude(b)};
  std::vector<V> done = ctx.while_loop(
      init, [&](const std::vector<V>& s) { return any_true(ctx, e.cmp("NE", s[0], zero)); },
      [&](const std::vector<V>& s) {
        V going = e.cmp("NE", s[0], zero);
        V r = ctx.binary("stablehlo.remainder", s[1], e.sel(going, s[0], one));
        return std::vector<V>{e.sel(going, r, s[0]), e.sel(going, s[0], s[1])};
      });
  return done[1];
}

void lower_gcd_lcm(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  bool narrow = out.dtype == DType::UInt8 || out.dtype == DType::Int8 || out.dtype == DType::Int16;
  DType dt = narrow ? DType::Int32 : out.dtype;
  Ex e = make_ex(ctx, dt, out.shape);
  V a = ctx.convert(tensor_or_scalar(ctx, node, 0, out.dtype, out.shape), dt);
  V b = ctx.convert(tensor_or_scalar(ctx, node, 1, out.dtype, out.shape), dt);
  V g = gcd_of(e, a, b, out.dtype);
  if (std::string(rule_data(node)) == "gcd") {
    ctx.set_result(ctx.convert(g, out.dtype));
    return;
  }
  V zero = e.k(0);
  V g_zero = e.cmp("EQ", g, zero);
  V lcm = e.un("stablehlo.abs", e.mul(e.div(a, e.sel(g_zero, e.k(1), g)), b));
  ctx.set_result(ctx.convert(e.sel(g_zero, zero, lcm), out.dtype));
}

// fmax/fmin: NaN only when both are NaN.
void lower_fmax_fmin(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, out.dtype, out.shape);
  V a = e.arg(node, 0), b = e.arg(node, 1);
  bool is_max = std::string(rule_data(node)) == "fmax";
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
  V small = e.cmp("LT", e.un("stablehlo.abs", w), e.k(0.5));
  V r = e.sel(small, e.add(a, e.mul(w, diff)), e.sub(b, e.mul(diff, e.sub(e.k(1.0), w))));
  ctx.set_result(ctx.convert(r, out.dtype));
}

// addcmul / addcdiv (self, tensor1, tensor2, value)
void lower_addc(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, compute_dtype(out.dtype), out.shape);
  V s = e.arg(node, 0), t1 = e.arg(node, 1), t2 = e.arg(node, 2), v = e.arg(node, 3);
  V r = std::string(rule_data(node)) == "addcmul" ? e.add(s, e.mul(e.mul(v, t1), t2)) : e.add(s, e.mul(v, e.div(t1, t2)));
  ctx.set_result(ctx.convert(r, out.dtype));
}

// clamp(self, min?, max?) with Scalar or Tensor bounds; clamp_min / clamp_max.
void lower_clamp(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, out.dtype, out.shape);
  std::string f = rule_data(node);
  V x = e.arg(node, 0);
  V r = x;
  auto present = [&](int i) { return i < static_cast<int>(node.args.size()) && !node.args[i].is_none(); };
  if (f == "clamp") {
    if (present(1)) r = e.max(r, e.arg(node, 1));
    if (present(2)) r = e.min(r, e.arg(node, 2));
  } else if (f == "clamp_min") {
    r = e.max(r, e.arg(node, 1));
  } else {
    r = e.min(r, e.arg(node, 1));
  }
  if (is_floating(out.dtype)) r = e.sel(e.isnan(x), x, r);  // a NaN input stays NaN
  ctx.set_result(r);
}

// isnan / isinf / isfinite / isposinf / isneginf
void lower_float_class(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  std::string f = rule_data(node);
  V x = ctx.input(node, 0);
  if (is_complex(x.type.dtype)) {
    // Either part NaN / infinite; finite when both parts are.
    Ex e = make_ex(ctx, real_part_type(x.type.dtype), out.shape);
    V re = ctx.real_part(x), im = ctx.imag_part(x);
    const double inf = std::numeric_limits<double>::infinity();
    auto inf_part = [&](const V& p) { return e.cmp("EQ", e.un("stablehlo.abs", p), e.k(inf)); };
    auto finite_part = [&](const V& p) { return e.cmp("LT", e.un("stablehlo.abs", p), e.k(inf)); };
    if (f == "isnan") ctx.set_result(e.bor(e.isnan(re), e.isnan(im)));
    else if (f == "isinf") ctx.set_result(e.bor(inf_part(re), inf_part(im)));
    else ctx.set_result(e.band(finite_part(re), finite_part(im)));  // isfinite
    return;
  }
  if (!is_floating(x.type.dtype)) {
    ctx.set_result(ctx.constant(f == "isfinite" ? 1 : 0, DType::Bool, out.shape));
    return;
  }
  Ex e = make_ex(ctx, x.type.dtype, out.shape);
  const double inf = std::numeric_limits<double>::infinity();
  V r;
  if (f == "isnan") r = e.isnan(x);
  else if (f == "isinf") r = e.cmp("EQ", e.un("stablehlo.abs", x), e.k(inf));
  else if (f == "isposinf") r = e.cmp("EQ", x, e.k(inf));
  else if (f == "isneginf") r = e.cmp("EQ", x, e.k(-inf));
  else r = e.cmp("LT", e.un("stablehlo.abs", x), e.k(inf));  // isfinite (false for NaN)
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
  V r = e.sel(e.cmp("EQ", x, e.k(inf)), e.k(posinf), x);
  r = e.sel(e.cmp("EQ", x, e.k(-inf)), e.k(neginf), r);
  r = e.sel(e.isnan(x), e.k(nan), r);
  ctx.set_result(r);
}

// bitwise_and/or/xor (.Tensor, .Scalar, .Scalar_Tensor) and bitwise_not.
void lower_bitwise(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Ex e = make_ex(ctx, out.dtype, out.shape);
  if (std::string(rule_data(node)) == "stablehlo.not") {
    ctx.set_result(e.un("stablehlo.not", e.arg(node, 0)));
    return;
  }
  ctx.set_result(ctx.emit(rule_data(node), {e.arg(node, 0), e.arg(node, 1)}, TensorType{out.shape, out.dtype}));
}

#define FLOAT_UNARY(name) LOWERING("aten::" #name, lower_float_unary, #name)
// The same functions of complex values (StableHLO and CHLO take complex operands for these).
#define COMPLEX_FLOAT_UNARY(name) LOWERING("aten::" #name, lower_float_unary, #name, kTakesComplex)
COMPLEX_FLOAT_UNARY(exp);
COMPLEX_FLOAT_UNARY(exp2);
COMPLEX_FLOAT_UNARY(expm1);
COMPLEX_FLOAT_UNARY(log);
COMPLEX_FLOAT_UNARY(log2);
COMPLEX_FLOAT_UNARY(log10);
COMPLEX_FLOAT_UNARY(log1p);
COMPLEX_FLOAT_UNARY(sqrt);
COMPLEX_FLOAT_UNARY(rsqrt);
COMPLEX_FLOAT_UNARY(reciprocal);
COMPLEX_FLOAT_UNARY(sin);
COMPLEX_FLOAT_UNARY(cos);
COMPLEX_FLOAT_UNARY(tan);
COMPLEX_FLOAT_UNARY(tanh);
COMPLEX_FLOAT_UNARY(atan);
COMPLEX_FLOAT_UNARY(asin);
COMPLEX_FLOAT_UNARY(acos);
COMPLEX_FLOAT_UNARY(sinh);
COMPLEX_FLOAT_UNARY(cosh);
COMPLEX_FLOAT_UNARY(asinh);
COMPLEX_FLOAT_UNARY(acosh);
COMPLEX_FLOAT_UNARY(atanh);
FLOAT_UNARY(erf);
FLOAT_UNARY(erfc);
FLOAT_UNARY(erfinv);
FLOAT_UNARY(lgamma);
COMPLEX_FLOAT_UNARY(sigmoid);
LOWERING("aten::silu", lower_float_unary, "silu", RuleFlags{.complex = true, .refuses = kBoolDTypes | kIntegerDTypes});
LOWERING("aten::mish", lower_float_unary, "mish", kFloatOnly);
LOWERING("aten::hardswish", lower_float_unary, "hardswish", kFloatOnly);
LOWERING("aten::hardsigmoid", lower_float_unary, "hardsigmoid", kFloatOnly);
LOWERING("aten::frac", lower_float_unary, "frac", kFloatOnly);
#undef FLOAT_UNARY
#undef COMPLEX_FLOAT_UNARY

LOWERING("aten::gelu", lower_gelu, nullptr, kFloatOnly);
LOWERING("aten::gelu_backward", lower_gelu_backward);
LOWERING("aten::sigmoid_backward", lower_pointwise_backward, "sigmoid_backward", kTakesComplex);
LOWERING("aten::tanh_backward", lower_pointwise_backward, "tanh_backward", kTakesComplex);
LOWERING("aten::silu_backward", lower_pointwise_backward, "silu_backward");
LOWERING("aten::mish_backward", lower_pointwise_backward, "mish_backward");
LOWERING("aten::softplus_backward", lower_pointwise_backward, "softplus_backward");
LOWERING("aten::hardtanh_backward", lower_pointwise_backward, "hardtanh_backward");
LOWERING("aten::leaky_relu_backward", lower_pointwise_backward, "leaky_relu_backward");
LOWERING("aten::elu_backward", lower_pointwise_backward, "elu_backward");
LOWERING("aten::hardswish_backward", lower_pointwise_backward, "hardswish_backward");
LOWERING("aten::hardsigmoid_backward", lower_pointwise_backward, "hardsigmoid_backward");
LOWERING("aten::logit_backward", lower_pointwise_backward, "logit_backward");
LOWERING("aten::softplus", lower_activation, "softplus", kFloatOnly);
LOWERING("aten::hardtanh", lower_activation, "hardtanh");
LOWERING("aten::leaky_relu", lower_activation, "leaky_relu");
LOWERING("aten::elu", lower_activation, "elu");
LOWERING("aten::logit", lower_activation, "logit");
LOWERING("aten::threshold", lower_activation, "threshold", kNoBool);

LOWERING("aten::abs", lower_int_unary, "abs", kComplexNoBool);
LOWERING("aten::neg", lower_int_unary, "neg", kTakesComplex);
LOWERING("aten::sign", lower_int_unary, "sign");
LOWERING("aten::sgn", lower_int_unary, "sgn", kTakesComplex);
LOWERING("aten::relu", lower_int_unary, "relu", kNoBool);
LOWERING("aten::floor", lower_int_unary, "floor", kNoBool);
LOWERING("aten::ceil", lower_int_unary, "ceil", kNoBool);
LOWERING("aten::round", lower_int_unary, "round", kNoBool);
LOWERING("aten::trunc", lower_int_unary, "trunc", kNoBool);
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
LOWERING("aten::logaddexp", lower_logaddexp, "e", kFloatOnly);
LOWERING("aten::logaddexp2", lower_logaddexp, "2", kFloatOnly);
LOWERING("aten::log_sigmoid_forward", lower_log_sigmoid_forward, nullptr, kFloatOnly);
LOWERING("aten::log_sigmoid_backward", lower_log_sigmoid_backward);
LOWERING("aten::remainder.Tensor", lower_remainder, "remainder", kNoBool);
LOWERING("aten::remainder.Scalar", lower_remainder, "remainder", kNoBool);
LOWERING("aten::remainder.Scalar_Tensor", lower_remainder, "remainder", kNoBool);
LOWERING("aten::fmod.Tensor", lower_remainder, "fmod", kNoBool);
LOWERING("aten::fmod.Scalar", lower_remainder, "fmod", kNoBool);
LOWERING("aten::gcd", lower_gcd_lcm, "gcd", kIntegerOnly);
LOWERING("aten::lcm", lower_gcd_lcm, "lcm", kIntegerOnly);
LOWERING("aten::fmax", lower_fmax_fmin, "fmax");
LOWERING("aten::fmin", lower_fmax_fmin, "fmin");
LOWERING("aten::lerp.Scalar", lower_lerp, nullptr, kFloatOnly);
LOWERING("aten::lerp.Tensor", lower_lerp, nullptr, kFloatOnly);
LOWERING("aten::addcmul", lower_addc, "addcmul", kComplexNoBool);
LOWERING("aten::addcdiv", lower_addc, "addcdiv", kTakesComplex);
LOWERING("aten::clamp", lower_clamp, "clamp", kNoBool);
LOWERING("aten::clamp.Tensor", lower_clamp, "clamp", kNoBool);
LOWERING("aten::clamp_min", lower_clamp, "clamp_min", kNoBool);
LOWERING("aten::clamp_min.Tensor", lower_clamp, "clamp_min", kNoBool);
LOWERING("aten::clamp_max", lower_clamp, "clamp_max", kNoBool);
LOWERING("aten::clamp_max.Tensor", lower_clamp, "clamp_max", kNoBool);
LOWERING("aten::isnan", lower_float_class, "isnan", kTakesComplex);
LOWERING("aten::isinf", lower_float_class, "isinf", kTakesComplex);
LOWERING("aten::isfinite", lower_float_class, "isfinite", kTakesComplex);
LOWERING("aten::isposinf", lower_float_class, "isposinf");
LOWERING("aten::isneginf", lower_float_class, "isneginf");
LOWERING("aten::nan_to_num", lower_nan_to_num);
LOWERING("aten::bitwise_and.Tensor", lower_bitwise, "stablehlo.and", kIntegerOrBool);
LOWERING("aten::bitwise_and.Scalar", lower_bitwise, "stablehlo.and", kIntegerOrBool);
LOWERING("aten::bitwise_and.Scalar_Tensor", lower_bitwise, "stablehlo.and", kIntegerOrBool);
LOWERING("aten::bitwise_or.Tensor", lower_bitwise, "stablehlo.or", kIntegerOrBool);
LOWERING("aten::bitwise_or.Scalar", lower_bitwise, "stablehlo.or", kIntegerOrBool);
LOWERING("aten::bitwise_or.Scalar_Tensor", lower_bitwise, "stablehlo.or", kIntegerOrBool);
LOWERING("aten::bitwise_xor.Tensor", lower_bitwise, "stablehlo.xor", kIntegerOrBool);
LOWERING("aten::bitwise_xor.Scalar", lower_bitwise, "stablehlo.xor", kIntegerOrBool);
LOWERING("aten::bitwise_xor.Scalar_Tensor", lower_bitwise, "stablehlo.xor", kIntegerOrBool);
LOWERING("aten::bitwise_not", lower_bitwise, "stablehlo.not", kIntegerOrBool);

}  // namespace
}  // namespace torchtpu
