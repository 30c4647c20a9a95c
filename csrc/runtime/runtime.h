// The Runtime interface: compile StableHLO, run executables, move buffers (no torch or
// Python headers). Two implementations: jaxlib's client through pybind11
// (jaxlib_runtime.cpp) and a PJRT C-API plugin called directly (pjrt_runtime.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <functional>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
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

// How a module is compiled: which device its executable runs on, and for a module with
// collectives the global device ids of its replicas in replica order (a process group's
// devices in group-rank order; empty: a single-device module). Every field that changes the
// executable belongs in describe(): the disk cache keys entries by it.
struct CompileOptions {
  int device = 0;
  std::vector<int64_t> replica_devices;
  // Whether XLA may keep a fused chain's float16/bfloat16 intermediates unrounded (XLA's
  // xla_allow_excess_precision). Off: each op's result is rounded, as in eager PyTorch.
  bool excess_precision = false;
  // Single-process SPMD: the mesh a partitioned module runs on, one replica and one partition
  // per mesh device (partition p on tpu:mesh->devices[p]). XLA's SPMD partitioner reads the
  // arguments' `mhlo.sharding` attributes from the module text, inserts the collectives and
  // chooses the shardings of results that have none. Null: a module of one device.
  MeshPtr mesh;
  // Of a partitioned module, per result: whether its mhlo.sharding in the module must be kept
  // (a result aliasing a donated argument, a sharding the user asked for) rather than
  // replaced by the one propagation chooses. Decided by the module text, so not in describe().
  std::vector<bool> fixed_result_layouts;
  std::string describe() const {
    std::string out = "device=" + std::to_string(device) + " excess_precision=" + (excess_precision ? "1" : "0");
    if (!replica_devices.empty()) {
      out += " replicas=";
      for (int64_t id : replica_devices) out += std::to_string(id) + ",";
    }
    if (mesh) {
      out += " partitions=";
      for (int d : mesh->devices) out += std::to_string(d) + ",";
    }
    return out;
  }
};

// XLA debug options every compile sets, whatever the runtime or platform: PyTorch's max/min
// (and the reductions, cumulative ops and clamps built on them) propagate NaN, XLA's "fast"
// ones do not; the CPU plugin built from jaxlib 0.11.2's XLA has them on by default (measured:
// maximum(1e30, nan) gave 1e30).
inline constexpr std::pair<const char*, bool> kFixedXlaOptions[] = {
    {"xla_cpu_enable_fast_min_max", false},
    {"xla_gpu_enable_fast_min_max", false},
};

// XLA:CPU hands reductions and dots, with the elementwise ops next to them, to YNNPACK (a
// "__ynn_fusion"), which keeps float16/bfloat16 intermediates unrounded whatever
// xla_allow_excess_precision says (jaxlib 0.10): bfloat16 (x * y).mean(-1) summed the
// unrounded products, and LIBRARY_FUSION_TYPE_DOT fused (x @ y) * 0.1 without rounding the
// product. Whether a compile must turn them off (xla_cpu_experimental_ynn_fusion_type set to
// an empty list): only for modules with such values, float32 modules keep them (without,
// bench/run.py's GPT and ResNet steps took 2-15% longer). Both runtimes ask this.
bool ynn_fusions_off(const std::string& platform, const std::string& module_text, bool excess_precision);
// Appended to a CPU runtime's version(), which keys the disk cache: executables compiled
// before ynn_fusions_off existed stay apart.
inline constexpr const char* kYnnVersionNote = " (no YNNPACK fusions for float16/bfloat16)";

// A multi-process job's device ids in process order, from (process index, device id) pairs
// as `source` (the client) lists them; each process must hold exactly one device.
std::vector<int64_t> one_device_per_process(std::vector<std::pair<int, int64_t>> by_process, const char* source);

class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual const std::string& platform() const = 0;
  // Device indices are node-local (tpu:N). In a torchrun job every index of the node is
  // counted but this process can use only its own (see ProcessLayout).
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
  // and must copy the data before releasing it. Single-device buffers only (a sharded one is
  // read through shards_of).
  virtual DLManagedTensor* download(const DeviceBuffer& buffer) = 0;
  virtual void wait(const DeviceBuffer& buffer) = 0;
  // Whether the buffer's contents are computed (never waits).
  virtual bool is_ready(const DeviceBuffer& buffer) = 0;
  // Copies the buffer's contents (row-major, type.nbytes() bytes) to `out`, waiting for them.
  // Also of a buffer replicated over a mesh (one copy is read): a partitioned executable's
  // runtime-check flags.
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

  // ---- zero-copy sharing with another framework in this process (JAX interop) ----------
  // Runtimes whose buffers are host memory (the CPU platform) implement these; the jaxlib
  // runtime's buffers are jax.Arrays already and need neither.
  // A DLPack tensor over the buffer's memory, holding the buffer until its deleter runs.
  virtual DLManagedTensor* share(const BufferPtr& buffer) {
    throw std::logic_error("torchtpu: this runtime cannot share its buffers");
  }
  // A buffer over memory another framework owns (`data`, row-major `type`); `release` runs
  // once the runtime no longer uses the memory, on whichever thread drops it.
  virtual BufferPtr view_of(void* data, const TensorType& type, int device, std::function<void()> release) {
    throw std::logic_error("torchtpu: this runtime cannot view foreign buffers");
  }

  // ---- single-process SPMD (one partitioned executable over a mesh of local devices) -----
  // An executable compiled with CompileOptions::mesh takes sharded buffers in execute() (each
  // laid out as its argument's mhlo.sharding says: a replicated argument is a buffer
  // replicated over the mesh), and returns sharded buffers whose `sharding` is the one the
  // compiler chose for each result (mesh: the compile's). `device` is the mesh's first device.
  //
  // A sharded buffer of the global type made of one single-device buffer per partition:
  // shards[p] is on tpu:sharding->mesh->devices[p] and has the type of that partition's
  // shard (sharding->shard_shape). The result may share the shards' memory.
  virtual BufferPtr assemble_sharded(const TensorType& global, ShardingPtr sharding,
                                     const std::vector<BufferPtr>& shards) {
    throw std::logic_error("torchtpu: runtime " + version() + " cannot hold tensors sharded over several devices");
  }
  // The single-device buffers of a sharded buffer, one per partition in mesh order (a
  // replicated shard appears once per device holding it). They may share the buffer's memory.
  virtual std::vector<BufferPtr> shards_of(const DeviceBuffer& buffer) {
    throw std::logic_error("torchtpu: runtime " + version() + " cannot hold tensors sharded over several devices");
  }

  // ---- multi-process jobs (one device per process; torch.distributed) --------------------
  // The contents of a small int64 buffer (waits for it).
  virtual std::vector<int64_t> read_int64(const DeviceBuffer& buffer) {
    throw std::logic_error("torchtpu: this runtime cannot read buffers back");
  }
  virtual int process_index() const { return 0; }
  virtual int64_t device_id(int device) const { return device; }  // the global id of a local device
  // The global id of each process's device, indexed by process index (= global rank).
  virtual std::vector<int64_t> process_device_ids() const { return {device_id(0)}; }
  // After collectives #first..#last over these replicas failed (a peer died, stopped or
  // issued something else): which ranks are at fault, as far as the job can tell. May wait
  // a few seconds for the other ranks' reports. "" outside a multi-process job.
  virtual std::string describe_collective_failure(const std::vector<int64_t>& replica_devices, int64_t first,
                                                  int64_t last) {
    return "";
  }
};

// The process's runtime, installed once (jaxlib_runtime.h; a C++ test installs its own) and
// never destroyed: its buffers may outlive static teardown.
void install_runtime(Runtime* runtime);
// A runtime may instead start at its first use (runtime()): `starter` creates it, once.
// A multi-process job joins its distributed runtime before that.
void set_runtime_starter(std::function<Runtime*()> starter);
bool runtime_initialized();
// The installed runtime's device count (0 before it starts); answers in a forked child too.
int runtime_device_count();
Runtime& runtime();  // starts the runtime on first use

// One process per device (torchrun): the node has local_world_size devices, numbered
// tpu:0..local_world_size-1, and this process drives tpu:local_rank only.
struct ProcessLayout {
  int local_rank = 0;
  int local_world_size = 0;  // 0: not a multi-process job; every local device is usable
};
void set_process_layout(ProcessLayout layout);
const ProcessLayout& process_layout();
// Whether this process may use tpu:index (false for another process's device).
bool device_addressable(int index);
// The number of device indices, without starting the runtime when the settings tell (a
// torchrun layout, or `known` from set_device_count_before_start; -1: ask the runtime).
int configured_device_count();
void set_device_count_before_start(int known);

// A child forked after install_runtime holds the parent's client without the threads that
// drive it: using it would hang, so the child is marked (pthread_atfork) and every use raises.
bool runtime_forked();
// Throws std::runtime_error with CUDA's wording in a forked child ("Cannot re-initialize").
void check_not_forked();

}  // namespace torchtpu
