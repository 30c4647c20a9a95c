// On-disk executable cache: a private folder, one file per executable with a checked header
// that records the entry's full key.
#include "engine/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "base/types.h"

namespace torchtpu {
namespace {

// Version 2 adds the key; version 3 starts an executable's payload with its memory_needed
// (compile.cpp, compile_graph). Entries of another version are read as absent and replaced.
constexpr char kMagic[8] = {'T', 'T', 'P', 'U', 'X', 'L', 'A', '3'};
constexpr size_t kHeader = sizeof(kMagic) + 3 * sizeof(uint64_t);  // magic, key and payload lengths, checksum

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Two differently seeded passes: 128 bits, so unrelated texts never share a digest.
std::string digest(const std::string& text) {
  uint64_t a = hash_string(0x51ED, text);
  uint64_t b = hash_bytes(hash_mix(0x9E3779B97F4A7C15ull, text.size()), text.data(), text.size());
  return hex64(a) + hex64(b);
}

uint64_t checksum(const std::string& key, const std::string& payload) {
  return hash_string(hash_string(0xC0FFEE, key), payload);
}

std::string entry_path(const std::string& dir, const CacheKey& key) { return dir + "/" + key.file_name; }

std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, std::string* out, size_t size) {
  out->resize(size);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, out->data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// A file or folder only this user can change: owned by the user, not writable by group or others.
std::string why_not_private(const struct stat& st) {
  if (st.st_uid != ::geteuid())
    return "it is owned by another user (uid " + std::to_string(st.st_uid) + ")";
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return "other users can write to it (mode " + octal_mode(st.st_mode) + ")";
  return "";
}

}  // namespace

CacheKey make_cache_key(const std::string& module_text, const std::string& compiler, const std::string& platform,
                        const std::string& options) {
  CacheKey key;
  key.text = "module " + digest(module_text) + " " + std::to_string(module_text.size()) + "\ncompiler " + compiler +
             "\nplatform " + platform + "\noptions " + options + "\n";
  key.file_name = digest(key.text) + ".xla";
  return key;
}

CacheKey make_blob_key(const std::string& text, const std::string& kind) {
  return CacheKey{text, digest(text) + "." + kind};
}

void DiskCache::set_dir(const std::string& dir) {
  dir_ = dir;
  state_ = State::Unchecked;
  write_failure_warned_ = false;
}

void DiskCache::warn_write_failure(const std::string& what, int error, const Warn& warn) {
  if (write_failure_warned_) return;
  write_failure_warned_ = true;
  if (warn)
    warn("torchtpu: cannot write the compilation cache in " + dir_ + " (" + what + ": " + std::strerror(error) +
         "); graphs will be compiled again by the next process. Free space, or set TORCHTPU_CACHE_DIR to a "
         "writable folder (an empty string disables the cache).");
}

bool DiskCache::usable(const Warn& warn) {
  if (dir_.empty()) return false;
  if (state_ != State::Unchecked) return state_ == State::Usable;
  state_ = State::Refused;
  struct stat st;
  if (::stat(dir_.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      warn_write_failure("cannot inspect the folder", errno, warn);
      return false;
    }
    // Missing: parents as usual, the folder itself private (mkdir's mode is masked by the
    // umask, so chmod sets it exactly).
    std::error_code ec;
    std::filesystem::path path(dir_);
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
    if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) {
      warn_write_failure("cannot create the folder", errno, warn);
      return false;
    }
    if (::stat(dir_.c_str(), &st) != 0) {
      warn_write_failure("cannot inspect the folder", errno, warn);
      return false;
    }
    if (st.st_uid == ::geteuid() && S_ISDIR(st.st_mode) && ::chmod(dir_.c_str(), 0700) == 0) st.st_mode = S_IFDIR | 0700;
  }
  std::string reason = S_ISDIR(st.st_mode) ? why_not_private(st) : "it is not a folder";
  if (!reason.empty()) {
    if (warn)
      warn("torchtpu: not using the compilation cache in " + dir_ + ": " + reason +
           ". A cached executable is native code this process would run, so the cache folder must be private "
           "(chmod 700 it, or set TORCHTPU_CACHE_DIR to a folder of your own). Running without the disk cache.");
    return false;
  }
  state_ = State::Usable;
  return true;
}

std::optional<std::string> DiskCache::load(const CacheKey& key, const Warn& warn) {
  if (!usable(warn)) return std::nullopt;
  std::string path = entry_path(dir_, key);
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st;
  std::string data;
  bool read = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && why_not_private(st).empty() &&
              read_all(fd, &data, static_cast<size_t>(st.st_size));
  ::close(fd);
  if (!read) return std::nullopt;  // not a private regular file: never run it; the next store replaces it
  if (data.size() >= sizeof(kMagic) && std::memcmp(data.data(), kMagic, sizeof(kMagic) - 1) == 0 &&
      data[sizeof(kMagic) - 1] != kMagic[sizeof(kMagic) - 1])
    return std::nullopt;  // another format version: recompiled and replaced
  bool valid = data.size() >= kHeader && std::memcmp(data.data(), kMagic, sizeof(kMagic)) == 0;
  uint64_t key_length = 0, payload_length = 0, sum = 0;
  if (valid) {
    std::memcpy(&key_length, data.data() + sizeof(kMagic), sizeof(uint64_t));
    std::memcpy(&payload_length, data.data() + sizeof(kMagic) + sizeof(uint64_t), sizeof(uint64_t));
    std::memcpy(&sum, data.data() + sizeof(kMagic) + 2 * sizeof(uint64_t), sizeof(uint64_t));
    valid = key_length <= data.size() - kHeader && payload_length == data.size() - kHeader - key_length;
  }
  std::string stored_key, payload;
  if (valid) {
    stored_key = data.substr(kHeader, key_length);
    payload = data.substr(kHeader + key_length);
    valid = checksum(stored_key, payload) == sum;
  }
  if (!valid) {
    if (warn) warn("torchtpu: ignoring damaged compilation cache entry " + path + "; it will be recompiled");
    ::unlink(path.c_str());
    return std::nullopt;
  }
  if (stored_key != key.text) {
    if (warn)
      warn("torchtpu: compilation cache entry " + path +
           " holds another graph's executable (its recorded key differs); it will be recompiled");
    return std::nullopt;  // the store after compiling replaces it
  }
  return payload;
}

void DiskCache::store(const CacheKey& key, const std::string& payload, const Warn& warn) {
  if (!usable(warn)) return;
  static thread_local std::mt19937_64 rng(std::random_device{}());
  std::string path = entry_path(dir_, key);
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + hex64(rng());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    warn_write_failure("cannot create an entry", errno, warn);
    return;
  }
  uint64_t lengths[3] = {key.text.size(), payload.size(), checksum(key.text, payload)};
  bool ok = ::fchmod(fd, 0600) == 0 && write_all(fd, kMagic, sizeof(kMagic)) &&
            write_all(fd, reinterpret_cast<const char*>(lengths), sizeof(lengths)) &&
            write_all(fd, key.text.data(), key.text.size()) && write_all(fd, payload.data(), payload.size());
  int error = errno;
  if (::close(fd) != 0 && ok) {  // network file systems report a full disk here
    ok = false;
    error = errno;
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    error = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    warn_write_failure("cannot write an entry", error, warn);
  }
}

void DiskCache::remove(const CacheKey& key) {
  if (dir_.empty() || state_ != State::Usable) return;
  ::unlink(entry_path(dir_, key).c_str());
}

}  // namespace torchtpu
