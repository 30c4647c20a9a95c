// Which devices an op's tensor arguments may be on, decided as CUDA decides it: an op
// mixing a tpu tensor with a tensor of another device raises PyTorch's own RuntimeError
// instead of moving the data silently.
//
// PyTorch's CUDA kernels check devices in three ways (torchgen's `device_check`):
//  - most ops: every tensor argument (out= arguments first) on one device, checked by the
//    generated wrapper (c10::impl::check_and_update_common_device);
//  - TensorIterator ops (elementwise): one device, except that a 0-dim CPU tensor input
//    is taken as a scalar;
//  - advanced indexing: the indices may be on CPU whatever the indexed tensor's device;
//  - the CTC loss: its lengths may be on CPU (its kernels read them on the host).
// A few ops move data between devices by design (the copy family) and are not checked.
#include <ATen/core/op_registration/adaption.h>

#include <unordered_map>
#include <unordered_set>

#include "device/kernels.h"

namespace torchtpu {
namespace {

enum class DeviceRule { SameDevice, CpuScalarInputs, CpuScalarArgument, HostIndices, HostLengths, Unchecked };

// Ops whose CUDA kernels take a 0-dim CPU tensor as a scalar in one argument only (fill_'s
// and masked_fill's value, a fused optimizer's learning rate), not in others (masked_fill's
// mask); the pointwise ops not listed here take one in any input.
const char* cpu_scalar_argument(const std::string& name) {
  static const std::unordered_map<std::string, const char*> ops = {
      {"aten::fill.Tensor", "value"}, {"aten::fill_.Tensor", "value"},
      {"aten::masked_fill.Tensor", "value"}, {"aten::masked_fill_.Tensor", "value"},
      {"aten::masked_fill.Scalar", "value"}, {"aten::masked_fill_.Scalar", "value"},
      {"aten::_fused_adam_.tensor_lr", "lr"}, {"aten::_fused_adamw_.tensor_lr", "lr"},
      {"aten::_fused_sgd_.tensor_lr", "lr"}};
  auto it = ops.find(name);
  return it == ops.end() ? nullptr : it->second;
}

// Pointwise ops that CUDA nevertheless checks strictly (their generated wrapper checks
// devices; torchgen's device_check is not NoCheck): a 0-dim CPU bound of clamp is an error.
bool pointwise_checked_strictly(const std::string& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::clamp.Tensor", "aten::clamp_.Tensor", "aten::clamp_max.Tensor", "aten::clamp_max_.Tensor",
      "aten::clamp_min.Tensor", "aten::clamp_min_.Tensor", "aten::clip.Tensor", "aten::clip_.Tensor",
      "aten::gcd", "aten::lcm", "aten::ldexp.Tensor", "aten::ldexp_", "aten::logaddexp", "aten::logaddexp2",
      "aten::igamma", "aten::igamma_", "aten::igammac", "aten::igammac_", "aten::nextafter", "aten::nextafter_",
      "aten::equal", "aten::float_power.Tensor_Tensor", "aten::float_power_.Tensor", "aten::native_dropout_backward",
      "aten::gelu_backward", "aten::silu_backward", "aten::sigmoid_backward", "aten::logit_backward",
      "aten::tanh_backward", "aten::threshold_backward"};
  return ops.count(name) > 0;
}

// Advanced indexing: x[cpu_index] is allowed on CUDA (PyTorch moves the index).
bool indexes_with_host_indices(const std::string& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::index.Tensor",        "aten::index.Tensor_out", "aten::_unsafe_index.Tensor",
      "aten::index_put",           "aten::index_put_",       "aten::_index_put_impl",
      "aten::_index_put_impl_",    "aten::_unsafe_index_put"};
  return ops.count(name) > 0;
}

// The CTC loss with lengths as tensors: CUDA's kernels read the lengths on the host, from
// CPU or from the device.
bool reads_lengths_on_host(const std::string& name) {
  return name == "aten::_ctc_loss.Tensor" || name == "aten::_ctc_loss_backward.Tensor";
}

// Ops whose job is to move data between devices.
bool moves_between_devices(const std::string& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::copy_", "aten::copy", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::_to_copy",
      "aten::to.device", "aten::to.dtype_layout", "aten::to.other", "aten::lift_fresh", "aten::lift_fresh_copy"};
  return ops.count(name) > 0;
}

DeviceRule rule_for(const c10::OperatorHandle& op, const std::string& name) {
  if (moves_between_devices(name)) return DeviceRule::Unchecked;
  if (indexes_with_host_indices(name)) return DeviceRule::HostIndices;
  if (reads_lengths_on_host(name)) return DeviceRule::HostLengths;
  if (cpu_scalar_argument(name)) return DeviceRule::CpuScalarArgument;
  // foreach ops take CUDA's slow path on mixed devices: the elementwise op per tensor.
  if ((op.hasTag(at::Tag::pointwise) && !pointwise_checked_strictly(name)) || name.rfind("aten::_foreach_", 0) == 0)
    return DeviceRule::CpuScalarInputs;
  return DeviceRule::SameDevice;
}

// One tensor argument with its schema position: written (out=, in-place self) or read.
struct TensorArg {
  const at::Tensor* tensor;
  const c10::Argument* argument;
  bool written;
};

// The defined tensor arguments, written ones first (the order CUDA's checks visit them).
std::vector<TensorArg> tensor_args(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& args,
                                   std::vector<at::Tensor>& storage) {
  storage.clear();
  std::vector<std::pair<size_t, const c10::Argument*>> found;  // index into storage
  std::vector<bool> written;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::Argument& argument = schema.arguments()[i];
    bool writes = argument.alias_info() && argument.alias_info()->isWrite();
    auto add = [&](const at::Tensor& t) {
      if (!t.defined()) return;
      storage.push_back(t);
      found.emplace_back(storage.size() - 1, &argument);
      written.push_back(writes);
    };
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      add(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) add(t);
    } else if (v.isOptionalTensorList()) {
      for (const auto& ref : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = ref;
        if (t.has_value()) add(*t);
      }
    }
  }
  std::vector<TensorArg> out;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t k = 0; k < found.size(); ++k)
      if (written[k] == (pass == 0)) out.push_back({&storage[found[k].first], found[k].second, written[k]});
  return out;
}

// The name of CUDA's generated wrapper for the op ("wrapper_CUDA__mm"), tpu's here.
std::string wrapper_name(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return "wrapper_PrivateUse1_" + name.overload_name + "_" + name.name.substr(name.name.find("::") + 2);
}

void check_same_device(const c10::OperatorHandle& op, const std::vector<TensorArg>& tensors) {
  std::optional<c10::Device> common;
  std::string method = wrapper_name(op);
  for (const TensorArg& t : tensors)
    c10::impl::check_and_update_common_device(common, *t.tensor, method.c_str(), t.argument->name().c_str());
}

// TensorIterator's rule: the common device is the first non-CPU one; a 0-dim CPU input
// passes as a scalar (only the argument named `scalar_argument`, when given).
void check_elementwise(const std::vector<TensorArg>& tensors, const char* scalar_argument = nullptr) {
  c10::Device common(c10::kCPU);
  for (const TensorArg& t : tensors)
    if (!t.tensor->is_cpu()) {
      common = t.tensor->device();
      break;
    }
  for (const TensorArg& t : tensors) {
    bool may_be_scalar = !scalar_argument || t.argument->name() == scalar_argument;
    if (may_be_scalar && !t.written && t.tensor->is_cpu() && t.tensor->dim() == 0) continue;
    TORCH_CHECK(t.tensor->device() == common, "Expected all tensors to be on the same device, but found at least "
                "two devices, ", common, " and ", t.tensor->device(), "!");
  }
}

// Advanced indexing: indices on CPU or the indexed tensor's device; the other tensors (the
// values index_put writes) follow the elementwise rule.
void check_indexing(const std::vector<c10::IValue>& args, const std::vector<TensorArg>& tensors) {
  const at::Tensor& self = args[0].toTensor();
  std::vector<TensorArg> others;
  for (const TensorArg& t : tensors) {
    if (t.argument->name() == "indices") {
      TORCH_CHECK(t.tensor->is_cpu() || t.tensor->device() == self.device(), "indices should be either on ",
                  c10::kCPU, " or on the same device as the indexed tensor (", self.device(), ")");
    } else {
      others.push_back(t);
    }
  }
  check_elementwise(others);
}

// One device for every tensor but the lengths (which may be on CPU).
void check_host_lengths(const c10::OperatorHandle& op, const std::vector<TensorArg>& tensors) {
  std::vector<TensorArg> others;
  for (const TensorArg& t : tensors) {
    const std::string& name = t.argument->name();
    if ((name == "input_lengths" || name == "target_lengths") && t.tensor->is_cpu()) continue;
    others.push_back(t);
  }
  check_same_device(op, others);
}

}  // namespace

void check_op_devices(const c10::OperatorHandle& op, const std::string& name, const std::vector<c10::IValue>& args) {
  // The common case first: every tensor argument on one device.
  std::optional<c10::Device> first;
  bool mixed = false;
  auto visit = [&](const at::Tensor& t) {
    // A Python number PyTorch wrapped as a 0-dim CPU tensor (floor_divide(x, 3)) is a scalar
    // wherever it goes, as on CUDA.
    if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
    if (!first) first = t.device();
    else if (t.device() != *first) mixed = true;
  };
  for (const c10::IValue& v : args) {
    if (v.isTensor()) {
      visit(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) visit(t);
    } else if (v.isOptionalTensorList()) {
      for (const auto& ref : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = ref;
        if (t.has_value()) visit(*t);
      }
    }
  }
  if (!mixed) return;
  DeviceRule rule = rule_for(op, name);
  if (rule == DeviceRule::Unchecked) return;
  std::vector<at::Tensor> storage;
  std::vector<TensorArg> tensors = tensor_args(op.schema(), args, storage);
  switch (rule) {
    case DeviceRule::SameDevice: check_same_device(op, tensors); break;
    case DeviceRule::CpuScalarInputs: check_elementwise(tensors); break;
    case DeviceRule::CpuScalarArgument: check_elementwise(tensors, cpu_scalar_argument(name)); break;
    case DeviceRule::HostIndices: check_indexing(args, tensors); break;
    case DeviceRule::HostLengths: check_host_lengths(op, tensors); break;
    case DeviceRule::Unchecked: break;
  }
}

// In-place and out= ops whose written tensor is on another device than what they read
// (cpu.add_(tpu), torch.add(cpu, cpu, out=tpu)) fail in functionalization before a tpu
// kernel sees them, with an internal assertion or, worse, a tpu tensor left holding CPU
// data. So their autograd kernel on tpu checks first, then runs PyTorch's own.
void checked_autograd_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t n = op.schema().arguments().size();
  check_op_devices(op, op_name(op), std::vector<c10::IValue>(stack->end() - n, stack->end()));
  op.callBoxedForDispatchKey(c10::DispatchKey::Autograd, *stack);
}

bool needs_checked_autograd(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  if (!schema.is_mutable() || !op.hasKernelForDispatchKey(c10::DispatchKey::Autograd)) return false;
  int tensors = 0;
  for (const c10::Argument& argument : schema.arguments()) {
    const c10::TypePtr& type = argument.type();
    if (type->isSubtypeOf(*c10::TensorType::get()) || type->isSubtypeOf(*c10::OptionalType::ofTensor())) ++tensors;
    else if (type->isSubtypeOf(*c10::ListType::ofTensors()) || type->isSubtypeOf(*c10::ListType::ofOptionalTensors())) tensors += 2;
  }
  return tensors >= 2;  // one tensor cannot mix devices
}

}  // namespace torchtpu
