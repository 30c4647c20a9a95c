// The process's one Runtime, started on first use, and the process's place in a job.
#include "runtime/runtime.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <mutex>

namespace torchtpu {
namespace {
std::atomic<Runtime*> g_runtime{nullptr};
std::atomic<bool> g_forked{false};
std::atomic<int> g_device_count{0};
std::function<Runtime*()> g_starter;
std::mutex g_start_mutex;
ProcessLayout g_layout;
int g_known_device_count = -1;

// Runs in the child right after fork(): a runtime started in the parent is unusable there.
void mark_forked() {
  if (g_runtime.load()) g_forked.store(true);
}

// The runtime is the process's from now on (installed or started).
void adopt(Runtime* runtime) {
  g_device_count.store(runtime->device_count());
  static std::once_flag watching;
  std::call_once(watching, [] { pthread_atfork(nullptr, nullptr, mark_forked); });
}
std::atomic<InterruptTest> g_interrupt_test{nullptr};
}  // namespace

bool ynn_fusions_off(const std::string& platform, const std::string& module_text, bool excess_precision) {
  if (platform != "cpu" || excess_precision) return false;
  for (const char* type : {"xf16>", "<f16>", "xbf16>", "<bf16>"})  // float16/bfloat16 values
    if (module_text.find(type) != std::string::npos) return true;
  return false;
}

std::vector<int64_t> one_device_per_process(std::vector<std::pair<int, int64_t>> by_process, const char* source) {
  std::sort(by_process.begin(), by_process.end());
  std::vector<int64_t> ids;
  for (size_t i = 0; i < by_process.size(); ++i) {
    if (by_process[i].first != static_cast<int>(i))
      throw std::runtime_error(std::string("torchtpu: a multi-process job needs exactly one device per process; ") +
                               source + " reports " + std::to_string(by_process.size()) + " devices over the processes");
    ids.push_back(by_process[i].second);
  }
  return ids;
}

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
  adopt(runtime);
}

int runtime_device_count() { return g_device_count.load(); }

bool runtime_forked() { return g_forked.load(); }

void check_not_forked() {
  if (g_forked.load())
    throw std::runtime_error(
        "Cannot re-initialize torchtpu in forked subprocess. To use tpu with multiprocessing, you must use "
        "the 'spawn' start method");
}

void set_runtime_starter(std::function<Runtime*()> starter) {
  std::lock_guard<std::mutex> lock(g_start_mutex);
  g_starter = std::move(starter);
}

bool runtime_initialized() { return g_runtime.load() != nullptr; }

Runtime& runtime() {
  check_not_forked();
  if (Runtime* r = g_runtime.load()) return *r;
  std::function<Runtime*()> starter;
  {
    std::lock_guard<std::mutex> lock(g_start_mutex);
    starter = g_starter;
  }
  if (!starter) throw std::runtime_error("torchtpu: runtime used before torchtpu was initialised");
  // The starter serialises itself (it may need to release locks the caller's language holds).
  Runtime* started = starter();
  Runtime* expected = nullptr;
  if (g_runtime.compare_exchange_strong(expected, started)) adopt(started);
  return *g_runtime.load();
}

void set_process_layout(ProcessLayout layout) { g_layout = layout; }
const ProcessLayout& process_layout() { return g_layout; }

bool device_addressable(int index) { return g_layout.local_world_size == 0 || index == g_layout.local_rank; }

void set_device_count_before_start(int known) { g_known_device_count = known; }

int configured_device_count() {
  if (g_layout.local_world_size > 0) return g_layout.local_world_size;
  // Answers in a forked child too (from the count the parent's runtime had).
  if (runtime_initialized()) return runtime_device_count();
  if (g_known_device_count >= 0) return g_known_device_count;
  return runtime().device_count();
}

}  // namespace torchtpu
