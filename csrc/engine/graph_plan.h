// The graph a flush compiles and runs (Engine::Graph) and the helpers the engine's files share.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace torchtpu {

// Positions of a graph's nodes or parameters, keyed by pointer. A strict-mode graph has one
// node and a few parameters, and one is assembled per op: up to kInline entries live inline
// and are searched in order (no allocation, no hashing); beyond that an open-addressing table.
// Unlike std::unordered_map, a reference into it is valid only until the next insertion.
template <typename T>
class PointerIndex {
 public:
  struct Entry {
    const T* first = nullptr;
    int second = 0;
  };
  size_t size() const { return size_; }
  void clear() {
    size_ = 0;
    table_.clear();
  }
  // The entry of `key`, or end() (nullptr).
  const Entry* find(const T* key) const {
    if (table_.empty()) {
      for (size_t i = 0; i < size_; ++i)
        if (inline_[i].first == key) return &inline_[i];
      return nullptr;
    }
    size_t mask = table_.size() - 1;
    for (size_t i = slot_of(key) & mask;; i = (i + 1) & mask) {
      if (table_[i].first == key) return &table_[i];
      if (!table_[i].first) return nullptr;
    }
  }
  const Entry* end() const { return nullptr; }
  size_t count(const T* key) const { return find(key) ? 1 : 0; }
  int at(const T* key) const {
    const Entry* entry = find(key);
    if (!entry) throw std::out_of_range("torchtpu: a value or node that is not part of the graph");
    return entry->second;
  }
  int& operator[](const T* key) { return insert(key, 0).first->second; }
  // Inserts (key, value) unless key is present; whether it inserted.
  bool emplace(const T* key, int value) { return insert(key, value).second; }

 private:
  static constexpr size_t kInline = 8;
  std::pair<Entry*, bool> insert(const T* key, int value) {
    if (const Entry* present = find(key)) return {const_cast<Entry*>(present), false};
    if (table_.empty() && size_ < kInline) {
      inline_[size_] = Entry{key, value};
      return {&inline_[size_++], true};
    }
    if ((size_ + 1) * 2 > table_.size()) grow();
    Entry* entry = place(key);
    entry->second = value;
    ++size_;
    return {entry, true};
  }
  void grow() {
    std::vector<Entry> old = std::move(table_);
    table_.assign(old.empty() ? 4 * kInline : old.size() * 2, Entry{});
    if (old.empty()) {
      for (size_t i = 0; i < size_; ++i) place(inline_[i].first)->second = inline_[i].second;
    } else {
      for (const Entry& e : old)
        if (e.first) place(e.first)->second = e.second;
    }
  }
  // The free slot for an absent key (the table is at most half full).
  Entry* place(const T* key) {
    size_t mask = table_.size() - 1;
    size_t i = slot_of(key) & mask;
    while (table_[i].first) i = (i + 1) & mask;
    table_[i].first = key;
    return &table_[i];
  }
  static size_t slot_of(const T* key) {
    uint64_t x = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(key));
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return static_cast<size_t>(x);
  }
  Entry inline_[kInline];
  size_t size_ = 0;
  std::vector<Entry> table_;  // empty while the entries fit inline; a power of two in size
};

// A graph ready to compile and run: its nodes in topological order, the buffers it reads
// (parameters), the values it produces (roots) and its structural hash.
struct Engine::Graph {
  int device = 0;
  std::vector<Node*> nodes;
  PointerIndex<Node> node_index;
  std::vector<ValuePtr> params;
  PointerIndex<Value> param_index;
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

// Mixes into h the graph's wiring: each node's node_hash and where its operands come from (a
// node's output or a parameter), then its roots. The one walk both of a graph's hashes take:
// Engine::hash_graph's (node hashes, the memory cache's key) and the bucket structure's
// (hash_node_structure, blind to sizes; buckets.cpp).
uint64_t hash_wiring(uint64_t h, const Engine::Graph& g, uint64_t (*node_hash)(const Node&));

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
