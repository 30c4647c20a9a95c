// The engine's bucket runner (engine/buckets.h) in Python: a fused flush that differs from an
// earlier one only in sizes goes to torchtpu/_fused_buckets.py, which records it padded.
#include <pybind11/complex.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "device/tensor.h"
#include "engine/engine.h"

namespace py = pybind11;

namespace torchtpu {
namespace {

py::object expr_to_py(const SizeExpr& e) {
  if (!e.symbolic()) return py::int_(e.offset);
  return py::make_tuple(e.coeff, e.a, e.b, e.offset);  // coeff * s[a] * s[b] + offset
}

py::list exprs_to_py(const std::vector<SizeExpr>& exprs) {
  py::list out;
  for (const SizeExpr& e : exprs) out.append(expr_to_py(e));
  return out;
}

// Tuples, so that Python can key its per-layout work on them (a decode step's cache comes
// with the same layout on every flush).
py::object layout_to_py(const LayoutSpec& layout) {
  if (layout.empty()) return py::none();
  py::tuple dims(layout.size());
  for (size_t d = 0; d < layout.size(); ++d) {
    py::tuple factors(layout[d].size());
    for (size_t i = 0; i < layout[d].size(); ++i) {
      const FactorSpec& f = layout[d][i];
      factors[i] = py::make_tuple(f.bucket, f.symbol, f.offset);
    }
    dims[d] = factors;
  }
  return dims;
}

LayoutSpec layout_from_py(const py::handle& h) {
  LayoutSpec layout;
  if (h.is_none()) return layout;
  for (const py::handle& dim : h) {
    std::vector<FactorSpec> factors;
    for (const py::handle& f : dim) {
      auto t = f.cast<py::tuple>();
      factors.push_back({t[0].cast<int64_t>(), t[1].cast<int>(), t[2].cast<int64_t>()});
    }
    layout.push_back(std::move(factors));
  }
  return layout;
}

// A lifted argument's value as Python passes it to the op.
py::object scalar_to_py(const Arg& a) {
  switch (a.kind) {
    case Arg::Kind::Int: return py::int_(a.i);
    case Arg::Kind::Double: return py::float_(a.d);
    case Arg::Kind::Bool: return py::bool_(a.i != 0);
    case Arg::Kind::IntList: return py::cast(a.ints);
    case Arg::Kind::DoubleList: return py::cast(a.doubles);
    case Arg::Kind::BoolList: {
      py::list out;
      for (int64_t v : a.ints) out.append(py::bool_(v != 0));
      return out;
    }
    default: return py::none();
  }
}

// One argument of an op: (kind, payload) with sizes as expressions (see _fused_buckets.py).
py::tuple arg_to_py(const Arg& a, const std::vector<SizeExpr>& ints, int scalar) {
  if (scalar >= 0) return py::make_tuple("scalar", scalar);
  switch (a.kind) {
    case Arg::Kind::None: return py::make_tuple("none", py::none());
    case Arg::Kind::Tensor: return py::make_tuple("tensor", a.operands[0]);
    case Arg::Kind::TensorList: return py::make_tuple("tensors", py::cast(a.operands));
    case Arg::Kind::Int: return py::make_tuple("int", expr_to_py(ints.at(0)));
    case Arg::Kind::IntList: return py::make_tuple("ints", exprs_to_py(ints));
    case Arg::Kind::Double: return py::make_tuple("float", a.d);
    case Arg::Kind::Bool: return py::make_tuple("bool", a.i != 0);
    case Arg::Kind::DoubleList: return py::make_tuple("floats", py::cast(a.doubles));
    case Arg::Kind::BoolList: {
      py::list out;
      for (int64_t v : a.ints) out.append(py::bool_(v != 0));
      return py::make_tuple("bools", out);
    }
    case Arg::Kind::String: return py::make_tuple("str", a.s);
    case Arg::Kind::Complex: return py::make_tuple("complex", py::cast(std::complex<double>(a.doubles[0], a.doubles[1])));
  }
  return py::make_tuple("none", py::none());
}

py::dict describe_to_py(const SymbolicGraph& g) {
  py::dict d;
  d["first_values"] = py::cast(g.first_values);
  py::list params;
  for (size_t p = 0; p < g.params.size(); ++p) params.append(py::make_tuple(exprs_to_py(g.params[p]), layout_to_py(g.param_layouts[p])));
  d["params"] = params;
  py::list ops;
  for (const SymbolicGraph::Op& op : g.ops) {
    const Node& node = *op.node;
    py::list args, operands, outputs;
    for (size_t a = 0; a < node.args.size(); ++a) args.append(arg_to_py(node.args[a], op.ints[a], op.scalar[a]));
    for (const auto& r : op.operands) operands.append(py::make_tuple(r.node, r.index));
    for (size_t o = 0; o < node.outputs.size(); ++o)
      outputs.append(py::make_tuple(dtype_name(node.outputs[o].dtype), exprs_to_py(op.outputs[o])));
    ops.append(py::make_tuple(node.op.name(), args, operands, outputs));
  }
  d["ops"] = ops;
  py::list roots;
  for (const auto& r : g.roots) roots.append(py::make_tuple(r.node, r.index));
  d["roots"] = roots;
  return d;
}

// A Python number stored as a 0-d tensor (x * 0.5 records the 0.5 as an uploaded tensor).
py::object number_of(const ValuePtr& v) {
  at::Scalar s = download(v).item();
  if (s.isBoolean()) return py::bool_(s.toBool());
  if (s.isIntegral(false)) return py::int_(s.toLong());
  return py::float_(s.toDouble());
}

at::Tensor tensor_of(ValuePtr v) { return wrap_for_user(make_tensor(std::move(v))); }

BucketRun run_in_python(BucketRequest& request) {
  py::gil_scoped_acquire gil;
  BucketRun run;
  py::object result;
  {
    py::list params, layouts, scalars;
    for (size_t p = 0; p < request.params.size(); ++p) {
      const ValuePtr& v = request.params[p];  // a value computed padded comes as its padded buffer
      if (request.number_params[p]) {
        params.append(number_of(v));
      } else {
        params.append(py::cast(tensor_of(v)));
      }
      layouts.append(layout_to_py(request.param_layouts[p]));
    }
    for (const Arg* a : request.scalars) scalars.append(scalar_to_py(*a));
    py::cpp_function describe([&request]() { return describe_to_py(request.describe()); });
    py::module_ runner = py::module_::import("torchtpu._fused_buckets");
    result = runner.attr("run")(request.structure, request.device, py::cast(request.symbols), params, layouts,
                                scalars, describe, py::cast(request.donatable));
  }
  if (py::isinstance<py::str>(result)) {
    run.refused = result.cast<std::string>();
    return run;
  }
  auto answer = result.cast<py::tuple>();  // (bucket, outputs, layouts)
  run.bucket = answer[0].cast<std::vector<int64_t>>();
  for (const py::handle& t : answer[1]) run.outputs.push_back(value_of(t.cast<at::Tensor>(), request.device));
  for (const py::handle& l : answer[2]) run.layouts.push_back(layout_from_py(l));
  return run;
}

py::list bucket_summaries() {
  py::list out;
  for (const BucketSummary& s : Engine::get().bucket_summaries()) {
    py::dict d;
    d["origin"] = s.origin;
    d["ops"] = s.ops;
    d["padded_runs"] = s.padded_runs;
    d["exact_graphs"] = s.exact_graphs;
    d["buckets"] = py::cast(s.buckets);
    d["exact_reason"] = s.exact_reason;
    out.append(d);
  }
  return out;
}

}  // namespace

void init_buckets(py::module_& m) {
  Engine::get().hooks().run_bucketed = run_in_python;
  m.def("bucket_summaries", &bucket_summaries,
        "Fused graphs seen at several sizes: padded runs, buckets, exact-size graphs and why");
}

}  // namespace torchtpu
