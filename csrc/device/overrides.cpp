// PyTorch kernels replaced for tpu, each because PyTorch's own cannot serve a tpu tensor:
// functionalization's _to_copy, new_* factories and record_stream, autograd's copy_
// (ADInplaceOrView), meta kernels of in-place foreach ops, native_batch_norm, the empty
// statistics of batch norm in eval mode, lift_fresh and fft_fftfreq.
#include <ATen/ExpandUtils.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/ops/_native_batch_norm_legit.h>
#include <ATen/ops/_to_copy.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/copy.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/variable.h>

#include "device/kernels.h"

namespace torchtpu {

// Our own version of functionalization's _to_copy kernel: PyTorch's wraps the result only for
// XLA and Lazy devices; a tpu result must be wrapped too or a raw inner tensor would escape.
at::Tensor to_copy_functionalize(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                                 std::optional<at::Layout> layout, std::optional<at::Device> device,
                                 std::optional<bool> pin_memory, bool non_blocking,
                                 std::optional<at::MemoryFormat> memory_format) {
  at::Tensor inner = self;
  if (at::functionalization::impl::isFunctionalTensor(self)) {
    at::functionalization::impl::sync(self);
    inner = at::functionalization::impl::from_functional_tensor(self);
  }
  at::Tensor out;
  {
    at::AutoDispatchSkipFunctionalize guard;
    out = at::_to_copy(inner, dtype, layout, device, pin_memory, non_blocking, memory_format);
  }
  if (!c10::impl::tls_local_dispatch_key_set().included_.has(c10::DispatchKey::Functionalize)) {
    c10::DeviceType target = device ? device->type() : self.device().type();
    if (target != c10::DeviceType::PrivateUse1 && target != c10::DeviceType::XLA &&
        target != c10::DeviceType::Lazy)
      return out;
  }
  return at::functionalization::impl::to_functional_tensor(out);
}

// new_zeros / new_ones / new_empty / new_full read only self's dtype and device, so this
// Functionalize kernel does not sync self (PyTorch's generated one does). A sync may replace
// the wrapper's inner tensor, and PyTorch's fft_r2c_backward holds grad.sym_sizes() (a view
// of the inner tensor's sizes) across grad.new_zeros(...): a sync there frees those sizes.
void new_factory_functionalize(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t n = op.schema().arguments().size();
  c10::IValue& self = (*stack)[stack->size() - n];
  bool functional = at::functionalization::impl::isFunctionalTensor(self.toTensor());
  if (functional) self = at::functionalization::impl::from_functional_tensor(self.toTensor());
  {
    at::AutoDispatchSkipFunctionalize skip;
    op.callBoxed(stack);
  }
  if (functional) stack->back() = at::functionalization::impl::to_functional_tensor(stack->back().toTensor());
}

// copy_ at the ADInplaceOrView key (same as PyTorch's generated kernel) plus one case:
// host_tensor.copy_(tpu_tensor). Functionalization rejects mutating a plain tensor from a
// functional one unless the source is an XLA tensor; a tpu source must be allowed too.
at::Tensor& copy_inplace_or_view(c10::DispatchKeySet ks, at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (is_tpu(src) && at::functionalization::impl::isFunctionalTensor(src) &&
      !at::functionalization::impl::isFunctionalTensor(self)) {
    at::Tensor inner = unwrap(src);
    {
      at::AutoDispatchBelowADInplaceOrView below;
      at::AutoDispatchSkipFunctionalize skip;
      self.copy_(inner, non_blocking);
    }
    torch::autograd::impl::bump_version(self);
    return self;
  }
  {
    at::AutoDispatchBelowADInplaceOrView below;
    at::_ops::copy_::redispatch(ks & c10::after_ADInplaceOrView_keyset, self, src, non_blocking);
  }
  torch::autograd::impl::bump_version(self);
  return self;
}

// torch.tensor(data, device="tpu") builds the tensor with functionalization switched off and
// then lifts it; PyTorch's default lift_fresh returns it as it is, which would leave the user
// a raw tpu tensor that in-place ops with ordinary tpu tensors reject ("mutating a
// non-functional tensor with a functional tensor", transformers' Trainer accumulating its loss).
at::Tensor tpu_lift_fresh(const at::Tensor& self) {
  if (at::functionalization::impl::isFunctionalTensor(self)) return self;
  return wrap_for_user(self);
}

// record_stream is an in-place op with an alias annotation, which functionalization rejects.
// A tpu buffer needs no stream bookkeeping (XLA frees it after the work that uses it), so it
// is a no-op for tpu (DDP's side-stream copies call it); other functional tensors pass it on
// to their own kernel.
void record_stream_functionalize(at::Tensor& self, c10::Stream stream) {
  if (is_tpu(self)) return;
  at::Tensor inner = at::functionalization::impl::from_functional_tensor(self);
  at::AutoDispatchSkipFunctionalize skip;
  inner.record_stream(stream);
}

void tpu_record_stream(at::Tensor&, c10::Stream) {}

// Meta kernel for in-place foreach ops (optimizer updates). Functionalization checks every
// in-place op on Meta tensors first; without this, PyTorch's composite runs the per-tensor
// Python meta functions, which cost more than the whole optimizer step on the device.
void foreach_inplace_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t n = schema.arguments().size();
  auto args = torch::jit::last(*stack, n);
  auto self = args[0].toTensorList();
  for (size_t a = 1; a < n; ++a) {
    const c10::IValue& v = args[a];
    if (v.isTensorList()) {
      auto other = v.toTensorList();
      TORCH_CHECK(other.size() == self.size(), "Tensor lists must have the same number of tensors, got ",
                  self.size(), " and ", other.size());
      for (size_t i = 0; i < self.size(); ++i) {
        at::Tensor s = self.get(i), o = other.get(i);
        auto shape = at::infer_size(s.sizes(), o.sizes());
        TORCH_CHECK(c10::IntArrayRef(shape) == s.sizes(), "output with shape ", s.sizes(),
                    " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
      }
    } else if (v.isList() && !v.isTensorList()) {
      TORCH_CHECK(v.toListRef().size() == self.size(), "Scalar list must have the same number of elements as the "
                  "tensor list, got ", self.size(), " and ", v.toListRef().size());
    }
  }
  torch::jit::drop(*stack, n);
  for (size_t r = 0; r < schema.returns().size(); ++r) stack->push_back(c10::IValue());
}

// native_batch_norm updates running_mean/running_var in place although its schema does not
// say so; a lowering is a pure function, so this kernel runs the functional form
// (_native_batch_norm_legit_functional, through the generic kernel) and stores the new
// statistics into the running tensors.
std::tuple<at::Tensor, at::Tensor, at::Tensor> tpu_native_batch_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps) {
  bool has_running = running_mean.has_value() && running_mean->defined() && running_var.has_value() &&
                     running_var->defined();
  if (!has_running) return at::_native_batch_norm_legit(input, weight, bias, training, momentum, eps);
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("aten::_native_batch_norm_legit_functional", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                           const at::Tensor&, const at::Tensor&, bool, double, double)>();
  auto r = op.call(input, weight, bias, *running_mean, *running_var, training, momentum, eps);
  if (training) {
    store_value(*running_mean, value_of(std::get<3>(r), running_mean->device().index()));
    store_value(*running_var, value_of(std::get<4>(r), running_var->device().index()));
  }
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
}

// _native_batch_norm_legit_functional / _native_batch_norm_legit_no_training: when not
// training, PyTorch's CPU kernels return empty save_mean/save_invstd while the meta kernels
// say [C]; the tpu results follow the CPU (the lowering's [C] values are dropped).
void batch_norm_empty_stats_in_eval(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t n = schema.arguments().size();
  bool training = schema.overload_name().empty() && op.operator_name().name == "aten::_native_batch_norm_legit_functional"
                      ? (*stack)[stack->size() - n + 5].toBool()
                      : false;
  tpu_boxed_kernel(op, stack);
  if (training) return;
  size_t r = schema.returns().size();
  for (size_t i = 1; i <= 2; ++i) {
    c10::IValue& v = (*stack)[stack->size() - r + i];
    at::Tensor t = v.toTensor();
    if (!is_tpu(t) || t.dim() != 1 || t.size(0) == 0) continue;
    TensorType empty{{0}, to_dtype(t.scalar_type())};
    v = wrap_for_user(make_tensor(zeros_value(empty, t.device().index())));
  }
}

// fft_fftfreq: PyTorch's kernel writes the negative frequencies with arange_out into an
// empty slice of its result (result.slice(0, (n + 1) / 2, 0)), growing that view in place past
// its own bounds; a tpu view cannot grow, so the same values come from two aranges.
at::Tensor tpu_fft_fftfreq(int64_t n, double d, std::optional<at::ScalarType> dtype,
                           std::optional<at::Layout> layout, std::optional<at::Device> device,
                           std::optional<bool> pin_memory) {
  auto options = at::TensorOptions()
                     .dtype(dtype.value_or(c10::get_default_dtype_as_scalartype()))
                     .layout(layout)
                     .device(device)
                     .pinned_memory(pin_memory);
  at::Tensor result = at::cat({at::arange((n + 1) / 2, options), at::arange(-(n / 2), 0, options)});
  return result.mul(1.0 / (static_cast<double>(n) * d));
}

}  // namespace torchtpu
