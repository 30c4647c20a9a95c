// PrivateUse1 plumbing: device guard, accelerator hooks and random generators (the allocator
// is in memory.cpp).
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <array>
#include <atomic>
#include <chrono>
#include <mutex>

#include "device/generator.h"
#include "device/host_copies.h"
#include "device/kernels.h"
#include "device/tensor.h"
#include "engine/engine.h"

namespace torchtpu {
namespace {

// Streams are logical: XLA runs a device's work in the order it was issued, so every stream
// is a name for that one queue. Stream 0 is the default; new streams get 1, 2, ...; the
// current stream is per thread and device, as on CUDA.
constexpr int kMaxDevices = 64;
std::atomic<c10::StreamId> g_next_stream_id{1};
thread_local std::array<c10::StreamId, kMaxDevices> g_current_stream{};

// An event marks a point in a device's work. Recording a plain event flushes nothing (FSDP-
// style event traffic keeps one fused graph per step); recording a timing event waits for
// the device, so elapsed_time is the host time between two points the device had reached.
// A plain event remembers the non-blocking copies issued before it and the last graph
// launched (a result of it, `marker`): synchronizing waits for those only, so a loop that
// reads each step's flag one step late (transformers' DeferredStopCheck) never waits for the
// step the device is running. With work recorded but not yet launched, it waits for all.
struct TpuEvent {
  bool timing = false;
  bool finished = false;
  std::chrono::steady_clock::time_point reached;
  int device = 0;
  uint64_t copies = 0;  // host_copies_issued() when recorded
  BufferPtr marker;     // Engine::last_launch_marker() when recorded
};

void wait_for_device() { synchronize(true); }

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
  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(device_count()); }

  c10::Stream getStream(c10::Device d) const override {
    c10::Device device = indexed(d);
    return c10::Stream(c10::Stream::UNSAFE, device, g_current_stream[slot(device.index())]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, indexed(d)); }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return c10::Stream(c10::Stream::UNSAFE, indexed(d), g_next_stream_id++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getNewStream(d, 0); }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = getStream(s.device());
    g_current_stream[slot(s.device_index())] = s.id();
    return old;
  }
  bool queryStream(const c10::Stream&) const override {
    wait_for_device();  // no completion probe: wait, then the answer is exact
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override { translate_errors(wait_for_device); }
  void synchronizeDevice(const c10::DeviceIndex) const override { translate_errors(wait_for_device); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag flag) const override {
    if (!*event) *event = new TpuEvent();
    auto* e = static_cast<TpuEvent*>(*event);
    e->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
    e->finished = false;
    e->device = stream.device_index();
    e->marker.reset();
    if (e->timing) {
      wait_for_device();
      e->reached = std::chrono::steady_clock::now();
      e->finished = true;
      return;
    }
    e->copies = host_copies_issued();
    e->marker = Engine::get().last_launch_marker();
  }
  void block(void*, const c10::Stream&) const override {}  // later work on any stream runs after it
  bool queryEvent(void* event) const override {
    synchronizeEvent(event);
    return true;
  }
  void synchronizeEvent(void* event) const override {
    auto* e = static_cast<TpuEvent*>(event);
    if (!e || e->finished) return;
    bool marked = !e->marker || e->marker->device == e->device;  // else: another device's graph
    BufferPtr marker = std::move(e->marker);
    e->finished = true;
    // A failed runtime check of the work waited for raises here, as CPU's kernel would have.
    translate_errors([&] {
      if (Engine::get().pending_ops() > 0 || !marked) {
        wait_for_device();
        return;
      }
      finish_host_copies(e->copies);
      if (marker) runtime().wait(*marker);
      Engine::get().raise_failed_checks(e->device);
    });
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<TpuEvent*>(start);
    auto* b = static_cast<TpuEvent*>(end);
    TORCH_CHECK(a && b && a->timing && b->timing, "Both events must be created with argument 'enable_timing=True'.");
    return std::chrono::duration<double, std::milli>(b->reached - a->reached).count();
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { delete static_cast<TpuEvent*>(event); }

 private:
  // "tpu" without an index means the current device.
  static c10::Device indexed(c10::Device d) {
    return d.has_index() ? d : c10::Device(kType, static_cast<c10::DeviceIndex>(current_device()));
  }
  static size_t slot(c10::DeviceIndex index) {
    TORCH_CHECK(index >= 0 && index < kMaxDevices, "tpu error: invalid device ordinal ", static_cast<int>(index));
    return static_cast<size_t>(index);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

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
  bool isPinnedPtr(const void* ptr) const override { return is_pinned_ptr(ptr); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
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
