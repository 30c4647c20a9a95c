// Text emission for StableHLO functions (see builder.h).
#include "stablehlo/builder.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace torchtpu {

std::string format_list(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

namespace {
// ", name = [..]" for a non-empty list (the pretty form leaves empty ones out).
std::string listed(const char* name, const std::vector<int64_t>& dims) {
  return dims.empty() ? "" : std::string(name) + " = " + format_list(dims) + ", ";
}
}  // namespace

std::string GatherDimensionNumbers::attribute() const {
  return "#stablehlo.gather<" + listed("offset_dims", offset_dims) + listed("collapsed_slice_dims", collapsed_slice_dims) +
         listed("start_index_map", start_index_map) + "index_vector_dim = " + std::to_string(index_vector_dim) + ">";
}

std::string ScatterDimensionNumbers::attribute() const {
  return "#stablehlo.scatter<" + listed("update_window_dims", update_window_dims) +
         listed("inserted_window_dims", inserted_window_dims) +
         listed("scatter_dims_to_operand_dims", scatter_dims_to_operand_dims) +
         "index_vector_dim = " + std::to_string(index_vector_dim) + ">";
}

std::string DotDimensionNumbers::attribute() const {
  return "#stablehlo.dot<lhs_batching_dimensions = " + format_list(lhs_batching) +
         ", rhs_batching_dimensions = " + format_list(rhs_batching) +
         ", lhs_contracting_dimensions = " + format_list(lhs_contracting) +
         ", rhs_contracting_dimensions = " + format_list(rhs_contracting) + ">";
}

namespace {
// "[b, f, 0, 1]": each dim of a convolution operand named by its role or its spatial index.
std::string conv_roles(int64_t first, const char* first_role, int64_t second, const char* second_role,
                       const std::vector<int64_t>& spatial) {
  std::vector<std::string> names(spatial.size() + 2);
  names.at(first) = first_role;
  names.at(second) = second_role;
  for (size_t i = 0; i < spatial.size(); ++i) names.at(spatial[i]) = std::to_string(i);
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + "]";
}
}  // namespace

std::string ConvDimensionNumbers::attribute() const {
  return "#stablehlo.conv<" + conv_roles(input_batch_dimension, "b", input_feature_dimension, "f", input_spatial_dimensions) +
         "x" + conv_roles(kernel_output_feature_dimension, "o", kernel_input_feature_dimension, "i", kernel_spatial_dimensions) +
         "->" + conv_roles(output_batch_dimension, "b", output_feature_dimension, "f", output_spatial_dimensions) + ">";
}

std::string format_dims(const std::vector<int64_t>& dims) {
  if (dims.empty()) return "array<i64>";
  std::string s = "array<i64: ";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ">";
}

const char* hlo_name(Hlo op) {
  // In Hlo's order.
  static const char* const names[] = {
    "stablehlo.abs", "stablehlo.add", "stablehlo.all_gather", "stablehlo.all_reduce",
    "stablehlo.all_to_all", "stablehlo.and", "stablehlo.atan2", "stablehlo.bitcast_convert",
    "stablehlo.broadcast_in_dim", "stablehlo.ceil", "stablehlo.cholesky",
    "stablehlo.collective_permute", "stablehlo.compare", "stablehlo.complex", "stablehlo.concatenate",
    "stablehlo.constant", "stablehlo.convert", "stablehlo.convolution", "stablehlo.cosine",
    "stablehlo.count_leading_zeros", "stablehlo.custom_call", "stablehlo.divide",
    "stablehlo.dot_general", "stablehlo.dynamic_slice", "stablehlo.dynamic_update_slice",
    "stablehlo.exponential", "stablehlo.exponential_minus_one", "stablehlo.fft", "stablehlo.floor",
    "stablehlo.gather", "stablehlo.if", "stablehlo.imag", "stablehlo.iota", "stablehlo.is_finite",
    "stablehlo.log", "stablehlo.log_plus_one", "stablehlo.logistic", "stablehlo.maximum",
    "stablehlo.minimum", "stablehlo.multiply", "stablehlo.negate", "stablehlo.not",
    "stablehlo.optimization_barrier", "stablehlo.or", "stablehlo.pad", "stablehlo.power",
    "stablehlo.real", "stablehlo.reduce", "stablehlo.reduce_precision", "stablehlo.reduce_scatter",
    "stablehlo.reduce_window", "stablehlo.remainder", "stablehlo.reshape", "stablehlo.return",
    "stablehlo.reverse", "stablehlo.rng_bit_generator", "stablehlo.round_nearest_even",
    "stablehlo.rsqrt", "stablehlo.scatter", "stablehlo.select", "stablehlo.shift_left",
    "stablehlo.shift_right_arithmetic", "stablehlo.shift_right_logical", "stablehlo.sign",
    "stablehlo.sine", "stablehlo.slice", "stablehlo.sort", "stablehlo.sqrt", "stablehlo.subtract",
    "stablehlo.tan", "stablehlo.tanh", "stablehlo.transpose", "stablehlo.triangular_solve",
    "stablehlo.while", "stablehlo.xor", "chlo.acos", "chlo.acosh", "chlo.asin", "chlo.asinh",
    "chlo.atan", "chlo.atanh", "chlo.cosh", "chlo.digamma", "chlo.erf", "chlo.erf_inv", "chlo.erfc",
    "chlo.lgamma", "chlo.sinh",
  };
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(Hlo::ChloSinh) + 1);
  return names[static_cast<size_t>(op)];
}

const char* cmp_name(Cmp direction) {
  static const char* const names[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
  return names[static_cast<size_t>(direction)];
}

namespace {

// Float literal that MLIR parses back to exactly this value (hex for inf/nan).
std::string float_literal(double value, DType dtype) {
  if (std::isfinite(value)) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17e", value);
    return buf;
  }
  bool negative = std::signbit(value);
  switch (dtype) {
    case DType::Float64:
      if (std::isnan(value)) return "0x7FF8000000000000";
      return negative ? "0xFFF0000000000000" : "0x7FF0000000000000";
    case DType::Float16:
      if (std::isnan(value)) return "0x7E00";
      return negative ? "0xFC00" : "0x7C00";
    case DType::BFloat16:
      if (std::isnan(value)) return "0x7FC0";
      return negative ? "0xFF80" : "0x7F80";
    default:
      if (std::isnan(value)) return "0x7FC00000";
      return negative ? "0xFF800000" : "0x7F800000";
  }
}

std::string types_of(const std::vector<V>& values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + values[i].type.mlir();
  return s;
}

const char* compare_type(DType dtype) {
  if (is_floating(dtype) || is_complex(dtype)) return "FLOAT";  // complex: EQ and NE only
  if (is_signed_integer(dtype)) return "SIGNED";
  return "UNSIGNED";
}

}  // namespace

std::string LoweringContext::fresh_name() { return "%" + std::to_string(counter_++); }

void LoweringContext::define_functions(const std::string& key, const std::string& definitions) {
  if (defined_functions_.insert(key).second) functions_ += definitions;
}

std::vector<V> LoweringContext::call(const std::string& function, const std::vector<V>& operands,
                                     const std::vector<TensorType>& results) {
  return emit_named("func.call", operands, results, "callee = @\"" + function + "\"", "");
}

void LoweringContext::begin_node(const Node& node, std::vector<V> operands, std::vector<int> lifted_slots) {
  operands_ = std::move(operands);
  lifted_slots_ = std::move(lifted_slots);
  results_.clear();
  rng_calls_ = 0;
  node_ = &node;
  body_ += "    // " + node.op.name() + "\n";
}

std::vector<V> LoweringContext::finish_node(const Node& node) {
  if (results_.size() != node.outputs.size())
    throw std::logic_error("torchtpu: lowering of " + node.op.name() + " produced " +
                           std::to_string(results_.size()) + " results, expected " +
                           std::to_string(node.outputs.size()));
  for (size_t i = 0; i < results_.size(); ++i) {
    if (results_[i].type != node.outputs[i])
      throw std::logic_error("torchtpu: lowering of " + node.op.name() + " result " + std::to_string(i) +
                             " has type " + results_[i].type.str() + " but PyTorch expects " +
                             node.outputs[i].str());
  }
  return std::move(results_);
}

V LoweringContext::input(const Node& node, int arg) const {
  const Arg& a = node.args.at(arg);
  if (a.kind != Arg::Kind::Tensor)
    throw std::logic_error("torchtpu: argument " + std::to_string(arg) + " of " + node.op.name() + " is not a tensor");
  return operands_.at(a.operands[0]);
}

bool LoweringContext::has_input(const Node& node, int arg) const {
  return arg < static_cast<int>(node.args.size()) && node.args[arg].kind == Arg::Kind::Tensor;
}

std::vector<V> LoweringContext::inputs(const Node& node, int arg) const {
  std::vector<V> out;
  for (int index : node.args.at(arg).operands)
    if (index >= 0) out.push_back(operands_.at(index));
  return out;
}

V LoweringContext::scalar(const Node& node, int arg, DType dtype) { return scalar_at(node, arg, 0, dtype); }

V LoweringContext::scalar_at(const Node& node, int arg, size_t index, DType dtype) {
  const Arg& a = node.args.at(arg);
  // Not lifted, or lifted but the graph has no scalar packs (an exported module): a constant.
  bool packed = a.lifted && !lifted_slots_.empty();
  if (a.kind == Arg::Kind::Complex) return complex_scalar(a, packed ? lifted_slots_.at(arg) : -1, dtype);
  if (!packed) {
    if (a.kind == Arg::Kind::DoubleList) return constant(a.doubles.at(index), dtype);
    if (a.kind == Arg::Kind::IntList) return constant_int(a.ints.at(index), dtype);
    if (a.kind == Arg::Kind::Double) return constant(a.d, dtype);
    if (a.kind == Arg::Kind::Int || a.kind == Arg::Kind::Bool) return constant_int(a.i, dtype);
    throw std::logic_error("torchtpu: argument " + std::to_string(arg) + " of " + node.op.name() + " is not a number");
  }
  int slot = lifted_slots_.at(arg) + static_cast<int>(index);
  bool is_float = a.kind == Arg::Kind::Double || a.kind == Arg::Kind::DoubleList;
  const V& pack = is_float ? float_pack_ : int_pack_;
  V element = slice(pack, {slot}, {slot + 1}, {1});
  element = reshape(element, {});
  return convert(element, dtype);
}

void LoweringContext::check(const V& failed, const V& value, RuntimeCheck check) {
  int64_t n = failed.type.numel();
  if (n == 0) return;
  // The first failing position (n when none fails), then the value there: one reduction and
  // a one-element slice, so a check costs little beside the op it guards.
  V flat = reshape(convert(failed, DType::Bool), {n});
  V positions = iota(TensorType{{n}, DType::Int64}, 0);
  V first = reduce(select(flat, positions, constant_int(n, DType::Int64, {n})), {0}, constant_int(n, DType::Int64),
                   Hlo::Minimum);
  V any = convert(compare(Cmp::LT, first, constant_int(n, DType::Int64)), DType::Int64);
  V reported = constant_int(0, DType::Int64, {1});
  if (!value.name.empty()) {
    V values = convert(reshape(value, {n}), DType::Int64);
    V at = binary(Hlo::Minimum, first, constant_int(n - 1, DType::Int64));
    reported = emit(Hlo::DynamicSlice, {values, at}, TensorType{{1}, DType::Int64},
                    "slice_sizes = array<i64: 1>");
  }
  checks_.push_back(EmittedCheck{node_, std::move(check), concatenate({reshape(any, {1}), reported}, 0)});
}

V LoweringContext::complex_scalar(const Arg& a, int slot, DType dtype) {
  if (!is_complex(dtype))
    throw std::logic_error("torchtpu: a complex scalar used as " + std::string(dtype_name(dtype)));
  if (slot < 0) return constant_complex(a.doubles[0], a.doubles[1], dtype);
  DType part = real_part_type(dtype);
  V re = convert(reshape(slice(float_pack_, {slot}, {slot + 1}, {1}), {}), part);
  V im = convert(reshape(slice(float_pack_, {slot + 1}, {slot + 2}, {1}), {}), part);
  return make_complex(re, im);
}

V LoweringContext::emit(Hlo op, const std::vector<V>& operands, const TensorType& result, const std::string& attrs,
                        const std::string& regions) {
  return emit_named(hlo_name(op), operands, {result}, attrs, regions)[0];
}

std::vector<V> LoweringContext::emit_multi(Hlo op, const std::vector<V>& operands,
                                           const std::vector<TensorType>& results, const std::string& attrs,
                                           const std::string& regions) {
  return emit_named(hlo_name(op), operands, results, attrs, regions);
}

std::vector<V> LoweringContext::emit_named(const char* op, const std::vector<V>& operands,
                                           const std::vector<TensorType>& results, const std::string& attrs,
                                           const std::string& regions) {
  std::string name = fresh_name();
  std::string line = "    " + name;
  if (results.size() > 1) line += ":" + std::to_string(results.size());
  line += " = \"" + std::string(op) + "\"(";
  for (size_t i = 0; i < operands.size(); ++i) line += (i ? ", " : "") + operands[i].name;
  line += ")";
  if (!regions.empty()) line += " (" + regions + ")";
  if (!attrs.empty()) line += " {" + attrs + "}";
  line += " : (" + types_of(operands) + ") -> ";
  std::vector<V> out;
  if (results.size() == 1) {
    line += results[0].mlir();
    out.push_back(V{name, results[0]});
  } else {
    line += "(";
    for (size_t i = 0; i < results.size(); ++i) {
      line += (i ? ", " : "") + results[i].mlir();
      out.push_back(V{name + "#" + std::to_string(i), results[i]});
    }
    line += ")";
  }
  append(line + "\n");
  return out;
}

V LoweringContext::constant(double value, DType dtype, const std::vector<int64_t>& shape) {
  if (is_complex(dtype)) return constant_complex(value, 0.0, dtype, shape);
  TensorType type{shape, dtype};
  std::string literal;
  if (dtype == DType::Bool) literal = value != 0.0 ? "true" : "false";
  else if (is_floating(dtype)) literal = float_literal(value, dtype);
  else return constant_int(static_cast<int64_t>(value), dtype, shape);
  return emit(Hlo::Constant, {}, type, "value = dense<" + literal + "> : " + type.mlir());
}

V LoweringContext::constant_complex(double real, double imag, DType dtype, const std::vector<int64_t>& shape) {
  TensorType type{shape, dtype};
  DType part = real_part_type(dtype);
  std::string literal = "(" + float_literal(real, part) + ", " + float_literal(imag, part) + ")";
  return emit(Hlo::Constant, {}, type, "value = dense<" + literal + "> : " + type.mlir());
}

V LoweringContext::constant_int(int64_t value, DType dtype, const std::vector<int64_t>& shape) {
  if (is_floating(dtype) || is_complex(dtype)) return constant(static_cast<double>(value), dtype, shape);
  TensorType type{shape, dtype};
  std::string literal = dtype == DType::Bool ? (value ? "true" : "false") : std::to_string(value);
  if (dtype == DType::UInt8) literal = std::to_string(static_cast<uint8_t>(value));
  return emit(Hlo::Constant, {}, type, "value = dense<" + literal + "> : " + type.mlir());
}

V LoweringContext::convert(const V& x, DType dtype) {
  if (x.type.dtype == dtype) return x;
  if (dtype == DType::Bool) {
    // PyTorch: nonzero -> true (a plain convert would truncate).
    V zero = constant(0, x.type.dtype, x.type.shape);
    return compare(Cmp::NE, x, zero);
  }
  if (x.type.dtype == DType::Bool && is_floating(dtype)) {
    // XLA's simplifier rewrites multiply(a, convert(pred)) as select(pred, a, 0), which loses
    // a's NaN, inf and sign where pred is false (PyTorch: inf * False = nan, -1 * False = -0,
    // as in amax's backward, grad / count * mask). It leaves a select of constants alone.
    return select(x, constant(1, dtype, x.type.shape), constant(0, dtype, x.type.shape));
  }
  if (is_complex(x.type.dtype) && !is_complex(dtype)) return convert(real_part(x), dtype);  // PyTorch keeps the real part
  if (is_complex(dtype) && !is_complex(x.type.dtype)) {
    // Through the part type, so integer and half inputs round as PyTorch's casts do.
    V part = convert(x, real_part_type(dtype));
    return emit(Hlo::Convert, {part}, TensorType{x.type.shape, dtype});
  }
  if (is_floating(x.type.dtype) && (dtype == DType::UInt8 || dtype == DType::Int8 || dtype == DType::Int16)) {
    // PyTorch's CPU casts truncate to a wide integer and wrap; XLA would saturate.
    V wide = emit(Hlo::Convert, {x}, TensorType{x.type.shape, DType::Int64});
    return emit(Hlo::Convert, {wide}, TensorType{x.type.shape, dtype});
  }
  return emit(Hlo::Convert, {x}, TensorType{x.type.shape, dtype});
}

V LoweringContext::real_part(const V& x) {
  if (!is_complex(x.type.dtype)) return x;
  return emit(Hlo::Real, {x}, TensorType{x.type.shape, real_part_type(x.type.dtype)});
}

V LoweringContext::imag_part(const V& x) {
  if (!is_complex(x.type.dtype)) return constant(0, x.type.dtype, x.type.shape);
  return emit(Hlo::Imag, {x}, TensorType{x.type.shape, real_part_type(x.type.dtype)});
}

V LoweringContext::make_complex(const V& real, const V& imag) {
  return emit(Hlo::Complex, {real, imag}, TensorType{real.type.shape, complex_type_of(real.type.dtype)});
}

V LoweringContext::conj(const V& x) {
  if (!is_complex(x.type.dtype)) return x;
  return make_complex(real_part(x), unary(Hlo::Negate, imag_part(x)));
}

V LoweringContext::reshape(const V& x, const std::vector<int64_t>& shape) {
  if (x.type.shape == shape) return x;
  return emit(Hlo::Reshape, {x}, TensorType{shape, x.type.dtype});
}

V LoweringContext::broadcast_in_dim(const V& x, const std::vector<int64_t>& shape, const std::vector<int64_t>& dims) {
  return emit(Hlo::BroadcastInDim, {x}, TensorType{shape, x.type.dtype},
              "broadcast_dimensions = " + format_dims(dims));
}

V LoweringContext::broadcast_to(const V& x, const std::vector<int64_t>& shape) {
  if (x.type.shape == shape) return x;
  size_t rank = shape.size(), xr = x.type.shape.size();
  if (xr > rank) throw std::logic_error("torchtpu: cannot broadcast " + x.type.str() + " to a lower rank");
  std::vector<int64_t> dims(xr);
  std::vector<int64_t> squeezed_shape;
  std::vector<int64_t> squeezed_dims;
  bool needs_reshape = false;
  for (size_t i = 0; i < xr; ++i) {
    dims[i] = static_cast<int64_t>(rank - xr + i);
    int64_t size = x.type.shape[i];
    if (size == shape[dims[i]]) {
      squeezed_shape.push_back(size);
      squeezed_dims.push_back(dims[i]);
    } else if (size == 1) {
      needs_reshape = true;
    } else {
      throw std::logic_error("torchtpu: cannot broadcast " + x.type.str() + " to " + format_list(shape));
    }
  }
  V source = x;
  if (needs_reshape) {
    source = reshape(x, squeezed_shape);
    dims = squeezed_dims;
  }
  return broadcast_in_dim(source, shape, dims);
}

V LoweringContext::transpose(const V& x, const std::vector<int64_t>& permutation) {
  bool identity = true;
  std::vector<int64_t> shape(permutation.size());
  for (size_t i = 0; i < permutation.size(); ++i) {
    shape[i] = x.type.shape[permutation[i]];
    identity &= permutation[i] == static_cast<int64_t>(i);
  }
  if (identity) return x;
  return emit(Hlo::Transpose, {x}, TensorType{shape, x.type.dtype},
              "permutation = " + format_dims(permutation));
}

V LoweringContext::slice(const V& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
                         const std::vector<int64_t>& strides) {
  std::vector<int64_t> shape(start.size());
  for (size_t i = 0; i < start.size(); ++i) {
    int64_t extent = limit[i] - start[i];
    shape[i] = extent <= 0 ? 0 : (extent + strides[i] - 1) / strides[i];
  }
  return emit(Hlo::Slice, {x}, TensorType{shape, x.type.dtype},
              "start_indices = " + format_dims(start) + ", limit_indices = " + format_dims(limit) +
                  ", strides = " + format_dims(strides));
}

V LoweringContext::concatenate(const std::vector<V>& xs, int64_t dim) {
  if (xs.size() == 1) return xs[0];
  TensorType type = xs[0].type;
  type.shape[dim] = 0;
  for (auto& x : xs) type.shape[dim] += x.type.shape[dim];
  return emit(Hlo::Concatenate, xs, type, "dimension = " + std::to_string(dim) + " : i64");
}

void LoweringContext::check_same_type(Hlo op, const V& a, const V& b) const {
  if (a.type == b.type) return;
  throw std::logic_error(std::string("torchtpu: ") + hlo_name(op) + " takes operands of one type, got " + a.type.mlir() +
                         " and " + b.type.mlir() + (node_ ? " (lowering " + node_->op.name() + ")" : ""));
}

V LoweringContext::unary(Hlo op, const V& x) { return emit(op, {x}, x.type); }

V LoweringContext::binary(Hlo op, const V& a, const V& b) {
  check_same_type(op, a, b);
  return emit(op, {a, b}, a.type);
}

V LoweringContext::compare(Cmp direction, const V& a, const V& b) {
  check_same_type(Hlo::Compare, a, b);
  return emit(Hlo::Compare, {a, b}, TensorType{a.type.shape, DType::Bool},
              std::string("comparison_direction = #stablehlo<comparison_direction ") + cmp_name(direction) +
                  ">, compare_type = #stablehlo<comparison_type " + compare_type(a.type.dtype) + ">");
}

V LoweringContext::select(const V& pred, const V& on_true, const V& on_false) {
  check_same_type(Hlo::Select, on_true, on_false);
  if (pred.type.dtype != DType::Bool || (pred.type.rank() != 0 && pred.type.shape != on_true.type.shape))
    throw std::logic_error(std::string("torchtpu: ") + hlo_name(Hlo::Select) +
                           " takes a bool predicate of its operands' shape or 0-d, got " + pred.type.mlir() + " for " +
                           on_true.type.mlir() +
                           (node_ ? " (lowering " + node_->op.name() + ")" : ""));
  return emit(Hlo::Select, {pred, on_true, on_false}, on_true.type);
}

V LoweringContext::reduce(const V& x, const std::vector<int64_t>& dims, const V& init, Hlo op) {
  TensorType scalar{{}, x.type.dtype};
  std::string body = region({scalar, scalar}, [&](const std::vector<V>& args) {
    return std::vector<V>{binary(op, args[0], args[1])};
  });
  std::vector<int64_t> shape;
  for (int64_t i = 0; i < x.type.rank(); ++i) {
    bool reduced = false;
    for (int64_t d : dims) reduced |= d == i;
    if (!reduced) shape.push_back(x.type.shape[i]);
  }
  return emit(Hlo::Reduce, {x, init}, TensorType{shape, x.type.dtype},
              "dimensions = " + format_dims(dims), body);
}

V LoweringContext::iota(const TensorType& type, int64_t dim) {
  return emit(Hlo::Iota, {}, type, "iota_dimension = " + std::to_string(dim) + " : i64");
}

V LoweringContext::dot_general(const V& lhs, const V& rhs, const std::vector<int64_t>& lhs_batch,
                               const std::vector<int64_t>& rhs_batch, const std::vector<int64_t>& lhs_contract,
                               const std::vector<int64_t>& rhs_contract, const TensorType& result) {
  DotDimensionNumbers numbers{lhs_batch, rhs_batch, lhs_contract, rhs_contract};
  return emit(Hlo::DotGeneral, {lhs, rhs}, result, "dot_dimension_numbers = " + numbers.attribute());
}

V LoweringContext::random_bits(const Node& node, const std::vector<int64_t>& shape, int bits) {
  // The last two args of a random node are its generator's seed and offset (lifted ints).
  int seed_arg = static_cast<int>(node.args.size()) - 2;
  V seed = scalar(node, seed_arg, DType::Int64);
  V offset = scalar(node, seed_arg + 1, DType::Int64);
  // Further draws within one op use further keys (the counter restarts at 0 for each).
  if (rng_calls_ > 0)
    seed = binary(Hlo::Add, seed, constant_int(static_cast<int64_t>(0x632BE59BD9B4E019ull) * rng_calls_, DType::Int64));
  ++rng_calls_;
  V state = concatenate({reshape(seed, {1}), reshape(offset, {1})}, 0);
  std::string state_u64 = "tensor<2xui64>";
  std::string name = fresh_name();
  append("    " + name + " = \"" + hlo_name(Hlo::BitcastConvert) + "\"(" + state.name + ") : (tensor<2xi64>) -> " + state_u64 + "\n");
  std::string bits_type = "tensor<";
  for (int64_t d : shape) bits_type += std::to_string(d) + "x";
  bits_type += bits == 64 ? "ui64>" : "ui32>";
  std::string out = fresh_name();
  append("    " + out + ":2 = \"" + hlo_name(Hlo::RngBitGenerator) + "\"(" + name +
         ") {rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>} : (" + state_u64 + ") -> (" + state_u64 + ", " +
         bits_type + ")\n");
  // Reinterpret as signed integers of the same width so the rest of the lowering uses i32/i64.
  TensorType signed_type{shape, bits == 64 ? DType::Int64 : DType::Int32};
  std::string result = fresh_name();
  append("    " + result + " = \"" + hlo_name(Hlo::BitcastConvert) + "\"(" + out + "#1) : (" + bits_type + ") -> " +
         signed_type.mlir() + "\n");
  return V{result, signed_type};
}

V LoweringContext::random_uniform(const Node& node, const std::vector<int64_t>& shape, DType dtype) {
  if (dtype == DType::Float64) {
    V bits = random_bits(node, shape, 64);
    V mantissa = binary(Hlo::ShiftRightLogical, bits, constant_int(12, DType::Int64, shape));
    V one_bits = binary(Hlo::Or, mantissa, constant_int(0x3FF0000000000000ll, DType::Int64, shape));
    V in_one_two = emit(Hlo::BitcastConvert, {one_bits}, TensorType{shape, DType::Float64});
    return binary(Hlo::Subtract, in_one_two, constant(1.0, DType::Float64, shape));
  }
  V bits = random_bits(node, shape, 32);
  V mantissa = binary(Hlo::ShiftRightLogical, bits, constant_int(9, DType::Int32, shape));
  V one_bits = binary(Hlo::Or, mantissa, constant_int(0x3F800000, DType::Int32, shape));
  V in_one_two = emit(Hlo::BitcastConvert, {one_bits}, TensorType{shape, DType::Float32});
  V uniform = binary(Hlo::Subtract, in_one_two, constant(1.0, DType::Float32, shape));
  if (dtype == DType::Float32) return uniform;
  // Rounding to a narrower type can reach 1.0; keep the result in [0, 1).
  V narrow = convert(uniform, dtype);
  double below_one = dtype == DType::BFloat16 ? 0.99609375 : 0.99951171875;
  V one = constant(1.0, dtype, shape);
  return select(compare(Cmp::GE, narrow, one), constant(below_one, dtype, shape), narrow);
}

}  // namespace torchtpu
