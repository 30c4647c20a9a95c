// Random lowerings. Rules are registered with random=true: the generator's (seed, offset)
// are appended as two lifted ints and LoweringContext::random_bits/random_uniform turn them
// into a counter-based stream, so the same seed gives the same values in every mode.
#include <cmath>
#include <limits>

#include "lowering/common.h"

namespace torchtpu {
namespace {

DType float_compute(DType out) { return out == DType::Float64 ? DType::Float64 : DType::Float32; }

// Standard normal samples (Box-Muller) in the compute type of out.
V standard_normal(LoweringContext& ctx, const Node& node, const std::vector<int64_t>& shape, DType ct) {
  V u1 = ctx.random_uniform(node, shape, ct);
  V u2 = ctx.random_uniform(node, shape, ct);
  V one = ctx.constant(1.0, ct, shape);
  V radius = ctx.unary(Hlo::Sqrt,
                       ctx.binary(Hlo::Multiply, ctx.constant(-2.0, ct, shape),
                                  ctx.unary(Hlo::Log, ctx.binary(Hlo::Subtract, one, u1))));
  V angle = ctx.binary(Hlo::Multiply, ctx.constant(2.0 * M_PI, ct, shape), u2);
  return ctx.binary(Hlo::Multiply, radius, ctx.unary(Hlo::Cosine, angle));
}

// The finite range of a floating dtype.
double lowest(DType dtype) {
  switch (dtype) {
    case DType::Float16: return -65504.0;
    case DType::BFloat16: return -3.3895313892515355e38;
    case DType::Float32: return std::numeric_limits<float>::lowest();
    default: return std::numeric_limits<double>::lowest();
  }
}

// The range of values of a dtype, as int64 (CPU checks random_'s bounds against it).
std::pair<int64_t, int64_t> integer_bounds(DType dtype) {
  switch (dtype) {
    case DType::Bool: return {0, 1};
    case DType::UInt8: return {0, 255};
    case DType::Int8: return {-128, 127};
    case DType::Int16: return {-32768, 32767};
    case DType::Int32: return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    default: return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  }
}

void check_in_range(double value, const char* name, double low, double high, DType dtype) {
  check_argument(value >= low && value <= high, std::string(name) + " is out of bounds for " + cpp_type_name(dtype));
}

// CPU's check_from_to_in_range: `from` and `to - 1` must be values of the dtype.
void check_random_bounds(int64_t from, int64_t to_inclusive, DType dtype) {
  if (is_floating(dtype)) {
    check_in_range(static_cast<double>(from), "from", lowest(dtype), -lowest(dtype), dtype);
    check_in_range(static_cast<double>(to_inclusive), "to - 1", lowest(dtype), -lowest(dtype), dtype);
  } else {
    auto [low, high] = integer_bounds(dtype);
    check_in_range(static_cast<double>(from), "from", static_cast<double>(low), static_cast<double>(high), dtype);
    check_argument(to_inclusive >= low && to_inclusive <= high, std::string("to - 1 is out of bounds for ") + cpp_type_name(dtype));
  }
}

// uniform(self, from, to, generator)
void lower_uniform(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType ct = float_compute(out.dtype);
  double from = node.args[1].as_double(), to = node.args[2].as_double();
  check_in_range(from, "from", lowest(out.dtype), -lowest(out.dtype), out.dtype);
  check_in_range(to, "to", lowest(out.dtype), -lowest(out.dtype), out.dtype);
  check_argument(from <= to, "uniform_ expects to return a [from, to) range, but found from=" + format_number(from) +
                                 " > to=" + format_number(to));
  V u = ctx.random_uniform(node, out.shape, ct);
  V r = ctx.binary(Hlo::Add, ctx.constant(from, ct, out.shape),
                   ctx.binary(Hlo::Multiply, u, ctx.constant(to - from, ct, out.shape)));
  ctx.set_result(ctx.convert(r, out.dtype));
}

// Where normal's mean and std are: after self (normal_functional) or first.
enum class NormalArgs : uint8_t { SelfMeanStd, MeanStd };

// normal_functional(self, mean, std) and normal.Tensor_float / float_Tensor / Tensor_Tensor /
// float_float(mean, std, ...): mean + std * N(0, 1).
void lower_normal(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType ct = float_compute(out.dtype);
  int mean_arg = rule_param<NormalArgs>(node) == NormalArgs::SelfMeanStd ? 1 : 0;
  V z = standard_normal(ctx, node, out.shape, ct);
  V mean = ctx.has_input(node, mean_arg) ? to_type(ctx, ctx.input(node, mean_arg), ct, out.shape)
                                         : ctx.constant(node.args[mean_arg].as_double(), ct, out.shape);
  V std;
  if (ctx.has_input(node, mean_arg + 1)) {
    std = to_type(ctx, ctx.input(node, mean_arg + 1), ct, out.shape);
    ctx.check(ctx.compare(Cmp::LT, std, ctx.constant(0, ct, out.shape)), V{},
              RuntimeCheck{RuntimeCheck::Error::Runtime, "normal expects all elements of std >= 0.0"});
  } else {
    double s = node.args[mean_arg + 1].as_double();
    check_argument(s >= 0.0, "normal expects std >= 0.0, but found std " + format_number(s));
    std = ctx.constant(s, ct, out.shape);
  }
  ctx.set_result(ctx.convert(ctx.binary(Hlo::Add, mean, ctx.binary(Hlo::Multiply, std, z)), out.dtype));
}

// Where bernoulli's probability is: a tensor (p, else self) or a number (bernoulli.p).
enum class Probability : uint8_t { Tensor, Number };

// bernoulli(self) / bernoulli.p(self, p) / bernoulli.Tensor(self, p): 1 with probability p.
void lower_bernoulli(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType ct = DType::Float32;
  if (out.dtype == DType::Float64 || (ctx.has_input(node, 1) && ctx.input(node, 1).type.dtype == DType::Float64))
    ct = DType::Float64;
  V p;
  if (ctx.has_input(node, 1)) p = to_type(ctx, ctx.input(node, 1), ct, out.shape);
  else if (rule_param<Probability>(node) == Probability::Number) p = ctx.constant(node.args[1].as_double(), ct, out.shape);  // .p
  else p = to_type(ctx, ctx.input(node, 0), ct, out.shape);                           // bernoulli(self)
  if (rule_param<Probability>(node) == Probability::Number) {
    double value = node.args[1].as_double();
    check_argument(value >= 0 && value <= 1, "bernoulli_ expects p to be in [0, 1], but got p=" + format_number(value));
  } else {
    V outside = ctx.emit(Hlo::Or, {ctx.compare(Cmp::LT, p, ctx.constant(0, ct, out.shape)),
                                          ctx.compare(Cmp::GT, p, ctx.constant(1, ct, out.shape))},
                         TensorType{out.shape, DType::Bool});
    ctx.check(outside, V{},
              RuntimeCheck{RuntimeCheck::Error::Runtime,
                           "Expected p_in >= 0 && p_in <= 1 to be true, but got false.  (Could this error message be "
                           "improved?  If so, please report an enhancement request to PyTorch.)"});
  }
  V u = ctx.random_uniform(node, out.shape, ct);
  ctx.set_result(ctx.convert(ctx.compare(Cmp::LT, u, p), out.dtype));
}

int64_t mantissa_range(DType dtype) {
  switch (dtype) {
    case DType::Float64: return (int64_t(1) << 53) + 1;
    case DType::Float32: return (int64_t(1) << 24) + 1;
    case DType::Float16: return (int64_t(1) << 11) + 1;
    case DType::BFloat16: return (int64_t(1) << 8) + 1;
    case DType::Bool: return 2;
    case DType::UInt8: return 256;
    case DType::Int8: return 128;
    case DType::Int16: return 32768;
    case DType::Int32: return int64_t(1) << 31;
    default: return 0;  // int64: all 63 bits
  }
}

// random's bounds: [from, to), [0, to) or the dtype's range.
enum class Bounds : uint8_t { FromTo, To, Dtype };

// random.from(self, from, to) / random.to(self, to) / random(self): integers uniform in
// [from, to) (default bounds as PyTorch: the exactly representable range of the dtype).
void lower_random(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  Bounds bounds = rule_param<Bounds>(node);
  int64_t from = 0, range = 0;
  if (bounds != Bounds::Dtype) {
    from = bounds == Bounds::FromTo ? node.args[1].i : 0;
    const Arg& to_arg = node.args[bounds == Bounds::FromTo ? 2 : 1];
    if (!to_arg.is_none()) {
      int64_t to = to_arg.i;
      check_argument(from < to, "random_ expects 'from' to be less than 'to', but got from=" + std::to_string(from) +
                                    " >= to=" + std::to_string(to));
      check_random_bounds(from, to - 1, out.dtype);
      range = to - from;
    } else {
      int64_t top = mantissa_range(out.dtype);
      range = top == 0 ? std::numeric_limits<int64_t>::max() - from : top - from;
    }
  } else {
    range = mantissa_range(out.dtype);
  }
  V bits = ctx.random_bits(node, out.shape, 64);
  V r = ctx.binary(Hlo::ShiftRightLogical, bits, ctx.constant_int(1, DType::Int64, out.shape));
  if (range > 0) r = ctx.binary(Hlo::Remainder, r, ctx.constant_int(range, DType::Int64, out.shape));
  if (from != 0) r = ctx.binary(Hlo::Add, r, ctx.constant_int(from, DType::Int64, out.shape));
  ctx.set_result(ctx.convert(r, out.dtype));
}

// exponential(self, lambd): -log(1 - u) / lambd
void lower_exponential(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  double lambda = node.args[1].as_double();
  check_argument(lambda > 0.0, "exponential_ expects lambda > 0.0, but found lambda=" + format_number(lambda));
  DType ct = float_compute(out.dtype);
  V u = ctx.random_uniform(node, out.shape, ct);
  V e = ctx.unary(Hlo::Negate, ctx.unary(Hlo::LogPlusOne, ctx.unary(Hlo::Negate, u)));
  e = ctx.binary(Hlo::Divide, e, ctx.constant(node.args[1].as_double(), ct, out.shape));
  ctx.set_result(ctx.convert(e, out.dtype));
}

// multinomial(self, num_samples, replacement, generator): indices drawn from the rows of
// self (unnormalized probabilities, 1-D or 2-D). As CPU's fast path: each draw is
// argmax(p / q) with q ~ Exp(1) (the exponential race; the Gumbel-max trick with the exp
// taken), so one draw per row is one argmax; draws without replacement are the num_samples
// largest ratios of one race, draws with replacement independent races. CPU reads its
// validity checks on the host before drawing; here they are runtime checks (raised when the
// host next waits, as CUDA's device asserts), so a sampling step costs no host round trip.
void lower_multinomial(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V p = ctx.input(node, 0);
  check_argument(is_floating(p.type.dtype), std::string("multinomial only supports floating-point dtypes for input, got: ") +
                                                scalar_type_name(p.type.dtype));
  int64_t samples = node.args[1].i;
  bool replacement = node.args[2].as_bool();
  int64_t categories = p.type.shape.back();
  check_argument(samples > 0, "cannot sample n_sample <= 0 samples");
  check_argument(replacement || samples <= categories,
                 "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  check_argument(categories <= (int64_t{1} << 24), "number of categories cannot exceed 2^24");
  DType ct = float_compute(p.type.dtype);
  int64_t rows = p.type.rank() == 2 ? p.type.shape[0] : 1;
  V probs = ctx.reshape(ctx.convert(p, ct), {rows, categories});
  Ex e = make_ex(ctx, ct, {rows, categories});
  TensorType flags{{rows, categories}, DType::Bool};
  V nan = e.isnan(probs), negative = e.cmp(Cmp::LT, probs, e.k(0.0));
  V infinite = e.band(e.bnot(nan), e.bnot(ctx.emit(Hlo::IsFinite, {probs}, flags)));
  V row_sum = ctx.reduce(probs, {1}, ctx.constant(0.0, ct), Hlo::Add);
  V empty_row = ctx.compare(Cmp::LE, row_sum, ctx.constant(0.0, ct, {rows}));
  if (!replacement || samples == 1) {
    ctx.check(e.bor(e.bor(nan, negative), infinite), V{},
              RuntimeCheck{RuntimeCheck::Error::Runtime, "probability tensor contains either `inf`, `nan` or element < 0"});
  } else {
    ctx.check(e.bor(nan, negative), V{},
              RuntimeCheck{RuntimeCheck::Error::Runtime, "invalid multinomial distribution (encountering probability entry < 0)"});
    ctx.check(infinite, V{},
              RuntimeCheck{RuntimeCheck::Error::Runtime,
                           "invalid multinomial distribution (encountering probability entry = infinity or NaN)"});
  }
  ctx.check(empty_row, V{}, RuntimeCheck{RuntimeCheck::Error::Runtime, "invalid multinomial distribution (sum of probabilities <= 0)"});

  int64_t races = replacement ? samples : 1;
  std::vector<int64_t> shape{rows, races, categories};
  V u = ctx.random_uniform(node, shape, ct);
  V q = ctx.unary(Hlo::Negate, ctx.unary(Hlo::LogPlusOne, ctx.unary(Hlo::Negate, u)));
  V ratio = ctx.binary(Hlo::Divide, ctx.broadcast_in_dim(probs, shape, {0, 2}), q);
  V picked;
  if (replacement || samples == 1) {
    // The first index of each race's largest ratio (argmax).
    V best = ctx.reduce(ratio, {2}, ctx.constant(-INFINITY, ct), Hlo::Maximum);
    V index = ctx.iota(TensorType{shape, DType::Int64}, 2);
    V at_best = ctx.compare(Cmp::EQ, ratio, ctx.broadcast_in_dim(best, shape, {0, 1}));
    V candidates = ctx.select(at_best, index, ctx.constant_int(categories, DType::Int64, shape));
    picked = ctx.reduce(candidates, {2}, ctx.constant_int(categories, DType::Int64), Hlo::Minimum);
  } else {
    V flat = ctx.reshape(ratio, {rows, categories});
    V order = ctx.iota(TensorType{{rows, categories}, DType::Int64}, 1);
    std::vector<V> sorted = sort_stable(ctx, {ctx.unary(Hlo::Negate, flat)}, {order}, 1);
    picked = ctx.slice(sorted[1], {0, 0}, {rows, samples}, {1, 1});
  }
  ctx.set_result(ctx.reshape(picked, out.shape));
}

// native_dropout(input, p, train) -> (input * mask / (1 - p), mask)
void lower_native_dropout(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  double p = node.args[1].as_double();
  bool train = node.args[2].is_none() || node.args[2].as_bool();
  if (!train || out.numel() == 0) {
    ctx.set_results({x, ctx.constant(1, DType::Bool, out.shape)});
    return;
  }
  DType ct = float_compute(out.dtype);
  V u = ctx.random_uniform(node, out.shape, ct);
  V mask = ctx.compare(Cmp::LT, u, ctx.constant(1.0 - p, ct, out.shape));
  double scale = p == 1.0 ? 0.0 : 1.0 / (1.0 - p);
  V kept = ctx.select(mask, x, ctx.constant(0, out.dtype, out.shape));
  ctx.set_results({ctx.binary(Hlo::Multiply, kept, ctx.constant(scale, out.dtype, out.shape)), mask});
}

// native_dropout_backward(grad, mask, scale)
void lower_native_dropout_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V g = ctx.input(node, 0);
  V mask = to_type(ctx, ctx.input(node, 1), DType::Bool, out.shape);
  V scaled = ctx.binary(Hlo::Multiply, g, ctx.broadcast_to(ctx.scalar(node, 2, out.dtype), out.shape));
  ctx.set_result(ctx.select(mask, scaled, ctx.constant(0, out.dtype, out.shape)));
}

// Draws CPU and CUDA make in floating types only ("normal_kernel_cpu" not implemented for 'Long').
constexpr RuleFlags kFloatDraws{.random = true, .refuses = kBoolDTypes | kIntegerDTypes};
// normal(mean, std) draws in its first tensor's dtype, where the meta kernel promotes to float.
constexpr RuleFlags kSelfFloatDraws{.random = true, .refuses = kBoolDTypes | kIntegerDTypes, .judged_on = Judged::Self};
LOWERING("aten::uniform", lower_uniform, nullptr, kFloatDraws);
LOWERING("aten::normal_functional", lower_normal, NormalArgs::SelfMeanStd, kFloatDraws);
LOWERING("aten::normal.Tensor_float", lower_normal, NormalArgs::MeanStd, kSelfFloatDraws);
LOWERING("aten::normal.float_Tensor", lower_normal, NormalArgs::MeanStd, kSelfFloatDraws);
LOWERING("aten::normal.Tensor_Tensor", lower_normal, NormalArgs::MeanStd, kSelfFloatDraws);
LOWERING("aten::normal.float_float", lower_normal, NormalArgs::MeanStd, kFloatDraws);
LOWERING("aten::bernoulli", lower_bernoulli, Probability::Tensor, kFloatDraws);
LOWERING("aten::bernoulli.p", lower_bernoulli, Probability::Number, RuleFlags{.random = true});
LOWERING("aten::bernoulli.Tensor", lower_bernoulli, Probability::Tensor, kFloatDraws);
LOWERING("aten::random.from", lower_random, Bounds::FromTo, RuleFlags{.random = true});
LOWERING("aten::random.to", lower_random, Bounds::To, RuleFlags{.random = true});
LOWERING("aten::random", lower_random, Bounds::Dtype, RuleFlags{.random = true});
LOWERING("aten::exponential", lower_exponential, nullptr, kFloatDraws);
LOWERING("aten::multinomial", lower_multinomial, nullptr, RuleFlags{.random = true});
LOWERING("aten::native_dropout", lower_native_dropout, nullptr, RuleFlags{.random = true});
LOWERING("aten::native_dropout_backward", lower_native_dropout_backward);

}  // namespace
}  // namespace torchtpu
