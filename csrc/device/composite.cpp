// What PyTorch's composite kernels issue below functionalization, on inner tensors: view
// ops (a view that reads from and writes through to its root), in-place and out= ops (the
// functional op, then a store into the written arguments), and foreach ops without a
// lowering of their own (the op on each element).
#include <ATen/FunctionalTensorWrapper.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "device/kernels.h"

namespace torchtpu {

// View ops on inner tensors (PyTorch's composite kernels call them below
// functionalization): the result is a TpuTensorImpl that reads from and writes through to
// its root (see TpuTensorImpl::become_view).
bool is_view_op(const c10::FunctionSchema& schema) {
  if (schema.returns().empty() || schema.arguments().empty()) return false;
  const auto* ret = schema.returns()[0].alias_info();
  const auto* arg = schema.arguments()[0].alias_info();
  return ret && !ret->isWrite() && arg && !arg->isWrite();
}

bool is_inplace_view_op(const std::string& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::transpose_", "aten::t_", "aten::unsqueeze_", "aten::squeeze_", "aten::squeeze_.dim",
      "aten::squeeze_.dims", "aten::as_strided_", "aten::swapdims_", "aten::swapaxes_"};
  return ops.count(name) > 0;
}

bool record_raw_view(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool inplace) {
  const auto& schema = op.schema();
  size_t n = schema.arguments().size();
  std::vector<c10::IValue> args(stack->end() - n, stack->end());
  if (!args[0].isTensor() || !is_tpu(args[0].toTensor())) return false;
  at::Tensor self = args[0].toTensor();
  if (at::functionalization::impl::isFunctionalTensor(self)) return false;
  auto* self_impl = dynamic_cast<TpuTensorImpl*>(self.unsafeGetTensorImpl());
  if (!self_impl) return false;
  torch::jit::Stack meta;
  for (const auto& a : args) meta.push_back(to_meta(a));
  try {
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception&) {
    rethrow_if_interrupt();
    return false;
  }
  std::vector<at::Tensor> views;
  for (const auto& r : meta) {
    if (r.isTensor()) views.push_back(r.toTensor());
    else if (r.isTensorList()) for (const at::Tensor& t : r.toTensorList()) views.push_back(t);
    else return false;
  }
  for (const auto& v : views)
    if (v.scalar_type() != self.scalar_type()) return false;  // dtype views stay on CPU
  c10::intrusive_ptr<TpuTensorImpl> root = c10::intrusive_ptr<TpuTensorImpl>::reclaim_copy(self_impl);
  if (root->view_of()) root = root->view_of()->root;
  auto make_view = [&](const at::Tensor& m) {
    auto impl = c10::make_intrusive<TpuTensorImpl>(root->value(), self.device());
    impl->become_view(root, m.sizes().vec(), m.strides().vec(), m.storage_offset());
    return at::Tensor(std::move(impl));
  };
  if (inplace) {
    self_impl->become_view(root, views[0].sizes().vec(), views[0].strides().vec(), views[0].storage_offset());
    torch::jit::drop(*stack, n);
    stack->push_back(self);
    return true;
  }
  torch::jit::drop(*stack, n);
  const auto& ret_type = schema.returns()[0].type();
  if (ret_type->kind() == c10::TypeKind::ListType) {
    c10::List<at::Tensor> list;
    for (const auto& v : views) list.push_back(make_view(v));
    stack->push_back(std::move(list));
  } else {
    stack->push_back(make_view(views[0]));
  }
  return true;
}

namespace {

bool name_is(const c10::FunctionSchema& schema, const char* name, const char* overload) {
  return schema.name() == name && schema.overload_name() == overload;
}

// The functional op of an in-place (add_) or out= (add.out) op, if it has a lowering.
std::optional<c10::OperatorHandle> functional_counterpart(const c10::FunctionSchema& schema, bool inplace) {
  std::string base = schema.name();
  std::string overload = schema.overload_name();
  std::vector<std::string> candidates;
  if (inplace) {
    base.pop_back();
    candidates = {overload};
    if (base == "aten::normal") return c10::Dispatcher::singleton().findOp({"aten::normal_functional", ""});
  } else if (overload == "out") {
    candidates = {"", "Tensor", "default"};
  } else if (name_is(schema, "aten::arange", "start_out")) {
    candidates = {"start_step"};  // the one out= form whose functional overload is named otherwise
  } else if (overload.size() > 4 && overload.compare(overload.size() - 4, 4, "_out") == 0) {
    candidates = {overload.substr(0, overload.size() - 4)};
  } else {
    return std::nullopt;
  }
  for (const auto& o : candidates) {
    std::string full = o.empty() ? base : base + "." + o;
    if (!find_lowering(full)) continue;
    if (auto handle = c10::Dispatcher::singleton().findOp({base, o})) return handle;
  }
  return std::nullopt;
}

}  // namespace

// An in-place or out= op on inner tensors (PyTorch's composite kernels issue these on fresh
// tensors below functionalization): run the functional op, then store into the written args.
bool record_mutable(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  bool inplace = !schema.name().empty() && schema.name().back() == '_' && !arguments.empty() &&
                 arguments[0].alias_info() && arguments[0].alias_info()->isWrite();
  auto functional = functional_counterpart(schema, inplace);
  if (!functional) return false;
  size_t n = arguments.size();
  std::vector<c10::IValue> args(stack->end() - n, stack->end());
  torch::jit::Stack call;
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < n; ++i) {
    bool is_written = arguments[i].alias_info() && arguments[i].alias_info()->isWrite();
    if (is_written) {
      if (!args[i].isTensor() || !is_tpu(args[i].toTensor())) return false;
      written.push_back(args[i].toTensor());
      if (!inplace) continue;  // out= arguments are not inputs
    }
    call.push_back(args[i]);
  }
  // Factory out= ops (arange.out, linspace.out): the functional form's dtype and device
  // come from the out tensor.
  const auto& functional_args = functional->schema().arguments();
  if (!inplace && written.size() == 1) {
    for (size_t i = call.size(); i < functional_args.size(); ++i) {
      const std::string& arg = functional_args[i].name();
      if (arg == "dtype") call.push_back(static_cast<int64_t>(written[0].scalar_type()));
      else if (arg == "device") call.push_back(written[0].device());
      else if (arg == "layout" || arg == "pin_memory") call.push_back(c10::IValue());
      else break;
    }
  }
  if (call.size() != functional_args.size()) return false;
  const LoweringRule* rule = find_lowering(op_name(*functional));
  if (!record_op(*functional, rule, &call)) return false;
  std::vector<at::Tensor> results;
  for (const auto& r : call) {
    if (r.isTensor()) results.push_back(r.toTensor());
    else if (r.isTensorList()) for (const at::Tensor& t : r.toTensorList()) results.push_back(t);
  }
  if (results.size() < written.size()) return false;
  for (size_t i = 0; i < written.size(); ++i)
    store_value(written[i], value_of(results[i], written[i].device().index()));
  torch::jit::drop(*stack, n);
  for (size_t i = 0; i < schema.returns().size() && i < written.size(); ++i) stack->push_back(written[i]);
  return true;
}

// _foreach_X(list, ...) without a lowering of its own: X on each element.
bool decompose_foreach(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.operator_name();
  std::string base = name.name.substr(std::string("aten::_foreach_").size());
  std::string overload = name.overload_name;
  static const std::unordered_map<std::string, std::vector<std::string>> overloads = {
      {"List", {"Tensor", "Tensor_Tensor", ""}},   {"Scalar", {"Scalar", "Tensor_Scalar", ""}},
      {"ScalarList", {"Scalar", "Tensor_Scalar", ""}}, {"Tensor", {"Tensor", ""}},
      {"", {"", "default"}},                          {"ScalarAndTensor", {"Scalar"}},
  };
  auto candidates = overloads.find(overload);
  if (candidates == overloads.end()) return false;
  std::optional<c10::OperatorHandle> element_op;
  for (const auto& o : candidates->second) {
    element_op = c10::Dispatcher::singleton().findOp({"aten::" + base, o});
    if (element_op) break;
  }
  if (!element_op) return false;
  const auto& schema = op.schema();
  size_t n = schema.arguments().size();
  if (element_op->schema().arguments().size() != n) return false;
  std::vector<c10::IValue> args(stack->end() - n, stack->end());
  size_t count = 0;
  for (const auto& v : args) {
    if (v.isTensorList()) count = v.toTensorList().size();
  }
  c10::List<at::Tensor> results;
  for (size_t i = 0; i < count; ++i) {
    torch::jit::Stack element;
    for (const auto& v : args) {
      if (v.isTensorList()) element.push_back(v.toTensorList().get(i));
      else if (v.isList() && !v.isTensorList()) element.push_back(v.toListRef()[i]);
      else element.push_back(v);
    }
    element_op->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &element);
    if (!schema.returns().empty()) results.push_back(element.back().toTensor());
  }
  torch::jit::drop(*stack, n);
  if (!schema.returns().empty()) stack->push_back(results);
  return true;
}

}  // namespace torchtpu
