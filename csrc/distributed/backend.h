// The "tpu" backend of torch.distributed: a c10d::Backend whose collectives are graph nodes
// (lowering/collective.cpp) over the process group's devices.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <vector>

namespace torchtpu {

// global_ranks: the group's members in group-rank order (the default group: 0..size-1).
c10::intrusive_ptr<c10d::Backend> make_tpu_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                   int size, std::vector<int64_t> global_ranks,
                                                   std::chrono::milliseconds timeout);

// c10d's in-place collectives declare no mutation in their schemas, so functionalization
// would hand the backend copies of the user's tensors' contents; on tpu tensors they
// reach the backend as the user's (functional) tensors, which it updates in place.
void register_c10d_functionalization();

// Whether collectives of groups of 2+ ranks first check that every rank issued the same one
// (default on; TORCHTPU_COLLECTIVE_CHECKS=0 turns it off, the same on every rank).
void set_collective_checks(bool enabled);

// Takes the tpu Works issued so far out of c10d's registry of functional collectives' Works
// (they are complete when issued; see backend.cpp).
void release_collective_works();

}  // namespace torchtpu
