// The table of torchtpu's kernels at dispatch keys every device goes through (see
// kernel_overrides.h): each entry owns the torch::Library its kernels live in, so removing
// the entry deregisters them.
#include "device/kernel_overrides.h"

#include <torch/headeronly/version.h>

#include <memory>
#include <mutex>
#include <stdexcept>

namespace torchtpu {
namespace {

struct Entry {
  KernelOverrideInfo info;
  std::string ns;
  c10::DispatchKey key;
  std::unique_ptr<torch::Library> library;
};

std::mutex g_mutex;

std::vector<std::unique_ptr<Entry>>& entries() {
  static std::vector<std::unique_ptr<Entry>> table;
  return table;
}

std::runtime_error guard_error(const std::string& name, const std::string& op, const std::string& what) {
  return std::runtime_error("torchtpu kernel override '" + name + "': " + op + " " + what + " in torch " +
                            TORCH_VERSION + "; install the torch release torchtpu pins (requirements.txt), or " +
                            "update this override (csrc/device/kernel_overrides.h lists where they are made)");
}

// "aten::add_.Tensor" -> ("aten::add_", "Tensor")
c10::OperatorName operator_name(const std::string& qualified_op) {
  auto dot = qualified_op.find('.', qualified_op.find("::"));
  if (dot == std::string::npos) return {qualified_op, ""};
  return {qualified_op.substr(0, dot), qualified_op.substr(dot + 1)};
}

}  // namespace

const char* override_relation(OverrideKind kind) {
  switch (kind) {
    case OverrideKind::Replaces:
      return "replaces torch's";
    case OverrideKind::Adds:
      return "added";
    case OverrideKind::AddsOrReplaces:
      return "added, or replaces torch's where a torch release has one";
  }
  return "";
}

void check_kernel_override(const std::string& name, const std::string& qualified_op, c10::DispatchKey key,
                           OverrideKind kind) {
  auto handle = c10::Dispatcher::singleton().findSchema(operator_name(qualified_op));
  if (!handle) throw guard_error(name, qualified_op, "does not exist");
  bool has_kernel = handle->hasKernelForDispatchKey(key);
  std::string key_name = c10::toString(key);
  if (kind == OverrideKind::Replaces && !has_kernel)
    throw guard_error(name, qualified_op, "has no " + key_name + " kernel of PyTorch's to replace");
  if (kind == OverrideKind::Adds && has_kernel)
    throw guard_error(name, qualified_op, "has a " + key_name + " kernel of PyTorch's already (torchtpu adds one)");
}

KernelOverride::KernelOverride(const char* name, const char* ns, c10::DispatchKey key, OverrideKind kind,
                               const char* rule) {
  auto entry = std::make_unique<Entry>();
  entry->info = KernelOverrideInfo{name, c10::toString(key), rule ? rule : "", kind, {}, true};
  entry->ns = ns;
  entry->key = key;
  entry->library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, key, __FILE__, __LINE__);
  std::lock_guard<std::mutex> lock(g_mutex);
  index_ = entries().size();
  entries().push_back(std::move(entry));
}

KernelOverride& KernelOverride::impl(const std::string& op, torch::CppFunction fn) {
  Entry* entry;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    entry = entries()[index_].get();
  }
  std::string qualified = entry->ns + "::" + op;
  if (!entry->library) throw std::logic_error("torchtpu kernel override '" + entry->info.name + "' was removed");
  try {
    check_kernel_override(entry->info.name, qualified, entry->key, entry->info.kind);
    try {
      entry->library->impl(op.c_str(), std::move(fn));
    } catch (const std::exception& e) {  // a kernel whose signature is not the op's any more
      throw guard_error(entry->info.name, qualified, std::string("cannot take torchtpu's kernel: ") + e.what());
    }
  } catch (...) {
    // torch as it was: a failed import of torchtpu leaves none of its kernels behind.
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto& e : entries()) {
      e->library.reset();
      e->info.active = false;
    }
    throw;
  }
  entry->info.ops.push_back(qualified);
  return *this;
}

std::vector<KernelOverrideInfo> kernel_overrides() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<KernelOverrideInfo> out;
  for (const auto& e : entries()) out.push_back(e->info);
  return out;
}

bool restore_kernel_override(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& e : entries())
    if (e->info.name == name) {
      e->library.reset();  // deregisters every kernel it holds
      e->info.active = false;
      return true;
    }
  return false;
}

}  // namespace torchtpu
