// Ops without a lowering run on CPU through PyTorch's own boxed CPU fallback (inputs
// copied to the host, the CPU kernel, written arguments and results copied back), under
// torchtpu's policy: counted per op in metrics, warned once per op, an error under
// TORCHTPU_FALLBACK=error. Calls a lowering declines run there too, but only count as a
// fallback when CPU's kernel computes them (cpu_kernel_decides).
#include <ATen/native/CPUFallback.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <mutex>
#include <unordered_set>

#include "device/explain.h"
#include "device/kernels.h"
#include "engine/engine.h"
#include "engine/trace.h"

namespace torchtpu {
namespace {

std::atomic<int> g_fallback_policy{0};  // 0 warn, 1 error, 2 silent
std::mutex g_warned_mutex;
std::unordered_set<std::string> g_warned;

}  // namespace

void clear_fallback_warnings() {
  std::lock_guard<std::mutex> lock(g_warned_mutex);
  g_warned.clear();
}

void set_fallback_policy(const std::string& policy) {
  if (policy == "warn") g_fallback_policy = 0;
  else if (policy == "error") g_fallback_policy = 1;
  else if (policy == "silent") g_fallback_policy = 2;
  else throw std::invalid_argument("torchtpu: TORCHTPU_FALLBACK must be warn, error or silent, not '" + policy + "'");
}

namespace {

// PyTorch's structured kernels reach us as `op.out` after allocating the output; users know
// the op by its functional name.
std::string fallback_name(const c10::OperatorHandle& op) {
  return op.operator_name().overload_name == "out" ? op.operator_name().name : op_name(op);
}

void check_fallback_allowed(const std::string& name) {
  if (g_fallback_policy == 1)
    TORCH_CHECK_NOT_IMPLEMENTED(false, "torchtpu: op ", name, " has no tpu lowering and TORCHTPU_FALLBACK=error; "
                                "set TORCHTPU_FALLBACK=warn to run it on CPU");
}

void announce_fallback(const std::string& name) {
  Engine::get().record_fallback(name);
  if (g_fallback_policy != 0) return;
  std::lock_guard<std::mutex> lock(g_warned_mutex);
  if (g_warned.insert(name).second)
    TORCH_WARN("torchtpu: op ", name, " has no tpu lowering yet; it runs on CPU (copies to and from the device). "
               "torchtpu.metrics.counters()['fallback_ops'] counts these; TORCHTPU_FALLBACK=error makes it an error.");
}

// The op's CPU kernel on host copies of its arguments; results come back to the op's device.
void run_on_cpu(const c10::OperatorHandle& op, const std::string& name, torch::jit::Stack* stack) {
  // The whole round trip: inputs to the host, the CPU kernel, results back.
  TraceSpan span([&] { return TraceEvent{"torchtpu::cpu_fallback#" + name, {{"op", name}}}; });
  const auto& schema = op.schema();
  size_t n = schema.arguments().size();
  int device = device_of_args(std::vector<c10::IValue>(stack->end() - n, stack->end()));
  // CPU kernels reject a tpu generator: they draw from the CPU's default one instead.
  for (auto it = stack->end() - n; it != stack->end(); ++it)
    if (it->isGenerator() && it->toGenerator().device().type() == c10::DeviceType::PrivateUse1) *it = c10::IValue();
  {
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    // Copies the tensors to CPU, runs the CPU kernel, writes mutated arguments back
    // (_copy_from_and_resize) and moves results to the first tensor argument's device.
    at::native::cpu_fallback(op, stack);
  }
  // That first tensor argument may be a CPU scalar (op(cpu_scalar_tensor, tpu_tensor)):
  // results that are not arguments the op wrote belong on the op's tpu device.
  size_t r = schema.returns().size();
  for (size_t i = 0; i < r; ++i) {
    const auto* alias = schema.returns()[i].alias_info();
    if (alias && alias->isWrite()) continue;
    c10::IValue& v = (*stack)[stack->size() - r + i];
    auto on_device = [&](const at::Tensor& t) {
      return t.defined() && !is_tpu(t) ? wrap_for_user(make_tensor(upload(t, device))) : t;
    };
    if (v.isTensor()) {
      v = on_device(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(on_device(t));
      v = std::move(out);
    }
  }
}

}  // namespace

std::string admit_fallback(const c10::OperatorHandle& op) {
  std::string name = fallback_name(op);
  if (explaining())
    report_route(op_name(op), g_fallback_policy == 1 ? "no lowering: refused (TORCHTPU_FALLBACK=error)"
                                                     : "no lowering: CPU fallback",
                 "counted in metrics fallback_ops");
  check_fallback_allowed(name);
  announce_fallback(name);
  return name;
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  std::string name = admit_fallback(op);
  run_on_cpu(op, name, stack);
}

void cpu_kernel_decides(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  std::string name = fallback_name(op);
  if (!explaining()) {
    run_on_cpu(op, name, stack);  // PyTorch's error, if CPU's kernel raises one, propagates as is
    check_fallback_allowed(name);
    announce_fallback(name);
    return;
  }
  std::string reason = "declined: " + take_decline_reason();
  try {
    run_on_cpu(op, name, stack);
  } catch (...) {
    report_route(op_name(op), reason, "CPU's kernel raised its error; nothing fell back");
    throw;
  }
  report_route(op_name(op), reason, g_fallback_policy == 1 ? "CPU's kernel computes it: refused (TORCHTPU_FALLBACK=error)"
                                                           : "CPU's kernel computes it: a CPU fallback, counted");
  check_fallback_allowed(name);
  announce_fallback(name);
}

}  // namespace torchtpu
