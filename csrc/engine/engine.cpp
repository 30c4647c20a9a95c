// Engine: pending graph, flush policy, graph building, executable caches, metrics.
#include "engine/engine.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include "engine/disk_cache.h"
#include "engine/trace.h"
#include "engine/graph_plan.h"
#include "lowering/registry.h"
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

EngineLock::EngineLock() : mutex_(Engine::get().mutex()) {
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

}  // namespace

void Engine::set_mode(Mode mode) {
  EngineLock lock;
  if (mode != mode_.load()) {
    for (int d = 0; d < (runtime_initialized() ? runtime().device_count() : 0); ++d)
      flush_locked(d, FlushReason::ModeChange);
  }
  mode_.store(mode);
}

void Engine::set_cache_dir(const std::string& dir) {
  EngineLock lock;
  cache_dir_ = dir;
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
  value->buffer = std::move(buffer);
  return value;
}

std::vector<ValuePtr> Engine::record(OpKind op, std::vector<Arg> args, std::vector<ValuePtr> operands,
                                     std::vector<TensorType> outputs, int device,
                                     std::shared_ptr<const Subgraph> body) {
  EngineLock lock;
  metrics_.ops_traced++;
  Mode mode = mode_.load();
  if (mode != Mode::Fused && !in_body_) {
    for (const ValuePtr& v : operands)
      if (v->pending()) flush_locked(v->device, FlushReason::Observation);
  }
  auto node = std::make_shared<Node>();
  node->op = op;
  node->args = std::move(args);
  node->outputs = std::move(outputs);
  node->device = device;
  node->body = std::move(body);
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
    value->node = node;
    value->output_index = static_cast<int>(i);
    results.push_back(std::move(value));
  }
  if (in_body_) return results;  // part of the body being traced; end_body collects it
  if (mode == Mode::Fused) {
    if (pending_ops_ == 0 && hooks_.python_origin) pending_origin_ = hooks_.python_origin();
    for (const ValuePtr& v : results) pending_.push_back(v);
    if (++pending_ops_ >= max_pending_ops_) flush_locked(device, FlushReason::SizeLimit);
    return results;
  }
  Graph graph;
  graph.device = device;
  graph.roots = results;
  collect_nodes(&graph, graph.roots);
  run_graph(graph);
  if (mode == Mode::Debug)
    for (const ValuePtr& v : results) runtime().wait(*v->buffer);
  return results;
}

void Engine::compute(const ValuePtr& value) {
  EngineLock lock;
  if (value->pending()) flush_locked(value->device, FlushReason::Observation);
}

BufferPtr Engine::materialize(const ValuePtr& value) {
  EngineLock lock;
  compute(value);
  if (value->pending() && in_body_)
    throw std::invalid_argument(
        "torchtpu.scan_layers: the layer reads a tensor on the host (.item(), printing, a data-dependent "
        "branch or an op without a tpu lowering); a scanned layer must stay on the device - run these "
        "layers in an ordinary loop instead");
  if (value->padded_only()) compute_unpadded(value);
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
  }
}

void Engine::flush_locked(int device, FlushReason reason) {
  if (pending_.empty()) return;
  Graph graph;
  graph.device = device;
  graph.origin = pending_origin_;
  graph.bucketable = mode_.load() == Mode::Fused;
  std::vector<std::weak_ptr<Value>> keep;
  for (auto& weak : pending_) {
    ValuePtr v = weak.lock();
    if (!v || !v->pending()) continue;
    if (v->device != device) {
      keep.push_back(weak);
      continue;
    }
    // Held by something besides pending nodes (a tensor, autograd): the user can see it.
    if (v.use_count() - 1 > v->node_uses.load()) graph.roots.push_back(v);
  }
  pending_.swap(keep);
  if (pending_.empty()) pending_ops_ = 0;
  if (graph.roots.empty()) return;
  collect_nodes(&graph, graph.roots);
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

// ---- running a graph: plan donation, lift scalars, hash, find or compile, launch -------

// A parameter nothing else holds gives its buffer to a root of the same type (an optimizer
// step then updates parameters without copies).
void Engine::plan_donation(Graph& g) {
  g.aliasing.assign(g.params.size(), -1);
  std::vector<bool> root_taken(g.roots.size(), false);
  for (size_t p = 0; p < g.params.size(); ++p) {
    const ValuePtr& param = g.params[p];
    bool unheld = param.use_count() - 1 == param->node_uses.load() && param->buffer.use_count() == 1 &&
                  !param->buffer->shared_outside.load();
    if (!g.donate || !unheld || param->type.numel() == 0) continue;
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
// lifted_slots say where its arguments start.
void Engine::lift_scalars(Graph& g) {
  g.float_scalars.clear();
  g.int_scalars.clear();
  g.lifted_slots.assign(g.nodes.size(), {});
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node* node = g.nodes[n];
    auto& slots = g.lifted_slots[n];
    slots.assign(node->args.size(), -1);
    for (size_t a = 0; a < node->args.size(); ++a) {
      const Arg& arg = node->args[a];
      if (!arg.lifted) continue;
      switch (arg.kind) {
        case Arg::Kind::Double: slots[a] = static_cast<int>(g.float_scalars.size()); g.float_scalars.push_back(arg.d); break;
        case Arg::Kind::DoubleList:
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
  g.hash = h;
}

ExecutablePtr Engine::find_or_compile(Graph& g) {
  auto cached = memory_cache_.find(g.hash);
  if (cached != memory_cache_.end()) {
    TraceSpan span([&] { return compile_event(g, "memory", hooks_); });
    metrics_.cache_hits_memory++;
    return cached->second;
  }
  ExecutablePtr exe = compile_graph(g);
  memory_cache_[g.hash] = exe;
  return exe;
}

DType Engine::scalar_float_dtype() { return runtime().has_float64() ? DType::Float64 : DType::Float32; }

BufferPtr Engine::upload_float_scalars(const std::vector<double>& values, int device) {
  TensorType t{{static_cast<int64_t>(values.size())}, scalar_float_dtype()};
  TraceSpan span([&] { return upload_event("scalars", t.nbytes(), device); });
  if (t.dtype == DType::Float64) return runtime().upload_bytes(values.data(), t, device);
  std::vector<float> narrow(values.begin(), values.end());
  return runtime().upload_bytes(narrow.data(), t, device);
}

BufferPtr Engine::upload_int_scalars(const std::vector<int64_t>& values, int device) {
  TensorType t{{static_cast<int64_t>(values.size())}, DType::Int64};
  TraceSpan span([&] { return upload_event("scalars", t.nbytes(), device); });
  return runtime().upload_bytes(values.data(), t, device);
}

std::vector<BufferPtr> Engine::launch(Executable& exe, const std::vector<BufferPtr>& args,
                                      const std::vector<TensorType>& result_types, int device,
                                      uint64_t graph_hash) {
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
  std::vector<BufferPtr> results = runtime().execute(exe, args, result_types, device);
  metrics_.execute_count++;
  last_results_.assign(results.begin(), results.end());
  return results;
}

void Engine::run_graph(Graph& g) {
  plan_donation(g);
  lift_scalars(g);
  hash_graph(g);
  if (g.bucketable && run_bucketed(g)) return;
  if (unpad_params(g)) {  // values computed padded by an earlier graph: sliced in this one
    plan_donation(g);
    lift_scalars(g);
    hash_graph(g);
  }
  ExecutablePtr exe = find_or_compile(g);
  std::vector<BufferPtr> args;
  args.reserve(g.params.size() + 2);
  for (const ValuePtr& p : g.params) args.push_back(p->buffer);
  if (!g.float_scalars.empty()) args.push_back(upload_float_scalars(g.float_scalars, g.device));
  if (!g.int_scalars.empty()) args.push_back(upload_int_scalars(g.int_scalars, g.device));
  std::vector<TensorType> result_types;
  result_types.reserve(g.roots.size());
  for (const ValuePtr& r : g.roots) result_types.push_back(r->type);
  std::vector<BufferPtr> results = launch(*exe, args, result_types, g.device, g.hash);
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

ExecutablePtr Engine::compile_graph(Graph& g) {
  std::vector<std::string> signature;
  std::string text;
  {
    TraceSpan span([&] {
      return TraceEvent{"torchtpu::lower", {{"graph", graph_name(g.hash)}, {"ops", static_cast<int64_t>(g.nodes.size())}}};
    });
    text = lower_graph(g, &signature);
  }
  dump_module(g, text);
  Runtime& rt = runtime();
  CompileOptions options;
  options.device = g.device;
  std::string key;
  if (!cache_dir_.empty()) {
    // Executables are bound to their device: the device index is part of the key.
    key = disk_cache_key(text, rt.version() + " device " + std::to_string(g.device));
    if (ExecutablePtr exe = load_from_disk(g, key)) return exe;
  }
  if (g.origin.empty() && hooks_.python_origin) g.origin = hooks_.python_origin();
  TraceSpan span([&] { return compile_event(g, "compiled", hooks_); });
  auto start = std::chrono::steady_clock::now();
  ExecutablePtr exe = rt.compile(text, options);
  metrics_.compile_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics_.graphs_compiled++;
  note_recompilation(g, std::move(signature));
  if (!key.empty()) disk_cache_store(cache_dir_, key, rt.serialize(*exe), hooks_.warn);
  return exe;
}

// The module's text; `signature` gets one line per node (op and operand types) for the
// recompilation log.
std::string Engine::lower_graph(const Graph& g, std::vector<std::string>* signature) {
  ModuleBuilder module;
  LoweringContext ctx;
  std::vector<V> param_values;
  for (size_t p = 0; p < g.params.size(); ++p) {
    param_values.push_back(module.add_argument("%arg" + std::to_string(p), g.params[p]->type));
    if (g.aliasing[p] >= 0) module.set_argument_attribute(p, "tf.aliasing_output", std::to_string(g.aliasing[p]) + " : i32");
  }
  V float_pack, int_pack;
  if (!g.float_scalars.empty())
    float_pack = module.add_argument(
        "%scalars_f", TensorType{{static_cast<int64_t>(g.float_scalars.size())}, scalar_float_dtype()});
  if (!g.int_scalars.empty())
    int_pack = module.add_argument("%scalars_i", TensorType{{static_cast<int64_t>(g.int_scalars.size())}, DType::Int64});
  ctx.set_scalar_packs(float_pack, int_pack);
  ctx.set_has_float64(scalar_float_dtype() == DType::Float64);

  std::vector<std::vector<V>> node_results(g.nodes.size());
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node* node = g.nodes[n];
    std::vector<V> operands;
    std::string sig = node->op.name() + "(";
    for (const ValuePtr& v : node->operands) {
      if (v->pending()) operands.push_back(node_results[g.node_index.at(v->node.get())][v->output_index]);
      else operands.push_back(param_values[g.param_index.at(v.get())]);
      sig += v->type.str() + " ";
    }
    signature->push_back(sig + ")");
    node_results[n] = lower_node(ctx, *node, std::move(operands), g.lifted_slots[n]);
  }
  std::vector<V> results;
  for (const ValuePtr& root : g.roots)
    results.push_back(root->pending() ? node_results[g.node_index.at(root->node.get())][root->output_index]
                                      : param_values[g.param_index.at(root.get())]);
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

// The executable stored under `key`, or null (absent, damaged or unloadable: removed).
ExecutablePtr Engine::load_from_disk(Graph& g, const std::string& key) {
  auto bytes = disk_cache_load(cache_dir_, key, hooks_.warn);
  if (!bytes) return nullptr;
  TraceSpan span([&] { return compile_event(g, "disk", hooks_); });
  try {
    CompileOptions options;
    options.device = g.device;
    ExecutablePtr exe = runtime().deserialize(*bytes, options);
    metrics_.cache_hits_disk++;
    return exe;
  } catch (const std::exception& e) {
    if (hooks_.warn)
      hooks_.warn(std::string("torchtpu: could not load a cached executable (") + e.what() + "); recompiling it");
    disk_cache_remove(cache_dir_, key);
    return nullptr;
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
      throw std::invalid_argument("torchtpu.scan_layers: the layer draws random numbers (" + node->op.name() +
                                  "); random ops are not supported inside scan_layers yet - set dropout to 0 "
                                  "or run these layers in an ordinary loop");
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

Engine::CaptureRun Engine::run_for_capture(const std::vector<ValuePtr>& roots, int device) {
  Graph graph;
  graph.device = device;
  graph.donate = false;
  if (hooks_.python_origin) graph.origin = hooks_.python_origin();
  graph.roots = roots;
  // Other live pending values made by the captured code (functional views' bases, say)
  // are computed too, as a flush would: left pending, they would be recomputed later.
  std::unordered_set<const Value*> seen;
  for (const ValuePtr& r : roots) seen.insert(r.get());
  for (auto& weak : pending_) {
    ValuePtr v = weak.lock();
    if (!v || !v->pending() || v->device != device || seen.count(v.get())) continue;
    if (v.use_count() - 1 > v->node_uses.load()) {
      seen.insert(v.get());
      graph.roots.push_back(v);
    }
  }
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
  run.executable = memory_cache_.at(graph.hash);
  run.graph_hash = graph.hash;
  run.params = graph.params;
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
  out.text = lower_graph(graph, &signature);
  return out;
}

}  // namespace torchtpu
