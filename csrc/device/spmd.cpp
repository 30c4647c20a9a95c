// Sharded tpu tensors (see spmd.h): their uploads, downloads, resharding and mesh checks.
#include "device/spmd.h"

#include <ATen/DLConvertor.h>
#include <ATen/FunctionalTensorWrapper.h>

#include "device/kernels.h"
#include "engine/engine.h"
#include "lowering/sharding.h"

namespace torchtpu {

namespace {

// The part of a host tensor a shard covers (a view).
at::Tensor shard_view(const at::Tensor& host, const std::vector<std::pair<int64_t, int64_t>>& bounds) {
  at::Tensor view = host;
  for (size_t d = 0; d < bounds.size(); ++d) view = view.narrow(static_cast<int64_t>(d), bounds[d].first, bounds[d].second);
  return view;
}

}  // namespace

ValuePtr upload_sharded(const at::Tensor& cpu, const ShardingPtr& sharding) {
  TensorType global = tensor_type_of(cpu);
  sharding->validate(global.rank());
  const std::vector<int>& devices = sharding->mesh->devices;
  std::vector<BufferPtr> shards;
  for (size_t p = 0; p < devices.size(); ++p) {
    ValuePtr shard = upload(shard_view(cpu, sharding->shard_bounds(global.shape, static_cast<int>(p))), devices[p]);
    shards.push_back(shard->buffer);
  }
  return Engine::get().from_buffer(runtime().assemble_sharded(global, sharding, shards));
}

at::Tensor download_sharded(const DeviceBuffer& buffer) {
  const Sharding& sharding = *buffer.sharding;
  at::ScalarType dtype = to_scalar_type(buffer.type.dtype);
  at::Tensor out = at::empty(buffer.type.shape, at::TensorOptions().dtype(dtype));
  std::vector<BufferPtr> shards = runtime().shards_of(buffer);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> copied;  // each tile is read once
  for (size_t p = 0; p < shards.size(); ++p) {
    auto bounds = sharding.shard_bounds(buffer.type.shape, static_cast<int>(p));
    if (std::find(copied.begin(), copied.end(), bounds) != copied.end()) continue;
    copied.push_back(bounds);
    if (shards[p]->type.numel() == 0) continue;
    at::Tensor host = at::fromDLPack(runtime().download(*shards[p]));
    if (host.scalar_type() != dtype) host = host.view(dtype);
    shard_view(out, bounds).copy_(host.reshape(shards[p]->type.shape));
  }
  return out;
}

at::Tensor shard_tensor(const at::Tensor& t, const ShardingPtr& sharding) {
  return translate_errors([&] {
    TensorType type = tensor_type_of(t);
    sharding->validate(type.rank());
    if (!is_tpu(t)) return wrap_for_user(make_tensor(upload_sharded(to_host(t), sharding)));
    const MeshPtr& mesh = sharding->mesh;
    int first = mesh->devices.front();
    ValuePtr value = value_of(t, t.device().index());
    bool on_mesh = value->mesh && value->mesh->same_devices(*mesh);
    bool pending_here = !value->mesh && value->pending() && value->device == first;
    if (on_mesh || pending_here) {
      static const OpKind op = lowered_kind(kShardOp);
      ValuePtr sharded = Engine::get().record(op, shard_args(*sharding), {value}, {type}, first, nullptr, mesh)[0];
      return wrap_for_user(make_tensor(std::move(sharded)));
    }
    return wrap_for_user(make_tensor(upload_sharded(to_host(t), sharding)));
  });
}

ShardingPtr sharding_of(const at::Tensor& t) {
  return translate_errors([&]() -> ShardingPtr {
    if (!is_tpu(t)) return nullptr;
    ValuePtr value = value_of(t, t.device().index());
    if (!value->mesh) return nullptr;
    return Engine::get().materialize(value)->sharding;
  });
}

MeshPtr mesh_of(const at::Tensor& t) {
  if (!is_tpu(t)) return nullptr;
  return value_of(t, t.device().index())->mesh;
}

std::vector<at::Tensor> shards_of(const at::Tensor& t) {
  return translate_errors([&] {
    TORCH_CHECK(is_tpu(t), "torchtpu.spmd.shards expects a tpu tensor, got a tensor on ", t.device());
    BufferPtr buffer = Engine::get().materialize(value_of(t, t.device().index()));
    std::vector<at::Tensor> out;
    if (!buffer->sharding) {
      out.push_back(t);
      return out;
    }
    for (BufferPtr& shard : runtime().shards_of(*buffer))
      out.push_back(wrap_for_user(make_tensor(Engine::get().from_buffer(std::move(shard)))));
    return out;
  });
}

ValuePtr copy_onto_layout(const at::Tensor& dst, const at::Tensor& src) {
  MeshPtr mesh = mesh_of(dst);
  if (!mesh) return nullptr;
  MeshPtr from = mesh_of(src);
  if (from && from->same_devices(*mesh)) return nullptr;
  ShardingPtr sharding = sharding_of(dst);
  at::Tensor host = to_host(src).to(dst.scalar_type()).expand(dst.sizes()).contiguous();
  return upload_sharded(host, sharding);
}

void check_one_mesh(const std::string& op, const c10::FunctionSchema& schema, const std::vector<Arg>& args,
                    const std::vector<ValuePtr>& operands) {
  const Mesh* first = nullptr;
  std::string first_name;
  size_t count = std::min(args.size(), schema.arguments().size());
  for (size_t i = 0; i < count; ++i) {
    if (args[i].kind != Arg::Kind::Tensor && args[i].kind != Arg::Kind::TensorList) continue;
    for (int index : args[i].operands) {
      if (index < 0) continue;
      const MeshPtr& mesh = operands[static_cast<size_t>(index)]->mesh;
      if (!mesh) continue;
      const std::string& name = schema.arguments()[i].name();
      if (!first) {
        first = mesh.get();
        first_name = name;
      } else if (!first->same_devices(*mesh)) {
        TORCH_CHECK_VALUE(false, "torchtpu: ", op, " got argument '", name, "' sharded over ", mesh->describe(),
                          " and argument '", first_name, "' over ", first->describe(),
                          "; the tensors of one op must share a mesh: reshard one onto the other's mesh "
                          "(torchtpu.spmd.shard(t, mesh, spec)) or bring it to one device (t.cpu())");
      }
    }
  }
}

}  // namespace torchtpu
