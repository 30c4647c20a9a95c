// Descriptors of collectives: what the ranks of a group must agree on before running one
// (lowering/collective.cpp checks them on the device; the tpu backend reports mismatches).
#pragma once

#include <string>
#include <vector>

#include "base/types.h"

namespace torchtpu {

enum class CollectiveKind : int64_t { AllReduce = 1, AllGather, ReduceScatter, AllToAll, Permute, Broadcast };

constexpr int64_t kCollectiveDescriptorLength = 8;

// [kind, reduce op, dtype, rank, numel, dim 0, dim 1, dim 2]
std::vector<int64_t> collective_descriptor(CollectiveKind kind, int64_t reduce_op, const TensorType& operand);
// "all_reduce of a float32 tensor of shape [4] (4 elements), op sum"
std::string describe_collective(const int64_t* descriptor);

}  // namespace torchtpu
