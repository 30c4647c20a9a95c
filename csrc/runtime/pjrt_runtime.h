// The Runtime on a PJRT C-API plugin (XLA's CPU plugin, jax's CUDA plugin, libtpu), called
// directly: no Python and no GIL anywhere on its paths (pjrt_runtime.cpp).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/pjrt_options.h"
#include "runtime/runtime.h"

namespace torchtpu {

// A plugin that may serve a platform: its file and the command that installs it.
struct PjrtPluginChoice {
  std::string platform;  // "cpu" | "cuda" | "tpu"
  std::string path;      // the plugin's shared library
  std::string fix;       // e.g. "pip install 'lammps-jax-pjrt-cpu==0.11.2'"
};

struct PjrtRuntimeSettings {
  // Tried in order at the first tpu use: the first plugin whose client starts serves the
  // process. With one candidate (a requested platform) its failure is the error.
  std::vector<PjrtPluginChoice> candidates;
  PjrtClientSettings client;  // platform is set from the candidate
  // A multi-process job's key-value store (the c10d store of torchrun), for plugins that
  // exchange ids through it (NCCL's on CUDA). get waits up to timeout_ms for the key and
  // throws when it does not appear.
  std::function<std::string(const std::string& key, int timeout_ms)> kv_get;
  std::function<void(const std::string& key, const std::string& value)> kv_put;
};

// Makes runtime() start a PJRT runtime with these settings at its first use.
void configure_pjrt_runtime(PjrtRuntimeSettings settings);
// Sets the job's key-value store and node id/count before the runtime starts (torch.distributed
// on cuda/tpu under the PJRT runtime); false when the runtime already started.
bool set_pjrt_distributed(int node_id, int num_nodes,
                          std::function<std::string(const std::string&, int)> kv_get,
                          std::function<void(const std::string&, const std::string&)> kv_put);
// Whether the process's runtime (started or configured) is the PJRT one.
bool pjrt_runtime_selected();

// What `python -m torchtpu` reports: plugin path, its PJRT API version, platform, the
// plugin's attributes (xla_version, stablehlo_current_version). Starts the runtime.
std::map<std::string, std::string> pjrt_runtime_info();

// Registers an XLA FFI custom-call handler (jaxlib's LAPACK handlers, for the linear
// algebra JAX lowers) with the running plugin, under `platform_name` ("Host" on CPU).
void register_pjrt_ffi_handler(const std::string& target, void* handler, const std::string& platform_name);

}  // namespace torchtpu
