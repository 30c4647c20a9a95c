// LoweringContext: writes the body of one StableHLO function as text, op by op (the module
// around it comes from ModuleBuilder, stablehlo/module.h).
// Lowerings call its helpers; everything is emitted in MLIR's generic form so the text is
// uniform, deterministic and easy to diff.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace torchtpu {

// The ops lowerings emit (StableHLO's, and CHLO's decompositions that XLA expands): one
// enumerator per op, spelled by hlo_name from one mnemonic table, so a misspelt op is a
// compile error instead of an XLA parse error for the whole module.
enum class Hlo : uint8_t {
  Abs, Add, AllGather, AllReduce, AllToAll, And, Atan2, BitcastConvert, BroadcastInDim, Ceil,
  Cholesky, CollectivePermute, Compare, Complex, Concatenate, Constant, Convert, Convolution, Cosine,
  CountLeadingZeros, CustomCall, Divide, DotGeneral, DynamicSlice, DynamicUpdateSlice, Exponential,
  ExponentialMinusOne, Fft, Floor, Gather, If, Imag, Iota, IsFinite, Log, LogPlusOne, Logistic,
  Maximum, Minimum, Multiply, Negate, Not, OptimizationBarrier, Or, Pad, Power, Real, Reduce,
  ReducePrecision, ReduceScatter, ReduceWindow, Remainder, Reshape, Return, Reverse, RngBitGenerator,
  RoundNearestEven, Rsqrt, Scatter, Select, ShiftLeft, ShiftRightArithmetic, ShiftRightLogical, Sign,
  Sine, Slice, Sort, Sqrt, Subtract, Tan, Tanh, Transpose, TriangularSolve, While, Xor, ChloAcos,
  ChloAcosh, ChloAsin, ChloAsinh, ChloAtan, ChloAtanh, ChloCosh, ChloDigamma, ChloErf, ChloErfInv,
  ChloErfc, ChloLgamma, ChloSinh,
};
const char* hlo_name(Hlo op);  // Hlo::Add -> "stablehlo.add"

// A comparison direction of stablehlo.compare.
enum class Cmp : uint8_t { EQ, NE, LT, LE, GT, GE };
const char* cmp_name(Cmp direction);  // Cmp::LT -> "LT"

// An SSA value of the function being built.
struct V {
  std::string name;
  TensorType type;
};

std::string format_dims(const std::vector<int64_t>& dims);  // "array<i64: 0, 1>"
std::string format_list(const std::vector<int64_t>& dims);  // "[0, 1]"

// Dimension numbers of stablehlo.gather / scatter / dot_general as typed fields; attribute()
// prints them as StableHLO's pretty form does (an empty list of gather and scatter is left
// out, dot_general lists all four).
struct GatherDimensionNumbers {
  std::vector<int64_t> offset_dims, collapsed_slice_dims, start_index_map;
  int64_t index_vector_dim = 0;
  std::string attribute() const;  // "#stablehlo.gather<...>"
};
struct ScatterDimensionNumbers {
  std::vector<int64_t> update_window_dims, inserted_window_dims, scatter_dims_to_operand_dims;
  int64_t index_vector_dim = 0;
  std::string attribute() const;  // "#stablehlo.scatter<...>"
};
struct DotDimensionNumbers {
  std::vector<int64_t> lhs_batching, rhs_batching, lhs_contracting, rhs_contracting;
  std::string attribute() const;  // "#stablehlo.dot<...>"
};
// Which dims of stablehlo.convolution's input, kernel and output are the batch, the features
// and the spatial dims (StableHLO's field names). attribute() prints the compact form: one
// list per operand, each dim named by its role ("b", "f"; "i", "o") or its spatial index.
// The roles default to PyTorch's layout: [N, C, spatial...] input and output, [O, I, ...] kernel.
struct ConvDimensionNumbers {
  int64_t input_batch_dimension = 0, input_feature_dimension = 1;
  std::vector<int64_t> input_spatial_dimensions;
  int64_t kernel_input_feature_dimension = 1, kernel_output_feature_dimension = 0;
  std::vector<int64_t> kernel_spatial_dimensions;
  int64_t output_batch_dimension = 0, output_feature_dimension = 1;
  std::vector<int64_t> output_spatial_dimensions;
  std::string attribute() const;  // "#stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>"
};

// A condition a lowering cannot decide while compiling (an index out of range, an integer
// division by zero). The graph computes it; the engine reads it when the host next waits for
// the graph's results and raises what PyTorch's CPU kernel raises (engine/checks.h).
struct RuntimeCheck {
  enum class Error : uint8_t { Index, Runtime, Value };  // IndexError, RuntimeError, ValueError
  Error error = Error::Runtime;
  std::string message;  // as CPU words it; "{}" stands for the reported value
};

class LoweringContext {
 public:
  // --- set up by the graph builder -------------------------------------------------------
  // lifted_slots: per argument, its first slot in the scalar packs; empty when the graph has
  // no packs (every scalar argument is then a constant) or the node no lifted argument.
  void begin_node(const Node& node, std::vector<V> operands, std::vector<int> lifted_slots);
  std::vector<V> finish_node(const Node& node);
  void set_scalar_packs(V floats, V ints) { float_pack_ = std::move(floats); int_pack_ = std::move(ints); }
  V parameter(const std::string& name, const TensorType& type) { return V{name, type}; }
  // Whether the platform computes in float64 (TPUs do not): lowerings that follow a CPU
  // kernel's double accumulation use it where it exists.
  void set_has_float64(bool value) { has_float64_ = value; }
  bool has_float64() const { return has_float64_; }
  const std::string& body() const { return body_; }
  // Functions the body calls, defined beside @main (ModuleBuilder::text places them).
  const std::string& functions() const { return functions_; }

  // --- inputs of the current node ----------------------------------------------------------
  V input(const Node& node, int arg) const;                      // Tensor argument
  bool has_input(const Node& node, int arg) const;               // Tensor argument present (not None)
  std::vector<V> inputs(const Node& node, int arg) const;        // TensorList argument (None skipped)
  V scalar(const Node& node, int arg, DType dtype);              // Scalar/number argument as a 0-d value
  V scalar_at(const Node& node, int arg, size_t index, DType dtype);  // element of a lifted list
  const TensorType& out(const Node& node, int index = 0) const { return node.outputs[index]; }

  // --- results of the current node ----------------------------------------------------------
  void set_result(V value) { results_ = {std::move(value)}; }
  void set_results(std::vector<V> values) { results_ = std::move(values); }

  // --- runtime checks -----------------------------------------------------------------------
  // Fails the current node at run time where `failed` (bool, any shape) is true. `value`
  // (an integer tensor of failed's shape, or V{} for none) is what the message reports in
  // place of "{}": the first failing element's, in row-major order.
  void check(const V& failed, const V& value, RuntimeCheck check);
  struct EmittedCheck {
    const Node* node;
    RuntimeCheck check;
    V flag;  // tensor<2xi64>: (failed, value)
  };
  const std::vector<EmittedCheck>& checks() const { return checks_; }

  // --- emission ---------------------------------------------------------------------------
  // Emits `%r = "op"(operands) {attrs} : (types) -> result` and returns %r.
  V emit(Hlo op, const std::vector<V>& operands, const TensorType& result, const std::string& attrs = "",
         const std::string& regions = "");
  std::vector<V> emit_multi(Hlo op, const std::vector<V>& operands, const std::vector<TensorType>& results,
                            const std::string& attrs = "", const std::string& regions = "");
  // A region with one block taking scalar tensors of `arg_types`; `body` receives the block
  // arguments and returns the values to yield.
  template <typename F>
  std::string region(const std::vector<TensorType>& arg_types, F body);
  std::string fresh_name();
  // stablehlo.while over loop-carried values: `cond` maps them to a 0-d bool (keep going),
  // `body` to their next values (same types). Returns the final values.
  template <typename C, typename B>
  std::vector<V> while_loop(const std::vector<V>& init, C cond, B body);
  // Adds function definitions to the module, once per key (several calls share them).
  void define_functions(const std::string& key, const std::string& definitions);
  // "func.call" of a function defined with define_functions.
  std::vector<V> call(const std::string& function, const std::vector<V>& operands,
                      const std::vector<TensorType>& results);

  // --- helpers ----------------------------------------------------------------------------
  V constant(double value, DType dtype, const std::vector<int64_t>& shape = {});
  V constant_int(int64_t value, DType dtype, const std::vector<int64_t>& shape = {});
  V constant_complex(double real, double imag, DType dtype, const std::vector<int64_t>& shape = {});
  // PyTorch's casts: complex -> real keeps the real part, nonzero -> true for bool.
  V convert(const V& x, DType dtype);
  // Parts of a complex value (a real x is its own real part, with a zero imaginary part).
  V real_part(const V& x);
  V imag_part(const V& x);
  V make_complex(const V& real, const V& imag);  // real and imag: same float type
  V conj(const V& x);                            // identity on real values
  V reshape(const V& x, const std::vector<int64_t>& shape);
  V broadcast_in_dim(const V& x, const std::vector<int64_t>& shape, const std::vector<int64_t>& dims);
  V broadcast_to(const V& x, const std::vector<int64_t>& shape);  // numpy rules, right-aligned
  V transpose(const V& x, const std::vector<int64_t>& permutation);
  V slice(const V& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
          const std::vector<int64_t>& strides);
  V concatenate(const std::vector<V>& xs, int64_t dim);
  // Elementwise ops. Their operands must have one type (select: a bool predicate of their
  // shape, or 0-d); a lowering that breaks this throws here, naming the op and the aten op
  // being lowered, instead of XLA rejecting the whole module later.
  V unary(Hlo op, const V& x);
  V binary(Hlo op, const V& a, const V& b);
  V compare(Cmp direction, const V& a, const V& b);
  V select(const V& pred, const V& on_true, const V& on_false);
  // Reduces `dims` of x with a two-argument elementwise op (Hlo::Add, Hlo::Maximum).
  V reduce(const V& x, const std::vector<int64_t>& dims, const V& init, Hlo op);
  V iota(const TensorType& type, int64_t dim);
  V dot_general(const V& lhs, const V& rhs, const std::vector<int64_t>& lhs_batch,
                const std::vector<int64_t>& rhs_batch, const std::vector<int64_t>& lhs_contract,
                const std::vector<int64_t>& rhs_contract, const TensorType& result);
  // Random bits of the given unsigned type ("ui32"/"ui64"), seeded from the node's seed/offset args.
  V random_bits(const Node& node, const std::vector<int64_t>& shape, int bits);
  // Uniform floats in [0, 1) of dtype, from the node's seed/offset args.
  V random_uniform(const Node& node, const std::vector<int64_t>& shape, DType dtype);

  // The result of the module's latest collective (lowering/collective.cpp chains them so
  // that every process issues its collectives in program order). Empty name: none yet.
  const V& last_collective() const { return last_collective_; }
  void set_last_collective(V value) { last_collective_ = std::move(value); }

 private:
  void append(const std::string& line) { body_ += line; }
  // Throws unless a and b have one type (the operands of an elementwise `op`).
  void check_same_type(Hlo op, const V& a, const V& b) const;
  // The one emission of an op named by text: func.call (call()), which is no StableHLO op and
  // so has no Hlo enumerator. Every other op goes through emit(Hlo) / emit_multi(Hlo).
  std::vector<V> emit_named(const char* op, const std::vector<V>& operands, const std::vector<TensorType>& results,
                            const std::string& attrs, const std::string& regions);
  V complex_scalar(const Arg& a, int slot, DType dtype);  // a Complex argument: a constant (slot < 0) or lifted

  std::string body_;
  std::string functions_;
  std::set<std::string> defined_functions_;
  int counter_ = 0;
  int rng_calls_ = 0;
  std::vector<V> operands_;
  std::vector<int> lifted_slots_;
  std::vector<V> results_;
  V float_pack_, int_pack_;
  bool has_float64_ = true;
  const Node* node_ = nullptr;  // the node being lowered
  std::vector<EmittedCheck> checks_;
  V last_collective_;
};

template <typename F>
std::string LoweringContext::region(const std::vector<TensorType>& arg_types, F body) {
  std::vector<V> args;
  std::string header = "{\n  ^bb0(";
  for (size_t i = 0; i < arg_types.size(); ++i) {
    V arg{fresh_name(), arg_types[i]};
    header += (i ? ", " : "") + arg.name + ": " + arg.type.mlir();
    args.push_back(arg);
  }
  header += "):\n";
  std::string saved;
  saved.swap(body_);
  std::vector<V> yielded = body(args);
  std::string inner;
  inner.swap(body_);
  body_.swap(saved);
  std::string ret = std::string("    \"") + hlo_name(Hlo::Return) + "\"(";
  std::string types;
  for (size_t i = 0; i < yielded.size(); ++i) {
    ret += (i ? ", " : "") + yielded[i].name;
    types += (i ? ", " : "") + yielded[i].type.mlir();
  }
  ret += ") : (" + types + ") -> ()\n";
  return header + inner + ret + "}";
}

template <typename C, typename B>
std::vector<V> LoweringContext::while_loop(const std::vector<V>& init, C cond, B body) {
  std::vector<TensorType> types;
  for (const V& v : init) types.push_back(v.type);
  std::string cond_region = region(types, [&](const std::vector<V>& args) { return std::vector<V>{cond(args)}; });
  std::string body_region = region(types, body);
  return emit_multi(Hlo::While, init, types, "", cond_region + ", " + body_region);
}

}  // namespace torchtpu
