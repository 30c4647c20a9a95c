// torchtpu.export's device side: the graph a run of an exported program records, lowered
// to a self-contained StableHLO module (torchtpu/export.py drives it).
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <vector>

namespace torchtpu {

// Runs all pending work and notes the engine's counters: what follows is recorded alone.
void export_begin();

struct ExportedGraph {
  std::string text;                    // @main(weights..., constants..., inputs...) -> outputs
  std::vector<at::Tensor> constants;   // device values the graph reads besides its arguments
};
// Lowers the graph recorded since export_begin that computes `outputs` (tpu tensors) from
// `weights` and `inputs`. Raises ValueError when the recorded ops did not stay one pending
// graph (an op ran on CPU, or the graph ran: a host read, the size limit).
ExportedGraph export_end(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& outputs);

}  // namespace torchtpu
