// Runtime backed by jaxlib's PJRT client, called through pybind11. All jaxlib-version
// differences live in this file.
#include <ATen/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "runtime/jaxlib_runtime.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace torchtpu {
namespace {

bool python_alive() { return Py_IsInitialized() && !_Py_IsFinalizing(); }

// Converts a Python exception raised inside jaxlib into a C++ one that says what failed.
[[noreturn]] void rethrow(const char* what, py::error_already_set& e) {
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

struct JaxBuffer final : DeviceBuffer {
  py::object array;
  JaxBuffer(py::object a, TensorType t, int d) : DeviceBuffer(std::move(t), d), array(std::move(a)) {}
  ~JaxBuffer() override {
    if (!python_alive()) {
      array.release();  // the interpreter is gone; leak rather than crash at exit
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
  explicit JaxExecutable(py::object e) : exe(std::move(e)) { execute_sharded = exe.attr("execute_sharded"); }
  ~JaxExecutable() override {
    if (!python_alive()) {
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
    default: t.code = kDLInt; break;
  }
  return t;
}

class JaxlibRuntime final : public Runtime {
 public:
  JaxlibRuntime(py::object client, std::string platform) : client_(std::move(client)), platform_(std::move(platform)) {
    xla_client_ = py::module_::import("jax._src.lib").attr("xla_client");
    jax_module_ = py::module_::import("jax._src.lib").attr("_jax");
    // Looked up once: attr("name") per launch would build the name's Python string each time.
    consume_with_handlers_ = jax_module_.attr("ExecuteResults").attr("consume_with_handlers");
    devices_ = client_.attr("local_devices")().cast<py::list>();
    py::object version = py::module_::import("jaxlib.version").attr("__version__");
    version_ = "jaxlib " + version.cast<std::string>() + " " + platform_ + " " +
               client_.attr("platform_version").cast<std::string>();
    numpy_ = py::module_::import("numpy");
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
      py::list devices;
      devices.append(devices_[options.device]);
      py::object exe =
          client_.attr("compile_and_load")(py::bytes(module_text), devices, compile_options(options));
      return std::make_shared<JaxExecutable>(std::move(exe));
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
      py::object results = jax_exe.execute_sharded(arrays);
      py::list per_output = jax_exe.has_handlers ? py::list(consume_with_handlers_(results, jax_exe.result_handlers))
                                                 : first_results(jax_exe, results);
      if (per_output.size() != result_types.size())
        throw std::runtime_error("torchtpu: executable returned an unexpected number of results");
      std::vector<BufferPtr> out;
      out.reserve(result_types.size());
      for (size_t i = 0; i < result_types.size(); ++i)
        out.push_back(std::make_shared<JaxBuffer>(per_output[i], result_types[i], device));
      return out;
    } catch (py::error_already_set& e) {
      rethrow("running a graph", e);
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
      if (device < 0 || device >= static_cast<int>(devices_.size())) throw std::logic_error("torchtpu: bad device index " + std::to_string(device) + " of " + std::to_string(devices_.size()));
      if (platform_ != "cpu") {
        py::object staged = jax_module_.attr("dlpack_managed_tensor_to_buffer")(capsule, host_device_, py::none());
        return std::make_shared<JaxBuffer>(device_put_(staged, devices_[device]), type, device);
      }
      py::object array = jax_module_.attr("dlpack_managed_tensor_to_buffer")(capsule, devices_[device], py::none());
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
      py::list devices;
      devices.append(devices_[options.device]);
      py::object device_list = jax_module_.attr("DeviceList")(py::tuple(devices));
      py::object exe =
          client_.attr("deserialize_executable")(py::bytes(bytes), device_list, compile_options(options));
      return std::make_shared<JaxExecutable>(std::move(exe));
    } catch (py::error_already_set& e) {
      rethrow("loading a cached executable", e);
    }
  }

 private:
  // Options that bind an executable to one device (the default assignment is device 0).
  py::object compile_options(const CompileOptions& compile) {
    py::object options = xla_client_.attr("CompileOptions")();
    py::object id = devices_[compile.device].attr("id");
    py::object assignment = numpy_.attr("array")(py::make_tuple(py::make_tuple(id)));
    options.attr("executable_build_options").attr("device_assignment") =
        xla_client_.attr("DeviceAssignment").attr("create")(assignment);
    return options;
  }

  // An executable's first results, split per output by jaxlib; their types and shardings
  // become the handlers later launches wrap results with (what jax's own dispatch does).
  py::list first_results(JaxExecutable& exe, py::object results) {
    py::list per_output;
    py::list handlers;
    py::object make_handler = jax_module_.attr("array_result_handler");
    for (py::handle shards : py::list(results.attr("disassemble_into_single_device_arrays")())) {
      py::object array = py::reinterpret_borrow<py::list>(shards)[0];
      per_output.append(array);
      handlers.append(make_handler(array.attr("aval"), array.attr("sharding"), py::arg("committed") = true,
                                   py::arg("_skip_checks") = true));
    }
    exe.result_handlers = handlers;
    exe.has_handlers = true;
    return per_output;
  }

  py::object client_;
  py::object xla_client_;
  py::object jax_module_;
  py::object numpy_;
  py::object host_device_;
  py::object device_put_;
  py::object consume_with_handlers_;
  py::list devices_;
  std::string platform_;
  std::string version_;
};

std::mutex g_init_mutex;

JaxlibRuntime& jaxlib_runtime() {
  auto* rt = dynamic_cast<JaxlibRuntime*>(&runtime());
  if (!rt) throw std::logic_error("torchtpu: JAX interop needs the jaxlib runtime");
  return *rt;
}

// The DType of a numpy dtype name ("float32", "bfloat16", ...), as dtype_name() spells them.
DType dtype_named(const std::string& name) {
  for (int code = 0; code < 32; ++code) {
    if (is_supported_dtype(code) && name == dtype_name(static_cast<DType>(code))) return static_cast<DType>(code);
  }
  throw std::invalid_argument("torchtpu.from_jax: dtype " + name +
                              " has no tpu tensor dtype (supported: float32, bfloat16, float16, float64, "
                              "int64, int32, int16, int8, uint8, bool)");
}

}  // namespace

_object* jax_array_of(const DeviceBuffer& buffer) {
  py::gil_scoped_acquire gil;
  return static_cast<const JaxBuffer&>(buffer).array.inc_ref().ptr();
}

BufferPtr buffer_of_jax_array(_object* object) {
  JaxlibRuntime& rt = jaxlib_runtime();
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
    int index = rt.device_index(devices[0]);
    if (index < 0)
      throw std::invalid_argument("torchtpu.from_jax: the jax.Array is on " + py::str(devices[0]).cast<std::string>() +
                                  ", not on a device of torchtpu's platform " + rt.platform() +
                                  "; jax.device_put it onto one of those first");
    TensorType type{array.attr("shape").cast<std::vector<int64_t>>(),
                    dtype_named(py::str(array.attr("dtype")).cast<std::string>())};
    return std::make_shared<JaxBuffer>(py::reinterpret_borrow<py::object>(array), type, index);
  } catch (py::error_already_set& e) {
    rethrow("sharing a jax.Array", e);
  }
}

void init_runtime(const std::string& requested_platform, int cpu_device_count) {
  std::lock_guard<std::mutex> lock(g_init_mutex);
  if (runtime_initialized()) return;
  py::gil_scoped_acquire gil;
  py::module_ jax;
  try {
    jax = py::module_::import("jax");
  } catch (py::error_already_set&) {
    throw std::runtime_error(
        "torchtpu needs jax and jaxlib: pip install 'jax[cpu]==0.10.2' (add the CUDA or TPU "
        "plugin for those platforms)");
  }
  if (cpu_device_count > 1) {
    try {
      jax.attr("config").attr("update")("jax_num_cpu_devices", cpu_device_count);
    } catch (py::error_already_set&) {
      // The CPU client already exists; its device count is fixed.
    }
  }
  py::module_ bridge = py::module_::import("jax._src.xla_bridge");
  std::vector<std::string> present;
  for (const char* name : {"tpu", "cuda", "cpu"}) {
    try {
      bridge.attr("get_backend")(name);
      present.push_back(name);
    } catch (py::error_already_set&) {
    }
  }
  auto is_present = [&](const std::string& p) {
    for (auto& x : present) if (x == p) return true;
    return false;
  };
  std::string present_list;
  for (auto& p : present) present_list += (present_list.empty() ? "" : ", ") + p;
  std::string platform = requested_platform;
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
  install_runtime(new JaxlibRuntime(client, platform));  // never destroyed: its Python objects outlive the interpreter
}

}  // namespace torchtpu
