// What torchtpu tells a PJRT plugin: the options its client is created with (per platform)
// and the serialized CompileOptionsProto of each compile. Pure functions, tested without a
// device (tests/test_pjrt_runtime.py reads them through torchtpu._C).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "runtime/runtime.h"

namespace torchtpu {

// How this process uses its platform; read from the settings (torchtpu/_settings.py).
struct PjrtClientSettings {
  std::string platform;  // "cpu" | "cuda" | "tpu"
  int cpu_device_count = 1;
  ProcessLayout layout;  // torchrun: this process drives device local_rank only
  // GPU memory: preallocating would take most of the GPU from JAX or PyTorch in the same
  // process, so torchtpu's client allocates on demand unless asked otherwise.
  bool gpu_preallocate = false;
  double gpu_memory_fraction = 0;  // 0: the plugin's default
  // Multi-process (torchrun on cuda/tpu): this process's node id and the job's process count.
  int node_id = 0;
  int num_nodes = 1;
};

// One PJRT_NamedValue, owned.
struct PjrtOption {
  std::string name;
  std::variant<std::string, int64_t, std::vector<int64_t>, float, bool> value;
  std::string describe() const;  // "name=value", for tests and error messages
};

// The create options for the platform's client. CPU: the device count; CUDA: allocation
// (preallocate, memory_fraction), the visible device under torchrun, and node_id/num_nodes
// for a multi-process job; TPU: none.
std::vector<PjrtOption> pjrt_client_options(const PjrtClientSettings& settings);

// An xla.CompileOptionsProto (xla/pjrt/proto/compile_options.proto), serialized by hand:
// executable_build_options with the replica count, one partition and the device assignment
// (one computation, `device_ids` = global device id per replica), the excess-precision
// override, kFixedXlaOptions (runtime.h) and, with `no_ynn_fusions` (runtime.h ynn_fusions_off),
// xla_cpu_experimental_ynn_fusion_type "". An empty proto is not an option: XLA aborts the
// process on replica_count 0.
std::string pjrt_compile_options(const std::vector<int64_t>& device_ids, bool excess_precision,
                                 bool no_ynn_fusions = false);

}  // namespace torchtpu
