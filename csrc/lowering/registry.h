// The table of aten-op lowerings: op kind ("aten::add.Tensor") -> emitter function.
#pragma once

#include <cstdint>
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
  // Dtype classes (kRefuseBool | kRefuseInteger | kRefuseFloat) that PyTorch's CPU and CUDA
  // kernels refuse to compute this op in, judged on its first result's dtype (clamp(bool, min=0)
  // is an int64 clamp and runs; clamp(bool, min=False) is refused), or on its first tensor
  // argument's with kJudgeSelf (argmax of bools gives int64 yet is refused). Such calls run through the CPU
  // fallback, whose kernel raises PyTorch's NotImplementedError ("\"addmm_impl_cpu_\" not
  // implemented for 'Bool'") instead of the lowering computing something PyTorch refuses, or
  // XLA failing (XLA:CPU aborts on bool dots).
  // kRefuseEmpty: a call whose first tensor argument has no elements runs through the CPU
  // fallback too, for ops whose CPU kernel raises on empty reductions the meta kernel passes
  // (max(), max(dim) or median(dim) along an empty dim: "Expected reduction dim 0 to have
  // non-zero size"); an empty result that CPU accepts costs nothing there.
  uint8_t refuses = 0;
};

enum : uint8_t { kRefuseBool = 1, kRefuseInteger = 2, kRefuseFloat = 4, kJudgeSelf = 8, kRefuseEmpty = 16 };

// A rule's properties, declared at registration:
// LOWERING("aten::norm.Scalar", lower_vector_norm, "all", RuleFlags{.static_scalars = true, .complex = true});
struct RuleFlags {
  bool static_scalars = false;
  bool random = false;
  bool complex = false;
  bool collective = false;
  uint8_t refuses = 0;
};
// Rules whose lowering handles complex values: LOWERING("aten::exp", lower_float_unary, "exp", kTakesComplex);
inline constexpr RuleFlags kTakesComplex{.complex = true};
// Rules of ops PyTorch defines for some dtype classes only (see LoweringRule::refuses).
inline constexpr RuleFlags kNoBool{.refuses = kRefuseBool};                            // matmul, conv, abs
inline constexpr RuleFlags kComplexNoBool{.complex = true, .refuses = kRefuseBool};
inline constexpr RuleFlags kFloatOnly{.refuses = static_cast<uint8_t>(kRefuseBool | kRefuseInteger)};       // softmax, gelu
inline constexpr RuleFlags kIntegerOnly{.refuses = static_cast<uint8_t>(kRefuseFloat | kRefuseBool)};       // gcd, lcm
inline constexpr RuleFlags kIntegerOrBool{.refuses = kRefuseFloat};                   // bitwise ops
inline constexpr RuleFlags kSelfNotBool{.refuses = static_cast<uint8_t>(kRefuseBool | kJudgeSelf)};  // argmax
inline constexpr RuleFlags kNotEmpty{.refuses = kRefuseEmpty};                       // max, min
inline constexpr RuleFlags kNoBoolNotEmpty{.refuses = static_cast<uint8_t>(kRefuseBool | kRefuseEmpty)};  // median.dim
inline constexpr RuleFlags kSelfFloatOnly{.refuses = static_cast<uint8_t>(kRefuseBool | kRefuseInteger | kJudgeSelf)};

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
