// Snapshots of tensors' values: an optimizer step that raises puts back the values its
// parameters and state had before it (torchtpu/_patches.py wraps Optimizer.step), so no
// step is ever half applied.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <vector>

#include "ir/graph.h"

namespace torchtpu {

struct ValueSnapshot {
  std::vector<at::Tensor> tensors;
  // In fused mode the old values are held weakly: holding them would keep a step's graph
  // from donating the parameters' buffers to their updates. Until that graph has run, its
  // pending nodes hold them; once it has, nothing is left to undo.
  std::vector<std::weak_ptr<Value>> weak;
  std::vector<ValuePtr> strong;  // strict and debug modes: each op has already run
  // Sparse tensors (a SparseAdam or momentum state): the inner sparse tensor their wrapper held,
  // kept whole (its indices and values are immutable tpu values).
  std::vector<at::Tensor> sparse_tensors;
  std::vector<at::Tensor> sparse_inners;
};

ValueSnapshot take_snapshot(const std::vector<at::Tensor>& tensors);
// Gives each tensor back its value from the snapshot where that value still exists; returns
// how many tensors could not get theirs back (a graph that ran inside the step consumed it).
size_t restore_snapshot(const ValueSnapshot& snapshot);

}  // namespace torchtpu
