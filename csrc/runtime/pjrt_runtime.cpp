// Runtime on a PJRT C-API plugin: compile StableHLO text, run, move buffers, all through the
// plugin's C entry points. Nothing here takes the GIL or calls Python, so a launch costs
// the plugin's own work (about 2 us on CPU) and any thread can launch.
#include "runtime/pjrt_runtime.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "runtime/pjrt_plugin.h"

namespace torchtpu {
namespace {

// The DLPack ABI (dlpack.h, stable since its first release), declared here because the
// runtime includes no torch header; runtime.h hands these around as ::DLManagedTensor.
namespace dl {
struct Device {
  int32_t device_type;  // 1: CPU
  int32_t device_id;
};
struct DataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: row-major
  uint64_t byte_offset;
};
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};
ManagedTensor* of(DLManagedTensor* t) { return reinterpret_cast<ManagedTensor*>(t); }
DLManagedTensor* as_public(ManagedTensor* t) { return reinterpret_cast<DLManagedTensor*>(t); }

DataType dtype_of(DType dtype) {
  DataType t{0, static_cast<uint8_t>(dtype_size(dtype) * 8), 1};
  switch (dtype) {
    case DType::Bool: t.code = 6; break;
    case DType::UInt8: t.code = 1; break;
    case DType::BFloat16: t.code = 4; break;
    case DType::Float16: case DType::Float32: case DType::Float64: t.code = 2; break;
    case DType::ComplexFloat: case DType::ComplexDouble: t.code = 5; break;
    default: t.code = 0; break;
  }
  return t;
}

// A DLPack tensor over memory something else keeps alive (`keep`, released by the deleter).
struct Holder {
  ManagedTensor managed{};
  std::vector<int64_t> shape;
  void* owned_memory = nullptr;  // freed by the deleter (a host copy of a device buffer)
  BufferPtr keep;                // held until the deleter runs (a shared buffer)
};
ManagedTensor* make(void* data, const TensorType& type, void* owned_memory, BufferPtr keep) {
  auto* holder = new Holder{{}, type.shape, owned_memory, std::move(keep)};
  ManagedTensor& m = holder->managed;
  m.manager_ctx = holder;
  m.deleter = [](ManagedTensor* self) {
    auto* h = static_cast<Holder*>(self->manager_ctx);
    std::free(h->owned_memory);
    delete h;
  };
  m.dl_tensor.data = data;
  m.dl_tensor.device = Device{1, 0};
  m.dl_tensor.ndim = static_cast<int32_t>(type.shape.size());
  m.dl_tensor.dtype = dtype_of(type.dtype);
  m.dl_tensor.shape = holder->shape.data();
  m.dl_tensor.strides = nullptr;
  m.dl_tensor.byte_offset = 0;
  return &m;
}
}  // namespace dl

PJRT_Buffer_Type element_type(DType dtype) {
  switch (dtype) {
    case DType::Bool: return PJRT_Buffer_Type_PRED;
    case DType::UInt8: return PJRT_Buffer_Type_U8;
    case DType::Int8: return PJRT_Buffer_Type_S8;
    case DType::Int16: return PJRT_Buffer_Type_S16;
    case DType::Int32: return PJRT_Buffer_Type_S32;
    case DType::Int64: return PJRT_Buffer_Type_S64;
    case DType::Float16: return PJRT_Buffer_Type_F16;
    case DType::Float32: return PJRT_Buffer_Type_F32;
    case DType::Float64: return PJRT_Buffer_Type_F64;
    case DType::BFloat16: return PJRT_Buffer_Type_BF16;
    case DType::ComplexFloat: return PJRT_Buffer_Type_C64;
    case DType::ComplexDouble: return PJRT_Buffer_Type_C128;
  }
  throw std::logic_error("torchtpu: no PJRT element type for " + std::string(dtype_name(dtype)));
}

// Set at exit, before the plugin's own static objects go: buffers dropped later (by static
// destructors) are leaked instead of handed to a plugin that is being torn down.
std::atomic<bool> g_exiting{false};

bool can_release() { return !g_exiting.load() && !runtime_forked(); }

void destroy_event(const PjrtPlugin& plugin, PJRT_Event* event) {
  auto args = PJRT_ARGS(PJRT_Event_Destroy_Args, event);
  args.event = event;
  if (PJRT_Error* error = plugin.try_call(PjrtSlot::Event_Destroy, &args)) plugin.destroy(error);
}

// Waits for `event`, destroys it, and raises the error it completed with.
void await_event(const PjrtPlugin& plugin, PJRT_Event* event, const std::string& what) {
  if (!event) return;
  auto args = PJRT_ARGS(PJRT_Event_Await_Args, event);
  args.event = event;
  PJRT_Error* error = plugin.try_call(PjrtSlot::Event_Await, &args);
  destroy_event(plugin, event);
  if (error) plugin.raise(error, what);
}

// Runs `done` once `event` fires (at once if it has), then lets the event go.
void when_ready(const PjrtPlugin& plugin, PJRT_Event* event, std::function<void()> done) {
  auto* pending = new std::function<void()>(std::move(done));
  auto args = PJRT_ARGS(PJRT_Event_OnReady_Args, user_arg);
  args.event = event;
  args.user_arg = pending;
  args.callback = [](PJRT_Error* error, void* user_arg) {
    // The error is the transfer's; the plugin reports it again on the buffer's own events.
    (void)error;
    auto* run = static_cast<std::function<void()>*>(user_arg);
    (*run)();
    delete run;
  };
  if (PJRT_Error* error = plugin.try_call(PjrtSlot::Event_OnReady, &args)) {
    plugin.destroy(error);
    await_event(plugin, event, "waiting for a transfer");  // cannot be told: wait instead
    (*pending)();
    delete pending;
    return;
  }
  destroy_event(plugin, event);  // the callback stays registered with the transfer
}

struct PjrtBuffer final : DeviceBuffer {
  const PjrtPlugin& plugin;
  PJRT_Buffer* buffer;
  PjrtBuffer(const PjrtPlugin& p, PJRT_Buffer* b, TensorType t, int d) : DeviceBuffer(std::move(t), d), plugin(p), buffer(b) {}
  ~PjrtBuffer() override {
    if (!can_release()) return;  // leaked: see g_exiting and runtime_forked()
    auto args = PJRT_ARGS(PJRT_Buffer_Destroy_Args, buffer);
    args.buffer = buffer;
    if (PJRT_Error* error = plugin.try_call(PjrtSlot::Buffer_Destroy, &args)) plugin.destroy(error);
  }
};

struct PjrtExecutable final : Executable {
  const PjrtPlugin& plugin;
  PJRT_LoadedExecutable* loaded;
  size_t num_outputs = 0;
  PjrtExecutable(const PjrtPlugin& p, PJRT_LoadedExecutable* e) : plugin(p), loaded(e) {}
  ~PjrtExecutable() override {
    if (!can_release()) return;
    auto args = PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args, executable);
    args.executable = loaded;
    if (PJRT_Error* error = plugin.try_call(PjrtSlot::LoadedExecutable_Destroy, &args)) plugin.destroy(error);
  }
};

// The key-value store a multi-process plugin exchanges ids through, as C callbacks.
struct KeyValueStore {
  std::function<std::string(const std::string&, int)> get;
  std::function<void(const std::string&, const std::string&)> put;

  static PJRT_Error* get_callback(PJRT_KeyValueGetCallback_Args* args) {
    auto* self = static_cast<KeyValueStore*>(args->user_arg);
    try {
      std::string value = self->get(std::string(args->key, args->key_size), args->timeout_in_ms);
      args->value = new char[value.size() + 1];
      std::memcpy(args->value, value.data(), value.size());
      args->value_size = value.size();
      args->value_deleter_callback = [](char* value) { delete[] value; };
      return nullptr;
    } catch (const std::exception& e) {
      return (*args->callback_error)(PJRT_Error_Code_NOT_FOUND, e.what(), std::strlen(e.what()));
    }
  }
  static PJRT_Error* put_callback(PJRT_KeyValuePutCallback_Args* args) {
    auto* self = static_cast<KeyValueStore*>(args->user_arg);
    try {
      self->put(std::string(args->key, args->key_size), std::string(args->value, args->value_size));
      return nullptr;
    } catch (const std::exception& e) {
      return (*args->callback_error)(PJRT_Error_Code_INTERNAL, e.what(), std::strlen(e.what()));
    }
  }
};

// What a partitioned (mesh) compile or a sharded buffer meets under this runtime: it runs one
// device per executable (as torchtpu.spmd's Mesh says before anything reaches here).
constexpr const char* kNoSpmd =
    "torchtpu.spmd needs the jaxlib runtime (TORCHTPU_RUNTIME=jaxlib); the pjrt runtime runs one device per "
    "executable, without XLA's SPMD partitioner";

class PjrtRuntime final : public Runtime {
 public:
  PjrtRuntime(const PjrtPlugin& plugin, PJRT_Client* client, std::string platform, const ProcessLayout& layout,
              std::unique_ptr<KeyValueStore> store)
      : plugin_(plugin), client_(client), platform_(std::move(platform)), store_(std::move(store)) {
    auto name = PJRT_ARGS(PJRT_Client_PlatformVersion_Args, platform_version_size);
    name.client = client_;
    plugin_.call(PjrtSlot::Client_PlatformVersion, name, "reading the platform version");
    platform_version_.assign(name.platform_version, name.platform_version_size);
    struct stat info{};
    stat(plugin_.path().c_str(), &info);
    std::string file = plugin_.path().substr(plugin_.path().rfind('/') + 1);
    // The disk cache keys executables by this: another plugin build must not load them.
    version_ = "pjrt " + plugin_.api_version() + " " + platform_ + " " + platform_version_ + " " + file + ":" +
               std::to_string(static_cast<long long>(info.st_size));
    if (platform_ == "cpu") version_ += kYnnVersionNote;
    auto devices = PJRT_ARGS(PJRT_Client_Devices_Args, num_devices);
    devices.client = client_;
    plugin_.call(PjrtSlot::Client_AddressableDevices, devices, "listing the devices");
    std::vector<PJRT_Device*> local(devices.devices, devices.devices + devices.num_devices);
    if (layout.local_world_size == 0) {
      devices_ = local;
    } else {
      // One process per device: this process drives tpu:local_rank only (pjrt_client_options
      // made its client see that device alone where the plugin can).
      size_t mine = local.size() == 1 ? 0 : static_cast<size_t>(layout.local_rank);
      if (mine >= local.size())
        throw std::runtime_error("torchtpu: LOCAL_RANK=" + std::to_string(layout.local_rank) + " but the PJRT plugin sees " +
                                 std::to_string(local.size()) + " local devices");
      devices_.assign(layout.local_world_size, nullptr);
      devices_[layout.local_rank] = local[mine];
    }
  }

  const PjrtPlugin& plugin() const { return plugin_; }
  const std::string& platform_version() const { return platform_version_; }

  const std::string& platform() const override { return platform_; }
  int device_count() const override { return static_cast<int>(devices_.size()); }
  const std::string& version() const override { return version_; }
  bool has_float64() const override { return platform_ != "tpu"; }

  ExecutablePtr compile(const std::string& module_text, const CompileOptions& options) override {
    if (options.mesh) throw std::runtime_error(kNoSpmd);
    std::vector<int64_t> ids = options.replica_devices;
    if (ids.empty()) ids.push_back(device_id(options.device));
    std::string proto = pjrt_compile_options(ids, options.excess_precision,
                                             ynn_fusions_off(platform_, module_text, options.excess_precision));
    auto program = PJRT_ARGS(PJRT_Program, format_size);
    program.code = const_cast<char*>(module_text.data());
    program.code_size = module_text.size();
    program.format = "mlir";
    program.format_size = 4;
    auto args = PJRT_ARGS(PJRT_Client_Compile_Args, executable);
    args.client = client_;
    args.program = &program;
    args.compile_options = proto.data();
    args.compile_options_size = proto.size();
    plugin_.call(PjrtSlot::Client_Compile, args, "compiling a graph");
    return loaded(args.executable);
  }

  std::vector<BufferPtr> execute(Executable& exe, const std::vector<BufferPtr>& args,
                                 const std::vector<TensorType>& result_types, int device) override {
    auto& executable = static_cast<PjrtExecutable&>(exe);
    if (executable.num_outputs != result_types.size())
      throw std::logic_error("torchtpu: executable has " + std::to_string(executable.num_outputs) +
                             " results, the graph expects " + std::to_string(result_types.size()));
    // Per-thread scratch: a launch allocates only its result handles.
    thread_local std::vector<PJRT_Buffer*> arguments, outputs;
    arguments.resize(args.size());
    for (size_t i = 0; i < args.size(); ++i) arguments[i] = static_cast<PjrtBuffer&>(*args[i]).buffer;
    outputs.assign(executable.num_outputs, nullptr);
    PJRT_Buffer* const* argument_lists[1] = {arguments.data()};
    PJRT_Buffer** output_lists[1] = {outputs.data()};
    auto options = PJRT_ARGS(PJRT_ExecuteOptions, incarnation_ids);
    auto call = PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args, execute_device);
    call.executable = executable.loaded;
    call.options = &options;
    call.argument_lists = argument_lists;
    call.num_devices = 1;
    call.num_args = args.size();
    call.output_lists = output_lists;
    plugin_.call(PjrtSlot::LoadedExecutable_Execute, call, "running a graph");
    std::vector<BufferPtr> results;
    results.reserve(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i)
      results.push_back(std::make_shared<PjrtBuffer>(plugin_, outputs[i], result_types[i], device));
    return results;
  }

  BufferPtr upload(DLManagedTensor* host_tensor, const TensorType& type, int device) override {
    dl::ManagedTensor* host = dl::of(host_tensor);
    auto release = [host] {
      if (host->deleter) host->deleter(host);
    };
    const dl::Tensor& t = host->dl_tensor;
    std::vector<int64_t> byte_strides;
    if (t.strides) {
      // The device layer hands over contiguous tensors; strides are passed through anyway.
      int64_t item = static_cast<int64_t>(dtype_size(type.dtype));
      for (int d = 0; d < t.ndim; ++d) byte_strides.push_back(t.strides[d] * item);
    }
    auto args = PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args, buffer);
    args.client = client_;
    args.data = static_cast<const char*>(t.data) + t.byte_offset;
    args.type = element_type(type.dtype);
    args.dims = type.shape.data();
    args.num_dims = type.shape.size();
    args.byte_strides = byte_strides.empty() ? nullptr : byte_strides.data();
    args.num_byte_strides = byte_strides.size();
    // On CPU the buffer may use the host memory itself (the device layer's private copy);
    // elsewhere the plugin copies it over, and the memory goes when the copy is done.
    args.host_buffer_semantics = platform_ == "cpu" ? PJRT_HostBufferSemantics_kImmutableZeroCopy
                                                    : PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
    args.device = local_device(device);
    if (PJRT_Error* error = plugin_.try_call(PjrtSlot::Client_BufferFromHostBuffer, &args)) {
      release();
      plugin_.raise(error, "copying a tensor to the device");
    }
    // A zero-copy buffer signals done_with_host_buffer when it is destroyed, never earlier
    // (waiting for it here would never return): the host memory goes then.
    if (args.done_with_host_buffer) when_ready(plugin_, args.done_with_host_buffer, release);
    else release();
    return std::make_shared<PjrtBuffer>(plugin_, args.buffer, type, device);
  }

  BufferPtr upload_bytes(const void* data, const TensorType& type, int device) override {
    auto args = PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args, buffer);
    args.client = client_;
    args.data = data;
    args.type = element_type(type.dtype);
    args.dims = type.shape.data();
    args.num_dims = type.shape.size();
    args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
    args.device = local_device(device);
    plugin_.call(PjrtSlot::Client_BufferFromHostBuffer, args, "copying a tensor to the device");
    if (args.done_with_host_buffer) destroy_event(plugin_, args.done_with_host_buffer);  // done: copied in the call
    return std::make_shared<PjrtBuffer>(plugin_, args.buffer, type, device);
  }

  DLManagedTensor* download(const DeviceBuffer& buffer) override {
    if (platform_ == "cpu") return dl::as_public(dl::make(host_pointer(buffer), buffer.type, nullptr, nullptr));
    size_t bytes = static_cast<size_t>(buffer.type.nbytes());
    void* memory = std::aligned_alloc(64, ((bytes + 63) / 64) * 64 + 64);
    try {
      copy_to_host(buffer, memory, bytes);
    } catch (...) {
      std::free(memory);
      throw;
    }
    return dl::as_public(dl::make(memory, buffer.type, memory, nullptr));
  }

  void wait(const DeviceBuffer& buffer) override {
    await_event(plugin_, ready_event(buffer), "running a graph");
  }

  bool is_ready(const DeviceBuffer& buffer) override {
    PJRT_Event* event = ready_event(buffer);
    auto args = PJRT_ARGS(PJRT_Event_IsReady_Args, is_ready);
    args.event = event;
    PJRT_Error* error = plugin_.try_call(PjrtSlot::Event_IsReady, &args);
    destroy_event(plugin_, event);
    if (error) plugin_.raise(error, "running a graph");
    return args.is_ready;
  }

  void download_bytes(const DeviceBuffer& buffer, void* out) override {
    size_t bytes = static_cast<size_t>(buffer.type.nbytes());
    if (platform_ == "cpu") {
      if (bytes) std::memcpy(out, host_pointer(buffer), bytes);
    } else {
      copy_to_host(buffer, out, bytes);
    }
  }

  int64_t memory_limit(int device) override {
    std::map<std::string, int64_t> stats = memory_stats(device);
    auto limit = stats.find("bytes_limit");
    if (limit != stats.end()) return limit->second;
    return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGE_SIZE));
  }

  int64_t memory_needed(Executable& exe) override {
    PJRT_Executable* unloaded = executable_of(static_cast<PjrtExecutable&>(exe));
    auto args = PJRT_ARGS(PJRT_Executable_GetCompiledMemoryStats_Args, peak_memory_in_bytes);
    args.executable = unloaded;
    PJRT_Error* error = plugin_.try_call(PjrtSlot::Executable_GetCompiledMemoryStats, &args);
    destroy_executable(unloaded);
    if (error) {
      plugin_.destroy(error);
      return 0;  // the platform does not report it
    }
    int64_t needed = args.output_size_in_bytes + args.temp_size_in_bytes - args.alias_size_in_bytes;
    return needed > 0 ? needed : 0;
  }

  bool is_deleted(const DeviceBuffer& buffer) override {
    auto args = PJRT_ARGS(PJRT_Buffer_IsDeleted_Args, is_deleted);
    args.buffer = static_cast<const PjrtBuffer&>(buffer).buffer;
    if (PJRT_Error* error = plugin_.try_call(PjrtSlot::Buffer_IsDeleted, &args)) {
      plugin_.destroy(error);
      return true;
    }
    return args.is_deleted;
  }

  std::string serialize(Executable& exe) override {
    PJRT_Executable* unloaded = executable_of(static_cast<PjrtExecutable&>(exe));
    auto args = PJRT_ARGS(PJRT_Executable_Serialize_Args, serialized_executable_deleter);
    args.executable = unloaded;
    PJRT_Error* error = plugin_.try_call(PjrtSlot::Executable_Serialize, &args);
    destroy_executable(unloaded);
    if (error) plugin_.raise(error, "serializing an executable");
    std::string bytes(args.serialized_bytes, args.serialized_bytes_size);
    if (args.serialized_executable_deleter) args.serialized_executable_deleter(args.serialized_executable);
    return bytes;
  }

  // Single-process SPMD is the jaxlib runtime's (torchtpu/spmd.py refuses a Mesh first).
  BufferPtr assemble_sharded(const TensorType&, ShardingPtr, const std::vector<BufferPtr>&) override {
    throw std::runtime_error(kNoSpmd);
  }
  std::vector<BufferPtr> shards_of(const DeviceBuffer&) override { throw std::runtime_error(kNoSpmd); }

  ExecutablePtr deserialize(const std::string& bytes, const CompileOptions& options) override {
    // The serialized executable carries its compile options (the device assignment included).
    auto args = PJRT_ARGS(PJRT_Executable_DeserializeAndLoad_Args, overridden_serialized_compile_options_size);
    args.client = client_;
    args.serialized_executable = bytes.data();
    args.serialized_executable_size = bytes.size();
    plugin_.call(PjrtSlot::Executable_DeserializeAndLoad, args, "loading a cached executable");
    return loaded(args.loaded_executable);
  }

  std::string device_kind(int device) override {
    auto args = PJRT_ARGS(PJRT_DeviceDescription_Kind_Args, device_kind_size);
    args.device_description = description(local_device(device));
    plugin_.call(PjrtSlot::DeviceDescription_Kind, args, "reading the device kind");
    return std::string(args.device_kind, args.device_kind_size);
  }

  std::map<std::string, int64_t> memory_stats(int device) override {
    std::map<std::string, int64_t> out;
    if (!memory_stats_supported_.load()) return out;
    auto args = PJRT_ARGS(PJRT_Device_MemoryStats_Args, peak_pool_bytes_is_set);
    args.device = local_device(device);
    if (PJRT_Error* error = plugin_.try_call(PjrtSlot::Device_MemoryStats, &args)) {
      plugin_.destroy(error);  // the CPU plugins keep no allocator statistics: measured
      memory_stats_supported_.store(false);
      return out;
    }
    out["bytes_in_use"] = args.bytes_in_use;
    auto put = [&](const char* name, int64_t value, bool is_set) {
      if (is_set) out[name] = value;
    };
    put("peak_bytes_in_use", args.peak_bytes_in_use, args.peak_bytes_in_use_is_set);
    put("num_allocs", args.num_allocs, args.num_allocs_is_set);
    put("largest_alloc_size", args.largest_alloc_size, args.largest_alloc_size_is_set);
    put("bytes_limit", args.bytes_limit, args.bytes_limit_is_set);
    put("bytes_reserved", args.bytes_reserved, args.bytes_reserved_is_set);
    put("peak_bytes_reserved", args.peak_bytes_reserved, args.peak_bytes_reserved_is_set);
    put("bytes_reservable_limit", args.bytes_reservable_limit, args.bytes_reservable_limit_is_set);
    put("largest_free_block_bytes", args.largest_free_block_bytes, args.largest_free_block_bytes_is_set);
    put("pool_bytes", args.pool_bytes, args.pool_bytes_is_set);
    put("peak_pool_bytes", args.peak_pool_bytes, args.peak_pool_bytes_is_set);
    return out;
  }

  std::vector<int64_t> read_int64(const DeviceBuffer& buffer) override {
    if (buffer.type.dtype != DType::Int64) throw std::logic_error("torchtpu: read_int64 of a non-int64 buffer");
    std::vector<int64_t> contents(static_cast<size_t>(buffer.type.numel()));
    download_bytes(buffer, contents.data());
    return contents;
  }

  int process_index() const override {
    auto args = PJRT_ARGS(PJRT_Client_ProcessIndex_Args, process_index);
    args.client = client_;
    plugin_.call(PjrtSlot::Client_ProcessIndex, args, "reading the process index");
    return args.process_index;
  }

  int64_t device_id(int device) const override {
    auto args = PJRT_ARGS(PJRT_DeviceDescription_Id_Args, id);
    args.device_description = description(local_device(device));
    plugin_.call(PjrtSlot::DeviceDescription_Id, args, "reading a device id");
    return args.id;
  }

  std::vector<int64_t> process_device_ids() const override {
    auto devices = PJRT_ARGS(PJRT_Client_Devices_Args, num_devices);
    devices.client = client_;
    plugin_.call(PjrtSlot::Client_Devices, devices, "listing the devices");
    std::vector<std::pair<int, int64_t>> by_process;
    for (size_t i = 0; i < devices.num_devices; ++i) {
      PJRT_DeviceDescription* d = description(devices.devices[i]);
      auto process = PJRT_ARGS(PJRT_DeviceDescription_ProcessIndex_Args, process_index);
      process.device_description = d;
      plugin_.call(PjrtSlot::DeviceDescription_ProcessIndex, process, "listing the devices");
      auto id = PJRT_ARGS(PJRT_DeviceDescription_Id_Args, id);
      id.device_description = d;
      plugin_.call(PjrtSlot::DeviceDescription_Id, id, "listing the devices");
      by_process.emplace_back(process.process_index, id.id);
    }
    return one_device_per_process(std::move(by_process), "the PJRT plugin");
  }

  DLManagedTensor* share(const BufferPtr& buffer) override {
    if (platform_ != "cpu")
      throw std::invalid_argument("torchtpu.to_jax under the PJRT runtime shares buffers on the cpu platform only (this "
                                  "is " + platform_ + "); set TORCHTPU_RUNTIME=jaxlib to share device buffers with JAX");
    return dl::as_public(dl::make(host_pointer(*buffer), buffer->type, nullptr, buffer));
  }

  BufferPtr view_of(void* data, const TensorType& type, int device, std::function<void()> release) override {
    auto* pending = new std::function<void()>(std::move(release));
    auto args = PJRT_ARGS(PJRT_Client_CreateViewOfDeviceBuffer_Args, memory);
    args.client = client_;
    args.device_buffer_ptr = data;
    args.dims = type.shape.data();
    args.num_dims = type.shape.size();
    args.element_type = element_type(type.dtype);
    args.device = local_device(device);
    // Never null: the plugins call it unconditionally (a null one aborts the process: measured).
    args.on_delete_callback = [](void*, void* user_arg) {
      auto* run = static_cast<std::function<void()>*>(user_arg);
      (*run)();
      delete run;
    };
    args.on_delete_callback_arg = pending;
    if (PJRT_Error* error = plugin_.try_call(PjrtSlot::Client_CreateViewOfDeviceBuffer, &args)) {
      (*pending)();
      delete pending;
      plugin_.raise(error, "viewing a foreign buffer");
    }
    return std::make_shared<PjrtBuffer>(plugin_, args.buffer, type, device);
  }

 private:
  PJRT_Device* local_device(int device) const {
    if (device < 0 || device >= static_cast<int>(devices_.size()) || !devices_[device])
      throw std::logic_error("torchtpu: device tpu:" + std::to_string(device) + " is not a device of this process");
    return devices_[device];
  }

  PJRT_DeviceDescription* description(PJRT_Device* device) const {
    auto args = PJRT_ARGS(PJRT_Device_GetDescription_Args, device_description);
    args.device = device;
    plugin_.call(PjrtSlot::Device_GetDescription, args, "describing a device");
    return args.device_description;
  }

  ExecutablePtr loaded(PJRT_LoadedExecutable* executable) {
    auto result = std::make_shared<PjrtExecutable>(plugin_, executable);
    PJRT_Executable* unloaded = executable_of(*result);
    auto outputs = PJRT_ARGS(PJRT_Executable_NumOutputs_Args, num_outputs);
    outputs.executable = unloaded;
    PJRT_Error* error = plugin_.try_call(PjrtSlot::Executable_NumOutputs, &outputs);
    destroy_executable(unloaded);
    if (error) plugin_.raise(error, "reading an executable's results");
    result->num_outputs = outputs.num_outputs;
    return result;
  }

  // The executable behind a loaded one (the caller destroys it).
  PJRT_Executable* executable_of(PjrtExecutable& exe) {
    auto args = PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args, executable);
    args.loaded_executable = exe.loaded;
    plugin_.call(PjrtSlot::LoadedExecutable_GetExecutable, args, "reading an executable");
    return args.executable;
  }

  void destroy_executable(PJRT_Executable* executable) {
    auto args = PJRT_ARGS(PJRT_Executable_Destroy_Args, executable);
    args.executable = executable;
    if (PJRT_Error* error = plugin_.try_call(PjrtSlot::Executable_Destroy, &args)) plugin_.destroy(error);
  }

  PJRT_Event* ready_event(const DeviceBuffer& buffer) {
    auto args = PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args, event);
    args.buffer = static_cast<const PjrtBuffer&>(buffer).buffer;
    plugin_.call(PjrtSlot::Buffer_ReadyEvent, args, "running a graph");
    return args.event;
  }

  // CPU: the buffer's own memory, once its contents are computed.
  void* host_pointer(const DeviceBuffer& buffer) {
    wait(buffer);
    auto args = PJRT_ARGS(PJRT_Buffer_UnsafePointer_Args, buffer_pointer);
    args.buffer = static_cast<const PjrtBuffer&>(buffer).buffer;
    plugin_.call(PjrtSlot::Buffer_UnsafePointer, args, "copying a tensor to the host");
    return reinterpret_cast<void*>(args.buffer_pointer);
  }

  void copy_to_host(const DeviceBuffer& buffer, void* out, size_t bytes) {
    auto args = PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args, event);
    args.src = static_cast<const PjrtBuffer&>(buffer).buffer;
    args.dst = out;
    args.dst_size = bytes;
    plugin_.call(PjrtSlot::Buffer_ToHostBuffer, args, "copying a tensor to the host");
    await_event(plugin_, args.event, "copying a tensor to the host");
  }

  const PjrtPlugin& plugin_;
  PJRT_Client* client_;  // never destroyed: buffers may outlive static teardown
  std::string platform_;
  std::string platform_version_;
  std::string version_;
  std::vector<PJRT_Device*> devices_;  // index = tpu index; null: another process's device
  std::unique_ptr<KeyValueStore> store_;  // must outlive the client
  std::atomic<bool> memory_stats_supported_{true};
};

// Creates the client of `choice` (throws PjrtPluginError naming the plugin on failure).
PjrtRuntime* start(const PjrtPluginChoice& choice, const PjrtRuntimeSettings& settings) {
  if (choice.path.empty())
    throw PjrtPluginError("torchtpu: platform '" + choice.platform +
                          "' was requested (TORCHTPU_PLATFORM) but is not present on this machine: its PJRT plugin "
                          "is not installed. Fix: " + choice.fix + ", or choose another platform");
  const PjrtPlugin& plugin = PjrtPlugin::load(choice.path, choice.fix);
  static std::once_flag exit_hook;
  std::call_once(exit_hook, [] { std::atexit([] { g_exiting.store(true); }); });
  PjrtClientSettings client_settings = settings.client;
  client_settings.platform = choice.platform;
  std::vector<PjrtOption> options = pjrt_client_options(client_settings);
  std::vector<PJRT_NamedValue> named(options.size());
  for (size_t i = 0; i < options.size(); ++i) {
    PJRT_NamedValue& v = named[i];
    v.struct_size = TORCHTPU_PJRT_SIZE(PJRT_NamedValue, value_size);
    v.name = options[i].name.data();
    v.name_size = options[i].name.size();
    v.value_size = 1;
    const auto& value = options[i].value;
    if (auto* s = std::get_if<std::string>(&value)) {
      v.type = PJRT_NamedValue_kString;
      v.string_value = s->data();
      v.value_size = s->size();
    } else if (auto* n = std::get_if<int64_t>(&value)) {
      v.type = PJRT_NamedValue_kInt64;
      v.int64_value = *n;
    } else if (auto* f = std::get_if<float>(&value)) {
      v.type = PJRT_NamedValue_kFloat;
      v.float_value = *f;
    } else if (auto* b = std::get_if<bool>(&value)) {
      v.type = PJRT_NamedValue_kBool;
      v.bool_value = *b;
    } else {
      const auto& list = std::get<std::vector<int64_t>>(value);
      v.type = PJRT_NamedValue_kInt64List;
      v.int64_array_value = list.data();
      v.value_size = list.size();
    }
  }
  std::unique_ptr<KeyValueStore> store;
  auto args = PJRT_ARGS(PJRT_Client_Create_Args, kv_try_get_user_arg);
  args.create_options = named.data();
  args.num_options = named.size();
  if (settings.kv_get && settings.kv_put && client_settings.num_nodes > 1) {
    store = std::make_unique<KeyValueStore>(KeyValueStore{settings.kv_get, settings.kv_put});
    args.kv_get_callback = &KeyValueStore::get_callback;
    args.kv_get_user_arg = store.get();
    args.kv_put_callback = &KeyValueStore::put_callback;
    args.kv_put_user_arg = store.get();
  }
  if (PJRT_Error* error = plugin.try_call(PjrtSlot::Client_Create, &args)) {
    std::string message = plugin.message(error);
    plugin.destroy(error);
    std::string described;
    for (const PjrtOption& o : options) described += (described.empty() ? "" : ", ") + o.describe();
    throw PjrtPluginError("torchtpu: the PJRT plugin " + choice.path + " could not create a " + choice.platform +
                          " client (options: " + (described.empty() ? "none" : described) + "): " + message +
                          ". Fix: " + choice.fix);
  }
  return new PjrtRuntime(plugin, args.client, choice.platform, client_settings.layout, std::move(store));
}

std::mutex g_settings_mutex;
PjrtRuntimeSettings g_settings;
bool g_selected = false;

PjrtRuntime* started_pjrt_runtime() {
  if (!g_selected) return nullptr;
  return dynamic_cast<PjrtRuntime*>(&runtime());
}

}  // namespace

void configure_pjrt_runtime(PjrtRuntimeSettings settings) {
  std::lock_guard<std::mutex> lock(g_settings_mutex);
  if (runtime_initialized()) return;  // settings are read once, when the runtime starts
  g_settings = std::move(settings);
  g_selected = true;
  set_process_layout(g_settings.client.layout);
  bool cpu_only = g_settings.candidates.size() == 1 && g_settings.candidates[0].platform == "cpu";
  set_device_count_before_start(cpu_only ? std::max(1, g_settings.client.cpu_device_count) : -1);
  set_runtime_starter([] {
    static std::mutex start_mutex;
    std::lock_guard<std::mutex> starting(start_mutex);
    static Runtime* started = nullptr;
    if (started) return started;
    PjrtRuntimeSettings settings;
    {
      std::lock_guard<std::mutex> lock(g_settings_mutex);
      settings = g_settings;
    }
    if (settings.candidates.empty())
      throw PjrtPluginError("torchtpu: no PJRT plugin is installed for any platform. Fix: pip install "
                            "'lammps-jax-pjrt-cpu==0.11.2' (cpu), or set TORCHTPU_RUNTIME=jaxlib");
    std::string failures;
    for (const PjrtPluginChoice& choice : settings.candidates) {
      try {
        started = start(choice, settings);
        return started;
      } catch (const PjrtPluginError& e) {
        if (settings.candidates.size() == 1) throw;
        failures += std::string(failures.empty() ? "" : " | ") + e.what();
      }
    }
    throw PjrtPluginError("torchtpu: no PJRT plugin started a client: " + failures);
  });
}

bool set_pjrt_distributed(int node_id, int num_nodes, std::function<std::string(const std::string&, int)> kv_get,
                          std::function<void(const std::string&, const std::string&)> kv_put) {
  std::lock_guard<std::mutex> lock(g_settings_mutex);
  if (runtime_initialized()) return false;
  g_settings.client.node_id = node_id;
  g_settings.client.num_nodes = num_nodes;
  g_settings.kv_get = std::move(kv_get);
  g_settings.kv_put = std::move(kv_put);
  return true;
}

bool pjrt_runtime_selected() { return g_selected; }

std::map<std::string, std::string> pjrt_runtime_info() {
  PjrtRuntime* rt = started_pjrt_runtime();
  if (!rt) return {};
  std::map<std::string, std::string> info = rt->plugin().attributes();
  info["runtime"] = "pjrt";
  info["plugin"] = rt->plugin().path();
  info["pjrt_api_version"] = rt->plugin().api_version();
  info["platform"] = rt->platform();
  info["platform_version"] = rt->platform_version();
  info["takes_ffi_handlers"] = rt->plugin().takes_ffi_handlers() ? "yes" : "no";
  return info;
}

void register_pjrt_ffi_handler(const std::string& target, void* handler, const std::string& platform_name) {
  PjrtRuntime* rt = started_pjrt_runtime();
  if (!rt) throw std::logic_error("torchtpu: custom-call handlers are registered with the PJRT runtime only");
  rt->plugin().register_ffi_handler(target, handler, platform_name);
}

}  // namespace torchtpu
