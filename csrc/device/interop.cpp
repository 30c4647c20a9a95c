// JAX interop for tpu tensors (see interop.h).
#include "device/interop.h"

#include "device/kernels.h"
#include "engine/engine.h"
#include "lowering/stablehlo_call.h"
#include "runtime/jaxlib_runtime.h"

namespace torchtpu {

_object* tensor_to_jax(const at::Tensor& t) {
  TORCH_CHECK(is_tpu(t), "torchtpu.to_jax expects a tpu tensor, got a tensor on ", t.device());
  // A tpu tensor's value holds its elements in logical (row-major) order, views included.
  ValuePtr value = value_of(t, t.device().index());
  BufferPtr buffer = Engine::get().materialize(value);
  buffer->shared_outside = true;
  return jax_array_of(buffer);
}

at::Tensor tensor_from_jax(_object* array) {
  BufferPtr buffer = translate_errors([&] { return buffer_of_jax_array(array); });
  buffer->shared_outside = true;
  return wrap_for_user(make_tensor(Engine::get().from_buffer(std::move(buffer))));
}

std::vector<at::Tensor> call_stablehlo(const std::string& key, const std::vector<at::Tensor>& inputs) {
  return translate_errors([&] {
    static const OpKind op = OpKind::intern(kCallStablehlo);
    const ImportedModule& module = registered_stablehlo_module(key);
    std::vector<c10::IValue> args(inputs.begin(), inputs.end());
    int device = device_of_args(args);
    check_device_index(device);
    Arg list;
    list.kind = Arg::Kind::TensorList;
    std::vector<ValuePtr> operands;
    for (const at::Tensor& t : inputs) {
      TORCH_CHECK(t.defined(), "torchtpu: ", key, " got an undefined tensor");
      list.operands.push_back(static_cast<int>(operands.size()));
      operands.push_back(value_of(t, device));
    }
    Arg name;
    name.kind = Arg::Kind::String;
    name.s = key;
    std::vector<ValuePtr> values = Engine::get().record(op, {list, name}, std::move(operands), module.results, device);
    std::vector<at::Tensor> out;
    out.reserve(values.size());
    for (ValuePtr& v : values) out.push_back(wrap_for_user(make_tensor(std::move(v))));
    return out;
  });
}

}  // namespace torchtpu
