// ModuleBuilder: the envelope of a StableHLO module around a function body - the module's
// attributes, the signature of @main with per-argument attributes (buffer donation,
// shardings) and its return.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "stablehlo/builder.h"

namespace torchtpu {

class ModuleBuilder {
 public:
  ModuleBuilder();  // mhlo.num_partitions = 1, mhlo.num_replicas = 1

  // Sets a module attribute, its value in MLIR syntax: ("mhlo.num_replicas", "2 : i32").
  void set_attribute(const std::string& name, const std::string& value);
  // Adds an argument to @main; the returned value is how the body reads it.
  V add_argument(const std::string& name, const TensorType& type);
  // Sets an attribute of argument `index`: (p, "tf.aliasing_output", "0 : i32") donates
  // its buffer to result 0.
  void set_argument_attribute(size_t index, const std::string& name, const std::string& value);
  size_t argument_count() const { return arguments_.size(); }
  // Sets an attribute of result `index` of @main: (0, "mhlo.sharding", "\"{replicated}\"").
  void set_result_attribute(size_t index, const std::string& name, const std::string& value);

  // The module's text: @main(arguments) -> types of `results`, with `body` (ops that
  // compute `results` from the arguments), then `functions` (definitions the body calls).
  std::string text(const std::string& body, const std::vector<V>& results, const std::string& functions = "") const;

 private:
  struct Argument {
    V value;
    std::vector<std::pair<std::string, std::string>> attributes;
  };
  std::map<std::string, std::string> attributes_;  // printed sorted by name
  std::vector<Argument> arguments_;
  std::map<size_t, std::vector<std::pair<std::string, std::string>>> result_attributes_;
};

}  // namespace torchtpu
