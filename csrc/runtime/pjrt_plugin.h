// A PJRT C-API plugin loaded into the process: its entry points, called with errors turned
// into C++ exceptions that carry the plugin's message (no torch or Python headers).
#pragma once

#include <map>
#include <stdexcept>
#include <string>

#include "runtime/pjrt_c_api.h"

namespace torchtpu {

// The plugin cannot be used (missing, not a PJRT plugin, too old, no client): the message
// names the plugin's path and the command that fixes it.
struct PjrtPluginError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The oldest PJRT C API this runtime drives: its argument layouts are those of pjrt_c_api.h
// (API 0.81, the oldest plugin measured), so an older plugin could read past them.
constexpr int kOldestPjrtMinor = 81;
// The oldest API whose FFI extension takes handler registrations in the layout declared in
// pjrt_c_api.h (measured on 0.106 and 0.115; the 0.81 plugin accepts the call but never
// finds the handler).
constexpr int kOldestFfiRegistrationMinor = 106;

class PjrtPlugin {
 public:
  // dlopens `path` (kept loaded for the process's life: its threads and buffers may outlive
  // anything), checks the API version and initializes the plugin. `fix` is the command a
  // user runs to repair a broken install ("pip install ..."), quoted in every error.
  static const PjrtPlugin& load(const std::string& path, const std::string& fix);

  const std::string& path() const { return path_; }
  const std::string& fix() const { return fix_; }
  int api_major() const { return api_->pjrt_api_version.major_version; }
  int api_minor() const { return api_->pjrt_api_version.minor_version; }
  std::string api_version() const { return std::to_string(api_major()) + "." + std::to_string(api_minor()); }
  // The plugin's attributes (xla_version, stablehlo_current_version, ...), as text.
  const std::map<std::string, std::string>& attributes() const { return attributes_; }

  // Whether the plugin's function table reaches `slot`.
  bool has(PjrtSlot slot) const;
  // Calls `slot` with `args` (struct_size must be set); throws what `raise` throws on error.
  template <class Args>
  void call(PjrtSlot slot, Args& args, const std::string& what) const {
    if (PJRT_Error* error = try_call(slot, &args)) raise(error, what);
  }
  // Calls `slot`; returns the plugin's error (the caller destroys it), nullptr on success.
  template <class Args>
  PJRT_Error* try_call(PjrtSlot slot, Args* args) const {
    return reinterpret_cast<PJRT_Error* (*)(Args*)>(function(slot))(args);
  }

  std::string message(PJRT_Error* error) const;
  PJRT_Error_Code code(PJRT_Error* error) const;
  void destroy(PJRT_Error* error) const;
  // Destroys `error` and throws: DeviceOutOfMemory when the plugin ran out of memory, else
  // std::runtime_error "torchtpu: <what> failed: <the plugin's message>".
  [[noreturn]] void raise(PJRT_Error* error, const std::string& what) const;

  // Registers an XLA FFI handler (typed FFI, api_version 1) for custom calls named `target`
  // on `platform_name` ("Host" for CPU). Throws when the plugin cannot take registrations.
  void register_ffi_handler(const std::string& target, void* handler, const std::string& platform_name) const;
  bool takes_ffi_handlers() const;

 private:
  PjrtPlugin(std::string path, std::string fix, const PJRT_Api* api);
  void* function(PjrtSlot slot) const;
  [[noreturn]] void refuse(const std::string& problem) const;

  std::string path_;
  std::string fix_;
  const PJRT_Api* api_;
  std::map<std::string, std::string> attributes_;
};

// Sets struct_size of a PJRT argument struct to the size the API declares (up to its last
// field), leaving every other field zero.
template <class Args>
Args pjrt_args(size_t declared_size) {
  Args args{};
  args.struct_size = declared_size;
  return args;
}
#define PJRT_ARGS(type, last_field) torchtpu::pjrt_args<type>(TORCHTPU_PJRT_SIZE(type, last_field))

}  // namespace torchtpu
