// Assembling an Engine::Graph (its nodes in order, its parameters and their layouts) and hashing it.
#include "engine/engine.h"

#include "engine/graph_plan.h"

namespace torchtpu {

// The layout in which a partitioned graph's parameter arrives: its buffer's sharding, or
// replicated (a buffer of one device is copied onto the mesh for the launch).
std::string argument_sharding(const Engine::Graph& g, size_t p) {
  const ValuePtr& param = g.params[p];
  return param->buffer && param->buffer->sharding ? param->buffer->sharding->hlo() : "{replicated}";
}

Engine::Graph graph_of(std::vector<ValuePtr> roots, int device, MeshPtr mesh, std::string origin) {
  Engine::Graph g;
  g.device = device;
  g.mesh = std::move(mesh);
  g.origin = std::move(origin);
  g.roots = std::move(roots);
  collect_nodes(&g, g.roots);
  return g;
}

Engine::Graph side_by_side(const std::vector<Node*>& nodes, int device, MeshPtr mesh) {
  Engine::Graph g;
  g.device = device;
  g.mesh = std::move(mesh);
  g.donate = false;
  for (Node* node : nodes) {
    g.node_index[node] = static_cast<int>(g.nodes.size());
    g.nodes.push_back(node);
    for (const ValuePtr& v : node->operands) {
      if (g.param_index.count(v.get())) continue;
      g.param_index[v.get()] = static_cast<int>(g.params.size());
      g.params.push_back(v);
    }
  }
  g.aliasing.assign(g.params.size(), -1);
  return g;
}

uint64_t hash_wiring(uint64_t h, const Engine::Graph& g, uint64_t (*node_hash)(const Node&)) {
  for (const Node* node : g.nodes) {
    h = hash_mix(h, node_hash(*node));
    for (const ValuePtr& v : node->operands) {
      if (v->pending()) h = hash_mix(hash_mix(h, g.node_index.at(v->node.get()) * 2 + 1), v->output_index);
      else h = hash_mix(h, g.param_index.at(v.get()) * 2);
    }
  }
  for (const ValuePtr& r : g.roots) h = hash_mix(hash_mix(h, g.node_index.at(r->node.get())), r->output_index);
  return h;
}

// Structural hash, the memory cache's key: node hashes, wiring, roots, parameter types,
// donation and the sizes of the scalar packs.
void Engine::hash_graph(Graph& g) {
  uint64_t h = hash_wiring(hash_mix(0x7A3F, static_cast<uint64_t>(g.device)), g,
                           [](const Node& node) { return node.hash; });
  for (size_t p = 0; p < g.params.size(); ++p) h = hash_mix(hash_type(h, g.params[p]->type), g.aliasing[p] + 2);
  h = hash_mix(hash_mix(h, g.float_scalars.size()), g.int_scalars.size());
  if (g.mesh) {  // a partitioned executable is made for its mesh and its arguments' shardings
    for (int d : g.mesh->devices) h = hash_mix(h, static_cast<uint64_t>(d) + 1);
    for (size_t p = 0; p < g.params.size(); ++p) h = hash_string(h, argument_sharding(g, p));
  }
  g.hash = h;
}

void collect_nodes(Engine::Graph* g, const std::vector<ValuePtr>& roots) {
  std::vector<std::pair<Node*, size_t>> stack;
  PointerIndex<Node> visiting;  // pushed on the stack, not yet ordered
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
    // A strict-mode graph is this node alone: its operands are all its parameters.
    if (g->params.empty()) g->params.reserve(start->operands.size());
    stack.emplace_back(start, 0);
    visiting.emplace(start, 0);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->operands.size()) {
        const ValuePtr& operand = node->operands[next++];
        if (operand->pending()) {
          Node* child = operand->node.get();
          if (!g->node_index.count(child) && !visiting.count(child)) {
            visiting.emplace(child, 0);
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

}  // namespace torchtpu
