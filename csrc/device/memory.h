// Device memory in torch.cuda's terms, for torch.tpu and torch.accelerator: torchtpu's own
// count of live buffer bytes ("allocated") and the platform allocator's numbers ("reserved").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace torchtpu {

struct MemoryStats {
  int64_t allocated = 0, allocated_peak = 0;  // bytes of live tpu buffers
  int64_t reserved = 0, reserved_peak = 0;    // what the platform's allocator holds (>= allocated)
  std::map<std::string, int64_t> platform;    // PJRT's own numbers, by its names
};

MemoryStats memory_stats(int device);
// (free, total) bytes of device memory; the host's memory on the CPU platform.
std::pair<int64_t, int64_t> memory_info(int device);

}  // namespace torchtpu
