// The table of aten-op lowerings: op kind ("aten::add.Tensor") -> emitter function.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace torchtpu {

class LoweringContext;

using LowerFn = void (*)(LoweringContext& ctx, const Node& node);

struct LoweringRule {
  OpKind kind;
  LowerFn lower = nullptr;
  const char* data = nullptr;   // family parameter, e.g. the StableHLO op of an elementwise rule
  bool static_scalars = false;  // Scalar arguments are compile-time constants (e.g. arange bounds)
  bool random = false;          // consumes the generator: a seed and an offset are appended as args
  // A collective across processes: its last arg lists the global device ids of its replicas
  // (lowering/collective.cpp); a graph holding one is compiled for those replicas.
  bool collective = false;
};

const LoweringRule* find_lowering(const std::string& op);
const LoweringRule* find_lowering(OpKind kind);
// The family parameter of the node's rule (LOWERING's third argument), or nullptr.
const char* rule_data(const Node& node);
std::vector<std::string> lowered_ops();

struct RegisterLowering {
  RegisterLowering(const char* op, LowerFn fn, const char* data = nullptr, bool static_scalars = false,
                   bool random = false, bool collective = false);
};

#define TORCHTPU_CONCAT_INNER(a, b) a##b
#define TORCHTPU_CONCAT(a, b) TORCHTPU_CONCAT_INNER(a, b)
// Registers a lowering at load time: LOWERING("aten::exp", lower_unary, "stablehlo.exponential");
#define LOWERING(...) \
  static ::torchtpu::RegisterLowering TORCHTPU_CONCAT(lowering_registration_, __COUNTER__)(__VA_ARGS__)

}  // namespace torchtpu
