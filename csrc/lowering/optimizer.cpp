// The fused optimizer steps (torch._fused_adam_, _fused_adamw_, _fused_sgd_, _fused_adagrad_,
// reached as their functional forms through functionalization): one node updates every
// parameter of a group, with the arithmetic of PyTorch's CPU kernels (aten/src/ATen/native/cpu/
// Fused*Kernel.cpp): per-step coefficients derived in double from the hyperparameters and each
// tensor's step, then rounded to the parameters' compute dtype; AMP's grad_scale divides the
// gradients (which are written back unscaled) and found_inf == 1 leaves everything as it was.
// Hyperparameters are lifted (RuleFlags::lifts_floats), so a changing learning rate does not
// recompile; the ones whose being zero changes the math (weight_decay, momentum) are not
// lifted when zero, so a zero stays a structural constant. GradScaler's two ops (its inf check
// and its scale update) are here too.
#include <string>

#include "lowering/common.h"

namespace torchtpu {
namespace {

// The precision CPU's kernels derive their coefficients in: double (float32 on a platform
// without float64, a TPU).
DType wide_dtype(const LoweringContext& ctx) { return ctx.has_float64() ? DType::Float64 : DType::Float32; }

// A hyperparameter as a 0-d wide value: a float argument (lifted or constant) or, for the
// tensor_lr overloads, a one-element tensor (CPU reads it with lr.item<double>()).
V hyperparameter(LoweringContext& ctx, const Node& node, int arg) {
  if (ctx.has_input(node, arg)) return ctx.convert(ctx.reshape(ctx.input(node, arg), {}), wide_dtype(ctx));
  return ctx.scalar(node, arg, wide_dtype(ctx));
}

// A one-element tensor (a step count, grad_scale, found_inf) as a 0-d value of dtype.
V scalar_tensor(LoweringContext& ctx, const V& x, DType dtype) { return ctx.convert(ctx.reshape(x, {}), dtype); }

// A 0-d coefficient rounded to the compute dtype (CPU's scalar_t(x) / opmath_t(x)) and
// broadcast to the tensor being updated.
V coefficient(const Ex& e, const V& wide) { return e.c.broadcast_in_dim(e.c.convert(wide, e.dt), e.shape, {}); }

bool nonzero(const Node& node, int arg) { return !node.args.at(arg).is_constant(0.0); }

std::string size_mismatch(const char* list, const char* expected) {
  return std::string("Expected ") + list + ".size() == " + expected +
         " to be true, but got false.  (Could this error message be improved?  If so, please report an "
         "enhancement request to PyTorch.)";
}

// CPU's checks of the lists' lengths (its TORCH_CHECKs, in their wording).
void check_sizes(const std::vector<std::vector<V>>& lists, const std::vector<const char*>& names, size_t n_tensors) {
  for (size_t k = 0; k < lists.size(); ++k) check_argument(lists[k].size() == n_tensors, size_mismatch(names[k], "n_tensors"));
}

// A list that holds a tensor per parameter only with some settings (amsgrad, momentum):
// CPU checks it is empty without them.
void check_optional_size(const std::vector<V>& list, const char* name, bool used, size_t n_tensors) {
  if (used) check_argument(list.size() == n_tensors, size_mismatch(name, "n_tensors"));
  else check_argument(list.empty(), std::string("Expected ") + name + ".empty() to be true, but got false.  (Could "
                      "this error message be improved?  If so, please report an enhancement request to PyTorch.)");
}

// Every tensor of a position must have its parameter's shape, which CPU's kernel assumes
// without checking.
void check_shapes(const Node& node, const std::vector<std::vector<V>>& lists, const std::vector<const char*>& names) {
  for (size_t k = 1; k < lists.size(); ++k)
    for (size_t i = 0; i < lists[k].size(); ++i)
      check_argument(lists[k][i].type.shape == lists[0][i].type.shape,
                     node.op.name() + ": " + names[k] + "[" + std::to_string(i) + "] has shape " +
                         format_list(lists[k][i].type.shape) + " where self[" + std::to_string(i) + "] has " +
                         format_list(lists[0][i].type.shape));
}

// What AMP adds to every fused step: the gradient divided by grad_scale, and whether found_inf
// (a float 1.0 when an inf or NaN was found) skips the step.
struct AmpScaling {
  V grad_scale;  // 0-d float32, or empty
  V skip;        // 0-d bool, or empty

  AmpScaling(LoweringContext& ctx, const Node& node, int grad_scale_arg, int found_inf_arg) {
    if (ctx.has_input(node, grad_scale_arg))
      grad_scale = scalar_tensor(ctx, ctx.input(node, grad_scale_arg), DType::Float32);
    if (ctx.has_input(node, found_inf_arg)) {
      V found = scalar_tensor(ctx, ctx.input(node, found_inf_arg), DType::Float32);
      skip = ctx.compare(Cmp::EQ, found, ctx.constant(1.0, DType::Float32));
    }
  }

  // The gradient the update uses (unscaled, in e.dt), and the one written back (*written).
  V gradient(const Ex& e, const V& grad, V* written) const {
    V g = e.c.convert(grad, e.dt);
    if (grad_scale.name.empty()) {
      *written = grad;
      return g;
    }
    g = e.div(g, coefficient(e, grad_scale));
    *written = e.c.convert(g, grad.type.dtype);
    return g;
  }

  // `updated` (of old's type) as the output replacing `old`: `old` itself where the step is skipped.
  V kept_or(LoweringContext& ctx, const V& old, const V& updated) const {
    if (skip.name.empty()) return updated;
    return ctx.select(ctx.broadcast_in_dim(skip, old.type.shape, {}), old, updated);
  }
  // The same for a value computed in e.dt, rounded to old's dtype.
  V result(const Ex& e, const V& old, const V& updated) const {
    return kept_or(e.c, old, e.c.convert(updated, old.type.dtype));
  }
};

// Adam's weight decay: added to the gradient (L2, _fused_adam) or applied to the weight
// (Decoupled, _fused_adamw).
enum class AdamDecay : uint8_t { L2, Decoupled };

// Where the arguments of the Adam family sit in its schema.
enum AdamArg { kAdamParams, kAdamGrads, kExpAvgs, kExpAvgSqs, kMaxExpAvgSqs, kAdamSteps, kAdamLr, kBeta1, kBeta2,
               kAdamWeightDecay, kAdamEps, kAmsgrad, kAdamMaximize, kAdamGradScale, kAdamFoundInf };

// _fused_adam / _fused_adamw (AdamDecay::Decoupled: decoupled weight decay), float or tensor lr:
//   -> (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs) updated.
void lower_fused_adam(LoweringContext& ctx, const Node& node) {
  bool decoupled = rule_param<AdamDecay>(node) == AdamDecay::Decoupled;
  std::vector<V> params = ctx.inputs(node, kAdamParams), grads = ctx.inputs(node, kAdamGrads);
  std::vector<V> exp_avgs = ctx.inputs(node, kExpAvgs), exp_avg_sqs = ctx.inputs(node, kExpAvgSqs);
  std::vector<V> max_exp_avg_sqs = ctx.inputs(node, kMaxExpAvgSqs), steps = ctx.inputs(node, kAdamSteps);
  bool amsgrad = node.args[kAmsgrad].as_bool(), maximize = node.args[kAdamMaximize].as_bool();
  size_t n = params.size();
  check_sizes({grads, exp_avgs, exp_avg_sqs}, {"grads", "exp_avgs", "exp_avg_sqs"}, n);
  check_optional_size(max_exp_avg_sqs, "max_exp_avg_sqs", amsgrad, n);
  check_sizes({steps}, {"state_steps"}, n);
  check_shapes(node, {params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs},
               {"self", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"});
  AmpScaling amp(ctx, node, kAdamGradScale, kAdamFoundInf);
  DType wide = wide_dtype(ctx);
  V lr = hyperparameter(ctx, node, kAdamLr), beta1 = hyperparameter(ctx, node, kBeta1);
  V beta2 = hyperparameter(ctx, node, kBeta2), eps = hyperparameter(ctx, node, kAdamEps);
  bool decays = nonzero(node, kAdamWeightDecay);
  V weight_decay = hyperparameter(ctx, node, kAdamWeightDecay);
  V one = ctx.constant(1.0, wide);
  V exp_avg_weight = ctx.binary(Hlo::Subtract, one, beta1);      // 1 - beta1: lerp's weight
  V exp_avg_sq_weight = ctx.binary(Hlo::Subtract, one, beta2);   // 1 - beta2
  V decay_factor = ctx.binary(Hlo::Subtract, one, ctx.binary(Hlo::Multiply, lr, weight_decay));
  std::vector<V> out_params, out_grads, out_exp_avgs, out_exp_avg_sqs, out_max;
  for (size_t i = 0; i < n; ++i) {
    DType cd = compute_dtype(params[i].type.dtype);
    Ex e = make_ex(ctx, cd, params[i].type.shape);
    // Per tensor, in double: its step's bias corrections.
    V step = scalar_tensor(ctx, steps[i], wide);
    V bias_correction1 = ctx.binary(Hlo::Subtract, one, ctx.binary(Hlo::Power, beta1, step));
    V bias_correction2 = ctx.binary(Hlo::Subtract, one, ctx.binary(Hlo::Power, beta2, step));
    V step_size = ctx.binary(Hlo::Divide, lr, bias_correction1);
    V bias_correction2_sqrt = ctx.unary(Hlo::Sqrt, bias_correction2);

    V p = ctx.convert(params[i], cd), written_grad;
    V g = amp.gradient(e, grads[i], &written_grad);
    if (maximize) g = e.un(Hlo::Negate, g);
    if (decays) {
      if (decoupled) p = e.mul(p, coefficient(e, decay_factor));
      else g = e.add(g, e.mul(p, coefficient(e, weight_decay)));
    }
    // exp_avg.lerp_(grad, 1 - beta1), in lerp's two forms as CPU picks them by the weight.
    V m = ctx.convert(exp_avgs[i], cd), w = coefficient(e, exp_avg_weight);
    V small = e.cmp(Cmp::LT, e.un(Hlo::Abs, w), e.k(0.5));
    V towards = e.sub(g, m);
    m = e.sel(small, e.add(m, e.mul(w, towards)), e.sub(g, e.mul(towards, e.sub(e.k(1.0), w))));
    V v = ctx.convert(exp_avg_sqs[i], cd);
    v = e.add(e.mul(v, coefficient(e, beta2)), e.mul(e.mul(coefficient(e, exp_avg_sq_weight), g), g));
    V second = v, v_max;
    if (amsgrad) second = v_max = e.max(ctx.convert(max_exp_avg_sqs[i], cd), v);
    V denom = e.add(e.div(e.un(Hlo::Sqrt, second), coefficient(e, bias_correction2_sqrt)), coefficient(e, eps));
    V negative_step = coefficient(e, ctx.unary(Hlo::Negate, step_size));
    p = e.add(p, e.div(e.mul(negative_step, m), denom));

    out_params.push_back(amp.result(e, params[i], p));
    out_grads.push_back(amp.kept_or(ctx, grads[i], written_grad));
    out_exp_avgs.push_back(amp.result(e, exp_avgs[i], m));
    out_exp_avg_sqs.push_back(amp.result(e, exp_avg_sqs[i], v));
    if (amsgrad) out_max.push_back(amp.result(e, max_exp_avg_sqs[i], v_max));
  }
  std::vector<V> results = out_params;
  for (auto* list : {&out_grads, &out_exp_avgs, &out_exp_avg_sqs, &out_max})
    results.insert(results.end(), list->begin(), list->end());
  ctx.set_results(results);
}

enum SgdArg { kSgdParams, kSgdGrads, kMomentumBuffers, kSgdWeightDecay, kMomentum, kSgdLr, kDampening, kNesterov,
              kSgdMaximize, kIsFirstStep, kSgdGradScale, kSgdFoundInf };

// _fused_sgd, float or tensor lr: -> (params, grads, momentum_buffer_list) updated. Without
// momentum (a constant 0) the buffer list is empty; on the first step its buffers are
// uninitialized and the gradient becomes the buffer.
void lower_fused_sgd(LoweringContext& ctx, const Node& node) {
  std::vector<V> params = ctx.inputs(node, kSgdParams), grads = ctx.inputs(node, kSgdGrads);
  std::vector<V> buffers = ctx.inputs(node, kMomentumBuffers);
  bool has_momentum = nonzero(node, kMomentum), nesterov = node.args[kNesterov].as_bool();
  bool maximize = node.args[kSgdMaximize].as_bool(), first_step = node.args[kIsFirstStep].as_bool();
  size_t n = params.size();
  check_sizes({grads}, {"grads"}, n);
  check_optional_size(buffers, "momentum_buffer_list", has_momentum, n);
  check_shapes(node, {params, grads, buffers}, {"self", "grads", "momentum_buffer_list"});
  AmpScaling amp(ctx, node, kSgdGradScale, kSgdFoundInf);
  DType wide = wide_dtype(ctx);
  bool decays = nonzero(node, kSgdWeightDecay);
  V weight_decay = hyperparameter(ctx, node, kSgdWeightDecay), momentum = hyperparameter(ctx, node, kMomentum);
  V negative_lr = ctx.unary(Hlo::Negate, hyperparameter(ctx, node, kSgdLr));
  V grad_weight = ctx.binary(Hlo::Subtract, ctx.constant(1.0, wide), hyperparameter(ctx, node, kDampening));
  std::vector<V> out_params, out_grads, out_buffers;
  for (size_t i = 0; i < n; ++i) {
    DType cd = compute_dtype(params[i].type.dtype);
    Ex e = make_ex(ctx, cd, params[i].type.shape);
    V p = ctx.convert(params[i], cd), written_grad;
    V g = amp.gradient(e, grads[i], &written_grad);
    if (maximize) g = e.un(Hlo::Negate, g);
    if (decays) g = e.add(e.mul(p, coefficient(e, weight_decay)), g);
    if (has_momentum) {
      V buffer = g;
      if (!first_step)
        buffer = e.add(e.mul(coefficient(e, grad_weight), g),
                       e.mul(ctx.convert(buffers[i], cd), coefficient(e, momentum)));
      out_buffers.push_back(amp.result(e, buffers[i], buffer));
      g = nesterov ? e.add(e.mul(buffer, coefficient(e, momentum)), g) : buffer;
    }
    p = e.add(p, e.mul(g, coefficient(e, negative_lr)));
    out_params.push_back(amp.result(e, params[i], p));
    out_grads.push_back(amp.kept_or(ctx, grads[i], written_grad));
  }
  std::vector<V> results = out_params;
  results.insert(results.end(), out_grads.begin(), out_grads.end());
  results.insert(results.end(), out_buffers.begin(), out_buffers.end());
  ctx.set_results(results);
}

enum AdagradArg { kAdagradParams, kAdagradGrads, kStateSums, kAdagradSteps, kAdagradLr, kLrDecay, kAdagradWeightDecay,
                  kAdagradEps, kAdagradMaximize, kAdagradGradScale, kAdagradFoundInf };

// _fused_adagrad, float or tensor lr: -> (params, grads, state_sums[, state_steps]) updated
// (the float-lr overload also returns the steps, which the kernel does not change).
void lower_fused_adagrad(LoweringContext& ctx, const Node& node) {
  std::vector<V> params = ctx.inputs(node, kAdagradParams), grads = ctx.inputs(node, kAdagradGrads);
  std::vector<V> sums = ctx.inputs(node, kStateSums), steps = ctx.inputs(node, kAdagradSteps);
  bool maximize = node.args[kAdagradMaximize].as_bool();
  size_t n = params.size();
  check_sizes({grads, sums, steps}, {"grads", "state_sums", "state_steps"}, n);
  check_shapes(node, {params, grads, sums}, {"self", "grads", "state_sums"});
  AmpScaling amp(ctx, node, kAdagradGradScale, kAdagradFoundInf);
  DType wide = wide_dtype(ctx);
  V lr = hyperparameter(ctx, node, kAdagradLr), lr_decay = hyperparameter(ctx, node, kLrDecay);
  V eps = hyperparameter(ctx, node, kAdagradEps), weight_decay = hyperparameter(ctx, node, kAdagradWeightDecay);
  bool decays = nonzero(node, kAdagradWeightDecay);
  V one = ctx.constant(1.0, wide);
  std::vector<V> out_params, out_grads, out_sums;
  for (size_t i = 0; i < n; ++i) {
    DType cd = compute_dtype(params[i].type.dtype);
    Ex e = make_ex(ctx, cd, params[i].type.shape);
    // clr = lr / (1 + (step - 1) * lr_decay), in double
    V step = scalar_tensor(ctx, steps[i], wide);
    V decayed = ctx.binary(Hlo::Multiply, ctx.binary(Hlo::Subtract, step, one), lr_decay);
    V clr = ctx.binary(Hlo::Divide, lr, ctx.binary(Hlo::Add, one, decayed));
    V p = ctx.convert(params[i], cd), written_grad;
    V g = amp.gradient(e, grads[i], &written_grad);
    if (maximize) g = e.un(Hlo::Negate, g);
    if (decays) g = e.add(g, e.mul(p, coefficient(e, weight_decay)));
    V sum = e.add(ctx.convert(sums[i], cd), e.mul(g, g));
    V std = e.add(e.un(Hlo::Sqrt, sum), coefficient(e, eps));
    p = e.sub(p, e.div(e.mul(coefficient(e, clr), g), std));
    out_params.push_back(amp.result(e, params[i], p));
    out_grads.push_back(amp.kept_or(ctx, grads[i], written_grad));
    out_sums.push_back(amp.result(e, sums[i], sum));
  }
  std::vector<V> results = out_params;
  results.insert(results.end(), out_grads.begin(), out_grads.end());
  results.insert(results.end(), out_sums.begin(), out_sums.end());
  if (node.outputs.size() == 4 * n) results.insert(results.end(), steps.begin(), steps.end());
  ctx.set_results(results);
}

// ---------------------------------------------------------------------------------------
// AMP's GradScaler ops, which hand the fused steps their grad_scale and found_inf.

// _amp_foreach_non_finite_check_and_unscale(grads, found_inf, inv_scale) -> (grads * inv_scale,
// found_inf set to 1 where any gradient holds an inf or NaN, else as it was).
void lower_amp_non_finite_check_and_unscale(LoweringContext& ctx, const Node& node) {
  std::vector<V> grads = ctx.inputs(node, 0);
  V found_inf = ctx.input(node, 1);
  V inv_scale = scalar_tensor(ctx, ctx.input(node, 2), DType::Float32);
  V any_non_finite = ctx.constant_int(0, DType::Bool);
  std::vector<V> results;
  for (const V& grad : grads) {
    DType cd = compute_dtype(grad.type.dtype);
    Ex e = make_ex(ctx, cd, grad.type.shape);
    V x = ctx.convert(grad, cd);
    V finite = ctx.emit(Hlo::IsFinite, {x}, TensorType{x.type.shape, DType::Bool});
    any_non_finite = e.bor(any_non_finite, any_true(ctx, e.bnot(finite)));
    results.push_back(ctx.convert(e.mul(x, coefficient(e, inv_scale)), grad.type.dtype));
  }
  V found = ctx.broadcast_in_dim(any_non_finite, found_inf.type.shape, {});
  results.push_back(ctx.select(found, ctx.constant(1.0, found_inf.type.dtype, found_inf.type.shape), found_inf));
  ctx.set_results(results);
}

// _amp_update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, interval)
//   -> (scale, growth_tracker) as CPU's kernel updates them: backed off (tracker 0) after an
//   overflow, else grown (in double, kept only when finite; tracker 0) every `interval`
//   successful steps, else the tracker counts.
void lower_amp_update_scale(LoweringContext& ctx, const Node& node) {
  V scale = ctx.input(node, 0), tracker = ctx.input(node, 1), found_inf = ctx.input(node, 2);
  DType wide = wide_dtype(ctx);
  const std::vector<int64_t>& shape = scale.type.shape;
  V overflowed = ctx.compare(Cmp::NE, found_inf, ctx.constant(0.0, found_inf.type.dtype, found_inf.type.shape));
  V successful = ctx.binary(Hlo::Add, tracker, ctx.constant_int(1, tracker.type.dtype, tracker.type.shape));
  V grows = ctx.compare(Cmp::EQ, successful, ctx.constant_int(node.args[5].as_int(), tracker.type.dtype, tracker.type.shape));
  V scale_wide = ctx.convert(scale, wide);
  auto times = [&](int arg) {
    V factor = ctx.broadcast_in_dim(hyperparameter(ctx, node, arg), shape, {});
    return ctx.convert(ctx.binary(Hlo::Multiply, scale_wide, factor), scale.type.dtype);
  };
  V grown = times(3);
  V grown_if_finite = ctx.select(ctx.emit(Hlo::IsFinite, {grown}, TensorType{shape, DType::Bool}), grown, scale);
  V zero = ctx.constant_int(0, tracker.type.dtype, tracker.type.shape);
  V new_scale = ctx.select(overflowed, times(4), ctx.select(grows, grown_if_finite, scale));
  V new_tracker = ctx.select(overflowed, zero, ctx.select(grows, zero, successful));
  ctx.set_results({new_scale, new_tracker});
}

// CPU's fused kernels take floating parameters only (AT_DISPATCH_FLOATING_TYPES_AND2).
constexpr RuleFlags kFusedStep{.lifts_floats = true, .refuses = kBoolDTypes | kIntegerDTypes};

LOWERING("aten::_fused_adam", lower_fused_adam, AdamDecay::L2, kFusedStep);
LOWERING("aten::_fused_adam.tensor_lr", lower_fused_adam, AdamDecay::L2, kFusedStep);
LOWERING("aten::_fused_adamw", lower_fused_adam, AdamDecay::Decoupled, kFusedStep);
LOWERING("aten::_fused_adamw.tensor_lr", lower_fused_adam, AdamDecay::Decoupled, kFusedStep);
LOWERING("aten::_fused_sgd", lower_fused_sgd, nullptr, kFusedStep);
LOWERING("aten::_fused_sgd.tensor_lr", lower_fused_sgd, nullptr, kFusedStep);
LOWERING("aten::_fused_adagrad", lower_fused_adagrad, nullptr, kFusedStep);
LOWERING("aten::_fused_adagrad.tensor_lr", lower_fused_adagrad, nullptr, kFusedStep);
LOWERING("aten::_amp_foreach_non_finite_check_and_unscale", lower_amp_non_finite_check_and_unscale, nullptr, kFloatOnly);
LOWERING("aten::_amp_update_scale", lower_amp_update_scale);

}  // namespace
}  // namespace torchtpu
