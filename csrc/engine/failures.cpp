// Failing ops: each node signature lowered alone when first met; a failed flush's culprit (bisection).
#include "engine/engine.h"

#include <stdexcept>
#include <unordered_map>

#include "engine/graph_plan.h"

namespace torchtpu {

const Engine::NodeFacts& Engine::learn_node(Node& node, const std::vector<ValuePtr>& results) {
  auto known = node_facts_.find(node.hash);
  if (known != node_facts_.end()) {
    if (known->second.failure) std::rethrow_exception(known->second.failure);
    if (known->second.checked && hooks_.python_origin) node.origin = hooks_.python_origin();
    return known->second;
  }
  if (hooks_.python_origin) node.origin = hooks_.python_origin();
  // Lowered alone, its operands as parameters: a rule that throws raises here, at the op.
  Graph alone = side_by_side({&node}, node.device, /*mesh=*/nullptr);
  alone.roots = results;
  lift_scalars(alone);
  std::vector<std::string> signature;
  std::vector<CheckSpec> checks;
  lower_graph(alone, &signature, &checks);
  NodeFacts facts;
  facts.checked = !checks.empty();
  return node_facts_.emplace(node.hash, facts).first->second;
}

std::exception_ptr Engine::explain_failure(Graph& g, Stage stage, std::exception_ptr error) {
  if (is_interrupt(error)) return error;  // Ctrl-C: no op is to blame
  if (stage == Stage::Running) {
    // The whole graph failed to run (out of memory, say). Its values stay pending, but a
    // donated argument may be gone with the failed execution: such a value can never be
    // read again, and says so instead of reading freed memory.
    for (size_t p = 0; p < g.params.size(); ++p) {
      const ValuePtr& param = g.params[p];
      if (g.aliasing.size() > p && g.aliasing[p] >= 0 && param->buffer && runtime().is_deleted(*param->buffer)) {
        param->buffer.reset();
        param->error = error;
        some_node_failed_ = true;
      }
    }
    return error;
  }
  // Lowering or compiling failed: find the op. Only ops whose signature never compiled can
  // be at fault; each is compiled alone, halving the suspects each time.
  std::vector<Node*> suspects;
  for (Node* node : g.nodes) {
    auto facts = node_facts_.find(node->hash);
    if (facts == node_facts_.end() || !facts->second.compiled) suspects.push_back(node);
  }
  std::string message;
  Node* culprit = first_failing_node(suspects, g.device, g.mesh, &message);
  if (!culprit) return error;  // no single op fails alone: the graph as a whole did
  std::string text = "torchtpu: " + culprit->op.name() + " cannot run on tpu";
  if (!culprit->origin.empty()) text += " (issued at " + culprit->origin + ")";
  text += ": " + message;
  std::exception_ptr failure = std::make_exception_ptr(std::runtime_error(text));
  culprit->error = failure;
  node_facts_[culprit->hash].failure = failure;  // recording it again raises at once
  some_node_failed_ = true;
  return failure;
}

Node* Engine::first_failing_node(const std::vector<Node*>& suspects, int device, const MeshPtr& mesh,
                                 std::string* message) {
  if (suspects.empty() || compiles_alone(suspects, device, mesh, message)) return nullptr;
  size_t low = 0, high = suspects.size();  // [low, high) holds the first failing node
  while (high - low > 1) {
    size_t mid = (low + high) / 2;
    std::vector<Node*> first_half(suspects.begin() + low, suspects.begin() + mid);
    if (compiles_alone(first_half, device, mesh, message)) low = mid;
    else high = mid;
  }
  compiles_alone({suspects[low]}, device, mesh, message);
  return suspects[low];
}

// Compiles `nodes` side by side, each reading its operands as parameters; on failure
// `message` says why.
bool Engine::compiles_alone(const std::vector<Node*>& nodes, int device, const MeshPtr& mesh, std::string* message) {
  Graph bag = side_by_side(nodes, device, mesh);
  lift_scalars(bag);
  try {
    std::vector<std::string> signature;
    std::vector<CheckSpec> checks;
    CompileOptions options;
    options.device = device;
    options.mesh = mesh;
    runtime().compile(lower_graph(bag, &signature, &checks), options);
    return true;
  } catch (const std::exception& e) {
    rethrow_if_interrupt();
    *message = e.what();
    return false;
  }
}

bool Engine::drop_failed_roots(Graph& g) {
  std::unordered_map<const Node*, std::exception_ptr> failed;
  for (Node* node : g.nodes) {  // operands first
    std::exception_ptr error = node->error;
    for (size_t i = 0; i < node->operands.size() && !error; ++i) {
      const ValuePtr& v = node->operands[i];
      if (!v->pending()) {
        error = v->error;
      } else if (auto it = failed.find(v->node.get()); it != failed.end()) {
        error = it->second;
      }
    }
    if (error) failed.emplace(node, error);
  }
  if (failed.empty()) return false;
  std::vector<ValuePtr> kept;
  for (const ValuePtr& root : g.roots) {
    auto it = failed.find(root->node.get());
    if (it == failed.end()) {
      kept.push_back(root);
    } else {
      root->error = it->second;
      root->node.reset();
    }
  }
  Graph rest = graph_of(std::move(kept), g.device, g.mesh, g.origin);
  g = std::move(rest);
  return true;
}

}  // namespace torchtpu
