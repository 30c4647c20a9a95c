// torchtpu's kernels at dispatch keys every device goes through (Functionalize, Meta,
// ADInplaceOrView): changes to PyTorch's own behaviour, so each is a named entry of one table,
// guarded when it registers, listed with the Python patches (torchtpu/_patches.py,
// `python -m torchtpu patches`, docs/ARCHITECTURE.md) and removable.
#pragma once

#include <torch/library.h>

#include <string>
#include <vector>

namespace torchtpu {

// How an entry's kernels relate to PyTorch's at their key.
enum class OverrideKind : uint8_t {
  Replaces,  // PyTorch has a kernel of its own there, which this one replaces
  Adds,      // PyTorch has none there (its fallback, or nothing, would run)
  // PyTorch has one in some of the torch releases torchtpu supports and none in others
  // (the GRU cell's Meta kernel arrived in torch 2.15): torchtpu's serves in every release.
  AddsOrReplaces,
};

// How an entry relates to PyTorch's kernels, as `python -m torchtpu patches` says it.
const char* override_relation(OverrideKind kind);

// One entry: KernelOverride("meta add_ sub_", "aten", c10::DispatchKey::Meta, OverrideKind::Replaces)
//                .impl("add_.Tensor", fn).impl("add_.Scalar", fn);
// `rule` describes the ops of an entry that chooses them by a rule ("every aten::_foreach_*_
// op without a Meta kernel"); without one the entry is described by the ops it lists.
class KernelOverride {
 public:
  KernelOverride(const char* name, const char* ns, c10::DispatchKey key, OverrideKind kind,
                 const char* rule = nullptr);
  // Registers fn as the kernel of ns::op at the key once the guard passes: the op exists, and
  // PyTorch has (Replaces) or has not (Adds) a kernel of its own there. Otherwise every entry
  // registered so far is removed and the guard's error, naming this entry, is thrown.
  KernelOverride& impl(const std::string& op, torch::CppFunction fn);

 private:
  size_t index_;
};

struct KernelOverrideInfo {
  std::string name;
  std::string key;    // "Meta", "Functionalize", ...
  std::string rule;   // "" when the entry lists its ops
  OverrideKind kind = OverrideKind::Adds;
  std::vector<std::string> ops;  // "aten::add_.Tensor", ...
  bool active = false;           // false once restored
};

std::vector<KernelOverrideInfo> kernel_overrides();
// Removes an entry's kernels: PyTorch's own (or its fallback) serve those ops again. False
// for an unknown name.
bool restore_kernel_override(const std::string& name);
// The guard alone (what impl checks), for tests: throws as impl would, registers nothing.
void check_kernel_override(const std::string& name, const std::string& qualified_op, c10::DispatchKey key,
                           OverrideKind kind);

}  // namespace torchtpu
