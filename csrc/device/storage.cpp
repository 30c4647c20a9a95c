// Storage resize on tpu: a user's tpu tensor is a functional wrapper whose storage (a
// FunctionalStorageImpl) holds the base inner tensor its views are regenerated from.
// resize_(0) gives that base a value that raises when read, so its device buffer is
// released once nothing pending still reads it; resize_(nbytes) gives it fresh contents.
// Ops recorded before the free keep the value they read (as work queued on a CUDA stream
// before a free still reads valid memory); in fused mode the old value then becomes an
// intermediate of the pending graph, never a buffer of its own.
#include "device/storage.h"

#include <ATen/FunctionalStorageImpl.h>
#include <ATen/FunctionalTensorWrapper.h>

#include <stdexcept>

#include "device/tensor.h"
#include "engine/engine.h"

namespace torchtpu {
namespace {

using at::functionalization::FunctionalStorageImpl;

FunctionalStorageImpl* functional_storage(c10::StorageImpl* storage) {
  auto* functional = dynamic_cast<FunctionalStorageImpl*>(storage);
  TORCH_CHECK(functional && functional->base().defined() && is_tpu(functional->base()),
              "torchtpu: only the storage of a tpu tensor (tensor.untyped_storage()) can be resized");
  return functional;
}

TpuTensorImpl* tpu_impl(const at::Tensor& inner) {
  auto* impl = dynamic_cast<TpuTensorImpl*>(inner.unsafeGetTensorImpl());
  TORCH_CHECK(impl, "torchtpu: a tpu storage without device data");
  return impl;
}

// What a tensor over a freed storage holds: a value that raises when an op reads it.
ValuePtr freed_value(const at::Tensor& inner) {
  static const std::exception_ptr freed = std::make_exception_ptr(std::runtime_error(
      "torchtpu: this tensor's tpu storage was freed (untyped_storage().resize_(0)); re-allocate it "
      "(untyped_storage().resize_(nbytes)) and write to it before reading it"));
  return Engine::dropped_value(TensorType{inner.sizes().vec(), to_dtype(inner.scalar_type())},
                               inner.device().index(), freed);
}

// Every wrapper over the storage re-reads the base at its next use: functionalization
// regenerates a wrapper whose generation is behind its storage's.
void advance_generation(FunctionalStorageImpl* storage) {
  storage->add_update(storage->base(), {});
  storage->apply_updates();
}

}  // namespace

void resize_storage(c10::StorageImpl* storage, int64_t nbytes) {
  TORCH_CHECK(nbytes >= 0, "Requested storage size (", nbytes, ") cannot be represented as a size_t");
  FunctionalStorageImpl* functional = functional_storage(storage);
  int64_t current = static_cast<int64_t>(functional->nbytes());
  if (nbytes == current) return;
  // Writes queued on views land in the base first, so that the base is what every alias holds.
  functional->apply_updates();
  const at::Tensor& base = functional->base();
  int64_t full = base.numel() * static_cast<int64_t>(base.itemsize());
  // The storage's tensors keep fixed shapes on the device: FSDP2's free and re-allocate
  // (CUDA's resize_bytes_cuda) are the resizes that fit them.
  TORCH_CHECK(nbytes == 0 || (current == 0 && nbytes == full), "torchtpu: a tpu storage can be freed (resize_(0)) ",
              "and re-allocated at its full size (resize_(", full, ")) only; resize_(", nbytes, ") of a storage of ",
              current, " bytes is not supported");
  ValuePtr contents = nbytes == 0 ? freed_value(base)
                                  : zeros_value(TensorType{base.sizes().vec(), to_dtype(base.scalar_type())},
                                                base.device().index());
  tpu_impl(base)->replace_contents(std::move(contents));
  functional->set_nbytes(static_cast<size_t>(nbytes));
  advance_generation(functional);
}

void release_freed_alias(const at::Tensor& t) {
  if (!is_tpu(t) || !at::functionalization::impl::isFunctionalTensor(t) || t.numel() == 0) return;
  auto* wrapper = at::functionalization::impl::unsafeGetFunctionalWrapper(t);
  if (wrapper->storage().nbytes() != 0) return;  // not freed
  const at::Tensor& inner = wrapper->value();
  tpu_impl(inner)->replace_contents(freed_value(inner));
}

}  // namespace torchtpu
