// CTC loss (nn.CTCLoss) forward and backward as CPU's kernel computes them: the alpha and beta
// recursions over time in log space, each one stablehlo.while over t with every batch item and
// every position s of the blank-extended target (l') updated at once; the gradient sums
// alpha * beta per class in log space, in CPU's order. The lengths are numbers here (the tensor-lengths
// overloads read them on the host first, as CUDA's kernels do: device/data_dependent.cpp).
#include <limits>

#include "lowering/common.h"

namespace torchtpu {
namespace {

// A constant int64 vector.
V int_vector(LoweringContext& ctx, const std::vector<int64_t>& values) {
  TensorType type{{static_cast<int64_t>(values.size())}, DType::Int64};
  std::string literal;
  for (size_t i = 0; i < values.size(); ++i) literal += (i ? ", " : "") + std::to_string(values[i]);
  return ctx.emit(Hlo::Constant, {}, type, "value = dense<[" + literal + "]> : " + type.mlir());
}

// CPU's argument checks (ctc_loss_cpu_template), in its words.
void check_ctc_arguments(const V& log_probs, const V& targets, const std::vector<int64_t>& input_lengths,
                         const std::vector<int64_t>& target_lengths, int64_t blank) {
  const char* from = " (while checking arguments for ctc_loss_cpu)";
  int64_t batch = log_probs.type.shape[1], labels = log_probs.type.shape[2], steps = log_probs.type.shape[0];
  check_argument(0 <= blank && blank < labels, "blank must be in label range");
  check_argument(static_cast<int64_t>(input_lengths.size()) == batch, "input_lengths must be of size batch_size");
  check_argument(static_cast<int64_t>(target_lengths.size()) == batch, "target_lengths must be of size batch_size");
  int64_t total = 0, longest = 0;
  for (int64_t length : target_lengths) {
    check_argument(length >= 0, "Expected target_lengths to have value at least 0, but got value " +
                                    std::to_string(length) + from);
    total += length;
    longest = std::max(longest, length);
  }
  if (targets.type.rank() == 1) {
    check_argument(targets.type.shape[0] == total, "Expected tensor to have size " + std::to_string(total) +
                                                       " at dimension 0, but got size " +
                                                       std::to_string(targets.type.shape[0]) +
                                                       " for argument #2 'targets' (while checking arguments for "
                                                       "ctc_loss_cpu)");
  } else {
    check_argument(targets.type.shape[1] >= longest,
                   "Expected tensor to have size at least " + std::to_string(longest) + " at dimension 1, but got size " +
                       std::to_string(targets.type.shape[1]) + " for argument #2 'targets'" + from);
  }
  for (int64_t length : input_lengths) {
    check_argument(length >= 0, "Expected input_lengths to have value at least 0, but got value " +
                                    std::to_string(length) + from);
    check_argument(length <= steps, "Expected input_lengths to have value at most " + std::to_string(steps) +
                                        ", but got value " + std::to_string(length) + from);
  }
}

// What both directions share: the extended targets l' of every batch item, masks over its
// positions s in [0, S) (S = 2 * longest target + 1), and log_probs read at l'.
struct CtcSetup {
  int64_t steps, batch, labels, positions;
  DType dt;
  std::vector<int64_t> input_lengths, target_lengths;
  V prime;      // [N, S] int64: blank at even s, the target's label (s-1)/2 at odd s
  V extended;   // [N, S] int64: 2 * target_length + 1
  V in_target;  // [N, S] bool: s < extended
  V at_prime;   // [T, N, S]: log_probs[t, b, prime[b, s]]
  V neg_inf;    // -inf, [N, S]

  std::vector<int64_t> row() const { return {batch, positions}; }
};

// `lengths`: the argument index of input_lengths (target_lengths follow), `blank_arg` the blank's.
CtcSetup ctc_setup(LoweringContext& ctx, const Node& node, const V& log_probs, const V& targets_in, int64_t positions,
                   int lengths, int blank_arg) {
  CtcSetup c;
  c.steps = log_probs.type.shape[0];
  c.batch = log_probs.type.shape[1];
  c.labels = log_probs.type.shape[2];
  c.positions = positions;
  c.dt = log_probs.type.dtype;
  c.input_lengths = node.args[lengths].ints;
  c.target_lengths = node.args[lengths + 1].ints;
  int64_t blank = node.args[blank_arg].i;
  check_ctc_arguments(log_probs, targets_in, c.input_lengths, c.target_lengths, blank);
  std::vector<int64_t> row = c.row();
  TensorType it{row, DType::Int64};
  auto i64 = [&](int64_t v) { return ctx.constant_int(v, DType::Int64, row); };
  V s = ctx.iota(it, 1);
  V label_at = ctx.binary(Hlo::Divide, ctx.binary(Hlo::Subtract, s, i64(1)), i64(2));
  label_at = ctx.binary(Hlo::Maximum, label_at, i64(0));
  V is_label = ctx.compare(Cmp::EQ, ctx.binary(Hlo::Remainder, s, i64(2)), i64(1));
  V targets = ctx.convert(targets_in, DType::Int64);
  V prime = i64(blank);
  if (targets.type.numel() > 0) {
    // Where label (s-1)/2 of item b sits in the targets: b's row of a 2-d targets tensor, or
    // its offset (the lengths before it) in concatenated 1-d targets.
    std::vector<int64_t> offsets;
    int64_t pos = 0;
    for (int64_t b = 0; b < c.batch; ++b) {
      offsets.push_back(targets.type.rank() == 2 ? b * targets.type.shape[1] : pos);
      pos += c.target_lengths[b];
    }
    V where = ctx.binary(Hlo::Add, ctx.broadcast_in_dim(int_vector(ctx, offsets), row, {0}), label_at);
    where = ctx.binary(Hlo::Minimum, where, i64(targets.type.numel() - 1));
    prime = ctx.select(is_label, gather_linear(ctx, targets, where), prime);
  }
  c.prime = prime;
  c.extended = ctx.binary(
      Hlo::Add,
      ctx.binary(Hlo::Multiply, ctx.broadcast_in_dim(int_vector(ctx, c.target_lengths), row, {0}), i64(2)),
      i64(1));
  c.in_target = ctx.compare(Cmp::LT, s, c.extended);
  std::vector<int64_t> cube = {c.steps, c.batch, c.positions};
  V clamped = ctx.binary(Hlo::Minimum, ctx.binary(Hlo::Maximum, prime, i64(0)), i64(c.labels - 1));
  V linear = ctx.binary(Hlo::Add, affine_index(ctx, cube, {c.batch * c.labels, c.labels, 0}, 0, DType::Int64),
                        ctx.broadcast_in_dim(clamped, cube, {1, 2}));
  c.at_prime = gather_linear(ctx, log_probs, linear);
  c.neg_inf = ctx.constant(-std::numeric_limits<double>::infinity(), c.dt, row);
  return c;
}

// x shifted `by` positions along s, toward larger s (by > 0) or smaller (by < 0), -inf filled.
V shift_positions(LoweringContext& ctx, const CtcSetup& c, const V& x, int64_t by) {
  int64_t n = c.positions, k = std::min<int64_t>(std::abs(by), n);
  if (k == n) return c.neg_inf;
  V fill = ctx.constant(-std::numeric_limits<double>::infinity(), c.dt, {c.batch, k});
  if (by > 0) return ctx.concatenate({fill, ctx.slice(x, {0, 0}, {c.batch, n - k}, {1, 1})}, 1);
  return ctx.concatenate({ctx.slice(x, {0, k}, {c.batch, n}, {1, 1}), fill}, 1);
}

// CPU's three-term step: log(exp(a1 - m) + exp(a2 - m) + exp(a3 - m)) + m + lp, m the largest
// term as CPU picks it (a1, then a2 or a3 where strictly larger), 0 where it is -inf.
V log_add3(const Ex& e, const V& a1, const V& a2, const V& a3, const V& lp) {
  V m = e.sel(e.cmp(Cmp::GT, a2, a1), a2, a1);
  m = e.sel(e.cmp(Cmp::GT, a3, m), a3, m);
  m = e.sel(e.cmp(Cmp::EQ, m, e.k(-std::numeric_limits<double>::infinity())), e.k(0.0), m);
  auto term = [&](const V& a) { return e.un(Hlo::Exponential, e.sub(a, m)); };
  V sum = e.add(e.add(term(a1), term(a2)), term(a3));
  return e.add(e.add(e.un(Hlo::Log, sum), m), lp);
}

// Where the path may skip a blank: into s from s - 2 (the alpha recursion: s > 1 and
// l'[s - 2] != l'[s]) or, `ahead`, into s from s + 2 (the beta recursion: s + 2 inside the
// extended target and l'[s + 2] != l'[s]).
V skip_allowed(LoweringContext& ctx, const CtcSetup& c, bool ahead) {
  std::vector<int64_t> row = c.row();
  int64_t n = c.positions;
  if (n <= 2) return ctx.constant_int(0, DType::Bool, row);
  auto i64 = [&](int64_t v) { return ctx.constant_int(v, DType::Int64, row); };
  V filler = ctx.constant_int(-1, DType::Int64, {c.batch, 2});
  V other = ahead ? ctx.concatenate({ctx.slice(c.prime, {0, 2}, {c.batch, n}, {1, 1}), filler}, 1)
                  : ctx.concatenate({filler, ctx.slice(c.prime, {0, 0}, {c.batch, n - 2}, {1, 1})}, 1);
  V s = ctx.iota(TensorType{row, DType::Int64}, 1);
  V inside = ahead ? ctx.compare(Cmp::LT, ctx.binary(Hlo::Add, s, i64(2)), c.extended)
                   : ctx.compare(Cmp::GT, s, i64(1));
  return ctx.binary(Hlo::And, ctx.compare(Cmp::NE, other, c.prime), inside);
}

// An [N] value of one int per batch item, broadcast along s.
V per_item(LoweringContext& ctx, const CtcSetup& c, const std::vector<int64_t>& values) {
  return ctx.broadcast_in_dim(int_vector(ctx, values), c.row(), {0});
}

// _ctc_loss(log_probs [T, N, C], targets, input_lengths, target_lengths, blank, zero_infinity)
//   -> (neg_log_likelihood [N], log_alpha [N, T, S])
void lower_ctc_loss(LoweringContext& ctx, const Node& node) {
  V log_probs = ctx.input(node, 0);
  const TensorType& alpha_type = ctx.out(node, 1);
  CtcSetup c = ctc_setup(ctx, node, log_probs, ctx.input(node, 1), alpha_type.shape[2], 2, 4);
  std::vector<int64_t> row = c.row();
  Ex e = make_ex(ctx, c.dt, row);
  V s = ctx.iota(TensorType{row, DType::Int64}, 1);
  auto i64 = [&](int64_t v) { return ctx.constant_int(v, DType::Int64, row); };
  V tl = per_item(ctx, c, c.target_lengths);
  // alpha at t = 0: l'[0] (the blank) and l'[1] (the first label, if any)
  V first = index_leading(ctx, c.at_prime, ctx.constant_int(0, DType::Int64));
  V start = ctx.binary(Hlo::Or, ctx.compare(Cmp::EQ, s, i64(0)),
                       ctx.binary(Hlo::And, ctx.compare(Cmp::EQ, s, i64(1)), ctx.compare(Cmp::GT, tl, i64(0))));
  V alpha0 = e.sel(start, first, c.neg_inf);
  std::vector<int64_t> cube = {c.steps, c.batch, c.positions};
  V stacked = update_leading(ctx, ctx.constant(-std::numeric_limits<double>::infinity(), c.dt, cube), alpha0,
                       ctx.constant_int(0, DType::Int64));
  V skip = skip_allowed(ctx, c, false);
  std::vector<V> done = ctx.while_loop(
      {ctx.constant_int(1, DType::Int64), alpha0, stacked},
      [&](const std::vector<V>& st) { return ctx.compare(Cmp::LT, st[0], ctx.constant_int(c.steps, DType::Int64)); },
      [&](const std::vector<V>& st) {
        V t = st[0], prev = st[1];
        V a2 = shift_positions(ctx, c, prev, 1);
        V a3 = e.sel(skip, shift_positions(ctx, c, prev, 2), c.neg_inf);
        V next = e.sel(c.in_target, log_add3(e, prev, a2, a3, index_leading(ctx, c.at_prime, t)), c.neg_inf);
        return std::vector<V>{ctx.binary(Hlo::Add, t, ctx.constant_int(1, DType::Int64)), next,
                              update_leading(ctx, st[2], next, t)};
      });
  V alphas = done[2];  // [T, N, S]
  // The likelihood: alpha at t = input_length - 1, positions 2L and 2L - 1 (2L alone for L = 0).
  std::vector<int64_t> at_end, before_end;
  for (int64_t b = 0; b < c.batch; ++b) {
    int64_t t = std::max<int64_t>(c.input_lengths[b] - 1, 0), l = c.target_lengths[b];
    at_end.push_back((t * c.batch + b) * c.positions + 2 * l);
    before_end.push_back((t * c.batch + b) * c.positions + std::max<int64_t>(2 * l - 1, 0));
  }
  Ex v = make_ex(ctx, c.dt, {c.batch});
  V l1 = gather_linear(ctx, alphas, int_vector(ctx, at_end));
  V l2 = gather_linear(ctx, alphas, int_vector(ctx, before_end));
  V neg_inf = v.k(-std::numeric_limits<double>::infinity());
  V m = v.sel(v.cmp(Cmp::LT, l1, l2), l2, l1);  // std::max(l1, l2)
  m = v.sel(v.cmp(Cmp::EQ, m, neg_inf), v.k(0.0), m);
  V both = v.add(v.un(Hlo::Log, v.add(v.un(Hlo::Exponential, v.sub(l1, m)),
                                             v.un(Hlo::Exponential, v.sub(l2, m)))),
                 m);
  std::vector<int64_t> no_target, no_input;
  for (int64_t b = 0; b < c.batch; ++b) {
    no_target.push_back(c.target_lengths[b] == 0);
    no_input.push_back(c.input_lengths[b] == 0);
  }
  V zero_i = ctx.constant_int(0, DType::Int64, {c.batch});
  V likelihood = v.sel(ctx.compare(Cmp::NE, int_vector(ctx, no_target), zero_i), l1, both);
  // No input: likelihood 1 for an empty target, else 0 (CPU's -0 and inf below).
  V empty_likelihood = v.sel(ctx.compare(Cmp::NE, int_vector(ctx, no_target), zero_i), v.k(0.0), neg_inf);
  likelihood = v.sel(ctx.compare(Cmp::NE, int_vector(ctx, no_input), zero_i), empty_likelihood, likelihood);
  V nll = v.un(Hlo::Negate, likelihood);
  ctx.set_results({nll, ctx.transpose(alphas, {1, 0, 2})});
}

// _ctc_loss_backward(grad [N], log_probs, targets, input_lengths, target_lengths,
//   neg_log_likelihood [N], log_alpha [N, T, S], blank, zero_infinity) -> [T, N, C]
void lower_ctc_loss_backward(LoweringContext& ctx, const Node& node) {
  V grad_out = ctx.input(node, 0), log_probs = ctx.input(node, 1), nll = ctx.input(node, 5);
  V log_alpha = ctx.input(node, 6);
  bool zero_infinity = node.args[8].i != 0;
  CtcSetup c = ctc_setup(ctx, node, log_probs, ctx.input(node, 2), log_alpha.type.shape[2], 3, 7);
  std::vector<int64_t> row = c.row(), cube = {c.steps, c.batch, c.positions};
  Ex e = make_ex(ctx, c.dt, row);
  V s = ctx.iota(TensorType{row, DType::Int64}, 1);
  auto i64 = [&](int64_t v) { return ctx.constant_int(v, DType::Int64, row); };
  V tl = per_item(ctx, c, c.target_lengths), il = per_item(ctx, c, c.input_lengths);
  V last_t = ctx.binary(Hlo::Subtract, il, i64(1));
  V two_l = ctx.binary(Hlo::Multiply, tl, i64(2));
  // beta at t = input_length - 1: l'[2L] (the last blank) and l'[2L - 1] (the last label).
  V ends = ctx.binary(Hlo::Or, ctx.compare(Cmp::EQ, s, two_l),
                      ctx.binary(Hlo::And, ctx.compare(Cmp::EQ, s, ctx.binary(Hlo::Subtract, two_l, i64(1))),
                                 ctx.compare(Cmp::GT, tl, i64(0))));
  V skip = skip_allowed(ctx, c, true);
  V below_end = ctx.compare(Cmp::LT, s, two_l);  // s + 1 inside the extended target
  V neg_cube = ctx.constant(-std::numeric_limits<double>::infinity(), c.dt, cube);
  std::vector<V> done = ctx.while_loop(
      {ctx.constant_int(c.steps - 1, DType::Int64), c.neg_inf, neg_cube},
      [&](const std::vector<V>& st) { return ctx.compare(Cmp::GE, st[0], ctx.constant_int(0, DType::Int64)); },
      [&](const std::vector<V>& st) {
        V t = st[0], next_row = st[1];
        V lp = index_leading(ctx, c.at_prime, t);
        V tt = ctx.broadcast_in_dim(t, row, {});
        V b2 = e.sel(below_end, shift_positions(ctx, c, next_row, -1), c.neg_inf);
        V b3 = e.sel(skip, shift_positions(ctx, c, next_row, -2), c.neg_inf);
        V stepped = e.sel(c.in_target, log_add3(e, next_row, b2, b3, lp), c.neg_inf);
        V beta = e.sel(ctx.compare(Cmp::EQ, tt, last_t), e.sel(ends, lp, c.neg_inf),
                       e.sel(ctx.compare(Cmp::LT, tt, last_t), stepped, c.neg_inf));
        return std::vector<V>{ctx.binary(Hlo::Subtract, t, ctx.constant_int(1, DType::Int64)), beta,
                              update_leading(ctx, st[2], beta, t)};
      });
  V betas = done[2];  // [T, N, S]
  // log(sum over s with l'[s] = c of alpha * beta), per (t, b, c), in CPU's order: a running
  // log-add over s from the last position down (a loop over s, every t, b and class at once);
  // -inf where no s reaches the class. The gradient below cancels (collected + nll, nll large),
  // so the order of these roundings shows in it.
  Ex x = make_ex(ctx, c.dt, cube);
  V neg_inf = x.k(-std::numeric_limits<double>::infinity());
  V t_cube = ctx.iota(TensorType{cube, DType::Int64}, 0);
  V inside_t = ctx.compare(Cmp::LT, t_cube, ctx.broadcast_in_dim(int_vector(ctx, c.input_lengths), cube, {1}));
  V valid = ctx.binary(Hlo::And, inside_t, ctx.broadcast_in_dim(c.in_target, cube, {1, 2}));
  V ab = x.sel(valid, x.add(ctx.transpose(log_alpha, {1, 0, 2}), betas), neg_inf);
  V ab_by_s = ctx.transpose(ab, {2, 0, 1});        // [S, T, N]
  V prime_by_s = ctx.transpose(c.prime, {1, 0});  // [S, N]
  std::vector<int64_t> grid = {c.steps, c.batch, c.labels};
  Ex g = make_ex(ctx, c.dt, grid);
  V neg_grid = g.k(-std::numeric_limits<double>::infinity());
  V class_iota = ctx.iota(TensorType{grid, DType::Int64}, 2);
  std::vector<V> folded = ctx.while_loop(
      {ctx.constant_int(c.positions - 1, DType::Int64), neg_grid},
      [&](const std::vector<V>& st) { return ctx.compare(Cmp::GE, st[0], ctx.constant_int(0, DType::Int64)); },
      [&](const std::vector<V>& st) {
        V at = st[0], acc = st[1];
        V value = ctx.broadcast_in_dim(index_leading(ctx, ab_by_s, at), grid, {0, 1});
        V label = ctx.broadcast_in_dim(index_leading(ctx, prime_by_s, at), grid, {1});
        V m = g.sel(g.cmp(Cmp::LT, acc, value), value, acc);  // std::max(lcab, log_alpha_beta)
        V added = g.add(g.un(Hlo::Log, g.add(g.un(Hlo::Exponential, g.sub(acc, m)),
                                                    g.un(Hlo::Exponential, g.sub(value, m)))),
                        m);
        V next = g.sel(g.cmp(Cmp::EQ, acc, neg_grid), value, added);
        return std::vector<V>{ctx.binary(Hlo::Subtract, at, ctx.constant_int(1, DType::Int64)),
                              g.sel(ctx.compare(Cmp::EQ, class_iota, label), next, acc)};
      });
  V collected = folded[1];
  // (exp(lp) - exp(collected + nll - lp)) * grad for t < input_length, else 0.
  V lp = log_probs;
  V nll_b = ctx.broadcast_in_dim(nll, grid, {1}), gr = ctx.broadcast_in_dim(grad_out, grid, {1});
  V result = g.mul(g.sub(g.un(Hlo::Exponential, lp),
                         g.un(Hlo::Exponential, g.sub(g.add(collected, nll_b), lp))),
                   gr);
  V t_grid = ctx.iota(TensorType{grid, DType::Int64}, 0);
  V live = ctx.compare(Cmp::LT, t_grid, ctx.broadcast_in_dim(int_vector(ctx, c.input_lengths), grid, {1}));
  if (zero_infinity)
    live = ctx.binary(Hlo::And, live, g.cmp(Cmp::NE, nll_b, g.k(std::numeric_limits<double>::infinity())));
  ctx.set_result(g.sel(live, result, g.k(0.0)));
}

// CPU's kernels take float and double only.
constexpr RuleFlags kCtcDTypes{.refuses = kBoolDTypes | kIntegerDTypes | dtype_set(DType::Float16) |
                                          dtype_set(DType::BFloat16)};

LOWERING("aten::_ctc_loss", lower_ctc_loss, nullptr, kCtcDTypes);
LOWERING("aten::_ctc_loss_backward", lower_ctc_loss_backward, nullptr, kCtcDTypes);

}  // namespace
}  // namespace torchtpu
