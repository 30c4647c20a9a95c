// Pinned host memory and non-blocking copies into it, with CUDA's semantics: a
// `dst.copy_(src, non_blocking=True)` from a tpu tensor into pinned memory launches what
// computes src and returns at once; the bytes land when the host next synchronizes with that
// point (an event recorded after the copy, the stream, the device). Into pageable memory, or
// when shapes or dtypes differ, the copy stays synchronous, as CUDA's does.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Allocator.h>

#include <cstdint>
#include <limits>

#include "engine/engine.h"

namespace torchtpu {

// torch's pinned-memory allocator for tpu (`pin_memory=True`, `Tensor.pin_memory()`): host
// memory the runtimes copy from and to directly, tracked so that is_pinned() knows it.
c10::Allocator* pinned_allocator();
bool is_pinned_ptr(const void* ptr);

// dst.copy_(src, non_blocking=True) with src on tpu and dst pinned host memory of src's shape
// and dtype: issued (the source's graph launched, nothing waited for) and true; false when
// the copy is not of that kind (the caller copies synchronously).
bool copy_to_pinned_later(const at::Tensor& src, const at::Tensor& dst);
// How many non-blocking copies were issued so far: an event records this count.
uint64_t host_copies_issued();
// Completes (waiting for their sources) the copies issued up to the `through`-th, oldest
// first; the first failure (a failed runtime check of the source's graph) raises here.
void finish_host_copies(uint64_t through = std::numeric_limits<uint64_t>::max());
// Runs all pending work and, with `wait`, waits for the device and lands every issued copy:
// what torch.tpu.synchronize(), a stream's or device's synchronize and torchtpu.sync(True) do.
void synchronize(bool wait, FlushReason reason = FlushReason::Sync);

}  // namespace torchtpu
