// What a launch passes besides parameter buffers: the scalar packs, and buffers replicated onto a mesh.
#include "engine/engine.h"

#include <vector>

#include "engine/trace.h"

namespace torchtpu {

namespace {

TraceEvent upload_event(const char* what, int64_t bytes, int device) {
  return TraceEvent{"torchtpu::transfer#to_device",
                    {{"direction", "to_device"}, {"what", what}, {"bytes", bytes}, {"device", static_cast<int64_t>(device)}}};
}

// Host bytes copied to every device of a mesh, as one replicated buffer.
BufferPtr upload_replicated(const void* data, const TensorType& type, const MeshPtr& mesh) {
  auto sharding = std::make_shared<Sharding>(Sharding::replicated(mesh, type.rank()));
  std::vector<BufferPtr> shards;
  for (int d : mesh->devices) shards.push_back(runtime().upload_bytes(data, type, d));
  return runtime().assemble_sharded(type, std::move(sharding), shards);
}

BufferPtr upload_to(const void* data, const TensorType& type, int device, const MeshPtr& mesh) {
  return mesh ? upload_replicated(data, type, mesh) : runtime().upload_bytes(data, type, device);
}

}  // namespace

DType Engine::scalar_float_dtype() { return runtime().has_float64() ? DType::Float64 : DType::Float32; }

BufferPtr Engine::upload_float_scalars(const std::vector<double>& values, int device, const MeshPtr& mesh) {
  TensorType t{{static_cast<int64_t>(values.size())}, scalar_float_dtype()};
  TraceSpan span([&] { return upload_event("scalars", t.nbytes(), device); });
  if (t.dtype == DType::Float64) return upload_to(values.data(), t, device, mesh);
  std::vector<float> narrow(values.begin(), values.end());
  return upload_to(narrow.data(), t, device, mesh);
}

BufferPtr Engine::upload_int_scalars(const std::vector<int64_t>& values, int device, const MeshPtr& mesh) {
  TensorType t{{static_cast<int64_t>(values.size())}, DType::Int64};
  TraceSpan span([&] { return upload_event("scalars", t.nbytes(), device); });
  return upload_to(values.data(), t, device, mesh);
}

BufferPtr Engine::argument_for_mesh(const BufferPtr& buffer, const MeshPtr& mesh) {
  if (buffer->sharding) return buffer;
  std::vector<char> host(static_cast<size_t>(buffer->type.nbytes()));
  runtime().download_bytes(*buffer, host.data());
  metrics_.bytes_to_host += buffer->type.nbytes();
  metrics_.bytes_to_device += buffer->type.nbytes() * static_cast<int64_t>(mesh->devices.size());
  TraceSpan span([&] { return upload_event("replicated", buffer->type.nbytes(), buffer->device); });
  return upload_replicated(host.data(), buffer->type, mesh);
}

}  // namespace torchtpu
