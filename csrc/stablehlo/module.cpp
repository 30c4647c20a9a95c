// Text of a module's envelope (see module.h).
#include "stablehlo/module.h"

#include <stdexcept>

namespace torchtpu {

ModuleBuilder::ModuleBuilder() {
  attributes_["mhlo.num_partitions"] = "1 : i32";
  attributes_["mhlo.num_replicas"] = "1 : i32";
}

void ModuleBuilder::set_attribute(const std::string& name, const std::string& value) { attributes_[name] = value; }

V ModuleBuilder::add_argument(const std::string& name, const TensorType& type) {
  arguments_.push_back(Argument{V{name, type}, {}});
  return arguments_.back().value;
}

namespace {

void set_in(std::vector<std::pair<std::string, std::string>>& attributes, const std::string& name,
            const std::string& value) {
  for (auto& [existing, old] : attributes) {
    if (existing == name) {
      old = value;
      return;
    }
  }
  attributes.emplace_back(name, value);
}

// " {a = 1, b = 2}", or "" for none.
std::string attribute_dictionary(const std::vector<std::pair<std::string, std::string>>& attributes) {
  if (attributes.empty()) return "";
  std::string s = " {";
  for (size_t k = 0; k < attributes.size(); ++k) s += (k ? ", " : "") + attributes[k].first + " = " + attributes[k].second;
  return s + "}";
}

}  // namespace

void ModuleBuilder::set_argument_attribute(size_t index, const std::string& name, const std::string& value) {
  if (index >= arguments_.size()) throw std::logic_error("torchtpu: attribute for a missing argument");
  set_in(arguments_[index].attributes, name, value);
}

void ModuleBuilder::set_result_attribute(size_t index, const std::string& name, const std::string& value) {
  set_in(result_attributes_[index], name, value);
}

std::string ModuleBuilder::text(const std::string& body, const std::vector<V>& results,
                                const std::string& functions) const {
  std::string s = "module @torchtpu attributes {";
  bool first = true;
  for (const auto& [name, value] : attributes_) {
    s += (first ? "" : ", ") + name + " = " + value;
    first = false;
  }
  s += "} {\n  func.func public @main(";
  for (size_t i = 0; i < arguments_.size(); ++i) {
    const Argument& a = arguments_[i];
    s += (i ? ", " : "") + a.value.name + ": " + a.value.type.mlir() + attribute_dictionary(a.attributes);
  }
  std::string values, types, signature;
  for (size_t r = 0; r < results.size(); ++r) {
    values += (r ? ", " : "") + results[r].name;
    types += (r ? ", " : "") + results[r].type.mlir();
    auto attributes = result_attributes_.find(r);
    signature += (r ? ", " : "") + results[r].type.mlir() +
                 (attributes == result_attributes_.end() ? "" : attribute_dictionary(attributes->second));
  }
  s += ") -> (" + signature + ") {\n" + body;
  s += "    \"func.return\"(" + values + ") : (" + types + ") -> ()\n  }\n" + functions + "}\n";
  return s;
}

}  // namespace torchtpu
