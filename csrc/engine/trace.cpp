// The process's tracer (see trace.h).
#include "engine/trace.h"

#include <cstdio>

namespace torchtpu {
namespace {

std::atomic<Tracer*> g_tracer{nullptr};

}  // namespace

void install_tracer(Tracer* tracer) { g_tracer.store(tracer, std::memory_order_release); }

Tracer* current_tracer() { return g_tracer.load(std::memory_order_acquire); }

std::string graph_name(uint64_t hash) {
  char name[17];
  std::snprintf(name, sizeof(name), "%016llx", static_cast<unsigned long long>(hash));
  return name;
}

}  // namespace torchtpu
