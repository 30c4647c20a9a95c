// The graph a flush compiles and runs (Engine::Graph) and the helpers the engine's files share.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace torchtpu {

// A graph ready to compile and run: its nodes in topological order, the buffers it reads
// (parameters), the values it produces (roots) and its structural hash.
struct Engine::Graph {
  int device = 0;
  std::vector<Node*> nodes;
  std::unordered_map<const Node*, int> node_index;
  std::vector<ValuePtr> params;
  std::unordered_map<const Value*, int> param_index;
  std::vector<ValuePtr> roots;
  std::vector<int> aliasing;  // per parameter: the root it donates its buffer to, or -1
  std::vector<double> float_scalars;
  std::vector<int64_t> int_scalars;
  std::vector<std::vector<int>> lifted_slots;
  std::vector<CheckQueue::Entry> check_entries;  // its runtime checks, once run
  uint64_t hash = 0;
  std::string origin;
  bool donate = true;       // false for captured graphs (their parameters belong to the caller)
  // Parameters donated whatever holds them, each to a root: a captured graph's in-place
  // update of an input (a static KV cache), whose caller replaces the input by that root.
  std::vector<std::pair<const Value*, int>> donate_to_root;
  bool bucketable = false;  // a fused flush: may run padded to a bucket of its sizes (buckets.cpp)
  Stage stage = Stage::Lowering;  // how far running it got (a failure is explained by it)
  std::vector<int64_t> replica_devices;  // set when the graph holds collectives
  // Single-process SPMD: the mesh of its roots; it compiles to one partitioned executable.
  MeshPtr mesh;
};

// Orders the pending nodes reachable from the roots (operands first), without recursion;
// values that are not pending become the parameters.
void collect_nodes(Engine::Graph* g, const std::vector<ValuePtr>& roots);
// The graph that computes `roots` on `device` (and `mesh`, if any), its nodes collected:
// how a graph is assembled from the values it must produce.
Engine::Graph graph_of(std::vector<ValuePtr> roots, int device, MeshPtr mesh, std::string origin = "");
// `nodes` side by side, each reading its operands as parameters, none donated: a node lowered
// alone when first recorded, or the suspects of a failed flush compiled together. No roots:
// give it some, or its module returns every node's results.
Engine::Graph side_by_side(const std::vector<Node*>& nodes, int device, MeshPtr mesh);

// The layout in which a partitioned graph's parameter arrives (graph_plan.cpp).
std::string argument_sharding(const Engine::Graph& g, size_t p);

// CUDA's out-of-memory message, for tpu: what did not fit, what the device holds, what to do
// (memory.cpp).
std::string out_of_memory_message(int64_t bytes, const std::string& what, int device, int64_t budget);

// Collectives (collectives.cpp): whether an op is one, and the replica set of a graph's
// collectives (empty when it has none).
bool is_collective(OpKind op);
std::vector<int64_t> replica_devices_of(const Engine::Graph& g);

}  // namespace torchtpu
