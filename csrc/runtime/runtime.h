// The Runtime interface: compile StableHLO, run executables, move buffers (no torch headers).
// Every jaxlib call lives behind this interface, in jaxlib_runtime.cpp.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/types.h"

struct DLManagedTensor;

namespace torchtpu {

// A buffer in device memory. Freed when the last owner lets go.
struct DeviceBuffer {
  TensorType type;
  int device = 0;
  explicit DeviceBuffer(TensorType t, int d);
  virtual ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};
using BufferPtr = std::shared_ptr<DeviceBuffer>;

struct Executable {
  virtual ~Executable() = default;
};
using ExecutablePtr = std::shared_ptr<Executable>;

// The device ran out of memory; the device layer raises torch.OutOfMemoryError.
struct DeviceOutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bytes currently held in device buffers, per process (all devices).
int64_t device_bytes_in_use(int device);
int64_t device_bytes_peak(int device);
void reset_device_bytes_peak(int device);

class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual const std::string& platform() const = 0;
  virtual int device_count() const = 0;
  // Identifies the compiler for cache keys: "jaxlib 0.10.2 cpu <platform_version>".
  virtual const std::string& version() const = 0;
  virtual ExecutablePtr compile(const std::string& module_text, int device) = 0;
  // Runs asynchronously: returns buffers whose contents may still be computing.
  virtual std::vector<BufferPtr> execute(Executable& exe, const std::vector<BufferPtr>& args,
                                         const std::vector<TensorType>& result_types,
                                         int device) = 0;
  // Takes ownership of a host DLPack tensor (its memory must not change afterwards).
  virtual BufferPtr upload(DLManagedTensor* host, const TensorType& type, int device) = 0;
  // Copies raw host bytes to the device.
  virtual BufferPtr upload_bytes(const void* data, const TensorType& type, int device) = 0;
  // Returns host-readable memory for the buffer, waiting for it; the caller owns the result
  // and must copy the data before releasing it.
  virtual DLManagedTensor* download(const DeviceBuffer& buffer) = 0;
  virtual void wait(const DeviceBuffer& buffer) = 0;
  virtual std::string serialize(Executable& exe) = 0;
  virtual ExecutablePtr deserialize(const std::string& bytes, int device) = 0;
};

// Chooses the platform ("" = best present) and creates the runtime once.
void init_runtime(const std::string& requested_platform, int cpu_device_count);
bool runtime_initialized();
Runtime& runtime();

}  // namespace torchtpu
