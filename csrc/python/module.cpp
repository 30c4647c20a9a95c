// The torchtpu._C extension module: initialisation and the engine's Python surface.
#include <pybind11/pybind11.h>
#include <frameobject.h>
#include <pybind11/stl.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "device/capture.h"
#include "device/export.h"
#include "device/generator.h"
#include "device/host_copies.h"
#include "device/explain.h"
#include "device/interop.h"
#include "device/kernel_overrides.h"
#include "device/kernels.h"
#include "device/memory.h"
#include "device/snapshot.h"
#include "device/storage.h"
#include "device/profiler.h"
#include "device/scan.h"
#include "device/tensor.h"
#include "distributed/backend.h"
#include "engine/engine.h"
#include "lowering/registry.h"
#include "lowering/stablehlo_call.h"
#include "runtime/jaxlib_runtime.h"

namespace py = pybind11;
using namespace torchtpu;

namespace torchtpu {
void init_buckets(py::module_& m);     // python/buckets.cpp
void init_cpu_kernel(py::module_& m);  // python/cpu_kernel.cpp
void init_pjrt(py::module_& m);        // python/pjrt.cpp
void init_spmd(py::module_& m);        // python/spmd.cpp
}  // namespace torchtpu

namespace {

// "file.py:12 in fn" for the innermost frame outside torch and torchtpu, or "".
std::string python_origin() {
  if (!Py_IsInitialized()) return "";
  py::gil_scoped_acquire gil;
  PyFrameObject* frame = PyEval_GetFrame();
  if (!frame) return "<no Python frame: autograd or another thread>";
  Py_INCREF(frame);
  std::string result;
  while (frame) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    std::string file = PyUnicode_AsUTF8(code->co_filename);
    bool internal = file.find("/torch/") != std::string::npos || file.find("/torchtpu/") != std::string::npos ||
                    file.rfind("<frozen", 0) == 0;
    if (!internal) {
      result = file + ":" + std::to_string(PyFrame_GetLineNumber(frame)) + " in " + PyUnicode_AsUTF8(code->co_name);
      Py_DECREF(code);
      Py_DECREF(frame);
      return result;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  return "<torch internals>";
}

void python_warn(const std::string& message) {
  if (!Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  if (PyErr_WarnEx(PyExc_UserWarning, message.c_str(), 1) != 0) {
    if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) throw py::error_already_set();  // Ctrl-C goes on
    PyErr_Clear();  // a warnings filter set to "error": the warning is not worth an exception
  }
}

// Waits (for the engine lock) with the GIL released if this thread holds it.
void without_gil(const std::function<void()>& wait) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    wait();
    PyEval_RestoreThread(state);
  } else {
    wait();
  }
}

// Whether `error` is a KeyboardInterrupt raised in Python code that C++ called: pybind11's
// error_already_set (jaxlib, hooks) or torch's python_error (Python kernels such as meta
// kernels). Reads only the exception's type, so it needs no GIL (callers may hold the
// engine lock).
bool is_keyboard_interrupt(const std::exception_ptr& error) {
  auto is_interrupt_type = [](PyObject* type) {
    return type && PyType_Check(type) &&
           PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type), reinterpret_cast<PyTypeObject*>(PyExc_KeyboardInterrupt));
  };
  try {
    std::rethrow_exception(error);
  } catch (const py::error_already_set& e) {
    return is_interrupt_type(e.type().ptr());
  } catch (const python_error& e) {
    return is_interrupt_type(e.type);
  } catch (...) {
    return false;
  }
}

// The lowered ops torch.compile keeps whole (torchtpu/compiler.py decomposes the others).
// Three backward ops with an output_mask are left out: their lowerings were registered
// under other names until they went through the generic kernel, so compile has always
// used PyTorch's decompositions of them (and the bucketing rules of _buckets.py follow
// those). Dropping this filter would let compile keep them whole, as eager mode does.
std::vector<std::string> compile_lowered_ops() {
  std::vector<std::string> names;
  for (const std::string& name : lowered_ops())
    if (name != "aten::native_layer_norm_backward" && name != "aten::native_group_norm_backward" &&
        name != "aten::native_batch_norm_backward")
      names.push_back(name);
  return names;
}

py::dict counters() {
  Metrics& m = Engine::get().metrics();
  py::dict d;
  d["ops_traced"] = m.ops_traced.load();
  d["graphs_compiled"] = m.graphs_compiled.load();
  d["cache_hits_memory"] = m.cache_hits_memory.load();
  d["cache_hits_disk"] = m.cache_hits_disk.load();
  d["executables_evicted"] = m.executables_evicted.load();
  d["compile_seconds"] = m.compile_seconds;
  d["execute_count"] = m.execute_count.load();
  d["bytes_to_device"] = m.bytes_to_device.load();
  d["bytes_to_host"] = m.bytes_to_host.load();
  d["downloads"] = m.downloads.load();
  d["recompilations"] = m.recompilations.load();
  d["donated_buffers"] = m.donated_buffers.load();
  py::dict fallbacks;
  {
    EngineLock lock;
    for (auto& [op, count] : m.fallback_ops) fallbacks[py::str(op)] = count;
  }
  d["fallback_ops"] = fallbacks;
  return d;
}

py::list recompilations() {
  py::list out;
  EngineLock lock;
  for (auto& r : Engine::get().metrics().recompilation_log) out.append(py::make_tuple(r.origin, r.reason));
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchtpu core: device, engine, lowerings and runtime";
  register_kernels();
  register_hooks();
  install_profiler_tracer();
  Engine::get().hooks().python_origin = python_origin;
  Engine::get().hooks().warn = python_warn;
  Engine::get().hooks().without_gil = without_gil;
  set_interrupt_test(is_keyboard_interrupt);
  // torch's python_error (a Python kernel's exception) raised out of a function of this
  // module is that Python exception again, KeyboardInterrupt included, not a RuntimeError.
  py::register_local_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (python_error& e) {
      e.restore();
    }
  });
  init_buckets(m);
  init_cpu_kernel(m);
  init_pjrt(m);
  init_spmd(m);

  m.def("configure", [](const std::string& platform, int cpu_devices, int local_rank, int local_world_size) {
    configure_runtime(platform, cpu_devices, ProcessLayout{local_rank, local_world_size});
  }, py::arg("platform"), py::arg("cpu_devices") = 1, py::arg("local_rank") = 0, py::arg("local_world_size") = 0);
  m.def("initialized", &runtime_initialized);
  m.def("in_bad_fork", &runtime_forked);
  m.def("check_not_forked", &check_not_forked);
  m.def("start", [] { runtime(); });
  // One empty backward per tpu device, made in C++ so that its graph task holds nothing whose
  // release needs the GIL (no Python object, no tpu buffer: the gradient lands in the leaf's
  // .grad, which this thread drops; a captured gradient would stay in the task's result):
  // returns once autograd's thread for each device has dropped every earlier graph task
  // (torchtpu/_exit.py says why).
  m.def("drain_autograd_threads", [](int64_t device_count) {
    py::gil_scoped_release no_gil;
    for (int64_t index = 0; index < device_count; ++index) {
      auto options = at::TensorOptions().device(c10::Device(c10::DeviceType::PrivateUse1, index));
      at::Tensor leaf = at::empty({0}, options).requires_grad_(true);
      torch::autograd::backward({leaf}, {at::empty({0}, options)});
    }
  });

  // ---- torch.distributed (torchtpu/distributed.py, csrc/distributed) ----------------------
  register_c10d_functionalization();
  m.def("release_collective_works", &release_collective_works);
  m.def("join_distributed", [](const std::string& address, int num_processes, int process_id, int init_timeout_s,
                               int heartbeat_timeout_s) {
    try {
      join_distributed(DistributedOptions{address, num_processes, process_id, init_timeout_s, heartbeat_timeout_s});
    } catch (const RuntimeAlreadyStarted&) {
      return false;
    }
    return true;
  });
  m.def("distributed_joined", &distributed_joined);
  m.def("set_collective_checks", &set_collective_checks);
  m.def("process_index", [] { return runtime().process_index(); });
  m.def("create_backend", [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             std::vector<int64_t> global_ranks, double timeout_s) {
    return make_tpu_backend(store, rank, size, std::move(global_ranks),
                            std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  });
  // ---- end of torch.distributed block -------------------------------------------------------
  // ---- TORCHTPU_EXPLAIN and torchtpu.explain() (device/explain.h) ----------------------------
  m.def("explain_print", [](std::vector<std::string> ops) {
    explain_print(std::move(ops), [](const std::string& line) {
      py::gil_scoped_acquire gil;
      py::module_::import("sys").attr("stderr").attr("write")(line + "\n");
    });
  });
  m.def("explain_start", &explain_start_collecting);
  m.def("explain_stop", [] {
    py::list out;
    for (const ExplainedRoute& r : explain_stop_collecting()) out.append(py::make_tuple(r.op, r.route, r.detail, r.count));
    return out;
  });
  m.def("explaining", &explaining);
  m.def("explain_route", [](const std::string& op, const std::string& route, const std::string& detail) {
    if (explaining()) report_route(op, route, detail);
  });
  // ---- kernels at dispatch keys every device goes through (torchtpu/_patches.py lists them) ---
  m.def("kernel_overrides", [] {
    py::list out;
    for (const KernelOverrideInfo& info : kernel_overrides()) {
      py::dict d;
      d["name"] = info.name;
      d["key"] = info.key;
      d["rule"] = info.rule;
      d["relation"] = override_relation(info.kind);
      d["ops"] = info.ops;
      d["active"] = info.active;
      out.append(d);
    }
    return out;
  });
  m.def("restore_kernel_override", &restore_kernel_override);
  m.def("check_kernel_override", [](const std::string& name, const std::string& op, const std::string& key,
                                    bool replaces) {
    check_kernel_override(name, op, c10::parseDispatchKey(key),
                          replaces ? OverrideKind::Replaces : OverrideKind::Adds);
  });
  m.def("platform", [] { return runtime().platform(); });
  m.def("runtime_version", [] { return runtime().version(); });
  m.def("device_count", [] { return device_count(); });
  m.def("current_device", [] { return current_device(); });
  m.def("set_device", [](int index) { set_current_device(index); });
  m.def("set_mode", [](const std::string& mode) { Engine::get().set_mode(parse_mode(mode)); },
        py::call_guard<py::gil_scoped_release>());
  m.def("get_mode", [] { return std::string(mode_name(Engine::get().mode())); });
  m.def("sync", [](bool wait, const std::string& reason) { translate_errors([&] { synchronize(wait, parse_flush_reason(reason)); }); },
        py::arg("wait") = false, py::arg("reason") = "sync", py::call_guard<py::gil_scoped_release>());
  m.def("pending_ops", [] { return Engine::get().pending_ops(); });
  m.def("counters", &counters);
  // torchtpu.profiler.trace: the attributes of the spans recorded meanwhile.
  m.def("start_span_log", &start_span_log);
  m.def("take_span_log", [] {
    py::list out;
    for (LoggedSpan& span : take_span_log()) {
      py::dict attributes;
      for (TraceAttribute& a : span.attributes)
        attributes[py::str(a.name)] = std::visit([](auto& v) { return py::cast(v); }, a.value);
      out.append(py::make_tuple(span.thread, span.name, attributes));
    }
    return out;
  });
  m.def("recompilations", &recompilations);
  m.def("reset_metrics", [] {
    Engine::get().reset_metrics();
    clear_fallback_warnings();
  }, py::call_guard<py::gil_scoped_release>());
  m.def("set_cache_dir", [](const std::string& dir) { Engine::get().set_cache_dir(dir); },
        py::call_guard<py::gil_scoped_release>());
  m.def("cache_dir", [] { return Engine::get().cache_dir(); });
  // Non-executable entries of the disk cache (torchtpu/_compile_cache.py): bytes or None.
  m.def("cache_load", [](const std::string& kind, const std::string& key) -> py::object {
    std::optional<std::string> data;
    {
      py::gil_scoped_release release;
      data = Engine::get().load_blob(kind, key);
    }
    if (!data) return py::none();
    return py::bytes(*data);
  });
  m.def("cache_store", [](const std::string& kind, const std::string& key, const py::bytes& payload) {
    std::string data = payload;
    py::gil_scoped_release release;
    return Engine::get().store_blob(kind, key, data);
  });
  m.def("cache_remove", [](const std::string& kind, const std::string& key) { Engine::get().remove_blob(kind, key); },
        py::call_guard<py::gil_scoped_release>());
  m.def("set_dump_dir", [](const std::string& dir) { Engine::get().set_dump_dir(dir); });
  m.def("set_executable_cache_size", [](int64_t n) { Engine::get().set_executable_cache_size(static_cast<size_t>(n)); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_corrupt_next_compile", [] { Engine::get().corrupt_next_compile(); });
  m.def("executable_cache_size", [] { return Engine::get().executable_cache_size(); });
  m.def("set_max_pending_ops", [](int64_t n) { Engine::get().set_max_pending_ops(n); });
  m.def("set_memory_fraction", [](int device, double fraction) {
    translate_errors([&] { Engine::get().set_memory_fraction(device, fraction); });
  });
  m.def("memory_budget", [](int device) { return translate_errors([&] { return Engine::get().memory_budget(device); }); });
  m.def("clear_memory_cache", [] { Engine::get().clear_memory_cache(); }, py::call_guard<py::gil_scoped_release>());
  m.def("set_fallback_policy", &set_fallback_policy);
  m.def("lowered_ops", &compile_lowered_ops);
  m.def("memory_allocated", [](int d) { return device_bytes_in_use(d); });
  m.def("max_memory_allocated", [](int d) { return device_bytes_peak(d); });
  m.def("reset_peak_memory", [](int d) { reset_device_bytes_peak(d); });
  // UntypedStorage.resize_ of a tpu storage (torchtpu/_patches.py "storage resize").
  m.def("resize_storage", [](py::handle storage, int64_t nbytes) {
    TORCH_CHECK_TYPE(THPStorage_Check(storage.ptr()), "resize_storage expects a torch.UntypedStorage");
    translate_errors([&] {
      resize_storage(THPStorage_Unpack(reinterpret_cast<THPStorage*>(storage.ptr())).unsafeGetStorageImpl(), nbytes);
    });
  });
  m.def("release_freed_alias", [](const at::Tensor& t) { release_freed_alias(t); });
  // torch.cuda.memory_stats' main keys, plus the platform allocator's own numbers ("device.*").
  m.def("memory_stats", [](int d) {
    MemoryStats s = memory_stats(d);
    py::dict out;
    out["allocated_bytes.all.current"] = s.allocated;
    out["allocated_bytes.all.peak"] = s.allocated_peak;
    out["reserved_bytes.all.current"] = s.reserved;
    out["reserved_bytes.all.peak"] = s.reserved_peak;
    for (auto& [key, value] : s.platform) out[py::str("device." + key)] = value;
    return out;
  });
  m.def("mem_get_info", [](int d) { return memory_info(d); });
  // torch.Event.elapsed_time accepts only exact torch.Event objects; torch.tpu.Event (a
  // subclass) times through the same c10::Event, with the device guard's clock.
  m.def("event_elapsed_time", [](py::handle start, py::handle end) {
    TORCH_CHECK_TYPE(THPEvent_Check(start.ptr()) && THPEvent_Check(end.ptr()), "expected torch.Event objects");
    const c10::Event& a = reinterpret_cast<THPEvent*>(start.ptr())->event;
    const c10::Event& b = reinterpret_cast<THPEvent*>(end.ptr())->event;
    py::gil_scoped_release release;
    return a.elapsedTime(b);
  });
  m.def("device_kind", [](int d) {
    check_device_index(d);
    return runtime().device_kind(d);
  });
  m.def("manual_seed", [](int d, uint64_t seed) {
    at::Generator gen = default_generator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  });
  m.def("initial_seed", [](int d) { return default_generator(d).current_seed(); });
  m.def("default_generator", [](int d) { return default_generator(d); });

  // ---- JAX interop (torchtpu/jax.py) -------------------------------------------------------
  m.def("to_jax", [](const at::Tensor& t) {
    _object* array;
    {
      py::gil_scoped_release release;  // a flush may run; the runtime takes the GIL itself
      array = tensor_to_jax(t);
    }
    return py::reinterpret_steal<py::object>(array);
  });
  m.def("from_jax", [](const py::object& array) {
    py::gil_scoped_release release;
    return tensor_from_jax(array.ptr());
  });
  // Registers a StableHLO module (text) for calls; returns its key.
  m.def("register_stablehlo", [](const std::string& name, const std::string& text) {
    try {
      return register_stablehlo_module(name, text);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  // Result types of a registered module: [(shape, dtype code)].
  m.def("stablehlo_results", [](const std::string& key) {
    py::list out;
    for (const TensorType& t : registered_stablehlo_module(key).results)
      out.append(py::make_tuple(t.shape, static_cast<int>(t.dtype)));
    return out;
  });
  m.def("call_stablehlo", [](const std::string& key, const std::vector<at::Tensor>& inputs) {
    py::gil_scoped_release release;
    return call_stablehlo(key, inputs);
  });

  // ---- optimizer steps as transactions (device/snapshot.h, torchtpu/_patches.py) ----------
  py::class_<ValueSnapshot>(m, "_ValueSnapshot");
  m.def("take_snapshot", [](const py::sequence& items) {
    std::vector<at::Tensor> tensors;
    for (const py::handle& item : items) tensors.push_back(THPVariable_Unpack(item.ptr()));
    return translate_errors([&] { return take_snapshot(tensors); });
  });
  m.def("restore_snapshot", [](const ValueSnapshot& s) { return translate_errors([&] { return restore_snapshot(s); }); });

  // ---- torch.compile: captured graphs (device/capture.h, torchtpu/compiler.py) ----------
  struct CaptureHandle {
    CapturePtr capture;
  };
  py::class_<CaptureHandle>(m, "_Capture")
      .def("__repr__", [](const CaptureHandle& h) { return describe_capture(*h.capture); });
  // FX inputs/outputs as tensors; an undefined tensor stands for each non-tensor item.
  static auto tensors_of = [](const py::sequence& items) {
    std::vector<at::Tensor> out;
    out.reserve(items.size());
    for (const py::handle& item : items)
      out.push_back(THPVariable_Check(item.ptr()) ? THPVariable_Unpack(item.ptr()) : at::Tensor());
    return out;
  };
  m.def("capture_begin", [](const py::sequence& inputs) {
    auto tensors = tensors_of(inputs);
    py::gil_scoped_release release;
    capture_begin(tensors);
  });
  m.def("capture_abort", &capture_abort);
  m.def("capture_end", [](const py::sequence& inputs, const py::sequence& outputs,
                          const std::vector<std::pair<int, int>>& updates, const std::vector<int>& vouched) -> py::object {
    auto ins = tensors_of(inputs), outs = tensors_of(outputs);
    CapturePtr capture;
    {
      py::gil_scoped_release release;
      capture = capture_end(ins, outs, updates, vouched);
    }
    if (!capture) return py::none();
    std::vector<at::Tensor> first;
    {
      py::gil_scoped_release release;
      first = take_first_outputs(*capture, ins);
    }
    py::list result(first.size());
    for (size_t i = 0; i < first.size(); ++i) result[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(first[i]));
    return py::make_tuple(py::cast(CaptureHandle{capture}), result);
  }, py::arg("inputs"), py::arg("outputs"), py::arg("updates"), py::arg("vouched") = std::vector<int>{});
  // The FX outputs (None for non-tensor ones), or None when the inputs do not fit.
  m.def("run_captured", [](const CaptureHandle& handle, const py::sequence& inputs) -> py::object {
    auto ins = tensors_of(inputs);
    std::optional<std::vector<at::Tensor>> outs;
    {
      py::gil_scoped_release release;
      outs = run_captured(*handle.capture, ins);
    }
    if (!outs) return py::none();
    py::list result(outs->size());
    for (size_t i = 0; i < outs->size(); ++i) result[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap((*outs)[i]));
    return std::move(result);
  });
  m.def("capture_stats", [] {
    CaptureStats s = capture_stats();
    py::dict d;
    d["captures"] = s.captures;
    d["uncapturable"] = s.uncapturable;
    d["replays"] = s.replays;
    d["misses"] = s.misses;
    return d;
  });
  // ---- end of torch.compile block ---------------------------------------------------------

  // ---- torchtpu.export (device/export.h, torchtpu/export.py) -------------------------------
  m.def("export_begin", &export_begin, py::call_guard<py::gil_scoped_release>());
  m.def("export_end", [](const py::sequence& weights, const py::sequence& inputs, const py::sequence& outputs) {
    auto w = tensors_of(weights), i = tensors_of(inputs), o = tensors_of(outputs);
    ExportedGraph graph;
    {
      py::gil_scoped_release release;
      graph = export_end(w, i, o);
    }
    py::list constants;
    for (const at::Tensor& t : graph.constants) constants.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(t)));
    return py::make_tuple(graph.text, constants);
  });

  // ---- structured loops (device/scan.h, torchtpu/scan.py) ------------------------------------
  py::class_<Subgraph, std::shared_ptr<Subgraph>>(m, "_ScanBody")
      .def("__repr__", [](const Subgraph& b) {
        return "<scan body: " + std::to_string(b.inputs.size()) + " inputs, " + std::to_string(b.captured.size()) +
               " captured, " + std::to_string(b.nodes.size()) + " ops, " + std::to_string(b.outputs.size()) +
               " outputs>";
      });
  m.def("scan_body_begin", &scan_body_begin, py::call_guard<py::gil_scoped_release>());
  m.def("scan_body_abort", &scan_body_abort, py::call_guard<py::gil_scoped_release>());
  m.def("scan_body_input", [](const std::vector<int64_t>& shape, at::ScalarType dtype, int device) {
    return scan_body_input(shape, dtype, device);
  });
  m.def("scan_body_end", [](const std::vector<at::Tensor>& outputs) {
    return std::const_pointer_cast<Subgraph>(scan_body_end(outputs));
  }, py::call_guard<py::gil_scoped_release>());
  m.def("scan", [](const std::shared_ptr<Subgraph>& body, const std::vector<at::Tensor>& carry,
                   const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& consts, int64_t length,
                   bool reverse) { return scan(body, carry, xs, consts, length, reverse); },
        py::call_guard<py::gil_scoped_release>());
}
