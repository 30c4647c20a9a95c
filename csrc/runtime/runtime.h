// The Runtime interface: compile StableHLO, run executables, move buffers (no torch or
// Python headers). Every jaxlib call lives behind it, in jaxlib_runtime.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/buffer.h"
#include "base/types.h"

struct DLManagedTensor;

namespace torchtpu {

// The device ran out of memory; the device layer raises torch.OutOfMemoryError.
struct DeviceOutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// How a module is compiled: which device its executable runs on. Every field that changes
// the executable belongs in describe(): the disk cache keys entries by it.
struct CompileOptions {
  int device = 0;
  std::string describe() const { return "device=" + std::to_string(device); }
};

class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual const std::string& platform() const = 0;
  virtual int device_count() const = 0;
  // Identifies the compiler for cache keys: "jaxlib 0.10.2 cpu <platform_version>".
  virtual const std::string& version() const = 0;
  // Whether the platform computes in float64 (TPUs do not): lifted float scalars travel
  // as f64 where it does, as f32 where it does not.
  virtual bool has_float64() const = 0;
  virtual ExecutablePtr compile(const std::string& module_text, const CompileOptions& options) = 0;
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
  // Whether the buffer's contents are computed (never waits).
  virtual bool is_ready(const DeviceBuffer& buffer) = 0;
  // Copies the buffer's contents (row-major, type.nbytes() bytes) to `out`, waiting for them.
  virtual void download_bytes(const DeviceBuffer& buffer, void* out) = 0;
  // Bytes of device memory the device can hold (its allocator's limit; the host's memory on
  // the CPU platform).
  virtual int64_t memory_limit(int device) = 0;
  // Device memory an execution of `exe` allocates beyond the arguments it reuses (donated
  // ones): its results and working space; 0 when the platform does not say.
  virtual int64_t memory_needed(Executable& exe) = 0;
  // Whether the buffer's memory is gone: donated to an execution (even one that then
  // failed) or deleted.
  virtual bool is_deleted(const DeviceBuffer& buffer) = 0;
  virtual std::string serialize(Executable& exe) = 0;
  virtual ExecutablePtr deserialize(const std::string& bytes, const CompileOptions& options) = 0;
  // The device's kind as the platform names it: "TPU v5 lite", "NVIDIA H200", "cpu".
  virtual std::string device_kind(int device) = 0;
  // The platform allocator's numbers for the device (bytes_in_use, bytes_limit, pool_bytes,
  // peak_bytes_in_use, ...); empty where it keeps none (the CPU client allocates each buffer
  // from the host heap).
  virtual std::map<std::string, int64_t> memory_stats(int device) = 0;
};

// The process's runtime, installed once (init_runtime in jaxlib_runtime.h; a C++ test
// installs its own) and never destroyed: its buffers may outlive static teardown.
void install_runtime(Runtime* runtime);
bool runtime_initialized();
// The installed runtime's device count (0 before install); answers in a forked child too.
int runtime_device_count();
// Raises (see check_not_forked) in a child forked after the runtime was installed.
Runtime& runtime();

// A child forked after install_runtime holds the parent's client without the threads that
// drive it: using it would hang, so the child is marked (pthread_atfork) and every use raises.
bool runtime_forked();
// Throws std::runtime_error with CUDA's wording in a forked child ("Cannot re-initialize").
void check_not_forked();

}  // namespace torchtpu
