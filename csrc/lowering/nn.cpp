// Neural-network lowerings: softmax family, layer/group/batch normalization.
// Statistics are computed in f32 for bf16/f16 inputs, as PyTorch's CPU kernels do.
#include <cmath>

#include "lowering/common.h"

namespace torchtpu {
namespace {

enum class Softmax : uint8_t { Plain, Log, Safe };  // softmax, log_softmax, _safe_softmax

// -- small helpers -------------------------------------------------------------------------

V mul(LoweringContext& ctx, const V& a, const V& b) { return ctx.binary(Hlo::Multiply, a, b); }
V add(LoweringContext& ctx, const V& a, const V& b) { return ctx.binary(Hlo::Add, a, b); }
V sub(LoweringContext& ctx, const V& a, const V& b) { return ctx.binary(Hlo::Subtract, a, b); }
V div(LoweringContext& ctx, const V& a, const V& b) { return ctx.binary(Hlo::Divide, a, b); }
// Floating accumulation type: f32 for bf16/f16.
DType acc_dtype(DType t) { return t == DType::BFloat16 || t == DType::Float16 ? DType::Float32 : t; }
V full(LoweringContext& ctx, double v, const V& like) { return ctx.constant(v, like.type.dtype, like.type.shape); }

// Shape of x with `dims` set to 1.
std::vector<int64_t> kept_shape(const std::vector<int64_t>& shape, const std::vector<int64_t>& dims) {
  std::vector<int64_t> s = shape;
  for (int64_t d : dims) s[d] = 1;
  return s;
}

// Reduces dims of x and broadcasts the result back to x's shape.
V reduce_bcast(LoweringContext& ctx, const V& x, const std::vector<int64_t>& dims, Hlo op) {
  V init = op == Hlo::Maximum ? lowest_scalar(ctx, x.type.dtype) : zero_like_scalar(ctx, x.type.dtype);
  V r = ctx.reduce(x, dims, init, op);
  return ctx.broadcast_to(ctx.reshape(r, kept_shape(x.type.shape, dims)), x.type.shape);
}
V sum_bcast(LoweringContext& ctx, const V& x, const std::vector<int64_t>& dims) {
  return reduce_bcast(ctx, x, dims, Hlo::Add);
}
// Sum over dims, reshaped to `shape` (same number of elements as the kept dims).
V sum_to(LoweringContext& ctx, const V& x, const std::vector<int64_t>& dims, const std::vector<int64_t>& shape) {
  return ctx.reshape(sum_dims(ctx, x, dims), shape);
}

std::vector<int64_t> range(int64_t begin, int64_t end) {
  std::vector<int64_t> r;
  for (int64_t i = begin; i < end; ++i) r.push_back(i);
  return r;
}

// A per-feature vector v (shape [C]) broadcast along `dim` of shape.
V along(LoweringContext& ctx, const V& v, const std::vector<int64_t>& shape, int64_t dim) {
  return ctx.broadcast_in_dim(ctx.reshape(v, {v.type.numel()}), shape, {dim});
}

// -- softmax ---------------------------------------------------------------------------------

// _softmax(self, dim, half_to_float), _log_softmax(...), _safe_softmax(self, dim, dtype)
void lower_softmax(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Softmax kind = rule_param<Softmax>(node);
  V x = ctx.input(node, 0);
  if (kind == Softmax::Safe) x = ctx.convert(x, out.dtype);
  DType acc = acc_dtype(out.dtype);
  x = ctx.convert(x, acc);
  if (x.type.rank() == 0) x = ctx.reshape(x, {1});
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  V m = reduce_bcast(ctx, x, {dim}, Hlo::Maximum);
  // Rows that are all -inf: keep the max finite so exp does not produce NaN from -inf - -inf.
  V neg_inf = full(ctx, -INFINITY, m);
  V all_masked = ctx.compare(Cmp::EQ, m, neg_inf);
  m = ctx.select(all_masked, full(ctx, 0, m), m);
  V shifted = sub(ctx, x, m);
  V e = ctx.unary(Hlo::Exponential, shifted);
  V s = sum_bcast(ctx, e, {dim});
  V r;
  if (kind == Softmax::Log) {
    r = sub(ctx, shifted, ctx.unary(Hlo::Log, s));
  } else {
    r = div(ctx, e, s);
    if (kind == Softmax::Safe) r = ctx.select(all_masked, full(ctx, 0, r), r);
  }
  ctx.set_result(ctx.reshape(ctx.convert(r, out.dtype), out.shape));
}

// _softmax_backward_data(grad, output, dim, input_dtype): out * (grad - sum(grad * out))
// _log_softmax_backward_data: grad - exp(out) * sum(grad)
void lower_softmax_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType acc = acc_dtype(out.dtype);
  V g = ctx.convert(ctx.input(node, 0), acc);
  V y = ctx.convert(ctx.input(node, 1), acc);
  if (g.type.rank() == 0) {
    g = ctx.reshape(g, {1});
    y = ctx.reshape(y, {1});
  }
  int64_t dim = wrap_dim(node.args[2].i, g.type.rank());
  V r;
  if (rule_param<Softmax>(node) == Softmax::Log) {
    r = sub(ctx, g, mul(ctx, ctx.unary(Hlo::Exponential, y), sum_bcast(ctx, g, {dim})));
  } else {
    r = mul(ctx, y, sub(ctx, g, sum_bcast(ctx, mul(ctx, g, y), {dim})));
  }
  ctx.set_result(ctx.reshape(ctx.convert(r, out.dtype), out.shape));
}

// -- normalization ---------------------------------------------------------------------------

// Optional per-feature tensor at arg, converted to acc, or nullptr-equivalent (empty name).
bool optional_input(LoweringContext& ctx, const Node& node, int arg, DType acc, V* v) {
  if (!ctx.has_input(node, arg)) return false;
  *v = ctx.convert(ctx.input(node, arg), acc);
  return true;
}

// Returns mean and rstd over `dims` of x (broadcast to x's shape), biased variance. The mean
// is NaN where the row holds an infinity, as from CPU's Welford moments (layer and group norm),
// whose combine step subtracts an infinite partial mean from another.
void moments(LoweringContext& ctx, const V& x, const std::vector<int64_t>& dims, V* mean, V* var) {
  int64_t n = 1;
  for (int64_t d : dims) n *= x.type.shape[d];
  V nan_if_not_finite = ctx.select(ctx.emit(Hlo::IsFinite, {x}, TensorType{x.type.shape, DType::Bool}),
                                   full(ctx, 0.0, x), full(ctx, NAN, x));
  *mean = div(ctx, sum_bcast(ctx, x, dims), full(ctx, static_cast<double>(n), x));
  if (n > 1) *mean = add(ctx, *mean, sum_bcast(ctx, nan_if_not_finite, dims));
  V c = sub(ctx, x, *mean);
  *var = div(ctx, sum_bcast(ctx, mul(ctx, c, c), dims), full(ctx, static_cast<double>(n), x));
}

// native_layer_norm(input, normalized_shape, weight, bias, eps) -> (out, mean, rstd)
void lower_layer_norm(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType acc = acc_dtype(out.dtype);
  V x = ctx.convert(ctx.input(node, 0), acc);
  int64_t rank = x.type.rank();
  int64_t axis = rank - static_cast<int64_t>(node.args[1].ints.size());
  std::vector<int64_t> dims = range(axis, rank);
  double eps = node.args[4].as_double();
  V mean, var;
  moments(ctx, x, dims, &mean, &var);
  V rstd = ctx.unary(Hlo::Rsqrt, add(ctx, var, full(ctx, eps, var)));
  V y = mul(ctx, sub(ctx, x, mean), rstd);
  std::vector<int64_t> feature_dims = range(axis, rank);
  V w, b;
  if (optional_input(ctx, node, 2, acc, &w))
    y = mul(ctx, y, ctx.broadcast_in_dim(w, x.type.shape, range(axis, rank)));
  if (optional_input(ctx, node, 3, acc, &b))
    y = add(ctx, y, ctx.broadcast_in_dim(b, x.type.shape, range(axis, rank)));
  std::vector<int64_t> stat_shape = ctx.out(node, 1).shape;
  V mean_r = ctx.reshape(ctx.slice(mean, std::vector<int64_t>(rank, 0), kept_shape(x.type.shape, dims),
                                   std::vector<int64_t>(rank, 1)), stat_shape);
  V rstd_r = ctx.reshape(ctx.slice(rstd, std::vector<int64_t>(rank, 0), kept_shape(x.type.shape, dims),
                                   std::vector<int64_t>(rank, 1)), stat_shape);
  ctx.set_results({ctx.convert(y, out.dtype), ctx.convert(mean_r, ctx.out(node, 1).dtype),
                   ctx.convert(rstd_r, ctx.out(node, 2).dtype)});
}

// Gradient of x for y = xhat * w + b where xhat = (x - mean) * rstd normalizes over `dims`:
// dx = rstd / N * (N * g - sum(g) - xhat * sum(g * xhat)) with g = dy * w.
V normalized_grad(LoweringContext& ctx, const V& g, const V& xhat, const V& rstd, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= g.type.shape[d];
  V t = sub(ctx, mul(ctx, g, full(ctx, static_cast<double>(n), g)), sum_bcast(ctx, g, dims));
  t = sub(ctx, t, mul(ctx, xhat, sum_bcast(ctx, mul(ctx, g, xhat), dims)));
  return mul(ctx, t, div(ctx, rstd, full(ctx, static_cast<double>(n), rstd)));
}

// Layer and group norm's input gradient in CPU's form, which decides where NaN appears when
// a gradient is infinite: with ds = sum(g * x), db = sum(g) over `dims`,
// dx = rstd * g + b * x + c, b = (db * mean - ds) * rstd^3 / N, c = -b * mean - db * rstd / N.
V moments_grad(LoweringContext& ctx, const V& g, const V& x, const V& mean, const V& rstd, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= g.type.shape[d];
  V scale = full(ctx, 1.0 / static_cast<double>(n), g);
  V ds = sum_bcast(ctx, mul(ctx, g, x), dims), db = sum_bcast(ctx, g, dims);
  V b = mul(ctx, mul(ctx, sub(ctx, mul(ctx, db, mean), ds), mul(ctx, mul(ctx, rstd, rstd), rstd)), scale);
  V c = sub(ctx, mul(ctx, ctx.unary(Hlo::Negate, b), mean), mul(ctx, mul(ctx, db, rstd), scale));
  return add(ctx, add(ctx, mul(ctx, rstd, g), mul(ctx, b, x)), c);
}

// Results for outputs whose output_mask entry is set (the others are not node outputs).
void set_masked(LoweringContext& ctx, const Node& node, const Arg& mask, std::vector<V> all) {
  std::vector<V> results;
  size_t k = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (k >= node.outputs.size()) break;
    if (node.outputs.size() < all.size() && !mask.ints.at(i)) continue;
    results.push_back(ctx.convert(all[i], node.outputs[k].dtype));
    ++k;
  }
  ctx.set_results(results);
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
void lower_layer_norm_backward(LoweringContext& ctx, const Node& node) {
  V x0 = ctx.input(node, 1);
  DType acc = acc_dtype(x0.type.dtype);
  V x = ctx.convert(x0, acc);
  V dy = ctx.convert(ctx.input(node, 0), acc);
  int64_t rank = x.type.rank();
  int64_t axis = rank - static_cast<int64_t>(node.args[2].ints.size());
  std::vector<int64_t> dims = range(axis, rank), batch = range(0, axis);
  std::vector<int64_t> stat_shape = kept_shape(x.type.shape, dims);
  V mean = ctx.broadcast_to(ctx.reshape(ctx.convert(ctx.input(node, 3), acc), stat_shape), x.type.shape);
  V rstd = ctx.broadcast_to(ctx.reshape(ctx.convert(ctx.input(node, 4), acc), stat_shape), x.type.shape);
  V xhat = mul(ctx, sub(ctx, x, mean), rstd);
  V g = dy, w;
  bool has_w = optional_input(ctx, node, 5, acc, &w);
  if (has_w) g = mul(ctx, dy, ctx.broadcast_in_dim(w, x.type.shape, dims));
  std::vector<int64_t> feat(x.type.shape.begin() + axis, x.type.shape.end());
  V dx = moments_grad(ctx, g, x, mean, rstd, dims);
  V dw = sum_to(ctx, mul(ctx, dy, xhat), batch, feat);
  V db = sum_to(ctx, dy, batch, feat);
  set_masked(ctx, node, node.args[7], {dx, dw, db});
}

// native_group_norm(input, weight, bias, N, C, HxW, group, eps) -> (out, mean[N, G], rstd[N, G])
void lower_group_norm(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType acc = acc_dtype(out.dtype);
  V x0 = ctx.convert(ctx.input(node, 0), acc);
  int64_t N = node.args[3].i, C = node.args[4].i, HW = node.args[5].i, G = node.args[6].i;
  double eps = node.args[7].as_double();
  V x = ctx.reshape(x0, {N, G, C / G * HW});
  V mean, var;
  moments(ctx, x, {2}, &mean, &var);
  V rstd = ctx.unary(Hlo::Rsqrt, add(ctx, var, full(ctx, eps, var)));
  V y = ctx.reshape(mul(ctx, sub(ctx, x, mean), rstd), {N, C, HW});
  V w, b;
  if (optional_input(ctx, node, 1, acc, &w)) y = mul(ctx, y, along(ctx, w, {N, C, HW}, 1));
  if (optional_input(ctx, node, 2, acc, &b)) y = add(ctx, y, along(ctx, b, {N, C, HW}, 1));
  auto stat = [&](const V& v) {
    return ctx.reshape(ctx.slice(v, {0, 0, 0}, {N, G, 1}, {1, 1, 1}), {N, G});
  };
  ctx.set_results({ctx.convert(ctx.reshape(y, out.shape), out.dtype), ctx.convert(stat(mean), ctx.out(node, 1).dtype),
                   ctx.convert(stat(rstd), ctx.out(node, 2).dtype)});
}

// native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask)
void lower_group_norm_backward(LoweringContext& ctx, const Node& node) {
  V x0 = ctx.input(node, 1);
  DType acc = acc_dtype(x0.type.dtype);
  int64_t N = node.args[5].i, C = node.args[6].i, HW = node.args[7].i, G = node.args[8].i;
  int64_t D = C / G * HW;
  V x = ctx.reshape(ctx.convert(x0, acc), {N, G, D});
  V dy = ctx.reshape(ctx.convert(ctx.input(node, 0), acc), {N, C, HW});
  V mean = ctx.broadcast_in_dim(ctx.convert(ctx.input(node, 2), acc), {N, G, D}, {0, 1});
  V rstd = ctx.broadcast_in_dim(ctx.convert(ctx.input(node, 3), acc), {N, G, D}, {0, 1});
  V xhat = mul(ctx, sub(ctx, x, mean), rstd);
  V g = dy, w;
  if (optional_input(ctx, node, 4, acc, &w)) g = mul(ctx, dy, along(ctx, w, {N, C, HW}, 1));
  V dx = ctx.reshape(moments_grad(ctx, ctx.reshape(g, {N, G, D}), x, mean, rstd, {2}), x0.type.shape);
  V dw = sum_to(ctx, mul(ctx, dy, ctx.reshape(xhat, {N, C, HW})), {0, 2}, {C});
  V db = sum_to(ctx, dy, {0, 2}, {C});
  set_masked(ctx, node, node.args[9], {dx, dw, db});
}

// Batch norm forward shared by the _native_batch_norm_legit* family.
// Returns out, save_mean, save_invstd, new running mean/var (when running stats exist).
void batch_norm_forward(LoweringContext& ctx, const Node& node, int rm_arg, int rv_arg, bool training,
                        double momentum, double eps, std::vector<V>* results) {
  const TensorType& out = ctx.out(node);
  DType acc = acc_dtype(out.dtype);
  V x = ctx.convert(ctx.input(node, 0), acc);
  const auto& shape = x.type.shape;
  int64_t rank = x.type.rank();
  int64_t C = shape[1];
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < rank; ++i)
    if (i != 1) dims.push_back(i);
  V mean_b, invstd_b, mean_c, var_c;
  V rm, rv;
  bool has_running = rm_arg >= 0 && optional_input(ctx, node, rm_arg, acc, &rm) && optional_input(ctx, node, rv_arg, acc, &rv);
  if (training) {
    int64_t n = x.type.numel() / C;
    mean_c = div(ctx, sum_dims(ctx, x, dims), ctx.constant(static_cast<double>(n), acc, {C}));
    mean_b = along(ctx, mean_c, shape, 1);
    V c = sub(ctx, x, mean_b);
    var_c = div(ctx, sum_dims(ctx, mul(ctx, c, c), dims), ctx.constant(static_cast<double>(n), acc, {C}));
    V invstd_c = ctx.unary(Hlo::Rsqrt, add(ctx, var_c, ctx.constant(eps, acc, {C})));
    invstd_b = along(ctx, invstd_c, shape, 1);
    results->push_back(V{});  // out, filled below
    results->push_back(ctx.convert(mean_c, ctx.out(node, 1).dtype));
    results->push_back(ctx.convert(invstd_c, ctx.out(node, 2).dtype));
    if (has_running) {
      V m = ctx.constant(momentum, acc, {C});
      V keep = ctx.constant(1.0 - momentum, acc, {C});
      V unbiased = mul(ctx, var_c, ctx.constant(static_cast<double>(n) / std::max<int64_t>(n - 1, 1), acc, {C}));
      results->push_back(add(ctx, mul(ctx, keep, rm), mul(ctx, m, mean_c)));
      results->push_back(add(ctx, mul(ctx, keep, rv), mul(ctx, m, unbiased)));
    }
  } else {
    mean_b = along(ctx, rm, shape, 1);
    invstd_b = along(ctx, ctx.unary(Hlo::Rsqrt, add(ctx, rv, ctx.constant(eps, acc, {C}))), shape, 1);
    results->push_back(V{});
    results->push_back(ctx.constant(0, ctx.out(node, 1).dtype, ctx.out(node, 1).shape));
    results->push_back(ctx.constant(0, ctx.out(node, 2).dtype, ctx.out(node, 2).shape));
    results->push_back(rm);
    results->push_back(rv);
  }
  V y = mul(ctx, sub(ctx, x, mean_b), invstd_b);
  V w, b;
  if (optional_input(ctx, node, 1, acc, &w)) y = mul(ctx, y, along(ctx, w, shape, 1));
  if (optional_input(ctx, node, 2, acc, &b)) y = add(ctx, y, along(ctx, b, shape, 1));
  (*results)[0] = ctx.convert(y, out.dtype);
  results->resize(node.outputs.size());
  for (size_t i = 3; i < results->size(); ++i) (*results)[i] = ctx.convert((*results)[i], node.outputs[i].dtype);
}

// _native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps)
//   -> (out, save_mean, save_invstd, running_mean_out, running_var_out)
void lower_batch_norm_functional(LoweringContext& ctx, const Node& node) {
  std::vector<V> r;
  batch_norm_forward(ctx, node, 3, 4, node.args[5].as_bool(), node.args[6].as_double(), node.args[7].as_double(), &r);
  ctx.set_results(r);
}

// _native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
void lower_batch_norm_no_stats(LoweringContext& ctx, const Node& node) {
  std::vector<V> r;
  batch_norm_forward(ctx, node, -1, -1, true, node.args[4].as_double(), node.args[5].as_double(), &r);
  ctx.set_results(r);
}

// _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps)
void lower_batch_norm_no_training(LoweringContext& ctx, const Node& node) {
  std::vector<V> r;
  batch_norm_forward(ctx, node, 3, 4, false, node.args[5].as_double(), node.args[6].as_double(), &r);
  r.resize(3);
  ctx.set_results(r);
}

// native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
//                            save_invstd, train, eps, output_mask)
void lower_batch_norm_backward(LoweringContext& ctx, const Node& node) {
  V x0 = ctx.input(node, 1);
  DType acc = acc_dtype(x0.type.dtype);
  V x = ctx.convert(x0, acc);
  V dy = ctx.convert(ctx.input(node, 0), acc);
  const auto& shape = x.type.shape;
  int64_t C = shape[1];
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x.type.rank(); ++i)
    if (i != 1) dims.push_back(i);
  bool train = node.args[7].as_bool();
  double eps = node.args[8].as_double();
  V mean_c, invstd_c;
  if (train) {
    mean_c = ctx.convert(ctx.input(node, 5), acc);
    invstd_c = ctx.convert(ctx.input(node, 6), acc);
  } else {
    mean_c = ctx.convert(ctx.input(node, 3), acc);
    V rv = ctx.convert(ctx.input(node, 4), acc);
    invstd_c = ctx.unary(Hlo::Rsqrt, add(ctx, rv, ctx.constant(eps, acc, {C})));
  }
  V mean = along(ctx, mean_c, shape, 1), invstd = along(ctx, invstd_c, shape, 1);
  V xhat = mul(ctx, sub(ctx, x, mean), invstd);
  V g = dy, w;
  if (optional_input(ctx, node, 2, acc, &w)) g = mul(ctx, dy, along(ctx, w, shape, 1));
  V dx = train ? normalized_grad(ctx, g, xhat, invstd, dims) : mul(ctx, g, invstd);
  V dw = sum_dims(ctx, mul(ctx, dy, xhat), dims);
  V db = sum_dims(ctx, dy, dims);
  set_masked(ctx, node, node.args[9], {dx, dw, db});
}

LOWERING("aten::_softmax", lower_softmax, Softmax::Plain, kFloatOnly);
LOWERING("aten::_log_softmax", lower_softmax, Softmax::Log, kFloatOnly);
LOWERING("aten::_safe_softmax", lower_softmax, Softmax::Safe);
LOWERING("aten::_softmax_backward_data", lower_softmax_backward, Softmax::Plain);
LOWERING("aten::_log_softmax_backward_data", lower_softmax_backward, Softmax::Log);
LOWERING("aten::native_layer_norm", lower_layer_norm);
LOWERING("aten::native_layer_norm_backward", lower_layer_norm_backward);
LOWERING("aten::native_group_norm", lower_group_norm);
LOWERING("aten::native_group_norm_backward", lower_group_norm_backward);
LOWERING("aten::_native_batch_norm_legit_functional", lower_batch_norm_functional);
LOWERING("aten::_native_batch_norm_legit.no_stats", lower_batch_norm_no_stats);
LOWERING("aten::_native_batch_norm_legit_no_training", lower_batch_norm_no_training);
LOWERING("aten::native_batch_norm_backward", lower_batch_norm_backward);

}  // namespace
}  // namespace torchtpu
