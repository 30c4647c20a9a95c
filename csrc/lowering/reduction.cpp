// Reductions: sum, mean, prod, var/std (+_mean), max/min (+.dim), amax/amin, aminmax,
// argmax/argmin, logsumexp, any/all, linalg_vector_norm, renorm, nansum, trace, cumsum/cumprod.
// Half-precision floats accumulate in f32 as PyTorch does; keepdim is a final reshape to the
// meta kernel's output shape (reducing dims does not reorder the remaining elements).
#include <cmath>
#include <limits>

#include "lowering/common.h"

namespace torchtpu {
namespace {

// The parameters of this file's families.
enum class SumMean : uint8_t { Sum, Mean };
enum class VarStd : uint8_t { Var, Std, VarMean, StdMean };
enum class AnyAll : uint8_t { Any, All };
enum class NormDims : uint8_t { Given, All };  // norm over the dims argument, or all (norm.Scalar)
enum class Cumulative : uint8_t { Sum, Prod };

DType acc_dtype(DType dtype) {
  return dtype == DType::BFloat16 || dtype == DType::Float16 ? DType::Float32 : dtype;
}

std::vector<int64_t> all_dims(int64_t rank) {
  std::vector<int64_t> all(rank);
  for (int64_t i = 0; i < rank; ++i) all[i] = i;
  return all;
}

// The dims of argument `arg`: an int, an int list (empty = all) or None (all).
std::vector<int64_t> reduced_dims(const Node& node, int arg, int64_t rank) {
  if (arg >= static_cast<int>(node.args.size()) || node.args[arg].is_none()) return all_dims(rank);
  const Arg& a = node.args[arg];
  if (a.kind == Arg::Kind::Int) return rank == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{wrap_dim(a.i, rank)};
  if (a.ints.empty()) return all_dims(rank);
  std::vector<int64_t> dims = wrap_dims(a.ints, rank);
  if (rank == 0) dims.clear();  // dim 0 / -1 of a 0-d tensor
  return dims;
}

int64_t count_of(const V& x, const std::vector<int64_t>& dims) {
  int64_t count = 1;
  for (int64_t d : dims) count *= x.type.shape[d];
  return count;
}

// x broadcast back over reduced dims (r has x's shape with `dims` removed).
V unreduce(LoweringContext& ctx, const V& r, const V& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < x.type.rank(); ++i) {
    bool reduced = false;
    for (int64_t d : dims) reduced |= d == i;
    if (!reduced) kept.push_back(i);
  }
  return ctx.broadcast_in_dim(r, x.type.shape, kept);
}

// sum(self, dtype) / sum.dim_IntList(self, dim, keepdim, dtype) / mean / mean.dim
void lower_sum_mean(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  bool has_dims = node.args.size() >= 3 && node.args[1].kind != Arg::Kind::Int;
  std::vector<int64_t> dims = has_dims ? reduced_dims(node, 1, x.type.rank()) : all_dims(x.type.rank());
  DType acc = acc_dtype(out.dtype);
  V total = sum_dims(ctx, ctx.convert(x, acc), dims);
  if (rule_param<SumMean>(node) == SumMean::Mean) {
    int64_t count = count_of(x, dims);
    total = ctx.binary(Hlo::Divide, total, ctx.constant(static_cast<double>(count), acc, total.type.shape));
  }
  ctx.set_result(ctx.reshape(ctx.convert(total, out.dtype), out.shape));
}

// prod(self, dtype) / prod.dim_int(self, dim, keepdim, dtype)
void lower_prod(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  bool has_dim = node.args.size() >= 3;
  std::vector<int64_t> dims = has_dim ? reduced_dims(node, 1, x.type.rank()) : all_dims(x.type.rank());
  DType acc = acc_dtype(out.dtype);
  V r = ctx.reduce(ctx.convert(x, acc), dims, ctx.constant(1, acc), out.dtype == DType::Bool ? Hlo::And : Hlo::Multiply);
  ctx.set_result(ctx.reshape(ctx.convert(r, out.dtype), out.shape));
}

// var.correction / std.correction (self, dim?, correction?, keepdim) and *_mean.correction.
void lower_var_std(LoweringContext& ctx, const Node& node) {
  VarStd f = rule_param<VarStd>(node);
  bool with_mean = f == VarStd::VarMean || f == VarStd::StdMean;
  const TensorType& out = ctx.out(node);
  V x0 = ctx.input(node, 0);
  // Dispatch sends integer and bool inputs to CPU's kernel (kVarStd); a graph lowered whole
  // (torch.compile) can meet this check instead (RuntimeError; on torch 2.15 the compiled call
  // raises CPU's NotImplementedError before it).
  const char* names = !with_mean ? "std and var" : f == VarStd::VarMean ? "var_mean" : "std_mean";
  check_argument(is_floating(x0.type.dtype) || is_complex(x0.type.dtype),
                 std::string(names) + " only support floating point and complex dtypes");
  std::vector<int64_t> dims = reduced_dims(node, 1, x0.type.rank());
  DType acc = acc_dtype(is_complex(x0.type.dtype) ? x0.type.dtype : out.dtype);  // complex input: real var
  V x = ctx.convert(x0, acc);
  int64_t count = count_of(x, dims);
  V mean = sum_dims(ctx, x, dims);
  mean = ctx.binary(Hlo::Divide, mean, ctx.constant(static_cast<double>(count), acc, mean.type.shape));
  V centered = ctx.binary(Hlo::Subtract, x, unreduce(ctx, mean, x, dims));
  V squares;
  if (is_complex(acc)) {
    // |x - mean|^2: the variance of complex values is real.
    V re = ctx.real_part(centered), im = ctx.imag_part(centered);
    squares = ctx.binary(Hlo::Add, ctx.binary(Hlo::Multiply, re, re), ctx.binary(Hlo::Multiply, im, im));
    acc = re.type.dtype;
  } else {
    squares = ctx.binary(Hlo::Multiply, centered, centered);
  }
  V sq = sum_dims(ctx, squares, dims);
  V correction = node.args.size() > 2 && !node.args[2].is_none() ? ctx.scalar(node, 2, acc) : ctx.constant(1, acc);
  V divisor = ctx.binary(Hlo::Subtract, ctx.constant(static_cast<double>(count), acc), correction);
  divisor = ctx.binary(Hlo::Maximum, divisor, ctx.constant(0, acc));
  V var = ctx.binary(Hlo::Divide, sq, ctx.broadcast_to(divisor, sq.type.shape));
  if (f == VarStd::Std || f == VarStd::StdMean) var = ctx.unary(Hlo::Sqrt, var);
  V result = ctx.reshape(ctx.convert(var, out.dtype), out.shape);
  if (!with_mean) {
    ctx.set_result(result);
  } else {
    ctx.set_results({result, ctx.reshape(ctx.convert(mean, ctx.out(node, 1).dtype), ctx.out(node, 1).shape)});
  }
}

// max/min (unary), amax/amin(self, dim[], keepdim): NaN propagates.
void lower_extremum(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  bool is_max = rule_param<Extremum>(node) == Extremum::Max;
  V x = ctx.input(node, 0);
  std::vector<int64_t> dims = node.args.size() > 1 ? reduced_dims(node, 1, x.type.rank()) : all_dims(x.type.rank());
  DType dt = x.type.dtype;
  V init = is_max ? lowest_scalar(ctx, dt) : highest_scalar(ctx, dt);
  V r = ctx.reduce(x, dims, init, is_max ? Hlo::Maximum : Hlo::Minimum);
  if (is_floating(dt)) {
    // NaN wins regardless of how the backend's max treats it.
    V any_nan = ctx.reduce(ctx.compare(Cmp::NE, x, x), dims, ctx.constant(0, DType::Bool), Hlo::Or);
    r = ctx.select(any_nan, ctx.constant(NAN, dt, r.type.shape), r);
  }
  ctx.set_result(ctx.reshape(r, out.shape));
}

// (value, index) reduction along dims with PyTorch's rules: NaN is the extremum, ties pick
// the first index. Returns {values, indices(i64)} with the reduced dims removed.
std::vector<V> arg_reduce(LoweringContext& ctx, const V& x, int64_t dim, bool is_max) {
  DType dt = x.type.dtype;
  V idx = ctx.iota(TensorType{x.type.shape, DType::Int64}, dim);
  V init_v = is_max ? lowest_scalar(ctx, dt) : highest_scalar(ctx, dt);
  V init_i = ctx.constant_int(std::numeric_limits<int64_t>::max(), DType::Int64);
  TensorType sv{{}, dt}, si{{}, DType::Int64};
  std::string body = ctx.region({sv, si, sv, si}, [&](const std::vector<V>& a) {
    const V &av = a[0], &ai = a[1], &bv = a[2], &bi = a[3];
    V better = ctx.compare(is_max ? Cmp::GT : Cmp::LT, av, bv);
    V equal = ctx.compare(Cmp::EQ, av, bv);
    if (is_floating(dt)) {
      V a_nan = ctx.compare(Cmp::NE, av, av), b_nan = ctx.compare(Cmp::NE, bv, bv);
      V b_not_nan = ctx.unary(Hlo::Not, b_nan);
      better = ctx.binary(Hlo::Or, better, ctx.binary(Hlo::And, a_nan, b_not_nan));
      equal = ctx.binary(Hlo::Or, equal, ctx.binary(Hlo::And, a_nan, b_nan));
    }
    V first = ctx.binary(Hlo::And, equal, ctx.compare(Cmp::LT, ai, bi));
    V pick = ctx.binary(Hlo::Or, better, first);
    return std::vector<V>{ctx.select(pick, av, bv), ctx.select(pick, ai, bi)};
  });
  std::vector<int64_t> shape;
  for (int64_t i = 0; i < x.type.rank(); ++i)
    if (i != dim) shape.push_back(x.type.shape[i]);
  return ctx.emit_multi(Hlo::Reduce, {x, idx, init_v, init_i},
                        {TensorType{shape, dt}, TensorType{shape, DType::Int64}},
                        "dimensions = " + format_dims({dim}), body);
}

// max.dim / min.dim (self, dim, keepdim) -> (values, indices)
void lower_extremum_dim(LoweringContext& ctx, const Node& node) {
  bool is_max = rule_param<Extremum>(node) == Extremum::Max;
  V x = ctx.input(node, 0);
  if (x.type.rank() == 0) {
    ctx.set_results({x, ctx.constant_int(0, DType::Int64)});
    return;
  }
  int64_t dim = wrap_dim(node.args[1].as_int(), x.type.rank());
  std::vector<V> r = arg_reduce(ctx, x, dim, is_max);
  ctx.set_results({ctx.reshape(r[0], ctx.out(node, 0).shape), ctx.reshape(r[1], ctx.out(node, 1).shape)});
}

// argmax / argmin (self, dim?, keepdim)
void lower_argextremum(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  bool is_max = rule_param<Extremum>(node) == Extremum::Max;
  V x = ctx.input(node, 0);
  int64_t dim = 0;
  if (node.args[1].is_none() || x.type.rank() == 0) {
    x = ctx.reshape(x, {x.type.numel()});
  } else {
    dim = wrap_dim(node.args[1].as_int(), x.type.rank());
  }
  std::vector<V> r = arg_reduce(ctx, x, dim, is_max);
  ctx.set_result(ctx.reshape(r[1], out.shape));
}

// logsumexp(self, dim[], keepdim)
void lower_logsumexp(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType acc = acc_dtype(out.dtype);
  V x = ctx.convert(ctx.input(node, 0), acc);
  std::vector<int64_t> dims = reduced_dims(node, 1, x.type.rank());
  V m = ctx.reduce(x, dims, lowest_scalar(ctx, acc), Hlo::Maximum);
  V inf = ctx.constant(INFINITY, acc, m.type.shape);
  m = ctx.select(ctx.compare(Cmp::EQ, ctx.unary(Hlo::Abs, m), inf), ctx.constant(0, acc, m.type.shape), m);
  V e = ctx.unary(Hlo::Exponential, ctx.binary(Hlo::Subtract, x, unreduce(ctx, m, x, dims)));
  V r = ctx.binary(Hlo::Add, ctx.unary(Hlo::Log, sum_dims(ctx, e, dims)), m);
  ctx.set_result(ctx.reshape(ctx.convert(r, out.dtype), out.shape));
}

// aminmax(self, dim?, keepdim) -> (min, max); NaN propagates to both.
void lower_aminmax(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  std::vector<int64_t> dims = reduced_dims(node, 1, x.type.rank());
  DType dt = x.type.dtype;
  V lo = ctx.reduce(x, dims, highest_scalar(ctx, dt), Hlo::Minimum);
  V hi = ctx.reduce(x, dims, lowest_scalar(ctx, dt), Hlo::Maximum);
  if (is_floating(dt)) {
    V any_nan = ctx.reduce(ctx.compare(Cmp::NE, x, x), dims, ctx.constant(0, DType::Bool), Hlo::Or);
    lo = ctx.select(any_nan, ctx.constant(NAN, dt, lo.type.shape), lo);
    hi = ctx.select(any_nan, ctx.constant(NAN, dt, hi.type.shape), hi);
  }
  ctx.set_results({ctx.reshape(lo, ctx.out(node, 0).shape), ctx.reshape(hi, ctx.out(node, 1).shape)});
}

// nansum(self, dim?, keepdim, dtype?): NaN counts as zero.
void lower_nansum(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  std::vector<int64_t> dims = reduced_dims(node, 1, x.type.rank());
  DType acc = acc_dtype(out.dtype);
  V xa = ctx.convert(x, acc);
  if (is_floating(acc)) xa = ctx.select(ctx.compare(Cmp::NE, xa, xa), ctx.constant(0, acc, xa.type.shape), xa);
  ctx.set_result(ctx.reshape(ctx.convert(sum_dims(ctx, xa, dims), out.dtype), out.shape));
}

// trace(self): the sum of a matrix's diagonal.
void lower_trace(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.convert(ctx.input(node, 0), acc_dtype(out.dtype));
  TensorType it{x.type.shape, DType::Int64};
  V diagonal = ctx.compare(Cmp::EQ, ctx.iota(it, 0), ctx.iota(it, 1));
  V kept = ctx.select(diagonal, x, ctx.constant(0, x.type.dtype, x.type.shape));
  ctx.set_result(ctx.convert(sum_dims(ctx, kept, {0, 1}), out.dtype));
}

// trace_backward(grad, sizes): grad on the diagonal.
void lower_trace_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  TensorType it{out.shape, DType::Int64};
  V diagonal = ctx.compare(Cmp::EQ, ctx.iota(it, 0), ctx.iota(it, 1));
  V g = to_type(ctx, ctx.input(node, 0), out.dtype, out.shape);
  ctx.set_result(ctx.select(diagonal, g, ctx.constant(0, out.dtype, out.shape)));
}

// renorm(self, p, dim, maxnorm): each slice along dim whose p-norm exceeds maxnorm is scaled
// to maxnorm (by maxnorm / (norm + 1e-7), as CPU does).
void lower_renorm(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType acc = acc_dtype(out.dtype);
  V x = ctx.convert(ctx.input(node, 0), acc);
  double p = node.args[1].as_double();
  int64_t dim = wrap_dim(node.args[2].i, x.type.rank());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.type.rank(); ++d)
    if (d != dim) dims.push_back(d);
  V a = ctx.unary(Hlo::Abs, x);
  V norm;
  if (std::isinf(p)) {
    norm = ctx.reduce(a, dims, p > 0 ? lowest_scalar(ctx, acc) : highest_scalar(ctx, acc),
                      p > 0 ? Hlo::Maximum : Hlo::Minimum);
  } else if (p == 1) {
    norm = sum_dims(ctx, a, dims);
  } else {
    V pw = ctx.binary(Hlo::Power, a, ctx.constant(p, acc, a.type.shape));
    V s = sum_dims(ctx, pw, dims);
    norm = ctx.binary(Hlo::Power, s, ctx.constant(1.0 / p, acc, s.type.shape));
  }
  V maxnorm = ctx.broadcast_to(ctx.scalar(node, 3, acc), norm.type.shape);
  V factor = ctx.binary(Hlo::Divide, maxnorm,
                        ctx.binary(Hlo::Add, norm, ctx.constant(1e-7, acc, norm.type.shape)));
  factor = ctx.select(ctx.compare(Cmp::GT, norm, maxnorm), factor, ctx.constant(1, acc, norm.type.shape));
  ctx.set_result(ctx.convert(ctx.binary(Hlo::Multiply, x, unreduce(ctx, factor, x, dims)), out.dtype));
}

// any / all (self) (.dim, .dims)
void lower_any_all(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  bool is_any = rule_param<AnyAll>(node) == AnyAll::Any;
  V x = ctx.convert(ctx.input(node, 0), DType::Bool);
  std::vector<int64_t> dims = node.args.size() > 1 ? reduced_dims(node, 1, x.type.rank()) : all_dims(x.type.rank());
  V r = ctx.reduce(x, dims, ctx.constant(is_any ? 0 : 1, DType::Bool), is_any ? Hlo::Or : Hlo::And);
  ctx.set_result(ctx.reshape(ctx.convert(r, out.dtype), out.shape));
}

// linalg_vector_norm(self, ord, dim?, keepdim, dtype?) and the older norm overloads
// (self, p?, [dim, keepdim,] [dtype]); ord/p is a compile-time constant (None: 2).
void lower_vector_norm(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  double ord = node.args[1].is_none() ? 2.0 : node.args[1].as_double();
  DType acc = acc_dtype(out.dtype);
  V x0 = ctx.input(node, 0);
  // A complex input's norm is of its magnitudes (abs is real); zeros count as for reals.
  V x = is_complex(x0.type.dtype) ? x0 : ctx.convert(x0, acc);
  bool all = rule_param<NormDims>(node) == NormDims::All;  // no dim argument
  std::vector<int64_t> dims = all ? all_dims(x.type.rank()) : reduced_dims(node, 2, x.type.rank());
  V a = ctx.convert(ctx.emit(Hlo::Abs, {x}, TensorType{x.type.shape, real_part_type(x.type.dtype)}), acc);
  V r;
  if (std::isinf(ord)) {
    bool is_max = ord > 0;
    r = ctx.reduce(a, dims, is_max ? lowest_scalar(ctx, acc) : highest_scalar(ctx, acc),
                   is_max ? Hlo::Maximum : Hlo::Minimum);
    V any_nan = ctx.reduce(ctx.compare(Cmp::NE, a, a), dims, ctx.constant(0, DType::Bool), Hlo::Or);
    r = ctx.select(any_nan, ctx.constant(NAN, acc, r.type.shape), r);
  } else if (ord == 0) {
    r = sum_dims(ctx, ctx.convert(ctx.compare(Cmp::NE, x, ctx.constant(0, x.type.dtype, x.type.shape)), acc), dims);
  } else if (ord == 1) {
    r = sum_dims(ctx, a, dims);
  } else if (ord == 2) {
    r = ctx.unary(Hlo::Sqrt, sum_dims(ctx, ctx.binary(Hlo::Multiply, a, a), dims));
  } else {
    V p = ctx.binary(Hlo::Power, a, ctx.constant(ord, acc, a.type.shape));
    V s = sum_dims(ctx, p, dims);
    r = ctx.binary(Hlo::Power, s, ctx.constant(1.0 / ord, acc, s.type.shape));
  }
  ctx.set_result(ctx.reshape(ctx.convert(r, out.dtype), out.shape));
}

// cumsum / cumprod (self, dim, dtype?): a reduce_window over the prefix along dim.
void lower_cumulative(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  bool is_sum = rule_param<Cumulative>(node) == Cumulative::Sum;
  DType acc = acc_dtype(out.dtype);
  V x = ctx.convert(ctx.input(node, 0), acc);
  if (x.type.rank() == 0 || x.type.numel() == 0) {
    ctx.set_result(ctx.reshape(ctx.convert(x, out.dtype), out.shape));
    return;
  }
  int64_t rank = x.type.rank();
  int64_t dim = wrap_dim(node.args[1].as_int(), rank);
  int64_t n = x.type.shape[dim];
  Hlo op = is_sum ? (acc == DType::Bool ? Hlo::Or : Hlo::Add)
                          : (acc == DType::Bool ? Hlo::And : Hlo::Multiply);
  V init = is_sum ? ctx.constant(0, acc) : ctx.constant(1, acc);
  TensorType scalar{{}, acc};
  std::string body = ctx.region({scalar, scalar}, [&](const std::vector<V>& a) {
    return std::vector<V>{ctx.binary(op, a[0], a[1])};
  });
  std::vector<int64_t> window(rank, 1), strides(rank, 1);
  window[dim] = n;
  std::string padding = "padding = dense<[";
  for (int64_t i = 0; i < rank; ++i)
    padding += std::string(i ? ", " : "") + "[" + (i == dim ? std::to_string(n - 1) : "0") + ", 0]";
  padding += "]> : tensor<" + std::to_string(rank) + "x2xi64>";
  V r = ctx.emit(Hlo::ReduceWindow, {x, init}, x.type,
                 "window_dimensions = " + format_dims(window) + ", window_strides = " + format_dims(strides) + ", " +
                     padding,
                 body);
  ctx.set_result(ctx.convert(r, out.dtype));
}

LOWERING("aten::sum", lower_sum_mean, SumMean::Sum, kTakesComplex);
LOWERING("aten::sum.dim_IntList", lower_sum_mean, SumMean::Sum, kTakesComplex);
LOWERING("aten::mean.dim", lower_sum_mean, SumMean::Mean, kTakesComplex);
LOWERING("aten::mean", lower_sum_mean, SumMean::Mean, kTakesComplex);
LOWERING("aten::prod", lower_prod, nullptr, kTakesComplex);
LOWERING("aten::prod.dim_int", lower_prod, nullptr, kTakesComplex);
// CPU refuses integer and bool inputs ("std and var only support floating point and complex
// dtypes"; PyTorch's meta kernel passes them): such calls run through CPU's kernel, whose error
// type is its torch release's (RuntimeError to 2.14, NotImplementedError from 2.15).
constexpr RuleFlags kVarStd{.complex = true, .refuses = kBoolDTypes | kIntegerDTypes, .judged_on = Judged::Self};
LOWERING("aten::var.correction", lower_var_std, VarStd::Var, kVarStd);
LOWERING("aten::std.correction", lower_var_std, VarStd::Std, kVarStd);
LOWERING("aten::var_mean.correction", lower_var_std, VarStd::VarMean, kVarStd);
LOWERING("aten::std_mean.correction", lower_var_std, VarStd::StdMean, kVarStd);
LOWERING("aten::max", lower_extremum, Extremum::Max, kNotEmpty);
LOWERING("aten::min", lower_extremum, Extremum::Min, kNotEmpty);
LOWERING("aten::amax", lower_extremum, Extremum::Max);
LOWERING("aten::amin", lower_extremum, Extremum::Min);
LOWERING("aten::max.dim", lower_extremum_dim, Extremum::Max, kNotEmpty);
LOWERING("aten::min.dim", lower_extremum_dim, Extremum::Min, kNotEmpty);
LOWERING("aten::argmax", lower_argextremum, Extremum::Max, kSelfNotBool);
LOWERING("aten::argmin", lower_argextremum, Extremum::Min, kSelfNotBool);
LOWERING("aten::logsumexp", lower_logsumexp);
constexpr RuleFlags kNormFlags{.static_scalars = true, .complex = true};
LOWERING("aten::any", lower_any_all, AnyAll::Any, kTakesComplex);
LOWERING("aten::any.dim", lower_any_all, AnyAll::Any, kTakesComplex);
LOWERING("aten::any.dims", lower_any_all, AnyAll::Any, kTakesComplex);
LOWERING("aten::all", lower_any_all, AnyAll::All, kTakesComplex);
LOWERING("aten::all.dim", lower_any_all, AnyAll::All, kTakesComplex);
LOWERING("aten::all.dims", lower_any_all, AnyAll::All, kTakesComplex);
LOWERING("aten::linalg_vector_norm", lower_vector_norm, NormDims::Given, kNormFlags);
LOWERING("aten::norm.Scalar", lower_vector_norm, NormDims::All, kNormFlags);
LOWERING("aten::norm.ScalarOpt_dtype", lower_vector_norm, NormDims::All, kNormFlags);
LOWERING("aten::norm.ScalarOpt_dim", lower_vector_norm, NormDims::Given, kNormFlags);
LOWERING("aten::norm.ScalarOpt_dim_dtype", lower_vector_norm, NormDims::Given, kNormFlags);
LOWERING("aten::aminmax", lower_aminmax);
LOWERING("aten::nansum", lower_nansum);
LOWERING("aten::trace", lower_trace, nullptr, kSelfNotBool);
LOWERING("aten::trace_backward", lower_trace_backward);
LOWERING("aten::renorm", lower_renorm);
LOWERING("aten::cumsum", lower_cumulative, Cumulative::Sum, kTakesComplex);
LOWERING("aten::cumprod", lower_cumulative, Cumulative::Prod, kTakesComplex);

}  // namespace
}  // namespace torchtpu
