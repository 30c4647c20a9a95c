// Device memory numbers and the tpu allocator. tpu storages hold no host memory, so the
// allocator allocates nothing; it is a c10::DeviceAllocator so that torch.accelerator's
// memory API (memory_allocated, memory_stats, empty_cache, ...) reads the numbers torch.tpu
// reports.
#include "device/memory.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "device/tensor.h"
#include "engine/engine.h"
#include "runtime/runtime.h"

namespace torchtpu {
namespace {

int64_t platform_number(const std::map<std::string, int64_t>& stats, const char* name, const char* alternative) {
  auto it = stats.find(name);
  if (it == stats.end()) it = stats.find(alternative);
  return it == stats.end() ? 0 : it->second;
}

// (available, total) bytes of host memory: the device memory of the CPU platform.
std::pair<int64_t, int64_t> host_memory() {
  int64_t page = sysconf(_SC_PAGE_SIZE);
  int64_t total = page * sysconf(_SC_PHYS_PAGES);
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kilobytes = 0;
  std::string unit;
  while (meminfo >> key >> kilobytes >> unit)
    if (key == "MemAvailable:") return {kilobytes * 1024, total};
  return {page * sysconf(_SC_AVPHYS_PAGES), total};
}

}  // namespace

MemoryStats memory_stats(int device) {
  check_device_index(device);
  MemoryStats s;
  s.allocated = device_bytes_in_use(device);
  s.allocated_peak = device_bytes_peak(device);
  s.platform = runtime().memory_stats(device);
  // The CPU platform keeps no pool: there, reserved equals allocated.
  s.reserved = std::max(platform_number(s.platform, "pool_bytes", "bytes_reserved"), s.allocated);
  s.reserved_peak = std::max({platform_number(s.platform, "peak_pool_bytes", "peak_bytes_reserved"), s.reserved,
                              s.allocated_peak});
  return s;
}

std::pair<int64_t, int64_t> memory_info(int device) {
  check_device_index(device);
  std::map<std::string, int64_t> stats = runtime().memory_stats(device);
  auto limit = stats.find("bytes_limit");
  if (limit == stats.end()) return host_memory();
  int64_t used = platform_number(stats, "bytes_in_use", "bytes_in_use");
  return {std::max<int64_t>(limit->second - used, 0), limit->second};
}

namespace {

struct TpuAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t n) override {
    c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(current_device()));
    TORCH_CHECK(n == 0, "torchtpu: tpu tensors have no host-addressable storage; copy the tensor to cpu "
                        "(tensor.cpu()) to work with its memory");
    return c10::DataPtr(nullptr, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t count) const override {
    TORCH_CHECK(count == 0, "torchtpu: tpu storages cannot be copied byte-wise");
  }

  bool initialized() override { return runtime_initialized(); }
  // No pool of freed memory is kept (a buffer is released when no tensor uses it); waiting
  // for pending work frees the buffers that only that work still held.
  void emptyCache(c10::MempoolId_t) override { Engine::get().sync(true); }
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // XLA frees after the work that uses it
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    MemoryStats s = memory_stats(device);
    c10::CachingDeviceAllocator::DeviceStats out;
    auto set = [](c10::CachingAllocator::StatArray& stat, int64_t current, int64_t peak) {
      auto& all = stat[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      all.current = current;
      all.peak = peak;
    };
    set(out.allocated_bytes, s.allocated, s.allocated_peak);
    set(out.active_bytes, s.allocated, s.allocated_peak);
    set(out.requested_bytes, s.allocated, s.allocated_peak);
    set(out.reserved_bytes, s.reserved, s.reserved_peak);
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}  // nothing accumulates
  void resetPeakStats(c10::DeviceIndex device) override {
    check_device_index(device);
    reset_device_bytes_peak(device);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    auto [free, total] = memory_info(device);
    return {static_cast<size_t>(free), static_cast<size_t>(total)};
  }
};

TpuAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

}  // namespace
}  // namespace torchtpu
