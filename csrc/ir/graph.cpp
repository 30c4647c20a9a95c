// Structural hashes of a node: op, static arguments, operand and output types (with or without sizes).
#include "ir/graph.h"

#include <cstring>

namespace torchtpu {

Node::~Node() {
  for (const ValuePtr& v : operands) v->node_uses.fetch_sub(1);
}

uint64_t hash_args(uint64_t h, const std::vector<Arg>& args, Sizes sizes) {
  for (const Arg& a : args) {
    h = hash_mix(h, static_cast<uint64_t>(a.kind) * 2 + a.lifted);
    if (a.lifted) {
      h = hash_mix(h, a.ints.size() + a.doubles.size());  // list length is structural
      continue;
    }
    switch (a.kind) {
      case Arg::Kind::Int:
        if (sizes == Sizes::Hashed) h = hash_mix(h, static_cast<uint64_t>(a.i));
        break;
      case Arg::Kind::Bool: h = hash_mix(h, static_cast<uint64_t>(a.i)); break;
      case Arg::Kind::Double: {
        uint64_t bits;
        std::memcpy(&bits, &a.d, sizeof(bits));
        h = hash_mix(h, bits);
        break;
      }
      case Arg::Kind::IntList: case Arg::Kind::BoolList:
        h = hash_mix(h, a.ints.size());
        if (sizes == Sizes::Hashed || a.kind == Arg::Kind::BoolList)
          for (int64_t v : a.ints) h = hash_mix(h, static_cast<uint64_t>(v));
        break;
      case Arg::Kind::DoubleList: case Arg::Kind::Complex:
        h = hash_bytes(h, a.doubles.data(), a.doubles.size() * sizeof(double));
        break;
      case Arg::Kind::String: h = hash_string(h, a.s); break;
      case Arg::Kind::Tensor: case Arg::Kind::TensorList:
        h = hash_mix(h, a.operands.size() * 2 + static_cast<uint64_t>(a.i));
        for (int index : a.operands) h = hash_mix(h, static_cast<uint64_t>(index + 7));
        break;
      case Arg::Kind::None: break;
    }
  }
  return h;
}

uint64_t hash_node_inputs(const OpKind& op, const std::vector<Arg>& args, const std::vector<ValuePtr>& operands) {
  uint64_t h = hash_args(op.hash(), args, Sizes::Hashed);
  for (const ValuePtr& v : operands) h = hash_type(h, v->type);
  return h;
}

uint64_t hash_node(const Node& node) {
  uint64_t h = hash_node_inputs(node.op, node.args, node.operands);
  for (const TensorType& t : node.outputs) h = hash_type(h, t);
  if (node.body) h = hash_mix(h, node.body->hash);
  return h;
}

uint64_t hash_node_structure(const Node& node) {
  uint64_t h = hash_args(node.op.hash(), node.args, Sizes::Ignored);
  for (const TensorType& t : node.outputs) h = hash_mix(hash_mix(h, static_cast<uint64_t>(t.dtype)), t.shape.size());
  if (node.body) h = hash_mix(h, node.body->hash);
  return h;
}

}  // namespace torchtpu
