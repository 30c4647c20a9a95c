// Profiler events of torchtpu (flushes, compiles, executions, transfers, CPU fallbacks):
// the engine and the device layer open TraceSpans; the Tracer the device layer installs
// turns them into PyTorch profiler events. No tracer, or no profiler listening, costs one
// check per span: attributes are only computed for a span that is recorded.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

// Builds with -DTORCHTPU_TRACING=0 compile every span out (bench/profiler_overhead.py
// measures the cost of the checks against such a build).
#ifndef TORCHTPU_TRACING
#define TORCHTPU_TRACING 1
#endif

namespace torchtpu {

struct TraceAttribute {
  std::string name;
  std::variant<int64_t, double, std::string> value;
};

// What a span records: its name ("torchtpu::flush#observation": the one attribute that
// classifies it rides in the name, which every profiler keeps) and its attributes.
struct TraceEvent {
  std::string name;
  std::vector<TraceAttribute> attributes;
};

// An open span: it ends when destroyed.
struct TraceScope {
  virtual ~TraceScope() = default;
};

class Tracer {
 public:
  virtual ~Tracer() = default;
  // Whether a span begun now on this thread may be recorded (cheap; checked first).
  virtual bool enabled() const = 0;
  // Begins a span; null when nothing records it after all.
  virtual std::unique_ptr<TraceScope> begin(TraceEvent event) = 0;
};

// The process's tracer (installed once by the device layer; none in C++ tests by default).
void install_tracer(Tracer* tracer);
Tracer* current_tracer();

// Whether a span begun now would be recorded: for work done only to be traced.
inline bool tracing() {
#if TORCHTPU_TRACING
  Tracer* tracer = current_tracer();
  return tracer && tracer->enabled();
#else
  return false;
#endif
}

// "%016llx": how graphs are named in traces and TORCHTPU_DUMP_DIR file names.
std::string graph_name(uint64_t hash);

// A span from construction to destruction. `describe` returns the TraceEvent and is only
// called when a profiler may record the span:
//   TraceSpan span([&] { return TraceEvent{"torchtpu::execute", {{"graph", graph_name(h)}}}; });
class TraceSpan {
 public:
  template <typename Describe>
  explicit TraceSpan([[maybe_unused]] Describe&& describe) {
#if TORCHTPU_TRACING
    Tracer* tracer = current_tracer();
    if (tracer && tracer->enabled()) scope_ = tracer->begin(describe());
#endif
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  std::unique_ptr<TraceScope> scope_;
};

}  // namespace torchtpu
