// Storage of the lowering table; rules register themselves from each lowering file.
#include "lowering/registry.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace torchtpu {
namespace {
std::unordered_map<std::string, LoweringRule>& table() {
  static std::unordered_map<std::string, LoweringRule> rules;
  return rules;
}
}  // namespace

RegisterLowering::RegisterLowering(const char* op, LowerFn fn, const char* data, bool static_scalars,
                                   bool random) {
  auto& rules = table();
  if (rules.count(op)) throw std::logic_error(std::string("torchtpu: two lowerings for ") + op);
  rules[op] = LoweringRule{op, fn, data, static_scalars, random};
}

const LoweringRule* find_lowering(const std::string& op) {
  auto& rules = table();
  auto it = rules.find(op);
  return it == rules.end() ? nullptr : &it->second;
}

std::vector<std::string> lowered_ops() {
  std::vector<std::string> names;
  for (auto& [name, rule] : table()) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace torchtpu
