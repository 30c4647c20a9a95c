// torchtpu.export's device side (see export.h).
#include "device/export.h"

#include <map>

#include "device/tensor.h"
#include "engine/engine.h"

namespace torchtpu {
namespace {

struct ExportState {
  bool active = false;
  int64_t execute_count = 0;
  std::map<std::string, int64_t> fallback_ops;
};
thread_local ExportState g_export;

int device_of(const std::vector<const std::vector<at::Tensor>*>& groups) {
  for (const auto* group : groups)
    for (const at::Tensor& t : *group)
      if (t.defined() && is_tpu(t)) return t.device().index();
  return current_device();
}

std::vector<ValuePtr> values_of(const std::vector<at::Tensor>& tensors, int device, const char* what) {
  std::vector<ValuePtr> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK_VALUE(t.defined() && is_tpu(t) && t.device().index() == device, "torchtpu.export: every ", what,
                      " must be a tensor on tpu:", device, ", got ", t.defined() ? t.device().str() : "None");
    out.push_back(value_of(t, device));
  }
  return out;
}

}  // namespace

void export_begin() {
  EngineLock lock;
  Engine& e = Engine::get();
  TORCH_CHECK_VALUE(e.mode() == Mode::Fused, "torchtpu.export records the model in fused mode");
  e.sync(false, FlushReason::Sync);
  g_export.active = true;
  g_export.execute_count = e.metrics().execute_count.load();
  g_export.fallback_ops = e.metrics().fallback_ops;
}

ExportedGraph export_end(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& outputs) {
  EngineLock lock;
  Engine& e = Engine::get();
  TORCH_CHECK_VALUE(g_export.active, "torchtpu.export: export_end without export_begin");
  g_export.active = false;
  std::string on_cpu;
  for (const auto& [op, count] : e.metrics().fallback_ops) {
    auto before = g_export.fallback_ops.find(op);
    if (before == g_export.fallback_ops.end() || before->second < count) on_cpu += (on_cpu.empty() ? "" : ", ") + op;
  }
  TORCH_CHECK_VALUE(on_cpu.empty(), "torchtpu.export: ", on_cpu, " ran on CPU (no tpu lowering yet); an exported "
                    "module must compute everything in StableHLO");
  TORCH_CHECK_VALUE(e.metrics().execute_count.load() == g_export.execute_count,
                    "torchtpu.export: the model's graph ran while it was recorded (the model reads a value on the "
                    "host - .item(), .tolist(), a data-dependent shape - or has more than TORCHTPU_MAX_PENDING_OPS "
                    "ops); an exported module must be one graph");
  int device = device_of({&weights, &inputs, &outputs});
  Engine::ExportedModule module = e.lower_for_export(values_of(weights, device, "weight"),
                                                     values_of(inputs, device, "input"),
                                                     values_of(outputs, device, "output"), device);
  ExportedGraph out;
  out.text = std::move(module.text);
  for (ValuePtr& v : module.constants) out.constants.push_back(wrap_for_user(make_tensor(std::move(v))));
  return out;
}

}  // namespace torchtpu
