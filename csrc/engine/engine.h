// The engine: records aten ops as graph nodes, decides when to compile and run them
// (debug / strict / fused), and caches compiled executables in memory and on disk.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/buckets.h"
#include "engine/checks.h"
#include "engine/disk_cache.h"
#include "ir/graph.h"
#include "runtime/runtime.h"

namespace torchtpu {

enum class Mode { Debug, Strict, Fused };
const char* mode_name(Mode mode);
Mode parse_mode(const std::string& name);  // throws std::invalid_argument

// Why pending work runs now (profiler events carry it): a value was read (copy to host,
// .item(), an op in strict mode on a pending operand), the end of an optimizer step, the
// pending graph reached its size limit, torchtpu.sync() / synchronize, a mode change, or
// torch.compile starting or ending a captured graph.
enum class FlushReason { Observation, OptimizerStep, SizeLimit, Sync, ModeChange, TorchCompile };
const char* flush_reason_name(FlushReason reason);
FlushReason parse_flush_reason(const std::string& name);  // throws std::invalid_argument

struct Recompilation {
  std::string origin;  // user's Python line that started the graph
  std::string reason;  // what differs from the graph compiled before at that line
};

struct Metrics {
  std::atomic<int64_t> ops_traced{0};
  std::atomic<int64_t> graphs_compiled{0};
  std::atomic<int64_t> cache_hits_memory{0};
  std::atomic<int64_t> cache_hits_disk{0};
  std::atomic<int64_t> execute_count{0};
  std::atomic<int64_t> bytes_to_device{0};
  std::atomic<int64_t> bytes_to_host{0};
  std::atomic<int64_t> downloads{0};  // copies to the host: each waits for the device (a host sync)
  std::atomic<int64_t> recompilations{0};
  std::atomic<int64_t> donated_buffers{0};
  std::atomic<int64_t> executables_evicted{0};  // dropped from the memory cache (its size limit)
  double compile_seconds = 0.0;
  std::map<std::string, int64_t> fallback_ops;
  std::vector<Recompilation> recompilation_log;
};

// Hooks into the Python layer, installed by the extension module (unset in C++ tests).
struct Hooks {
  std::function<std::string()> python_origin;       // "file.py:12 in train_step"
  std::function<void(const std::string&)> warn;      // issues a Python warning
  // Runs `wait` (a blocking call) without holding the GIL if this thread holds it: the
  // thread that holds the engine may need the GIL to finish.
  std::function<void(const std::function<void()>& wait)> without_gil;
  // Runs a fused flush padded to a bucket of its sizes (engine/buckets.h); unset: exact sizes.
  BucketRunner run_bucketed;
};

class Engine {
 public:
  static Engine& get();

  Mode mode() const { return mode_.load(); }
  void set_mode(Mode mode);

  // Records an op on device tensors and returns its outputs: computed now in debug/strict
  // mode, pending (computed at the next flush) in fused mode.
  // `body` is the traced function of a structured op (torchtpu::scan).
  // Single-process SPMD: outputs live on the mesh of their operands (`mesh`, where given:
  // torchtpu::shard's); operands of one device on the mesh's first device are replicated onto
  // it, operands of two meshes raise std::invalid_argument.
  std::vector<ValuePtr> record(OpKind op, std::vector<Arg> args, std::vector<ValuePtr> operands,
                               std::vector<TensorType> outputs, int device,
                               std::shared_ptr<const Subgraph> body = nullptr, MeshPtr mesh = nullptr);
  ValuePtr from_buffer(BufferPtr buffer);
  // A value whose contents were dropped (a freed storage): reading it raises `error`, view
  // copies of it are dropped values too (Value::dropped).
  static ValuePtr dropped_value(const TensorType& type, int device, std::exception_ptr error);
  // Runs the pending work that computes a value (an observation point): it then has a
  // buffer, or only a padded one (value->padded) when a bucketed graph computed it.
  void compute(const ValuePtr& value);
  // The buffer of a value, running pending work first (an observation point).
  BufferPtr materialize(const ValuePtr& value);
  // Runs all pending work; with wait, also waits until the device has finished it (and
  // raises the first failed runtime check).
  void sync(bool wait, FlushReason reason = FlushReason::Sync);
  // Raises the first failed runtime check of finished graphs on `device` (a host wait, such
  // as a download, just ended).
  void raise_failed_checks(int device);
  int64_t pending_ops() const { return pending_ops_; }
  // The smallest live result of the last graph launched, or null: held by an event, it marks
  // that point of its device's work (XLA runs a device's graphs in the order issued).
  BufferPtr last_launch_marker();
  // A value that must pass a test on the host (the descriptors a collective gathered to
  // check that every rank issued the same one): `verify` gets its int64 contents and returns
  // "" or an error message. Checked when the host next waits for results (materialize,
  // sync(wait)); a failure raises there.
  void add_check(ValuePtr value, std::function<std::string(const std::vector<int64_t>&)> verify);

  Metrics& metrics() { return metrics_; }
  void reset_metrics();
  void record_fallback(const std::string& op);
  Hooks& hooks() { return hooks_; }

  void set_cache_dir(const std::string& dir);  // "" disables the disk cache
  const std::string& cache_dir() const { return disk_cache_.dir(); }
  // Entries of other kinds in the same private folder (torch.compile's cached AOTAutograd
  // results): the stored bytes for the full key text, or nothing (absent, damaged, another
  // key's: warned as executables are).
  std::optional<std::string> load_blob(const std::string& kind, const std::string& key_text);
  // False when there is no usable folder (none set, or refused), so nothing was stored.
  bool store_blob(const std::string& kind, const std::string& key_text, const std::string& payload);
  void remove_blob(const std::string& kind, const std::string& key_text);
  void set_dump_dir(const std::string& dir) { dump_dir_ = dir; }
  void set_max_pending_ops(int64_t n) { max_pending_ops_ = n; }
  // At most this many executables stay in the memory cache; the least recently used goes
  // first (TORCHTPU_EXECUTABLE_CACHE_SIZE). Each holds the compiler's JIT code and its
  // mappings: unbounded, a process that compiles thousands of distinct graphs runs out of
  // them (XLA CPU: ~1 MB and 24 mappings per small graph).
  void set_executable_cache_size(size_t n);
  size_t executable_cache_size() const { return memory_cache_capacity_; }
  // Tests: the next XLA compile is given a module that is not valid StableHLO, so the path of
  // a compile the runtime refuses can be exercised on demand.
  void corrupt_next_compile() { corrupt_next_compile_ = true; }
  // The share of a device's memory torchtpu may fill (torch.tpu.set_per_process_memory_fraction):
  // an op whose result, or a graph whose results and working space, would not fit raises
  // DeviceOutOfMemory before anything runs.
  void set_memory_fraction(int device, double fraction);
  int64_t memory_budget(int device);
  void clear_memory_cache();

  std::recursive_mutex& mutex() { return mutex_; }

  // Fused graphs seen at more than one size: what ran padded and what could not (buckets.cpp).
  std::vector<BucketSummary> bucket_summaries();

  struct Graph;  // defined in graph_plan.h
  // A compiled graph: its executable and the runtime checks it computes (their flags are
  // its last result).
  struct Compiled {
    ExecutablePtr executable;
    std::vector<CheckSpec> checks;
    int64_t memory_needed = 0;  // device memory a run allocates (Runtime::memory_needed)
  };
  using CompiledPtr = std::shared_ptr<const Compiled>;

  // ---- torch.compile capture support (used by device/capture.cpp; capture_export.cpp) --
  struct CaptureRun {
    ExecutablePtr executable;               // null when there was nothing to run
    std::vector<ValuePtr> params;           // executable parameters, in order
    std::vector<int> aliasing;              // per parameter: the result it was donated to, or -1
    std::vector<TensorType> result_types;   // the roots asked for first, then other live values
    std::vector<double> float_scalars;      // lifted scalars, as passed this time
    std::vector<int64_t> int_scalars;
    std::vector<int> random_seed_slots;     // per random node: int-scalar slot of its seed (offset follows)
    std::vector<CheckQueue::Entry> checks;  // its runtime checks (pass them to launch)
    uint64_t graph_hash = 0;
    // A partitioned executable (roots on a mesh): its mesh and each parameter's layout (pass
    // parameters through argument_for_mesh, scalar packs uploaded for the mesh).
    MeshPtr mesh;
    std::vector<std::string> param_shardings;
  };
  // Compiles (or finds in the caches) and runs the pending graph that computes `roots`
  // (and any other live pending value of their mesh) on `device`, donating no parameter but
  // those in `donations` (parameter value, root index). The executable's results are `roots`
  // first; roots must share one mesh (or none). The caller holds the engine lock.
  CaptureRun run_for_capture(const std::vector<ValuePtr>& roots, int device,
                             const std::vector<std::pair<const Value*, int>>& donations = {});
  // The scalar packs an executable takes after its parameters: floats in the platform's
  // float type (f64, or f32 where the platform has no f64), ints as i64.
  // A partitioned executable (`mesh`) takes them replicated over its mesh.
  BufferPtr upload_float_scalars(const std::vector<double>& values, int device, const MeshPtr& mesh = nullptr);
  BufferPtr upload_int_scalars(const std::vector<int64_t>& values, int device, const MeshPtr& mesh = nullptr);
  // Launches an executable on `args` (parameters, then the scalar packs it takes) and
  // counts it; sync(wait=true) waits for its results. graph_hash names it in traces. An
  // executable with runtime checks returns their flags last: `checks` says what they mean,
  // and they are queued, not returned.
  // A partitioned executable's arguments: a buffer of one device is replicated onto its mesh
  // (through the host).
  BufferPtr argument_for_mesh(const BufferPtr& buffer, const MeshPtr& mesh);
  std::vector<BufferPtr> launch(Executable& exe, const std::vector<BufferPtr>& args,
                                const std::vector<TensorType>& result_types, int device, uint64_t graph_hash,
                                const std::vector<CheckQueue::Entry>& checks = {});
  // ---- end of capture support ---------------------------------------------------------

  // ---- export (used by device/export.cpp) ------------------------------------------------
  struct ExportedModule {
    std::string text;                  // @main(weights..., constants..., inputs...) -> roots
    std::vector<ValuePtr> constants;   // other device values the graph reads, in argument order
  };
  // Lowers the pending graph that computes `roots` into a self-contained StableHLO module,
  // without compiling or running it: its arguments are `weights`, then any other device
  // value it reads (constants made while it was recorded), then `inputs`; scalar arguments
  // are constants; nothing is donated. A root may be a weight or input (returned as is).
  // Random ops are refused (std::invalid_argument): their seeds would be constants.
  // The caller holds the engine lock.
  ExportedModule lower_for_export(const std::vector<ValuePtr>& weights, const std::vector<ValuePtr>& inputs,
                                  const std::vector<ValuePtr>& roots, int device);

  // ---- tracing a body for a structured op (torchtpu.scan_layers; scan_bodies.cpp) -------
  // Between begin_body and end_body, recorded ops build a Subgraph in every mode: they
  // neither run nor join the pending graph. Reading such a value on the host is an error.
  void begin_body();
  // A placeholder input of the body being traced (inputs are numbered in creation order).
  ValuePtr body_input(const TensorType& type, int device);
  // The traced function from the placeholders to `outputs`; ends the trace.
  std::shared_ptr<const Subgraph> end_body(const std::vector<ValuePtr>& outputs);
  void abort_body();
  bool in_body() const { return in_body_; }

 private:
  // The steps of running a graph (run_graph), in order.
  void plan_donation(Graph& graph);
  bool carried_unheld(const Value& param) const;
  void lift_scalars(Graph& graph);  // arguments.cpp
  void hash_graph(Graph& graph);    // graph_plan.cpp
  CompiledPtr find_or_compile(Graph& graph);
  void run_graph(Graph& graph);
  // The steps of compiling one (find_or_compile on a memory-cache miss; compile.cpp).
  CompiledPtr compile_graph(Graph& graph);
  std::string lower_graph(const Graph& graph, std::vector<std::string>* signature, std::vector<CheckSpec>* checks);
  void dump_module(const Graph& graph, const std::string& text);
  // Fills `compiled`'s executable and memory_needed from the disk cache; false on a miss.
  bool load_from_disk(Graph& graph, const CacheKey& key, Compiled* compiled);
  std::vector<BufferPtr> launch_graph(Executable& exe, const std::vector<BufferPtr>& args,
                                      const std::vector<TensorType>& result_types, const Graph& g);
  void note_recompilation(const Graph& graph, std::vector<std::string> signature);
  DType scalar_float_dtype();

  void flush_locked(int device, FlushReason reason);
  void run_checks_locked();  // host_checks.cpp
  // Collectives (collectives.cpp; fused mode): a pending graph holds collectives of one
  // replica set only, and a collective always runs, even when nothing holds its result (the
  // other ranks wait for it).
  void prepare_collective(const std::vector<int64_t>& replica_devices, int device);
  void take_pending_collectives(int device, std::vector<ValuePtr>& roots);

  // Shape buckets (buckets.cpp): a flush that only differs in sizes from an earlier one runs
  // padded; values computed padded are sliced when an exact graph or the user reads them.
  bool run_bucketed(Graph& graph);
  std::string run_padded(Graph& graph, BucketState::Structure& structure, const std::vector<int64_t>& sizes,
                         const std::vector<SizeSlot>& slots);
  void note_exact_graph(const Graph& graph, BucketState::Structure& structure, const std::string& reason,
                        bool sizes_differ);
  bool unpad_params(Graph& graph);
  void compute_unpadded(const ValuePtr& value);
  std::shared_ptr<BucketState> buckets_ = std::make_shared<BucketState>();
  int bucket_depth_ = 0;  // > 0 while a bucketed graph is being recorded
  // While a padded graph runs: its parameters that carry a padded-only value's buffer, and
  // that value. plan_donation donates such a buffer when nothing but pending nodes holds the
  // value (the cache a decode step grows), as it does a plain parameter's.
  std::vector<std::pair<const Value*, std::weak_ptr<Value>>> carried_owners_;
  // What recording learns about each node signature (Node::hash) the first time it meets it,
  // by lowering the node alone: whether it has runtime checks (its origin is then kept).
  // A node that cannot be lowered raises at once, at the user's line, and never joins a graph.
  struct NodeFacts {
    bool checked = false;
    bool compiled = false;       // part of a graph that compiled: it cannot make one fail
    std::exception_ptr failure;  // it failed to compile alone: recording it raises this
  };
  const NodeFacts& learn_node(Node& node, const std::vector<ValuePtr>& results);
  void check_fits(const Node& node);

  // A flush is a transaction: when running its graph fails, the pending graph is left as
  // it was (every pending value stays computable) and the error is explained (failures.cpp).
  enum class Stage { Lowering, Compiling, Running };
  std::exception_ptr explain_failure(Graph& graph, Stage stage, std::exception_ptr error);
  // The first node (in graph order) of `candidates` that fails to compile alone, or null.
  Node* first_failing_node(const std::vector<Node*>& candidates, int device, const MeshPtr& mesh, std::string* message);
  bool compiles_alone(const std::vector<Node*>& nodes, int device, const MeshPtr& mesh, std::string* message);
  // Roots that depend on a failed node become failed values (reading them raises its
  // error) and leave the graph; false when none did.
  bool drop_failed_roots(Graph& graph);
  bool some_node_failed_ = false;
  std::vector<int64_t> memory_limit_;
  std::vector<double> memory_fraction_;
  std::unordered_map<uint64_t, NodeFacts> node_facts_;
  CheckQueue checks_;

  bool in_body_ = false;
  uint64_t body_first_serial_ = 0;
  std::vector<ValuePtr> body_inputs_;

  std::atomic<Mode> mode_{Mode::Fused};
  std::recursive_mutex mutex_;
  std::vector<std::weak_ptr<Value>> pending_;
  std::map<int, std::vector<int64_t>> pending_replicas_;  // per device: replica set of its pending collectives
  std::map<std::vector<int64_t>, int64_t> collectives_run_;  // per replica set: collectives launched so far
  std::vector<ValuePtr> pending_collectives_;
  struct HostCheck {  // add_check's (collective descriptors); checks_ holds the graphs' own flags
    ValuePtr value;
    std::function<std::string(const std::vector<int64_t>&)> verify;
  };
  std::vector<HostCheck> host_checks_;
  int64_t pending_ops_ = 0;
  std::string pending_origin_;
  int64_t max_pending_ops_ = 10000;
  struct CachedExecutable {
    CompiledPtr compiled;
    std::list<uint64_t>::iterator recency;  // its place in memory_cache_recency_
  };
  std::unordered_map<uint64_t, CachedExecutable> memory_cache_;
  std::list<uint64_t> memory_cache_recency_;  // graph hashes, most recently used first
  size_t memory_cache_capacity_ = 1024;
  bool corrupt_next_compile_ = false;
  void evict_executables();
  std::map<std::string, std::vector<std::string>> last_signature_by_origin_;
  std::vector<std::weak_ptr<DeviceBuffer>> last_results_;  // weak: must not block donation
  DiskCache disk_cache_;
  std::string dump_dir_;
  Metrics metrics_;
  Hooks hooks_;
};

// Holds the engine lock; waits for it without holding the GIL (see engine.cpp).
class EngineLock {
 public:
  EngineLock();
  ~EngineLock();
 private:
  std::recursive_mutex& mutex_;
};

inline BufferPtr Engine::last_launch_marker() {
  EngineLock lock;
  BufferPtr smallest;
  for (const auto& weak : last_results_)
    if (BufferPtr b = weak.lock())
      if (!smallest || b->type.nbytes() < smallest->type.nbytes()) smallest = std::move(b);
  return smallest;
}

}  // namespace torchtpu
