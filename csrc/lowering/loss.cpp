// Losses: nll_loss(2d) forward/backward, mse, smooth_l1, huber, binary_cross_entropy,
// multi_margin_loss and multilabel_margin_loss forward/backward.
// reduction: 0 none, 1 mean, 2 sum (at::Reduction).
#include "lowering/common.h"

namespace torchtpu {
namespace {

V mul(LoweringContext& ctx, const V& a, const V& b) { return ctx.binary(Hlo::Multiply, a, b); }
V sub(LoweringContext& ctx, const V& a, const V& b) { return ctx.binary(Hlo::Subtract, a, b); }
V div(LoweringContext& ctx, const V& a, const V& b) { return ctx.binary(Hlo::Divide, a, b); }
V full(LoweringContext& ctx, double v, const V& like) { return ctx.constant(v, like.type.dtype, like.type.shape); }
DType acc_dtype(DType t) { return t == DType::BFloat16 || t == DType::Float16 ? DType::Float32 : t; }

std::vector<int64_t> all_dims(int64_t rank) {
  std::vector<int64_t> d;
  for (int64_t i = 0; i < rank; ++i) d.push_back(i);
  return d;
}

// Applies the reduction to an elementwise loss and converts to the output type.
V reduce_loss(LoweringContext& ctx, const V& loss, int64_t reduction, const TensorType& out) {
  if (reduction == 0) return ctx.convert(loss, out.dtype);
  V total = sum_dims(ctx, loss, all_dims(loss.type.rank()));
  if (reduction == 1)
    total = ctx.binary(Hlo::Divide, total, ctx.constant(static_cast<double>(loss.type.numel()), total.type.dtype));
  return ctx.reshape(ctx.convert(total, out.dtype), out.shape);
}

// The incoming gradient of a reduced loss, broadcast to shape (divided by numel for mean).
V loss_grad(LoweringContext& ctx, const V& grad, int64_t reduction, DType dtype, const std::vector<int64_t>& shape) {
  V g = ctx.convert(grad, dtype);
  if (reduction == 0) return ctx.broadcast_to(g, shape);
  g = ctx.broadcast_to(ctx.reshape(g, {}), shape);
  if (reduction == 1) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    g = div(ctx, g, ctx.constant(static_cast<double>(n), dtype, shape));
  }
  return g;
}

// -- nll_loss ----------------------------------------------------------------------------------

struct NllParts {
  V onehot;   // bool, self's shape: the target class of each sample
  V weight;   // per-sample weight (0 where ignored), target's shape
  V kept;     // bool, target's shape: the target is not ignore_index
  int64_t class_dim;
};

// The forward checks the targets (the backward reads the same ones).
NllParts nll_parts(LoweringContext& ctx, const Node& node, int self_arg, DType dtype, bool check_targets) {
  V self = ctx.input(node, self_arg);
  V target = ctx.input(node, self_arg + 1);
  int weight_arg = self_arg + 2;
  int64_t ignore = node.args[self_arg + 4].as_int();
  const auto& shape = self.type.shape;
  NllParts p;
  p.class_dim = self.type.rank() == 1 ? 0 : 1;
  int64_t C = shape[p.class_dim];
  std::vector<int64_t> target_dims;
  for (int64_t i = 0; i < self.type.rank(); ++i)
    if (i != p.class_dim) target_dims.push_back(i);
  V t = ctx.convert(target, DType::Int64);
  if (check_targets) {
    const auto& ts = t.type.shape;
    V below = ctx.compare(Cmp::LT, t, ctx.constant_int(0, DType::Int64, ts));
    V above = ctx.compare(Cmp::GE, t, ctx.constant_int(C, DType::Int64, ts));
    V counted = ctx.compare(Cmp::NE, t, ctx.constant_int(ignore, DType::Int64, ts));
    V bad = ctx.emit(Hlo::And, {counted, ctx.emit(Hlo::Or, {below, above}, below.type)}, below.type);
    ctx.check(bad, t, RuntimeCheck{RuntimeCheck::Error::Index, "Target {} is out of bounds."});
  }
  V classes = ctx.iota(TensorType{shape, DType::Int64}, p.class_dim);
  p.onehot = ctx.compare(Cmp::EQ, classes, ctx.broadcast_in_dim(t, shape, target_dims));
  V w;
  if (ctx.has_input(node, weight_arg)) {
    V wb = ctx.broadcast_in_dim(ctx.convert(ctx.input(node, weight_arg), dtype), shape, {p.class_dim});
    w = sum_dims(ctx, ctx.select(p.onehot, wb, ctx.constant(0, dtype, shape)), {p.class_dim});
  } else {
    w = ctx.constant(1, dtype, t.type.shape);
  }
  p.kept = ctx.compare(Cmp::NE, t, ctx.constant_int(ignore, DType::Int64, t.type.shape));
  p.weight = ctx.select(p.kept, w, ctx.constant(0, dtype, t.type.shape));
  return p;
}

// nll_loss_forward(self, target, weight, reduction, ignore_index) -> (output, total_weight)
void lower_nll_loss(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType acc = acc_dtype(out.dtype);
  V self = ctx.convert(ctx.input(node, 0), acc);
  NllParts p = nll_parts(ctx, node, 0, acc, /*check_targets=*/true);
  int64_t reduction = node.args[3].as_int();
  V picked = sum_dims(ctx, ctx.select(p.onehot, self, full(ctx, 0, self)), {p.class_dim});
  V loss = ctx.unary(Hlo::Negate, mul(ctx, picked, p.weight));
  V total_weight = sum_dims(ctx, p.weight, all_dims(p.weight.type.rank()));
  V output;
  if (reduction == 0) {
    output = ctx.convert(loss, out.dtype);
  } else {
    V total = sum_dims(ctx, loss, all_dims(loss.type.rank()));
    if (reduction == 1) total = div(ctx, total, total_weight);
    output = ctx.reshape(ctx.convert(total, out.dtype), out.shape);
  }
  const TensorType& tw = ctx.out(node, 1);
  ctx.set_results({output, ctx.reshape(ctx.convert(total_weight, tw.dtype), tw.shape)});
}

// nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)
void lower_nll_loss_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType acc = acc_dtype(out.dtype);
  NllParts p = nll_parts(ctx, node, 1, acc, /*check_targets=*/false);
  int64_t reduction = node.args[4].as_int();
  V g = ctx.convert(ctx.input(node, 0), acc);
  if (reduction == 0) {
    g = mul(ctx, ctx.reshape(g, p.weight.type.shape), p.weight);
  } else {
    g = ctx.broadcast_to(ctx.reshape(g, {}), p.weight.type.shape);
    if (reduction == 1)
      g = div(ctx, g, ctx.broadcast_to(ctx.reshape(ctx.convert(ctx.input(node, 6), acc), {}), g.type.shape));
    g = mul(ctx, g, p.weight);
  }
  // CPU writes the gradient of kept samples only: an ignored one stays 0 even when the mean's
  // total weight is 0 (every target ignored: the scale is inf or NaN, and 0 * inf is NaN).
  g = ctx.select(p.kept, g, ctx.constant(0, acc, g.type.shape));
  std::vector<int64_t> target_dims;
  for (int64_t i = 0; i < out.rank(); ++i)
    if (i != p.class_dim) target_dims.push_back(i);
  V gb = ctx.broadcast_in_dim(ctx.unary(Hlo::Negate, g), out.shape, target_dims);
  ctx.set_result(ctx.convert(ctx.select(p.onehot, gb, ctx.constant(0, acc, out.shape)), out.dtype));
}

// -- elementwise losses --------------------------------------------------------------------------

// Elementwise loss kinds (the rule's parameter).
enum class Loss : uint8_t { Mse, SmoothL1, Huber };

V elementwise_loss(LoweringContext& ctx, Loss kind, const V& x, const V& t, double param) {
  V d = sub(ctx, x, t);
  if (kind == Loss::Mse) return mul(ctx, d, d);
  V z = ctx.unary(Hlo::Abs, d);
  if (kind == Loss::SmoothL1) {
    if (param == 0) return z;
    V quad = div(ctx, mul(ctx, full(ctx, 0.5, z), mul(ctx, z, z)), full(ctx, param, z));
    return ctx.select(ctx.compare(Cmp::LT, z, full(ctx, param, z)), quad, sub(ctx, z, full(ctx, 0.5 * param, z)));
  }
  // huber
  V quad = mul(ctx, full(ctx, 0.5, z), mul(ctx, z, z));
  V lin = mul(ctx, full(ctx, param, z), sub(ctx, z, full(ctx, 0.5 * param, z)));
  return ctx.select(ctx.compare(Cmp::LT, z, full(ctx, param, z)), quad, lin);
}

// d loss / d x (before the incoming gradient).
V elementwise_loss_grad(LoweringContext& ctx, Loss kind, const V& x, const V& t, double param) {
  V d = sub(ctx, x, t);
  if (kind == Loss::Mse) return mul(ctx, full(ctx, 2, d), d);
  V lo = ctx.compare(Cmp::LE, d, full(ctx, -param, d));
  V hi = ctx.compare(Cmp::GE, d, full(ctx, param, d));
  V mid = kind == Loss::SmoothL1 ? div(ctx, d, full(ctx, param, d)) : d;
  double edge = kind == Loss::SmoothL1 ? 1.0 : param;
  return ctx.select(lo, full(ctx, -edge, d), ctx.select(hi, full(ctx, edge, d), mid));
}

// mse_loss(self, target, reduction) / smooth_l1_loss(..., beta) / huber_loss(..., delta)
void lower_loss(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  V t0 = ctx.input(node, 1);
  DType dtype = promote_types(x.type.dtype, t0.type.dtype);
  std::vector<int64_t> shape = x.type.shape;
  if (t0.type.rank() > x.type.rank() || t0.type.numel() > x.type.numel()) shape = t0.type.shape;
  x = to_type(ctx, x, dtype, shape);
  V t = to_type(ctx, t0, dtype, shape);
  double param = node.args.size() > 3 ? node.args[3].as_double() : 0.0;
  ctx.set_result(reduce_loss(ctx, elementwise_loss(ctx, rule_param<Loss>(node), x, t, param), node.args[2].as_int(), out));
}

// *_loss_backward(grad_output, self, target, reduction[, param])
void lower_loss_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = to_type(ctx, ctx.input(node, 1), out.dtype, out.shape);
  V t = to_type(ctx, ctx.input(node, 2), out.dtype, out.shape);
  int64_t reduction = node.args[3].as_int();
  double param = node.args.size() > 4 ? node.args[4].as_double() : 0.0;
  V g = loss_grad(ctx, ctx.input(node, 0), reduction, out.dtype, out.shape);
  ctx.set_result(mul(ctx, elementwise_loss_grad(ctx, rule_param<Loss>(node), x, t, param), g));
}

// binary_cross_entropy(self, target, weight, reduction): log terms clamped at -100 like PyTorch.
void lower_bce(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  V t = ctx.convert(ctx.input(node, 1), x.type.dtype);
  V floor = full(ctx, -100, x);
  V log_x = ctx.binary(Hlo::Maximum, ctx.unary(Hlo::Log, x), floor);
  V log_1mx = ctx.binary(Hlo::Maximum, ctx.unary(Hlo::Log, sub(ctx, full(ctx, 1, x), x)), floor);
  V loss = ctx.unary(Hlo::Negate,
                     ctx.binary(Hlo::Add, mul(ctx, t, log_x), mul(ctx, sub(ctx, full(ctx, 1, t), t), log_1mx)));
  if (ctx.has_input(node, 2)) loss = mul(ctx, loss, to_type(ctx, ctx.input(node, 2), x.type.dtype, x.type.shape));
  ctx.set_result(reduce_loss(ctx, loss, node.args[3].as_int(), out));
}

// binary_cross_entropy_backward(grad_output, self, target, weight, reduction):
// grad * (x - t) / max(x * (1 - x), 1e-12) * weight
void lower_bce_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.convert(ctx.input(node, 1), out.dtype);
  V t = ctx.convert(ctx.input(node, 2), out.dtype);
  V denom = ctx.binary(Hlo::Maximum, mul(ctx, x, sub(ctx, full(ctx, 1, x), x)), full(ctx, 1e-12, x));
  V r = div(ctx, sub(ctx, x, t), denom);
  if (ctx.has_input(node, 3)) r = mul(ctx, r, to_type(ctx, ctx.input(node, 3), out.dtype, out.shape));
  ctx.set_result(mul(ctx, r, loss_grad(ctx, ctx.input(node, 0), node.args[4].as_int(), out.dtype, out.shape)));
}

// CPU takes class targets in int64 or uint8 ("expected target dtype to be Long or Byte, but got Int").
constexpr DTypeSet kTargetNotInt64OrUInt8 = kIndexNotInt64 & ~dtype_set(DType::UInt8);
constexpr RuleFlags kNllLoss{.refuses = kBoolDTypes | kIntegerDTypes, .judged_on = Judged::Self, .index_arg = 1,
                             .index_refuses = kTargetNotInt64OrUInt8};
constexpr RuleFlags kNllLossBackward{.index_arg = 2, .index_refuses = kTargetNotInt64OrUInt8};
// -- multi_margin_loss ---------------------------------------------------------------------------
// CPU's kernel per sample (row of C scores, target y): the sum over d != y of
// max(0, margin - x[y] + x[d])^p * w[y], over C; p (1 or 2) and margin are static (they shape
// the graph; a model keeps them fixed).

struct MarginParts {
  V x;          // [N, C] in the computing dtype (a vector or a 0-d score as one row)
  V onehot;     // [N, C] bool: d == y
  V z;          // [N, C]: margin - x[y] + x[d]
  V active;     // [N, C] bool: d != y and z > 0
  V weight;     // [N, C]: w[y] broadcast along the row (1 without weights)
  int64_t rows, classes;
};

MarginParts margin_parts(LoweringContext& ctx, const Node& node, int self_arg, bool check_targets) {
  V self = ctx.input(node, self_arg);
  DType dt = self.type.dtype;
  MarginParts m;
  m.classes = self.type.rank() == 2 ? self.type.shape[1] : self.type.rank() == 1 ? self.type.shape[0] : 1;
  m.rows = self.type.rank() == 2 ? self.type.shape[0] : 1;
  std::vector<int64_t> shape{m.rows, m.classes};
  m.x = ctx.reshape(self, shape);
  V t = ctx.reshape(ctx.convert(ctx.input(node, self_arg + 1), DType::Int64), {m.rows});
  if (check_targets) {
    V below = ctx.compare(Cmp::LT, t, ctx.constant_int(0, DType::Int64, {m.rows}));
    V above = ctx.compare(Cmp::GE, t, ctx.constant_int(m.classes, DType::Int64, {m.rows}));
    ctx.check(ctx.binary(Hlo::Or, below, above), t, RuntimeCheck{RuntimeCheck::Error::Runtime, "target out of range"});
  }
  m.onehot = ctx.compare(Cmp::EQ, ctx.iota(TensorType{shape, DType::Int64}, 1), ctx.broadcast_in_dim(t, shape, {0}));
  V picked = sum_dims(ctx, ctx.select(m.onehot, m.x, ctx.constant(0, dt, shape)), {1});
  V margin = ctx.constant(node.args[self_arg + 3].as_double(), dt, shape);
  m.z = ctx.binary(Hlo::Add, sub(ctx, margin, ctx.broadcast_in_dim(picked, shape, {0})), m.x);
  m.active = ctx.binary(Hlo::And, ctx.unary(Hlo::Not, m.onehot),
                        ctx.compare(Cmp::GT, m.z, ctx.constant(0, dt, shape)));
  int weight_arg = self_arg + 4;
  if (ctx.has_input(node, weight_arg)) {
    V wb = ctx.broadcast_in_dim(ctx.input(node, weight_arg), shape, {1});
    V w = sum_dims(ctx, ctx.select(m.onehot, wb, ctx.constant(0, dt, shape)), {1});
    m.weight = ctx.broadcast_in_dim(w, shape, {0});
  }
  return m;
}

// multi_margin_loss(self, target, p, margin, weight, reduction)
void lower_multi_margin_loss(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  MarginParts m = margin_parts(ctx, node, 0, /*check_targets=*/true);
  const TensorType& xt = m.x.type;
  V h = node.args[2].as_int() == 1 ? m.z : mul(ctx, m.z, m.z);
  if (!m.weight.name.empty()) h = mul(ctx, h, m.weight);
  h = ctx.select(m.active, h, ctx.constant(0, xt.dtype, xt.shape));
  V per_row = div(ctx, sum_dims(ctx, h, {1}), ctx.constant(static_cast<double>(m.classes), xt.dtype, {m.rows}));
  int64_t reduction = node.args[5].as_int();
  if (reduction == 0) {
    ctx.set_result(ctx.reshape(per_row, out.shape));
    return;
  }
  V total = sum_dims(ctx, per_row, {0});
  if (reduction == 1) total = div(ctx, total, ctx.constant(static_cast<double>(m.rows), xt.dtype));
  ctx.set_result(ctx.reshape(total, out.shape));
}

// multi_margin_loss_backward(grad_output, self, target, p, margin, weight, reduction): each
// active d gets h = g (p = 1) or 2*g*z (p = 2), times w[y], and the target the negated sum;
// g = 1/C, or 1/(N*C) for a mean.
void lower_multi_margin_loss_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  MarginParts m = margin_parts(ctx, node, 1, /*check_targets=*/false);
  const TensorType& xt = m.x.type;
  int64_t reduction = node.args[6].as_int();
  double g = reduction == 1 ? 1.0 / static_cast<double>(m.rows * m.classes) : 1.0 / static_cast<double>(m.classes);
  V gv = ctx.constant(g, xt.dtype, xt.shape);
  V h = node.args[3].as_int() == 1 ? gv : mul(ctx, mul(ctx, ctx.constant(2, xt.dtype, xt.shape), gv), m.z);
  if (!m.weight.name.empty()) h = mul(ctx, h, m.weight);
  h = ctx.select(m.active, h, ctx.constant(0, xt.dtype, xt.shape));
  V target_grad = ctx.unary(Hlo::Negate, sum_dims(ctx, h, {1}));
  V grad = ctx.select(m.onehot, ctx.broadcast_in_dim(target_grad, xt.shape, {0}), h);
  V go = ctx.input(node, 0);
  if (reduction == 0 && go.type.rank() > 0)
    go = ctx.broadcast_in_dim(ctx.reshape(go, {m.rows}), xt.shape, {0});
  else
    go = ctx.broadcast_to(ctx.reshape(go, {}), xt.shape);
  ctx.set_result(ctx.reshape(mul(ctx, grad, go), out.shape));
}

// p other than 1 or 2 ("only p == 1 and p == 2 supported"): CPU's kernel raises it. Argument p
// is the third of the forward, the fourth of the backward.
template <int p_arg>
DTypeSet margin_p_refuses(const std::vector<Arg>& args) {
  if (args.size() <= p_arg) return 0;
  double p = args[p_arg].as_double();
  return p == 1.0 || p == 2.0 ? 0 : kAllDTypes;
}
// CPU's kernels take float32 and float64 only (AT_DISPATCH_FLOATING_TYPES): others raise there.
constexpr DTypeSet kMarginRefuses = kBoolDTypes | kIntegerDTypes | dtype_set(DType::Float16) | dtype_set(DType::BFloat16);
constexpr RuleFlags kMarginLoss{.static_scalars = true, .refuses = kMarginRefuses, .refuses_for = margin_p_refuses<2>};
constexpr RuleFlags kMarginLossBackward{.static_scalars = true, .refuses = kMarginRefuses,
                                        .refuses_for = margin_p_refuses<3>};

// -- multilabel_margin_loss ----------------------------------------------------------------------
// CPU's kernel per sample: the targets are the row's class indices up to its first negative one;
// the loss sums max(0, 1 - x[y_k] + x[d]) over those targets k and the classes d that are no
// target, over C. Pairs are [N, K, C] (K = C target slots): a multilabel problem has few classes.

struct MultilabelParts {
  V x;        // [N, C]
  V active;   // [N, K, C] bool: slot k holds a target, d is no target, and its margin is violated
  V z;        // [N, K, C]: 1 - x[y_k] + x[d]
  V picks;    // [N, K, C] bool: y_k == d
  int64_t rows, classes;
};

// is_target: [N, C] of the row's targets, computed (forward: empty on entry) or the given one
// reshaped to [N, C] (backward: CPU reads the forward's).
MultilabelParts multilabel_parts(LoweringContext& ctx, const Node& node, int self_arg, bool check_targets,
                                 V* is_target) {
  V self = ctx.input(node, self_arg);
  DType dt = self.type.dtype;
  MultilabelParts m;
  m.classes = self.type.rank() == 2 ? self.type.shape[1] : self.type.rank() == 1 ? self.type.shape[0] : 1;
  m.rows = self.type.rank() == 2 ? self.type.shape[0] : 1;
  int64_t n = m.rows, c = m.classes;
  std::vector<int64_t> row{n, c}, pairs{n, c, c};
  m.x = ctx.reshape(self, row);
  V t = ctx.reshape(ctx.convert(ctx.input(node, self_arg + 1), DType::Int64), row);
  if (check_targets) {
    V below = ctx.compare(Cmp::LT, t, ctx.constant_int(-1, DType::Int64, row));
    V above = ctx.compare(Cmp::GE, t, ctx.constant_int(c, DType::Int64, row));
    ctx.check(ctx.binary(Hlo::Or, below, above), t,
              RuntimeCheck{RuntimeCheck::Error::Runtime, "argument #2 'target' is out of range"});
  }
  // Slot k holds a target when no slot up to k is negative (a running count of negatives).
  TensorType pair_ints{pairs, DType::Int64};
  V zeros = ctx.constant_int(0, DType::Int64, row);
  V negatives = cumsum_along(ctx, ctx.select(ctx.compare(Cmp::LT, t, zeros), ctx.constant_int(1, DType::Int64, row), zeros), 1);
  V slot = ctx.broadcast_in_dim(ctx.compare(Cmp::EQ, negatives, zeros), pairs, {0, 1});
  m.picks = ctx.compare(Cmp::EQ, ctx.broadcast_in_dim(t, pairs, {0, 1}), ctx.iota(pair_ints, 2));
  if (!is_target->name.empty()) {
    *is_target = ctx.reshape(*is_target, row);
  } else {
    V hits = ctx.select(ctx.binary(Hlo::And, m.picks, slot), ctx.constant_int(1, DType::Int64, pairs),
                        ctx.constant_int(0, DType::Int64, pairs));
    V marks = ctx.compare(Cmp::GT, sum_dims(ctx, hits, {1}), zeros);
    *is_target = ctx.select(marks, ctx.constant(1, dt, row), ctx.constant(0, dt, row));
  }
  V no_target = ctx.broadcast_in_dim(ctx.compare(Cmp::EQ, *is_target, ctx.constant(0, dt, row)), pairs, {0, 2});
  V xd = ctx.broadcast_in_dim(m.x, pairs, {0, 2});
  // x[y_k] by selection (a product with a one-hot would turn a NaN elsewhere in the row into NaN).
  V target_score = sum_dims(ctx, ctx.select(m.picks, xd, ctx.constant(0, dt, pairs)), {2});
  m.z = ctx.binary(Hlo::Add, sub(ctx, ctx.constant(1, dt, pairs), ctx.broadcast_in_dim(target_score, pairs, {0, 1})), xd);
  m.active = ctx.binary(Hlo::And, ctx.binary(Hlo::And, slot, no_target),
                        ctx.compare(Cmp::GT, m.z, ctx.constant(0, dt, pairs)));
  return m;
}

// multilabel_margin_loss_forward(self, target, reduction) -> (output, is_target)
void lower_multilabel_margin_loss(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V is_target;
  MultilabelParts m = multilabel_parts(ctx, node, 0, /*check_targets=*/true, &is_target);
  DType dt = m.x.type.dtype;
  V per_row = sum_dims(ctx, ctx.select(m.active, m.z, ctx.constant(0, dt, m.z.type.shape)), {1, 2});
  int64_t reduction = node.args[2].as_int();
  V output;
  if (reduction == 0 && out.rank() > 0) {
    output = div(ctx, per_row, ctx.constant(static_cast<double>(m.classes), dt, {m.rows}));
  } else {
    output = div(ctx, sum_dims(ctx, per_row, {0}), ctx.constant(static_cast<double>(m.classes), dt));
    if (reduction == 1) output = div(ctx, output, ctx.constant(static_cast<double>(m.rows), dt));
  }
  const TensorType& marks = ctx.out(node, 1);
  ctx.set_results({ctx.reshape(output, out.shape), ctx.reshape(is_target, marks.shape)});
}

// multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target): each
// violated (target k, class d) pair adds g to d and takes g from y_k; g = 1/C, or 1/(N*C) for a mean.
void lower_multilabel_margin_loss_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V is_target = ctx.input(node, 4);
  MultilabelParts m = multilabel_parts(ctx, node, 1, /*check_targets=*/false, &is_target);
  DType dt = m.x.type.dtype;
  const std::vector<int64_t>& pairs = m.z.type.shape;
  int64_t reduction = node.args[3].as_int();
  double g = reduction == 1 ? 1.0 / static_cast<double>(m.rows * m.classes) : 1.0 / static_cast<double>(m.classes);
  V count = ctx.select(m.active, ctx.constant(1, dt, pairs), ctx.constant(0, dt, pairs));
  V gained = sum_dims(ctx, count, {1});                         // [N, C]: violations where d is the class
  V per_slot = ctx.broadcast_in_dim(sum_dims(ctx, count, {2}), pairs, {0, 1});  // per target slot
  V lost = sum_dims(ctx, ctx.select(m.picks, per_slot, ctx.constant(0, dt, pairs)), {1});
  V grad = mul(ctx, sub(ctx, gained, lost), ctx.constant(g, dt, m.x.type.shape));
  V go = ctx.input(node, 0);
  if (reduction == 0 && go.type.rank() > 0)
    go = ctx.broadcast_in_dim(ctx.reshape(go, {m.rows}), m.x.type.shape, {0});
  else
    go = ctx.broadcast_to(ctx.reshape(go, {}), m.x.type.shape);
  ctx.set_result(ctx.reshape(mul(ctx, grad, go), out.shape));
}

constexpr RuleFlags kMultilabelMarginLoss{.refuses = kMarginRefuses};
LOWERING("aten::multilabel_margin_loss_forward", lower_multilabel_margin_loss, nullptr, kMultilabelMarginLoss);
LOWERING("aten::multilabel_margin_loss_backward", lower_multilabel_margin_loss_backward, nullptr,
         kMultilabelMarginLoss);
LOWERING("aten::multi_margin_loss", lower_multi_margin_loss, nullptr, kMarginLoss);
LOWERING("aten::multi_margin_loss_backward", lower_multi_margin_loss_backward, nullptr, kMarginLossBackward);
LOWERING("aten::nll_loss_forward", lower_nll_loss, nullptr, kNllLoss);
LOWERING("aten::nll_loss2d_forward", lower_nll_loss, nullptr, kNllLoss);
LOWERING("aten::nll_loss_backward", lower_nll_loss_backward, nullptr, kNllLossBackward);
LOWERING("aten::nll_loss2d_backward", lower_nll_loss_backward, nullptr, kNllLossBackward);
LOWERING("aten::mse_loss", lower_loss, Loss::Mse);
LOWERING("aten::mse_loss_backward", lower_loss_backward, Loss::Mse);
LOWERING("aten::smooth_l1_loss", lower_loss, Loss::SmoothL1, kSelfFloatOnly);
LOWERING("aten::smooth_l1_loss_backward", lower_loss_backward, Loss::SmoothL1);
LOWERING("aten::huber_loss", lower_loss, Loss::Huber, kSelfFloatOnly);
LOWERING("aten::huber_loss_backward", lower_loss_backward, Loss::Huber);
LOWERING("aten::binary_cross_entropy", lower_bce);
LOWERING("aten::binary_cross_entropy_backward", lower_bce_backward);

}  // namespace
}  // namespace torchtpu
