// Allocation and copies: empty tensors, the copy family (_copy_from, copy,
// _copy_from_and_resize, _to_copy), resize_ and reading a scalar. Every copy onto a tpu
// device goes through tpu_copy (into a sharded tensor, copy_onto_layout: device/spmd.h);
// every copy to the host through to_host.
#include "device/explain.h"
#include "device/host_copies.h"
#include "device/kernels.h"
#include "device/spmd.h"

namespace torchtpu {

ValuePtr tpu_copy(const at::Tensor& src, int device, DType dtype) {
  ValuePtr v;
  if (is_tpu(src) && src.device().index() == device) v = value_of(src, device);
  else v = upload(to_host(src), device);  // another tpu device's data travels through the host
  return convert_value(v, dtype);
}

at::Tensor to_host(const at::Tensor& t) {
  if (!is_tpu(t)) return t;
  return download(value_of(t, t.device().index()));
}

at::Tensor tpu_empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                     std::optional<at::Device> device, std::optional<bool>, std::optional<at::MemoryFormat>) {
  if (explaining()) report_route("aten::empty.memory_format", "own kernel", "csrc/device/copy.cpp: a new value on the device");
  return translate_errors([&] {
    TORCH_CHECK(!layout || *layout == at::kStrided, "torchtpu: only strided tensors are supported on tpu");
    for (int64_t d : size) TORCH_CHECK(d >= 0, "Trying to create tensor with negative dimension ", d, ": ", size);
    int index = device && device->has_index() ? device->index() : current_device();
    check_device_index(index);
    TensorType type{size.vec(), to_dtype(dtype.value_or(at::get_default_dtype_as_scalartype()))};
    return wrap_for_user(make_tensor(zeros_value(type, index)));
  });
}

at::Tensor tpu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout> layout, std::optional<at::Device> device,
                             std::optional<bool> pin) {
  return tpu_empty(size, dtype, layout, device, pin, std::nullopt);
}

// _copy_from(self, dst): dst.copy_(self) where either is a tpu tensor. A tpu dst gets self
// converted to its dtype and broadcast to its shape. non_blocking into pinned host memory
// returns before the bytes land (device/host_copies.h).
at::Tensor tpu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (explaining()) report_route("aten::_copy_from", "own kernel", "csrc/device/copy.cpp: a copy between devices (tpu_copy)");
  return translate_errors([&] {
    if (is_tpu(dst)) {
      if (ValuePtr laid_out = copy_onto_layout(dst, self)) {
        store_value(dst, laid_out);
        return dst;
      }
      ValuePtr v = tpu_copy(self, dst.device().index(), to_dtype(dst.scalar_type()));
      store_value(dst, broadcast_value(v, dst.sizes().vec()));
    } else if (!(non_blocking && copy_to_pinned_later(self, dst))) {
      dst.copy_(to_host(self));
    }
    return dst;
  });
}

// copy(self, src): functionalization's form of self.copy_(src); a new value, src converted
// to self's dtype and broadcast to its shape.
at::Tensor tpu_copy_functional(const at::Tensor& self, const at::Tensor& src, bool) {
  if (explaining()) report_route("aten::copy", "own kernel", "csrc/device/copy.cpp: functionalization's copy_ (tpu_copy)");
  return translate_errors([&] {
    if (ValuePtr laid_out = copy_onto_layout(self, src)) return wrap_for_user(make_tensor(std::move(laid_out)));
    ValuePtr v = tpu_copy(src, self.device().index(), to_dtype(self.scalar_type()));
    return wrap_for_user(make_tensor(broadcast_value(v, self.sizes().vec())));
  });
}

// _copy_from_and_resize(self, dst): dst takes self's shape and contents.
at::Tensor tpu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (explaining()) report_route("aten::_copy_from_and_resize", "own kernel", "csrc/device/copy.cpp");
  return translate_errors([&] {
    if (is_tpu(dst)) {
      at::Tensor inner = unwrap(dst);
      auto* impl = static_cast<TpuTensorImpl*>(inner.unsafeGetTensorImpl());
      impl->set_value(tpu_copy(self, dst.device().index(), to_dtype(dst.scalar_type())));
    } else {
      at::Tensor host = to_host(self);
      dst.resize_(host.sizes());
      dst.copy_(host);
    }
    return dst;
  });
}

at::Tensor tpu_to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                       std::optional<at::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                       std::optional<at::MemoryFormat>) {
  if (explaining()) report_route("aten::_to_copy", "own kernel", "csrc/device/copy.cpp: .to(device or dtype) (tpu_copy)");
  return translate_errors([&]() -> at::Tensor {
    TORCH_CHECK(!layout || *layout == at::kStrided, "torchtpu: only strided tensors are supported on tpu");
    at::ScalarType target = dtype.value_or(self.scalar_type());
    if (!is_tpu(self)) {
      // Host to device: PyTorch routes this here because the target device is tpu. The
      // host converts the dtype, as a CPU .to(dtype) would.
      int index = device && device->has_index() ? device->index() : current_device();
      check_device_index(index);
      at::Tensor host = self.scalar_type() == target ? self : self.to(target);
      return wrap_for_user(make_tensor(tpu_copy(host, index, to_dtype(target))));
    }
    if (device && device->type() != c10::DeviceType::PrivateUse1) {
      at::Tensor out = to_host(self).to(*device, target, non_blocking, /*copy=*/false);
      if (pin_memory.value_or(false)) out = out.pin_memory();
      return out;
    }
    int index = device && device->has_index() ? device->index() : self.device().index();
    check_device_index(index);
    return make_tensor(tpu_copy(self, index, to_dtype(target)));
  });
}

// resize_ on an inner tensor (out= kernels resize their outputs): new contents are zeros.
const at::Tensor& tpu_resize(const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat>) {
  return translate_errors([&]() -> const at::Tensor& {
    if (self.sizes() == size) return self;
    at::Tensor inner = unwrap(self);
    auto* impl = dynamic_cast<TpuTensorImpl*>(inner.unsafeGetTensorImpl());
    TORCH_CHECK(impl, "torchtpu: resize_ of a non-tpu tensor");
    impl->set_value(zeros_value(TensorType{size.vec(), to_dtype(self.scalar_type())}, self.device().index()));
    return self;
  });
}

c10::Scalar tpu_local_scalar_dense(const at::Tensor& self) {
  if (explaining()) report_route("aten::_local_scalar_dense", "own kernel", "csrc/device/copy.cpp: .item() reads the value on the host");
  return translate_errors([&] { return to_host(self).item(); });
}

}  // namespace torchtpu
