// Structured loops on tpu tensors: body tracing and the torchtpu::scan op (see scan.h).
#include "device/scan.h"

#include "device/tensor.h"
#include "engine/engine.h"

namespace torchtpu {

void scan_body_begin() { Engine::get().begin_body(); }

void scan_body_abort() { Engine::get().abort_body(); }

at::Tensor scan_body_input(const std::vector<int64_t>& shape, c10::ScalarType dtype, int device) {
  ValuePtr value = Engine::get().body_input(TensorType{shape, to_dtype(dtype)}, device);
  return wrap_for_user(make_tensor(std::move(value)));
}

std::shared_ptr<const Subgraph> scan_body_end(const std::vector<at::Tensor>& outputs) {
  std::vector<ValuePtr> values;
  for (const at::Tensor& t : outputs) {
    TORCH_CHECK_VALUE(is_tpu(t), "torchtpu.scan_layers: the layer returned a tensor that is not on tpu");
    values.push_back(value_of(t, t.device().index()));
  }
  return Engine::get().end_body(values);
}

namespace {

void check_type(const char* what, size_t index, const TensorType& got, const TensorType& expected) {
  TORCH_CHECK_VALUE(got == expected, "torchtpu.scan_layers: ", what, " ", index, " is ", got.str(),
                    " but the traced layer expects ", expected.str());
}

}  // namespace

std::vector<at::Tensor> scan(const std::shared_ptr<const Subgraph>& body, const std::vector<at::Tensor>& carry,
                             const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& consts,
                             int64_t length, bool reverse) {
  const size_t n_carry = carry.size(), n_xs = xs.size();
  TORCH_CHECK_VALUE(body->inputs.size() == n_carry + n_xs + consts.size() && body->outputs.size() >= n_carry,
                    "torchtpu.scan_layers: the traced layer does not fit the loop's inputs");
  TORCH_CHECK_VALUE(length > 0, "torchtpu.scan_layers: a loop needs at least one step");
  int device = carry.empty() ? current_device() : static_cast<int>(carry[0].device().index());
  std::vector<ValuePtr> operands;
  std::vector<int> indices;
  auto add = [&](const at::Tensor& t) {
    indices.push_back(static_cast<int>(operands.size()));
    operands.push_back(value_of(t, device));
  };
  for (size_t k = 0; k < n_carry; ++k) {
    add(carry[k]);
    check_type("carry", k, operands.back()->type, body->inputs[k]->type);
    check_type("layer output", k, body->outputs[k]->type, body->inputs[k]->type);
  }
  for (size_t k = 0; k < n_xs; ++k) {
    add(xs[k]);
    TensorType row = operands.back()->type;
    TORCH_CHECK_VALUE(row.rank() >= 1 && row.shape[0] == length, "torchtpu.scan_layers: stacked input ", k,
                      " has type ", row.str(), "; expected ", length, " rows");
    row.shape.erase(row.shape.begin());
    check_type("row of stacked input", k, row, body->inputs[n_carry + k]->type);
  }
  for (size_t k = 0; k < consts.size(); ++k) {
    add(consts[k]);
    check_type("extra input", k, operands.back()->type, body->inputs[n_carry + n_xs + k]->type);
  }
  for (const ValuePtr& v : body->captured) {
    indices.push_back(static_cast<int>(operands.size()));
    operands.push_back(v);
  }
  std::vector<TensorType> outputs;
  for (size_t k = 0; k < body->outputs.size(); ++k) {
    TensorType t = body->outputs[k]->type;
    if (k >= n_carry) t.shape.insert(t.shape.begin(), length);
    outputs.push_back(t);
  }
  Arg all;
  all.kind = Arg::Kind::TensorList;
  all.operands = indices;
  std::vector<Arg> args = {Arg::integer(static_cast<int64_t>(n_carry)), Arg::integer(static_cast<int64_t>(n_xs)),
                           Arg::integer(length), Arg::boolean(reverse), all};
  static const OpKind kind = OpKind::intern("torchtpu::scan");
  std::vector<ValuePtr> results =
      Engine::get().record(kind, std::move(args), std::move(operands), std::move(outputs), device, body);
  std::vector<at::Tensor> tensors;
  for (ValuePtr& v : results) tensors.push_back(wrap_for_user(make_tensor(std::move(v))));
  return tensors;
}

}  // namespace torchtpu
