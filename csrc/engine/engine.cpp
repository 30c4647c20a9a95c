// Engine: recording ops, the pending graph and when it flushes, the steps of running a graph, launches.
#include "engine/engine.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include "engine/graph_plan.h"
#include "engine/trace.h"

namespace torchtpu {

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

void Engine::set_mode(Mode mode) {
  EngineLock lock;
  if (mode != mode_.load()) {
    for (int d = 0; d < (runtime_initialized() ? runtime().device_count() : 0); ++d)
      flush_locked(d, FlushReason::ModeChange);
  }
  mode_.store(mode);
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
  Graph graph = graph_of(results, device, mesh);
  run_graph(graph);
  if (mode == Mode::Debug) {
    for (const ValuePtr& v : results) runtime().wait(*v->buffer);
    checks_.raise_failed(runtime(), device, /*wait=*/true);  // at the op itself
  }
  return results;
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

// ---- running a graph: plan donation, lift scalars (arguments.cpp), hash (graph_plan.cpp),
// find or compile (compile.cpp), launch ---------------------------------------------------

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
  std::vector<BufferPtr> results;
  if (checks.empty()) {
    results = runtime().execute(exe, args, result_types, device);
  } else {
    std::vector<TensorType> types = result_types;
    types.push_back(TensorType{{static_cast<int64_t>(checks.size() * 2)}, DType::Int64});
    results = runtime().execute(exe, args, types, device);
  }
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

}  // namespace torchtpu
