// Helpers shared by the lowering families: type promotion and operand preparation.
#pragma once

#include <optional>
#include <string>

#include "ir/graph.h"
#include "lowering/registry.h"
#include "stablehlo/builder.h"

namespace torchtpu {

// PyTorch's promotion of two dtypes (bool < integers < floating).
DType promote_types(DType a, DType b);
// PyTorch's result_type over tensor operands: 0-d tensors only raise the category.
DType result_type(const std::vector<V>& values);

// Converts x to dtype and broadcasts it to shape.
V to_type(LoweringContext& ctx, const V& x, DType dtype, const std::vector<int64_t>& shape);
// A Tensor or Scalar argument as a value of `dtype` broadcast to `shape`.
V tensor_or_scalar(LoweringContext& ctx, const Node& node, int arg, DType dtype, const std::vector<int64_t>& shape);
// Normalizes a possibly negative dimension.
int64_t wrap_dim(int64_t dim, int64_t rank);
std::vector<int64_t> wrap_dims(const std::vector<int64_t>& dims, int64_t rank);
// Identity elements for reductions.
V zero_like_scalar(LoweringContext& ctx, DType dtype);
V lowest_scalar(LoweringContext& ctx, DType dtype);   // -inf or the smallest integer
V highest_scalar(LoweringContext& ctx, DType dtype);  // +inf or the largest integer
// Sum over dims (in the accumulation dtype of the input) with optional keepdim reshape to out.
V sum_dims(LoweringContext& ctx, const V& x, const std::vector<int64_t>& dims);

// Which extremum a max/min rule computes (fmax/fmin, max/min and their reductions, argmax,
// cummax): the parameter of those families.
enum class Extremum : uint8_t { Max, Min };

// The dtype float math runs in: f32 for bf16/f16 (PyTorch's CPU kernels compute half types
// in float and round once), else the dtype itself.
DType compute_dtype(DType dtype);

// Small expression helper for elementwise formulas: every operand has `shape` and dtype `dt`.
struct Ex {
  LoweringContext& c;
  DType dt;
  std::vector<int64_t> shape;
  // The dtype arguments are converted to before dt, when it differs (operands_ex).
  std::optional<DType> operands = std::nullopt;

  V k(double v) const { return c.constant(v, dt, shape); }
  V add(const V& a, const V& b) const { return c.binary(Hlo::Add, a, b); }
  V sub(const V& a, const V& b) const { return c.binary(Hlo::Subtract, a, b); }
  V mul(const V& a, const V& b) const { return c.binary(Hlo::Multiply, a, b); }
  V div(const V& a, const V& b) const { return c.binary(Hlo::Divide, a, b); }
  V max(const V& a, const V& b) const { return c.binary(Hlo::Maximum, a, b); }
  V min(const V& a, const V& b) const { return c.binary(Hlo::Minimum, a, b); }
  V un(Hlo op, const V& a) const { return c.unary(op, a); }
  V sel(const V& p, const V& a, const V& b) const { return c.select(p, a, b); }
  V cmp(Cmp dir, const V& a, const V& b) const { return c.compare(dir, a, b); }
  V isnan(const V& a) const { return c.compare(Cmp::NE, a, a); }
  V band(const V& a, const V& b) const { return c.emit(Hlo::And, {a, b}, a.type); }
  V bor(const V& a, const V& b) const { return c.emit(Hlo::Or, {a, b}, a.type); }
  V bnot(const V& a) const { return c.unary(Hlo::Not, a); }
  // A Tensor or Scalar argument converted to dt (through `operands` when set) and broadcast to shape.
  V arg(const Node& node, int i) const {
    if (!operands || *operands == dt) return tensor_or_scalar(c, node, i, dt, shape);
    return c.convert(tensor_or_scalar(c, node, i, *operands, shape), dt);
  }
};

inline Ex make_ex(LoweringContext& ctx, DType dt, const std::vector<int64_t>& shape) { return Ex{ctx, dt, shape}; }
// For binary ops PyTorch computes like CPU's TensorIterator: operands converted to the result
// dtype `out` first (a float32 0-d tensor or a Python float is rounded to bfloat16 when the
// result is bfloat16), then computed in `compute` (by default float32 for float16/bfloat16).
Ex operands_ex(LoweringContext& ctx, const TensorType& out);
Ex operands_ex(LoweringContext& ctx, const TensorType& out, DType compute);

// True when any element of the boolean x is true (a 0-d bool).
V any_true(LoweringContext& ctx, const V& x);
// Inclusive prefix sum along `dim` (integer or float x).
V cumsum_along(LoweringContext& ctx, const V& x, int64_t dim);
// Sorts along `dim`, stably and ascending, by `keys` compared lexicographically (NaN after
// every number, NaNs equal to each other); `payload` values (same shape) move alongside.
// Returns the sorted keys, then the payloads. Bool keys sort as false < true.
std::vector<V> sort_stable(LoweringContext& ctx, const std::vector<V>& keys, const std::vector<V>& payload, int64_t dim);

}  // namespace torchtpu

// --- Linear-index gather/scatter (added for shape/indexing lowerings) -------------------
// Every element of a tensor read row-major has a linear position; view-like and indexing
// ops become a gather/scatter over the flattened operand with computed positions.
namespace torchtpu {
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);
// Integer type for linear positions into `numel` elements (i32 when it fits, else i64).
DType index_dtype(int64_t numel);
// Positions of `shape`: offset + sum_d iota_d * coefs[d], in dtype.
V affine_index(LoweringContext& ctx, const std::vector<int64_t>& shape, const std::vector<int64_t>& coefs,
               int64_t offset, DType dtype);
// Elements of x (read row-major) at linear positions idx; the result has idx's shape.
V gather_linear(LoweringContext& ctx, const V& x, const V& idx);
// x with `updates` (idx's shape) combined at linear positions idx: combine is none to
// overwrite or a StableHLO binary op (Hlo::Add, Hlo::Maximum, ...).
V scatter_linear(LoweringContext& ctx, const V& x, const V& idx, const V& updates, std::optional<Hlo> combine);
}  // namespace torchtpu

// --- Checked indexing ---------------------------------------------------------------------
// XLA clamps out-of-range gather/scatter indices; PyTorch raises. Every lowering that indexes
// with a user's tensor reads it through checked_index, which also emits a runtime check
// (LoweringContext::check): the op raises PyTorch's CPU error when the host next waits.
namespace torchtpu {
// How an op reports an index out of range, in its CPU kernel's wording.
struct IndexCheck {
  RuntimeCheck::Error error = RuntimeCheck::Error::Index;
  std::string message;      // "{}" is the offending index
  bool negative_ok = true;  // indices in [-size, 0) count from the end
};
// "index {} is out of bounds for dimension D with size S" (index, index_put, gather, scatter).
IndexCheck bounds_check(int64_t dim, int64_t size, bool negative_ok, RuntimeCheck::Error error);
// "index out of range in self" (index_select, index_add, embedding): no negative indices.
IndexCheck range_check();
// A user's index tensor as positions in [0, size) of `dtype`: negative indices wrapped where
// `check` allows them. Out-of-range indices fail the op at run time; with `check` null (the
// _unsafe_ ops, indices a forward op already checked) they are only wrapped.
V checked_index(LoweringContext& ctx, const V& index, int64_t size, DType dtype, const IndexCheck* check);
}  // namespace torchtpu

// --- Integer division by zero -------------------------------------------------------------
namespace torchtpu {
// CPU raises RuntimeError("ZeroDivisionError") for an integer division or remainder by zero:
// at once for a divisor given as a number (argument `arg`), else at run time where the
// divisor `b` is zero.
void check_integer_divisor(LoweringContext& ctx, const Node& node, int arg, const V& b);
}  // namespace torchtpu

// --- Argument checks CPU kernels make and meta kernels do not ------------------------------
// A lowering that throws raises at the op, in every mode (the engine lowers each new node
// signature alone when it is recorded), so these checks cost a steady loop nothing.
namespace torchtpu {
// PyTorch's names of a dtype in its messages: the C++ type ("long int", "c10::Half", as
// caffe2::TypeMeta prints it) and the scalar type ("Long", "Half", as c10::toString does).
const char* cpp_type_name(DType dtype);
const char* scalar_type_name(DType dtype);
// A number as PyTorch's C++ messages print it (ostream defaults: 5, -0.1, 1e+20).
std::string format_number(double value);
// Throws RuntimeError(message) unless `condition`.
void check_argument(bool condition, const std::string& message);
// Throws IndexError(message) unless `condition` (a std::out_of_range, which the device layer
// raises as IndexError, like the dimension errors of wrap_dim).
void check_index_argument(bool condition, const std::string& message);
// x[at] along the leading dimension (at: a 0-d i64 value), and stacked with stacked[at] = row:
// the rows of a loop over time (scan bodies, CTC's recursions).
V index_leading(LoweringContext& ctx, const V& x, const V& at);
V update_leading(LoweringContext& ctx, const V& stacked, const V& row, const V& at);

}  // namespace torchtpu
