// The queue of launched runtime checks and how a failed one is reported.
#include "engine/checks.h"

namespace torchtpu {
namespace {

// Beyond this many unread launches, finished ones that passed are dropped as new ones come
// (a loop that never waits must not grow the queue without bound).
constexpr size_t kMaxUnread = 256;

}  // namespace

std::string check_message(const CheckQueue::Entry& entry, int64_t value) {
  std::string message = entry.check.message;
  auto at = message.find("{}");
  if (at != std::string::npos) message.replace(at, 2, std::to_string(value));
  message += " (checked on tpu by " + entry.op;
  if (!entry.origin.empty()) message += " issued at " + entry.origin;
  return message + ")";
}

const CheckQueue::Entry* CheckQueue::first_failure(Runtime& rt, const Launched& launched, int64_t* value) {
  std::vector<int64_t> flags(launched.entries.size() * 2);
  rt.download_bytes(*launched.flags, flags.data());
  for (size_t i = 0; i < launched.entries.size(); ++i) {
    if (flags[2 * i] != 0) {
      *value = flags[2 * i + 1];
      return &launched.entries[i];
    }
  }
  return nullptr;
}

void CheckQueue::add(Runtime& rt, BufferPtr flags, int device, std::vector<Entry> entries) {
  launched_.push_back(Launched{std::move(flags), device, std::move(entries)});
  if (launched_.size() <= kMaxUnread) return;
  // Keep failures (the next wait raises them); drop finished launches that passed. Never
  // throws: the launch that called this succeeded (a device error surfaces at the next wait).
  std::deque<Launched> kept;
  for (Launched& l : launched_) {
    int64_t value = 0;
    bool passed = false;
    try {
      passed = rt.is_ready(*l.flags) && !first_failure(rt, l, &value);
    } catch (const std::exception&) {
    }
    if (!passed) kept.push_back(std::move(l));
  }
  launched_.swap(kept);
}

void CheckQueue::raise_failed(Runtime& rt, int device, bool wait) {
  for (auto it = launched_.begin(); it != launched_.end();) {
    if (device >= 0 && it->device != device) {
      ++it;
      continue;
    }
    if (!wait && !rt.is_ready(*it->flags)) {
      ++it;
      continue;
    }
    Launched launched = std::move(*it);
    it = launched_.erase(it);
    int64_t value = 0;
    if (const Entry* failed = first_failure(rt, launched, &value))
      throw CheckFailed(failed->check.error, check_message(*failed, value));
  }
}

}  // namespace torchtpu
