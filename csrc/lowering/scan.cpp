// torchtpu::scan: a loop over a traced body (the node's Subgraph), lowered as one
// stablehlo.while so that the body is compiled once however many times it runs.
#include <unordered_map>

#include "lowering/common.h"

namespace torchtpu {
namespace {

const TensorType kIndexType{{}, DType::Int64};

// The body's nodes on the values its inputs and captured values have inside the loop;
// returns its outputs.
std::vector<V> lower_body(LoweringContext& ctx, const Subgraph& body, const std::vector<V>& inputs,
                          const std::vector<V>& captured) {
  std::unordered_map<const Value*, V> known;
  for (size_t i = 0; i < inputs.size(); ++i) known[body.inputs[i].get()] = inputs[i];
  for (size_t i = 0; i < captured.size(); ++i) known[body.captured[i].get()] = captured[i];
  std::unordered_map<const Node*, std::vector<V>> results;
  auto value_of = [&](const ValuePtr& v) -> V {
    if (auto it = known.find(v.get()); it != known.end()) return it->second;
    return results.at(v->node.get()).at(v->output_index);
  };
  for (const NodePtr& node : body.nodes) {
    std::vector<V> operands;
    for (const ValuePtr& v : node->operands) operands.push_back(value_of(v));
    results[node.get()] = lower_node(ctx, *node, std::move(operands), std::vector<int>(node->args.size(), -1));
  }
  std::vector<V> outputs;
  for (const ValuePtr& v : body.outputs) outputs.push_back(value_of(v));
  return outputs;
}

// torchtpu::scan(int n_carry, int n_xs, int length, bool reverse, Tensor[] operands)
// operands: carry (initial values), xs (stacked along dim 0, one row per step), then the
// invariants: consts and the body's captured values. The body maps (carry, x rows, consts)
// to (new carry, y rows); results: the final carry, then the ys stacked along dim 0.
// Loop state: step index, carry, ys so far, xs, invariants.
void lower_scan(LoweringContext& ctx, const Node& node) {
  const Subgraph& body = *node.body;
  const int64_t n_carry = node.args[0].i, n_xs = node.args[1].i, length = node.args[2].i;
  const bool reverse = node.args[3].i != 0;
  std::vector<V> operands = ctx.inputs(node, 4);
  const int64_t n_ys = static_cast<int64_t>(node.outputs.size()) - n_carry;
  const int64_t n_consts = static_cast<int64_t>(body.inputs.size()) - n_carry - n_xs;

  std::vector<V> init = {ctx.constant_int(0, DType::Int64)};
  init.insert(init.end(), operands.begin(), operands.begin() + n_carry);
  for (int64_t k = 0; k < n_ys; ++k) init.push_back(ctx.constant(0, ctx.out(node, n_carry + k).dtype, ctx.out(node, n_carry + k).shape));
  init.insert(init.end(), operands.begin() + n_carry, operands.end());
  std::vector<TensorType> types;
  for (const V& v : init) types.push_back(v.type);
  const int64_t ys_at = 1 + n_carry, xs_at = ys_at + n_ys, consts_at = xs_at + n_xs,
                captured_at = consts_at + n_consts;

  std::string cond = ctx.region(types, [&](const std::vector<V>& state) {
    return std::vector<V>{ctx.compare(Cmp::LT, state[0], ctx.constant_int(length, DType::Int64))};
  });
  std::string step = ctx.region(types, [&](const std::vector<V>& state) {
    V i = state[0];
    V at = reverse ? ctx.binary(Hlo::Subtract, ctx.constant_int(length - 1, DType::Int64), i) : i;
    std::vector<V> inputs(state.begin() + 1, state.begin() + ys_at);
    for (int64_t k = 0; k < n_xs; ++k) inputs.push_back(index_leading(ctx, state[xs_at + k], at));
    inputs.insert(inputs.end(), state.begin() + consts_at, state.begin() + captured_at);
    std::vector<V> captured(state.begin() + captured_at, state.end());
    std::vector<V> outputs = lower_body(ctx, body, inputs, captured);
    std::vector<V> next = {ctx.binary(Hlo::Add, i, ctx.constant_int(1, DType::Int64))};
    next.insert(next.end(), outputs.begin(), outputs.begin() + n_carry);
    for (int64_t k = 0; k < n_ys; ++k) next.push_back(update_leading(ctx, state[ys_at + k], outputs[n_carry + k], at));
    next.insert(next.end(), state.begin() + xs_at, state.end());
    return next;
  });
  std::vector<V> final_state = ctx.emit_multi(Hlo::While, init, types, "", cond + ", " + step);
  ctx.set_results(std::vector<V>(final_state.begin() + 1, final_state.begin() + xs_at));
}

LOWERING("torchtpu::scan", lower_scan);

}  // namespace
}  // namespace torchtpu
