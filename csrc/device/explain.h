// TORCHTPU_EXPLAIN and torchtpu.explain(): which route each op takes through the tpu kernels
// (lowered by which rule, declined and why, a view or in-place op below functionalization,
// the CPU fallback). The routing code reports at each route it takes; while nothing listens,
// a report costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "lowering/registry.h"

namespace torchtpu {

namespace explain_detail {
extern std::atomic<bool> listening;
void note_decline(const char* reason);
}  // namespace explain_detail

inline bool explaining() { return explain_detail::listening.load(std::memory_order_relaxed); }

// The route an op took ("lowered", "CPU fallback", ...) and what decided it, to the listeners.
// Call it under `if (explaining())` when building the detail costs anything.
void report_route(const std::string& op, const std::string& route, const std::string& detail);
inline void explain_route(const std::string& op, const char* route, const char* detail = "") {
  if (explaining()) report_route(op, route, detail);
}
// Lowered by its rule (names the rule's function and file, and a view functionalization copied).
void report_lowered(const std::string& op, const LoweringRule* rule, const char* how);
inline void explain_lowered(const std::string& op, const LoweringRule* rule, const char* how = nullptr) {
  if (explaining()) report_lowered(op, rule, how);
}

// record_op's `return false`: remembers why (per thread) for the route reported when CPU's
// kernel then decides.
inline bool declined(const char* reason) {
  if (explaining()) explain_detail::note_decline(reason);
  return false;
}
// The reason noted last on this thread (and forgets it), or "".
std::string take_decline_reason();

struct ExplainedRoute {
  std::string op, route, detail;
  int64_t count = 0;
};

// Prints each new (op, route, detail) of the listed ops ("all", "aten::add" for every overload,
// "aten::add.Tensor") through `print` (TORCHTPU_EXPLAIN); an empty list stops printing.
void explain_print(std::vector<std::string> ops, void (*print)(const std::string& line));
// Collects every route from now on (torchtpu.explain) until stop_collecting returns them.
void explain_start_collecting();
std::vector<ExplainedRoute> explain_stop_collecting();

}  // namespace torchtpu
