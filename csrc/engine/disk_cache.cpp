// On-disk executable cache: one file per executable with a checked header.
#include "engine/disk_cache.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "base/types.h"

namespace torchtpu {
namespace {

constexpr char kMagic[8] = {'T', 'T', 'P', 'U', 'X', 'L', 'A', '1'};

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t checksum(const std::string& bytes) { return hash_bytes(0xC0FFEE, bytes.data(), bytes.size()); }

std::string entry_path(const std::string& dir, const std::string& key) { return dir + "/" + key + ".xla"; }

}  // namespace

std::string disk_cache_key(const std::string& module_text, const std::string& runtime_version) {
  uint64_t a = hash_string(hash_string(1, runtime_version), module_text);
  uint64_t b = hash_string(hash_string(0x9E3779B97F4A7C15ull, module_text), runtime_version);
  return hex64(a) + hex64(b);
}

std::optional<std::string> disk_cache_load(const std::string& dir, const std::string& key,
                                           const std::function<void(const std::string&)>& warn) {
  std::string path = entry_path(dir, key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string data = buffer.str();
  const size_t header = sizeof(kMagic) + 2 * sizeof(uint64_t);
  bool valid = data.size() >= header && std::memcmp(data.data(), kMagic, sizeof(kMagic)) == 0;
  std::string payload;
  if (valid) {
    uint64_t length, sum;
    std::memcpy(&length, data.data() + sizeof(kMagic), sizeof(length));
    std::memcpy(&sum, data.data() + sizeof(kMagic) + sizeof(length), sizeof(sum));
    valid = length == data.size() - header;
    if (valid) {
      payload = data.substr(header);
      valid = checksum(payload) == sum;
    }
  }
  if (!valid) {
    if (warn) warn("torchtpu: ignoring damaged compilation cache entry " + path + "; it will be recompiled");
    std::error_code ec;
    std::filesystem::remove(path, ec);
    return std::nullopt;
  }
  return payload;
}

void disk_cache_store(const std::string& dir, const std::string& key, const std::string& bytes,
                      const std::function<void(const std::string&)>& warn) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  static thread_local std::mt19937_64 rng(std::random_device{}());
  std::string tmp = entry_path(dir, key) + ".tmp." + std::to_string(getpid()) + "." + hex64(rng());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      if (warn) warn("torchtpu: cannot write the compilation cache in " + dir + " (set TORCHTPU_CACHE_DIR to a writable folder, or to an empty string to disable it)");
      return;
    }
    uint64_t length = bytes.size(), sum = checksum(bytes);
    out.write(kMagic, sizeof(kMagic));
    out.write(reinterpret_cast<const char*>(&length), sizeof(length));
    out.write(reinterpret_cast<const char*>(&sum), sizeof(sum));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, entry_path(dir, key), ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

void disk_cache_remove(const std::string& dir, const std::string& key) {
  std::error_code ec;
  std::filesystem::remove(entry_path(dir, key), ec);
}

}  // namespace torchtpu
