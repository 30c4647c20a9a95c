// The process's one Runtime.
#include "runtime/runtime.h"

#include <atomic>

namespace torchtpu {
namespace {
std::atomic<Runtime*> g_runtime{nullptr};
std::atomic<InterruptTest> g_interrupt_test{nullptr};
}  // namespace

void set_interrupt_test(InterruptTest test) { g_interrupt_test.store(test); }

bool is_interrupt(const std::exception_ptr& error) {
  InterruptTest test = g_interrupt_test.load();
  return error && test && test(error);
}

void rethrow_if_interrupt() {
  std::exception_ptr current = std::current_exception();
  if (is_interrupt(current)) std::rethrow_exception(current);
}

void install_runtime(Runtime* runtime) {
  Runtime* expected = nullptr;
  if (!g_runtime.compare_exchange_strong(expected, runtime))
    throw std::logic_error("torchtpu: a runtime is already installed");
}

bool runtime_initialized() { return g_runtime.load() != nullptr; }

Runtime& runtime() {
  Runtime* r = g_runtime.load();
  if (!r) throw std::runtime_error("torchtpu: runtime used before torchtpu was initialised");
  return *r;
}

}  // namespace torchtpu
