// Calls of imported StableHLO modules (JAX functions, Pallas kernels, jax.lax.linalg): the
// device layer registers a module's text once per input signature and records nodes
// "torchtpu::call_stablehlo"(Tensor[] inputs, str key); their lowering inlines the module.
#pragma once

#include <string>

#include "stablehlo/import.h"

namespace torchtpu {

// The op kind of a call node.
extern const char* const kCallStablehlo;

// Registers `text` (a module with a @main) under a key made of `name` and the text's hash,
// so the same text always gets the same key (and the same compiled-graph text in every
// process). Throws std::invalid_argument when the module cannot be imported.
std::string register_stablehlo_module(const std::string& name, const std::string& text);
// The module registered under `key`; throws std::logic_error for an unknown key.
const ImportedModule& registered_stablehlo_module(const std::string& key);

}  // namespace torchtpu
