// JAX interop for tpu tensors: zero-copy exchange with jax.Arrays (torchtpu.to_jax /
// from_jax) and calls of imported StableHLO modules (torchtpu.jax_op, jax-backed aten ops).
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <vector>

struct _object;  // PyObject

namespace torchtpu {

// The jax.Array sharing t's device buffer (pending work for t runs first); a new reference.
// The buffer is never donated afterwards, so the array stays valid.
_object* tensor_to_jax(const at::Tensor& t);
// A tpu tensor sharing the buffer of a single-device jax.Array on torchtpu's platform.
at::Tensor tensor_from_jax(_object* array);

// Records a call of the StableHLO module registered under `key` (lowering/stablehlo_call.h)
// on `inputs`; returns its results (pending in fused mode, like any op's).
std::vector<at::Tensor> call_stablehlo(const std::string& key, const std::vector<at::Tensor>& inputs);

}  // namespace torchtpu
