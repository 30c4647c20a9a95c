// Structured loops on tpu tensors (torchtpu.scan_layers): trace a body once, then record one
// torchtpu::scan op that runs it over stacked inputs.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <vector>

#include "ir/graph.h"

namespace torchtpu {

// Starts tracing a body: ops recorded until scan_body_end form it, in every mode.
void scan_body_begin();
// A placeholder input of the body (in creation order: carry, then x rows, then consts).
at::Tensor scan_body_input(const std::vector<int64_t>& shape, c10::ScalarType dtype, int device);
// The traced body, from its placeholders to `outputs` (new carry, then y rows).
std::shared_ptr<const Subgraph> scan_body_end(const std::vector<at::Tensor>& outputs);
void scan_body_abort();

// Runs `body` `length` times (backwards when reverse): carry flows from step to step, step i
// reads row i of each xs tensor, consts are the same every step. Returns the final carry and
// the ys stacked along dim 0. Raises ValueError when the types do not fit the body.
std::vector<at::Tensor> scan(const std::shared_ptr<const Subgraph>& body, const std::vector<at::Tensor>& carry,
                             const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& consts,
                             int64_t length, bool reverse);

}  // namespace torchtpu
