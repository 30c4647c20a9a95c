// Linear algebra that StableHLO has ops for: Cholesky factorization and triangular solves
// (linalg_cholesky_ex, cholesky, cholesky_inverse, _cholesky_solve_helper,
// linalg_solve_triangular, triangular_solve). XLA implements them per platform (its own
// expanders on CPU and TPU, cuSOLVER / cuBLAS on GPU). The other factorizations (LU, QR,
// eigh, SVD, ...) come from JAX's linalg lowerings: torchtpu/_linalg.py.
//
// RuleFlags::float32_or_float64 tells the device layer that these ops take float32 / float64
// only (PyTorch's CPU and CUDA kernels raise for other dtypes; the CPU kernel raises that error).
#include "lowering/common.h"

namespace torchtpu {
namespace {

constexpr RuleFlags kLinalg{.float32_or_float64 = true};

std::vector<int64_t> batch_of(const std::vector<int64_t>& shape) {
  return std::vector<int64_t>(shape.begin(), shape.end() - 2);
}

std::vector<int64_t> matrix_shape(std::vector<int64_t> batch, int64_t rows, int64_t cols) {
  batch.push_back(rows);
  batch.push_back(cols);
  return batch;
}

// x broadcast to `batch` + its own matrix dims (PyTorch broadcasts batch dims of operands).
V broadcast_batch(LoweringContext& ctx, const V& x, const std::vector<int64_t>& batch) {
  int64_t r = x.type.rank();
  return ctx.broadcast_to(x, matrix_shape(batch, x.type.shape[r - 2], x.type.shape[r - 1]));
}

// x with the other triangle (above the diagonal when `lower`, below otherwise) zeroed.
V keep_triangle(LoweringContext& ctx, const V& x, bool lower) {
  int64_t r = x.type.rank();
  TensorType index{x.type.shape, DType::Int64};
  V rows = ctx.iota(index, r - 2), cols = ctx.iota(index, r - 1);
  V keep = ctx.compare(lower ? Cmp::GE : Cmp::LE, rows, cols);
  return ctx.select(keep, x, ctx.constant(0, x.type.dtype, x.type.shape));
}

// Solves op(a) x = b (left_side) or x op(a) = b, a triangular; batch dims must agree.
V triangular_solve(LoweringContext& ctx, const V& a, const V& b, bool left_side, bool lower, bool unit_diagonal,
                   bool transpose_a) {
  std::string attrs = std::string("left_side = ") + (left_side ? "true" : "false") +
                      ", lower = " + (lower ? "true" : "false") +
                      ", unit_diagonal = " + (unit_diagonal ? "true" : "false") +
                      ", transpose_a = #stablehlo<transpose " + (transpose_a ? "TRANSPOSE" : "NO_TRANSPOSE") + ">";
  return ctx.emit(Hlo::TriangularSolve, {a, b}, b.type, attrs);
}

// The lower (L L^T) or upper (U^T U) Cholesky factor of a, read from that triangle of a as
// LAPACK does; the other triangle is zeroed (StableHLO leaves it undefined).
V cholesky_factor(LoweringContext& ctx, const V& a, bool upper) {
  V factor = ctx.emit(Hlo::Cholesky, {a}, a.type, upper ? "lower = false" : "lower = true");
  return keep_triangle(ctx, factor, !upper);
}

std::vector<int64_t> without_last(std::vector<int64_t> shape) {
  shape.pop_back();
  return shape;
}

// One step k of Gaussian elimination without pivoting on m (batch of N x N): the pivot
// m[k, k] is checked (info = k + 1 where it is not positive and info is still 0), then the
// rows and columns after k are updated. Returns (m', info').
std::vector<V> eliminate_step(LoweringContext& ctx, const V& k, const V& m, const V& info) {
  const std::vector<int64_t>& shape = m.type.shape;
  int64_t r = m.type.rank();
  std::vector<int64_t> vector_shape = without_last(shape);
  TensorType index{shape, DType::Int64};
  V k_matrix = ctx.broadcast_to(k, shape);
  V is_row = ctx.compare(Cmp::EQ, ctx.iota(index, r - 2), k_matrix);
  V is_col = ctx.compare(Cmp::EQ, ctx.iota(index, r - 1), k_matrix);
  V zero = ctx.constant(0, m.type.dtype, shape);
  V zero_scalar = ctx.constant(0, m.type.dtype);
  V row = ctx.reduce(ctx.select(is_row, m, zero), {r - 2}, zero_scalar, Hlo::Add);  // m[k, :]
  V col = ctx.reduce(ctx.select(is_col, m, zero), {r - 1}, zero_scalar, Hlo::Add);  // m[:, k]
  V at_pivot = ctx.emit(Hlo::And, {is_row, is_col}, is_row.type);
  V pivot = ctx.reduce(ctx.select(at_pivot, m, zero), {r - 2, r - 1}, zero_scalar, Hlo::Add);
  V not_positive = ctx.emit(Hlo::Not, {ctx.compare(Cmp::GT, pivot, ctx.constant(0, m.type.dtype, pivot.type.shape))},
                            TensorType{pivot.type.shape, DType::Bool});
  V unset = ctx.compare(Cmp::EQ, info, ctx.constant_int(0, DType::Int32, info.type.shape));
  V order = ctx.broadcast_to(ctx.convert(ctx.binary(Hlo::Add, k, ctx.constant_int(1, DType::Int64)), DType::Int32),
                             info.type.shape);
  V new_info = ctx.select(ctx.emit(Hlo::And, {not_positive, unset}, unset.type), order, info);
  V after = ctx.compare(Cmp::GT, ctx.iota(TensorType{vector_shape, DType::Int64}, r - 2), ctx.broadcast_to(k, vector_shape));
  V zero_vector = ctx.constant(0, m.type.dtype, vector_shape);
  std::vector<int64_t> rows_dims, cols_dims;
  for (int64_t d = 0; d < r - 2; ++d) {
    rows_dims.push_back(d);
    cols_dims.push_back(d);
  }
  rows_dims.push_back(r - 2);
  cols_dims.push_back(r - 1);
  V u = ctx.broadcast_in_dim(ctx.select(after, col, zero_vector), shape, rows_dims);
  V v = ctx.broadcast_in_dim(ctx.select(after, row, zero_vector), shape, cols_dims);
  V p = ctx.broadcast_in_dim(pivot, shape, std::vector<int64_t>(rows_dims.begin(), rows_dims.end() - 1));
  V update = ctx.binary(Hlo::Divide, ctx.binary(Hlo::Multiply, u, v), p);
  return {ctx.binary(Hlo::Subtract, m, update), new_info};
}

// LAPACK potrf's info: the order of the first leading minor that is not positive definite,
// or 0. XLA's factorization returns NaN everywhere when it fails, which hides where: so when
// some factor has a NaN, Gaussian elimination without pivoting of the symmetric matrix read
// from the same triangle finds the first pivot that is not positive (a stablehlo.if: the
// loop runs only then).
V cholesky_info(LoweringContext& ctx, const V& a, const V& factor, bool upper, const TensorType& info_type) {
  int64_t r = a.type.rank(), n = a.type.shape[r - 1];
  std::vector<int64_t> all_dims(r);
  for (int64_t d = 0; d < r; ++d) all_dims[d] = d;
  V nan = ctx.compare(Cmp::NE, factor, factor);
  V failed = ctx.reduce(nan, all_dims, ctx.constant(0, DType::Bool), Hlo::Or);
  TensorType index_scalar{{}, DType::Int64};
  std::string on_failure = ctx.region({}, [&](const std::vector<V>&) {
    TensorType index{a.type.shape, DType::Int64};
    V read = ctx.compare(upper ? Cmp::LE : Cmp::GE, ctx.iota(index, r - 2), ctx.iota(index, r - 1));
    std::vector<int64_t> swap(r);
    for (int64_t d = 0; d < r; ++d) swap[d] = d;
    std::swap(swap[r - 1], swap[r - 2]);
    V symmetric = ctx.select(read, a, ctx.transpose(a, swap));
    std::vector<V> init = {ctx.constant_int(0, DType::Int64), symmetric, ctx.constant_int(0, DType::Int32, info_type.shape)};
    std::vector<TensorType> types = {index_scalar, a.type, info_type};
    std::string cond = ctx.region(types, [&](const std::vector<V>& state) {
      return std::vector<V>{ctx.compare(Cmp::LT, state[0], ctx.constant_int(n, DType::Int64))};
    });
    std::string body = ctx.region(types, [&](const std::vector<V>& state) {
      std::vector<V> next = eliminate_step(ctx, state[0], state[1], state[2]);
      V k = ctx.binary(Hlo::Add, state[0], ctx.constant_int(1, DType::Int64));
      return std::vector<V>{k, next[0], next[1]};
    });
    return std::vector<V>{ctx.emit_multi(Hlo::While, init, types, "", cond + ", " + body)[2]};
  });
  std::string on_success = ctx.region({}, [&](const std::vector<V>&) {
    return std::vector<V>{ctx.constant_int(0, DType::Int32, info_type.shape)};
  });
  return ctx.emit(Hlo::If, {failed}, info_type, "", on_failure + ", " + on_success);
}

// linalg_cholesky_ex(self, *, upper, check_errors) -> (L, info); cholesky(self, upper) -> L.
// (check_errors is the device layer's: it raises from info after recording.)
void lower_cholesky(LoweringContext& ctx, const Node& node) {
  V a = ctx.input(node, 0);
  bool upper = node.args.at(1).as_bool();
  V factor = cholesky_factor(ctx, a, upper);
  if (node.outputs.size() == 1) ctx.set_result(factor);
  else ctx.set_results({factor, cholesky_info(ctx, a, factor, upper, ctx.out(node, 1))});
}

// X = A^-1 B with A = L L^T (lower factor) or U^T U (upper): two triangular solves.
V solve_with_factor(LoweringContext& ctx, const V& factor, const V& b, bool upper) {
  V y = triangular_solve(ctx, factor, b, true, !upper, false, /*transpose_a=*/upper);
  return triangular_solve(ctx, factor, y, true, !upper, false, /*transpose_a=*/!upper);
}

// _cholesky_solve_helper(self, A, upper): self = B, A = the factor (batch dims already
// broadcast by cholesky_solve).
void lower_cholesky_solve(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V b = ctx.broadcast_to(ctx.input(node, 0), out.shape);
  V factor = broadcast_batch(ctx, ctx.input(node, 1), batch_of(out.shape));
  ctx.set_result(solve_with_factor(ctx, factor, b, node.args.at(2).as_bool()));
}

// cholesky_inverse(self, upper): A^-1 from A's Cholesky factor.
void lower_cholesky_inverse(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V factor = ctx.input(node, 0);
  int64_t r = out.rank();
  V identity = ctx.convert(ctx.compare(Cmp::EQ, ctx.iota(TensorType{out.shape, DType::Int32}, r - 2),
                                       ctx.iota(TensorType{out.shape, DType::Int32}, r - 1)),
                           out.dtype);
  ctx.set_result(solve_with_factor(ctx, factor, identity, node.args.at(1).as_bool()));
}

// linalg_solve_triangular(self, B, *, upper, left, unitriangular): self is triangular;
// solves self X = B (left) or X self = B.
void lower_linalg_solve_triangular(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V b = ctx.broadcast_to(ctx.input(node, 1), out.shape);
  V a = broadcast_batch(ctx, ctx.input(node, 0), batch_of(out.shape));
  bool upper = node.args.at(2).as_bool(), left = node.args.at(3).as_bool(), unit = node.args.at(4).as_bool();
  ctx.set_result(triangular_solve(ctx, a, b, left, !upper, unit, false));
}

// triangular_solve(self, A, upper, transpose, unitriangular) -> (solution, cloned_coefficient):
// solves op(A) X = self, op(A) = A or A^T.
void lower_triangular_solve(LoweringContext& ctx, const Node& node) {
  V b = ctx.broadcast_to(ctx.input(node, 0), ctx.out(node, 0).shape);
  V a = ctx.broadcast_to(ctx.input(node, 1), ctx.out(node, 1).shape);
  bool upper = node.args.at(2).as_bool(), transpose = node.args.at(3).as_bool(), unit = node.args.at(4).as_bool();
  ctx.set_results({triangular_solve(ctx, a, b, true, !upper, unit, transpose), a});
}

LOWERING("aten::linalg_cholesky_ex", lower_cholesky, nullptr, kLinalg);
LOWERING("aten::cholesky", lower_cholesky, nullptr, kLinalg);
LOWERING("aten::_cholesky_solve_helper", lower_cholesky_solve, nullptr, kLinalg);
LOWERING("aten::cholesky_inverse", lower_cholesky_inverse, nullptr, kLinalg);
LOWERING("aten::linalg_solve_triangular", lower_linalg_solve_triangular, nullptr, kLinalg);
LOWERING("aten::triangular_solve", lower_triangular_solve, nullptr, kLinalg);

}  // namespace
}  // namespace torchtpu
