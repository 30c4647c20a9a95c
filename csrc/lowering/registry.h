// The table of aten-op lowerings: op kind ("aten::add.Tensor") -> emitter function.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "stablehlo/builder.h"

namespace torchtpu {

using LowerFn = void (*)(LoweringContext& ctx, const Node& node);

struct LoweringRule {
  OpKind kind;
  LowerFn lower = nullptr;
  const char* data = nullptr;   // family parameter, e.g. the StableHLO op of an elementwise rule
  bool static_scalars = false;  // Scalar arguments are compile-time constants (e.g. arange bounds)
  bool random = false;          // consumes the generator: a seed and an offset are appended as args
  // Takes complex operands or gives complex results. A rule without it never sees a complex
  // tensor: such calls run through the CPU fallback, which computes them (or raises CPU's error).
  bool complex = false;
  // A collective across processes: its last arg lists the global device ids of its replicas
  // (lowering/collective.cpp); a graph holding one is compiled for those replicas.
  bool collective = false;
  // Integer and bool dtypes only (bitwise ops, gcd): calls with floating results run through
  // the CPU fallback, whose kernel raises PyTorch's NotImplementedError ("... not implemented
  // for 'Float'") instead of the lowering computing something PyTorch refuses.
  bool integral = false;
};

// A rule's properties, declared at registration:
// LOWERING("aten::norm.Scalar", lower_vector_norm, "all", RuleFlags{.static_scalars = true, .complex = true});
struct RuleFlags {
  bool static_scalars = false;
  bool random = false;
  bool complex = false;
  bool collective = false;
  bool integral = false;
};
// Rules whose lowering handles complex values: LOWERING("aten::exp", lower_float_unary, "exp", kTakesComplex);
inline constexpr RuleFlags kTakesComplex{.complex = true};
// Rules of integer/bool-only ops: LOWERING("aten::gcd", lower_gcd_lcm, "gcd", kIntegral);
inline constexpr RuleFlags kIntegral{.integral = true};

const LoweringRule* find_lowering(const std::string& op);
const LoweringRule* find_lowering(OpKind kind);
// The family parameter of the node's rule (LOWERING's third argument), or nullptr.
const char* rule_data(const Node& node);
std::vector<std::string> lowered_ops();

// Lowers one node with its rule (operands already lowered; lifted_slots: per argument, its
// slot in the scalar packs or -1) and returns its results, checked against node.outputs.
std::vector<V> lower_node(LoweringContext& ctx, const Node& node, std::vector<V> operands,
                          std::vector<int> lifted_slots);

struct RegisterLowering {
  RegisterLowering(const char* op, LowerFn fn, const char* data = nullptr, bool static_scalars = false,
                   bool random = false);
  RegisterLowering(const char* op, LowerFn fn, const char* data, RuleFlags flags);
};

#define TORCHTPU_CONCAT_INNER(a, b) a##b
#define TORCHTPU_CONCAT(a, b) TORCHTPU_CONCAT_INNER(a, b)
// Registers a lowering at load time: LOWERING("aten::exp", lower_unary, "stablehlo.exponential");
#define LOWERING(...) \
  static ::torchtpu::RegisterLowering TORCHTPU_CONCAT(lowering_registration_, __COUNTER__)(__VA_ARGS__)

}  // namespace torchtpu
