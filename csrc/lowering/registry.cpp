// Storage of the lowering table; rules register themselves from each lowering file (at load
// time, before any lookup).
#include "lowering/registry.h"

#include <algorithm>
#include <cstring>
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

RegisterLowering::RegisterLowering(RuleSource source, const char* op, LowerFn fn, RuleParam param,
                                   RuleFlags flags) {
  LoweringRule rule;
  static_cast<RuleFlags&>(rule) = flags;
  rule.kind = OpKind::intern(op);
  rule.lower = fn;
  rule.param = param;
  rule.function_name = source.function_name;
  rule.file = source.file;
  // "nullptr": a rule without a parameter, given only to pass flags.
  rule.param_text = std::strcmp(source.param_text, "nullptr") == 0 ? "" : source.param_text;
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

const RuleParam& rule_param_of(const Node& node) {
  const LoweringRule* rule = find_lowering(node.op);
  if (!rule) throw std::logic_error("torchtpu: no lowering for " + node.op.name());
  return rule->param;
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
