// What the engine reports and is told by name: its counters (Metrics), and the names of modes and flush reasons.
#include "engine/engine.h"

#include <stdexcept>

namespace torchtpu {

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::Debug: return "debug";
    case Mode::Strict: return "strict";
    case Mode::Fused: return "fused";
  }
  return "?";
}

Mode parse_mode(const std::string& name) {
  if (name == "debug") return Mode::Debug;
  if (name == "strict") return Mode::Strict;
  if (name == "fused") return Mode::Fused;
  throw std::invalid_argument("torchtpu: unknown mode '" + name + "'; choose debug, strict or fused");
}

const char* flush_reason_name(FlushReason reason) {
  switch (reason) {
    case FlushReason::Observation: return "observation";
    case FlushReason::OptimizerStep: return "optimizer_step";
    case FlushReason::SizeLimit: return "size_limit";
    case FlushReason::Sync: return "sync";
    case FlushReason::ModeChange: return "mode_change";
    case FlushReason::TorchCompile: return "torch_compile";
  }
  return "?";
}

FlushReason parse_flush_reason(const std::string& name) {
  for (FlushReason r : {FlushReason::Observation, FlushReason::OptimizerStep, FlushReason::SizeLimit, FlushReason::Sync,
                        FlushReason::ModeChange, FlushReason::TorchCompile})
    if (name == flush_reason_name(r)) return r;
  throw std::invalid_argument("torchtpu: unknown flush reason '" + name + "'");
}

void Engine::reset_metrics() {
  EngineLock lock;
  metrics_.ops_traced = 0;
  metrics_.graphs_compiled = 0;
  metrics_.cache_hits_memory = 0;
  metrics_.cache_hits_disk = 0;
  metrics_.execute_count = 0;
  metrics_.bytes_to_device = 0;
  metrics_.bytes_to_host = 0;
  metrics_.downloads = 0;
  metrics_.recompilations = 0;
  metrics_.donated_buffers = 0;
  metrics_.executables_evicted = 0;
  metrics_.compile_seconds = 0;
  metrics_.fallback_ops.clear();
  metrics_.recompilation_log.clear();
  reset_bucket_counts(*buckets_);
}

void Engine::record_fallback(const std::string& op) {
  EngineLock lock;
  metrics_.fallback_ops[op] += 1;
}

}  // namespace torchtpu
