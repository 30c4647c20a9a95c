// Creates the jaxlib-backed Runtime (the one the extension module uses), and shares its
// buffers with JAX (they are jax.Arrays already).
#pragma once

#include <string>

#include "base/buffer.h"

struct _object;  // PyObject, without Python's headers

namespace torchtpu {

// Chooses the platform ("" = best present: tpu, else cuda, else cpu) and installs the
// runtime once; later calls do nothing.
void init_runtime(const std::string& requested_platform, int cpu_device_count);

// JAX interop (torchtpu.to_jax / from_jax), zero copy; both take the GIL themselves.
// The jax.Array holding `buffer` (a new reference).
_object* jax_array_of(const DeviceBuffer& buffer);
// A buffer holding `array` (a single-device jax.Array on one of the runtime's devices);
// throws std::invalid_argument for any other object, naming what is wrong.
BufferPtr buffer_of_jax_array(_object* array);

}  // namespace torchtpu
