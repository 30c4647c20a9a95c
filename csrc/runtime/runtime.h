// The Runtime interface: compile StableHLO, run executables, move buffers (no torch or
// Python headers). Every jaxlib call lives behind it, in jaxlib_runtime.cpp.
#pragma once

#include <exception>
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

// Ctrl-C: a KeyboardInterrupt raised in Python code that C++ called (jaxlib, a Python meta
// kernel, a hook) travels up as the Python exception it is, untouched, and Python sees it
// again at the boundary. Code that catches std::exception to recover (fall back, retry,
// warn) calls rethrow_if_interrupt() first in its handler, so that Ctrl-C is never
// swallowed or reworded. Which exceptions are interrupts is known only where Python is:
// the extension module installs the test (without it nothing is an interrupt).
using InterruptTest = bool (*)(const std::exception_ptr&);
void set_interrupt_test(InterruptTest test);
bool is_interrupt(const std::exception_ptr& error);
// Inside a catch block: rethrows the exception being handled when it is an interrupt.
void rethrow_if_interrupt();

// How a module is compiled: which device its executable runs on.
struct CompileOptions {
  int device = 0;
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
  virtual std::string serialize(Executable& exe) = 0;
  virtual ExecutablePtr deserialize(const std::string& bytes, const CompileOptions& options) = 0;
};

// The process's runtime, installed once (init_runtime in jaxlib_runtime.h; a C++ test
// installs its own) and never destroyed: its buffers may outlive static teardown.
void install_runtime(Runtime* runtime);
bool runtime_initialized();
Runtime& runtime();

}  // namespace torchtpu
