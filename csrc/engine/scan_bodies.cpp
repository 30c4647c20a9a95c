// Tracing the body of a structured op (torchtpu.scan_layers) into a Subgraph with its structural hash.
#include "engine/engine.h"

#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "lowering/registry.h"

namespace torchtpu {

namespace {

const OpKind& body_input_kind() {
  static const OpKind kind = OpKind::intern("torchtpu::body_input");
  return kind;
}

// Where a body node reads an operand from, for the body's structural hash.
uint64_t wiring_code(const Value* v, const std::unordered_map<const Value*, int>& inputs,
                     const std::unordered_map<const Value*, int>& captured,
                     const std::unordered_map<const Node*, int>& nodes) {
  if (auto it = inputs.find(v); it != inputs.end()) return it->second * 4 + 1;
  if (auto it = captured.find(v); it != captured.end()) return it->second * 4 + 2;
  return (static_cast<uint64_t>(nodes.at(v->node.get())) * 64 + v->output_index) * 4 + 3;
}

}  // namespace

void Engine::begin_body() {
  EngineLock lock;
  if (in_body_)
    throw std::invalid_argument("torchtpu.scan_layers: a scanned layer cannot itself call scan_layers");
  in_body_ = true;
  body_first_serial_ = next_value_serial();
  body_inputs_.clear();
}

ValuePtr Engine::body_input(const TensorType& type, int device) {
  EngineLock lock;
  if (!in_body_) throw std::logic_error("torchtpu: body_input outside a body trace");
  auto node = std::make_shared<Node>();
  node->op = body_input_kind();
  node->args = {Arg::integer(static_cast<int64_t>(body_inputs_.size()))};
  node->outputs = {type};
  node->device = device;
  node->hash = hash_node(*node);
  auto value = std::make_shared<Value>();
  value->type = type;
  value->device = device;
  value->node = node;
  body_inputs_.push_back(value);
  return value;
}

void Engine::abort_body() {
  EngineLock lock;
  in_body_ = false;
  body_inputs_.clear();
}

std::shared_ptr<const Subgraph> Engine::end_body(const std::vector<ValuePtr>& outputs) {
  EngineLock lock;
  if (!in_body_) throw std::logic_error("torchtpu: end_body without begin_body");
  in_body_ = false;
  auto body = std::make_shared<Subgraph>();
  body->inputs.swap(body_inputs_);
  body->outputs = outputs;
  std::unordered_map<const Value*, int> input_index, captured_index;
  std::unordered_map<const Node*, int> node_index;
  for (size_t i = 0; i < body->inputs.size(); ++i) input_index[body->inputs[i].get()] = static_cast<int>(i);
  // A value made before the trace (a buffer, or older pending work) is captured: passed in.
  auto made_in_body = [&](const ValuePtr& v) { return v->pending() && v->serial >= body_first_serial_; };
  auto note_captured = [&](const ValuePtr& v) {
    if (input_index.count(v.get()) || captured_index.count(v.get()) || made_in_body(v)) return;
    captured_index[v.get()] = static_cast<int>(body->captured.size());
    body->captured.push_back(v);
  };
  // Depth-first from the outputs, operands first (as collect_nodes, stopping at the body's edge).
  std::vector<std::pair<NodePtr, size_t>> stack;
  std::unordered_set<const Node*> visiting;
  auto visit = [&](const ValuePtr& v) {
    note_captured(v);
    if (!made_in_body(v) || input_index.count(v.get())) return;
    if (v->node->op == body_input_kind())
      throw std::invalid_argument("torchtpu.scan_layers: the layer uses a tensor traced for another scan");
    if (node_index.count(v->node.get()) || visiting.count(v->node.get())) return;
    visiting.insert(v->node.get());
    stack.emplace_back(v->node, 0);
  };
  for (const ValuePtr& out : outputs) {
    visit(out);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->operands.size()) {
        ValuePtr operand = node->operands[next++];
        visit(operand);
        continue;
      }
      node_index[node.get()] = static_cast<int>(body->nodes.size());
      body->nodes.push_back(node);
      stack.pop_back();
    }
  }
  uint64_t h = 0x5CA9;
  for (const ValuePtr& v : body->inputs) h = hash_type(h, v->type);
  for (const ValuePtr& v : body->captured) h = hash_type(h, v->type);
  for (const NodePtr& node : body->nodes) {
    const LoweringRule* rule = find_lowering(node->op);
    if (!rule) throw std::logic_error("torchtpu: no lowering for " + node->op.name());
    if (rule->random)
      throw std::invalid_argument("torchtpu.scan_layers / StackedLayers: the layer draws random numbers (" +
                                  node->op.name() +
                                  "); random ops are not supported inside the loop yet - set dropout to 0 or run "
                                  "these layers in an ordinary loop");
    // The body's scalars are constants of its module: the loop body is compiled once.
    bool had_lifted = false;
    for (Arg& arg : node->args) had_lifted |= std::exchange(arg.lifted, false);
    if (had_lifted) node->hash = hash_node(*node);
    h = hash_mix(h, node->hash);
    for (const ValuePtr& v : node->operands) h = hash_mix(h, wiring_code(v.get(), input_index, captured_index, node_index));
  }
  for (const ValuePtr& v : outputs) h = hash_mix(h, wiring_code(v.get(), input_index, captured_index, node_index));
  body->hash = h;
  return body;
}

}  // namespace torchtpu
