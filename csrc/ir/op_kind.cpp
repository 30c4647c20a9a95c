// The table of interned op names.
#include "ir/op_kind.h"

#include <memory>
#include <mutex>
#include <unordered_map>

#include "base/types.h"

namespace torchtpu {

OpKind OpKind::intern(const std::string& name) {
  // Entries are never freed, so OpKinds stay valid in static destructors too.
  static std::mutex* mutex = new std::mutex();
  static auto* entries = new std::unordered_map<std::string, std::unique_ptr<Entry>>();
  std::lock_guard<std::mutex> lock(*mutex);
  auto& entry = (*entries)[name];
  if (!entry) {
    // The same seed the node hash always started from, so graph hashes (and the names of
    // TORCHTPU_DUMP_DIR files) do not change with interning order.
    entry.reset(new Entry{name, hash_string(0x51ED270B27E0C1A5ull, name), static_cast<uint32_t>(entries->size())});
  }
  return OpKind(entry.get());
}

const std::string& OpKind::name() const {
  static const std::string none = "<no op>";
  return entry_ ? entry_->name : none;
}

}  // namespace torchtpu
