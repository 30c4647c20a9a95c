// torchtpu::shard: the op that lays a value out over a mesh (single-process SPMD), a sharding
// constraint XLA's partitioner honours; the engine pins the sharding of graph results it makes.
#pragma once

#include "base/sharding.h"
#include "ir/graph.h"

namespace torchtpu {

inline constexpr const char* kShardOp = "torchtpu::shard";

// The arguments of torchtpu::shard(Tensor self, int[] tiles, int replicas, int[] tile_assignment)
// for a sharding (the mesh is the node's, Node::mesh).
std::vector<Arg> shard_args(const Sharding& sharding);
// The sharding a torchtpu::shard node gives its result.
Sharding sharding_of_shard_node(const Node& node);
bool is_shard_node(const Node& node);

}  // namespace torchtpu
