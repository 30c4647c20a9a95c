// The pending graph for torch.compile (compiled and run, its executable handed out) and for export (lowered only).
#include "engine/engine.h"

#include <stdexcept>
#include <unordered_set>

#include "engine/graph_plan.h"
#include "lowering/registry.h"

namespace torchtpu {

Engine::CaptureRun Engine::run_for_capture(const std::vector<ValuePtr>& roots, int device,
                                           const std::vector<std::pair<const Value*, int>>& donations) {
  MeshPtr mesh = roots.empty() ? nullptr : roots.front()->mesh;
  std::string origin = hooks_.python_origin ? hooks_.python_origin() : "";
  std::vector<ValuePtr> all_roots = roots;
  // Other live pending values made by the captured code (functional views' bases, say)
  // are computed too, as a flush would: left pending, they would be recomputed later.
  std::unordered_set<const Value*> seen;
  for (const ValuePtr& r : roots) seen.insert(r.get());
  auto same_mesh = [&](const Value& v) {
    return mesh ? v.mesh && v.mesh->same_devices(*mesh) : !v.mesh;
  };
  for (auto& weak : pending_) {
    ValuePtr v = weak.lock();
    if (!v || !v->pending() || v->device != device || seen.count(v.get()) || !same_mesh(*v)) continue;
    if (v.use_count() - 1 > v->node_uses.load()) {
      seen.insert(v.get());
      all_roots.push_back(v);
    }
  }
  take_pending_collectives(device, all_roots);
  CaptureRun run;
  for (const ValuePtr& r : all_roots) run.result_types.push_back(r->type);
  if (all_roots.empty()) return run;
  Graph graph = graph_of(std::move(all_roots), device, mesh, origin);
  graph.donate = false;
  graph.donate_to_root = donations;
  // Random nodes take (seed, offset) as their last two args; note them before running
  // (run_graph releases the nodes).
  std::vector<std::pair<size_t, size_t>> random_nodes;  // (node index, seed arg index)
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const LoweringRule* rule = find_lowering(graph.nodes[n]->op);
    if (rule && rule->random && graph.nodes[n]->args.size() >= 2)
      random_nodes.emplace_back(n, graph.nodes[n]->args.size() - 2);
  }
  run_graph(graph);
  run.executable = memory_cache_.at(graph.hash).compiled->executable;
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
