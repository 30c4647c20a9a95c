// Matrix and vector products: mm, bmm, addmm, baddbmm, mv, addmv, dot, vdot, addbmm (complex
// too), cross.
#include "lowering/common.h"

namespace torchtpu {
namespace {

// beta * self + alpha * product for the add* family (args: self, _, _, beta, alpha). A
// float16/bfloat16 product comes unrounded in float32 (`product`'s dtype): CPU's gemm scales
// and adds in float32 and rounds once.
V beta_self_plus_alpha(LoweringContext& ctx, const Node& node, V product) {
  const TensorType& out = ctx.out(node);
  DType acc = product.type.dtype;
  const Arg& beta = node.args[3];
  const Arg& alpha = node.args[4];
  if (!alpha.is_constant(1.0))
    product = ctx.binary(Hlo::Multiply, product, ctx.broadcast_to(ctx.scalar(node, 4, acc), out.shape));
  if (beta.is_constant(0.0)) return ctx.convert(product, out.dtype);  // PyTorch ignores self (even NaN) when beta is 0
  V self = to_type(ctx, ctx.input(node, 0), acc, out.shape);
  if (!beta.is_constant(1.0))
    self = ctx.binary(Hlo::Multiply, self, ctx.broadcast_to(ctx.scalar(node, 3, acc), out.shape));
  return ctx.convert(ctx.binary(Hlo::Add, self, product), out.dtype);
}

// The add* family's product type: float32 for half types (rounded once, after the add).
TensorType product_type(const TensorType& out) { return TensorType{out.shape, compute_dtype(out.dtype)}; }

// CPU's dtype checks (the meta kernels promote instead): mm's, and the add* family's.
void check_mm_dtypes(const V& m1, const V& m2) {
  check_argument(m1.type.dtype == m2.type.dtype, std::string("expected m1 and m2 to have the same dtype, but got: ") +
                                                     cpp_type_name(m1.type.dtype) + " != " + cpp_type_name(m2.type.dtype));
}

void check_addmm_dtypes(const V& self, const V& mat1, const V& mat2) {
  check_argument(self.type.dtype == mat2.type.dtype, std::string("self and mat2 must have the same dtype, but got ") +
                                                         scalar_type_name(self.type.dtype) + " and " +
                                                         scalar_type_name(mat2.type.dtype));
  check_argument(mat1.type.dtype == mat2.type.dtype, std::string("mat1 and mat2 must have the same dtype, but got ") +
                                                         scalar_type_name(mat1.type.dtype) + " and " +
                                                         scalar_type_name(mat2.type.dtype));
}

void check_addmv_dtypes(DType self, const V& mat, const V& vec) {
  check_argument(self == mat.type.dtype && mat.type.dtype == vec.type.dtype,
                 std::string("addmv input tensors must have the same dtype, but got ") + scalar_type_name(self) + ", " +
                     scalar_type_name(mat.type.dtype) + ", and " + scalar_type_name(vec.type.dtype));
}

// mm(self, mat2) and bmm(self, mat2): contract the last dim of self with mat2's dim -2.
void lower_matmul(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  check_mm_dtypes(ctx.input(node, 0), ctx.input(node, 1));
  V a = ctx.convert(ctx.input(node, 0), out.dtype);
  V b = ctx.convert(ctx.input(node, 1), out.dtype);
  if (a.type.rank() == 3)
    ctx.set_result(ctx.dot_general(a, b, {0}, {0}, {2}, {1}, out));
  else
    ctx.set_result(ctx.dot_general(a, b, {}, {}, {1}, {0}, out));
}

// addmm(self, mat1, mat2, beta, alpha) and baddbmm: beta * self + alpha * (mat1 @ mat2).
void lower_addmm(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  check_addmm_dtypes(ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2));
  V a = ctx.convert(ctx.input(node, 1), out.dtype);
  V b = ctx.convert(ctx.input(node, 2), out.dtype);
  V product = a.type.rank() == 3 ? ctx.dot_general(a, b, {0}, {0}, {2}, {1}, product_type(out))
                                 : ctx.dot_general(a, b, {}, {}, {1}, {0}, product_type(out));
  ctx.set_result(beta_self_plus_alpha(ctx, node, product));
}

// mv(self, vec), dot(self, tensor): contract the last dim of self with the vector.
void lower_mv_dot(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  // mv runs as addmv into a result of the vector's dtype.
  if (node.op.name() == "aten::mv") check_addmv_dtypes(ctx.input(node, 1).type.dtype, ctx.input(node, 0), ctx.input(node, 1));
  V a = ctx.convert(ctx.input(node, 0), out.dtype);
  V b = ctx.convert(ctx.input(node, 1), out.dtype);
  ctx.set_result(ctx.dot_general(a, b, {}, {}, {a.type.rank() - 1}, {0}, out));
}

// vdot(self, other): dot with self conjugated.
void lower_vdot(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V a = ctx.conj(ctx.convert(ctx.input(node, 0), out.dtype));
  V b = ctx.convert(ctx.input(node, 1), out.dtype);
  ctx.set_result(ctx.dot_general(a, b, {}, {}, {0}, {0}, out));
}

// addmv(self, mat, vec, beta, alpha) and addbmm(self, batch1, batch2, beta, alpha):
// beta * self + alpha * product (addbmm sums the batch of products).
void lower_addmv_addbmm(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  if (ctx.input(node, 1).type.rank() == 3) check_addmm_dtypes(ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2));
  else check_addmv_dtypes(ctx.input(node, 0).type.dtype, ctx.input(node, 1), ctx.input(node, 2));
  V a = ctx.convert(ctx.input(node, 1), out.dtype);
  V b = ctx.convert(ctx.input(node, 2), out.dtype);
  V product = a.type.rank() == 3 ? ctx.dot_general(a, b, {}, {}, {0, 2}, {0, 1}, product_type(out))  // sum over batch and k
                                 : ctx.dot_general(a, b, {}, {}, {1}, {0}, product_type(out));
  ctx.set_result(beta_self_plus_alpha(ctx, node, product));
}

// linalg_cross(self, other, dim): the cross product of 3-vectors along dim (inputs broadcast).
void lower_cross(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V a = to_type(ctx, ctx.input(node, 0), out.dtype, out.shape);
  V b = to_type(ctx, ctx.input(node, 1), out.dtype, out.shape);
  int64_t dim = wrap_dim(node.args[2].i, out.rank());
  auto component = [&](const V& x, int64_t i) {
    std::vector<int64_t> start(out.rank(), 0), limit = out.shape, ones(out.rank(), 1);
    start[dim] = i;
    limit[dim] = i + 1;
    return ctx.slice(x, start, limit, ones);
  };
  auto term = [&](int64_t i, int64_t j) {
    return ctx.binary(Hlo::Subtract, ctx.binary(Hlo::Multiply, component(a, i), component(b, j)),
                      ctx.binary(Hlo::Multiply, component(a, j), component(b, i)));
  };
  ctx.set_result(ctx.concatenate({term(1, 2), term(2, 0), term(0, 1)}, dim));
}

LOWERING("aten::mm", lower_matmul, nullptr, kComplexNoBool);
LOWERING("aten::linalg_cross", lower_cross, nullptr, kNoBool);
LOWERING("aten::mv", lower_mv_dot, nullptr, kComplexNoBool);
LOWERING("aten::dot", lower_mv_dot, nullptr, kComplexNoBool);
LOWERING("aten::vdot", lower_vdot, nullptr, kComplexNoBool);
LOWERING("aten::addmv", lower_addmv_addbmm, nullptr, kComplexNoBool);
LOWERING("aten::addbmm", lower_addmv_addbmm, nullptr, kComplexNoBool);
LOWERING("aten::bmm", lower_matmul, nullptr, kComplexNoBool);
LOWERING("aten::addmm", lower_addmm, nullptr, kComplexNoBool);
LOWERING("aten::baddbmm", lower_addmm, nullptr, kComplexNoBool);

}  // namespace
}  // namespace torchtpu
