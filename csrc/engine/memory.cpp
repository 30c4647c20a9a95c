// Device memory: each device's budget, and the checks that an op's result or a graph fits in it.
#include "engine/engine.h"

#include <cstdio>
#include <stdexcept>
#include <string>

#include "engine/graph_plan.h"

namespace torchtpu {

namespace {

std::string format_bytes(int64_t bytes) {
  char buf[32];
  double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof(buf), "%.2f MiB", b / (1024.0 * 1024));
  else std::snprintf(buf, sizeof(buf), "%lld bytes", static_cast<long long>(bytes));
  return buf;
}

}  // namespace

std::string out_of_memory_message(int64_t bytes, const std::string& what, int device, int64_t budget) {
  return "torchtpu: tpu out of memory. Tried to allocate " + format_bytes(bytes) + " for " + what + ". tpu:" +
         std::to_string(device) + " can hold " + format_bytes(budget) + ", of which tensors hold " +
         format_bytes(device_bytes_in_use(device)) +
         ". Free tensors you no longer need (del them), lower the batch size, or call torchtpu.sync() more often "
         "so that fewer results are computed at once.";
}

void Engine::set_memory_fraction(int device, double fraction) {
  EngineLock lock;
  if (device < 0 || device >= runtime().device_count())
    throw std::invalid_argument("torchtpu: no tpu:" + std::to_string(device));
  if (fraction < 0.0 || fraction > 1.0)
    throw std::invalid_argument("torchtpu: memory fraction " + std::to_string(fraction) + " is not in [0, 1]");
  if (memory_fraction_.size() <= static_cast<size_t>(device)) memory_fraction_.resize(device + 1, 1.0);
  memory_fraction_[device] = fraction;
}

int64_t Engine::memory_budget(int device) {
  EngineLock lock;
  if (memory_limit_.size() <= static_cast<size_t>(device)) memory_limit_.resize(device + 1, -1);
  if (memory_limit_[device] < 0) memory_limit_[device] = runtime().memory_limit(device);
  double fraction = static_cast<size_t>(device) < memory_fraction_.size() ? memory_fraction_[device] : 1.0;
  return static_cast<int64_t>(static_cast<double>(memory_limit_[device]) * fraction);
}

// An op's result that cannot fit on the device even alone raises at the op, as a CUDA
// allocation would (a fused graph would otherwise fail later, away from the user's line).
void Engine::check_fits(const Node& node) {
  int64_t budget = memory_budget(node.device);
  // On a mesh a result is spread over its devices: at best each holds an equal share.
  int64_t shares = node.mesh ? static_cast<int64_t>(node.mesh->devices.size()) : 1;
  for (const TensorType& t : node.outputs)
    if (t.nbytes() / shares > budget)
      throw DeviceOutOfMemory(out_of_memory_message(t.nbytes(), "a result of " + node.op.name() + " (" + t.str() + ")",
                                                    node.device, budget));
}

}  // namespace torchtpu
