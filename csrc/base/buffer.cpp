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

}  // namespace

DeviceBuffer::DeviceBuffer(TensorType t, int d) : type(std::move(t)), device(checked(d)) {
  int64_t now = g_bytes_in_use[device].fetch_add(type.nbytes()) + type.nbytes();
  int64_t peak = g_bytes_peak[device].load();
  while (now > peak && !g_bytes_peak[device].compare_exchange_weak(peak, now)) {
  }
}

DeviceBuffer::~DeviceBuffer() { g_bytes_in_use[device].fetch_sub(type.nbytes()); }

int64_t device_bytes_in_use(int device) { return g_bytes_in_use[checked(device)].load(); }
int64_t device_bytes_peak(int device) { return g_bytes_peak[checked(device)].load(); }
void reset_device_bytes_peak(int device) { g_bytes_peak[checked(device)].store(g_bytes_in_use[device].load()); }

}  // namespace torchtpu
