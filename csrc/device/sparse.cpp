// Sparse COO tensors on tpu: PyTorch's generic SparseTensorImpl whose indices and values are
// dense tpu tensors. What training with sparse gradients needs (building, coalescing, adding into
// a dense tensor, sparse_mask, to_dense, scaling) is done by dense tpu ops; every other sparse
// op runs on CPU through the counted fallback.
#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/copy_sparse_to_sparse_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/resize_as_sparse_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/zero_native.h>
#include <torch/library.h>

#include "device/kernels.h"

namespace torchtpu {
namespace {

// A sparse tensor over the given parts; the parts are immutable tpu values, shared, not copied.
at::Tensor make_sparse(const at::Tensor& like, const at::Tensor& indices, const at::Tensor& values, bool coalesced) {
  at::Tensor result = at::native::new_with_dims_and_tensor_sparse_symint(
      like.sparse_dim(), like.dense_dim(), like.sym_sizes(), indices, values, values.scalar_type(), at::kSparse,
      values.device(), std::nullopt, coalesced);
  return result;
}

// The indices as one index tensor per sparse dimension (what index/index_put take).
c10::List<std::optional<at::Tensor>> index_rows(const at::Tensor& indices) {
  c10::List<std::optional<at::Tensor>> rows;
  for (int64_t d = 0; d < indices.size(0); ++d) rows.push_back(indices.select(0, d));
  return rows;
}

// Functionalization turns the view ops `_indices`/`_values` into their copy variants: the
// parts are immutable tpu values, so a clone shares them without a copy on device.
at::Tensor indices_part(const at::Tensor& self) { return at::native::_indices_sparse(self).clone(); }
at::Tensor values_part(const at::Tensor& self) { return at::native::_values_sparse(self).clone(); }
// (PyTorch's indices()/values() kernels return an alias, which a tpu value need not be.)
at::Tensor coalesced_indices_copy(const at::Tensor& self) {
  TORCH_CHECK(self.is_coalesced(), "Cannot get indices on an uncoalesced tensor, please call .coalesce() first");
  return indices_part(self);
}
at::Tensor coalesced_values_copy(const at::Tensor& self) {
  TORCH_CHECK(self.is_coalesced(), "Cannot get values on an uncoalesced tensor, please call .coalesce() first");
  return values_part(self);
}
at::Tensor sparse_detach_copy(const at::Tensor& self) {
  return make_sparse(self, self._indices(), self._values(), self.is_coalesced());
}

// A tpu tensor (sparse or dense) as a CPU one, and back.
at::Tensor to_cpu(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) return t;
  if (!t.is_sparse()) return t.cpu();
  return at::native::new_with_dims_and_tensor_sparse_symint(t.sparse_dim(), t.dense_dim(), t.sym_sizes(), t._indices().cpu(),
                                                            t._values().cpu(), t.scalar_type(), at::kSparse,
                                                            c10::Device(c10::kCPU), std::nullopt, t.is_coalesced());
}

at::Tensor to_tpu(const at::Tensor& t, c10::Device device) {
  if (!t.defined() || t.device().type() != c10::kCPU) return t;
  if (!t.is_sparse()) return t.to(device);
  return at::native::new_with_dims_and_tensor_sparse_symint(t.sparse_dim(), t.dense_dim(), t.sym_sizes(),
                                                            t._indices().to(device), t._values().to(device),
                                                            t.scalar_type(), at::kSparse, device, std::nullopt,
                                                            t.is_coalesced());
}

// Every other sparse op: on CPU, counted like any fallback. PyTorch's own boxed CPU fallback
// handles strided tensors only; this one moves sparse tensors by their parts.
void sparse_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  admit_fallback(op);
  const auto& schema = op.schema();
  size_t n = schema.arguments().size();
  auto args_begin = stack->end() - static_cast<std::ptrdiff_t>(n);
  std::vector<c10::IValue> originals(args_begin, stack->end());
  c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_of_args(originals)));
  for (auto it = args_begin; it != stack->end(); ++it) {
    if (it->isTensor()) {
      *it = to_cpu(it->toTensor());
    } else if (it->isTensorList()) {
      c10::List<at::Tensor> host;
      for (const at::Tensor& t : it->toTensorList()) host.push_back(to_cpu(t));
      *it = std::move(host);
    } else if (it->isGenerator() && it->toGenerator().device().type() == c10::DeviceType::PrivateUse1) {
      *it = c10::IValue();  // CPU kernels draw from CPU's generator
    }
  }
  op.callBoxed(stack);
  // Arguments the op wrote: the CPU result goes back into the tpu tensor.
  for (size_t i = 0; i < n; ++i) {
    const auto* alias = schema.arguments()[i].alias_info();
    if (!alias || !alias->isWrite() || !originals[i].isTensor()) continue;
    at::Tensor target = originals[i].toTensor();
    TORCH_CHECK(target.device().type() == c10::DeviceType::PrivateUse1, "torchtpu: ", op_name(op), " wrote a ",
                target.device(), " tensor in the tpu fallback");
    // The written CPU argument is the op's result of the same alias set.
    for (size_t r = 0; r < schema.returns().size(); ++r) {
      const auto* result_alias = schema.returns()[r].alias_info();
      if (!result_alias || result_alias->beforeSets() != alias->beforeSets()) continue;
      at::Tensor written = (*stack)[stack->size() - schema.returns().size() + r].toTensor();
      if (target.is_sparse()) at::native::copy_sparse_(target, to_tpu(written, device), false);
      else target.copy_(to_tpu(written, device));
      (*stack)[stack->size() - schema.returns().size() + r] = target;
    }
  }
  size_t returns = schema.returns().size();
  for (size_t r = 0; r < returns; ++r) {
    c10::IValue& v = (*stack)[stack->size() - returns + r];
    if (v.isTensor()) {
      v = to_tpu(v.toTensor(), device);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(to_tpu(t, device));
      v = std::move(out);
    }
  }
}

// Duplicates summed, indices sorted (row-major over the sparse dimensions), as CPU's kernel.
at::Tensor sparse_coalesce(const at::Tensor& self) {
  at::Tensor indices = self._indices(), values = self._values();
  if (self.is_coalesced() || self._nnz() < 2) return make_sparse(self, indices.clone(), values.clone(), true);
  int64_t sparse_dim = self.sparse_dim();
  std::vector<int64_t> strides(static_cast<size_t>(sparse_dim), 1);
  for (int64_t d = sparse_dim - 2; d >= 0; --d) strides[d] = strides[d + 1] * self.size(d + 1);
  at::Tensor linear = at::zeros({indices.size(1)}, indices.options());
  for (int64_t d = 0; d < sparse_dim; ++d) linear = linear + indices.select(0, d) * strides[d];
  auto [unique, inverse, counts] = at::_unique2(linear, /*sorted=*/true, /*return_inverse=*/true, false);
  std::vector<int64_t> value_shape = values.sizes().vec();
  value_shape[0] = unique.size(0);
  at::Tensor summed = at::zeros(value_shape, values.options()).index_add(0, inverse, values);
  std::vector<at::Tensor> rows;
  for (int64_t d = 0; d < sparse_dim; ++d) rows.push_back(at::remainder(at::floor_divide(unique, strides[d]), self.size(d)));
  return make_sparse(self, at::stack(rows), summed, true);
}

at::Tensor sparse_to_dense(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<bool>) {
  at::ScalarType type = dtype.value_or(self.scalar_type());
  at::Tensor dense = at::zeros(self.sizes(), self._values().options().dtype(type));
  if (self._nnz() == 0) return dense;
  return dense.index_put(index_rows(self._indices()), self._values().to(type), /*accumulate=*/true);
}

void check_same_size(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.sizes().equals(other.sizes()), "add: expected 'self' and 'other' to have same size, but self has size ",
              self.sizes(), " while other has size ", other.sizes(),
              " (FYI: dense-sparse addition does not currently support broadcasting)");
}

// dense + alpha * sparse (a dense result) or, both coalesced, sparse + alpha * sparse (the
// parts side by side, coalesced: CPU's merge of two coalesced tensors gives the same).
at::Tensor sparse_add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  TORCH_CHECK(!(self.is_sparse() && !other.is_sparse()), "add(sparse, dense) is not supported. Use add(dense, sparse) instead.");
  check_same_size(self, other);
  at::ScalarType common = at::promoteTypes(self.scalar_type(), other.scalar_type());
  at::Tensor scaled = other._values().to(common);
  if (!(alpha.isIntegral(true) && alpha.toLong() == 1)) scaled = scaled * alpha;
  if (!self.is_sparse()) {
    at::Tensor dense = self.to(common);
    if (other._nnz() == 0) return dense.clone();
    return dense.index_put(index_rows(other._indices()), scaled, /*accumulate=*/true);
  }
  TORCH_CHECK(self.sparse_dim() == other.sparse_dim() && self.dense_dim() == other.dense_dim(),
              "add: expected 'self' and 'other' to have the same sparse and dense dimensions");
  TORCH_INTERNAL_ASSERT(self.is_coalesced() && other.is_coalesced(), "torchtpu: uncoalesced sparse add on tpu");
  return sparse_coalesce(make_sparse(self, at::cat({self._indices(), other._indices()}, 1),
                                     at::cat({self._values().to(common), scaled}, 0), false));
}

// Writes `result` into `out` (a dense tpu tensor below functionalization, or a sparse one).
at::Tensor& assign(at::Tensor& out, const at::Tensor& result) {
  if (out.is_sparse()) {
    TORCH_CHECK(result.is_sparse(), "add: a dense result cannot be written into a sparse tensor");
    at::native::copy_sparse_(out, result, false);
    return out;
  }
  TORCH_CHECK(at::canCast(result.scalar_type(), out.scalar_type()), "result type ", result.scalar_type(),
              " can't be cast to the desired output type ", out.scalar_type());
  if (!out.sizes().equals(result.sizes())) out.resize_(result.sizes());
  out.copy_(result.is_sparse() ? sparse_to_dense(result, out.scalar_type(), std::nullopt) : result);
  return out;
}

// add, add_ and add.out (self, other, alpha[, out]). CPU adds two sparse tensors that are not
// both coalesced by a merge that keeps their order (duplicates stay where the inputs had them):
// that layout comes from CPU's kernel itself, through the counted fallback.
void sparse_add_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t n = op.schema().arguments().size();
  auto args = stack->end() - static_cast<std::ptrdiff_t>(n);
  at::Tensor self = args[0].toTensor(), other = args[1].toTensor();
  at::Scalar alpha = args[2].toScalar();
  if (self.is_sparse() && other.is_sparse() && !(self.is_coalesced() && other.is_coalesced()))
    return sparse_cpu_fallback(op, stack);
  at::Tensor result = sparse_add(self, other, alpha);
  bool in_place = op.schema().name() == "aten::add_";
  at::Tensor out = n == 4 ? args[3].toTensor() : self;
  torch::jit::drop(*stack, n);
  if (in_place || n == 4) stack->emplace_back(assign(out, result));
  else stack->emplace_back(std::move(result));
}

// `self` (dense) read at the mask's indices: CPU computes self * (the mask with ones for
// values), so a duplicate index gets the value at each occurrence.
at::Tensor dense_sparse_mask(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.sizes().equals(self.sizes()), "sparse_mask(): operands have incompatible sizes; self has size ",
              self.sizes(), " but mask has size ", mask.sizes());
  TORCH_CHECK(!self.is_sparse(), "torchtpu: sparse_mask of a sparse tensor runs through the CPU fallback");
  at::Tensor indices = mask._indices();
  at::Tensor values = mask._nnz() == 0 ? mask._values().to(self.scalar_type()).clone()
                                       : at::index(self, index_rows(indices));
  return make_sparse(mask, indices.clone(), values, mask.is_coalesced());
}

bool is_scalar_like(const at::Tensor& t) { return !t.is_sparse() && t.dim() == 0; }

// A sparse tensor times or divided by a 0-d tensor (a Python number): its values scaled.
at::Tensor scale_values(const at::Tensor& self, const at::Tensor& values) {
  return make_sparse(self, self._indices().clone(), values, self.is_coalesced());
}

void sparse_mul(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const at::Tensor self = (*stack)[stack->size() - 2].toTensor();
  const at::Tensor other = (*stack)[stack->size() - 1].toTensor();
  if (!self.is_sparse() || !is_scalar_like(other)) return sparse_cpu_fallback(op, stack);
  torch::jit::drop(*stack, 2);
  stack->emplace_back(scale_values(self, self._values() * other.to(self.device())));
}

void sparse_div(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const at::Tensor self = (*stack)[stack->size() - 2].toTensor();
  const at::Tensor other = (*stack)[stack->size() - 1].toTensor();
  if (!self.is_sparse() || !is_scalar_like(other)) return sparse_cpu_fallback(op, stack);
  torch::jit::drop(*stack, 2);
  stack->emplace_back(scale_values(self, self._values() / other.to(self.device())));
}

at::Tensor sparse_neg(const at::Tensor& self) { return scale_values(self, self._values().neg()); }

// The functional copy (functionalization's form of copy_): src's parts in self's dtype.
at::Tensor sparse_copy(const at::Tensor& self, const at::Tensor& src, bool) {
  TORCH_CHECK(src.is_sparse(), "copy(): a dense tensor cannot be copied into a sparse one");
  return make_sparse(src, src._indices().to(self.device()), src._values().to(self.device(), self.scalar_type()),
                     src.is_coalesced());
}

// How functionalization derives a sparse tensor's part (`_values`, `_indices`) from the sparse
// tensor, and back: PyTorch's inverse asserts ("sparse tensors aren't supported during
// functionalization"), so an in-place op on `grad._values()` (Adagrad's `std._values().sqrt_()`)
// could not reach the sparse tensor. The reverse rebuilds the sparse tensor around the part.
struct SparsePartView final : at::functionalization::ViewMeta {
  explicit SparsePartView(bool values) : ViewMeta(/*has_symbolic_inputs=*/false), values(values) {}
  at::Tensor forward(const at::Tensor& base) override { return values ? base._values() : base._indices(); }
  at::Tensor reverse(const at::Tensor& base, const at::Tensor& mutated_part) override {
    return at::native::new_with_dims_and_tensor_sparse_symint(
        base.sparse_dim(), base.dense_dim(), base.sym_sizes(), values ? base._indices() : mutated_part,
        values ? mutated_part : base._values(), base.scalar_type(), at::kSparse, base.device(), std::nullopt,
        base.is_coalesced());
  }
  bool values;
};

at::Tensor sparse_part_functionalize(const at::Tensor& self, bool values, bool coalesced_only) {
  if (coalesced_only)
    TORCH_CHECK(self.is_coalesced(), "Cannot get ", values ? "values" : "indices",
                " on an uncoalesced tensor, please call .coalesce() first");
  if (!at::functionalization::impl::isFunctionalTensor(self)) {
    at::AutoDispatchSkipFunctionalize skip;
    return values ? self._values() : self._indices();
  }
  at::functionalization::impl::sync(self);
  at::Tensor inner = at::functionalization::impl::from_functional_tensor(self);
  at::Tensor part;
  {
    at::AutoDispatchSkipFunctionalize skip;
    part = values ? inner._values() : inner._indices();
  }
  // What create_functional_tensor_with_view_meta does (PyTorch does not export it).
  return at::detail::make_tensor<at::FunctionalTensorWrapper>(
      part, at::functionalization::impl::unsafeGetFunctionalWrapper(self), std::make_shared<SparsePartView>(values));
}

}  // namespace

at::Tensor sparse_values_functionalize(const at::Tensor& self) { return sparse_part_functionalize(self, true, false); }
at::Tensor sparse_indices_functionalize(const at::Tensor& self) { return sparse_part_functionalize(self, false, false); }
at::Tensor coalesced_values_functionalize(const at::Tensor& self) { return sparse_part_functionalize(self, true, true); }
at::Tensor coalesced_indices_functionalize(const at::Tensor& self) { return sparse_part_functionalize(self, false, true); }

void register_sparse_kernels() {
  static torch::Library fallback(torch::Library::IMPL, "_", c10::DispatchKey::SparsePrivateUse1, __FILE__, __LINE__);
  fallback.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_cpu_fallback>());
  static torch::Library sparse(torch::Library::IMPL, "aten", c10::DispatchKey::SparsePrivateUse1, __FILE__, __LINE__);
  // PyTorch's own generic kernels: a SparseTensorImpl's bookkeeping, whatever the device.
  sparse.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(at::native::new_with_dims_and_tensor_sparse_symint));
  sparse.impl("_sparse_coo_tensor_with_dims", TORCH_FN(at::native::new_with_dims_sparse));
  sparse.impl("empty.memory_format", TORCH_FN(at::native::empty_sparse));
  sparse.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  sparse.impl("_values", TORCH_FN(at::native::_values_sparse));
  sparse.impl("indices", TORCH_FN(coalesced_indices_copy));
  sparse.impl("values", TORCH_FN(coalesced_values_copy));
  sparse.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  sparse.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  sparse.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  sparse.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  sparse.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  sparse.impl("sparse_resize_", TORCH_FN(at::native::sparse_resize_));
  sparse.impl("sparse_resize_and_clear_", TORCH_FN(at::native::sparse_resize_and_clear_));
  sparse.impl("resize_as_sparse_", TORCH_FN(at::native::resize_as_sparse_));
  sparse.impl("clone", TORCH_FN(at::native::clone_sparse));
  sparse.impl("zero_", TORCH_FN(at::native::zero_sparse_));
  sparse.impl("copy_", TORCH_FN(at::native::copy_sparse_));
  // What functionalization issues in place of views and copy_.
  sparse.impl("_indices_copy", TORCH_FN(indices_part));
  sparse.impl("_values_copy", TORCH_FN(values_part));
  sparse.impl("indices_copy", TORCH_FN(coalesced_indices_copy));
  sparse.impl("values_copy", TORCH_FN(coalesced_values_copy));
  sparse.impl("detach_copy", TORCH_FN(sparse_detach_copy));
  sparse.impl("copy", TORCH_FN(sparse_copy));
  // The math, by dense tpu ops.
  sparse.impl("_coalesce", TORCH_FN(sparse_coalesce));
  sparse.impl("_to_dense", TORCH_FN(sparse_to_dense));
  for (const char* name : {"add.Tensor", "add_.Tensor", "add.out"})
    sparse.impl(name, torch::CppFunction::makeFromBoxedFunction<&sparse_add_boxed>());
  sparse.impl("sparse_mask", TORCH_FN(dense_sparse_mask));
  sparse.impl("neg", TORCH_FN(sparse_neg));
  sparse.impl("mul.Tensor", torch::CppFunction::makeFromBoxedFunction<&sparse_mul>());
  sparse.impl("div.Tensor", torch::CppFunction::makeFromBoxedFunction<&sparse_div>());
}

}  // namespace torchtpu
