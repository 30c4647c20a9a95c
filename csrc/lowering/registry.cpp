// Storage of the lowering table; rules register themselves from each lowering file (at load
// time, before any lookup).
#include "lowering/registry.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace torchtpu {
namespace {

struct Table {
  std::unordered_map<std::string, std::unique_ptr<LoweringRule>> by_name;
  std::vector<const LoweringRule*> by_kind;  // indexed by OpKind::id()
};

Table& table() {
  static Table* rules = new Table();  // never destroyed: lookups may run during teardown
  return *rules;
}

void add_rule(const LoweringRule& rule) {
  Table& t = table();
  auto& slot = t.by_name[rule.kind.name()];
  if (slot) throw std::logic_error("torchtpu: two lowerings for " + rule.kind.name());
  slot.reset(new LoweringRule(rule));
  uint32_t id = slot->kind.id();
  if (t.by_kind.size() <= id) t.by_kind.resize(id + 1, nullptr);
  t.by_kind[id] = slot.get();
}

}  // namespace

RegisterLowering::RegisterLowering(RuleSource source, const char* op, LowerFn fn, const char* data,
                                   bool static_scalars, bool random) {
  LoweringRule rule{OpKind::intern(op), fn, data, static_scalars, random};
  rule.function_name = source.function_name;
  rule.file = source.file;
  add_rule(rule);
}

RegisterLowering::RegisterLowering(RuleSource source, const char* op, LowerFn fn, const char* data,
                                   RuleFlags flags) {
  LoweringRule rule{OpKind::intern(op), fn, data, flags.static_scalars, flags.random};
  rule.function_name = source.function_name;
  rule.file = source.file;
  rule.lifts_floats = flags.lifts_floats;
  rule.complex = flags.complex;
  rule.collective = flags.collective;
  rule.refuses = flags.refuses;
  rule.judged_on = flags.judged_on;
  rule.refuses_for = flags.refuses_for;
  rule.refuses_empty = flags.refuses_empty;
  rule.index_arg = flags.index_arg;
  rule.index_refuses = flags.index_refuses;
  add_rule(rule);
}

const LoweringRule* find_lowering(const std::string& op) {
  Table& t = table();
  auto it = t.by_name.find(op);
  return it == t.by_name.end() ? nullptr : it->second.get();
}

const LoweringRule* find_lowering(OpKind kind) {
  Table& t = table();
  return kind.id() < t.by_kind.size() ? t.by_kind[kind.id()] : nullptr;
}

const char* rule_data(const Node& node) {
  const LoweringRule* rule = find_lowering(node.op);
  return rule ? rule->data : nullptr;
}

std::vector<std::string> lowered_ops() {
  std::vector<std::string> names;
  for (auto& [name, rule] : table().by_name) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<V> lower_node(LoweringContext& ctx, const Node& node, std::vector<V> operands,
                          std::vector<int> lifted_slots) {
  const LoweringRule* rule = find_lowering(node.op);
  if (!rule) throw std::logic_error("torchtpu: no lowering for " + node.op.name());
  ctx.begin_node(node, std::move(operands), std::move(lifted_slots));
  rule->lower(ctx, node);
  return ctx.finish_node(node);
}

}  // namespace torchtpu
