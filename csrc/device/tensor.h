// Device tensors: a storage-less TensorImpl holding an engine Value, and the helpers that
// move between at::Tensor and engine values.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/TensorImpl.h>

#include "ir/graph.h"

namespace torchtpu {

// The inner tensor of a tpu tensor. Users hold a FunctionalTensorWrapper around it
// (functionalization gives views and in-place ops their CPU semantics).
class TpuTensorImpl final : public c10::TensorImpl {
 public:
  TpuTensorImpl(ValuePtr value, c10::Device device);
  const ValuePtr& value() const { return value_; }
  // Replaces the contents (used when an op writes into a fresh inner tensor).
  void set_value(ValuePtr value);

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  ValuePtr value_;
};

DType to_dtype(c10::ScalarType type);  // raises TypeError for dtypes tpu does not support
inline c10::ScalarType to_scalar_type(DType dtype) { return static_cast<c10::ScalarType>(dtype); }
TensorType tensor_type_of(const at::Tensor& t);

bool is_tpu(const at::Tensor& t);
// The inner tensor of a (possibly functional-wrapped) tpu tensor.
at::Tensor unwrap(const at::Tensor& t);
// The engine value of a tpu tensor; CPU tensors are copied to `device`.
ValuePtr value_of(const at::Tensor& t, int device);
// A new raw tpu tensor holding the value.
at::Tensor make_tensor(ValuePtr value);
// Wraps a raw tensor for the user unless we are inside functionalization.
at::Tensor wrap_for_user(const at::Tensor& raw);

// Host <-> device copies (observation points in fused mode).
ValuePtr upload(const at::Tensor& cpu, int device);
at::Tensor download(const ValuePtr& value);  // a fresh contiguous CPU tensor

// Records an internal op (convert dtype, broadcast) on a value.
ValuePtr convert_value(const ValuePtr& value, DType dtype);
ValuePtr broadcast_value(const ValuePtr& value, const std::vector<int64_t>& shape);
ValuePtr zeros_value(const TensorType& type, int device);

int current_device();
void set_current_device(int index);
int device_count();
void check_device_index(int64_t index);

}  // namespace torchtpu
