// Meshes and shardings of single-process SPMD: a tensor whose one global value is laid out
// over several local devices, as XLA's SPMD partitioner sees it (no torch headers).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torchtpu {

// The devices one partitioned executable runs on: partition p runs on tpu:devices[p]. The
// shape and axis names are the user's (torchtpu.spmd.Mesh), kept for messages; two meshes
// with the same devices in the same order are one device assignment to XLA, so values of
// both may meet in one op (as jax allows).
struct Mesh {
  std::vector<int> devices;
  std::vector<int64_t> shape;
  std::vector<std::string> axis_names;
  // "mesh (4, 2) ('data', 'model') over tpu:0..7"
  std::string describe() const;
  bool same_devices(const Mesh& other) const { return devices == other.devices; }
};
using MeshPtr = std::shared_ptr<const Mesh>;

// How a global tensor is laid out over a mesh: XLA's tiled HloSharding. Dimension d is cut
// into tiles[d] pieces (1: whole); each tile has `replicas` copies; tile_assignment lists the
// partition holding each (tile..., copy) in row-major order, so it has mesh->devices.size()
// entries. No tiles (rank 0 or every tiles[d] = 1) with replicas = devices is "replicated".
struct Sharding {
  MeshPtr mesh;
  std::vector<int64_t> tiles;
  int64_t replicas = 1;
  std::vector<int> tile_assignment;

  static Sharding replicated(MeshPtr mesh, int64_t rank);
  // Checks the fields agree with each other and with a tensor of `rank` dimensions; throws
  // std::invalid_argument naming what is wrong.
  void validate(int64_t rank) const;
  bool is_replicated() const;
  // XLA's text: "{replicated}" or "{devices=[4,1,2]0,2,4,6,1,3,5,7 last_tile_dim_replicate}".
  std::string hlo() const;
  // The shard of a tensor of `shape` partition p holds: per dimension (offset, size). Shards
  // are ceil(size / tiles) long, the last ones shorter (or empty) when that does not divide.
  std::vector<std::pair<int64_t, int64_t>> shard_bounds(const std::vector<int64_t>& shape, int partition) const;
  // The shard's shape.
  std::vector<int64_t> shard_shape(const std::vector<int64_t>& shape, int partition) const;
  bool operator==(const Sharding& other) const;
  bool operator!=(const Sharding& other) const { return !(*this == other); }
};
using ShardingPtr = std::shared_ptr<const Sharding>;

}  // namespace torchtpu
