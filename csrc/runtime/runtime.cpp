// The process's one Runtime.
#include "runtime/runtime.h"

#include <pthread.h>

#include <atomic>

namespace torchtpu {
namespace {
std::atomic<Runtime*> g_runtime{nullptr};
std::atomic<bool> g_forked{false};
std::atomic<int> g_device_count{0};

void mark_forked() { g_forked.store(true); }  // runs in the child right after fork()
}  // namespace

void install_runtime(Runtime* runtime) {
  Runtime* expected = nullptr;
  if (!g_runtime.compare_exchange_strong(expected, runtime))
    throw std::logic_error("torchtpu: a runtime is already installed");
  g_device_count.store(runtime->device_count());
  pthread_atfork(nullptr, nullptr, mark_forked);
}

int runtime_device_count() { return g_device_count.load(); }

bool runtime_forked() { return g_forked.load(); }

void check_not_forked() {
  if (g_forked.load())
    throw std::runtime_error(
        "Cannot re-initialize torchtpu in forked subprocess. To use tpu with multiprocessing, you must use "
        "the 'spawn' start method");
}

bool runtime_initialized() { return g_runtime.load() != nullptr; }

Runtime& runtime() {
  check_not_forked();
  Runtime* r = g_runtime.load();
  if (!r) throw std::runtime_error("torchtpu: runtime used before torchtpu was initialised");
  return *r;
}

}  // namespace torchtpu
