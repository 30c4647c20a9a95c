// Single-process SPMD in the device layer: tpu tensors whose value is laid out over a mesh of
// local devices (torchtpu.spmd), moved to and from the host and checked at each op.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/function_schema.h>

#include "base/sharding.h"
#include "device/tensor.h"

namespace torchtpu {

// A tensor with t's contents laid out as `sharding` says. A value already on the mesh, or
// still pending on its first device, is resharded by a torchtpu::shard node (XLA moves the
// data, inside the step's executable in fused mode); a computed value of one device, or one
// on other devices, goes through the host and is uploaded shard by shard.
at::Tensor shard_tensor(const at::Tensor& t, const ShardingPtr& sharding);
// A host tensor uploaded shard by shard (each device receives only its shard).
ValuePtr upload_sharded(const at::Tensor& cpu, const ShardingPtr& sharding);
// The global contents of a sharded buffer, gathered on the host from its shards.
at::Tensor download_sharded(const DeviceBuffer& buffer);
// The sharding of t's value (computing it: XLA chooses the layout of results), or null for a
// tensor of one device.
ShardingPtr sharding_of(const at::Tensor& t);
// The mesh t's value lives on, without computing anything (null: one device).
MeshPtr mesh_of(const at::Tensor& t);
// Each device's shard of t as a tpu tensor on that device, in mesh order.
std::vector<at::Tensor> shards_of(const at::Tensor& t);
// dst.copy_(src) where dst lives on a mesh and src does not (a CPU tensor, a tensor of one
// device: load_state_dict into a sharded model): src converted to dst's dtype and shape, laid
// out as dst is. Null when dst lives on one device or src on dst's mesh (an ordinary copy).
ValuePtr copy_onto_layout(const at::Tensor& dst, const at::Tensor& src);
// Raises ValueError when an op's tensor arguments live on two meshes, naming both arguments
// and meshes. `args` in schema order; `operands` are the values their Tensor args index.
void check_one_mesh(const std::string& op, const c10::FunctionSchema& schema, const std::vector<Arg>& args,
                    const std::vector<ValuePtr>& operands);

}  // namespace torchtpu
