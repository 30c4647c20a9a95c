// The CPU fallback for tpu kernels written in Python (torchtpu/_linalg.py): a call they
// decline goes through the same counted path as the C++ kernels' (device/cpu_fallback.cpp:
// CPU's error, or a fallback counted, warned and subject to TORCHTPU_FALLBACK).
#include <pybind11/pybind11.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include "device/explain.h"
#include "device/kernels.h"

namespace py = pybind11;

namespace torchtpu {

void init_cpu_kernel(py::module_& m) {
  // cpu_kernel_decides("aten::linalg_qr", "", "why the kernel declines", *args, **kwargs): the
  // op's CPU kernel on host copies of the arguments; its results on the tpu device, or its error.
  m.def("cpu_kernel_decides", [](const std::string& name, const std::string& overload, const std::string& reason,
                                 py::args args, py::kwargs kwargs) {
    c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
    torch::jit::Stack stack = torch::jit::createStackForSchema(op.schema(), args, kwargs, std::nullopt);
    {
      py::gil_scoped_release no_gil;
      declined(reason.c_str());  // for TORCHTPU_EXPLAIN
      translate_errors([&] { cpu_kernel_decides(op, &stack); });
    }
    return torch::jit::createPyObjectForStack(std::move(stack));
  });
}

}  // namespace torchtpu
