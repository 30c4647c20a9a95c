// Registry of imported StableHLO modules and the lowering of their calls (see stablehlo_call.h).
#include "lowering/stablehlo_call.h"

#include <cctype>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "lowering/common.h"

namespace torchtpu {

const char* const kCallStablehlo = "torchtpu::call_stablehlo";

namespace {

struct Registry {
  std::mutex mutex;
  // Never shrinks: one entry per (function, input signature), like the executable caches.
  std::unordered_map<std::string, std::unique_ptr<ImportedModule>> modules;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: lowerings may run during teardown
  return *r;
}

// A name that reads well inside a symbol: letters, digits and '_' only.
std::string symbol_safe(const std::string& name) {
  std::string out;
  for (char c : name) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out.empty() ? "fn" : out;
}

// "torchtpu::call_stablehlo"(Tensor[] inputs, str key): the module's functions join the
// graph's module once, and the node becomes a call of its @main.
void lower_call_stablehlo(LoweringContext& ctx, const Node& node) {
  const std::string& key = node.args.at(1).s;
  const ImportedModule& module = registered_stablehlo_module(key);
  std::vector<V> inputs = ctx.inputs(node, 0);
  if (inputs.size() != module.arguments.size())
    throw std::logic_error("torchtpu: " + key + " takes " + std::to_string(module.arguments.size()) +
                           " tensors, the call passed " + std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].type != module.arguments[i])
      throw std::logic_error("torchtpu: argument " + std::to_string(i) + " of " + key + " is " +
                             module.arguments[i].str() + ", the call passed " + inputs[i].type.str());
  ctx.define_functions(key, module.definitions);
  ctx.set_results(ctx.call(module.entry, inputs, module.results));
}

LOWERING(kCallStablehlo, lower_call_stablehlo);

}  // namespace

std::string register_stablehlo_module(const std::string& name, const std::string& text) {
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(hash_string(0x5EED, text)));
  std::string key = symbol_safe(name) + "_" + hash;
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.modules.count(key)) return key;
  }
  auto module = std::make_unique<ImportedModule>(import_module(text, key + "_"));
  std::lock_guard<std::mutex> lock(r.mutex);
  r.modules.emplace(key, std::move(module));
  return key;
}

const ImportedModule& registered_stablehlo_module(const std::string& key) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.modules.find(key);
  if (it == r.modules.end()) throw std::logic_error("torchtpu: no StableHLO module registered as " + key);
  return *it->second;
}

}  // namespace torchtpu
