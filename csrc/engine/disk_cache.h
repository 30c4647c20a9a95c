// Serialized executables on disk: a private folder of entries, each recording its full key.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace torchtpu {

// Everything that decides what an executable computes and where it runs. An entry stores
// its key's text and is used only when that text matches: a file copied over another
// graph's entry, or a hash collision of file names, recompiles instead of running the
// wrong executable.
struct CacheKey {
  std::string text;       // "module <digest> <length>\ncompiler ...\nplatform ...\noptions ...\n"
  std::string file_name;  // 32 hex digits (a hash of text) + ".xla"
};
CacheKey make_cache_key(const std::string& module_text, const std::string& compiler, const std::string& platform,
                        const std::string& options);
// The key of a non-executable entry (torch.compile's AOTAutograd results, torchtpu/_compile_cache.py):
// its full text is the caller's; the file name is a hash of it with `kind` as extension.
CacheKey make_blob_key(const std::string& text, const std::string& kind);

// A cached executable is native code the process runs, so the folder must be private: it is
// created 0700 and its entries 0600 whatever the umask, and a folder that another user owns
// or can write is refused (one warning, then the process runs uncached). A failed write
// (disk full, read-only file system) warns once and leaves the cache as it was.
class DiskCache {
 public:
  using Warn = std::function<void(const std::string&)>;

  void set_dir(const std::string& dir);  // "" disables; checked again on next use
  const std::string& dir() const { return dir_; }
  // False once the folder was refused or when disabled: callers skip serializing.
  bool active() const { return !dir_.empty() && state_ != State::Refused; }

  // The entry's payload, or nothing (absent, damaged, for another key, not private). A
  // damaged entry is removed and reported through `warn`.
  std::optional<std::string> load(const CacheKey& key, const Warn& warn);
  // Writes atomically (private temporary file, then rename), so concurrent writers leave a
  // valid entry.
  void store(const CacheKey& key, const std::string& payload, const Warn& warn);
  // Removes an entry (a valid-looking entry that failed to load).
  void remove(const CacheKey& key);

 private:
  // Whether the folder may be used: created private if missing, else checked (once).
  bool usable(const Warn& warn);
  void warn_write_failure(const std::string& what, int error, const Warn& warn);

  enum class State { Unchecked, Usable, Refused };
  std::string dir_;
  State state_ = State::Unchecked;
  bool write_failure_warned_ = false;
};

}  // namespace torchtpu
