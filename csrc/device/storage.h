// Freeing and re-allocating a tpu tensor's storage (untyped_storage().resize_), as FSDP2
// does to drop unsharded parameters between uses while keeping their aliases.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>

namespace torchtpu {

// untyped_storage().resize_(nbytes) of a tpu tensor's storage: 0 frees the storage's device
// data (reading it raises until it is re-allocated); its full size re-allocates a freed
// storage (contents zero until written). Other sizes raise.
void resize_storage(c10::StorageImpl* storage, int64_t nbytes);
// A tensor over a freed storage stops holding the data it last read (a computed view keeps
// its own copy on the device otherwise, until it is next used).
void release_freed_alias(const at::Tensor& t);

}  // namespace torchtpu
