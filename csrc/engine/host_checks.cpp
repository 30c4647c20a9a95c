// Checks the host reads after a graph ran: add_check's values verified on the host, and the graphs' failed runtime checks.
#include "engine/engine.h"

#include <stdexcept>

namespace torchtpu {

void Engine::add_check(ValuePtr value, std::function<std::string(const std::vector<int64_t>&)> verify) {
  EngineLock lock;
  host_checks_.push_back(HostCheck{std::move(value), std::move(verify)});
}

// Reads the computed check values (a few bytes each; not counted as transfers of user data).
void Engine::run_checks_locked() {
  if (host_checks_.empty()) return;
  std::vector<HostCheck> keep;
  std::string errors;
  for (HostCheck& check : host_checks_) {
    if (check.value->pending() || !check.value->buffer) {
      keep.push_back(std::move(check));
      continue;
    }
    std::string message = check.verify(runtime().read_int64(*check.value->buffer));
    if (!message.empty() && errors.empty()) errors = message;
  }
  host_checks_.swap(keep);
  if (!errors.empty()) throw std::runtime_error(errors);
}

void Engine::raise_failed_checks(int device) {
  EngineLock lock;
  if (runtime_initialized()) checks_.raise_failed(runtime(), device, /*wait=*/false);
}

}  // namespace torchtpu
