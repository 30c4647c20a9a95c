// Serialized executables on disk, keyed by module text and compiler version.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace torchtpu {

// Key for an entry: hex digest of the module text and the runtime's version string.
std::string disk_cache_key(const std::string& module_text, const std::string& runtime_version);

// Returns the entry's bytes, or nothing if absent. A damaged entry is removed and reported
// through `warn`; the caller then compiles as if it were absent.
std::optional<std::string> disk_cache_load(const std::string& dir, const std::string& key,
                                           const std::function<void(const std::string&)>& warn);
// Writes atomically (temporary file + rename), so concurrent writers leave a valid entry.
void disk_cache_store(const std::string& dir, const std::string& key, const std::string& bytes,
                      const std::function<void(const std::string&)>& warn);
// Removes an entry (used when a valid-looking entry fails to load).
void disk_cache_remove(const std::string& dir, const std::string& key);

}  // namespace torchtpu
