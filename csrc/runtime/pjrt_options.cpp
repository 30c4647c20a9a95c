// Create options and CompileOptionsProto bytes for PJRT plugins (see pjrt_options.h).
#include "runtime/pjrt_options.h"

#include <sstream>

namespace torchtpu {
namespace {

// Protocol-buffer wire format, the little of it a CompileOptionsProto needs.
void varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}
void varint_field(std::string& out, int field, uint64_t value) {
  varint(out, static_cast<uint64_t>(field) << 3);  // wire type 0
  varint(out, value);
}
void bytes_field(std::string& out, int field, const std::string& bytes) {
  varint(out, (static_cast<uint64_t>(field) << 3) | 2);  // wire type 2: length-delimited
  varint(out, bytes.size());
  out += bytes;
}

}  // namespace

std::string PjrtOption::describe() const {
  std::ostringstream out;
  out << name << "=";
  if (auto* s = std::get_if<std::string>(&value)) out << *s;
  else if (auto* i = std::get_if<int64_t>(&value)) out << *i;
  else if (auto* f = std::get_if<float>(&value)) out << *f;
  else if (auto* b = std::get_if<bool>(&value)) out << (*b ? "true" : "false");
  else {
    const auto& list = std::get<std::vector<int64_t>>(value);
    out << "[";
    for (size_t k = 0; k < list.size(); ++k) out << (k ? "," : "") << list[k];
    out << "]";
  }
  return out.str();
}

std::vector<PjrtOption> pjrt_client_options(const PjrtClientSettings& settings) {
  std::vector<PjrtOption> options;
  if (settings.platform == "cpu") {
    options.push_back({"cpu_device_count", int64_t{settings.cpu_device_count < 1 ? 1 : settings.cpu_device_count}});
  } else if (settings.platform == "cuda") {
    options.push_back({"preallocate", settings.gpu_preallocate});
    if (settings.gpu_memory_fraction > 0)
      options.push_back({"memory_fraction", static_cast<float>(settings.gpu_memory_fraction)});
    if (settings.layout.local_world_size > 0)
      options.push_back({"visible_devices", std::vector<int64_t>{settings.layout.local_rank}});
    if (settings.num_nodes > 1) {
      options.push_back({"node_id", int64_t{settings.node_id}});
      options.push_back({"num_nodes", int64_t{settings.num_nodes}});
    }
  }
  return options;
}

std::string pjrt_compile_options(const std::vector<int64_t>& device_ids, bool excess_precision,
                                 bool no_ynn_fusions) {
  // DeviceAssignmentProto: replica_count 1, computation_count 2, computation_devices 3
  // (ComputationDevice: replica_device_ids 1, packed).
  std::string ids;
  for (int64_t id : device_ids) varint(ids, static_cast<uint64_t>(id));
  std::string computation;
  bytes_field(computation, 1, ids);
  std::string assignment;
  varint_field(assignment, 1, device_ids.size());
  varint_field(assignment, 2, 1);
  bytes_field(assignment, 3, computation);
  // ExecutableBuildOptionsProto: num_replicas 4, num_partitions 5, device_assignment 9.
  std::string build;
  varint_field(build, 4, device_ids.size());
  varint_field(build, 5, 1);
  bytes_field(build, 9, assignment);
  // CompileOptionsProto: executable_build_options 3, env_option_overrides 7 (a map entry:
  // key 1, value 2 = OptionOverrideProto, a oneof of string_field 1 and bool_field 2).
  std::string out;
  bytes_field(out, 3, build);
  auto add_override = [&out](const std::string& name, const std::string& override_value) {
    std::string entry;
    bytes_field(entry, 1, name);
    bytes_field(entry, 2, override_value);
    bytes_field(out, 7, entry);
  };
  auto override_flag = [&add_override](const std::string& name, bool value) {
    std::string override_value;
    varint_field(override_value, 2, value ? 1 : 0);
    add_override(name, override_value);
  };
  override_flag("xla_allow_excess_precision", excess_precision);
  for (const auto& [name, value] : kFixedXlaOptions) override_flag(name, value);
  if (no_ynn_fusions) {
    std::string empty_string;  // string_field "" (a oneof member is written even when empty)
    bytes_field(empty_string, 1, "");
    add_override("xla_cpu_experimental_ynn_fusion_type", empty_string);
  }
  return out;
}

}  // namespace torchtpu
