// The engine's Tracer on PyTorch's RecordFunction: each span is a USER_SCOPE record function,
// its attributes the record function's keyword inputs (torch.profiler exports them as the
// event's args when it records inputs: record_shapes=True), and, while a span log is on,
// also a log entry (see profiler.h).
#include "device/profiler.h"

#include <ATen/record_function.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace torchtpu {
namespace {

std::atomic<bool> g_logging{false};
std::mutex g_log_mutex;
std::vector<LoggedSpan> g_log;

c10::IValue to_ivalue(const std::variant<int64_t, double, std::string>& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  if (const auto* d = std::get_if<double>(&value)) return *d;
  return std::get<std::string>(value);
}

void log_span(const TraceEvent& event) {
  LoggedSpan span{static_cast<int64_t>(syscall(SYS_gettid)), event.name, event.attributes};
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (g_logging.load()) g_log.push_back(std::move(span));
}

// One open span. The name lives here: the record function refers to it until it ends.
struct RecordFunctionScope final : TraceScope {
  RecordFunctionScope(at::StepCallbacks callbacks, TraceEvent event)
      : name(std::move(event.name)), record(std::move(callbacks)) {
    std::unordered_map<std::string, c10::IValue> attributes;
    for (TraceAttribute& a : event.attributes) attributes.emplace(std::move(a.name), to_ivalue(a.value));
    record.before(std::string_view(name), &attributes);
  }
  std::string name;
  at::RecordFunction record;  // its destructor ends the event
};

class RecordFunctionTracer final : public Tracer {
 public:
  // The dispatcher's own per-op check (a thread-local test while no profiler runs);
  // at::hasCallbacks() would copy the global callback list under a mutex.
  bool enabled() const override { return at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE).has_value(); }

  std::unique_ptr<TraceScope> begin(TraceEvent event) override {
    auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE);
    if (!callbacks) return nullptr;
    if (g_logging.load()) log_span(event);
    return std::make_unique<RecordFunctionScope>(std::move(*callbacks), std::move(event));
  }
};

}  // namespace

void install_profiler_tracer() {
  static RecordFunctionTracer tracer;  // lives for the process, like the engine
  install_tracer(&tracer);
}

void start_span_log() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log.clear();
  g_logging = true;
}

std::vector<LoggedSpan> take_span_log() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_logging = false;
  return std::move(g_log);
}

}  // namespace torchtpu
