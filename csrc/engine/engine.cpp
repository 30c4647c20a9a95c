// Engine: pending graph, flush policy, graph building, executable caches, metrics.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include "engine/disk_cache.h"
#include "engine/trace.h"
#include "engine/graph_plan.h"
#include "lowering/registry.h"
#include "lowering/sharding.h"
#include "stablehlo/builder.h"
#include "stablehlo/module.h"

namespace torchtpu {

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::Debug: return "debug";
    case Mode::Strict: return "strict";
    case Mode::Fused: return "fused";
  }
  return "?";
}

Mode parse_mode(const std::string& name) {
  if (name == "debug") return Mode::Debug;
  if (name == "strict") return Mode::Strict;
  if (name == "fused") return Mode::Fused;
  throw std::invalid_argument("torchtpu: unknown mode '" + name + "'; choose debug, strict or fused");
}

const char* flush_reason_name(FlushReason reason) {
  switch (reason) {
    case FlushReason::Observation: return "observation";
    case FlushReason::OptimizerStep: return "optimizer_step";
    case FlushReason::SizeLimit: return "size_limit";
    case FlushReason::Sync: return "sync";
    case FlushReason::ModeChange: return "mode_change";
    case FlushReason::TorchCompile: return "torch_compile";
  }
  return "?";
}

FlushReason parse_flush_reason(const std::string& name) {
  for (FlushReason r : {FlushReason::Observation, FlushReason::OptimizerStep, FlushReason::SizeLimit, FlushReason::Sync,
                        FlushReason::ModeChange, FlushReason::TorchCompile})
    if (name == flush_reason_name(r)) return r;
  throw std::invalid_argument("torchtpu: unknown flush reason '" + name + "'");
}

// A forked child raises before it waits on a lock some parent thread may have held at fork().
EngineLock::EngineLock() : mutex_((check_not_forked(), Engine::get().mutex())) {
  if (mutex_.try_lock()) return;
  // Another thread holds the engine and may need the GIL to finish: wait without it.
  const auto& without_gil = Engine::get().hooks().without_gil;
  if (without_gil) without_gil([this] { mutex_.lock(); });
  else mutex_.lock();
}

EngineLock::~EngineLock() { mutex_.unlock(); }

Engine& Engine::get() {
  static Engine* engine = new Engine();  // never destroyed: buffers may outlive static teardown
  return *engine;
}

namespace {
// The event of finding a graph's executable: `cache` is where it came from (memory, disk)
// or "compiled" (XLA compiled it); the span's duration is the time that took.
TraceEvent compile_event(Engine::Graph& g, const char* cache, const Hooks& hooks) {
  if (g.origin.empty() && hooks.python_origin) g.origin = hooks.python_origin();
  return TraceEvent{std::string("torchtpu::compile#") + cache,
                    {{"cache", cache},
                     {"graph", graph_name(g.hash)},
                     {"origin", g.origin},
                     {"ops", static_cast<int64_t>(g.nodes.size())},
                     {"device", static_cast<int64_t>(g.device)}}};
}

TraceEvent upload_event(const char* what, int64_t bytes, int device) {
  return TraceEvent{"torchtpu::transfer#to_device",
                    {{"direction", "to_device"}, {"what", what}, {"bytes", bytes}, {"device", static_cast<int64_t>(device)}}};
}

std::string format_bytes(int64_t bytes) {
  char buf[32];
  double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof(buf), "%.2f MiB", b / (1024.0 * 1024));
  else std::snprintf(buf, sizeof(buf), "%lld bytes", static_cast<long long>(bytes));
  return buf;
}

// CUDA's out-of-memory message, for tpu: what did not fit, what the device holds, what to do.
std::string out_of_memory_message(int64_t bytes, const std::string& what, int device, int64_t budget) {
  return "torchtpu: tpu out of memory. Tried to allocate " + format_bytes(bytes) + " for " + what + ". tpu:" +
         std::to_string(device) + " can hold " + format_bytes(budget) + ", of which tensors hold " +
         format_bytes(device_bytes_in_use(device)) +
         ". Free tensors you no longer need (del them), lower the batch size, or call torchtpu.sync() more often "
         "so that fewer results are computed at once.";
}

bool is_collective(OpKind op);
std::vector<int64_t> replica_devices_of(const Engine::Graph& g);

// The layout in which a partitioned graph's parameter arrives: its buffer's sharding, or
// replicated (a buffer of one device is copied onto the mesh for the launch).
std::string argument_sharding(const Engine::Graph& g, size_t p) {
  const ValuePtr& param = g.params[p];
  return param->buffer && param->buffer->sharding ? param->buffer->sharding->hlo() : "{replicated}";
}

// Per root of a partitioned graph, the layout XLA must give it, or "" to let it choose: a
// donated parameter's result keeps the parameter's layout (XLA aliases only buffers of one
// shape per device, and parameters and optimizer state keep their sharding step after step);
// torchtpu::shard's result is the user's.
std::vector<std::string> fixed_result_layouts(const Engine::Graph& g) {
  std::vector<std::string> layouts(g.roots.size());
  for (size_t p = 0; p < g.params.size(); ++p)
    if (g.aliasing.size() > p && g.aliasing[p] >= 0) layouts[static_cast<size_t>(g.aliasing[p])] = argument_sharding(g, p);
  for (size_t r = 0; r < g.roots.size(); ++r) {
    const ValuePtr& root = g.roots[r];
    if (root->pending() && is_shard_node(*root->node)) layouts[r] = sharding_of_shard_node(*root->node).hlo();
  }
  return layouts;
}

// Which results of a partitioned graph's module keep the layout the module gives them
// (CompileOptions::fixed_result_layouts): the roots above, and the runtime-check flags.
std::vector<bool> fixed_results(const Engine::Graph& g, bool has_checks) {
  std::vector<bool> fixed;
  for (const std::string& layout : fixed_result_layouts(g)) fixed.push_back(!layout.empty());
  if (has_checks) fixed.push_back(true);
  return fixed;
}

}  // namespace

void Engine::set_mode(Mode mode) {
  EngineLock lock;
  if (mode != mode_.load()) {
    for (int d = 0; d < (runtime_initialized() ? runtime().device_count() : 0); ++d)
      flush_locked(d, FlushReason::ModeChange);
  }
  mode_.store(mode);
}

void Engine::set_memory_fraction(int device, double fraction) {
  EngineLock lock;
  if (device < 0 || device >= runtime().device_count())
    throw std::invalid_argument("torchtpu: no tpu:" + std::to_string(device));
  if (fraction < 0.0 || fraction > 1.0)
    throw std::invalid_argument("torchtpu: memory fraction " + std::to_string(fraction) + " is not in [0, 1]");
  if (memory_fraction_.size() <= static_cast<size_t>(device)) memory_fraction_.resize(device + 1, 1.0);
  memory_fraction_[device] = fraction;
}

int64_t Engine::memory_budget(int device) {
  EngineLock lock;
  if (memory_limit_.size() <= static_cast<size_t>(device)) memory_limit_.resize(device + 1, -1);
  if (memory_limit_[device] < 0) memory_limit_[device] = runtime().memory_limit(device);
  double fraction = static_cast<size_t>(device) < memory_fraction_.size() ? memory_fraction_[device] : 1.0;
  return static_cast<int64_t>(static_cast<double>(memory_limit_[device]) * fraction);
}

void Engine::set_cache_dir(const std::string& dir) {
  EngineLock lock;
  disk_cache_.set_dir(dir);
}

std::optional<std::string> Engine::load_blob(const std::string& kind, const std::string& key_text) {
  EngineLock lock;
  if (!disk_cache_.active()) return std::nullopt;
  return disk_cache_.load(make_blob_key(key_text, kind), hooks_.warn);
}

bool Engine::store_blob(const std::string& kind, const std::string& key_text, const std::string& payload) {
  EngineLock lock;
  if (disk_cache_.active()) disk_cache_.store(make_blob_key(key_text, kind), payload, hooks_.warn);
  return disk_cache_.active();  // the store itself may have found the folder refused
}

void Engine::remove_blob(const std::string& kind, const std::string& key_text) {
  EngineLock lock;
  disk_cache_.remove(make_blob_key(key_text, kind));
}

void Engine::clear_memory_cache() {
  EngineLock lock;
  memory_cache_.clear();
  last_signature_by_origin_.clear();
  buckets_ = std::make_shared<BucketState>();
}

void Engine::reset_metrics() {
  EngineLock lock;
  metrics_.ops_traced = 0;
  metrics_.graphs_compiled = 0;
  metrics_.cache_hits_memory = 0;
  metrics_.cache_hits_disk = 0;
  metrics_.execute_count = 0;
  metrics_.bytes_to_device = 0;
  metrics_.bytes_to_host = 0;
  metrics_.downloads = 0;
  metrics_.recompilations = 0;
  metrics_.donated_buffers = 0;
  metrics_.compile_seconds = 0;
  metrics_.fallback_ops.clear();
  metrics_.recompilation_log.clear();
  reset_bucket_counts(*buckets_);
}

void Engine::record_fallback(const std::string& op) {
  EngineLock lock;
  metrics_.fallback_ops[op] += 1;
}

ValuePtr Engine::from_buffer(BufferPtr buffer) {
  auto value = std::make_shared<Value>();
  value->type = buffer->type;
  value->device = buffer->device;
  if (buffer->sharding) value->mesh = buffer->sharding->mesh;
  value->buffer = std::move(buffer);
  return value;
}

namespace {

// The view_copy ops functionalization computes views with (ATen's view ops with "_copy"
// appended) that have lowerings.
bool is_view_copy(const OpKind& op) {
  static const std::unordered_set<std::string> names = {
      "aten::_conj_copy", "aten::_neg_view_copy", "aten::view_as_real_copy", "aten::view_as_complex_copy",
      "aten::alias_copy", "aten::detach_copy", "aten::view_copy", "aten::_reshape_alias_copy",
      "aten::unsqueeze_copy", "aten::squeeze_copy", "aten::squeeze_copy.dim", "aten::squeeze_copy.dims",
      "aten::expand_copy", "aten::permute_copy", "aten::transpose_copy.int", "aten::t_copy",
      "aten::slice_copy.Tensor", "aten::select_copy.int", "aten::as_strided_copy", "aten::diagonal_copy",
      "aten::unfold_copy", "aten::split_copy.Tensor", "aten::split_with_sizes_copy", "aten::unbind_copy.int",
      "aten::narrow_copy"};
  return names.count(op.name()) > 0;
}

std::vector<ValuePtr> dropped_results(const std::vector<TensorType>& outputs, int device,
                                      const std::exception_ptr& error) {
  std::vector<ValuePtr> results;
  for (const TensorType& type : outputs) results.push_back(Engine::dropped_value(type, device, error));
  return results;
}

}  // namespace

ValuePtr Engine::dropped_value(const TensorType& type, int device, std::exception_ptr error) {
  auto value = std::make_shared<Value>();
  value->type = type;
  value->device = device;
  value->error = std::move(error);
  value->dropped = true;
  return value;
}

std::vector<ValuePtr> Engine::record(OpKind op, std::vector<Arg> args, std::vector<ValuePtr> operands,
                                     std::vector<TensorType> outputs, int device,
                                     std::shared_ptr<const Subgraph> body, MeshPtr mesh) {
  EngineLock lock;
  metrics_.ops_traced++;
  Mode mode = mode_.load();
  bool collective = is_collective(op);
  if (collective && mode == Mode::Fused) prepare_collective(args.back().ints, device);
  if (mode != Mode::Fused && !in_body_) {
    for (const ValuePtr& v : operands)
      if (v->pending()) flush_locked(v->device, FlushReason::Observation);
  }
  // A value that can never be computed stays so: an op reading it raises its error.
  for (const ValuePtr& v : operands) {
    if (!v->error) continue;
    if (v->dropped && is_view_copy(op)) return dropped_results(outputs, device, v->error);
    std::rethrow_exception(v->error);
  }
  for (const ValuePtr& v : operands) {
    if (!v->mesh) continue;
    if (!mesh) mesh = v->mesh;
    else if (!mesh->same_devices(*v->mesh))
      throw std::invalid_argument("torchtpu: " + op.name() + " got tensors of two meshes, " + mesh->describe() +
                                  " and " + v->mesh->describe() +
                                  "; reshard one onto the other's mesh first (torchtpu.spmd.shard)");
  }
  auto node = std::make_shared<Node>();
  node->op = op;
  node->args = std::move(args);
  node->outputs = std::move(outputs);
  node->device = device;
  node->body = std::move(body);
  node->mesh = mesh;
  node->operands = std::move(operands);
  for (const ValuePtr& v : node->operands) {
    if (v->device != device)
      throw std::invalid_argument("torchtpu: " + op.name() + " got tensors on tpu:" + std::to_string(v->device) +
                                  " and tpu:" + std::to_string(device) +
                                  "; move them to one device first (tensor.to(\"tpu:N\"))");
    v->node_uses.fetch_add(1);
  }
  node->hash = hash_node(*node);
  std::vector<ValuePtr> results;
  results.reserve(node->outputs.size());
  for (size_t i = 0; i < node->outputs.size(); ++i) {
    auto value = std::make_shared<Value>();
    value->type = node->outputs[i];
    value->device = device;
    value->mesh = mesh;
    value->node = node;
    value->output_index = static_cast<int>(i);
    results.push_back(std::move(value));
  }
  if (in_body_) return results;  // part of the body being traced; end_body collects it
  check_fits(*node);
  learn_node(*node, results);
  if (mode == Mode::Fused) {
    if (pending_ops_ == 0 && hooks_.python_origin) pending_origin_ = hooks_.python_origin();
    for (const ValuePtr& v : results) pending_.push_back(v);
    if (collective) pending_collectives_.insert(pending_collectives_.end(), results.begin(), results.end());
    if (++pending_ops_ >= max_pending_ops_) flush_locked(device, FlushReason::SizeLimit);
    return results;
  }
  Graph graph;
  graph.device = device;
  graph.mesh = mesh;
  graph.roots = results;
  collect_nodes(&graph, graph.roots);
  run_graph(graph);
  if (mode == Mode::Debug) {
    for (const ValuePtr& v : results) runtime().wait(*v->buffer);
    checks_.raise_failed(runtime(), device, /*wait=*/true);  // at the op itself
  }
  return results;
}

const Engine::NodeFacts& Engine::learn_node(Node& node, const std::vector<ValuePtr>& results) {
  auto known = node_facts_.find(node.hash);
  if (known != node_facts_.end()) {
    if (known->second.failure) std::rethrow_exception(known->second.failure);
    if (known->second.checked && hooks_.python_origin) node.origin = hooks_.python_origin();
    return known->second;
  }
  if (hooks_.python_origin) node.origin = hooks_.python_origin();
  // Lowered alone, its operands as parameters: a rule that throws raises here, at the op.
  Graph alone;
  alone.device = node.device;
  alone.nodes = {&node};
  alone.node_index[&node] = 0;
  for (const ValuePtr& v : node.operands) {
    if (alone.param_index.count(v.get())) continue;
    alone.param_index[v.get()] = static_cast<int>(alone.params.size());
    alone.params.push_back(v);
  }
  alone.aliasing.assign(alone.params.size(), -1);
  alone.roots = results;
  lift_scalars(alone);
  std::vector<std::string> signature;
  std::vector<CheckSpec> checks;
  lower_graph(alone, &signature, &checks);
  NodeFacts facts;
  facts.checked = !checks.empty();
  return node_facts_.emplace(node.hash, facts).first->second;
}

// An op's result that cannot fit on the device even alone raises at the op, as a CUDA
// allocation would (a fused graph would otherwise fail later, away from the user's line).
void Engine::check_fits(const Node& node) {
  int64_t budget = memory_budget(node.device);
  // On a mesh a result is spread over its devices: at best each holds an equal share.
  int64_t shares = node.mesh ? static_cast<int64_t>(node.mesh->devices.size()) : 1;
  for (const TensorType& t : node.outputs)
    if (t.nbytes() / shares > budget)
      throw DeviceOutOfMemory(out_of_memory_message(t.nbytes(), "a result of " + node.op.name() + " (" + t.str() + ")",
                                                    node.device, budget));
}

void Engine::compute(const ValuePtr& value) {
  EngineLock lock;
  if (value->pending()) flush_locked(value->device, FlushReason::Observation);
  if (value->error) std::rethrow_exception(value->error);
}

BufferPtr Engine::materialize(const ValuePtr& value) {
  EngineLock lock;
  compute(value);
  if (value->pending() && in_body_)
    throw std::invalid_argument(
        "torchtpu.scan_layers / StackedLayers: the layer reads a tensor on the host (.item(), printing, a "
        "data-dependent branch or an op without a tpu lowering); a scanned layer must stay on the device - run "
        "these layers in an ordinary loop instead");
  if (value->padded_only()) compute_unpadded(value);
  run_checks_locked();
  if (!value->buffer) throw std::logic_error("torchtpu: a tensor was not computed by its graph");
  return value->buffer;
}

void Engine::sync(bool wait, FlushReason reason) {
  EngineLock lock;
  if (!runtime_initialized()) return;
  for (int d = 0; d < runtime().device_count(); ++d) flush_locked(d, reason);
  if (wait) {
    TraceSpan span([&] { return TraceEvent{"torchtpu::wait", {{"reason", flush_reason_name(reason)}}}; });
    for (const auto& weak : last_results_)
      if (BufferPtr b = weak.lock()) runtime().wait(*b);
    last_results_.clear();
    checks_.raise_failed(runtime(), -1, /*wait=*/true);
  }
  run_checks_locked();
}

void Engine::add_check(ValuePtr value, std::function<std::string(const std::vector<int64_t>&)> verify) {
  EngineLock lock;
  host_checks_.push_back(HostCheck{std::move(value), std::move(verify)});
}

// Reads the computed check values (a few bytes each; not counted as transfers of user data).
void Engine::run_checks_locked() {
  if (host_checks_.empty()) return;
  std::vector<HostCheck> keep;
  std::string errors;
  for (HostCheck& check : host_checks_) {
    if (check.value->pending() || !check.value->buffer) {
      keep.push_back(std::move(check));
      continue;
    }
    std::string message = check.verify(runtime().read_int64(*check.value->buffer));
    if (!message.empty() && errors.empty()) errors = message;
  }
  host_checks_.swap(keep);
  if (!errors.empty()) throw std::runtime_error(errors);
}

void Engine::raise_failed_checks(int device) {
  EngineLock lock;
  if (runtime_initialized()) checks_.raise_failed(runtime(), device, /*wait=*/false);
}

void Engine::flush_locked(int device, FlushReason reason) {
  if (pending_.empty()) return;
  std::vector<ValuePtr> roots;
  std::vector<std::weak_ptr<Value>> keep;
  for (auto& weak : pending_) {
    ValuePtr v = weak.lock();
    if (!v || !v->pending()) continue;
    if (v->device != device) {
      keep.push_back(weak);
      continue;
    }
    // Held by something besides pending nodes (a tensor, autograd): the user can see it.
    if (v.use_count() - 1 > v->node_uses.load()) roots.push_back(v);
  }
  take_pending_collectives(device, roots);
  // Values of each mesh (single-process SPMD) are one partitioned executable, values of the
  // device alone another. Meshes go first: a value of one device they read while it is still
  // pending is computed inside them, not copied onto the mesh through the host.
  std::vector<Graph> graphs;
  for (ValuePtr& root : roots) {
    auto same = [&](const Graph& g) {
      return root->mesh ? g.mesh && g.mesh->same_devices(*root->mesh) : !g.mesh;
    };
    auto it = std::find_if(graphs.begin(), graphs.end(), same);
    if (it == graphs.end()) {
      graphs.emplace_back();
      it = graphs.end() - 1;
      it->device = device;
      it->mesh = root->mesh;
      it->origin = pending_origin_;
      it->bucketable = mode_.load() == Mode::Fused;
    }
    it->roots.push_back(std::move(root));
  }
  std::stable_partition(graphs.begin(), graphs.end(), [](const Graph& g) { return g.mesh != nullptr; });
  for (Graph& graph : graphs) {
    collect_nodes(&graph, graph.roots);
    if (some_node_failed_) drop_failed_roots(graph);
    // A transaction: if this throws, the pending graph is as it was.
    if (!graph.roots.empty()) {
      TraceSpan span([&] {
        const char* why = flush_reason_name(reason);
        return TraceEvent{std::string("torchtpu::flush#") + why,
                          {{"reason", why},
                           {"ops", static_cast<int64_t>(graph.nodes.size())},
                           {"outputs", static_cast<int64_t>(graph.roots.size())},
                           {"device", static_cast<int64_t>(device)},
                           {"origin", graph.origin}}};
      });
      run_graph(graph);
    }
  }
  pending_.swap(keep);
  if (pending_.empty()) pending_ops_ = 0;
}

bool Engine::drop_failed_roots(Graph& g) {
  std::unordered_map<const Node*, std::exception_ptr> failed;
  for (Node* node : g.nodes) {  // operands first
    std::exception_ptr error = node->error;
    for (size_t i = 0; i < node->operands.size() && !error; ++i) {
      const ValuePtr& v = node->operands[i];
      if (!v->pending()) {
        error = v->error;
      } else if (auto it = failed.find(v->node.get()); it != failed.end()) {
        error = it->second;
      }
    }
    if (error) failed.emplace(node, error);
  }
  if (failed.empty()) return false;
  Graph kept;
  kept.device = g.device;
  kept.mesh = g.mesh;
  kept.origin = g.origin;
  for (const ValuePtr& root : g.roots) {
    auto it = failed.find(root->node.get());
    if (it == failed.end()) {
      kept.roots.push_back(root);
    } else {
      root->error = it->second;
      root->node.reset();
    }
  }
  g = Graph();
  if (!kept.roots.empty()) collect_nodes(&kept, kept.roots);
  g = std::move(kept);
  return true;
}

void Engine::prepare_collective(const std::vector<int64_t>& replica_devices, int device) {
  auto it = pending_replicas_.find(device);
  if (it != pending_replicas_.end() && it->second != replica_devices) flush_locked(device, FlushReason::Sync);  // another process group's collectives
  pending_replicas_[device] = replica_devices;
}

void Engine::take_pending_collectives(int device, std::vector<ValuePtr>& roots) {
  pending_replicas_.erase(device);
  std::unordered_set<const Value*> present;
  for (const ValuePtr& r : roots) present.insert(r.get());
  std::vector<ValuePtr> keep;
  for (ValuePtr& v : pending_collectives_) {
    if (v->device != device) keep.push_back(std::move(v));
    else if (v->pending() && present.insert(v.get()).second) roots.push_back(std::move(v));
  }
  pending_collectives_.swap(keep);
}

namespace {

bool is_collective(OpKind op) {
  const LoweringRule* rule = find_lowering(op);
  return rule && rule->collective;
}

// The replica set of a graph's collectives (empty when it has none).
std::vector<int64_t> replica_devices_of(const Engine::Graph& g) {
  std::vector<int64_t> replicas;
  for (const Node* node : g.nodes) {
    if (!is_collective(node->op)) continue;
    const std::vector<int64_t>& mine = node->args.back().ints;
    if (!replicas.empty() && replicas != mine)
      throw std::logic_error("torchtpu: one graph holds collectives of two process groups");
    replicas = mine;
  }
  return replicas;
}

}  // namespace

void collect_nodes(Engine::Graph* g, const std::vector<ValuePtr>& roots) {
  std::vector<std::pair<Node*, size_t>> stack;
  std::unordered_set<const Node*> visiting;
  for (const ValuePtr& root : roots) {
    if (!root->pending()) {  // an exported graph may return an argument as is
      if (!g->param_index.count(root.get())) {
        g->param_index[root.get()] = static_cast<int>(g->params.size());
        g->params.push_back(root);
      }
      continue;
    }
    Node* start = root->node.get();
    if (g->node_index.count(start) || visiting.count(start)) continue;
    stack.emplace_back(start, 0);
    visiting.insert(start);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->operands.size()) {
        const ValuePtr& operand = node->operands[next++];
        if (operand->pending()) {
          Node* child = operand->node.get();
          if (!g->node_index.count(child) && !visiting.count(child)) {
            visiting.insert(child);
            stack.emplace_back(child, 0);
          }
        } else if (!g->param_index.count(operand.get())) {
          g->param_index[operand.get()] = static_cast<int>(g->params.size());
          g->params.push_back(operand);
        }
        continue;
      }
      g->node_index[node] = static_cast<int>(g->nodes.size());
      g->nodes.push_back(node);
      stack.pop_back();
    }
  }
}

// A graph with collectives that fails says which ranks are at fault.
std::vector<BufferPtr> Engine::launch_graph(Executable& exe, const std::vector<BufferPtr>& args,
                                            const std::vector<TensorType>& result_types, const Graph& g) {
  if (g.replica_devices.empty()) return launch(exe, args, result_types, g.device, g.hash, g.check_entries);
  int64_t collectives = 0;
  for (const Node* node : g.nodes) collectives += is_collective(node->op) ? 1 : 0;
  int64_t& done = collectives_run_[g.replica_devices];
  int64_t first = done + 1;
  done += collectives;
  try {
    return launch(exe, args, result_types, g.device, g.hash, g.check_entries);
  } catch (const DeviceOutOfMemory&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(e.what()) +
                             runtime().describe_collective_failure(g.replica_devices, first, done));
  }
}

// ---- running a graph: plan donation, lift scalars, hash, find or compile, launch -------

// A padded graph's parameter that carries the buffer of a value computed padded (buckets.cpp):
// donatable when that value is the buffer's only other holder and only pending nodes hold it.
bool Engine::carried_unheld(const Value& param) const {
  for (const auto& [carrier, owner] : carried_owners_) {
    if (carrier != &param) continue;
    ValuePtr value = owner.lock();
    return value && value->padded && value->padded->buffer == param.buffer && param.buffer.use_count() == 2 &&
           value.use_count() - 1 == value->node_uses.load();
  }
  return false;
}

// A parameter nothing else holds gives its buffer to a root of the same type (an optimizer
// step then updates parameters without copies).
void Engine::plan_donation(Graph& g) {
  g.aliasing.assign(g.params.size(), -1);
  std::vector<bool> root_taken(g.roots.size(), false);
  for (auto [value, root] : g.donate_to_root) {
    auto it = g.param_index.find(value);
    if (it == g.param_index.end() || root_taken[root] || !(g.roots[root]->type == value->type)) continue;
    if (g.mesh && !g.params[it->second]->buffer->sharding) continue;  // replicated for the launch: a copy
    root_taken[root] = true;
    g.aliasing[it->second] = root;
  }
  for (size_t p = 0; p < g.params.size(); ++p) {
    const ValuePtr& param = g.params[p];
    if (g.aliasing[p] >= 0) continue;
    bool unheld = param.use_count() - 1 == param->node_uses.load() && param->buffer &&
                  !param->buffer->shared_outside.load() &&
                  (param->buffer.use_count() == 1 || carried_unheld(*param));
    // On a mesh only a buffer laid out over it is passed as it is (one of a single device is
    // replicated onto the mesh for the launch: that copy is not the value's buffer).
    bool passed_as_is = unheld && (!g.mesh || param->buffer->sharding);
    if (!g.donate || !unheld || !passed_as_is || param->type.numel() == 0) continue;
    for (size_t r = 0; r < g.roots.size(); ++r) {
      if (!root_taken[r] && g.roots[r]->type == param->type) {
        root_taken[r] = true;
        g.aliasing[p] = static_cast<int>(r);
        break;
      }
    }
  }
}

// Lifted scalar arguments, in node order, become the float and int packs; each node's
// lifted_slots say where its arguments start (left empty for a node without lifted
// arguments, most of them: no allocation per node at every flush).
void Engine::lift_scalars(Graph& g) {
  g.float_scalars.clear();
  g.int_scalars.clear();
  g.lifted_slots.assign(g.nodes.size(), {});
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node* node = g.nodes[n];
    auto& slots = g.lifted_slots[n];
    for (size_t a = 0; a < node->args.size(); ++a) {
      const Arg& arg = node->args[a];
      if (!arg.lifted) continue;
      if (slots.empty()) slots.assign(node->args.size(), -1);
      switch (arg.kind) {
        case Arg::Kind::Double: slots[a] = static_cast<int>(g.float_scalars.size()); g.float_scalars.push_back(arg.d); break;
        case Arg::Kind::DoubleList: case Arg::Kind::Complex:
          slots[a] = static_cast<int>(g.float_scalars.size());
          g.float_scalars.insert(g.float_scalars.end(), arg.doubles.begin(), arg.doubles.end());
          break;
        case Arg::Kind::IntList: case Arg::Kind::BoolList:
          slots[a] = static_cast<int>(g.int_scalars.size());
          g.int_scalars.insert(g.int_scalars.end(), arg.ints.begin(), arg.ints.end());
          break;
        default: slots[a] = static_cast<int>(g.int_scalars.size()); g.int_scalars.push_back(arg.i); break;
      }
    }
  }
}

// Structural hash, the memory cache's key: node hashes, wiring, roots, parameter types,
// donation and the sizes of the scalar packs.
void Engine::hash_graph(Graph& g) {
  uint64_t h = hash_mix(0x7A3F, static_cast<uint64_t>(g.device));
  for (const Node* node : g.nodes) {
    h = hash_mix(h, node->hash);
    for (const ValuePtr& v : node->operands) {
      if (v->pending()) h = hash_mix(hash_mix(h, g.node_index.at(v->node.get()) * 2 + 1), v->output_index);
      else h = hash_mix(h, g.param_index.at(v.get()) * 2);
    }
  }
  for (const ValuePtr& r : g.roots) h = hash_mix(hash_mix(h, g.node_index.at(r->node.get())), r->output_index);
  for (size_t p = 0; p < g.params.size(); ++p) h = hash_mix(hash_type(h, g.params[p]->type), g.aliasing[p] + 2);
  h = hash_mix(hash_mix(h, g.float_scalars.size()), g.int_scalars.size());
  if (g.mesh) {  // a partitioned executable is made for its mesh and its arguments' shardings
    for (int d : g.mesh->devices) h = hash_mix(h, static_cast<uint64_t>(d) + 1);
    for (size_t p = 0; p < g.params.size(); ++p) h = hash_string(h, argument_sharding(g, p));
  }
  g.hash = h;
}

Engine::CompiledPtr Engine::find_or_compile(Graph& g) {
  auto cached = memory_cache_.find(g.hash);
  if (cached != memory_cache_.end()) {
    TraceSpan span([&] { return compile_event(g, "memory", hooks_); });
    metrics_.cache_hits_memory++;
    return cached->second;
  }
  CompiledPtr compiled = compile_graph(g);
  memory_cache_[g.hash] = compiled;
  return compiled;
}

DType Engine::scalar_float_dtype() { return runtime().has_float64() ? DType::Float64 : DType::Float32; }

namespace {

// Host bytes copied to every device of a mesh, as one replicated buffer.
BufferPtr upload_replicated(const void* data, const TensorType& type, const MeshPtr& mesh) {
  auto sharding = std::make_shared<Sharding>(Sharding::replicated(mesh, type.rank()));
  std::vector<BufferPtr> shards;
  for (int d : mesh->devices) shards.push_back(runtime().upload_bytes(data, type, d));
  return runtime().assemble_sharded(type, std::move(sharding), shards);
}

BufferPtr upload_to(const void* data, const TensorType& type, int device, const MeshPtr& mesh) {
  return mesh ? upload_replicated(data, type, mesh) : runtime().upload_bytes(data, type, device);
}

}  // namespace

BufferPtr Engine::upload_float_scalars(const std::vector<double>& values, int device, const MeshPtr& mesh) {
  TensorType t{{static_cast<int64_t>(values.size())}, scalar_float_dtype()};
  TraceSpan span([&] { return upload_event("scalars", t.nbytes(), device); });
  if (t.dtype == DType::Float64) return upload_to(values.data(), t, device, mesh);
  std::vector<float> narrow(values.begin(), values.end());
  return upload_to(narrow.data(), t, device, mesh);
}

BufferPtr Engine::upload_int_scalars(const std::vector<int64_t>& values, int device, const MeshPtr& mesh) {
  TensorType t{{static_cast<int64_t>(values.size())}, DType::Int64};
  TraceSpan span([&] { return upload_event("scalars", t.nbytes(), device); });
  return upload_to(values.data(), t, device, mesh);
}

BufferPtr Engine::argument_for_mesh(const BufferPtr& buffer, const MeshPtr& mesh) {
  if (buffer->sharding) return buffer;
  std::vector<char> host(static_cast<size_t>(buffer->type.nbytes()));
  runtime().download_bytes(*buffer, host.data());
  metrics_.bytes_to_host += buffer->type.nbytes();
  metrics_.bytes_to_device += buffer->type.nbytes() * static_cast<int64_t>(mesh->devices.size());
  TraceSpan span([&] { return upload_event("replicated", buffer->type.nbytes(), buffer->device); });
  return upload_replicated(host.data(), buffer->type, mesh);
}

std::vector<BufferPtr> Engine::launch(Executable& exe, const std::vector<BufferPtr>& args,
                                      const std::vector<TensorType>& result_types, int device,
                                      uint64_t graph_hash, const std::vector<CheckQueue::Entry>& checks) {
  EngineLock lock;
  // Launching is asynchronous: the span is the host's share; the device's is in the
  // timeline of torchtpu.profiler.trace.
  TraceSpan span([&] {
    return TraceEvent{"torchtpu::execute",
                      {{"graph", graph_name(graph_hash)},
                       {"arguments", static_cast<int64_t>(args.size())},
                       {"results", static_cast<int64_t>(result_types.size())},
                       {"device", static_cast<int64_t>(device)}}};
  });
  std::vector<TensorType> types = result_types;
  if (!checks.empty()) types.push_back(TensorType{{static_cast<int64_t>(checks.size() * 2)}, DType::Int64});
  std::vector<BufferPtr> results = runtime().execute(exe, args, types, device);
  metrics_.execute_count++;
  last_results_.assign(results.begin(), results.end());
  if (!checks.empty()) {
    BufferPtr flags = std::move(results.back());
    results.pop_back();
    checks_.add(runtime(), std::move(flags), device, checks);
  }
  return results;
}

void Engine::run_graph(Graph& g) {
  std::vector<BufferPtr> results;
  // Nothing changes until the launch has succeeded: a failure leaves the graph pending.
  try {
    g.stage = Stage::Lowering;  // find_or_compile moves it on
    g.replica_devices = replica_devices_of(g);
    plan_donation(g);
    lift_scalars(g);
    hash_graph(g);
  } catch (...) {
    std::rethrow_exception(explain_failure(g, g.stage, std::current_exception()));
  }
  // Run padded to a bucket: the padded graph goes through run_graph, which explains its own
  // failures (this graph's values stay pending). Collectives run at their exact sizes:
  // padding would change what all_gather, all_to_all and reduce_scatter exchange (and the
  // ranks' padded programs could differ).
  if (g.bucketable && g.replica_devices.empty() && !g.mesh && run_bucketed(g)) return;
  try {
    if (unpad_params(g)) {  // values computed padded by an earlier graph: sliced in this one
      plan_donation(g);
      lift_scalars(g);
      hash_graph(g);
    }
    CompiledPtr compiled = find_or_compile(g);
    for (const CheckSpec& spec : compiled->checks) {
      const Node* node = g.nodes[spec.node];
      g.check_entries.push_back(CheckQueue::Entry{spec.check, node->op.name(), node->origin});
    }
    g.stage = Stage::Running;
    int64_t budget = memory_budget(g.device);
    if (compiled->memory_needed > 0 && device_bytes_in_use(g.device) + compiled->memory_needed > budget)
      throw DeviceOutOfMemory(out_of_memory_message(
          compiled->memory_needed,
          "the results and working memory of a graph of " + std::to_string(g.nodes.size()) + " ops" +
              (g.origin.empty() ? std::string() : " started at " + g.origin),
          g.device, budget));
    std::vector<BufferPtr> args;
    args.reserve(g.params.size() + 2);
    for (const ValuePtr& p : g.params) args.push_back(g.mesh ? argument_for_mesh(p->buffer, g.mesh) : p->buffer);
    if (!g.float_scalars.empty()) args.push_back(upload_float_scalars(g.float_scalars, g.device, g.mesh));
    if (!g.int_scalars.empty()) args.push_back(upload_int_scalars(g.int_scalars, g.device, g.mesh));
    std::vector<TensorType> result_types;
    result_types.reserve(g.roots.size());
    for (const ValuePtr& r : g.roots) result_types.push_back(r->type);
    results = launch_graph(*compiled->executable, args, result_types, g);
  } catch (...) {
    std::rethrow_exception(explain_failure(g, g.stage, std::current_exception()));
  }
  for (size_t p = 0; p < g.params.size(); ++p) {
    if (g.aliasing[p] >= 0) {
      metrics_.donated_buffers++;
      g.params[p]->buffer.reset();  // the executable consumed it
    }
  }
  for (size_t r = 0; r < g.roots.size(); ++r) {
    g.roots[r]->buffer = std::move(results[r]);
    g.roots[r]->node.reset();
  }
}

// ---- compiling a graph: lower to a module, dump, disk cache, compile, bookkeeping --------

Engine::CompiledPtr Engine::compile_graph(Graph& g) {
  std::vector<std::string> signature;
  auto compiled = std::make_shared<Compiled>();
  std::string text;
  {
    TraceSpan span([&] {
      return TraceEvent{"torchtpu::lower", {{"graph", graph_name(g.hash)}, {"ops", static_cast<int64_t>(g.nodes.size())}}};
    });
    text = lower_graph(g, &signature, &compiled->checks);
  }
  g.stage = Stage::Compiling;
  dump_module(g, text);
  Runtime& rt = runtime();
  CompileOptions options;
  options.device = g.device;
  options.replica_devices = g.replica_devices;
  options.mesh = g.mesh;
  if (g.mesh) options.fixed_result_layouts = fixed_results(g, !compiled->checks.empty());
  // Executables are bound to their device: the options (device assignment) are in the key.
  CacheKey key = make_cache_key(text, rt.version(), rt.platform(), options.describe());
  if (load_from_disk(g, key, compiled.get())) return compiled;
  if (g.origin.empty() && hooks_.python_origin) g.origin = hooks_.python_origin();
  TraceSpan span([&] { return compile_event(g, "compiled", hooks_); });
  auto start = std::chrono::steady_clock::now();
  ExecutablePtr exe = rt.compile(text, options);
  metrics_.compile_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics_.graphs_compiled++;
  note_recompilation(g, std::move(signature));
  // Its ops' signatures compiled: none of them can make a later graph fail to compile.
  for (const Node* node : g.nodes)
    if (auto facts = node_facts_.find(node->hash); facts != node_facts_.end()) facts->second.compiled = true;
  compiled->memory_needed = rt.memory_needed(*exe);
  if (disk_cache_.active()) {
    // The entry keeps memory_needed beside the executable: asking the runtime costs as much
    // as serializing the module (about 10 ms, 2% of the bench GPT's warm first fused step).
    std::string payload(sizeof(int64_t), '\0');
    std::memcpy(payload.data(), &compiled->memory_needed, sizeof(int64_t));
    payload += rt.serialize(*exe);
    disk_cache_.store(key, payload, hooks_.warn);
  }
  compiled->executable = std::move(exe);
  return compiled;
}

// ---- a failed flush: which op, and what is lost ------------------------------------------

std::exception_ptr Engine::explain_failure(Graph& g, Stage stage, std::exception_ptr error) {
  if (is_interrupt(error)) return error;  // Ctrl-C: no op is to blame
  if (stage == Stage::Running) {
    // The whole graph failed to run (out of memory, say). Its values stay pending, but a
    // donated argument may be gone with the failed execution: such a value can never be
    // read again, and says so instead of reading freed memory.
    for (size_t p = 0; p < g.params.size(); ++p) {
      const ValuePtr& param = g.params[p];
      if (g.aliasing.size() > p && g.aliasing[p] >= 0 && param->buffer && runtime().is_deleted(*param->buffer)) {
        param->buffer.reset();
        param->error = error;
        some_node_failed_ = true;
      }
    }
    return error;
  }
  // Lowering or compiling failed: find the op. Only ops whose signature never compiled can
  // be at fault; each is compiled alone, halving the suspects each time.
  std::vector<Node*> suspects;
  for (Node* node : g.nodes) {
    auto facts = node_facts_.find(node->hash);
    if (facts == node_facts_.end() || !facts->second.compiled) suspects.push_back(node);
  }
  std::string message;
  Node* culprit = first_failing_node(suspects, g.device, g.mesh, &message);
  if (!culprit) return error;  // no single op fails alone: the graph as a whole did
  std::string text = "torchtpu: " + culprit->op.name() + " cannot run on tpu";
  if (!culprit->origin.empty()) text += " (issued at " + culprit->origin + ")";
  text += ": " + message;
  std::exception_ptr failure = std::make_exception_ptr(std::runtime_error(text));
  culprit->error = failure;
  node_facts_[culprit->hash].failure = failure;  // recording it again raises at once
  some_node_failed_ = true;
  return failure;
}

Node* Engine::first_failing_node(const std::vector<Node*>& suspects, int device, const MeshPtr& mesh,
                                 std::string* message) {
  if (suspects.empty() || compiles_alone(suspects, device, mesh, message)) return nullptr;
  size_t low = 0, high = suspects.size();  // [low, high) holds the first failing node
  while (high - low > 1) {
    size_t mid = (low + high) / 2;
    std::vector<Node*> first_half(suspects.begin() + low, suspects.begin() + mid);
    if (compiles_alone(first_half, device, mesh, message)) low = mid;
    else high = mid;
  }
  compiles_alone({suspects[low]}, device, mesh, message);
  return suspects[low];
}

// Compiles `nodes` side by side, each reading its operands as parameters; on failure
// `message` says why.
bool Engine::compiles_alone(const std::vector<Node*>& nodes, int device, const MeshPtr& mesh, std::string* message) {
  Graph bag;
  bag.device = device;
  bag.mesh = mesh;
  bag.donate = false;
  for (Node* node : nodes) {
    bag.node_index[node] = static_cast<int>(bag.nodes.size());
    bag.nodes.push_back(node);
    for (const ValuePtr& v : node->operands) {
      if (bag.param_index.count(v.get())) continue;
      bag.param_index[v.get()] = static_cast<int>(bag.params.size());
      bag.params.push_back(v);
    }
  }
  bag.aliasing.assign(bag.params.size(), -1);
  lift_scalars(bag);
  try {
    std::vector<std::string> signature;
    std::vector<CheckSpec> checks;
    CompileOptions options;
    options.device = device;
    options.mesh = mesh;
    runtime().compile(lower_graph(bag, &signature, &checks), options);
    return true;
  } catch (const std::exception& e) {
    rethrow_if_interrupt();
    *message = e.what();
    return false;
  }
}

// The module's text; `signature` gets one line per node (op and operand types) for the
// recompilation log, `checks` the graph's runtime checks (their flags are its last result; null:
// none returned).
// An operand that is a parameter is read as one even if it is pending (a node lowered alone).
std::string Engine::lower_graph(const Graph& g, std::vector<std::string>* signature, std::vector<CheckSpec>* checks) {
  ModuleBuilder module;
  LoweringContext ctx;
  std::vector<V> param_values;
  for (size_t p = 0; p < g.params.size(); ++p) {
    param_values.push_back(module.add_argument("%arg" + std::to_string(p), g.params[p]->type));
    if (g.aliasing[p] >= 0) module.set_argument_attribute(p, "tf.aliasing_output", std::to_string(g.aliasing[p]) + " : i32");
    if (g.mesh) module.set_argument_attribute(p, "mhlo.sharding", "\"" + argument_sharding(g, p) + "\"");
  }
  V float_pack, int_pack;
  if (!g.float_scalars.empty())
    float_pack = module.add_argument(
        "%scalars_f", TensorType{{static_cast<int64_t>(g.float_scalars.size())}, scalar_float_dtype()});
  if (!g.int_scalars.empty())
    int_pack = module.add_argument("%scalars_i", TensorType{{static_cast<int64_t>(g.int_scalars.size())}, DType::Int64});
  if (g.mesh) {
    module.set_attribute("mhlo.num_partitions", std::to_string(g.mesh->devices.size()) + " : i32");
    for (size_t a = g.params.size(); a < module.argument_count(); ++a)
      module.set_argument_attribute(a, "mhlo.sharding", "\"{replicated}\"");
  }
  ctx.set_scalar_packs(float_pack, int_pack);
  ctx.set_has_float64(scalar_float_dtype() == DType::Float64);

  std::vector<std::vector<V>> node_results(g.nodes.size());
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node* node = g.nodes[n];
    std::vector<V> operands;
    std::string sig = node->op.name() + "(";
    for (const ValuePtr& v : node->operands) {
      auto param = g.param_index.find(v.get());
      if (param != g.param_index.end()) operands.push_back(param_values[param->second]);
      else operands.push_back(node_results[g.node_index.at(v->node.get())][v->output_index]);
      sig += v->type.str() + " ";
    }
    signature->push_back(sig + ")");
    node_results[n] = lower_node(ctx, *node, std::move(operands), g.lifted_slots[n]);
  }
  std::vector<V> results;
  for (const ValuePtr& root : g.roots)
    results.push_back(root->pending() ? node_results[g.node_index.at(root->node.get())][root->output_index]
                                      : param_values[g.param_index.at(root.get())]);
  if (!g.replica_devices.empty())
    module.set_attribute("mhlo.num_replicas", std::to_string(g.replica_devices.size()) + " : i32");
  if (g.mesh) {
    std::vector<std::string> layouts = fixed_result_layouts(g);
    for (size_t r = 0; r < layouts.size(); ++r)
      if (!layouts[r].empty()) module.set_result_attribute(r, "mhlo.sharding", "\"" + layouts[r] + "\"");
  }
  if (g.roots.empty())  // nodes compiled side by side (compiles_alone): all their results
    for (const auto& outputs : node_results) results.insert(results.end(), outputs.begin(), outputs.end());
  if (checks && !ctx.checks().empty()) {  // export passes none: a module returns only its roots
    std::vector<V> flags;
    for (const auto& c : ctx.checks()) {
      flags.push_back(c.flag);
      checks->push_back(CheckSpec{g.node_index.at(c.node), c.check});
    }
    results.push_back(ctx.concatenate(flags, 0));
    // Read on the host from one device: each holds them all.
    if (g.mesh) module.set_result_attribute(results.size() - 1, "mhlo.sharding", "\"{replicated}\"");
  }
  return module.text(ctx.body(), results, ctx.functions());
}

void Engine::dump_module(const Graph& g, const std::string& text) {
  if (dump_dir_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dump_dir_, ec);
  char name[64];
  std::snprintf(name, sizeof(name), "/graph_%016llx.mlir", static_cast<unsigned long long>(g.hash));
  std::ofstream(dump_dir_ + name) << text;
}

// The executable stored under `key` (payload: memory_needed as 8 bytes, then the serialized
// executable), or false (absent, damaged or unloadable: removed).
bool Engine::load_from_disk(Graph& g, const CacheKey& key, Compiled* compiled) {
  auto bytes = disk_cache_.load(key, hooks_.warn);
  if (!bytes) return false;
  TraceSpan span([&] { return compile_event(g, "disk", hooks_); });
  try {
    int64_t memory_needed = -1;
    if (bytes->size() > sizeof(int64_t)) std::memcpy(&memory_needed, bytes->data(), sizeof(int64_t));
    if (memory_needed < 0) throw std::runtime_error("the entry is too short or its memory size is negative");
    CompileOptions options;
    options.device = g.device;
    options.replica_devices = g.replica_devices;
    options.mesh = g.mesh;
    if (g.mesh) options.fixed_result_layouts = fixed_results(g, !compiled->checks.empty());
    compiled->executable = runtime().deserialize(bytes->substr(sizeof(int64_t)), options);
    compiled->memory_needed = memory_needed;
    metrics_.cache_hits_disk++;
    return true;
  } catch (const std::exception& e) {
    rethrow_if_interrupt();  // Ctrl-C while loading is not a damaged entry
    if (hooks_.warn)
      hooks_.warn(std::string("torchtpu: could not load a cached executable (") + e.what() + "); recompiling it");
    disk_cache_.remove(key);
    return false;
  }
}

// Recompilation bookkeeping: a graph started at a line that compiled a different graph before.
// Keyed by the line and the graph's first op, so that strict mode (one op per graph) only
// reports an op compiled again for new shapes, not each different op on one line.
void Engine::note_recompilation(const Graph& g, std::vector<std::string> signature) {
  auto& previous = last_signature_by_origin_[g.origin + "|" + (g.nodes.empty() ? "" : g.nodes[0]->op.name())];
  if (!previous.empty() && !g.origin.empty()) {
    std::string reason;
    size_t n = std::min(previous.size(), signature.size());
    for (size_t i = 0; i < n && reason.empty(); ++i)
      if (previous[i] != signature[i])
        reason = "op #" + std::to_string(i) + " is " + signature[i] + ", was " + previous[i];
    if (reason.empty() && previous.size() == signature.size())
      reason = "same ops and shapes; buffer donation or scalar arguments differ";
    if (reason.empty())
      reason = "graph has " + std::to_string(signature.size()) + " ops, was " + std::to_string(previous.size());
    metrics_.recompilations++;
    metrics_.recompilation_log.push_back(Recompilation{g.origin, reason});
  }
  previous = std::move(signature);
}

// ---- tracing a body for a structured op (see lowering/scan.cpp) ---------------------

namespace {

const OpKind& body_input_kind() {
  static const OpKind kind = OpKind::intern("torchtpu::body_input");
  return kind;
}

// Where a body node reads an operand from, for the body's structural hash.
uint64_t wiring_code(const Value* v, const std::unordered_map<const Value*, int>& inputs,
                     const std::unordered_map<const Value*, int>& captured,
                     const std::unordered_map<const Node*, int>& nodes) {
  if (auto it = inputs.find(v); it != inputs.end()) return it->second * 4 + 1;
  if (auto it = captured.find(v); it != captured.end()) return it->second * 4 + 2;
  return (static_cast<uint64_t>(nodes.at(v->node.get())) * 64 + v->output_index) * 4 + 3;
}

}  // namespace

void Engine::begin_body() {
  EngineLock lock;
  if (in_body_)
    throw std::invalid_argument("torchtpu.scan_layers: a scanned layer cannot itself call scan_layers");
  in_body_ = true;
  body_first_serial_ = next_value_serial();
  body_inputs_.clear();
}

ValuePtr Engine::body_input(const TensorType& type, int device) {
  EngineLock lock;
  if (!in_body_) throw std::logic_error("torchtpu: body_input outside a body trace");
  auto node = std::make_shared<Node>();
  node->op = body_input_kind();
  node->args = {Arg::integer(static_cast<int64_t>(body_inputs_.size()))};
  node->outputs = {type};
  node->device = device;
  node->hash = hash_node(*node);
  auto value = std::make_shared<Value>();
  value->type = type;
  value->device = device;
  value->node = node;
  body_inputs_.push_back(value);
  return value;
}

void Engine::abort_body() {
  EngineLock lock;
  in_body_ = false;
  body_inputs_.clear();
}

std::shared_ptr<const Subgraph> Engine::end_body(const std::vector<ValuePtr>& outputs) {
  EngineLock lock;
  if (!in_body_) throw std::logic_error("torchtpu: end_body without begin_body");
  in_body_ = false;
  auto body = std::make_shared<Subgraph>();
  body->inputs.swap(body_inputs_);
  body->outputs = outputs;
  std::unordered_map<const Value*, int> input_index, captured_index;
  std::unordered_map<const Node*, int> node_index;
  for (size_t i = 0; i < body->inputs.size(); ++i) input_index[body->inputs[i].get()] = static_cast<int>(i);
  // A value made before the trace (a buffer, or older pending work) is captured: passed in.
  auto made_in_body = [&](const ValuePtr& v) { return v->pending() && v->serial >= body_first_serial_; };
  auto note_captured = [&](const ValuePtr& v) {
    if (input_index.count(v.get()) || captured_index.count(v.get()) || made_in_body(v)) return;
    captured_index[v.get()] = static_cast<int>(body->captured.size());
    body->captured.push_back(v);
  };
  // Depth-first from the outputs, operands first (as collect_nodes, stopping at the body's edge).
  std::vector<std::pair<NodePtr, size_t>> stack;
  std::unordered_set<const Node*> visiting;
  auto visit = [&](const ValuePtr& v) {
    note_captured(v);
    if (!made_in_body(v) || input_index.count(v.get())) return;
    if (v->node->op == body_input_kind())
      throw std::invalid_argument("torchtpu.scan_layers: the layer uses a tensor traced for another scan");
    if (node_index.count(v->node.get()) || visiting.count(v->node.get())) return;
    visiting.insert(v->node.get());
    stack.emplace_back(v->node, 0);
  };
  for (const ValuePtr& out : outputs) {
    visit(out);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->operands.size()) {
        ValuePtr operand = node->operands[next++];
        visit(operand);
        continue;
      }
      node_index[node.get()] = static_cast<int>(body->nodes.size());
      body->nodes.push_back(node);
      stack.pop_back();
    }
  }
  uint64_t h = 0x5CA9;
  for (const ValuePtr& v : body->inputs) h = hash_type(h, v->type);
  for (const ValuePtr& v : body->captured) h = hash_type(h, v->type);
  for (const NodePtr& node : body->nodes) {
    const LoweringRule* rule = find_lowering(node->op);
    if (!rule) throw std::logic_error("torchtpu: no lowering for " + node->op.name());
    if (rule->random)
      throw std::invalid_argument("torchtpu.scan_layers / StackedLayers: the layer draws random numbers (" +
                                  node->op.name() +
                                  "); random ops are not supported inside the loop yet - set dropout to 0 or run "
                                  "these layers in an ordinary loop");
    // The body's scalars are constants of its module: the loop body is compiled once.
    bool had_lifted = false;
    for (Arg& arg : node->args) had_lifted |= std::exchange(arg.lifted, false);
    if (had_lifted) node->hash = hash_node(*node);
    h = hash_mix(h, node->hash);
    for (const ValuePtr& v : node->operands) h = hash_mix(h, wiring_code(v.get(), input_index, captured_index, node_index));
  }
  for (const ValuePtr& v : outputs) h = hash_mix(h, wiring_code(v.get(), input_index, captured_index, node_index));
  body->hash = h;
  return body;
}

// ---- torch.compile capture support (see device/capture.cpp) ---------------------------

Engine::CaptureRun Engine::run_for_capture(const std::vector<ValuePtr>& roots, int device,
                                           const std::vector<std::pair<const Value*, int>>& donations) {
  Graph graph;
  graph.device = device;
  graph.donate = false;
  graph.donate_to_root = donations;
  graph.mesh = roots.empty() ? nullptr : roots.front()->mesh;
  if (hooks_.python_origin) graph.origin = hooks_.python_origin();
  graph.roots = roots;
  // Other live pending values made by the captured code (functional views' bases, say)
  // are computed too, as a flush would: left pending, they would be recomputed later.
  std::unordered_set<const Value*> seen;
  for (const ValuePtr& r : roots) seen.insert(r.get());
  auto same_mesh = [&](const Value& v) {
    return graph.mesh ? v.mesh && v.mesh->same_devices(*graph.mesh) : !v.mesh;
  };
  for (auto& weak : pending_) {
    ValuePtr v = weak.lock();
    if (!v || !v->pending() || v->device != device || seen.count(v.get()) || !same_mesh(*v)) continue;
    if (v.use_count() - 1 > v->node_uses.load()) {
      seen.insert(v.get());
      graph.roots.push_back(v);
    }
  }
  take_pending_collectives(device, graph.roots);
  CaptureRun run;
  for (const ValuePtr& r : graph.roots) run.result_types.push_back(r->type);
  if (graph.roots.empty()) return run;
  collect_nodes(&graph, graph.roots);
  // Random nodes take (seed, offset) as their last two args; note them before running
  // (run_graph releases the nodes).
  std::vector<std::pair<size_t, size_t>> random_nodes;  // (node index, seed arg index)
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const LoweringRule* rule = find_lowering(graph.nodes[n]->op);
    if (rule && rule->random && graph.nodes[n]->args.size() >= 2)
      random_nodes.emplace_back(n, graph.nodes[n]->args.size() - 2);
  }
  run_graph(graph);
  run.executable = memory_cache_.at(graph.hash)->executable;
  run.checks = graph.check_entries;
  run.graph_hash = graph.hash;
  run.params = graph.params;
  run.aliasing = graph.aliasing;
  run.mesh = graph.mesh;
  if (graph.mesh)
    for (size_t p = 0; p < graph.params.size(); ++p) run.param_shardings.push_back(argument_sharding(graph, p));
  run.float_scalars = graph.float_scalars;
  run.int_scalars = graph.int_scalars;
  for (auto [n, a] : random_nodes) run.random_seed_slots.push_back(graph.lifted_slots[n][a]);
  return run;
}

// ---- export (see device/export.cpp) ----------------------------------------------------

Engine::ExportedModule Engine::lower_for_export(const std::vector<ValuePtr>& weights,
                                                const std::vector<ValuePtr>& inputs,
                                                const std::vector<ValuePtr>& roots, int device) {
  Graph graph;
  graph.device = device;
  graph.donate = false;
  for (const auto* group : {&weights, &inputs})
    for (const ValuePtr& v : *group) {
      if (v->pending()) throw std::logic_error("torchtpu: export got an argument that is not computed yet");
      graph.param_index.emplace(v.get(), static_cast<int>(graph.params.size()));  // a repeated value reads its first slot
      graph.params.push_back(v);
    }
  graph.roots = roots;
  collect_nodes(&graph, graph.roots);
  for (const Node* node : graph.nodes) {
    const LoweringRule* rule = find_lowering(node->op);
    if (rule && rule->random)
      throw std::invalid_argument("torchtpu.export: " + node->op.name() + " draws random numbers, and a module "
                                  "would draw the same ones on every call (dropout in training mode? call "
                                  "model.eval() before exporting)");
  }
  // Values found while collecting (after weights and inputs) go between them.
  ExportedModule out;
  auto first_found = graph.params.begin() + static_cast<std::ptrdiff_t>(weights.size() + inputs.size());
  out.constants.assign(first_found, graph.params.end());
  std::vector<ValuePtr> ordered(graph.params.begin(), graph.params.begin() + static_cast<std::ptrdiff_t>(weights.size()));
  ordered.insert(ordered.end(), out.constants.begin(), out.constants.end());
  ordered.insert(ordered.end(), inputs.begin(), inputs.end());
  graph.params = std::move(ordered);
  graph.param_index.clear();
  for (size_t p = 0; p < graph.params.size(); ++p) graph.param_index.emplace(graph.params[p].get(), static_cast<int>(p));
  plan_donation(graph);
  graph.lifted_slots.assign(graph.nodes.size(), {});  // no scalar packs: scalars are constants
  std::vector<std::string> signature;
  out.text = lower_graph(graph, &signature, /*checks=*/nullptr);  // unused checks: XLA drops them
  return out;
}

}  // namespace torchtpu
