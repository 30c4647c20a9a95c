// Collectives in a pending graph: one replica set per graph, always run, failures blamed on ranks.
#include "engine/engine.h"

#include <stdexcept>
#include <unordered_set>

#include "engine/graph_plan.h"
#include "lowering/registry.h"

namespace torchtpu {

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

}  // namespace torchtpu
