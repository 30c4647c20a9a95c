// Graph IR: a Value is a device tensor, either a buffer or an output of a pending Node.
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "base/buffer.h"
#include "base/types.h"
#include "ir/op_kind.h"

namespace torchtpu {

struct Node;

// One argument of an aten op, in schema order.
struct Arg {
  enum class Kind : uint8_t { None, Tensor, TensorList, Int, Double, Bool, IntList, DoubleList, BoolList, String, Complex };
  Kind kind = Kind::None;
  // A lifted scalar is fed to the compiled graph at run time instead of being baked into
  // the module text, so a changing learning rate does not recompile.
  bool lifted = false;
  int64_t i = 0;
  double d = 0.0;
  std::vector<int64_t> ints;     // IntList, BoolList (0/1), Int lifted lists
  std::vector<double> doubles;   // DoubleList; Complex: {real, imag}
  std::string s;
  std::vector<int> operands;     // Tensor: one operand index; TensorList: indices, -1 for None

  static Arg none() { return Arg{}; }
  static Arg integer(int64_t v, bool lifted = false) { Arg a; a.kind = Kind::Int; a.i = v; a.lifted = lifted; return a; }
  static Arg real(double v, bool lifted = false) { Arg a; a.kind = Kind::Double; a.d = v; a.lifted = lifted; return a; }
  static Arg boolean(bool v, bool lifted = false) { Arg a; a.kind = Kind::Bool; a.i = v; a.lifted = lifted; return a; }
  static Arg complex(double re, double im, bool lifted = false) {
    Arg a; a.kind = Kind::Complex; a.doubles = {re, im}; a.lifted = lifted; return a;
  }
  static Arg tensor(int operand) { Arg a; a.kind = Kind::Tensor; a.operands = {operand}; return a; }

  bool is_none() const { return kind == Kind::None; }
  double as_double() const {
    return kind == Kind::Double ? d : kind == Kind::Complex ? doubles[0] : static_cast<double>(i);
  }
  int64_t as_int() const { return kind == Kind::Double ? static_cast<int64_t>(d) : i; }
  bool as_bool() const { return kind == Kind::Double ? d != 0.0 : i != 0; }
  // A static (not lifted) number equal to v; a complex number only when its imaginary part is 0.
  bool is_constant(double v) const {
    if (lifted) return false;
    if (kind == Kind::Complex) return doubles[0] == v && doubles[1] == 0.0;
    return (kind == Kind::Double || kind == Kind::Int || kind == Kind::Bool) && as_double() == v;
  }
};

struct Value;
using ValuePtr = std::shared_ptr<Value>;
struct Subgraph;

// A value computed at a bucket's sizes (a fused graph run padded, engine/buckets.h): the
// buffer holds the real elements with zeros around them. Per dimension, its factors
// (outermost first) at the bucket's and at the real size, so that a dimension merging a
// padded one (a view of [B, T] as [B*T]) says where its padding lies.
struct PaddedBuffer {
  struct Factor {
    int64_t bucket = 1;
    int64_t real = 1;
  };
  BufferPtr buffer;
  std::vector<std::vector<Factor>> dims;
};

struct Node {
  OpKind op;
  std::vector<Arg> args;
  std::vector<ValuePtr> operands;
  std::vector<TensorType> outputs;
  uint64_t hash = 0;   // op, static args, operand and output types, body; not operand identity
  int device = 0;
  // The user's Python line that issued the op, kept where an error may surface after
  // recording: ops with runtime checks, and the first op of each signature (the only
  // ones a compile can newly fail on).
  std::string origin;
  // Set when the node failed to compile alone (found after its graph failed): values that
  // depend on it can never be computed, and reading them raises this.
  std::exception_ptr error;
  // The traced function a structured op (torchtpu::scan) calls; null for aten ops.
  std::shared_ptr<const Subgraph> body;
  // Single-process SPMD: the mesh its results live on (an operand's, or torchtpu::shard's);
  // null for values of one device.
  MeshPtr mesh;
  ~Node();  // releases its operands' node_uses
};
using NodePtr = std::shared_ptr<Node>;

// Values are numbered in creation order (a capture tells values made inside it from older
// state it read).
inline uint64_t next_value_serial() {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

struct Value {
  uint64_t serial = next_value_serial();
  TensorType type;
  int device = 0;
  BufferPtr buffer;     // set once computed
  // Laid out over this mesh (single-process SPMD; `device` is its first device): computed by a
  // partitioned executable, its buffer sharded. Null: a value of one device.
  MeshPtr mesh;
  // Set instead of `buffer` when a bucketed graph computed it: read through a slice (in the
  // graph that uses it, or on the host when downloaded) or carried padded into the next one.
  std::shared_ptr<const PaddedBuffer> padded;
  NodePtr node;         // set while pending
  int output_index = 0;
  // How many pending nodes use this value as an operand. A value held by nothing else is
  // an intermediate: it is not a graph output and its buffer may be donated.
  std::atomic<int> node_uses{0};
  // Set instead of a buffer when the value can never be computed (an op it depends on failed
  // to compile, or its buffer was lost to a failed execution): reading it raises this.
  std::exception_ptr error;
  // With `error`: the value's contents were dropped (its tpu storage was freed). Reading it
  // raises, but view copies of it are dropped values too: functionalization computes
  // provisional views of stale tensors, which it regenerates before any read.
  bool dropped = false;

  bool pending() const { return node != nullptr; }
  bool padded_only() const { return !node && !buffer && padded; }
};

// A function traced once and called by a structured op (torchtpu::scan, see
// lowering/scan.cpp): its nodes in topological order read `inputs` (placeholder values made
// for the trace) and `captured` (values from outside the trace, passed in unchanged).
struct Subgraph {
  std::vector<ValuePtr> inputs;
  std::vector<ValuePtr> captured;
  std::vector<NodePtr> nodes;
  std::vector<ValuePtr> outputs;
  uint64_t hash = 0;  // structure: node hashes, wiring, input and captured types
};

uint64_t hash_node(const Node& node);
// The part of hash_node its inputs decide (op, arguments, operand types): the key of the
// output types a node will have, computed before the node exists.
uint64_t hash_node_inputs(const OpKind& op, const std::vector<Arg>& args, const std::vector<ValuePtr>& operands);
// What a hash sees of sizes: all of them, or none (int arguments and int lists' values are
// left out; a shape bucket's SizePlan relates them).
enum class Sizes { Hashed, Ignored };
uint64_t hash_args(uint64_t h, const std::vector<Arg>& args, Sizes sizes);
// A node without its sizes, for shape buckets (engine/buckets.cpp): op, arguments but ints,
// output dtypes and ranks, body. Operands are left to the caller (it hashes their wiring).
uint64_t hash_node_structure(const Node& node);

}  // namespace torchtpu
