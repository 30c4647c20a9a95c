// Meshes and shardings (see sharding.h).
#include "base/sharding.h"

#include <algorithm>
#include <stdexcept>

namespace torchtpu {

std::string Mesh::describe() const {
  std::string s = "mesh (";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  s += shape.size() == 1 ? ",) (" : ") (";
  for (size_t i = 0; i < axis_names.size(); ++i) s += (i ? ", '" : "'") + axis_names[i] + "'";
  s += axis_names.size() == 1 ? ",)" : ")";
  bool consecutive = !devices.empty();
  for (size_t i = 1; i < devices.size(); ++i) consecutive &= devices[i] == devices[i - 1] + 1;
  if (consecutive && devices.size() > 1) {
    s += " over tpu:" + std::to_string(devices.front()) + ".." + std::to_string(devices.back());
  } else {
    s += " over tpu:";
    for (size_t i = 0; i < devices.size(); ++i) s += (i ? "," : "") + std::to_string(devices[i]);
  }
  return s;
}

Sharding Sharding::replicated(MeshPtr mesh, int64_t rank) {
  Sharding s;
  s.tiles.assign(static_cast<size_t>(rank), 1);
  s.replicas = static_cast<int64_t>(mesh->devices.size());
  for (size_t p = 0; p < mesh->devices.size(); ++p) s.tile_assignment.push_back(static_cast<int>(p));
  s.mesh = std::move(mesh);
  return s;
}

void Sharding::validate(int64_t rank) const {
  if (!mesh || mesh->devices.empty()) throw std::invalid_argument("torchtpu: a sharding needs a mesh of devices");
  if (static_cast<int64_t>(tiles.size()) != rank)
    throw std::invalid_argument("torchtpu: a sharding for " + std::to_string(tiles.size()) +
                                " dimensions given to a tensor of " + std::to_string(rank));
  int64_t count = replicas;
  for (int64_t t : tiles) {
    if (t < 1) throw std::invalid_argument("torchtpu: a sharding cuts a dimension into " + std::to_string(t) + " pieces");
    count *= t;
  }
  int64_t n = static_cast<int64_t>(mesh->devices.size());
  if (replicas < 1 || count != n || static_cast<int64_t>(tile_assignment.size()) != n)
    throw std::invalid_argument("torchtpu: a sharding's tiles and copies (" + std::to_string(count) +
                                ") do not cover the " + std::to_string(n) + " devices of " + mesh->describe());
  std::vector<bool> seen(static_cast<size_t>(n), false);
  for (int p : tile_assignment) {
    if (p < 0 || p >= n || seen[static_cast<size_t>(p)])
      throw std::invalid_argument("torchtpu: a sharding's tile assignment is not a permutation of the mesh's partitions");
    seen[static_cast<size_t>(p)] = true;
  }
}

bool Sharding::is_replicated() const {
  return std::all_of(tiles.begin(), tiles.end(), [](int64_t t) { return t == 1; });
}

std::string Sharding::hlo() const {
  if (is_replicated()) return "{replicated}";
  std::string s = "{devices=[";
  for (size_t d = 0; d < tiles.size(); ++d) s += (d ? "," : "") + std::to_string(tiles[d]);
  if (replicas > 1) s += "," + std::to_string(replicas);
  s += "]";
  for (size_t i = 0; i < tile_assignment.size(); ++i) s += (i ? "," : "") + std::to_string(tile_assignment[i]);
  if (replicas > 1) s += " last_tile_dim_replicate";
  return s + "}";
}

std::vector<std::pair<int64_t, int64_t>> Sharding::shard_bounds(const std::vector<int64_t>& shape, int partition) const {
  auto at = std::find(tile_assignment.begin(), tile_assignment.end(), partition);
  if (at == tile_assignment.end()) throw std::logic_error("torchtpu: partition " + std::to_string(partition) + " holds no tile");
  int64_t flat = (at - tile_assignment.begin()) / replicas;  // row-major over tiles, the copy index dropped
  std::vector<std::pair<int64_t, int64_t>> out(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    int64_t index = flat % tiles[k];
    flat /= tiles[k];
    int64_t length = (shape[k] + tiles[k] - 1) / tiles[k];
    int64_t begin = std::min(shape[k], index * length);
    out[k] = {begin, std::min(shape[k], begin + length) - begin};
  }
  return out;
}

std::vector<int64_t> Sharding::shard_shape(const std::vector<int64_t>& shape, int partition) const {
  std::vector<int64_t> out;
  for (auto [offset, size] : shard_bounds(shape, partition)) out.push_back(size);
  return out;
}

bool Sharding::operator==(const Sharding& other) const {
  bool meshes = mesh == other.mesh || (mesh && other.mesh && mesh->same_devices(*other.mesh));
  if (!meshes || is_replicated() != other.is_replicated()) return false;
  if (is_replicated()) return true;
  return tiles == other.tiles && replicas == other.replicas && tile_assignment == other.tile_assignment;
}

}  // namespace torchtpu
