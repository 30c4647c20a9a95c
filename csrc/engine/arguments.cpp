// What a launch passes besides parameter buffers: the scalar packs (lifted, then uploaded), and buffers replicated onto a mesh.
#include "engine/engine.h"

#include <vector>

#include "engine/graph_plan.h"
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

// Lifted scalar arguments, in node order, become the float and int packs; each node's
// lifted_slots say where its arguments start (left empty for a node without lifted
// arguments, most of them: no allocation per node at every flush).
void Engine::lift_scalars(Graph& g) {
  g.float_scalars.clear();
  g.int_scalars.clear();
  g.lifted_slots.assign(g.nodes.size(), {});
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node* node = g.nodes[n];
    auto& slots = g.lifted_slots[n];
    for (size_t a = 0; a < node->args.size(); ++a) {
      const Arg& arg = node->args[a];
      if (!arg.lifted) continue;
      if (slots.empty()) slots.assign(node->args.size(), -1);
      switch (arg.kind) {
        case Arg::Kind::Double: slots[a] = static_cast<int>(g.float_scalars.size()); g.float_scalars.push_back(arg.d); break;
        case Arg::Kind::DoubleList: case Arg::Kind::Complex:
          slots[a] = static_cast<int>(g.float_scalars.size());
          g.float_scalars.insert(g.float_scalars.end(), arg.doubles.begin(), arg.doubles.end());
          break;
        case Arg::Kind::IntList: case Arg::Kind::BoolList:
          slots[a] = static_cast<int>(g.int_scalars.size());
          g.int_scalars.insert(g.int_scalars.end(), arg.ints.begin(), arg.ints.end());
          break;
        default: slots[a] = static_cast<int>(g.int_scalars.size()); g.int_scalars.push_back(arg.i); break;
      }
    }
  }
}

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
