// Loading a PJRT C-API plugin (dlopen, version check, initialize) and calling it.
#include "runtime/pjrt_plugin.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>

#include "runtime/runtime.h"

namespace torchtpu {

PjrtPlugin::PjrtPlugin(std::string path, std::string fix, const PJRT_Api* api)
    : path_(std::move(path)), fix_(std::move(fix)), api_(api) {}

void PjrtPlugin::refuse(const std::string& problem) const {
  throw PjrtPluginError("torchtpu: the PJRT plugin " + path_ + " " + problem + ". Fix: " + fix_);
}

const PjrtPlugin& PjrtPlugin::load(const std::string& path, const std::string& fix) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<PjrtPlugin>>& loaded = *new std::map<std::string, std::unique_ptr<PjrtPlugin>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto known = loaded.find(path);
  if (known != loaded.end()) return *known->second;

  PjrtPlugin probe(path, fix, nullptr);
  struct stat info;
  if (stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) probe.refuse("does not exist");
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    const char* why = dlerror();
    probe.refuse(std::string("could not be loaded (") + (why ? why : "dlopen failed") + ")");
  }
  auto get_api = reinterpret_cast<GetPjrtApiFunction>(dlsym(library, "GetPjrtApi"));
  if (!get_api) probe.refuse("is not a PJRT plugin: it exports no GetPjrtApi");
  const PJRT_Api* api = get_api();
  if (!api) probe.refuse("returned no API table from GetPjrtApi");
  auto plugin = std::unique_ptr<PjrtPlugin>(new PjrtPlugin(path, fix, api));
  const PJRT_Api_Version& version = api->pjrt_api_version;
  if (version.major_version != 0 || version.minor_version < kOldestPjrtMinor)
    plugin->refuse("implements PJRT C API " + plugin->api_version() + ", and torchtpu needs 0." +
                   std::to_string(kOldestPjrtMinor) + " or newer within major version 0");
  if (!plugin->has(PjrtSlot::Executable_GetCompiledMemoryStats))
    plugin->refuse("has a function table shorter than its API version " + plugin->api_version() + " promises");

  auto initialize = PJRT_ARGS(PJRT_Plugin_Initialize_Args, extension_start);
  if (PJRT_Error* error = plugin->try_call(PjrtSlot::Plugin_Initialize, &initialize)) {
    std::string message = plugin->message(error);
    plugin->destroy(error);
    plugin->refuse("failed to initialize: " + message);
  }
  auto attributes = PJRT_ARGS(PJRT_Plugin_Attributes_Args, num_attributes);
  if (PJRT_Error* error = plugin->try_call(PjrtSlot::Plugin_Attributes, &attributes)) {
    plugin->destroy(error);  // attributes are informative only
  } else {
    for (size_t i = 0; i < attributes.num_attributes; ++i) {
      const PJRT_NamedValue& a = attributes.attributes[i];
      std::string value;
      switch (a.type) {
        case PJRT_NamedValue_kString: value.assign(a.string_value, a.value_size); break;
        case PJRT_NamedValue_kInt64: value = std::to_string(a.int64_value); break;
        case PJRT_NamedValue_kInt64List:
          for (size_t k = 0; k < a.value_size; ++k) value += (k ? "." : "") + std::to_string(a.int64_array_value[k]);
          break;
        case PJRT_NamedValue_kFloat: value = std::to_string(a.float_value); break;
        case PJRT_NamedValue_kBool: value = a.bool_value ? "true" : "false"; break;
      }
      plugin->attributes_[std::string(a.name, a.name_size)] = value;
    }
  }
  return *(loaded[path] = std::move(plugin));
}

bool PjrtPlugin::has(PjrtSlot slot) const {
  size_t end = offsetof(PJRT_Api, functions) + (static_cast<size_t>(slot) + 1) * sizeof(void*);
  return api_->struct_size >= end && api_->functions[static_cast<int>(slot)] != nullptr;
}

void* PjrtPlugin::function(PjrtSlot slot) const {
  if (!has(slot))
    throw std::runtime_error("torchtpu: the PJRT plugin " + path_ + " (API " + api_version() +
                             ") lacks entry point #" + std::to_string(static_cast<int>(slot)) + ". Fix: " + fix_);
  return api_->functions[static_cast<int>(slot)];
}

std::string PjrtPlugin::message(PJRT_Error* error) const {
  auto args = PJRT_ARGS(PJRT_Error_Message_Args, message_size);
  args.error = error;
  reinterpret_cast<void (*)(PJRT_Error_Message_Args*)>(function(PjrtSlot::Error_Message))(&args);
  return std::string(args.message, args.message_size);
}

PJRT_Error_Code PjrtPlugin::code(PJRT_Error* error) const {
  auto args = PJRT_ARGS(PJRT_Error_GetCode_Args, code);
  args.error = error;
  if (PJRT_Error* failed = try_call(PjrtSlot::Error_GetCode, &args)) {
    destroy(failed);
    return PJRT_Error_Code_INTERNAL;
  }
  return args.code;
}

void PjrtPlugin::destroy(PJRT_Error* error) const {
  auto args = PJRT_ARGS(PJRT_Error_Destroy_Args, error);
  args.error = error;
  reinterpret_cast<void (*)(PJRT_Error_Destroy_Args*)>(function(PjrtSlot::Error_Destroy))(&args);
}

void PjrtPlugin::raise(PJRT_Error* error, const std::string& what) const {
  std::string text = message(error);
  PJRT_Error_Code error_code = code(error);
  destroy(error);
  // The wording is the jaxlib runtime's (jaxlib_runtime.cpp), so that both runtimes raise alike.
  if (error_code == PJRT_Error_Code_RESOURCE_EXHAUSTED || text.find("ut of memory") != std::string::npos)
    throw DeviceOutOfMemory("torchtpu: the device ran out of memory while " + what +
                            ". Free tensors you no longer need (del them), lower the batch size, "
                            "or call torchtpu.sync() more often. XLA said: " + text);
  throw std::runtime_error("torchtpu: " + what + " failed: " + text);
}

bool PjrtPlugin::takes_ffi_handlers() const {
  if (api_minor() < kOldestFfiRegistrationMinor) return false;
  for (const PJRT_Extension_Base* e = api_->extension_start; e; e = e->next)
    if (e->type == PJRT_Extension_Type_FFI)
      return e->struct_size >= sizeof(PJRT_FFI_Extension) &&
             reinterpret_cast<const PJRT_FFI_Extension*>(e)->register_handler != nullptr;
  return false;
}

void PjrtPlugin::register_ffi_handler(const std::string& target, void* handler, const std::string& platform_name) const {
  if (!takes_ffi_handlers())
    throw std::runtime_error("torchtpu: the PJRT plugin " + path_ + " (API " + api_version() +
                             ") cannot register custom-call handlers (needs API 0." +
                             std::to_string(kOldestFfiRegistrationMinor) + " or newer with the FFI extension), so " +
                             target + " is not available. Fix: " + fix_);
  for (const PJRT_Extension_Base* e = api_->extension_start; e; e = e->next) {
    if (e->type != PJRT_Extension_Type_FFI) continue;
    auto args = PJRT_ARGS(PJRT_FFI_Register_Handler_Args, traits);
    args.target_name = target.data();
    args.target_name_size = target.size();
    args.handler = handler;
    args.platform_name = platform_name.data();
    args.platform_name_size = platform_name.size();
    if (PJRT_Error* error = reinterpret_cast<const PJRT_FFI_Extension*>(e)->register_handler(&args))
      raise(error, "registering the custom-call handler " + target);
    return;
  }
}

}  // namespace torchtpu
