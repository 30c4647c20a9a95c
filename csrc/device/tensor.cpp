// TpuTensorImpl and the conversions between at::Tensor and engine values.
#include "device/tensor.h"

#include <ATen/DLConvertor.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "device/spmd.h"
#include "engine/engine.h"
#include "engine/trace.h"
#include "lowering/registry.h"

namespace torchtpu {

namespace {

c10::Storage empty_storage(const TensorType& type, c10::Device device) {
  // No host-addressable memory: the data lives in the engine value.
  return c10::Storage(c10::Storage::use_byte_size_t(), type.nbytes(), c10::DataPtr(nullptr, device),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

thread_local int g_current_device = -1;  // -1: the process default

}  // namespace

OpKind lowered_kind(const char* name) {
  const LoweringRule* rule = find_lowering(name);
  TORCH_INTERNAL_ASSERT(rule, "torchtpu: missing lowering ", name);
  return rule->kind;
}

TpuTensorImpl::TpuTensorImpl(ValuePtr value, c10::Device device)
    : c10::TensorImpl(empty_storage(value->type, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                      caffe2::TypeMeta::fromScalarType(to_scalar_type(value->type.dtype))),
      value_(std::move(value)) {
  set_sizes_contiguous(value_->type.shape);
}

namespace {

Arg int_list(const std::vector<int64_t>& v) {
  Arg a;
  a.kind = Arg::Kind::IntList;
  a.ints = v;
  return a;
}


// The elements of a view, read from its root's value.
ValuePtr read_view(const ValuePtr& root, const TpuTensorImpl::ViewOf& v) {
  static const OpKind op = lowered_kind("aten::as_strided_copy");
  TensorType out{v.sizes, root->type.dtype};
  return Engine::get().record(op, {Arg::tensor(0), int_list(v.sizes), int_list(v.strides), Arg::integer(v.offset)},
                              {root}, {out}, root->device)[0];
}

// The root's value with a view's elements replaced.
ValuePtr write_view(const ValuePtr& root, const ValuePtr& src, const TpuTensorImpl::ViewOf& v) {
  static const OpKind op = lowered_kind("aten::as_strided_scatter");
  return Engine::get().record(op,
                              {Arg::tensor(0), Arg::tensor(1), int_list(v.sizes), int_list(v.strides),
                               Arg::integer(v.offset)},
                              {root, src}, {root->type}, root->device)[0];
}

}  // namespace

const ValuePtr& TpuTensorImpl::value() {
  // Composite kernels may restride an inner tensor directly (transpose_ calls as_strided_,
  // which sets sizes and strides without dispatching): the tensor is then a view of what
  // it held before.
  bool drifted = view_ ? (sizes() != c10::IntArrayRef(view_->sizes) || strides() != c10::IntArrayRef(view_->strides) ||
                          storage_offset() != view_->offset)
                       : (sizes() != c10::IntArrayRef(value_->type.shape) || !is_contiguous() || storage_offset() != 0);
  if (drifted) {
    c10::intrusive_ptr<TpuTensorImpl> root;
    if (view_) {
      root = view_->root;
    } else {
      root = c10::make_intrusive<TpuTensorImpl>(value_, device());
    }
    become_view(root, sizes().vec(), strides().vec(), storage_offset());
  }
  if (view_ && view_->root->value_ != view_->root_value_seen) {
    view_->root_value_seen = view_->root->value_;
    value_ = read_view(view_->root_value_seen, *view_);
  }
  return value_;
}

void TpuTensorImpl::set_value(ValuePtr value) {
  if (value->type.dtype != value_->type.dtype)
    throw std::logic_error("torchtpu: set_value changed a tensor's dtype");
  bool reshaped = value->type.shape != value_->type.shape;
  if (view_ && !reshaped) {
    ValuePtr root_value = write_view(view_->root->value(), value, *view_);
    view_->root->set_value(root_value);
    view_->root_value_seen = view_->root->value_;
    value_ = std::move(value);
    return;
  }
  view_.reset();
  value_ = std::move(value);
  if (reshaped || !is_contiguous()) {
    set_sizes_contiguous(value_->type.shape);
    set_storage_offset(0);
    storage_ = empty_storage(value_->type, device());
  }
}

void TpuTensorImpl::replace_contents(ValuePtr value) {
  view_.reset();
  value_ = std::move(value);
}

void TpuTensorImpl::become_view(c10::intrusive_ptr<TpuTensorImpl> root, std::vector<int64_t> sizes,
                                std::vector<int64_t> strides, int64_t offset) {
  while (root->view_) root = root->view_->root;  // geometry is always relative to the root
  ViewOf v{root, std::move(sizes), std::move(strides), offset, root->value()};
  value_ = read_view(v.root_value_seen, v);
  set_sizes_and_strides(v.sizes, v.strides, v.offset);
  storage_ = root->storage_;
  view_ = std::move(v);
}

c10::intrusive_ptr<c10::TensorImpl> TpuTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<TpuTensorImpl>(value_, device());
  copy_tensor_metadata(this, impl.get(), version_counter, allow_tensor_metadata_change);
  impl->view_ = view_;
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> TpuTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<TpuTensorImpl>(value_, device());
  copy_tensor_metadata(this, impl.get(), std::move(version_counter), allow_tensor_metadata_change);
  impl->view_ = view_;
  return impl;
}

void TpuTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  auto* other = dynamic_cast<TpuTensorImpl*>(impl.get());
  TORCH_CHECK(other, "torchtpu: cannot copy a non-tpu tensor into a tpu tensor's metadata");
  copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
  value_ = other->value_;
  view_ = other->view_;
}

DType to_dtype(c10::ScalarType type) {
  int code = static_cast<int>(type);
  TORCH_CHECK_TYPE(is_supported_dtype(code), "torchtpu: dtype torch.", c10::getDtypeNames(type).first,
                   " is not supported on tpu; supported dtypes are float32, bfloat16, float16, float64, "
                   "complex64, complex128, int64, int32, int16, int8, uint8 and bool");
  // complex128 is two float64s: only where the platform computes in float64.
  TORCH_CHECK_TYPE(type != c10::ScalarType::ComplexDouble || !runtime_initialized() || runtime().has_float64(),
                   "torchtpu: dtype torch.complex128 is not supported on platform ", runtime().platform(),
                   " (it has no float64); use torch.complex64");
  return static_cast<DType>(code);
}

TensorType tensor_type_of(const at::Tensor& t) {
  return TensorType{t.sizes().vec(), to_dtype(t.scalar_type())};
}

bool is_tpu(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

at::Tensor unwrap(const at::Tensor& t) {
  if (at::functionalization::impl::isFunctionalTensor(t)) {
    at::functionalization::impl::sync(t);
    return at::functionalization::impl::from_functional_tensor(t);
  }
  return t;
}

namespace {

// conj() and _neg_view() below functionalization (composite kernels call them on inner
// tensors) set a math bit on the tensor, not in its value: reading it applies the bit, as
// PyTorch's clone of such a tensor does.
ValuePtr apply_math_bits(const at::Tensor& t, ValuePtr value) {
  auto apply = [&](const char* op_name) {
    TensorType type = value->type;
    int device = value->device;
    return Engine::get().record(lowered_kind(op_name), {Arg::tensor(0)}, {std::move(value)}, {type}, device)[0];
  };
  if (t.is_conj()) value = apply("aten::_conj_physical");
  if (t.is_neg()) value = apply("aten::neg");
  return value;
}

}  // namespace

namespace {

// A Python number an op takes as a tensor (x.add_(1), x * 0.5) in fused mode: a node of the
// step's graph holding the number (lifted into the graph's scalar packs, so a changing number
// does not recompile; 0 and 1 stay constants, as for Scalar arguments), not an upload per op.
// Strict and debug mode upload it: a node there would be one more launch before the op's.
ValuePtr wrapped_number_value(const at::Tensor& t, int device) {
  static const OpKind op = lowered_kind("torchtpu::scalar");
  c10::Scalar number = t.item();
  Arg a;
  if (number.isFloatingPoint()) a = Arg::real(number.toDouble());
  else if (number.isBoolean()) a = Arg::boolean(number.toBool());
  else a = Arg::integer(number.toLong());
  a.lifted = a.as_double() != 0.0 && a.as_double() != 1.0;
  return Engine::get().record(op, {std::move(a)}, {}, {tensor_type_of(t)}, device)[0];
}

}  // namespace

ValuePtr value_of(const at::Tensor& t, int device) {
  if (!is_tpu(t)) {
    bool wrapped = t.unsafeGetTensorImpl()->is_wrapped_number();
    // A Python complex number (x * 2j) is a complex128 CPU scalar; it only promotes like a
    // scalar, so on a platform without float64 it travels as complex64.
    if (wrapped && t.scalar_type() == at::kComplexDouble && !runtime().has_float64())
      return upload(t.to(at::kComplexFloat), device);
    if (wrapped && !t.is_complex() && t.dim() == 0 && Engine::get().mode() == Mode::Fused)
      return wrapped_number_value(t, device);
    return upload(t, device);
  }
  at::Tensor inner = unwrap(t);
  auto* impl = dynamic_cast<TpuTensorImpl*>(inner.unsafeGetTensorImpl());
  TORCH_CHECK(impl, "torchtpu: found a tpu tensor without device data");
  if (inner.is_conj() || inner.is_neg()) return apply_math_bits(inner, impl->value());
  return impl->value();
}

at::Tensor make_tensor(ValuePtr value) {
  c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(value->device));
  return at::Tensor(c10::make_intrusive<TpuTensorImpl>(std::move(value), device));
}

void store_value(const at::Tensor& dst, const ValuePtr& value) {
  at::Tensor inner = unwrap(dst);
  auto* impl = dynamic_cast<TpuTensorImpl*>(inner.unsafeGetTensorImpl());
  TORCH_CHECK(impl, "torchtpu: an op wrote into a tensor that is not on tpu");
  impl->set_value(convert_value(value, to_dtype(dst.scalar_type())));
  if (at::functionalization::impl::isFunctionalTensor(dst)) {
    at::functionalization::impl::replace_(dst, inner);
    // A view (a slice passed to a collective, DDP's bucket views) writes through to its
    // base, as an in-place op on it would.
    at::functionalization::impl::commit_update(dst);
  }
}

at::Tensor wrap_for_user(const at::Tensor& raw) {
  if (c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Functionalize)) return raw;
  return at::functionalization::impl::to_functional_tensor(raw);
}

namespace {

// Keeps a CPU tensor alive for as long as the runtime reads it through DLPack.
struct HostHolder {
  at::Tensor tensor;
  DLManagedTensor managed;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

TraceEvent transfer_event(const char* direction, const TensorType& type, int device) {
  return TraceEvent{std::string("torchtpu::transfer#") + direction,
                    {{"direction", direction},
                     {"what", "tensor"},
                     {"bytes", type.nbytes()},
                     {"type", type.str()},
                     {"device", static_cast<int64_t>(device)}}};
}

}  // namespace

ValuePtr upload(const at::Tensor& cpu_in, int device) {
  TORCH_CHECK(cpu_in.device().is_cpu(), "torchtpu: cannot copy a ", cpu_in.device(), " tensor to tpu directly; move it to cpu first");
  TensorType type = tensor_type_of(cpu_in);
  TraceSpan span([&] { return transfer_event("to_device", type, device); });
  // A private contiguous copy: the device buffer may alias it (zero-copy on CPU), so later
  // writes to the user's CPU tensor must not show through.
  at::Tensor cpu = cpu_in.is_conj() || cpu_in.is_neg() ? cpu_in.resolve_conj().resolve_neg() : cpu_in;
  at::Tensor copy = at::empty(cpu.sizes(), cpu.options().memory_format(c10::MemoryFormat::Contiguous));
  copy.copy_(cpu);
  auto* holder = new HostHolder{copy, {}, type.shape, copy.strides().vec()};
  DLManagedTensor& m = holder->managed;
  m.manager_ctx = holder;
  m.deleter = [](DLManagedTensor* self) { delete static_cast<HostHolder*>(self->manager_ctx); };
  m.dl_tensor.data = copy.numel() ? copy.data_ptr() : nullptr;
  m.dl_tensor.device = DLDevice{kDLCPU, 0};
  m.dl_tensor.ndim = static_cast<int32_t>(type.shape.size());
  m.dl_tensor.dtype = at::getDLDataType(copy);
  m.dl_tensor.shape = holder->shape.data();
  m.dl_tensor.strides = holder->strides.data();
  m.dl_tensor.byte_offset = 0;
  if (type.numel() == 0) {
    // Zero-size tensors carry no data; hand the runtime a valid pointer anyway.
    static int64_t dummy[8];
    m.dl_tensor.data = dummy;
  }
  Engine::get().metrics().bytes_to_device += type.nbytes();
  return Engine::get().from_buffer(runtime().upload(&m, type, device));
}

namespace {

// The real elements of a padded host copy (a value a bucketed graph computed padded): sliced
// on the host, so that reading such a value compiles nothing.
at::Tensor unpad_on_host(const at::Tensor& host, const PaddedBuffer& padded) {
  std::vector<int64_t> bucket, real;
  for (const auto& dim : padded.dims)
    for (const auto& f : dim) {
      bucket.push_back(f.bucket);
      real.push_back(f.real);
    }
  at::Tensor x = host.reshape(bucket);
  for (size_t d = 0; d < real.size(); ++d) x = x.narrow(static_cast<int64_t>(d), 0, real[d]);
  return x;
}

}  // namespace

IssuedRead issue_read(const ValuePtr& value) {
  IssuedRead read;
  read.value = value;
  EngineLock lock;
  Engine::get().compute(value);
  if (value->padded_only()) read.padded = value->padded;
  else read.buffer = Engine::get().materialize(value);
  return read;
}

at::Tensor finish_read(const IssuedRead& read) {
  const ValuePtr& value = read.value;
  const std::shared_ptr<const PaddedBuffer>& padded = read.padded;
  if (read.buffer && read.buffer->sharding) {  // laid out over a mesh: gathered from its shards
    at::Tensor out = download_sharded(*read.buffer);
    Engine::get().raise_failed_checks(value->device);
    Engine::get().metrics().bytes_to_host += value->type.nbytes();
    return out;
  }
  const DeviceBuffer& source = padded ? *padded->buffer : *read.buffer;
  if (tracing()) {
    // The copy waits for the value's computation: traced apart, the transfer's span is the copy.
    TraceSpan wait([&] {
      return TraceEvent{"torchtpu::wait", {{"reason", "to_host"}, {"device", static_cast<int64_t>(value->device)}}};
    });
    runtime().wait(source);
  }
  const TensorType& stored = padded ? padded->buffer->type : value->type;
  TraceSpan span([&] { return transfer_event("to_host", stored, value->device); });
  DLManagedTensor* managed = runtime().download(source);
  at::Tensor host = at::fromDLPack(managed);
  // The host waited for the graph: its runtime checks (and earlier ones) are computed.
  Engine::get().raise_failed_checks(value->device);
  at::ScalarType want = to_scalar_type(value->type.dtype);
  if (host.scalar_type() != want) host = host.view(want);
  host = host.reshape(stored.shape);
  if (padded) host = unpad_on_host(host, *padded);
  at::Tensor out = at::empty(value->type.shape, at::TensorOptions().dtype(want));
  if (out.numel()) out.copy_(host.reshape(value->type.shape));
  Engine::get().metrics().bytes_to_host += stored.nbytes();
  Engine::get().metrics().downloads++;
  return out;
}

at::Tensor download(const ValuePtr& value) { return finish_read(issue_read(value)); }

ValuePtr convert_value(const ValuePtr& value, DType dtype) {
  if (value->type.dtype == dtype) return value;
  static const OpKind op = lowered_kind("torchtpu::convert");
  TensorType out{value->type.shape, dtype};
  return Engine::get().record(op, {Arg::tensor(0), Arg::integer(static_cast<int>(dtype))}, {value}, {out},
                              value->device)[0];
}

ValuePtr broadcast_value(const ValuePtr& value, const std::vector<int64_t>& shape) {
  if (value->type.shape == shape) return value;
  static const OpKind op = lowered_kind("torchtpu::broadcast");
  Arg sizes;
  sizes.kind = Arg::Kind::IntList;
  sizes.ints = shape;
  TensorType out{shape, value->type.dtype};
  return Engine::get().record(op, {Arg::tensor(0), sizes}, {value}, {out}, value->device)[0];
}

ValuePtr zeros_value(const TensorType& type, int device) {
  static const OpKind op = lowered_kind("torchtpu::zeros");
  return Engine::get().record(op, {}, {}, {type}, device)[0];
}

int current_device() {
  // Under torchrun a thread starts on this process's own device (tpu:LOCAL_RANK).
  return g_current_device >= 0 ? g_current_device : process_layout().local_rank;
}

int device_count() { return configured_device_count(); }

void check_device_range(int64_t index) {
  int count = device_count();
  if (index < 0 || index >= count) {
    TORCH_CHECK(false, "tpu error: invalid device ordinal ", index, " (torchtpu sees ", count,
                " device", count == 1 ? "" : "s", " on platform ", runtime_initialized() ? runtime().platform() : "?",
                "; on cpu, set TORCHTPU_NUM_DEVICES=N before importing torch for more)");
  }
}

void check_device_index(int64_t index) {
  check_device_range(index);
  if (!device_addressable(static_cast<int>(index))) {
    int mine = process_layout().local_rank;
    TORCH_CHECK(false, "tpu error: tpu:", index, " belongs to another process of this torchrun job; each process "
                "drives only its own device, tpu:LOCAL_RANK (here tpu:", mine, "). Use "
                "torch.device(\"tpu\", int(os.environ[\"LOCAL_RANK\"])) or plain \"tpu\"");
  }
}

void set_current_device(int index) {
  // Any device of the node may be current (autograd's worker threads visit each), but only
  // this process's own device can hold tensors (check_device_index).
  check_device_range(index);
  g_current_device = index;
}

}  // namespace torchtpu
