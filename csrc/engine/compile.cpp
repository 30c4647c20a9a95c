// Compiling a graph: lowering to a module, dumps, the memory and disk caches of executables, the recompilation log.
#include "engine/engine.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "engine/disk_cache.h"
#include "engine/graph_plan.h"
#include "engine/trace.h"
#include "lowering/registry.h"
#include "lowering/sharding.h"
#include "stablehlo/builder.h"
#include "stablehlo/module.h"

namespace torchtpu {

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
  memory_cache_recency_.clear();
  last_signature_by_origin_.clear();
  buckets_ = std::make_shared<BucketState>();
}

void Engine::set_executable_cache_size(size_t n) {
  EngineLock lock;
  if (n == 0) throw std::invalid_argument("torchtpu: the executable cache holds at least one executable");
  memory_cache_capacity_ = n;
  evict_executables();
}

// Launches in flight and torch.compile replays hold their executable themselves: dropping
// the cache's reference frees it once they are done.
void Engine::evict_executables() {
  while (memory_cache_.size() > memory_cache_capacity_) {
    memory_cache_.erase(memory_cache_recency_.back());
    memory_cache_recency_.pop_back();
    metrics_.executables_evicted++;
  }
}

Engine::CompiledPtr Engine::find_or_compile(Graph& g) {
  auto cached = memory_cache_.find(g.hash);
  if (cached != memory_cache_.end()) {
    TraceSpan span([&] { return compile_event(g, "memory", hooks_); });
    metrics_.cache_hits_memory++;
    memory_cache_recency_.splice(memory_cache_recency_.begin(), memory_cache_recency_, cached->second.recency);
    return cached->second.compiled;
  }
  CompiledPtr compiled = compile_graph(g);
  memory_cache_recency_.push_front(g.hash);
  memory_cache_[g.hash] = CachedExecutable{compiled, memory_cache_recency_.begin()};
  evict_executables();
  return compiled;
}

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
  ExecutablePtr exe;
  try {
    if (corrupt_next_compile_) {
      corrupt_next_compile_ = false;
      exe = rt.compile(text + "\n} this line is not StableHLO {\n", options);
    } else {
      exe = rt.compile(text, options);
    }
  } catch (const DeviceOutOfMemory&) {
    throw;
  } catch (const std::exception& error) {
    rethrow_if_interrupt();
    // The runtime's words, with which graph it was: the flush then looks for the op to blame
    // (explain_failure) and leaves the graph pending, so the engine stays usable.
    throw std::runtime_error("torchtpu: XLA could not compile graph " + graph_name(g.hash) + " (" +
                             std::to_string(g.nodes.size()) + " ops" +
                             (g.origin.empty() ? std::string() : ", started at " + g.origin) + "): " + error.what());
  }
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

}  // namespace torchtpu
