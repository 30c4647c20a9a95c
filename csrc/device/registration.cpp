// PrivateUse1 plumbing: device guard, accelerator hooks, allocator and random generators.
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/empty.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <mutex>

#include "device/generator.h"
#include "device/tensor.h"
#include "engine/engine.h"

namespace torchtpu {
namespace {

struct TpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() != old.index()) set_current_device(d.index());
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kType, static_cast<c10::DeviceIndex>(current_device())); }
  void setDevice(c10::Device d) const override { set_current_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) {
      try {
        set_current_device(d.index());
      } catch (...) {
      }
    }
  }
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(device_count()); }
  // Events: work on one device runs in order, so recording and blocking are no-ops.
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override { Engine::get().sync(true); }
  void synchronizeDevice(const c10::DeviceIndex) const override { Engine::get().sync(true); }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

// tpu storages hold no host memory; anything that asks for one gets a clear error.
struct TpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(current_device()));
    TORCH_CHECK(n == 0, "torchtpu: tpu tensors have no host-addressable storage; copy the tensor to cpu "
                        "(tensor.cpu()) to work with its memory");
    return c10::DataPtr(nullptr, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t count) const override {
    TORCH_CHECK(count == 0, "torchtpu: tpu storages cannot be copied byte-wise");
  }
};

TpuAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index < 0 ? current_device() : index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<TpuGeneratorImpl>(index < 0 ? current_device() : index);
  }
  at::Device getDeviceFromPtr(void*) const override {
    TORCH_CHECK(false, "torchtpu: tpu tensors have no host pointers");
  }
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(current_device()); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device();
    set_current_device(d);
    return static_cast<c10::DeviceIndex>(old);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
};

}  // namespace

TpuGeneratorImpl::TpuGeneratorImpl(int device)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

void TpuGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

uint64_t TpuGeneratorImpl::seed() {
  uint64_t s = c10::detail::getNonDeterministicRandom();
  set_current_seed(s);
  return s;
}

std::pair<uint64_t, uint64_t> TpuGeneratorImpl::next() {
  std::lock_guard<std::mutex> lock(mutex_);
  return {seed_, offset_++};
}

int64_t TpuGeneratorImpl::next_key() {
  auto [seed, offset] = next();
  uint64_t key = seed * 0x9E3779B97F4A7C15ull + offset;
  key = (key ^ (key >> 30)) * 0xBF58476D1CE4E5B9ull;
  key = (key ^ (key >> 27)) * 0x94D049BB133111EBull;
  key ^= key >> 31;
  return static_cast<int64_t>(key);
}

void TpuGeneratorImpl::set_state(const c10::TensorImpl& state) {
  TORCH_CHECK(state.numel() == 16 && state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
              "torchtpu: a tpu generator state is a uint8 tensor of 16 bytes");
  const auto* data = static_cast<const uint8_t*>(state.data());
  std::memcpy(&seed_, data, 8);
  std::memcpy(&offset_, data + 8, 8);
}

c10::intrusive_ptr<c10::TensorImpl> TpuGeneratorImpl::get_state() const {
  at::Tensor state = at::empty({16}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(state.data_ptr(), &seed_, 8);
  std::memcpy(static_cast<uint8_t*>(state.data_ptr()) + 8, &offset_, 8);
  return state.getIntrusivePtr();
}

TpuGeneratorImpl* TpuGeneratorImpl::clone_impl() const {
  auto* copy = new TpuGeneratorImpl(device().index());
  copy->seed_ = seed_;
  copy->offset_ = offset_;
  return copy;
}

const at::Generator& default_generator(int device) {
  static std::once_flag once;
  static std::vector<at::Generator> generators;
  std::call_once(once, [] {
    for (int d = 0; d < 64; ++d) {
      generators.push_back(at::make_generator<TpuGeneratorImpl>(d));
      generators.back().set_current_seed(c10::default_rng_seed_val);
    }
  });
  check_device_range(device);
  return generators[device];
}

void register_hooks() {
  static TpuHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

}  // namespace torchtpu
