// Runtime checks (RuntimeCheck, stablehlo/builder.h): what a compiled graph checks and, once
// it is launched, its flags until the host reads them at its next wait - the way CUDA's
// device-side asserts surface at the next synchronization.
#pragma once

#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/runtime.h"
#include "stablehlo/builder.h"

namespace torchtpu {

// A check a compiled graph computes: its node (index in the graph's node order) and error.
struct CheckSpec {
  int node = 0;
  RuntimeCheck check;
};

// A check that failed; the device layer raises the Python exception of its kind.
struct CheckFailed : std::runtime_error {
  RuntimeCheck::Error error;
  CheckFailed(RuntimeCheck::Error e, const std::string& message) : std::runtime_error(message), error(e) {}
};

// The flags of launched graphs, oldest first.
class CheckQueue {
 public:
  struct Entry {
    RuntimeCheck check;
    std::string op;      // "aten::index.Tensor"
    std::string origin;  // the user's Python line that issued it
  };
  // `flags` holds (failed, value) per entry, as int64.
  void add(Runtime& rt, BufferPtr flags, int device, std::vector<Entry> entries);
  // Reads the flags of graphs on `device` (-1: every device) whose results are computed, or
  // of all of them (waiting) with `wait`, oldest first; throws CheckFailed for the first
  // failed check. Read flags are dropped, so each failure is raised once.
  void raise_failed(Runtime& rt, int device, bool wait);

 private:
  struct Launched {
    BufferPtr flags;
    int device;
    std::vector<Entry> entries;
  };
  // The first failure of `launched`, or nothing.
  static const Entry* first_failure(Runtime& rt, const Launched& launched, int64_t* value);
  std::deque<Launched> launched_;
};

std::string check_message(const CheckQueue::Entry& entry, int64_t value);

}  // namespace torchtpu
