// The tpu device's aten kernels, one file per job, and their registration (kernels.cpp):
//   record_op.cpp     ops with a lowering: arguments -> graph node, output types from
//                     PyTorch's meta kernels (cached), recorded in the engine
//   data_dependent.cpp  ops whose result shape depends on the data (nonzero, unique, ...)
//   composite.cpp     what PyTorch's composite kernels issue below functionalization:
//                     views of inner tensors, in-place and out= ops, foreach ops
//   early_refusals.cpp  dtypes PyTorch refuses above the tpu kernel (max_pool1d, normal_)
//   cpu_fallback.cpp  ops without a lowering run on CPU, counted and under a policy;
//                     calls a lowering declines get CPU's error, or count as fallbacks
//   copy.cpp          allocation and copies between devices (one tpu_copy)
//   overrides.cpp     PyTorch kernels replaced for tpu (functionalization, autograd, meta),
//                     registered as entries of kernel_overrides.h's table
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "device/tensor.h"
#include "engine/checks.h"
#include "lowering/registry.h"
#include "runtime/runtime.h"

namespace torchtpu {

// ---- kernels.cpp: routing and registration --------------------------------------------
void register_kernels();
// The kernel of every op without a kernel of its own: lowered, composite or CPU fallback.
void tpu_boxed_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Runs f, turning the runtime's errors into the exceptions PyTorch users expect.
template <typename F>
auto translate_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const DeviceOutOfMemory& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  } catch (const CheckFailed& e) {
    // A runtime check (an index out of range, ...): the exception CPU's kernel raises.
    TORCH_CHECK_INDEX(e.error != RuntimeCheck::Error::Index, e.what());
    TORCH_CHECK_VALUE(e.error != RuntimeCheck::Error::Value, e.what());
    TORCH_CHECK(false, e.what());
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::out_of_range& e) {
    // A lowering's index argument check (a dimension out of range, ...): CPU's IndexError.
    TORCH_CHECK_INDEX(false, e.what());
  }
}

std::string op_name(const c10::OperatorHandle& op);  // "aten::add.Tensor"
// The tpu device an op runs on: its first tpu tensor's, else its tpu device argument's,
// else the current device.
int device_of_args(const std::vector<c10::IValue>& args);

// ---- device_check.cpp -------------------------------------------------------------------
// Raises PyTorch's RuntimeError when the op's tensor arguments are on devices CUDA would
// not accept together (a tpu tensor with a CPU tensor that is not a 0-dim scalar, tpu:0
// with tpu:1); CPU indices of advanced indexing and the copy family pass.
void check_op_devices(const c10::OperatorHandle& op, const std::string& name, const std::vector<c10::IValue>& args);
// The AutogradPrivateUse1 kernel of in-place and out= ops: checks devices before
// functionalization sees a write across devices, then runs PyTorch's autograd kernel.
void checked_autograd_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);
bool needs_checked_autograd(const c10::OperatorHandle& op);  // mutable, two tensors or more

// ---- early_refusals.cpp -----------------------------------------------------------------
// The AutogradPrivateUse1 kernel of ops whose dtype refusals PyTorch makes before the tpu
// kernel sees the call (composites such as max_pool1d, in-place random ops functionalization
// checks on meta first): a refused dtype gets CPU's error, other calls PyTorch's kernel.
void early_refusal_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);
std::vector<const char*> early_refusal_ops();  // their names ("max_pool1d")

// ---- record_op.cpp ----------------------------------------------------------------------
// Records the op with its lowering; false when it declines the call (a refused or unsupported
// dtype or argument, arguments the meta kernel rejects, no meta kernel, a data-dependent
// shape): the caller lets CPU's kernel decide (cpu_kernel_decides).
bool record_op(const c10::OperatorHandle& op, const LoweringRule* rule, torch::jit::Stack* stack);
// Whether the op's index argument has a dtype the rule refuses (LoweringRule::index_refuses):
// record_op declines such calls, and mask indexing leaves them to it unexpanded.
bool refuses_index(const LoweringRule* rule, const std::vector<c10::IValue>& args);
// An argument as meta kernels take it (tensors become meta tensors of the same geometry).
c10::IValue to_meta(const c10::IValue& v);

// ---- data_dependent.cpp ------------------------------------------------------------------
// nonzero, masked_select, boolean-mask indexing and unique: a count read back, then the
// result at that size on the device. False when the op is not one of them or cannot run
// here (the caller goes on as for any other op).
bool record_data_dependent(const std::string& name, const c10::OperatorHandle& op, const LoweringRule* rule,
                           torch::jit::Stack* stack);

// ---- composite.cpp ----------------------------------------------------------------------
bool is_view_op(const c10::FunctionSchema& schema);
bool is_inplace_view_op(const std::string& name);
bool record_raw_view(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool inplace);
bool record_mutable(const c10::OperatorHandle& op, torch::jit::Stack* stack);
bool decompose_foreach(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// ---- cpu_fallback.cpp -------------------------------------------------------------------
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// A call torchtpu declines although the op has a lowering: a dtype PyTorch refuses, arguments
// the meta kernel rejects, or what the lowering does not cover (complex values, a dtype tpu
// lacks, no meta kernel, a data-dependent shape). CPU's kernel decides: when it raises, that
// is the op's error, exactly as on CPU, and nothing fell back (no count, no warning, whatever
// TORCHTPU_FALLBACK says); when it computes, the call was a fallback, counted and warned
// after the fact (or its results dropped for the policy's error). Only for calls that are
// functional or that CPU refuses, so that running first changes nothing the caller holds.
void cpu_kernel_decides(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void set_fallback_policy(const std::string& policy);  // warn | error | silent
void clear_fallback_warnings();  // each op warns once again (metrics.reset())

// ---- copy.cpp ---------------------------------------------------------------------------
// The contents of `src` (a tensor on any device) as a value on tpu `device`, in `dtype`:
// the one way data moves onto a tpu device.
ValuePtr tpu_copy(const at::Tensor& src, int device, DType dtype);
// A tpu tensor's contents as a fresh CPU tensor; other tensors are returned as they are.
at::Tensor to_host(const at::Tensor& t);
at::Tensor tpu_empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                     std::optional<at::Device> device, std::optional<bool> pin, std::optional<at::MemoryFormat>);
at::Tensor tpu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout> layout, std::optional<at::Device> device,
                             std::optional<bool> pin);
at::Tensor tpu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);
at::Tensor tpu_copy_functional(const at::Tensor& self, const at::Tensor& src, bool non_blocking);
at::Tensor tpu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst);
at::Tensor tpu_to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                       std::optional<at::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                       std::optional<at::MemoryFormat> memory_format);
const at::Tensor& tpu_resize(const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat>);
c10::Scalar tpu_local_scalar_dense(const at::Tensor& self);

// ---- overrides.cpp ----------------------------------------------------------------------
void new_factory_functionalize(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void host_results_stay_plain_functionalize(const c10::OperatorHandle& op, torch::jit::Stack* stack);
at::Tensor to_copy_functionalize(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                                 std::optional<at::Layout> layout, std::optional<at::Device> device,
                                 std::optional<bool> pin_memory, bool non_blocking,
                                 std::optional<at::MemoryFormat> memory_format);
at::Tensor& copy_inplace_or_view(c10::DispatchKeySet ks, at::Tensor& self, const at::Tensor& src, bool non_blocking);
void foreach_inplace_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void inplace_binary_alpha_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack);  // add_, sub_
void inplace_fill_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack);  // fill_, relu_ (self only)
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_meta(const at::Tensor& input_gates,
                                                                    const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                                    const std::optional<at::Tensor>& input_bias,
                                                                    const std::optional<at::Tensor>& hidden_bias);
std::tuple<at::Tensor, at::Tensor> fused_gru_cell_meta(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                       const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                                       const std::optional<at::Tensor>& hidden_bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward_meta(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias);
at::Tensor multi_margin_loss_backward_meta(const at::Tensor& grad_output, const at::Tensor& self,
                                          const at::Tensor& target, const at::Scalar& p, const at::Scalar& margin,
                                          const std::optional<at::Tensor>& weight, int64_t reduction);
std::tuple<at::Tensor, at::Tensor> multilabel_margin_loss_forward_meta(const at::Tensor& self, const at::Tensor& target,
                                                                      int64_t reduction);
at::Tensor multilabel_margin_loss_backward_meta(const at::Tensor& grad_output, const at::Tensor& self,
                                               const at::Tensor& target, int64_t reduction, const at::Tensor& is_target);
at::Tensor fractional_max_pool3d_backward_meta(const at::Tensor& grad_output, const at::Tensor& self,
                                               at::IntArrayRef kernel_size, at::IntArrayRef output_size,
                                               const at::Tensor& indices);
at::Tensor ctc_loss_backward_meta(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& targets,
                                  at::IntArrayRef input_lengths, at::IntArrayRef target_lengths,
                                  const at::Tensor& neg_log_likelihood, const at::Tensor& log_alpha, int64_t blank,
                                  bool zero_infinity);
void batch_norm_empty_stats_in_eval(const c10::OperatorHandle& op, torch::jit::Stack* stack);
at::Tensor tpu_lift_fresh(const at::Tensor& self);
void record_stream_functionalize(at::Tensor& self, c10::Stream stream);
void tpu_record_stream(at::Tensor& self, c10::Stream stream);
std::tuple<at::Tensor, at::Tensor, at::Tensor> tpu_native_batch_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps);
at::Tensor tpu_fft_fftfreq(int64_t n, double d, std::optional<at::ScalarType> dtype,
                           std::optional<at::Layout> layout, std::optional<at::Device> device,
                           std::optional<bool> pin_memory);

}  // namespace torchtpu
