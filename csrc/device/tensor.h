// Device tensors: a storage-less TensorImpl holding an engine Value, and the helpers that
// move between at::Tensor and engine values.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <optional>

#include "ir/graph.h"

namespace torchtpu {

// The inner tensor of a tpu tensor. Users hold a FunctionalTensorWrapper around it
// (functionalization gives views and in-place ops their CPU semantics).
class TpuTensorImpl final : public c10::TensorImpl {
 public:
  TpuTensorImpl(ValuePtr value, c10::Device device);
  // The contents; a view re-reads its root first if the root was written since.
  const ValuePtr& value();
  // Replaces the contents (an op wrote into this inner tensor). A view writes through to its
  // root, so the composite kernels PyTorch runs below functionalization (which take views
  // of fresh tensors and write into them) keep CPU semantics.
  void set_value(ValuePtr value);
  // Gives this tensor new contents of its own shape without writing through to a root: a
  // storage resize frees or re-allocates what the tensor holds (device/storage.cpp).
  void replace_contents(ValuePtr value);

  // Inner tensors made by view ops (as_strided, transpose_, diagonal, ...) reaching the
  // backend: the view's geometry over its root's contiguous storage.
  struct ViewOf {
    c10::intrusive_ptr<TpuTensorImpl> root;
    std::vector<int64_t> sizes, strides;
    int64_t offset = 0;
    ValuePtr root_value_seen;
  };
  const std::optional<ViewOf>& view_of() const { return view_; }
  // Makes this tensor a view of `root` with the given geometry (replacing its contents).
  void become_view(c10::intrusive_ptr<TpuTensorImpl> root, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                   int64_t offset);

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  ValuePtr value_;
  std::optional<ViewOf> view_;
};

DType to_dtype(c10::ScalarType type);  // raises TypeError for dtypes tpu does not support
inline c10::ScalarType to_scalar_type(DType dtype) { return static_cast<c10::ScalarType>(dtype); }
TensorType tensor_type_of(const at::Tensor& t);

bool is_tpu(const at::Tensor& t);
// The inner tensor of a (possibly functional-wrapped) tpu tensor.
at::Tensor unwrap(const at::Tensor& t);
// The engine value of a tpu tensor; CPU tensors are copied to `device` (a Python number
// taken as a tensor becomes a node of the graph in fused mode).
ValuePtr value_of(const at::Tensor& t, int device);
// A new raw tpu tensor holding the value.
at::Tensor make_tensor(ValuePtr value);
// Stores `value` (converted to dst's dtype) as the new contents of the tpu tensor dst: an
// op wrote into it. A functional wrapper is updated too.
void store_value(const at::Tensor& dst, const ValuePtr& value);
// Wraps a raw tensor for the user unless we are inside functionalization.
at::Tensor wrap_for_user(const at::Tensor& raw);

// Host <-> device copies (observation points in fused mode).
ValuePtr upload(const at::Tensor& cpu, int device);
at::Tensor download(const ValuePtr& value);  // a fresh contiguous CPU tensor
// download() in two halves: issue_read launches what computes the value (no wait) and
// holds its buffer; finish_read waits for it and copies it to a fresh CPU tensor.
struct IssuedRead {
  ValuePtr value;
  std::shared_ptr<const PaddedBuffer> padded;  // a value a bucketed graph computed padded
  BufferPtr buffer;                           // otherwise its buffer
};
IssuedRead issue_read(const ValuePtr& value);
at::Tensor finish_read(const IssuedRead& read);

// The kind of an op the device layer records itself; its lowering must exist.
OpKind lowered_kind(const char* name);
// Records an internal op (convert dtype, broadcast) on a value.
ValuePtr convert_value(const ValuePtr& value, DType dtype);
ValuePtr broadcast_value(const ValuePtr& value, const std::vector<int64_t>& shape);
ValuePtr zeros_value(const TensorType& type, int device);

int current_device();
void set_current_device(int index);
int device_count();
// A device this process can use (in a torchrun job, only tpu:LOCAL_RANK).
void check_device_index(int64_t index);
// Any device index of the node (setting the current device, seeding generators).
void check_device_range(int64_t index);

}  // namespace torchtpu
