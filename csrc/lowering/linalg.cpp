// Linear algebra that StableHLO has ops for: Cholesky factorization and triangular solves
// (linalg_cholesky_ex, cholesky, cholesky_inverse, _cholesky_solve_helper,
// linalg_solve_triangular, triangular_solve). XLA implements them per platform (its own
// expanders on CPU and TPU, cuSOLVER / cuBLAS on GPU). The other factorizations (LU, QR,
// eigh, SVD, ...) come from JAX's linalg lowerings: torchtpu/_linalg.py.
//
// The rule data "linalg" tells the device layer that these ops take float32 / float64 only
// (PyTorch's CPU and CUDA kernels raise for other dtypes; the CPU kernel raises that error).
#include "lowering/common.h"

namespace torchtpu {
namespace {

constexpr const char* kLinalg = "linalg";

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
  V keep = ctx.compare(lower ? "GE" : "LE", rows, cols);
  return ctx.select(keep, x, ctx.constant(0, x.type.dtype, x.type.shape));
}

// Solves op(a) x = b (left_side) or x op(a) = b, a triangular; batch dims must agree.
V triangular_solve(LoweringContext& ctx, const V& a, const V& b, bool left_side, bool lower, bool unit_diagonal,
                   bool transpose_a) {
  std::string attrs = std::string("left_side = ") + (left_side ? "true" : "false") +
                      ", lower = " + (lower ? "true" : "false") +
                      ", unit_diagonal = " + (unit_diagonal ? "true" : "false") +
                      ", transpose_a = #stablehlo<transpose " + (transpose_a ? "TRANSPOSE" : "NO_TRANSPOSE") + ">";
  return ctx.emit("stablehlo.triangular_solve", {a, b}, b.type, attrs);
}

// The lower (L L^T) or upper (U^T U) Cholesky factor of a, read from that triangle of a as
// LAPACK does; the other triangle is zeroed (StableHLO leaves it undefined).
V cholesky_factor(LoweringContext& ctx, const V& a, bool upper) {
  V factor = ctx.emit("stablehlo.cholesky", {a}, a.type, upper ? "lower = false" : "lower = true");
  return keep_triangle(ctx, factor, !upper);
}

// LAPACK's potrf info from a factor: 1 + the first column whose diagonal is not positive
// (the factorization breaks down there and XLA's result is NaN from that column on), or 0.
V cholesky_info(LoweringContext& ctx, const V& factor, const TensorType& info_type) {
  int64_t r = factor.type.rank(), n = factor.type.shape[r - 1];
  TensorType square{matrix_shape(batch_of(factor.type.shape), n, n), DType::Int32};
  V on_diagonal = ctx.compare("EQ", ctx.iota(square, r - 2), ctx.iota(square, r - 1));
  V zero = ctx.constant(0, factor.type.dtype, factor.type.shape);
  V positive = ctx.compare("GT", factor, zero);  // false for NaN
  V failed = ctx.emit("stablehlo.and", {on_diagonal, ctx.emit("stablehlo.not", {positive}, positive.type)},
                      on_diagonal.type);
  V column = ctx.binary("stablehlo.add", ctx.iota(square, r - 1), ctx.constant_int(1, DType::Int32, square.shape));
  V none = ctx.constant_int(n + 1, DType::Int32, square.shape);
  V first = ctx.reduce(ctx.select(failed, column, none), {r - 2, r - 1},
                       ctx.constant_int(n + 1, DType::Int32), "stablehlo.minimum");
  V found = ctx.compare("LE", first, ctx.constant_int(n, DType::Int32, info_type.shape));
  return ctx.select(found, first, ctx.constant_int(0, DType::Int32, info_type.shape));
}

// linalg_cholesky_ex(self, *, upper, check_errors) -> (L, info); cholesky(self, upper) -> L.
// (check_errors is the device layer's: it raises from info after recording.)
void lower_cholesky(LoweringContext& ctx, const Node& node) {
  V factor = cholesky_factor(ctx, ctx.input(node, 0), node.args.at(1).as_bool());
  if (node.outputs.size() == 1) ctx.set_result(factor);
  else ctx.set_results({factor, cholesky_info(ctx, factor, ctx.out(node, 1))});
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
  V identity = ctx.convert(ctx.compare("EQ", ctx.iota(TensorType{out.shape, DType::Int32}, r - 2),
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

LOWERING("aten::linalg_cholesky_ex", lower_cholesky, kLinalg);
LOWERING("aten::cholesky", lower_cholesky, kLinalg);
LOWERING("aten::_cholesky_solve_helper", lower_cholesky_solve, kLinalg);
LOWERING("aten::cholesky_inverse", lower_cholesky_inverse, kLinalg);
LOWERING("aten::linalg_solve_triangular", lower_linalg_solve_triangular, kLinalg);
LOWERING("aten::triangular_solve", lower_triangular_solve, kLinalg);

}  // namespace
}  // namespace torchtpu
