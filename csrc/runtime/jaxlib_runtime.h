// Creates the jaxlib-backed Runtime (the one the extension module uses), joins a
// multi-process job's distributed runtime, and shares its buffers with JAX (they are
// jax.Arrays already).
#pragma once

#include <stdexcept>
#include <string>

#include "base/buffer.h"
#include "runtime/runtime.h"

struct _object;  // PyObject, without Python's headers

namespace torchtpu {

// Records the settings and makes runtime() start jaxlib's client at the first tpu use, so
// that a multi-process job can join jax's distributed runtime first. Chooses the platform
// then ("" = best present: tpu, else cuda, else cpu).
void configure_runtime(const std::string& requested_platform, int cpu_device_count, ProcessLayout layout);

// Joining a multi-process job (jax's distributed runtime); must precede the runtime's start.
struct DistributedOptions {
  std::string coordinator_address;  // host:port; process 0 serves it
  int num_processes = 1;
  int process_id = 0;
  int initialization_timeout_s = 300;  // also the timeout of every CPU collective
  int heartbeat_timeout_s = 100;
};
// Thrown by join_distributed when the runtime already started (tpu was used first).
struct RuntimeAlreadyStarted : std::logic_error {
  using std::logic_error::logic_error;
};
void join_distributed(const DistributedOptions& options);
bool distributed_joined();

// JAX interop (torchtpu.to_jax / from_jax), zero copy; both take the GIL themselves. The
// jaxlib runtime's buffers are jax.Arrays; another runtime's (PJRT on CPU) are shared with
// jax through their host memory (Runtime::share / view_of).
// The jax.Array holding `buffer` (a new reference).
_object* jax_array_of(const BufferPtr& buffer);
// A buffer holding `array` (a single-device jax.Array on one of the runtime's devices);
// throws std::invalid_argument for any other object, naming what is wrong.
BufferPtr buffer_of_jax_array(_object* array);

}  // namespace torchtpu
