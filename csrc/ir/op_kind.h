// Op kinds: every op name ("aten::add.Tensor", "torchtpu::convert") is interned once, so a
// graph node names its op with a small id instead of knowing how the op is lowered.
#pragma once

#include <cstdint>
#include <string>

namespace torchtpu {

class OpKind {
 public:
  OpKind() = default;  // no op (a default-constructed node)
  // The kind of `name`, interned on first use (thread-safe).
  static OpKind intern(const std::string& name);

  // Dense ids from 1 in interning order (0 for no op): tables index by them.
  uint32_t id() const { return entry_ ? entry_->id : 0; }
  const std::string& name() const;
  // Hash of the name, the same in every process (graph hashes start from it).
  uint64_t hash() const { return entry_ ? entry_->hash : 0; }

  explicit operator bool() const { return entry_ != nullptr; }
  bool operator==(OpKind other) const { return entry_ == other.entry_; }
  bool operator!=(OpKind other) const { return entry_ != other.entry_; }

 private:
  struct Entry {
    std::string name;
    uint64_t hash;
    uint32_t id;
  };
  explicit OpKind(const Entry* entry) : entry_(entry) {}
  const Entry* entry_ = nullptr;
};

}  // namespace torchtpu
