// torch.autocast("tpu"): PyTorch's own op lists and casting policies, registered for the
// AutocastPrivateUse1 key (the same lists CUDA uses).
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

using namespace at::autocast;
using at::Tensor;
using at::IntArrayRef;
#if __has_include(<ATen/core/Dimname.h>)
using at::DimnameList;  // PyTorch 2.11's op lists name it unqualified; 2.13 has no named tensors
#endif
using c10::Scalar;
using c10::ScalarType;

#define TORCHTPU_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TORCHTPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TORCHTPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TORCHTPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TORCHTPU_LOWER_PRECISION)
  AT_FORALL_FP32(TORCHTPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TORCHTPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TORCHTPU_PROMOTE)
}

}  // namespace
