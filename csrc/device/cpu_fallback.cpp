// Ops without a lowering run on CPU: inputs copied to the host, the CPU kernel, results
// (and arguments it wrote) copied back. Counted per op in metrics, warned once per op,
// an error under TORCHTPU_FALLBACK=error.
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <mutex>
#include <unordered_set>

#include "device/kernels.h"
#include "engine/engine.h"

namespace torchtpu {
namespace {

std::atomic<int> g_fallback_policy{0};  // 0 warn, 1 error, 2 silent
std::mutex g_warned_mutex;
std::unordered_set<std::string> g_warned;

void write_back(const at::Tensor& tpu_dst, const at::Tensor& cpu_src) {
  store_value(tpu_dst, upload(cpu_src, tpu_dst.device().index()));
}

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

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // PyTorch's structured kernels reach us as `op.out` after allocating the output; users
  // know the op by its functional name.
  std::string name = op.operator_name().overload_name == "out" ? op.operator_name().name : op_name(op);
  if (g_fallback_policy == 1)
    TORCH_CHECK_NOT_IMPLEMENTED(false, "torchtpu: op ", name, " has no tpu lowering and TORCHTPU_FALLBACK=error; "
                                "set TORCHTPU_FALLBACK=warn to run it on CPU");
  Engine::get().record_fallback(name);
  if (g_fallback_policy == 0) {
    std::lock_guard<std::mutex> lock(g_warned_mutex);
    if (g_warned.insert(name).second)
      TORCH_WARN("torchtpu: op ", name, " has no tpu lowering yet; it runs on CPU (copies to and from the device). "
                 "torchtpu.metrics.counters()['fallback_ops'] counts these; TORCHTPU_FALLBACK=error makes it an error.");
  }
  const auto& schema = op.schema();
  size_t n = schema.arguments().size();
  auto args = torch::jit::last(*stack, n);
  int device = device_of_args(std::vector<c10::IValue>(args.begin(), args.end()));
  std::vector<std::pair<at::Tensor, at::Tensor>> mutated;  // (tpu tensor, its CPU stand-in)
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = (*stack)[stack->size() - n + i];
    const auto* alias = schema.arguments()[i].alias_info();
    bool written = alias && alias->isWrite();
    if (v.isTensor()) {
      at::Tensor t = v.toTensor();
      if (is_tpu(t)) {
        at::Tensor cpu = to_host(t);
        if (written) mutated.emplace_back(t, cpu);
        v = cpu;
      }
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> cpu_list;
      for (const at::Tensor& t : v.toTensorList()) {
        at::Tensor cpu = to_host(t);
        if (written && is_tpu(t)) mutated.emplace_back(t, cpu);
        cpu_list.push_back(cpu);
      }
      v = cpu_list;
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> cpu_list;
      for (const auto& ref : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = ref;
        cpu_list.push_back(t.has_value() && t->defined() ? std::optional<at::Tensor>(to_host(*t)) : std::nullopt);
      }
      v = cpu_list;
    } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      v = c10::Device(c10::kCPU);
    } else if (v.isGenerator() && v.toGenerator().device().type() == c10::DeviceType::PrivateUse1) {
      v = c10::IValue();
    }
  }
  {
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }
  for (auto& [tpu, cpu] : mutated) write_back(tpu, cpu);
  size_t r = schema.returns().size();
  for (size_t i = 0; i < r; ++i) {
    c10::IValue& v = (*stack)[stack->size() - r + i];
    const auto* alias = schema.returns()[i].alias_info();
    if (alias && alias->isWrite()) {
      // Returns an argument it mutated (add_, out=): hand back the tpu tensor.
      for (auto& [tpu, cpu] : mutated)
        if (v.isTensor() && v.toTensor().is_same(cpu)) v = tpu;
      continue;
    }
    if (v.isTensor() && v.toTensor().defined()) {
      v = wrap_for_user(make_tensor(upload(v.toTensor(), device)));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(wrap_for_user(make_tensor(upload(t, device))));
      v = out;
    }
  }
}

}  // namespace torchtpu
