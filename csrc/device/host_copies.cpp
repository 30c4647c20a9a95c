// Pinned host memory and non-blocking copies to it (see host_copies.h).
#include "device/host_copies.h"

#include <c10/core/impl/alloc_cpu.h>

#include <deque>
#include <map>
#include <mutex>

#include "device/tensor.h"
#include "engine/engine.h"

namespace torchtpu {
namespace {

// Pinned memory is plain host memory (XLA's CPU client and the PJRT plugins copy from and to
// any host pointer), remembered so that is_pinned() and non-blocking copies can tell it.
std::mutex g_pinned_mutex;
std::map<const char*, size_t> g_pinned;  // start -> bytes

void free_pinned(void* ptr) {
  if (!ptr) return;
  {
    std::lock_guard<std::mutex> guard(g_pinned_mutex);
    g_pinned.erase(static_cast<const char*>(ptr));
  }
  c10::free_cpu(ptr);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* ptr = n ? c10::alloc_cpu(n) : nullptr;
    if (ptr) {
      std::lock_guard<std::mutex> guard(g_pinned_mutex);
      g_pinned[static_cast<const char*>(ptr)] = n;
    }
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

// Issued copies, oldest first; `number` counts from 1.
struct PendingCopy {
  IssuedRead read;
  at::Tensor dst;
  uint64_t number = 0;
};
std::mutex g_copies_mutex;
std::deque<PendingCopy> g_copies;
uint64_t g_issued = 0;

}  // namespace

c10::Allocator* pinned_allocator() {
  static PinnedAllocator allocator;
  return &allocator;
}

bool is_pinned_ptr(const void* ptr) {
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> guard(g_pinned_mutex);
  auto it = g_pinned.upper_bound(p);
  if (it == g_pinned.begin()) return false;
  --it;
  return p < it->first + it->second;
}

bool copy_to_pinned_later(const at::Tensor& src, const at::Tensor& dst) {
  if (!is_tpu(src) || dst.device().type() != c10::DeviceType::CPU) return false;
  if (dst.scalar_type() != src.scalar_type() || dst.sizes() != src.sizes() || !dst.is_contiguous() ||
      dst.numel() == 0 || !is_pinned_ptr(dst.data_ptr()))
    return false;
  IssuedRead read = issue_read(value_of(src, src.device().index()));
  std::lock_guard<std::mutex> guard(g_copies_mutex);
  g_copies.push_back(PendingCopy{std::move(read), dst, ++g_issued});
  return true;
}

uint64_t host_copies_issued() {
  std::lock_guard<std::mutex> guard(g_copies_mutex);
  return g_issued;
}

void finish_host_copies(uint64_t through) {
  for (;;) {
    PendingCopy copy;
    {
      std::lock_guard<std::mutex> guard(g_copies_mutex);
      if (g_copies.empty() || g_copies.front().number > through) return;
      copy = std::move(g_copies.front());
      g_copies.pop_front();
    }
    // Waits (without the lock: another thread may issue meanwhile) and lands the bytes.
    at::Tensor host = finish_read(copy.read);
    copy.dst.copy_(host);
  }
}

void synchronize(bool wait, FlushReason reason) {
  Engine::get().sync(wait, reason);
  if (wait) finish_host_copies();
}

}  // namespace torchtpu
