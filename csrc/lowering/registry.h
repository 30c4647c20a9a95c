// The table of aten-op lowerings: op kind ("aten::add.Tensor") -> emitter function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "ir/graph.h"
#include "stablehlo/builder.h"

namespace torchtpu {

using LowerFn = void (*)(LoweringContext& ctx, const Node& node);

// A set of dtypes, one bit per DType code (the dtypes a rule refuses).
using DTypeSet = uint32_t;
constexpr DTypeSet dtype_set(DType dtype) { return DTypeSet{1} << static_cast<int>(dtype); }
inline constexpr DTypeSet kBoolDTypes = dtype_set(DType::Bool);
inline constexpr DTypeSet kIntegerDTypes = dtype_set(DType::UInt8) | dtype_set(DType::Int8) | dtype_set(DType::Int16) |
                                           dtype_set(DType::Int32) | dtype_set(DType::Int64);
inline constexpr DTypeSet kFloatDTypes = dtype_set(DType::Float16) | dtype_set(DType::BFloat16) |
                                         dtype_set(DType::Float32) | dtype_set(DType::Float64);
inline constexpr DTypeSet kAllDTypes = ~DTypeSet{0};

// The dtype a rule's refusal is judged on.
enum class Judged : uint8_t {
  Result,    // its first result's: clamp(bool, min=0) is an int64 clamp and runs; clamp(bool, min=False) is refused
  Self,      // its first tensor argument's: argmax of bools gives int64 yet is refused
  Promoted,  // its tensor and Scalar arguments' promoted dtype (PyTorch's result_type), which CPU
             // computes in: pow of two bools is refused although its meta kernel gives int64
  Operands,  // each of its `self` and `other` arguments' (a Python bool is Bool): CPU's sub refuses
             // float - bool, which PyTorch's meta kernel passes
};

using RefusalFn = DTypeSet (*)(const std::vector<Arg>& args);

// A rule's family parameter (LOWERING's third argument): one enumerator of its family's enum
// (Hlo::Add for an elementwise rule, Cmp::LT for a comparison, FloatFn::Exp for a float
// function, ...) or a number (a pooling rule's spatial dims). It remembers its enum, so a
// rule reading another family's parameter fails at once, and a misspelt one does not compile.
class RuleParam {
 public:
  constexpr RuleParam() = default;
  constexpr RuleParam(std::nullptr_t) {}  // a rule without a parameter
  template <typename E>
    requires std::is_enum_v<E>
  RuleParam(E value) : family_(family_of<E>()), value_(static_cast<int>(value)) {}
  RuleParam(int value) : family_(family_of<int>()), value_(value) {}

  bool empty() const { return family_ == nullptr; }
  template <typename E>
  bool is() const { return family_ == family_of<E>(); }
  // The parameter as the family's enum (or int); throws if the rule was registered with another's.
  template <typename E>
  E as() const {
    if (!is<E>()) throw std::logic_error("torchtpu: a lowering rule read a parameter of another family");
    return static_cast<E>(value_);
  }

 private:
  // One address per type: identifies the enum a parameter came from.
  template <typename T>
  static const void* family_of() {
    static const char id = 0;
    return &id;
  }
  const void* family_ = nullptr;
  int value_ = 0;
};

// The rule's properties, declared at registration:
// LOWERING("aten::norm.Scalar", lower_vector_norm, Norm::All, RuleFlags{.static_scalars = true, .complex = true});
struct RuleFlags {
  bool static_scalars = false;  // Scalar arguments are compile-time constants (e.g. arange bounds)
  bool random = false;          // consumes the generator: a seed and an offset are appended as args
  // `float` arguments (a C++ double in the schema, not a Scalar) are lifted like Scalars: the
  // fused optimizers take their learning rate as one, and a scheduler changes it every step.
  bool lifts_floats = false;
  // Takes complex operands or gives complex results. A rule without it never sees a complex
  // tensor: such calls run through the CPU fallback, which computes them (or raises CPU's error).
  bool complex = false;
  // A collective across processes: its last arg lists the global device ids of its replicas
  // (lowering/collective.cpp); a graph holding one is compiled for those replicas.
  bool collective = false;
  // Dtypes PyTorch's CPU and CUDA kernels refuse to compute this op in (RuleFlags presets below),
  // judged on the dtype `judged_on` names. Such calls run through the CPU kernel, which raises
  // PyTorch's NotImplementedError ("\"addmm_impl_cpu_\" not implemented for 'Bool'") instead of
  // the lowering computing something PyTorch refuses, or XLA failing (XLA:CPU aborts on bool dots).
  DTypeSet refuses = 0;
  Judged judged_on = Judged::Result;
  // Dtypes refused besides those for a call with these arguments (node.args): CPU's transposed
  // and dilated convolutions refuse int32 where its direct one computes it.
  RefusalFn refuses_for = nullptr;
  // A call whose first tensor argument has no elements runs through the CPU kernel too: ops
  // whose CPU kernel raises on an empty reduction the meta kernel passes (max(), max(dim) or
  // median(dim) along an empty dim: "Expected reduction dim 0 to have non-zero size").
  bool refuses_empty = false;
  // Dtypes the op's index argument (args[index_arg]: a Tensor, or each tensor of a TensorList;
  // a mask or a class target is an index too) may not have, whatever the other arguments'. CPU's
  // kernels check them where the meta kernels do not: index_put of float indices raises
  // IndexError("tensors used as indices must be long, int, byte or bool tensors"), index_copy
  // takes int64 only. Such calls run through the CPU kernel, which raises that error.
  int index_arg = -1;
  DTypeSet index_refuses = 0;
  // Linear algebra computed in float32 / float64 only: PyTorch's CPU and CUDA kernels raise for
  // other dtypes, so the device layer sends those calls to the CPU kernel, which raises that error.
  bool float32_or_float64 = false;
  // The value itself (clone, alias_copy, detach_copy): where the result's type is the input's,
  // the device layer shares the input's value (values are immutable) and records no node.
  bool identity = false;
};

struct LoweringRule : RuleFlags {
  OpKind kind;
  LowerFn lower = nullptr;
  RuleParam param;
  // Where the rule is written, for TORCHTPU_EXPLAIN: its function's name and file, and its
  // parameter as written ("Hlo::Add"; LOWERING fills them).
  const char* function_name = "";
  const char* file = "";
  const char* param_text = "";
};

// Rules whose lowering handles complex values: LOWERING("aten::exp", lower_float_unary, FloatFn::Exp, kTakesComplex);
inline constexpr RuleFlags kTakesComplex{.complex = true};
// Rules of ops PyTorch defines for some dtypes only (see LoweringRule::refuses).
inline constexpr RuleFlags kNoBool{.refuses = kBoolDTypes};                                   // matmul, conv, abs
inline constexpr RuleFlags kComplexNoBool{.complex = true, .refuses = kBoolDTypes};
inline constexpr RuleFlags kFloatOnly{.refuses = kBoolDTypes | kIntegerDTypes};               // softmax, gelu
inline constexpr RuleFlags kIntegerOnly{.refuses = kFloatDTypes | kBoolDTypes};               // gcd, lcm
inline constexpr RuleFlags kIntegerOrBool{.refuses = kFloatDTypes};                           // bitwise ops
// avg_pool2d: CPU's kernel takes int64 (and floats) but no other integer type.
inline constexpr RuleFlags kFloatOrInt64{.refuses = kBoolDTypes | (kIntegerDTypes & ~dtype_set(DType::Int64))};
inline constexpr RuleFlags kSelfNotBool{.refuses = kBoolDTypes, .judged_on = Judged::Self};  // argmax
inline constexpr RuleFlags kSelfFloatOnly{.refuses = kBoolDTypes | kIntegerDTypes, .judged_on = Judged::Self};
inline constexpr RuleFlags kNotEmpty{.refuses_empty = true};                                 // max, min
inline constexpr RuleFlags kNoBoolNotEmpty{.refuses = kBoolDTypes, .refuses_empty = true};    // median.dim
// Index dtypes CPU's kernels refuse (LoweringRule::index_refuses), by the dtypes they take.
inline constexpr DTypeSet kIndexNotInt64 = kAllDTypes & ~dtype_set(DType::Int64);         // index_copy, put
inline constexpr DTypeSet kIndexNotInt = kIndexNotInt64 & ~dtype_set(DType::Int32);       // index_add
// index_put's indices: int64, int32 or bool masks. CPU reads a uint8 index as a mask too, but
// raises for it where it fills from a 0-d value (x[uint8_mask] = 1.0: "masked_fill_ only
// supports boolean masks"), so CPU decides every uint8 call.
inline constexpr DTypeSet kIndicesNotIntOrBool = kIndexNotInt & ~kBoolDTypes;

const LoweringRule* find_lowering(const std::string& op);
const LoweringRule* find_lowering(OpKind kind);
// The family parameter of the node's rule (LOWERING's third argument) as its family's enum:
// rule_param<FloatFn>(node).
const RuleParam& rule_param_of(const Node& node);
template <typename E>
E rule_param(const Node& node) {
  return rule_param_of(node).as<E>();
}
std::vector<std::string> lowered_ops();

// Lowers one node with its rule (operands already lowered; lifted_slots: per argument, its
// slot in the scalar packs or -1) and returns its results, checked against node.outputs.
std::vector<V> lower_node(LoweringContext& ctx, const Node& node, std::vector<V> operands,
                          std::vector<int> lifted_slots);

// Where a rule is written (LoweringRule::function_name, file, param_text).
struct RuleSource {
  const char* function_name;
  const char* file;
  const char* param_text;
};

struct RegisterLowering {
  RegisterLowering(RuleSource source, const char* op, LowerFn fn, RuleParam param = nullptr,
                   RuleFlags flags = RuleFlags{});
};

#define TORCHTPU_CONCAT_INNER(a, b) a##b
#define TORCHTPU_CONCAT(a, b) TORCHTPU_CONCAT_INNER(a, b)
#define TORCHTPU_FIRST_TEXT(first, ...) #first
// Registers a lowering at load time: LOWERING("aten::exp", lower_float_unary, FloatFn::Exp, kTakesComplex);
#define LOWERING(op, fn, ...)                                                                           \
  static ::torchtpu::RegisterLowering TORCHTPU_CONCAT(lowering_registration_, __COUNTER__)(        \
      ::torchtpu::RuleSource{#fn, __FILE__, TORCHTPU_FIRST_TEXT(__VA_ARGS__ __VA_OPT__(, ))}, op, \
      fn __VA_OPT__(, ) __VA_ARGS__)

}  // namespace torchtpu
