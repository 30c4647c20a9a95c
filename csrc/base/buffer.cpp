// Byte accounting of device buffers (what torch.tpu.memory_allocated reports).
#include "base/buffer.h"

#include <atomic>
#include <stdexcept>
#include <string>

namespace torchtpu {
namespace {

constexpr int kMaxDevices = 64;
std::atomic<int64_t> g_bytes_in_use[kMaxDevices];
std::atomic<int64_t> g_bytes_peak[kMaxDevices];

int checked(int device) {
  if (device < 0 || device >= kMaxDevices)
    throw std::logic_error("torchtpu: device index " + std::to_string(device) + " out of range");
  return device;
}

void charge(int device, int64_t bytes) {
  int64_t now = g_bytes_in_use[checked(device)].fetch_add(bytes) + bytes;
  int64_t peak = g_bytes_peak[device].load();
  while (bytes > 0 && now > peak && !g_bytes_peak[device].compare_exchange_weak(peak, now)) {
  }
}

// Calls charge(device, bytes) for each device holding part of the buffer.
template <typename F>
void for_each_shard(const DeviceBuffer& b, F&& charge_shard) {
  if (!b.sharding) return charge_shard(b.device, b.type.nbytes());
  const std::vector<int>& devices = b.sharding->mesh->devices;
  for (size_t p = 0; p < devices.size(); ++p) {
    int64_t elements = 1;
    for (int64_t n : b.sharding->shard_shape(b.type.shape, static_cast<int>(p))) elements *= n;
    charge_shard(devices[p], elements * static_cast<int64_t>(dtype_size(b.type.dtype)));
  }
}

}  // namespace

DeviceBuffer::DeviceBuffer(TensorType t, int d, ShardingPtr s)
    : type(std::move(t)), device(checked(d)), sharding(std::move(s)) {
  for_each_shard(*this, [](int device, int64_t bytes) { charge(device, bytes); });
}

DeviceBuffer::~DeviceBuffer() {
  for_each_shard(*this, [](int device, int64_t bytes) { g_bytes_in_use[device].fetch_sub(bytes); });
}

int64_t device_bytes_in_use(int device) { return g_bytes_in_use[checked(device)].load(); }
int64_t device_bytes_peak(int device) { return g_bytes_peak[checked(device)].load(); }
void reset_device_bytes_peak(int device) { g_bytes_peak[checked(device)].store(g_bytes_in_use[device].load()); }

}  // namespace torchtpu
