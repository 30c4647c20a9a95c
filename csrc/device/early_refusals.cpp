// Dtype refusals PyTorch makes before a call reaches the tpu kernel, where a lowering rule's
// refusal (LoweringRule::refuses) cannot see them. max_pool1d is composite: CPU refuses integer
// dtypes there (max_pool1d_impl) that max_pool2d_with_indices, which it decomposes into on tpu,
// accepts, so the lowering would compute what CPU refuses.
// normal_, log_normal_, cauchy_, exponential_ and geometric_ are checked by functionalization on meta
// tensors first, whose Python kernels raise other errors than CPU's and CUDA's kernels
// (RuntimeError for normal_'s NotImplementedError, cauchy_'s words). The autograd kernel of these ops on
// tpu sends a call with a refused dtype to CPU's kernel, which raises PyTorch's own error;
// other calls go on to PyTorch's own autograd or composite kernel. (torch.inference_mode runs
// as no_grad on tpu, so autograd kernels always run.)
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/LegacyTypeDispatch.h>

#include "device/explain.h"
#include "device/kernels.h"

namespace torchtpu {
namespace {

struct EarlyRefusal {
  const char* op;    // an aten op's name (its default overload)
  DTypeSet refuses;  // judged on the first tensor argument (input, self)
};

constexpr DTypeSet kNotFloat = kBoolDTypes | kIntegerDTypes;

const EarlyRefusal kEarlyRefusals[] = {
    {"max_pool1d", kNotFloat},  // "max_pool1d_impl" not implemented for 'Long'
    {"normal_", kNotFloat},  // "normal_kernel_cpu" not implemented for 'Long'
    {"log_normal_", kNotFloat},
    {"cauchy_", kNotFloat},  // "Cauchy distribution is a continuous ... you specified long int"
    {"exponential_", kNotFloat},
    {"geometric_", kBoolDTypes},  // "geometric_cpu" not implemented for 'Bool'
};

DTypeSet refused_dtypes(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  if (!name.overload_name.empty() || name.name.rfind("aten::", 0) != 0) return 0;
  for (const EarlyRefusal& r : kEarlyRefusals)
    if (name.name.compare(6, std::string::npos, r.op) == 0) return r.refuses;
  return 0;
}

bool refused_early(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  size_t n = op.schema().arguments().size();
  for (auto it = stack.end() - n; it != stack.end(); ++it) {
    if (!it->isTensor() || !it->toTensor().defined()) continue;
    at::ScalarType type = it->toTensor().scalar_type();
    return is_supported_dtype(static_cast<int>(type)) && (refused_dtypes(op) & dtype_set(to_dtype(type)));
  }
  return false;
}

}  // namespace

std::vector<const char*> early_refusal_ops() {
  std::vector<const char*> ops;
  for (const EarlyRefusal& r : kEarlyRefusals) ops.push_back(r.op);
  return ops;
}

void early_refusal_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!refused_early(op, *stack)) {
    op.callBoxedForDispatchKey(op.hasKernelForDispatchKey(c10::DispatchKey::Autograd)
                                   ? c10::DispatchKey::Autograd
                                   : c10::DispatchKey::CompositeImplicitAutograd,
                               *stack);
    return;
  }
  // CPU's kernel runs on the tensors below functionalization, as the tpu kernel's calls do:
  // CPU copies of functional tensors would be functional too, and CPU's composite kernels
  // take another path for those (max_pool1d would decompose and compute).
  size_t n = op.schema().arguments().size();
  std::vector<at::Tensor> wrappers(n), inner(n);
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = (*stack)[stack->size() - n + i];
    if (!v.isTensor() || !at::functionalization::impl::isFunctionalTensor(v.toTensor())) continue;
    wrappers[i] = v.toTensor();
    at::functionalization::impl::sync(wrappers[i]);
    inner[i] = at::functionalization::impl::from_functional_tensor(wrappers[i]);
    v = inner[i];
  }
  {
    at::AutoDispatchSkipFunctionalize skip;
    declined("a dtype PyTorch refuses before the tpu kernel (early_refusals.cpp)");
    translate_errors([&] { cpu_kernel_decides(op, stack); });
  }
  // Only when CPU computed what the table says it refuses: results back into functional tensors.
  size_t r = op.schema().returns().size();
  for (size_t k = 0; k < r; ++k) {
    c10::IValue& v = (*stack)[stack->size() - r + k];
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    at::Tensor out = v.toTensor();
    bool written = false;
    for (size_t i = 0; i < n && !written; ++i)
      if (wrappers[i].defined() && inner[i].is_same(out)) v = wrappers[i], written = true;
    if (!written && !at::functionalization::impl::isFunctionalTensor(out))
      v = at::functionalization::impl::to_functional_tensor(out);
  }
}

}  // namespace torchtpu
