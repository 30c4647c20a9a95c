// Compiled-graph capture for torch.compile: the first run of an FX graph records its aten
// ops into the pending graph as eager code does; the executable that computes the graph's
// outputs is then remembered with the wiring of FX inputs to executable parameters, so
// later calls run it directly on the input buffers without tracing any op.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <optional>
#include <vector>

namespace torchtpu {

struct Capture;
using CapturePtr = std::shared_ptr<Capture>;

// Runs the inputs' pending work and notes the engine's counters. inputs: the FX graph's
// inputs, an undefined tensor for each non-tensor input.
void capture_begin(const std::vector<at::Tensor>& inputs);
// Ends a capture without result (the FX graph raised).
void capture_abort();
// Runs the pending graph that computes `outputs` (undefined for non-tensor outputs) as one
// executable. Returns the capture, or null when the FX graph was not one pending graph
// (an op ran on CPU, a flush happened inside it, a CPU tensor input); the outputs are
// computed either way.
// updates: (FX input, FX output) pairs where the output is the input's new contents (an
// in-place update the caller writes back): the input's buffer is donated to it when the
// input tensor alone holds it, and the input tensor then holds the output.
// vouched: FX inputs whose buffers the caller vouches nothing else reads, on this call and on
// every replay it makes of the capture (the fused bucket runner, for the flush's parameters
// only the flush holds): each is donated to the first result of its type not taken.
CapturePtr capture_end(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                       const std::vector<std::pair<int, int>>& updates = {}, const std::vector<int>& vouched = {});
// The outputs for new inputs (undefined where the FX output is not a tensor), or nullopt
// when the inputs' types or aliasing differ from the captured ones.
std::optional<std::vector<at::Tensor>> run_captured(Capture& capture, const std::vector<at::Tensor>& inputs);
// The capturing call's outputs in the form replays return them (fresh tensors for computed
// outputs, the input tensors for outputs that are inputs), so the graphs that consume them
// (a backward reading a forward's saved tensors) see the same kind of inputs every call.
std::vector<at::Tensor> take_first_outputs(Capture& capture, const std::vector<at::Tensor>& inputs);

struct CaptureStats {
  int64_t captures = 0;       // graphs captured
  int64_t uncapturable = 0;   // capture_end calls that returned null
  int64_t replays = 0;        // run_captured calls that ran the executable
  int64_t misses = 0;         // run_captured calls that returned nullopt
};
CaptureStats capture_stats();
// Human-readable summary of a capture: parameter sources, outputs.
std::string describe_capture(const Capture& capture);

}  // namespace torchtpu
