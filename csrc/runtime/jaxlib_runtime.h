// Creates the jaxlib-backed Runtime (the one the extension module uses).
#pragma once

#include <string>

namespace torchtpu {

// Chooses the platform ("" = best present: tpu, else cuda, else cpu) and installs the
// runtime once; later calls do nothing.
void init_runtime(const std::string& requested_platform, int cpu_device_count);

}  // namespace torchtpu
