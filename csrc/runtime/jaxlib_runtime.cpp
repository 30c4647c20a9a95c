// Runtime backed by jaxlib's PJRT client, called through pybind11. All jaxlib-version
// differences live in this file.
#include <ATen/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <unistd.h>

#include "runtime/jaxlib_runtime.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace torchtpu {
namespace {

// Py_IsFinalizing is public from Python 3.13, which removed the private _Py_IsFinalizing.
bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// Ctrl-C while jaxlib ran (it polls for signals while compiling): the KeyboardInterrupt
// goes on as it is (runtime.h), never reworded into a RuntimeError. Call with the GIL held.
void pass_interrupt(py::error_already_set& e) {
  if (e.matches(PyExc_KeyboardInterrupt)) throw;
}

// Converts a Python exception raised inside jaxlib into a C++ one that says what failed.
[[noreturn]] void rethrow(const char* what, py::error_already_set& e) {
  pass_interrupt(e);
  std::string message = e.what();
  if (message.find("RESOURCE_EXHAUSTED") != std::string::npos ||
      message.find("Out of memory") != std::string::npos ||
      message.find("out of memory") != std::string::npos) {
    throw DeviceOutOfMemory(std::string("torchtpu: the device ran out of memory while ") + what +
                            ". Free tensors you no longer need (del them), lower the batch size, "
                            "or call torchtpu.sync() more often. XLA said: " + message);
  }
  throw std::runtime_error(std::string("torchtpu: ") + what + " failed: " + message);
}

// Ctrl-C while jaxlib works: it polls for signals and abandons a compile, which leaves
// its client broken (the process crashes at exit), and an execute stopped between
// consuming its donated inputs and handing back its results would lose the user's
// tensors. So compiles and executes run to their end with SIGINT noted by a stand-in
// handler; the user's handler comes back afterwards and a noted interrupt is raised again
// (PyErr_SetInterruptEx): Python raises KeyboardInterrupt at its next check, at the start
// of the next runtime call or in the user's code, with nothing half done. Only the main
// thread receives signals; a handler that is not a Python callable (SIG_IGN, SIG_DFL) is
// left alone. The GIL is held throughout.
class DeferredInterrupt {
 public:
  DeferredInterrupt() {
    static py::object& getsignal = *new py::object(py::module_::import("_signal").attr("getsignal"));
    static py::object& setsignal = *new py::object(py::module_::import("_signal").attr("signal"));
    static py::object& stand_in = *new py::object(py::cpp_function([](py::args) { noted() = true; }));
    setsignal_ = setsignal;
    previous_ = getsignal(SIGINT);
    if (!PyCallable_Check(previous_.ptr()) || previous_.is(stand_in)) return;  // ignored, or nested
    try {
      setsignal(SIGINT, stand_in);  // raises a SIGINT already pending: fine, nothing started
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_ValueError)) throw;  // ValueError: not the main thread
      return;
    }
    noted() = false;
    active_ = true;
  }
  ~DeferredInterrupt() {
    if (!active_) return;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);  // restoring must not disturb an error in flight
    try {
      setsignal_(SIGINT, previous_);  // runs the stand-in for a signal still pending
    } catch (py::error_already_set&) {
    }
    PyErr_Restore(type, value, traceback);
    if (noted()) PyErr_SetInterruptEx(SIGINT);
  }
  DeferredInterrupt(const DeferredInterrupt&) = delete;
  DeferredInterrupt& operator=(const DeferredInterrupt&) = delete;

 private:
  static bool& noted() {
    static bool value = false;  // main thread only, under the GIL
    return value;
  }
  py::object setsignal_, previous_;
  bool active_ = false;
};

struct JaxBuffer final : DeviceBuffer {
  py::object array;  // a sharded buffer's is a global jax.Array over its mesh's devices
  JaxBuffer(py::object a, TensorType t, int d, ShardingPtr s = nullptr)
      : DeviceBuffer(std::move(t), d, std::move(s)), array(std::move(a)) {}
  ~JaxBuffer() override {
    // Leak rather than crash when the interpreter is gone, or hang in a forked child whose
    // client has lost its threads.
    if (!python_alive() || runtime_forked()) {
      array.release();
      return;
    }
    py::gil_scoped_acquire gil;
    array = py::object();
  }
};

struct JaxExecutable final : Executable {
  py::object exe;
  // Per launch: jaxlib's execute_sharded, bound once, and the handlers that wrap its results
  // as jax.Arrays (made at the first launch; an executable's result types never change).
  // disassemble_into_single_device_arrays would build each result's sharding in Python on
  // every launch.
  py::object execute_sharded;
  py::object result_handlers;  // a list, once has_handlers
  bool has_handlers = false;
  // A partitioned executable (CompileOptions::mesh): its results' shardings, read from the
  // compiled executable at the first launch.
  MeshPtr mesh;
  std::vector<ShardingPtr> result_shardings;
  JaxExecutable(py::object e, MeshPtr m) : exe(std::move(e)), mesh(std::move(m)) {
    execute_sharded = exe.attr("execute_sharded");
  }
  ~JaxExecutable() override {
    if (!python_alive() || runtime_forked()) {
      exe.release();
      execute_sharded.release();
      result_handlers.release();
      return;
    }
    py::gil_scoped_acquire gil;
    exe = py::object();
    execute_sharded = py::object();
    result_handlers = py::object();  // members die after the GIL is released: empty them here
  }
};

// Host memory owned by a DLManagedTensor we built ourselves.
struct OwnedHostTensor {
  DLManagedTensor managed;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  void* data;
};

void delete_owned_host_tensor(DLManagedTensor* self) {
  auto* owned = static_cast<OwnedHostTensor*>(self->manager_ctx);
  std::free(owned->data);
  delete owned;
}

DLDataType dlpack_dtype(DType dtype) {
  DLDataType t;
  t.lanes = 1;
  t.bits = static_cast<uint8_t>(dtype_size(dtype) * 8);
  switch (dtype) {
    case DType::Bool: t.code = kDLBool; break;
    case DType::UInt8: t.code = kDLUInt; break;
    case DType::BFloat16: t.code = kDLBfloat; break;
    case DType::Float16: case DType::Float32: case DType::Float64: t.code = kDLFloat; break;
    case DType::ComplexFloat: case DType::ComplexDouble: t.code = kDLComplex; break;
    default: t.code = kDLInt; break;
  }
  return t;
}

class JaxlibRuntime final : public Runtime {
 public:
  JaxlibRuntime(py::object client, std::string platform, const ProcessLayout& layout)
      : client_(std::move(client)), platform_(std::move(platform)) {
    xla_client_ = py::module_::import("jax._src.lib").attr("xla_client");
    jax_module_ = py::module_::import("jax._src.lib").attr("_jax");
    // Looked up once: attr("name") per launch would build the name's Python string each time.
    consume_with_handlers_ = jax_module_.attr("ExecuteResults").attr("consume_with_handlers");
    // array_result_handler's private `_skip_checks` (result_handler_like).
    handlers_take_skip_checks_ =
        py::module_::import("jax._src.lib").attr("jaxlib_extension_version").cast<int>() < 489;
    devices_ = node_local_devices(client_.attr("local_devices")().cast<py::list>(), layout);
    py::object version = py::module_::import("jaxlib.version").attr("__version__");
    version_ = "jaxlib " + version.cast<std::string>() + " " + platform_ + " " +
               client_.attr("platform_version").cast<std::string>();
    if (platform_ == "cpu") version_ += kYnnVersionNote;
    numpy_ = py::module_::import("numpy");
    make_array_from_single_device_arrays_ = py::module_::import("jax").attr("make_array_from_single_device_arrays");
    if (platform_ != "cpu") {
      // Host data reaches an accelerator through the CPU client (DLPack keeps int64 and
      // bfloat16 intact) and jax's device_put, which copies it over.
      py::object cpu = py::module_::import("jax._src.xla_bridge").attr("get_backend")("cpu");
      host_device_ = cpu.attr("local_devices")()[py::int_(0)];
      device_put_ = py::module_::import("jax").attr("device_put");
    }
  }

  const std::string& platform() const override { return platform_; }
  // The torchtpu index of a jax device, or -1 if it is not one of this client's devices.
  int device_index(py::handle device) const {
    for (size_t i = 0; i < devices_.size(); ++i)
      if (py::object(devices_[i]).equal(device)) return static_cast<int>(i);
    return -1;
  }
  int device_count() const override { return static_cast<int>(devices_.size()); }
  const std::string& version() const override { return version_; }
  bool has_float64() const override { return platform_ != "tpu"; }

  ExecutablePtr compile(const std::string& module_text, const CompileOptions& options) override {
    py::gil_scoped_acquire gil;
    try {
      py::list devices = executable_devices(options);
      DeferredInterrupt defer;
      py::object exe =
          client_.attr("compile_and_load")(py::bytes(module_text), devices,
                                           compile_options(options, ynn_fusions_off(platform_, module_text, options.excess_precision)));
      return std::make_shared<JaxExecutable>(std::move(exe), options.mesh);
    } catch (py::error_already_set& e) {
      rethrow("compiling a graph", e);
    }
  }

  std::vector<BufferPtr> execute(Executable& exe, const std::vector<BufferPtr>& args,
                                 const std::vector<TensorType>& result_types, int device) override {
    py::gil_scoped_acquire gil;
    try {
      auto& jax_exe = static_cast<JaxExecutable&>(exe);
      py::list arrays(args.size());
      for (size_t i = 0; i < args.size(); ++i) arrays[i] = static_cast<JaxBuffer&>(*args[i]).array;
      DeferredInterrupt defer;
      py::object results = jax_exe.execute_sharded(arrays);
      py::list per_output = jax_exe.has_handlers ? py::list(consume_with_handlers_(results, jax_exe.result_handlers))
                            : jax_exe.mesh       ? first_partitioned_results(jax_exe, results, result_types)
                                                 : first_results(jax_exe, results);
      if (per_output.size() != result_types.size())
        throw std::runtime_error("torchtpu: executable returned an unexpected number of results");
      std::vector<BufferPtr> out;
      out.reserve(result_types.size());
      for (size_t i = 0; i < result_types.size(); ++i)
        out.push_back(std::make_shared<JaxBuffer>(per_output[i], result_types[i], device,
                                                  jax_exe.mesh ? jax_exe.result_shardings[i] : nullptr));
      return out;
    } catch (py::error_already_set& e) {
      rethrow("running a graph", e);
    }
  }

  BufferPtr assemble_sharded(const TensorType& global, ShardingPtr sharding,
                             const std::vector<BufferPtr>& shards) override {
    const std::vector<int>& devices = sharding->mesh->devices;
    if (shards.size() != devices.size())
      throw std::logic_error("torchtpu: assemble_sharded got " + std::to_string(shards.size()) + " shards for " +
                             std::to_string(devices.size()) + " devices");
    py::gil_scoped_acquire gil;
    try {
      py::list arrays;
      for (size_t p = 0; p < shards.size(); ++p) {
        if (shards[p]->device != devices[p] || shards[p]->sharding ||
            shards[p]->type.shape != sharding->shard_shape(global.shape, static_cast<int>(p)))
          throw std::logic_error("torchtpu: assemble_sharded got a shard of the wrong device or shape");
        arrays.append(static_cast<JaxBuffer&>(*shards[p]).array);
      }
      py::object array = make_array_from_single_device_arrays_(py::tuple(py::cast(global.shape)),
                                                               jax_sharding(*sharding), arrays);
      return std::make_shared<JaxBuffer>(std::move(array), global, devices.front(), std::move(sharding));
    } catch (py::error_already_set& e) {
      rethrow("assembling a sharded tensor", e);
    }
  }

  std::vector<BufferPtr> shards_of(const DeviceBuffer& buffer) override {
    if (!buffer.sharding) throw std::logic_error("torchtpu: shards_of a buffer that is not sharded");
    const Sharding& sharding = *buffer.sharding;
    py::gil_scoped_acquire gil;
    try {
      std::map<int, py::object> by_device;
      for (py::handle shard : static_cast<const JaxBuffer&>(buffer).array.attr("addressable_shards"))
        by_device[device_index(shard.attr("device"))] = shard.attr("data");
      std::vector<BufferPtr> out;
      for (size_t p = 0; p < sharding.mesh->devices.size(); ++p) {
        int device = sharding.mesh->devices[p];
        TensorType type{sharding.shard_shape(buffer.type.shape, static_cast<int>(p)), buffer.type.dtype};
        out.push_back(std::make_shared<JaxBuffer>(by_device.at(device), type, device));
      }
      return out;
    } catch (py::error_already_set& e) {
      rethrow("reading the shards of a sharded tensor", e);
    }
  }

  BufferPtr upload(DLManagedTensor* host, const TensorType& type, int device) override {
    py::gil_scoped_acquire gil;
    py::capsule capsule(host, "dltensor", [](PyObject* object) {
      if (PyCapsule_IsValid(object, "dltensor")) {
        auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(object, "dltensor"));
        if (managed && managed->deleter) managed->deleter(managed);
      }
    });
    try {
      py::object target = local_device(device);
      if (platform_ != "cpu") {
        py::object staged = jax_module_.attr("dlpack_managed_tensor_to_buffer")(capsule, host_device_, py::none());
        return std::make_shared<JaxBuffer>(device_put_(staged, target), type, device);
      }
      py::object array = jax_module_.attr("dlpack_managed_tensor_to_buffer")(capsule, target, py::none());
      return std::make_shared<JaxBuffer>(std::move(array), type, device);
    } catch (py::error_already_set& e) {
      rethrow("copying a tensor to the device", e);
    }
  }

  BufferPtr upload_bytes(const void* data, const TensorType& type, int device) override {
    auto* owned = new OwnedHostTensor();
    size_t bytes = static_cast<size_t>(type.nbytes());
    owned->data = std::aligned_alloc(64, ((bytes + 63) / 64) * 64 + 64);
    if (bytes) std::memcpy(owned->data, data, bytes);
    owned->shape = type.shape;
    owned->strides.assign(type.shape.size(), 1);
    for (int i = static_cast<int>(type.shape.size()) - 2; i >= 0; --i)
      owned->strides[i] = owned->strides[i + 1] * type.shape[i + 1];
    DLManagedTensor& m = owned->managed;
    m.manager_ctx = owned;
    m.deleter = delete_owned_host_tensor;
    m.dl_tensor.data = owned->data;
    m.dl_tensor.device = DLDevice{kDLCPU, 0};
    m.dl_tensor.ndim = static_cast<int32_t>(type.shape.size());
    m.dl_tensor.dtype = dlpack_dtype(type.dtype);
    m.dl_tensor.shape = owned->shape.data();
    m.dl_tensor.strides = owned->strides.data();
    m.dl_tensor.byte_offset = 0;
    return upload(&m, type, device);
  }

  DLManagedTensor* download(const DeviceBuffer& buffer) override {
    py::gil_scoped_acquire gil;
    try {
      py::object array = static_cast<const JaxBuffer&>(buffer).array;
      if (platform_ != "cpu") {
        // Bring the bytes to host memory through numpy (bfloat16 travels as uint16 bits).
        py::object host = numpy_.attr("asarray")(array);
        if (buffer.type.dtype == DType::BFloat16) host = host.attr("view")(numpy_.attr("uint16"));
        array = numpy_.attr("ascontiguousarray")(host);
      }
      py::object capsule = array.attr("__dlpack__")();
      auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
      if (!managed) throw py::error_already_set();
      PyCapsule_SetName(capsule.ptr(), "used_dltensor");
      return managed;
    } catch (py::error_already_set& e) {
      rethrow("copying a tensor to the host", e);
    }
  }

  void wait(const DeviceBuffer& buffer) override {
    py::gil_scoped_acquire gil;
    try {
      static_cast<const JaxBuffer&>(buffer).array.attr("block_until_ready")();
    } catch (py::error_already_set& e) {
      rethrow("running a graph", e);
    }
  }

  bool is_ready(const DeviceBuffer& buffer) override {
    py::gil_scoped_acquire gil;
    try {
      return static_cast<const JaxBuffer&>(buffer).array.attr("is_ready")().cast<bool>();
    } catch (py::error_already_set& e) {
      rethrow("running a graph", e);
    }
  }

  void download_bytes(const DeviceBuffer& buffer, void* out) override {
    if (buffer.sharding) {  // a partitioned executable's check flags: every device holds them all
      if (!buffer.sharding->is_replicated()) throw std::logic_error("torchtpu: download_bytes of a sharded buffer");
      return download_bytes(*shards_of(buffer).front(), out);
    }
    DLManagedTensor* managed = download(buffer);
    py::gil_scoped_acquire gil;  // the deleter may release Python objects
    const DLTensor& t = managed->dl_tensor;
    std::memcpy(out, static_cast<const char*>(t.data) + t.byte_offset, static_cast<size_t>(buffer.type.nbytes()));
    if (managed->deleter) managed->deleter(managed);
  }

  int64_t memory_limit(int device) override {
    py::gil_scoped_acquire gil;
    try {
      py::object stats = devices_[device].attr("memory_stats")();
      if (!stats.is_none()) {
        py::dict d = stats;
        if (d.contains("bytes_limit")) return d["bytes_limit"].cast<int64_t>();
      }
    } catch (py::error_already_set& e) {
      pass_interrupt(e);
      // No allocator statistics on this platform: the host's memory below.
    }
    return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGE_SIZE));
  }

  int64_t memory_needed(Executable& exe) override {
    py::gil_scoped_acquire gil;
    try {
      py::object stats = static_cast<JaxExecutable&>(exe).exe.attr("get_compiled_memory_stats")();
      int64_t needed = stats.attr("output_size_in_bytes").cast<int64_t>() +
                       stats.attr("temp_size_in_bytes").cast<int64_t>() -
                       stats.attr("alias_size_in_bytes").cast<int64_t>();
      return needed > 0 ? needed : 0;
    } catch (py::error_already_set& e) {
      pass_interrupt(e);
      return 0;  // the platform does not report it
    }
  }

  bool is_deleted(const DeviceBuffer& buffer) override {
    py::gil_scoped_acquire gil;
    try {
      return static_cast<const JaxBuffer&>(buffer).array.attr("is_deleted")().cast<bool>();
    } catch (py::error_already_set&) {
      return true;
    }
  }

  std::string serialize(Executable& exe) override {
    py::gil_scoped_acquire gil;
    try {
      py::bytes bytes = client_.attr("serialize_executable")(static_cast<JaxExecutable&>(exe).exe);
      return bytes;
    } catch (py::error_already_set& e) {
      rethrow("serializing an executable", e);
    }
  }

  ExecutablePtr deserialize(const std::string& bytes, const CompileOptions& options) override {
    py::gil_scoped_acquire gil;
    try {
      py::object device_list = jax_module_.attr("DeviceList")(py::tuple(executable_devices(options)));
      DeferredInterrupt defer;
      py::object exe =
          client_.attr("deserialize_executable")(py::bytes(bytes), device_list, compile_options(options));
      return std::make_shared<JaxExecutable>(std::move(exe), options.mesh);
    } catch (py::error_already_set& e) {
      rethrow("loading a cached executable", e);
    }
  }

  std::string device_kind(int device) override {
    py::gil_scoped_acquire gil;
    try {
      return py::str(local_device(device).attr("device_kind"));
    } catch (py::error_already_set& e) {
      rethrow("reading the device kind", e);
    }
  }

  std::map<std::string, int64_t> memory_stats(int device) override {
    py::gil_scoped_acquire gil;
    try {
      std::map<std::string, int64_t> out;
      py::object stats = local_device(device).attr("memory_stats")();
      if (stats.is_none()) return out;
      for (auto item : py::cast<py::dict>(stats))
        if (py::isinstance<py::int_>(item.second)) out[py::str(item.first)] = item.second.cast<int64_t>();
      return out;
    } catch (py::error_already_set& e) {
      rethrow("reading the device's memory statistics", e);
    }
  }

  std::vector<int64_t> read_int64(const DeviceBuffer& buffer) override {
    if (buffer.type.dtype != DType::Int64) throw std::logic_error("torchtpu: read_int64 of a non-int64 buffer");
    if (buffer.sharding) {  // replicated: every device holds it all
      if (!buffer.sharding->is_replicated()) throw std::logic_error("torchtpu: read_int64 of a sharded buffer");
      return read_int64(*shards_of(buffer).front());
    }
    DLManagedTensor* host = download(buffer);
    const auto* data = static_cast<const int64_t*>(host->dl_tensor.data) + host->dl_tensor.byte_offset / 8;
    std::vector<int64_t> contents(data, data + buffer.type.numel());
    if (host->deleter) {
      py::gil_scoped_acquire gil;  // the deleter may release a Python object
      host->deleter(host);
    }
    return contents;
  }

  int process_index() const override {
    py::gil_scoped_acquire gil;
    return client_.attr("process_index")().cast<int>();
  }

  int64_t device_id(int device) const override {
    py::gil_scoped_acquire gil;
    return local_device(device).attr("id").cast<int64_t>();
  }

  std::vector<int64_t> process_device_ids() const override {
    py::gil_scoped_acquire gil;
    std::vector<std::pair<int, int64_t>> by_process;
    for (py::handle d : client_.attr("devices")())
      by_process.emplace_back(d.attr("process_index").cast<int>(), d.attr("id").cast<int64_t>());
    return one_device_per_process(std::move(by_process), "jaxlib");
  }

  std::string describe_collective_failure(const std::vector<int64_t>& replica_devices, int64_t first,
                                          int64_t last) override;

 private:
  // The node-local device list: index = tpu index. In a torchrun job the other processes'
  // devices are None (this process drives tpu:local_rank only).
  static std::vector<py::object> node_local_devices(const py::list& local, const ProcessLayout& layout) {
    std::vector<py::object> devices;
    if (layout.local_world_size == 0) {
      for (py::handle d : local) devices.push_back(py::reinterpret_borrow<py::object>(d));
      return devices;
    }
    // Joined to a distributed runtime, the client sees only this process's device; alone
    // (no process group yet) it may see them all, and tpu:local_rank is its local_rank-th.
    size_t mine = local.size() == 1 ? 0 : static_cast<size_t>(layout.local_rank);
    if (mine >= local.size())
      throw std::runtime_error("torchtpu: LOCAL_RANK=" + std::to_string(layout.local_rank) + " but jaxlib sees " +
                               std::to_string(local.size()) + " local devices");
    devices.assign(layout.local_world_size, py::none());
    devices[layout.local_rank] = py::reinterpret_borrow<py::object>(local[mine]);
    return devices;
  }

  py::object local_device(int device) const {
    if (device < 0 || device >= static_cast<int>(devices_.size()) || devices_[device].is_none())
      throw std::logic_error("torchtpu: device tpu:" + std::to_string(device) + " is not a device of this process");
    return devices_[device];
  }

  // The devices an executable is loaded on: its device, or its mesh's.
  py::list executable_devices(const CompileOptions& options) const {
    py::list devices;
    if (!options.mesh) devices.append(local_device(options.device));
    else for (int d : options.mesh->devices) devices.append(local_device(d));
    return devices;
  }

  // Options that bind an executable to one device, to the replicas' devices for a module
  // with collectives (this process runs the replica whose device is its own), or to a mesh
  // (one replica, a partition per device, XLA's SPMD partitioner).
  // `no_ynn_fusions`: turn YNNPACK's fusions off (runtime.h ynn_fusions_off; only a compile reads it).
  py::object compile_options(const CompileOptions& compile, bool no_ynn_fusions = false) {
    const std::vector<int64_t>& replica_devices = compile.replica_devices;
    py::object options = xla_client_.attr("CompileOptions")();
    py::object build = options.attr("executable_build_options");
    py::tuple rows;
    if (compile.mesh) {
      int partitions = static_cast<int>(compile.mesh->devices.size());
      options.attr("num_replicas") = 1;
      options.attr("num_partitions") = partitions;
      build.attr("num_replicas") = 1;
      build.attr("num_partitions") = partitions;
      build.attr("use_spmd_partitioning") = true;
      // Results whose layout is not fixed get the one propagation gives them (as jax.jit's
      // unspecified out_shardings), not a replicated copy.
      py::list propagate;
      for (bool fixed : compile.fixed_result_layouts) propagate.append(!fixed);
      if (compile.fixed_result_layouts.empty()) propagate.append(true);
      build.attr("allow_spmd_sharding_propagation_to_output") = py::tuple(propagate);
      py::tuple row(partitions);
      for (int p = 0; p < partitions; ++p) row[p] = local_device(compile.mesh->devices[p]).attr("id");
      rows = py::make_tuple(row);
    } else if (replica_devices.empty()) {
      rows = py::make_tuple(py::make_tuple(local_device(compile.device).attr("id")));
    } else {
      int replicas = static_cast<int>(replica_devices.size());
      options.attr("num_replicas") = replicas;
      options.attr("num_partitions") = 1;
      build.attr("num_replicas") = replicas;
      build.attr("num_partitions") = 1;
      rows = py::tuple(replicas);
      for (int r = 0; r < replicas; ++r) rows[r] = py::make_tuple(replica_devices[r]);
    }
    build.attr("device_assignment") = xla_client_.attr("DeviceAssignment").attr("create")(numpy_.attr("array")(rows));
    // Off, every op's float16/bfloat16 result is rounded, as eager PyTorch rounds each op's
    // result: XLA's default keeps a fused chain's intermediates in float32 (x.abs() + 0.5 fed
    // to pow unrounded), so a fused graph would differ from the same ops run one by one.
    py::list overrides;
    overrides.append(py::make_tuple("xla_allow_excess_precision", compile.excess_precision));
    for (const auto& [name, value] : kFixedXlaOptions) overrides.append(py::make_tuple(name, value));
    if (no_ynn_fusions) overrides.append(py::make_tuple("xla_cpu_experimental_ynn_fusion_type", ""));
    options.attr("env_option_overrides") = overrides;
    return options;
  }

  // jaxlib's handler that wraps a later launch's result like `array` (its type and sharding).
  // jaxlib 0.12 (extension version 489) dropped the private `_skip_checks` argument; jax's own
  // array.py passes it only below that version.
  py::object result_handler_like(py::handle array) {
    py::object make_handler = jax_module_.attr("array_result_handler");
    if (handlers_take_skip_checks_)
      return make_handler(array.attr("aval"), array.attr("sharding"), py::arg("committed") = true,
                          py::arg("_skip_checks") = true);
    return make_handler(array.attr("aval"), array.attr("sharding"), py::arg("committed") = true);
  }

  // An executable's first results, split per output by jaxlib; their types and shardings
  // become the handlers later launches wrap results with (what jax's own dispatch does).
  py::list first_results(JaxExecutable& exe, py::object results) {
    py::list per_output;
    py::list handlers;
    for (py::handle shards : py::list(results.attr("disassemble_into_single_device_arrays")())) {
      py::object array = py::reinterpret_borrow<py::list>(shards)[0];
      per_output.append(array);
      handlers.append(result_handler_like(array));
    }
    exe.result_handlers = handlers;
    exe.has_handlers = true;
    return per_output;
  }

  // The first results of a partitioned executable: one global array per result, made from
  // its per-device shards with the sharding the compiler chose; the handlers of later launches
  // come from them.
  py::list first_partitioned_results(JaxExecutable& exe, py::object results, const std::vector<TensorType>& types) {
    py::object reported = exe.exe.attr("get_output_shardings")();  // None for a mesh of one device
    py::list per_device = results.attr("disassemble_into_single_device_arrays")();
    if ((!reported.is_none() && py::len(reported) != types.size()) || per_device.size() != types.size())
      throw std::runtime_error("torchtpu: a partitioned executable returned an unexpected number of results");
    py::list per_output;
    py::list handlers;
    py::object from_proto = xla_client_.attr("HloSharding").attr("from_proto");
    exe.result_shardings.clear();
    for (size_t i = 0; i < types.size(); ++i) {
      auto sharding = std::make_shared<Sharding>(
          reported.is_none() ? Sharding::replicated(exe.mesh, types[i].rank())
                             : sharding_of(from_proto(reported[py::int_(i)]), exe.mesh, types[i].rank()));
      py::object array = make_array_from_single_device_arrays_(py::tuple(py::cast(types[i].shape)),
                                                               jax_sharding(*sharding), per_device[i]);
      per_output.append(array);
      handlers.append(result_handler_like(array));
      exe.result_shardings.push_back(std::move(sharding));
    }
    exe.result_handlers = handlers;
    exe.has_handlers = true;
    return per_output;
  }

  // The sharding jaxlib's HloSharding describes, over `mesh` (its device numbers are
  // partitions). Tiled and replicated shardings only: XLA gives nothing else to results of
  // modules whose arguments are tiled or replicated.
  static Sharding sharding_of(py::handle hlo, const MeshPtr& mesh, int64_t rank) {
    if (hlo.attr("is_replicated")().cast<bool>()) return Sharding::replicated(mesh, rank);
    std::string text = py::str(hlo);
    if (!hlo.attr("is_tiled")().cast<bool>() || py::len(hlo.attr("subgroup_types")()) > 0)
      throw std::runtime_error("torchtpu: XLA chose a sharding torchtpu cannot hold: " + text);
    Sharding s;
    s.mesh = mesh;
    s.tiles = hlo.attr("tile_assignment_dimensions")().cast<std::vector<int64_t>>();
    if (hlo.attr("replicate_on_last_tile_dim")().cast<bool>()) {
      s.replicas = s.tiles.back();
      s.tiles.pop_back();
    }
    s.tile_assignment = hlo.attr("tile_assignment_devices")().cast<std::vector<int>>();
    try {
      s.validate(rank);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(std::string(e.what()) + " (XLA's sharding " + text + ")");
    }
    return s;
  }

  // jax's sharding object for a sharding (cached: a replicated scalar pack needs one per launch).
  py::object jax_sharding(const Sharding& sharding) {
    std::string key = sharding.hlo() + " on";
    for (int d : sharding.mesh->devices) key += " " + std::to_string(d);
    auto it = jax_shardings_.find(key);
    if (it != jax_shardings_.end()) return it->second;
    static py::object& gspmd = *new py::object(py::module_::import("jax._src.sharding_impls").attr("GSPMDSharding"));
    py::tuple devices(sharding.mesh->devices.size());
    for (size_t p = 0; p < sharding.mesh->devices.size(); ++p) devices[p] = local_device(sharding.mesh->devices[p]);
    py::object made = gspmd(devices, xla_client_.attr("HloSharding").attr("from_string")(sharding.hlo()));
    jax_shardings_.emplace(key, made);
    return made;
  }

  py::object client_;
  py::object xla_client_;
  py::object jax_module_;
  py::object numpy_;
  py::object host_device_;
  py::object device_put_;
  py::object consume_with_handlers_;
  bool handlers_take_skip_checks_ = false;
  std::vector<py::object> devices_;
  std::map<std::string, py::object> jax_shardings_;
  py::object make_array_from_single_device_arrays_;
  std::string platform_;
  std::string version_;
};

std::mutex g_runtime_mutex;  // held while the runtime starts or the process joins a job
int g_collective_timeout_s = 0;  // set when joining a job: the process group's timeout

// The DType of a numpy dtype name ("float32", "bfloat16", ...), as dtype_name() spells them.
DType dtype_named(const std::string& name) {
  for (int code = 0; code < 32; ++code) {
    if (is_supported_dtype(code) && name == dtype_name(static_cast<DType>(code))) return static_cast<DType>(code);
  }
  throw std::invalid_argument("torchtpu.from_jax: dtype " + name +
                              " has no tpu tensor dtype (supported: float32, bfloat16, float16, float64, "
                              "int64, int32, int16, int8, uint8, bool)");
}

struct Settings {
  std::string platform;  // "" = best present
  int cpu_device_count = 1;
  ProcessLayout layout;
};
Settings g_settings;
bool g_distributed_joined = false;

// Takes the runtime mutex without holding the GIL while waiting (the holder may need it).
std::unique_lock<std::mutex> lock_runtime_mutex() {
  std::unique_lock<std::mutex> lock(g_runtime_mutex, std::defer_lock);
  py::gil_scoped_release release;
  lock.lock();
  return lock;
}

py::module_ import_jax() {
  try {
    return py::module_::import("jax");
  } catch (py::error_already_set& e) {
    pass_interrupt(e);
    throw std::runtime_error(
        "torchtpu needs jax and jaxlib: pip install 'jax[cpu]==0.10.2' (add the CUDA or TPU "
        "plugin for those platforms)");
  }
}

// Chooses the platform and creates jaxlib's client. Called once, with the GIL and the mutex.
Runtime* start_runtime_locked() {
  py::module_ jax = import_jax();
  if (g_settings.cpu_device_count > 1 && g_settings.layout.local_world_size == 0) {
    try {
      jax.attr("config").attr("update")("jax_num_cpu_devices", g_settings.cpu_device_count);
    } catch (py::error_already_set& e) {
      pass_interrupt(e);
      // The CPU client already exists; its device count is fixed.
    }
  }
  py::module_ bridge = py::module_::import("jax._src.xla_bridge");
  std::vector<std::string> present;
  for (const char* name : {"tpu", "cuda", "cpu"}) {
    try {
      bridge.attr("get_backend")(name);
      present.push_back(name);
    } catch (py::error_already_set& e) {
      pass_interrupt(e);  // a platform that does not start is absent; Ctrl-C is not that
    }
  }
  auto is_present = [&](const std::string& p) {
    for (auto& x : present) if (x == p) return true;
    return false;
  };
  std::string present_list;
  for (auto& p : present) present_list += (present_list.empty() ? "" : ", ") + p;
  std::string platform = g_settings.platform;
  if (platform.empty()) {
    if (present.empty()) throw std::runtime_error("torchtpu: jaxlib found no usable platform");
    platform = present.front();
  } else if (platform != "cpu" && platform != "cuda" && platform != "tpu") {
    throw std::invalid_argument("torchtpu: unknown platform '" + platform +
                                "'; valid platforms are cpu, cuda, tpu (present here: " +
                                present_list + ")");
  } else if (!is_present(platform)) {
    throw std::runtime_error("torchtpu: platform '" + platform +
                             "' was requested (TORCHTPU_PLATFORM) but is not present on this "
                             "machine; present: " + present_list +
                             ". Install its jax plugin or choose another platform.");
  }
  py::object client = bridge.attr("get_backend")(platform);
  return new JaxlibRuntime(client, platform, g_settings.layout);
}

}  // namespace

namespace {

void release_unused_capsule(PyObject* object) {
  if (PyCapsule_IsValid(object, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(object, "dltensor"));
    if (managed && managed->deleter) managed->deleter(managed);
  }
}

// jax's CPU device with torchtpu's index, or its first (JAX may have fewer CPU devices).
py::object jax_cpu_device(int index) {
  py::list devices = py::module_::import("jax").attr("devices")("cpu");
  return devices[index < static_cast<int>(devices.size()) ? index : 0];
}

// from_jax under a runtime whose buffers are host memory (PJRT on CPU): a view of the
// array's memory that keeps the array alive. The GIL is held.
BufferPtr view_of_jax_array(py::handle array, py::handle device, const TensorType& type) {
  Runtime& rt = runtime();
  std::string platform = py::str(device.attr("platform"));
  if (platform != "cpu" || rt.platform() != "cpu")
    throw std::invalid_argument("torchtpu.from_jax: the jax.Array is on " + py::str(device).cast<std::string>() +
                                "; torchtpu's PJRT runtime on platform " + rt.platform() +
                                " shares memory with JAX's cpu arrays only (set TORCHTPU_RUNTIME=jaxlib to share "
                                "device arrays)");
  int id = device.attr("id").cast<int>();
  int index = id < rt.device_count() ? id : 0;
  array.attr("block_until_ready")();  // the runtime reads the memory without asking JAX
  void* data = reinterpret_cast<void*>(array.attr("unsafe_buffer_pointer")().cast<uintptr_t>());
  PyObject* keep = py::reinterpret_borrow<py::object>(array).release().ptr();
  auto release = [keep] {
    if (!python_alive()) return;  // the interpreter is gone: leak the reference
    py::gil_scoped_acquire gil;
    Py_DECREF(keep);
  };
  py::gil_scoped_release unlocked;  // release() may run here and take the GIL
  return rt.view_of(data, type, index, release);
}

}  // namespace

// The jax.Array adopted for each shared buffer while it lives (weakly: the array holds the
// buffer), so that sharing a buffer twice gives the same array, as jaxlib's buffers do.
// Under the GIL.
std::map<const DeviceBuffer*, py::object>& arrays_of_shared_buffers() {
  static auto& arrays = *new std::map<const DeviceBuffer*, py::object>();
  return arrays;
}

_object* jax_array_of(const BufferPtr& buffer) {
  if (auto* jax_buffer = dynamic_cast<const JaxBuffer*>(buffer.get())) {
    py::gil_scoped_acquire gil;
    return jax_buffer->array.inc_ref().ptr();
  }
  {
    py::gil_scoped_acquire gil;
    auto known = arrays_of_shared_buffers().find(buffer.get());
    if (known != arrays_of_shared_buffers().end()) {
      py::object array = known->second();  // the weak reference
      if (!array.is_none()) return array.release().ptr();
    }
  }
  // Another runtime's buffer in host memory: JAX adopts it through DLPack without a copy
  // (dlpack_managed_tensor_to_buffer keeps int64, which jax.dlpack would narrow).
  DLManagedTensor* shared = runtime().share(buffer);  // waits for the contents, holds the buffer
  py::gil_scoped_acquire gil;
  py::capsule capsule(shared, "dltensor", release_unused_capsule);
  try {
    py::object convert = py::module_::import("jax._src.lib").attr("_jax").attr("dlpack_managed_tensor_to_buffer");
    py::object array = convert(capsule, jax_cpu_device(buffer->device), py::none());
    const DeviceBuffer* key = buffer.get();
    py::cpp_function forget([key](py::handle) { arrays_of_shared_buffers().erase(key); });
    arrays_of_shared_buffers()[key] = py::weakref(array, forget);
    return array.release().ptr();
  } catch (py::error_already_set& e) {
    rethrow("sharing a tensor with JAX", e);
  }
}

BufferPtr buffer_of_jax_array(_object* object) {
  auto* rt = dynamic_cast<JaxlibRuntime*>(&runtime());
  py::gil_scoped_acquire gil;
  py::handle array(object);
  py::object array_type = py::module_::import("jax").attr("Array");
  if (!py::isinstance(array, array_type))
    throw std::invalid_argument("torchtpu.from_jax expects a jax.Array, got " +
                                py::str(py::type::of(array).attr("__name__")).cast<std::string>());
  try {
    if (array.attr("is_deleted")().cast<bool>())
      throw std::invalid_argument("torchtpu.from_jax: the jax.Array has been deleted (donated or freed)");
    py::list devices(py::module_::import("builtins").attr("list")(array.attr("devices")()));
    if (devices.size() != 1)
      throw std::invalid_argument("torchtpu.from_jax: the jax.Array spans " + std::to_string(devices.size()) +
                                  " devices; pass one shard (array.addressable_shards[i].data)");
    TensorType type{array.attr("shape").cast<std::vector<int64_t>>(),
                    dtype_named(py::str(array.attr("dtype")).cast<std::string>())};
    if (!rt) return view_of_jax_array(array, devices[0], type);
    int index = rt->device_index(devices[0]);
    if (index < 0)
      throw std::invalid_argument("torchtpu.from_jax: the jax.Array is on " + py::str(devices[0]).cast<std::string>() +
                                  ", not on a device of torchtpu's platform " + rt->platform() +
                                  "; jax.device_put it onto one of those first");
    return std::make_shared<JaxBuffer>(py::reinterpret_borrow<py::object>(array), type, index);
  } catch (py::error_already_set& e) {
    rethrow("sharing a jax.Array", e);
  }
}

void configure_runtime(const std::string& requested_platform, int cpu_device_count, ProcessLayout layout) {
  py::gil_scoped_acquire gil;
  auto lock = lock_runtime_mutex();
  if (runtime_initialized()) return;  // settings are read once, when the runtime starts
  g_settings = Settings{requested_platform, cpu_device_count, layout};
  set_process_layout(layout);
  // Known without starting the runtime: the CPU platform's device count.
  set_device_count_before_start(requested_platform == "cpu" ? std::max(1, cpu_device_count) : -1);
  set_runtime_starter([] {
    py::gil_scoped_acquire gil;
    auto lock = lock_runtime_mutex();
    static Runtime* started = start_runtime_locked();  // never destroyed: its Python objects outlive the interpreter
    return started;
  });
}

bool distributed_joined() { return g_distributed_joined; }

namespace {

// jax's coordination client of this process (set once joined), and the last error it
// reported (a peer that stopped sending heartbeats, a failed shutdown barrier). Never
// destroyed: a global py::object's destructor runs after Python has finalized, and once jax
// 0.12 lets go of its own reference at exit, it freed the client there (SIGSEGV on every
// rank's exit).
py::object& g_coordination_client = *new py::object();
std::mutex g_coordination_error_mutex;
std::string g_coordination_error;

std::string coordination_error() {
  std::lock_guard<std::mutex> lock(g_coordination_error_mutex);
  return g_coordination_error;
}

void record_coordination_error(const std::string& message) {
  std::lock_guard<std::mutex> lock(g_coordination_error_mutex);
  g_coordination_error = message;
}

}  // namespace

// Each failing rank posts the collectives it was running to jax's key-value store, waits
// for the others, then names the ranks that posted nothing (dead or busy elsewhere) or
// something else (out of step).
std::string JaxlibRuntime::describe_collective_failure(const std::vector<int64_t>& replica_devices, int64_t first,
                                                       int64_t last) {
  py::gil_scoped_acquire gil;
  if (g_coordination_client.is_none() || !g_coordination_client) return "";
  std::map<int64_t, int> rank_of_device;
  for (py::handle d : client_.attr("devices")())
    rank_of_device[d.attr("id").cast<int64_t>()] = d.attr("process_index").cast<int>();
  std::vector<int> ranks;
  std::string directory = "torchtpu/failed/";
  for (int64_t id : replica_devices) {
    ranks.push_back(rank_of_device[id]);
    directory += std::to_string(id) + "_";
  }
  static int failures = 0;
  directory += "/" + std::to_string(failures++) + "/";
  int me = client_.attr("process_index")().cast<int>();
  std::string mine = std::to_string(first) + ".." + std::to_string(last);
  std::string report;
  try {
    g_coordination_client.attr("key_value_set")(directory + std::to_string(me), mine);
    {
      py::gil_scoped_release release;
      std::this_thread::sleep_for(std::chrono::seconds(std::clamp(g_collective_timeout_s / 4, 2, 10)));
    }
    std::map<int, std::string> posted;
    for (py::handle item : g_coordination_client.attr("key_value_dir_get")(directory)) {
      std::string key = py::str(item[py::int_(0)]);
      posted[std::stoi(key.substr(key.rfind('/') + 1))] = py::str(item[py::int_(1)]);
    }
    std::string absent, different;
    for (int r : ranks) {
      if (!posted.count(r)) absent += (absent.empty() ? "" : ", ") + std::to_string(r);
      else if (posted[r] != mine) different += (different.empty() ? "" : ", ") + std::to_string(r) + " (#" + posted[r] + ")";
    }
    if (!absent.empty())
      report += " Rank(s) " + absent + " did not reach these collectives: they died, or are stuck or busy elsewhere.";
    if (!different.empty())
      report += " Rank(s) " + different + " failed in other collectives: the ranks issued different collectives.";
  } catch (py::error_already_set& e) {
    report += " (the job's coordination service could not be asked which ranks failed: " + std::string(e.what()) + ")";
  }
  std::string service = coordination_error();
  if (!service.empty()) report += " jax's coordination service reported: " + service;
  std::string group;
  for (int r : ranks) group += (group.empty() ? "" : ", ") + std::to_string(r);
  return " [collectives #" + mine + " over ranks " + group + " on rank " + std::to_string(me) + "]" + report;
}

// Joins the job the way jax.distributed.initialize does, with one difference: jax's client
// terminates the process (LOG(FATAL)) when the coordination service reports an error, such
// as a peer that died or never connected. Here the error is recorded and surfaces as a
// Python exception from the failing call, which can name the ranks at fault.
void join_distributed(const DistributedOptions& options) {
  py::gil_scoped_acquire gil;
  auto lock = lock_runtime_mutex();
  if (g_distributed_joined) return;
  if (runtime_initialized())
    throw RuntimeAlreadyStarted("torchtpu: the tpu runtime started before this process joined the job");
  py::module_ jax = import_jax();
  py::object config = jax.attr("config");
  // CPU collectives go over gloo (GPU ones over NCCL, TPU ones over ICI: chosen by the client).
  config.attr("update")("jax_cpu_collectives_implementation", "gloo");
  if (g_settings.layout.local_world_size > 0) {
    std::string mine = std::to_string(g_settings.layout.local_rank);
    config.attr("update")("jax_cuda_visible_devices", mine);
  }
  // A peer that never reaches a collective: the wait ends after the process group's timeout
  // (XLA's CPU collectives wait 30 minutes by default). Read when the client starts.
  py::object environ = py::module_::import("os").attr("environ");
  std::string flags = py::str(environ.attr("get")("XLA_FLAGS", ""));
  if (flags.find("xla_cpu_collective_timeout_seconds") == std::string::npos)
    environ["XLA_FLAGS"] = flags + " --xla_cpu_collective_timeout_seconds=" + std::to_string(options.initialization_timeout_s);
  py::object state = py::module_::import("jax._src.distributed").attr("global_state");
  if (!state.attr("client").is_none())
    throw std::runtime_error("torchtpu: jax.distributed was initialized already; let torch.distributed's "
                             "init_process_group() join the job instead");
  py::object jaxlib = py::module_::import("jax._src.lib").attr("_jax");
  const std::string& address = options.coordinator_address;
  int shutdown_timeout = std::min(options.initialization_timeout_s, 300);
  try {
    if (options.process_id == 0) {
      std::string bind = "[::]:" + address.substr(address.rfind(':') + 1);
      state.attr("service") = jaxlib.attr("get_distributed_runtime_service")(
          bind, options.num_processes, py::arg("heartbeat_timeout") = options.heartbeat_timeout_s,
          py::arg("shutdown_timeout") = shutdown_timeout);
    }
    py::cpp_function on_error([](py::object status) { record_coordination_error(py::str(status)); });
    py::object client = jaxlib.attr("get_distributed_runtime_client")(
        address, options.process_id, py::arg("init_timeout") = options.initialization_timeout_s,
        py::arg("shutdown_timeout") = shutdown_timeout, py::arg("heartbeat_timeout") = options.heartbeat_timeout_s,
        py::arg("missed_heartbeat_callback") = on_error, py::arg("use_compression") = true);
    client.attr("connect")();
    state.attr("client") = client;
    state.attr("process_id") = options.process_id;
    state.attr("num_processes") = options.num_processes;
    state.attr("coordinator_address") = address;
    g_coordination_client = client;
  } catch (py::error_already_set& e) {
    throw std::runtime_error(
        "torchtpu: could not join the distributed job (jax's coordination service at " + address + ", process " +
        std::to_string(options.process_id) + " of " + std::to_string(options.num_processes) + ", waited up to " +
        std::to_string(options.initialization_timeout_s) +
        " s): check that every rank started and called init_process_group(), that MASTER_ADDR is rank 0's host "
        "address as the other hosts see it, and that no firewall blocks the port. jax said: " + e.what());
  }
  g_collective_timeout_s = options.initialization_timeout_s;
  g_distributed_joined = true;
}

}  // namespace torchtpu
