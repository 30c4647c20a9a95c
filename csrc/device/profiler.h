// torchtpu's profiler events as PyTorch profiler events (at::RecordFunction, USER_SCOPE):
// what torch.profiler.profile collects and exports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/trace.h"

namespace torchtpu {

// Installs the engine's tracer (engine/trace.h) that records spans as RecordFunctions.
void install_profiler_tracer();

// The attributes of recorded spans, kept apart while a log is on: PyTorch exports a record
// function's attributes only with record_shapes=True, which also keeps every op's inputs
// alive (weak references), so torchtpu.profiler.trace profiles without it and adds them to
// the trace from this log (matched per thread and name, in order).
struct LoggedSpan {
  int64_t thread = 0;  // the OS thread id, as in Chrome traces
  std::string name;
  std::vector<TraceAttribute> attributes;
};
void start_span_log();
std::vector<LoggedSpan> take_span_log();  // and stops logging

}  // namespace torchtpu
