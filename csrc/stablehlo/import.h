// Imports a StableHLO module written elsewhere (jax.jit(fn).lower(...).as_text()) so graphs can
// call it: its functions are renamed under a prefix and made private, so several imported
// modules (and several calls of one) coexist in one torchtpu module; XLA inlines the calls.
#pragma once

#include <string>
#include <vector>

#include "base/types.h"

namespace torchtpu {

struct ImportedModule {
  std::string entry;                     // the renamed @main: "prefix_main"
  std::string definitions;               // its functions' text, renamed and private
  std::vector<TensorType> arguments;     // @main's signature
  std::vector<TensorType> results;
};

// Parses `text` (one `module` whose top-level ops are func.func definitions, one of them
// @main) and renames every function it defines to prefix + name. Throws
// std::invalid_argument naming what it cannot import (other top-level ops, tokens,
// dynamic or unsupported element types).
ImportedModule import_module(const std::string& text, const std::string& prefix);

// "tensor<2x3xf32>" -> float32[2, 3]; throws std::invalid_argument for anything else.
TensorType parse_tensor_type(const std::string& text);

}  // namespace torchtpu
