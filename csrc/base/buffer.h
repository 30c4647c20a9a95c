// Device buffers and executables as every layer sees them: opaque handles the runtime
// creates, the graph IR holds and the engine passes back to the runtime.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "base/sharding.h"
#include "base/types.h"

namespace torchtpu {

// A buffer in device memory. Freed when the last owner lets go; the runtime subclasses it.
// A sharded buffer (single-process SPMD) holds one global value laid out over a mesh: its
// type is the global type, `device` the mesh's first device, and each device of the mesh
// holds (and is charged for) its shard.
struct DeviceBuffer {
  TensorType type;
  int device = 0;
  ShardingPtr sharding;  // null: the whole value on `device`
  // Also held outside torchtpu (a jax.Array from torchtpu.to_jax / from_jax): never donated,
  // since donating it would delete the other holder's array.
  std::atomic<bool> shared_outside{false};
  explicit DeviceBuffer(TensorType t, int d, ShardingPtr s = nullptr);
  virtual ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};
using BufferPtr = std::shared_ptr<DeviceBuffer>;

// A compiled graph, bound to its device(s); the runtime subclasses it.
struct Executable {
  virtual ~Executable() = default;
};
using ExecutablePtr = std::shared_ptr<Executable>;

// Bytes currently held in device buffers, per process and device (torch.tpu.memory_allocated).
int64_t device_bytes_in_use(int device);
int64_t device_bytes_peak(int device);
void reset_device_bytes_peak(int device);

}  // namespace torchtpu
