// PyTorch kernels replaced for tpu, each because PyTorch's own cannot serve a tpu tensor:
// functionalization's _to_copy, new_* factories, record_stream and packed sequences, autograd's copy_
// (ADInplaceOrView), meta kernels of in-place foreach ops and of add_/sub_/fill_/relu_
// (C++ instead of PyTorch's Python ones), native_batch_norm, the empty
// statistics of batch norm in eval mode, lift_fresh and fft_fftfreq; and meta kernels of the
// fused LSTM and GRU cells and of the margin losses' backward ops.
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

// _pack_padded_sequence / _pad_packed_sequence return a CPU tensor beside the tpu one
// (batch_sizes, lengths), which the RNN kernels and users read on the host. PyTorch's
// Functionalize kernels wrap every result, and a wrapped CPU tensor has no data to read:
// here tpu results are wrapped and CPU results stay plain tensors.
void host_results_stay_plain_functionalize(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    c10::IValue& arg = (*stack)[i];
    if (!arg.isTensor() || !at::functionalization::impl::isFunctionalTensor(arg.toTensor())) continue;
    at::functionalization::impl::sync(arg.toTensor());
    arg = at::functionalization::impl::from_functional_tensor(arg.toTensor());
  }
  {
    at::AutoDispatchSkipFunctionalize skip;
    op.callBoxed(stack);
  }
  size_t results = op.schema().returns().size();
  for (size_t i = stack->size() - results; i < stack->size(); ++i) {
    c10::IValue& result = (*stack)[i];
    if (result.isTensor() && result.toTensor().device().type() == c10::DeviceType::PrivateUse1)
      result = at::functionalization::impl::to_functional_tensor(result.toTensor());
  }
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

namespace {

// Python's reprs in PyTorch's meta errors: torch.Size([2, 3]), a list [2, 3], a tuple (2, 3).
std::string join_dims(c10::IntArrayRef dims) {
  std::string out;
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out;
}
std::string size_repr(c10::IntArrayRef dims) { return "torch.Size([" + join_dims(dims) + "])"; }
std::string tuple_repr(c10::IntArrayRef dims) {
  return "(" + join_dims(dims) + (dims.size() == 1 ? ",)" : ")");
}

// torch._refs._broadcast_shapes(self, other) then _meta_registrations.check_inplace_broadcast,
// step by step, so that the errors carry the same words.
void check_inplace_broadcast(c10::IntArrayRef self, c10::IntArrayRef other) {
  std::vector<int64_t> common(std::max(self.size(), other.size()), 1);
  const c10::IntArrayRef shapes[] = {self, other};
  for (int arg = 0; arg < 2; ++arg) {
    c10::IntArrayRef shape = shapes[arg];
    for (int64_t idx = -1; idx >= -static_cast<int64_t>(shape.size()); --idx) {
      int64_t s = shape[shape.size() + idx];
      int64_t& c = common[common.size() + idx];
      if (s == c) continue;
      if (c == 1) c = s;
      if (s == 1) continue;
      TORCH_CHECK(c == s, "Attempting to broadcast a dimension of length ", s, " at ", idx,
                  "! Mismatching argument at index ", arg, " had ", size_repr(shape),
                  "; but expected shape should be broadcastable to [", join_dims(common), "]");
    }
  }
  TORCH_CHECK(c10::IntArrayRef(common) == self, "output with shape ", size_repr(self),
              " doesn't match the broadcast shape ", tuple_repr(common));
}

// The dtype classes of torch._prims_common (is_integer_dtype excludes bool; is_float_dtype
// is dtype.is_floating_point) and of a Python number (a bool is also an int).
bool is_integer_dtype(at::ScalarType t) { return c10::isIntegralType(t, /*includeBool=*/false); }
bool integeric(const c10::IValue& v) {
  return v.isTensor() ? is_integer_dtype(v.toTensor().scalar_type()) : v.isInt() || v.isBool();
}
bool floatic(const c10::IValue& v) { return v.isTensor() ? at::isFloatingType(v.toTensor().scalar_type()) : v.isDouble(); }
bool booleanic(const c10::IValue& v) { return v.isTensor() ? v.toTensor().scalar_type() == at::kBool : v.isBool(); }

}  // namespace

// Meta kernels of the in-place ops a training step runs outside the optimizer: add_/sub_
// (batch norm's num_batches_tracked.add_(1)), fill_ and relu_. Functionalization checks each
// in-place op on meta tensors first, and PyTorch's meta kernels for these are Python
// (_meta_registrations: meta_binop_inplace_alpha, meta_fill_, meta_relu_), a Python call
// per op per step. These do the same checks, with the same errors, in C++.
void inplace_binary_alpha_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t n = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, n);
  // A Scalar argument is an IValue number: a Python bool stays a bool, a float a double.
  const c10::IValue self = args[0], other = args[1];
  TORCH_CHECK(!(integeric(self) && floatic(other)),
              "Promotion of int.add/sub_(float) in in-place ops are not possible due to element size change.");
  TORCH_CHECK(!(booleanic(self) && !booleanic(other)),
              "Promotion of bool.add/sub_(others) in in-place ops are not possible due to element size change.");
  if (other.isTensor()) check_inplace_broadcast(self.toTensor().sizes(), other.toTensor().sizes());
  torch::jit::drop(*stack, n);
  stack->push_back(self);
}

void inplace_fill_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t n = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, n);
  const c10::IValue self = args[0];
  if (n > 1 && args[1].isTensor())
    TORCH_CHECK(args[1].toTensor().dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor with ",
                args[1].toTensor().dim(), " dimensions.");
  torch::jit::drop(*stack, n);
  stack->push_back(self);
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

// The fused cells' argument checks (CUDA's checkSizes) and output types: PyTorch has no meta
// kernel for the GRU cell and a Python one for the LSTM cell that fails without biases.
void check_fused_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& state,
                      const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias,
                      int64_t gates) {
  TORCH_CHECK(input_gates.dim() == 2, "input_gates must be 2-D, got ", input_gates.dim(), "-D");
  TORCH_CHECK(input_gates.sizes() == hidden_gates.sizes(), "input_gates and hidden_gates must have the same size, got ",
              input_gates.sizes(), " and ", hidden_gates.sizes());
  int64_t gates_size = input_gates.size(1);
  TORCH_CHECK(gates_size % gates == 0, "the gates' size (", gates_size, ") must be a multiple of ", gates);
  bool has_bias = input_bias.has_value() && input_bias->defined();
  TORCH_CHECK(has_bias == (hidden_bias.has_value() && hidden_bias->defined()),
              "input_bias and hidden_bias must be given together");
  if (has_bias)
    TORCH_CHECK(input_bias->dim() == 1 && input_bias->size(0) == gates_size && hidden_bias->sizes() == input_bias->sizes(),
                "the biases must be 1-D of the gates' size (", gates_size, ")");
  TORCH_CHECK(state.numel() == input_gates.size(0) * gates_size / gates, "the state must hold ",
              input_gates.size(0) * gates_size / gates, " elements, got ", state.numel());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_meta(const at::Tensor& input_gates,
                                                                    const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                                    const std::optional<at::Tensor>& input_bias,
                                                                    const std::optional<at::Tensor>& hidden_bias) {
  check_fused_cell(input_gates, hidden_gates, cx, input_bias, hidden_bias, 4);
  return {at::empty_like(cx), at::empty_like(cx), at::empty_like(input_gates)};
}

// hy like hx, and the workspace [r, z, n, hx, hidden n gate] of the lowering (rnn.cpp).
std::tuple<at::Tensor, at::Tensor> fused_gru_cell_meta(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                       const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                                       const std::optional<at::Tensor>& hidden_bias) {
  check_fused_cell(input_gates, hidden_gates, hx, input_bias, hidden_bias, 3);
  return {at::empty_like(hx), at::empty({hx.size(0), 5 * hx.size(1)}, hx.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward_meta(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  int64_t batch = grad_hy.size(0), hidden = grad_hy.size(1);
  auto gates = [&] { return at::empty({batch, 3 * hidden}, grad_hy.options()); };
  auto bias = [&] { return has_bias ? at::empty({3 * hidden}, grad_hy.options()) : at::Tensor(); };
  return {gates(), gates(), at::empty_like(grad_hy), bias(), bias()};
}

// The gradients of multi_margin_loss and multilabel_margin_loss have their input's shape and
// dtype (PyTorch has no Meta kernel for these backward ops, so record_op could not type them).
at::Tensor multi_margin_loss_backward_meta(const at::Tensor& grad_output, const at::Tensor& self,
                                          const at::Tensor& target, const at::Scalar& p, const at::Scalar& margin,
                                          const std::optional<at::Tensor>& weight, int64_t reduction) {
  return at::empty_like(self);
}

// multilabel_margin_loss_forward's (output, is_target) as CPU's kernel makes them: a 0-d loss
// for a 1-d sample whatever the reduction (PyTorch's Meta kernel gives [1] there).
std::tuple<at::Tensor, at::Tensor> multilabel_margin_loss_forward_meta(const at::Tensor& self, const at::Tensor& target,
                                                                      int64_t reduction) {
  bool per_sample = reduction == at::Reduction::None && target.dim() > 1;
  at::Tensor output = per_sample ? at::empty({self.size(0)}, self.options()) : at::empty({}, self.options());
  return {output, at::empty(target.sizes(), self.options())};
}

at::Tensor multilabel_margin_loss_backward_meta(const at::Tensor& grad_output, const at::Tensor& self,
                                               const at::Tensor& target, int64_t reduction, const at::Tensor& is_target) {
  return at::empty_like(self);
}

// fractional_max_pool3d's gradient has its input's shape and dtype (PyTorch has a Meta kernel
// for the 2-d pool's backward, none for the 3-d one's).
at::Tensor fractional_max_pool3d_backward_meta(const at::Tensor& grad_output, const at::Tensor& self,
                                               at::IntArrayRef kernel_size, at::IntArrayRef output_size,
                                               const at::Tensor& indices) {
  return at::empty_like(self);
}

// _ctc_loss_backward's gradient has log_probs' shape and dtype (no Meta kernel in PyTorch).
at::Tensor ctc_loss_backward_meta(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& targets,
                                  at::IntArrayRef input_lengths, at::IntArrayRef target_lengths,
                                  const at::Tensor& neg_log_likelihood, const at::Tensor& log_alpha, int64_t blank,
                                  bool zero_infinity) {
  return at::empty_like(log_probs);
}

}  // namespace torchtpu
