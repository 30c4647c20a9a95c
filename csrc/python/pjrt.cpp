// torchtpu._C's surface for the PJRT runtime (runtime/pjrt_runtime.h): selecting it, the
// plugin's report, custom-call handlers from jaxlib, a multi-process job's key-value store,
// and the checks tests/test_pjrt_runtime.py makes of it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "device/tensor.h"
#include "engine/engine.h"
#include "runtime/pjrt_runtime.h"

namespace py = pybind11;

namespace torchtpu {
namespace {

PjrtClientSettings client_settings(const std::string& platform, int cpu_devices, int local_rank, int local_world_size,
                                   bool gpu_preallocate, double gpu_memory_fraction, int node_id, int num_nodes) {
  PjrtClientSettings s;
  s.platform = platform;
  s.cpu_device_count = cpu_devices;
  s.layout = ProcessLayout{local_rank, local_world_size};
  s.gpu_preallocate = gpu_preallocate;
  s.gpu_memory_fraction = gpu_memory_fraction;
  s.node_id = node_id;
  s.num_nodes = num_nodes;
  return s;
}

// A module adding two tensors of `type`, for the launch check below.
std::string add_module(const TensorType& type) {
  std::string t = type.mlir();
  return "module @torchtpu attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
         "  func.func public @main(%a: " + t + ", %b: " + t + ") -> " + t + " {\n"
         "    %0 = \"stablehlo.add\"(%a, %b) : (" + t + ", " + t + ") -> " + t + "\n"
         "    \"func.return\"(%0) : (" + t + ") -> ()\n"
         "  }\n"
         "}\n";
}

}  // namespace

void init_pjrt(py::module_& m) {
  // Selects the PJRT runtime: the plugins to try in order, [(platform, path, fix command)].
  m.def("configure_pjrt", [](const std::vector<std::tuple<std::string, std::string, std::string>>& candidates,
                             int cpu_devices, int local_rank, int local_world_size, bool gpu_preallocate,
                             double gpu_memory_fraction) {
    PjrtRuntimeSettings settings;
    for (const auto& [platform, path, fix] : candidates) settings.candidates.push_back({platform, path, fix});
    settings.client = client_settings("", cpu_devices, local_rank, local_world_size, gpu_preallocate,
                                      gpu_memory_fraction, 0, 1);
    configure_pjrt_runtime(std::move(settings));
  }, py::arg("candidates"), py::arg("cpu_devices") = 1, py::arg("local_rank") = 0, py::arg("local_world_size") = 0,
     py::arg("gpu_preallocate") = false, py::arg("gpu_memory_fraction") = 0.0);

  // Which runtime serves the process and where it came from (starts it).
  m.def("runtime_info", [] {
    std::map<std::string, std::string> info;
    {
      py::gil_scoped_release release;  // the jaxlib runtime takes the GIL itself
      info = pjrt_runtime_selected() ? pjrt_runtime_info() : std::map<std::string, std::string>{};
      if (info.empty()) {
        info["runtime"] = "jaxlib";
        info["version"] = runtime().version();
      }
    }
    return info;
  });

  // The create options each platform's client gets (checked without a device by tests).
  m.def("pjrt_client_options", [](const std::string& platform, int cpu_devices, int local_rank, int local_world_size,
                                  bool gpu_preallocate, double gpu_memory_fraction, int node_id, int num_nodes) {
    std::vector<std::string> out;
    for (const PjrtOption& o : pjrt_client_options(client_settings(platform, cpu_devices, local_rank, local_world_size,
                                                                   gpu_preallocate, gpu_memory_fraction, node_id,
                                                                   num_nodes)))
      out.push_back(o.describe());
    return out;
  });
  m.def("pjrt_compile_options", [](const std::vector<int64_t>& device_ids, bool excess_precision,
                                   bool no_ynn_fusions) {
    return py::bytes(pjrt_compile_options(device_ids, excess_precision, no_ynn_fusions));
  }, py::arg("device_ids"), py::arg("excess_precision"), py::arg("no_ynn_fusions") = false);

  // jaxlib's custom-call handlers ({name: PyCapsule "xla._CUSTOM_CALL_TARGET"}), registered
  // with the PJRT plugin for `platform_name` ("Host" on CPU); returns how many.
  m.def("register_ffi_handlers", [](const py::dict& handlers, const std::string& platform_name) {
    int count = 0;
    for (auto item : handlers) {
      void* handler = PyCapsule_GetPointer(item.second.ptr(), "xla._CUSTOM_CALL_TARGET");
      if (!handler) throw py::error_already_set();
      std::string name = py::str(item.first);
      py::gil_scoped_release release;
      register_pjrt_ffi_handler(name, handler, platform_name);
      ++count;
    }
    return count;
  });

  // Whether the PJRT runtime serves this process (known before it starts).
  m.def("pjrt_selected", &pjrt_runtime_selected);
  static bool joined = false;
  m.def("pjrt_distributed_joined", [] { return joined; });
  // torch.distributed on cuda/tpu under the PJRT runtime: the plugin exchanges its ids
  // (NCCL's) through the job's c10d store. False when the runtime already started.
  m.def("join_distributed_pjrt", [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size) {
    auto get = [store](const std::string& key, int timeout_ms) {
      std::string prefixed = "torchtpu/pjrt/" + key;
      store->wait({prefixed}, std::chrono::milliseconds(timeout_ms));
      std::vector<uint8_t> value = store->get(prefixed);
      return std::string(value.begin(), value.end());
    };
    auto put = [store](const std::string& key, const std::string& value) {
      store->set("torchtpu/pjrt/" + key, std::vector<uint8_t>(value.begin(), value.end()));
    };
    joined = set_pjrt_distributed(rank, world_size, get, put);
    return joined;
  });

  // The launch path takes no GIL: this thread holds the GIL throughout (never releasing it)
  // while a native thread that never held it launches `launches` adds of t to itself and waits
  // for each. Returns how many finished within `timeout_s` (0 under a runtime that needs the
  // GIL: its thread finishes only once this call lets go).
  m.def("launches_while_gil_held", [](const at::Tensor& t, int launches, double timeout_s) {
    int device = t.device().index();
    BufferPtr buffer;
    ExecutablePtr exe;
    {
      py::gil_scoped_release release;
      buffer = Engine::get().materialize(value_of(t, device));
      CompileOptions options;
      options.device = device;
      exe = runtime().compile(add_module(buffer->type), options);
    }
    std::atomic<int> finished{0};
    std::thread worker([&] {
      for (int i = 0; i < launches; ++i) {
        std::vector<BufferPtr> out = Engine::get().launch(*exe, {buffer, buffer}, {buffer->type}, device, 0, {});
        runtime().wait(*out[0]);
        finished.fetch_add(1);
      }
    });
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (finished.load() < launches && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a C++ sleep: the GIL stays held
    int done = finished.load();
    {
      py::gil_scoped_release release;
      worker.join();
    }
    return done;
  });
}

}  // namespace torchtpu
