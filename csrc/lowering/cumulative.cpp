// Cumulative ops beyond cumsum/cumprod: cummax, cummin (values and indices) and
// logcumsumexp, each a reduce_window over the prefix along dim; cummaxmin_backward.
#include <cmath>
#include <string>

#include "lowering/common.h"

namespace torchtpu {
namespace {

// The attributes of a prefix window along dim: window of the whole dim, padded in front.
std::string prefix_window(const V& x, int64_t dim) {
  int64_t rank = x.type.rank(), n = x.type.shape[dim];
  std::vector<int64_t> window(rank, 1);
  window[dim] = n;
  std::string padding = "padding = dense<[";
  for (int64_t i = 0; i < rank; ++i)
    padding += std::string(i ? ", " : "") + "[" + (i == dim ? std::to_string(n - 1) : "0") + ", 0]";
  padding += "]> : tensor<" + std::to_string(rank) + "x2xi64>";
  return "window_dimensions = " + format_dims(window) + ", " + padding;
}

// cummax / cummin(self, dim) -> (values, indices). CPU keeps the latest index among equal
// values and lets NaN win (the latest NaN's index). As a combiner that is a max over the
// order (NaN first, then the value, then the index), which is commutative and associative.
void lower_cumulative_extremum(LoweringContext& ctx, const Node& node) {
  bool is_max = rule_param<Extremum>(node) == Extremum::Max;
  V x = ctx.input(node, 0);
  const TensorType &values = ctx.out(node, 0), &indices = ctx.out(node, 1);
  if (x.type.rank() == 0 || x.type.numel() == 0) {
    ctx.set_results({ctx.reshape(x, values.shape), ctx.constant_int(0, DType::Int64, indices.shape)});
    return;
  }
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  DType dt = x.type.dtype;
  V keys = dt == DType::Bool ? ctx.convert(x, DType::UInt8) : x;
  V index = ctx.iota(TensorType{x.type.shape, DType::Int64}, dim);
  TensorType sv{{}, keys.type.dtype}, si{{}, DType::Int64};
  std::string body = ctx.region({sv, si, sv, si}, [&](const std::vector<V>& a) {
    const V &av = a[0], &ai = a[1], &bv = a[2], &bi = a[3];
    V b_better = ctx.compare(is_max ? Cmp::GT : Cmp::LT, bv, av);
    V same = ctx.compare(Cmp::EQ, bv, av);
    if (is_floating(dt)) {
      V a_nan = ctx.compare(Cmp::NE, av, av), b_nan = ctx.compare(Cmp::NE, bv, bv);
      V neither = ctx.binary(Hlo::And, ctx.unary(Hlo::Not, a_nan), ctx.unary(Hlo::Not, b_nan));
      b_better = ctx.binary(Hlo::Or, ctx.binary(Hlo::And, b_nan, ctx.unary(Hlo::Not, a_nan)),
                            ctx.binary(Hlo::And, neither, b_better));
      same = ctx.binary(Hlo::Or, ctx.binary(Hlo::And, a_nan, b_nan), ctx.binary(Hlo::And, neither, same));
    }
    V pick_b = ctx.binary(Hlo::Or, b_better, ctx.binary(Hlo::And, same, ctx.compare(Cmp::GT, bi, ai)));
    return std::vector<V>{ctx.select(pick_b, bv, av), ctx.select(pick_b, bi, ai)};
  });
  V init_v = is_max ? lowest_scalar(ctx, keys.type.dtype) : highest_scalar(ctx, keys.type.dtype);
  V init_i = ctx.constant_int(-1, DType::Int64);
  std::vector<V> r = ctx.emit_multi(Hlo::ReduceWindow, {keys, index, init_v, init_i}, {keys.type, index.type},
                                    prefix_window(x, dim), body);
  ctx.set_results({ctx.convert(r[0], dt), r[1]});
}

// _logcumsumexp / logcumsumexp(self, dim): log(exp(a) + exp(b)) as the combiner, in the
// stable form max + log1p(exp(-|a - b|)) (equal infinities stay themselves).
void lower_logcumsumexp(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType dt = compute_dtype(out.dtype);
  V x = ctx.convert(ctx.input(node, 0), dt);
  if (x.type.rank() == 0 || x.type.numel() == 0) {
    ctx.set_result(ctx.convert(x, out.dtype));
    return;
  }
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  TensorType s{{}, dt};
  std::string body = ctx.region({s, s}, [&](const std::vector<V>& a) {
    Ex e = make_ex(ctx, dt, {});
    V hi = e.max(a[0], a[1]), lo = e.min(a[0], a[1]);
    V r = e.add(hi, e.un(Hlo::LogPlusOne, e.un(Hlo::Exponential, e.sub(lo, hi))));
    V same_inf = e.band(e.cmp(Cmp::EQ, a[0], a[1]), e.cmp(Cmp::EQ, e.un(Hlo::Abs, a[0]), e.k(INFINITY)));
    return std::vector<V>{e.sel(same_inf, a[0], r)};
  });
  V r = ctx.emit(Hlo::ReduceWindow, {x, ctx.constant(-INFINITY, dt)}, x.type, prefix_window(x, dim), body);
  ctx.set_result(ctx.convert(r, out.dtype));
}

// cummaxmin_backward(grad, input, indices, dim): each gradient element added at the index
// its output came from.
void lower_cummaxmin_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V grad = ctx.convert(ctx.input(node, 0), out.dtype);
  V indices = ctx.input(node, 2);
  if (out.numel() == 0 || out.rank() == 0) {
    ctx.set_result(out.rank() == 0 ? ctx.reshape(grad, out.shape) : ctx.constant(0, out.dtype, out.shape));
    return;
  }
  int64_t dim = wrap_dim(node.args[3].i, out.rank());
  std::vector<int64_t> strides = contiguous_strides(out.shape);
  DType it = index_dtype(out.numel());
  std::vector<int64_t> coefs = strides;
  coefs[dim] = 0;
  V pos = affine_index(ctx, out.shape, coefs, 0, it);
  V along = ctx.convert(indices, it);
  if (strides[dim] != 1) along = ctx.binary(Hlo::Multiply, along, ctx.constant_int(strides[dim], it, out.shape));
  pos = ctx.binary(Hlo::Add, pos, along);
  ctx.set_result(scatter_linear(ctx, ctx.constant(0, out.dtype, out.shape), pos, grad, Hlo::Add));
}

LOWERING("aten::cummax", lower_cumulative_extremum, Extremum::Max);
LOWERING("aten::cummin", lower_cumulative_extremum, Extremum::Min);
LOWERING("aten::_logcumsumexp", lower_logcumsumexp);
LOWERING("aten::logcumsumexp", lower_logcumsumexp, nullptr, kFloatOnly);
LOWERING("aten::cummaxmin_backward", lower_cummaxmin_backward);

}  // namespace
}  // namespace torchtpu
