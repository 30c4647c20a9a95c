// The graph a flush compiles and runs (Engine::Graph), shared by engine.cpp and buckets.cpp.
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

}  // namespace torchtpu
