// torchtpu._C's single-process SPMD surface (torchtpu/spmd.py): meshes, sharding tensors,
// reading a tensor's layout and shards.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "device/spmd.h"

namespace py = pybind11;

namespace torchtpu {

void init_spmd(py::module_& m) {
  py::class_<Mesh, std::shared_ptr<Mesh>>(m, "_Mesh")
      .def(py::init([](std::vector<int> devices, std::vector<int64_t> shape, std::vector<std::string> names) {
        auto mesh = std::make_shared<Mesh>();
        mesh->devices = std::move(devices);
        mesh->shape = std::move(shape);
        mesh->axis_names = std::move(names);
        return mesh;
      }))
      .def_property_readonly("devices", [](const Mesh& mesh) { return mesh.devices; })
      .def("describe", &Mesh::describe);
  // A sharding as a dict: mesh devices, tiles per dimension, replicas, tile assignment, XLA's text.
  auto describe = [](const ShardingPtr& s) -> py::object {
    if (!s) return py::none();
    py::dict d;
    d["devices"] = s->mesh->devices;
    d["tiles"] = s->tiles;
    d["replicas"] = s->replicas;
    d["tile_assignment"] = s->tile_assignment;
    d["hlo"] = s->hlo();
    return d;
  };
  m.def("spmd_shard", [](const at::Tensor& t, const std::shared_ptr<Mesh>& mesh, std::vector<int64_t> tiles,
                         int64_t replicas, std::vector<int> tile_assignment) {
    auto sharding = std::make_shared<Sharding>();
    sharding->mesh = mesh;
    sharding->tiles = std::move(tiles);
    sharding->replicas = replicas;
    sharding->tile_assignment = std::move(tile_assignment);
    py::gil_scoped_release release;
    return shard_tensor(t, sharding);
  });
  m.def("spmd_sharding", [describe](const at::Tensor& t) {
    ShardingPtr s;
    {
      py::gil_scoped_release release;
      s = sharding_of(t);
    }
    return describe(s);
  });
  m.def("spmd_mesh_devices", [](const at::Tensor& t) -> py::object {
    MeshPtr mesh = mesh_of(t);
    if (!mesh) return py::none();
    return py::cast(mesh->devices);
  });
  m.def("spmd_shards", [](const at::Tensor& t) {
    py::gil_scoped_release release;
    return shards_of(t);
  });
}

}  // namespace torchtpu
