// Routing and registration of the tpu device's kernels (see kernels.h for the files that
// define them). One boxed kernel serves every op without a kernel of its own: an op with a
// lowering is recorded, what composite kernels issue below functionalization is handled
// there, and anything else runs on CPU.
#include <torch/library.h>

#include <unordered_map>
#include <unordered_set>

#include "device/explain.h"
#include "device/kernel_overrides.h"
#include "device/kernels.h"

namespace torchtpu {

std::string op_name(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

int device_of_args(const std::vector<c10::IValue>& args) {
  for (const auto& v : args) {
    if (v.isTensor() && is_tpu(v.toTensor())) return v.toTensor().device().index();
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList())
        if (is_tpu(t)) return t.device().index();
    if (v.isOptionalTensorList())
      for (const auto& ref : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = ref;
        if (t.has_value() && is_tpu(*t)) return t->device().index();
      }
  }
  for (const auto& v : args)
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1)
      return v.toDevice().has_index() ? v.toDevice().index() : current_device();
  return current_device();
}

namespace {

// An operator's full name and lowering rule, found once per operator and thread: building
// "aten::add.Tensor" and looking it up on every call is per-op work (lowering rules are
// all registered at load time, so a lookup never goes stale). Keyed by the address of the
// operator's name, and checked against the name itself in case an operator was
// deregistered and another took its place.
struct OpInfo {
  c10::OperatorName key;
  std::string name;
  const LoweringRule* rule;
};

const OpInfo& op_info(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const c10::OperatorName*, OpInfo> cache;
  const c10::OperatorName& key = op.operator_name();
  auto it = cache.find(&key);
  if (it != cache.end() && it->second.key == key) return it->second;
  std::string name = op_name(op);
  const LoweringRule* rule = find_lowering(name);
  return cache.insert_or_assign(&key, OpInfo{key, std::move(name), rule}).first->second;
}

// The kernels at keys every device goes through (kernel_overrides.h: one named entry each).
void register_kernel_overrides() {
  using c10::DispatchKey;
  KernelOverride("functionalize _to_copy", "aten", DispatchKey::Functionalize, OverrideKind::Replaces)
      .impl("_to_copy", torch::CppFunction(TORCH_FN(to_copy_functionalize)));
  KernelOverride("functionalize record_stream", "aten", DispatchKey::Functionalize, OverrideKind::Adds)
      .impl("record_stream", torch::CppFunction(TORCH_FN(record_stream_functionalize)));
  KernelOverride new_factories("functionalize new_* factories", "aten", DispatchKey::Functionalize, OverrideKind::Adds);
  for (const char* name : {"new_zeros", "new_ones", "new_empty", "new_full"})
    new_factories.impl(name, torch::CppFunction::makeFromBoxedFunction<&new_factory_functionalize>());
  KernelOverride foreach_meta("meta in-place foreach", "aten", DispatchKey::Meta, OverrideKind::Adds,
                              "every aten::_foreach_*_ op without a Meta kernel");
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    const std::string& base = name.name;
    if (base.rfind("aten::_foreach_", 0) != 0 || base.back() != '_') continue;
    auto handle = c10::Dispatcher::singleton().findOp(name);
    if (!handle || handle->hasKernelForDispatchKey(DispatchKey::Meta)) continue;
    if (!handle->schema().returns().empty()) continue;
    foreach_meta.impl(base.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name),
                      torch::CppFunction::makeFromBoxedFunction<&foreach_inplace_meta>());
  }
  // These replace PyTorch's Python meta kernels (the override's warning is silenced by the caller).
  KernelOverride add_sub_meta("meta add_ sub_", "aten", DispatchKey::Meta, OverrideKind::Replaces);
  for (const char* name : {"add_.Tensor", "add_.Scalar", "sub_.Tensor", "sub_.Scalar"})
    add_sub_meta.impl(name, torch::CppFunction::makeFromBoxedFunction<&inplace_binary_alpha_meta>());
  KernelOverride fill_meta("meta fill_ relu_", "aten", DispatchKey::Meta, OverrideKind::Replaces);
  for (const char* name : {"fill_.Scalar", "fill_.Tensor", "relu_"})
    fill_meta.impl(name, torch::CppFunction::makeFromBoxedFunction<&inplace_fill_meta>());
  KernelOverride("autograd copy_ from tpu", "aten", DispatchKey::ADInplaceOrView, OverrideKind::Replaces)
      .impl("copy_", torch::CppFunction(TORCH_FN(copy_inplace_or_view)));
  KernelOverride packed_sequences("functionalize packed sequences", "aten", DispatchKey::Functionalize,
                                   OverrideKind::Adds);
  for (const char* name : {"_pack_padded_sequence", "_pad_packed_sequence"})
    packed_sequences.impl(name, torch::CppFunction::makeFromBoxedFunction<&host_results_stay_plain_functionalize>());
  KernelOverride("meta fused LSTM cell", "aten", DispatchKey::Meta, OverrideKind::Replaces)
      .impl("_thnn_fused_lstm_cell", torch::CppFunction(TORCH_FN(fused_lstm_cell_meta)));
  KernelOverride("meta fused GRU cell", "aten", DispatchKey::Meta, OverrideKind::AddsOrReplaces)
      .impl("_thnn_fused_gru_cell", torch::CppFunction(TORCH_FN(fused_gru_cell_meta)))
      .impl("_thnn_fused_gru_cell_backward", torch::CppFunction(TORCH_FN(fused_gru_cell_backward_meta)));
  KernelOverride("meta multilabel margin loss", "aten", DispatchKey::Meta, OverrideKind::Replaces)
      .impl("multilabel_margin_loss_forward", torch::CppFunction(TORCH_FN(multilabel_margin_loss_forward_meta)));
  KernelOverride("meta margin loss backward", "aten", DispatchKey::Meta, OverrideKind::AddsOrReplaces)
      .impl("multi_margin_loss_backward", torch::CppFunction(TORCH_FN(multi_margin_loss_backward_meta)))
      .impl("multilabel_margin_loss_backward", torch::CppFunction(TORCH_FN(multilabel_margin_loss_backward_meta)));
  KernelOverride("meta fractional max pool 3d and CTC backward", "aten", DispatchKey::Meta, OverrideKind::AddsOrReplaces)
      .impl("fractional_max_pool3d_backward", torch::CppFunction(TORCH_FN(fractional_max_pool3d_backward_meta)))
      .impl("_ctc_loss_backward", torch::CppFunction(TORCH_FN(ctc_loss_backward_meta)));
}

}  // namespace

void tpu_boxed_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  translate_errors([&] {
    const OpInfo& info = op_info(op);
    const std::string& name = info.name;
    size_t n = op.schema().arguments().size();
    check_op_devices(op, name, std::vector<c10::IValue>(stack->end() - n, stack->end()));
    const LoweringRule* rule = info.rule;
    // Each route reports itself to TORCHTPU_EXPLAIN (device/explain.h; free while off).
    if (record_data_dependent(name, op, rule, stack)) {
      explain_route(name, "data-dependent shape", "the size is read on the host, then the op is lowered at it");
      return;
    }
    if (rule && !op.schema().is_mutable()) {
      if (!record_op(op, rule, stack)) cpu_kernel_decides(op, stack);  // each reports its route
      return;
    }
    if (!rule && is_view_op(op.schema()) && record_raw_view(op, stack, false)) {
      explain_route(name, "view below functionalization", "a composite kernel's view of an inner tensor: "
                    "gathered from its root when read, scattered into it when written");
      return;
    }
    if (!rule && is_inplace_view_op(name) && record_raw_view(op, stack, true)) {
      explain_route(name, "in-place view below functionalization", "restrides the inner tensor's view of its root");
      return;
    }
    if (!rule && op.schema().is_mutable() && record_mutable(op, stack)) {
      explain_route(name, "in-place or out= below functionalization", "its functional op runs, then the value is swapped in");
      return;
    }
    if (!rule && name.rfind("aten::_foreach_", 0) == 0 && !op.schema().is_mutable() && decompose_foreach(op, stack)) {
      explain_route(name, "foreach decomposed", "one op per tensor, each routed on its own");
      return;
    }
    cpu_fallback(op, stack);
  });
}

void register_kernels() {
  static bool done = false;
  if (done) return;
  done = true;
  // Registered here rather than with TORCH_LIBRARY_IMPL so that overriding PyTorch's
  // Functionalize and Meta kernels happens once, with their expected warnings silenced.
  struct QuietHandler : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  static torch::Library fallback(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  fallback.fallback(torch::CppFunction::makeFromBoxedFunction<&tpu_boxed_kernel>());
  static torch::Library aten(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  aten.impl("empty.memory_format", TORCH_FN(tpu_empty));
  aten.impl("empty_strided", TORCH_FN(tpu_empty_strided));
  aten.impl("_copy_from", TORCH_FN(tpu_copy_from));
  aten.impl("copy", TORCH_FN(tpu_copy_functional));
  aten.impl("resize_", TORCH_FN(tpu_resize));
  aten.impl("_copy_from_and_resize", TORCH_FN(tpu_copy_from_and_resize));
  aten.impl("_to_copy", TORCH_FN(tpu_to_copy));
  aten.impl("_local_scalar_dense", TORCH_FN(tpu_local_scalar_dense));
  aten.impl("native_batch_norm", TORCH_FN(tpu_native_batch_norm));
  aten.impl("lift_fresh", TORCH_FN(tpu_lift_fresh));
  aten.impl("record_stream", TORCH_FN(tpu_record_stream));
  aten.impl("fft_fftfreq", TORCH_FN(tpu_fft_fftfreq));
  // Ops with a lowering get the boxed kernel directly: a direct registration wins over
  // PyTorch's composite kernels (which would call the out= variant through the fallback).
  static const std::unordered_set<std::string> boxed_overrides = {"_native_batch_norm_legit_functional",
                                                                   "_native_batch_norm_legit_no_training"};
  for (const std::string& name : boxed_overrides)
    aten.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&batch_norm_empty_stats_in_eval>());
  for (const std::string& full : lowered_ops()) {
    if (full.rfind("aten::", 0) != 0) continue;
    std::string name = full.substr(6);
    if (boxed_overrides.count(name)) continue;
    auto dot = name.find('.');
    std::string base = name.substr(0, dot), overload = dot == std::string::npos ? "" : name.substr(dot + 1);
    if (!c10::Dispatcher::singleton().findSchema({"aten::" + base, overload})) continue;  // not in this torch
    aten.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&tpu_boxed_kernel>());
  }
  static torch::Library autograd(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto handle = c10::Dispatcher::singleton().findOp(name);
    if (!handle || !needs_checked_autograd(*handle)) continue;
    std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    autograd.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&checked_autograd_kernel>());
  }
  for (const char* name : early_refusal_ops())
    autograd.impl(name, torch::CppFunction::makeFromBoxedFunction<&early_refusal_kernel>());
  register_kernel_overrides();
}

}  // namespace torchtpu
