// Type promotion and operand helpers for lowerings.
#include "lowering/common.h"

#include <limits>
#include <sstream>
#include <stdexcept>

namespace torchtpu {
namespace {
int category(DType t) {
  if (t == DType::Bool) return 0;
  if (is_complex(t)) return 3;
  if (is_floating(t)) return 2;
  return 1;
}

// PyTorch's combine_categories: a 0-d operand of a higher category decides the category,
// the dimensioned operand keeps its precision where it can (float32 with a 0-d complex128
// gives complex64).
DType combine_categories(DType higher, DType lower) {
  if (is_complex(higher)) return higher;
  if (is_complex(lower)) return is_floating(higher) ? complex_type_of(higher) : lower;
  if (is_floating(higher)) return higher;
  if (higher == DType::Bool || is_floating(lower)) return promote_types(higher, lower);
  return higher;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  int ca = category(a), cb = category(b);
  if (ca == 3 || cb == 3) {
    // The complex type whose parts hold both: complex64 with float64 gives complex128.
    bool wide = a == DType::ComplexDouble || b == DType::ComplexDouble || a == DType::Float64 || b == DType::Float64;
    return wide ? DType::ComplexDouble : DType::ComplexFloat;
  }
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 2) {
    if ((a == DType::Float16 && b == DType::BFloat16) || (a == DType::BFloat16 && b == DType::Float16))
      return DType::Float32;
    return dtype_size(a) >= dtype_size(b) ? a : b;
  }
  // integers
  if (a == DType::UInt8 || b == DType::UInt8) {
    DType other = a == DType::UInt8 ? b : a;
    if (other == DType::Int8) return DType::Int16;
    return other;
  }
  return dtype_size(a) >= dtype_size(b) ? a : b;
}

DType result_type(const std::vector<V>& values) {
  bool have_dim = false, have_zero_dim = false;
  DType dim_type = DType::Bool, zero_type = DType::Bool;
  for (const V& v : values) {
    if (v.type.rank() > 0) {
      dim_type = have_dim ? promote_types(dim_type, v.type.dtype) : v.type.dtype;
      have_dim = true;
    } else {
      zero_type = have_zero_dim ? promote_types(zero_type, v.type.dtype) : v.type.dtype;
      have_zero_dim = true;
    }
  }
  if (!have_dim) return zero_type;
  if (!have_zero_dim) return dim_type;
  return combine_categories(dim_type, zero_type);
}

V to_type(LoweringContext& ctx, const V& x, DType dtype, const std::vector<int64_t>& shape) {
  return ctx.broadcast_to(ctx.convert(x, dtype), shape);
}

V tensor_or_scalar(LoweringContext& ctx, const Node& node, int arg, DType dtype, const std::vector<int64_t>& shape) {
  if (ctx.has_input(node, arg)) return to_type(ctx, ctx.input(node, arg), dtype, shape);
  return ctx.broadcast_to(ctx.scalar(node, arg, dtype), shape);
}

int64_t wrap_dim(int64_t dim, int64_t rank) {
  int64_t r = rank == 0 ? 1 : rank;
  // c10::maybe_wrap_dim's words; std::out_of_range reaches the user as IndexError, as on CPU.
  if (dim < -r || dim >= r)
    throw std::out_of_range("Dimension out of range (expected to be in range of [" + std::to_string(-r) + ", " +
                            std::to_string(r - 1) + "], but got " + std::to_string(dim) + ")");
  return dim < 0 ? dim + r : dim;
}

std::vector<int64_t> wrap_dims(const std::vector<int64_t>& dims, int64_t rank) {
  std::vector<int64_t> out;
  for (int64_t d : dims) out.push_back(wrap_dim(d, rank));
  return out;
}

V zero_like_scalar(LoweringContext& ctx, DType dtype) { return ctx.constant(0, dtype); }

V lowest_scalar(LoweringContext& ctx, DType dtype) {
  switch (dtype) {
    case DType::Bool: return ctx.constant_int(0, dtype);
    case DType::UInt8: return ctx.constant_int(0, dtype);
    case DType::Int8: return ctx.constant_int(std::numeric_limits<int8_t>::min(), dtype);
    case DType::Int16: return ctx.constant_int(std::numeric_limits<int16_t>::min(), dtype);
    case DType::Int32: return ctx.constant_int(std::numeric_limits<int32_t>::min(), dtype);
    case DType::Int64: return ctx.constant_int(std::numeric_limits<int64_t>::min(), dtype);
    default: return ctx.constant(-std::numeric_limits<double>::infinity(), dtype);
  }
}

V highest_scalar(LoweringContext& ctx, DType dtype) {
  switch (dtype) {
    case DType::Bool: return ctx.constant_int(1, dtype);
    case DType::UInt8: return ctx.constant_int(255, dtype);
    case DType::Int8: return ctx.constant_int(std::numeric_limits<int8_t>::max(), dtype);
    case DType::Int16: return ctx.constant_int(std::numeric_limits<int16_t>::max(), dtype);
    case DType::Int32: return ctx.constant_int(std::numeric_limits<int32_t>::max(), dtype);
    case DType::Int64: return ctx.constant_int(std::numeric_limits<int64_t>::max(), dtype);
    default: return ctx.constant(std::numeric_limits<double>::infinity(), dtype);
  }
}

V sum_dims(LoweringContext& ctx, const V& x, const std::vector<int64_t>& dims) {
  return ctx.reduce(x, dims, zero_like_scalar(ctx, x.type.dtype), Hlo::Add);
}

DType compute_dtype(DType dtype) {
  return dtype == DType::BFloat16 || dtype == DType::Float16 ? DType::Float32 : dtype;
}

Ex operands_ex(LoweringContext& ctx, const TensorType& out, DType compute) {
  Ex e = make_ex(ctx, compute, out.shape);
  e.operands = out.dtype;
  return e;
}

Ex operands_ex(LoweringContext& ctx, const TensorType& out) { return operands_ex(ctx, out, compute_dtype(out.dtype)); }

V cumsum_along(LoweringContext& ctx, const V& x, int64_t dim) {
  int64_t rank = x.type.rank(), n = x.type.shape[dim];
  if (n <= 1) return x;
  TensorType scalar{{}, x.type.dtype};
  Hlo add = x.type.dtype == DType::Bool ? Hlo::Or : Hlo::Add;
  std::string body = ctx.region({scalar, scalar}, [&](const std::vector<V>& a) {
    return std::vector<V>{ctx.binary(add, a[0], a[1])};
  });
  std::vector<int64_t> window(rank, 1);
  window[dim] = n;
  std::string padding = "padding = dense<[";
  for (int64_t i = 0; i < rank; ++i)
    padding += std::string(i ? ", " : "") + "[" + (i == dim ? std::to_string(n - 1) : "0") + ", 0]";
  padding += "]> : tensor<" + std::to_string(rank) + "x2xi64>";
  return ctx.emit(Hlo::ReduceWindow, {x, ctx.constant(0, x.type.dtype)}, x.type,
                  "window_dimensions = " + format_dims(window) + ", " + padding, body);
}

std::vector<V> sort_stable(LoweringContext& ctx, const std::vector<V>& keys, const std::vector<V>& payload, int64_t dim) {
  std::vector<V> operands;
  for (const V& k : keys) operands.push_back(k.type.dtype == DType::Bool ? ctx.convert(k, DType::UInt8) : k);
  operands.insert(operands.end(), payload.begin(), payload.end());
  std::vector<TensorType> arg_types, result_types;
  for (const V& v : operands) {
    arg_types.push_back(TensorType{{}, v.type.dtype});
    arg_types.push_back(TensorType{{}, v.type.dtype});
    result_types.push_back(v.type);
  }
  std::string body = ctx.region(arg_types, [&](const std::vector<V>& a) {
    // less = lt_0 or (eq_0 and (lt_1 or (eq_1 and ...))), built from the last key up.
    V less;
    for (int64_t k = static_cast<int64_t>(keys.size()) - 1; k >= 0; --k) {
      V lhs = a[2 * k], rhs = a[2 * k + 1];
      V lt = ctx.compare(Cmp::LT, lhs, rhs), eq = ctx.compare(Cmp::EQ, lhs, rhs);
      if (is_floating(lhs.type.dtype)) {
        V lhs_nan = ctx.compare(Cmp::NE, lhs, lhs), rhs_nan = ctx.compare(Cmp::NE, rhs, rhs);
        lt = ctx.binary(Hlo::Or, lt, ctx.binary(Hlo::And, rhs_nan, ctx.unary(Hlo::Not, lhs_nan)));
        eq = ctx.binary(Hlo::Or, eq, ctx.binary(Hlo::And, lhs_nan, rhs_nan));
      }
      less = less.name.empty() ? lt : ctx.binary(Hlo::Or, lt, ctx.binary(Hlo::And, eq, less));
    }
    return std::vector<V>{less};
  });
  std::vector<V> sorted = ctx.emit_multi(Hlo::Sort, operands, result_types,
                                         "dimension = " + std::to_string(dim) + " : i64, is_stable = true", body);
  for (size_t k = 0; k < keys.size(); ++k)
    if (keys[k].type.dtype == DType::Bool) sorted[k] = ctx.convert(sorted[k], DType::Bool);
  return sorted;
}

V any_true(LoweringContext& ctx, const V& x) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.type.rank(); ++d) dims.push_back(d);
  return ctx.reduce(x, dims, ctx.constant_int(0, DType::Bool), Hlo::Or);
}

}  // namespace torchtpu

// --- Linear-index gather/scatter ---------------------------------------------------------
namespace torchtpu {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

DType index_dtype(int64_t numel) { return numel < (int64_t(1) << 31) ? DType::Int32 : DType::Int64; }

V affine_index(LoweringContext& ctx, const std::vector<int64_t>& shape, const std::vector<int64_t>& coefs,
               int64_t offset, DType dtype) {
  V total = ctx.constant_int(offset, dtype, shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (coefs[d] == 0 || shape[d] <= 1) continue;
    V term = ctx.iota(TensorType{shape, dtype}, static_cast<int64_t>(d));
    if (coefs[d] != 1) term = ctx.binary(Hlo::Multiply, term, ctx.constant_int(coefs[d], dtype, shape));
    total = ctx.binary(Hlo::Add, total, term);
  }
  return total;
}

V gather_linear(LoweringContext& ctx, const V& x, const V& idx) {
  TensorType out{idx.type.shape, x.type.dtype};
  if (out.numel() == 0 || x.type.numel() == 0) return ctx.constant(0, out.dtype, out.shape);
  V flat = ctx.reshape(x, {x.type.numel()});
  GatherDimensionNumbers numbers{.collapsed_slice_dims = {0}, .start_index_map = {0}, .index_vector_dim = idx.type.rank()};
  std::string attrs = "dimension_numbers = " + numbers.attribute() + ", indices_are_sorted = false, slice_sizes = array<i64: 1>";
  return ctx.emit(Hlo::Gather, {flat, idx}, out, attrs);
}

V scatter_linear(LoweringContext& ctx, const V& x, const V& idx, const V& updates, std::optional<Hlo> combine) {
  if (idx.type.numel() == 0 || x.type.numel() == 0) return x;
  V flat = ctx.reshape(x, {x.type.numel()});
  TensorType scalar{{}, x.type.dtype};
  std::string body = ctx.region({scalar, scalar}, [&](const std::vector<V>& args) {
    if (!combine) return std::vector<V>{args[1]};
    return std::vector<V>{ctx.binary(*combine, args[0], args[1])};
  });
  ScatterDimensionNumbers numbers{.inserted_window_dims = {0}, .scatter_dims_to_operand_dims = {0},
                                  .index_vector_dim = idx.type.rank()};
  std::string attrs = "indices_are_sorted = false, scatter_dimension_numbers = " + numbers.attribute() +
                      ", unique_indices = false";
  V out = ctx.emit(Hlo::Scatter, {flat, idx, ctx.convert(updates, x.type.dtype)}, flat.type, attrs, body);
  return ctx.reshape(out, x.type.shape);
}

}  // namespace torchtpu

// --- Checked indexing ---------------------------------------------------------------------
namespace torchtpu {

IndexCheck bounds_check(int64_t dim, int64_t size, bool negative_ok, RuntimeCheck::Error error) {
  return IndexCheck{error,
                    "index {} is out of bounds for dimension " + std::to_string(dim) + " with size " +
                        std::to_string(size),
                    negative_ok};
}

IndexCheck range_check() { return IndexCheck{RuntimeCheck::Error::Index, "index out of range in self", false}; }

V checked_index(LoweringContext& ctx, const V& index, int64_t size, DType dtype, const IndexCheck* check) {
  // Compared as int64: an int64 index beyond the int32 range must not wrap into range.
  V i = ctx.convert(index, DType::Int64);
  const auto& shape = i.type.shape;
  bool negative_ok = !check || check->negative_ok;
  if (check) {
    V below = ctx.compare(Cmp::LT, i, ctx.constant_int(negative_ok ? -size : 0, DType::Int64, shape));
    V above = ctx.compare(Cmp::GE, i, ctx.constant_int(size, DType::Int64, shape));
    ctx.check(ctx.emit(Hlo::Or, {below, above}, below.type), i, RuntimeCheck{check->error, check->message});
  }
  if (negative_ok) {
    V wrapped = ctx.binary(Hlo::Add, i, ctx.constant_int(size, DType::Int64, shape));
    i = ctx.select(ctx.compare(Cmp::LT, i, ctx.constant_int(0, DType::Int64, shape)), wrapped, i);
  }
  return ctx.convert(i, dtype);
}

}  // namespace torchtpu

namespace torchtpu {

void check_integer_divisor(LoweringContext& ctx, const Node& node, int arg, const V& b) {
  const Arg& a = node.args.at(arg);
  if (a.kind != Arg::Kind::Tensor && !a.lifted && a.as_double() == 0.0) throw std::runtime_error("ZeroDivisionError");
  ctx.check(ctx.compare(Cmp::EQ, b, ctx.constant_int(0, b.type.dtype, b.type.shape)), V{},
            RuntimeCheck{RuntimeCheck::Error::Runtime, "ZeroDivisionError"});
}

}  // namespace torchtpu

namespace torchtpu {

const char* cpp_type_name(DType dtype) {
  switch (dtype) {
    case DType::UInt8: return "unsigned char";
    case DType::Int8: return "signed char";
    case DType::Int16: return "short int";
    case DType::Int32: return "int";
    case DType::Int64: return "long int";
    case DType::Float16: return "c10::Half";
    case DType::Float32: return "float";
    case DType::Float64: return "double";
    case DType::Bool: return "bool";
    case DType::BFloat16: return "c10::BFloat16";
    case DType::ComplexFloat: return "c10::complex<float>";
    case DType::ComplexDouble: return "c10::complex<double>";
  }
  return "?";
}

const char* scalar_type_name(DType dtype) {
  switch (dtype) {
    case DType::UInt8: return "Byte";
    case DType::Int8: return "Char";
    case DType::Int16: return "Short";
    case DType::Int32: return "Int";
    case DType::Int64: return "Long";
    case DType::Float16: return "Half";
    case DType::Float32: return "Float";
    case DType::Float64: return "Double";
    case DType::Bool: return "Bool";
    case DType::BFloat16: return "BFloat16";
    case DType::ComplexFloat: return "ComplexFloat";
    case DType::ComplexDouble: return "ComplexDouble";
  }
  return "?";
}

std::string format_number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

void check_argument(bool condition, const std::string& message) {
  if (!condition) throw std::runtime_error(message);
}

void check_index_argument(bool condition, const std::string& message) {
  if (!condition) throw std::out_of_range(message);
}

// x[at] along the leading dimension (at: a 0-d i64 value).
V index_leading(LoweringContext& ctx, const V& x, const V& at) {
  std::vector<int64_t> sizes = x.type.shape;
  sizes[0] = 1;
  std::vector<V> operands = {x, at};
  for (size_t d = 1; d < sizes.size(); ++d) operands.push_back(ctx.constant_int(0, DType::Int64));
  V row = ctx.emit(Hlo::DynamicSlice, operands, TensorType{sizes, x.type.dtype},
                   "slice_sizes = " + format_dims(sizes));
  return ctx.reshape(row, std::vector<int64_t>(sizes.begin() + 1, sizes.end()));
}

// stacked with stacked[at] = row.
V update_leading(LoweringContext& ctx, const V& stacked, const V& row, const V& at) {
  std::vector<int64_t> sizes = row.type.shape;
  sizes.insert(sizes.begin(), 1);
  std::vector<V> operands = {stacked, ctx.reshape(row, sizes), at};
  for (size_t d = 1; d < sizes.size(); ++d) operands.push_back(ctx.constant_int(0, DType::Int64));
  return ctx.emit(Hlo::DynamicUpdateSlice, operands, stacked.type);
}

}  // namespace torchtpu
