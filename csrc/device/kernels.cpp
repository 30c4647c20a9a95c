// The aten kernels of the tpu device. One boxed kernel serves every op that has a lowering:
// it turns the op's arguments into a graph node, asks PyTorch's meta kernel for the output
// shapes and dtypes, and hands the node to the engine. Ops without a lowering run on CPU.
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_to_copy.h>
#include <ATen/ops/copy.h>
#include <ATen/ops/empty.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "device/generator.h"
#include "device/kernels.h"
#include "device/tensor.h"
#include "engine/engine.h"
#include "lowering/registry.h"

namespace torchtpu {

namespace {

std::atomic<int> g_fallback_policy{0};  // 0 warn, 1 error, 2 silent

// Runs f, turning the runtime's errors into the exceptions PyTorch users expect.
template <typename F>
auto translate_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const DeviceOutOfMemory& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

std::string op_name(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

bool is_number_type(const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  if (t->kind() == c10::TypeKind::NumberType) return true;
  if (auto list = t->cast<c10::ListType>()) return list->getElementType()->kind() == c10::TypeKind::NumberType;
  return false;
}

// ---------------------------------------------------------------------------------------
// Output types from PyTorch's meta kernels (cached per node signature).

struct OutputSignature {
  // per return: -1 for a Tensor, -2 for an undefined Tensor (masked-out backward outputs),
  // N for a Tensor[] of N. Only defined tensors become node outputs.
  std::vector<int> list_sizes;
  std::vector<TensorType> types;
};

std::unordered_map<uint64_t, OutputSignature>& meta_cache() {
  static std::unordered_map<uint64_t, OutputSignature> cache;
  return cache;
}
std::mutex g_meta_mutex;

c10::IValue to_meta(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return v;
    // A Python number passed as a tensor (x + 1.5) promotes like a scalar, not a tensor:
    // keep it as the CPU scalar it is (meta kernels accept CPU scalars).
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) return v;
    // A view made below functionalization keeps its geometry over its root's storage, so
    // that meta kernels of further views compute strides and offsets relative to the root.
    if (auto* impl = dynamic_cast<TpuTensorImpl*>(t.unsafeGetTensorImpl()); impl && impl->view_of()) {
      at::Tensor root = at::empty({impl->view_of()->root->numel()}, t.options().device(c10::kMeta));
      return root.as_strided(t.sizes(), t.strides(), t.storage_offset());
    }
    return at::empty(t.sizes(), t.options().device(c10::kMeta));
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(to_meta(t).toTensor());
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const auto& ref : v.toOptionalTensorList()) {
      std::optional<at::Tensor> t = ref;
      if (t.has_value() && t->defined()) out.push_back(to_meta(*t).toTensor());
      else out.push_back(std::nullopt);
    }
    return out;
  }
  if (v.isDevice()) return c10::Device(c10::kMeta);
  if (v.isGenerator()) return c10::IValue();
  return v;
}

OutputSignature infer_outputs(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  torch::jit::Stack meta;
  meta.reserve(args.size());
  for (const auto& a : args) meta.push_back(to_meta(a));
  {
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  }
  OutputSignature sig;
  for (const c10::IValue& r : meta) {
    if (r.isTensor() && !r.toTensor().defined()) {
      sig.list_sizes.push_back(-2);
    } else if (r.isTensor()) {
      sig.list_sizes.push_back(-1);
      sig.types.push_back(tensor_type_of(r.toTensor()));
    } else if (r.isTensorList()) {
      auto list = r.toTensorList();
      sig.list_sizes.push_back(static_cast<int>(list.size()));
      for (const at::Tensor& t : list) sig.types.push_back(tensor_type_of(t));
    } else {
      TORCH_CHECK_NOT_IMPLEMENTED(false, "torchtpu: op returns a non-tensor value");
    }
  }
  return sig;
}

// ---------------------------------------------------------------------------------------
// Arguments -> node.

struct ParsedOp {
  std::vector<Arg> args;
  std::vector<ValuePtr> operands;
  int device = -1;
  bool supported = true;
};

int device_of_args(const std::vector<c10::IValue>& args) {
  for (const auto& v : args) {
    if (v.isTensor() && is_tpu(v.toTensor())) return v.toTensor().device().index();
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList())
        if (is_tpu(t)) return t.device().index();
    if (v.isOptionalTensorList())
      for (const auto& ref : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = ref;
        if (t.has_value() && is_tpu(*t)) return t->device().index();
      }
  }
  for (const auto& v : args)
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1)
      return v.toDevice().has_index() ? v.toDevice().index() : current_device();
  return current_device();
}

ParsedOp parse_args(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& args, const LoweringRule* rule) {
  ParsedOp p;
  p.device = device_of_args(args);
  check_device_index(p.device);
  auto add_tensor = [&](const at::Tensor& t) {
    p.operands.push_back(value_of(t, p.device));
    return static_cast<int>(p.operands.size() - 1);
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    bool lift = !rule->static_scalars && is_number_type(schema.arguments()[i].type());
    // 0 and 1 (alpha=1, beta=0, ...) stay constants: they rarely change, and keeping them
    // out of the scalar vector saves a host-to-device transfer per launch in strict mode.
    if (lift && (v.isInt() || v.isDouble() || v.isBool())) {
      double number = v.isDouble() ? v.toDouble() : v.isInt() ? static_cast<double>(v.toInt()) : v.toBool();
      if (number == 0.0 || number == 1.0) lift = false;
    }
    Arg a;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined()) {
        a = Arg::tensor(add_tensor(t));
        a.i = t.unsafeGetTensorImpl()->is_wrapped_number();  // part of the signature: it changes promotion
      }
    } else if (v.isTensorList()) {
      a.kind = Arg::Kind::TensorList;
      for (const at::Tensor& t : v.toTensorList()) a.operands.push_back(add_tensor(t));
    } else if (v.isOptionalTensorList()) {
      a.kind = Arg::Kind::TensorList;
      for (const auto& ref : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = ref;
        a.operands.push_back(t.has_value() && t->defined() ? add_tensor(*t) : -1);
      }
    } else if (v.isNone() || v.isDevice() || v.isGenerator()) {
      // None; devices were resolved above; generators are handled by random rules.
    } else if (v.isBool()) {
      a = Arg::boolean(v.toBool(), lift);
    } else if (v.isInt()) {
      a = Arg::integer(v.toInt(), lift);
    } else if (v.isSymInt()) {
      a = Arg::integer(v.toSymInt().guard_int(__FILE__, __LINE__), lift);
    } else if (v.isDouble()) {
      a = Arg::real(v.toDouble(), lift);
    } else if (v.isIntList() || v.isSymIntList()) {
      a.kind = Arg::Kind::IntList;
      if (v.isIntList()) {
        a.ints = v.toIntVector();
      } else {
        for (const c10::SymInt& s : v.toSymIntList()) a.ints.push_back(s.guard_int(__FILE__, __LINE__));
      }
    } else if (v.isDoubleList()) {
      a.kind = Arg::Kind::DoubleList;
      a.doubles = v.toDoubleVector();
      a.lifted = lift;
    } else if (v.isBoolList()) {
      a.kind = Arg::Kind::BoolList;
      for (bool b : v.toBoolList()) a.ints.push_back(b);
    } else if (v.isString()) {
      a.kind = Arg::Kind::String;
      a.s = v.toStringRef();
    } else if (v.isList()) {
      // Scalar[]: numbers of mixed kinds become doubles (ints stay exact below 2^53).
      a.kind = Arg::Kind::DoubleList;
      a.lifted = lift;
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isDouble()) a.doubles.push_back(e.toDouble());
        else if (e.isInt()) a.doubles.push_back(static_cast<double>(e.toInt()));
        else if (e.isBool()) a.doubles.push_back(e.toBool());
        else p.supported = false;
      }
    } else {
      p.supported = false;
    }
    p.args.push_back(std::move(a));
  }
  return p;
}

uint64_t signature_hash(const LoweringRule* rule, const ParsedOp& p) {
  Node probe;
  probe.rule = rule;
  probe.args = p.args;
  probe.operands = p.operands;
  uint64_t h = hash_node(probe);
  probe.operands.clear();  // keep node_uses untouched: the probe never incremented them
  return h;
}

void append_generator_args(ParsedOp& p, const std::vector<c10::IValue>& args) {
  at::Generator chosen = default_generator(p.device);
  for (const auto& v : args)
    if (v.isGenerator()) chosen = v.toGenerator();
  auto* impl = dynamic_cast<TpuGeneratorImpl*>(chosen.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl, "torchtpu: random ops on tpu need a tpu generator (torch.Generator(device=\"tpu\"))");
  p.args.push_back(Arg::integer(impl->next_key(), true));
  p.args.push_back(Arg::integer(0, true));
}

// Returns false when the op cannot be lowered here (the caller falls back to CPU).
bool lower_op(const c10::OperatorHandle& op, const LoweringRule* rule, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t n = schema.arguments().size();
  std::vector<c10::IValue> args(stack->end() - n, stack->end());
  for (const auto& v : args) {
    if (v.isTensor() && v.toTensor().defined()) {
      const auto& t = v.toTensor();
      if (!is_supported_dtype(static_cast<int>(t.scalar_type()))) return false;
      if (!is_tpu(t) && !t.device().is_cpu()) return false;
    }
  }
  ParsedOp p = parse_args(schema, args, rule);
  if (!p.supported) return false;
  uint64_t key = signature_hash(rule, p);
  OutputSignature sig;
  {
    std::unique_lock<std::mutex> lock(g_meta_mutex);
    auto it = meta_cache().find(key);
    if (it != meta_cache().end()) {
      sig = it->second;
    } else {
      lock.unlock();
      try {
        sig = infer_outputs(op, args);
      } catch (const std::exception&) {
        // No meta kernel, a data-dependent shape (nonzero, x[mask]) or invalid arguments:
        // the CPU kernel runs it, or raises the same error CPU users see.
        return false;
      }
      for (const TensorType& t : sig.types)
        if (!is_supported_dtype(static_cast<int>(t.dtype))) return false;
      lock.lock();
      meta_cache()[key] = sig;
    }
  }
  // clone/detach/alias of an unchanged type: values are immutable (in-place ops swap them),
  // so the result can share the input's value; no node, no launch.
  if (rule->data && std::strcmp(rule->data, "identity") == 0 && sig.types.size() == 1 && !p.operands.empty() &&
      p.operands[0]->type == sig.types[0]) {
    torch::jit::drop(*stack, n);
    stack->push_back(wrap_for_user(make_tensor(p.operands[0])));
    return true;
  }
  if (rule->random) append_generator_args(p, args);
  std::vector<ValuePtr> values = Engine::get().record(rule, std::move(p.args), std::move(p.operands), sig.types, p.device);
  torch::jit::drop(*stack, n);
  size_t next = 0;
  for (int size : sig.list_sizes) {
    if (size == -2) {
      stack->push_back(at::Tensor());
    } else if (size < 0) {
      stack->push_back(wrap_for_user(make_tensor(values[next++])));
    } else {
      c10::List<at::Tensor> list;
      for (int i = 0; i < size; ++i) list.push_back(wrap_for_user(make_tensor(values[next++])));
      stack->push_back(std::move(list));
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// CPU fallback: inputs to CPU, run there, results back.

std::mutex g_warned_mutex;
std::unordered_set<std::string> g_warned;

at::Tensor to_cpu(const at::Tensor& t) {
  if (!is_tpu(t)) return t;
  return download(value_of(t, t.device().index()));
}

void write_back(const at::Tensor& tpu_dst, const at::Tensor& cpu_src) {
  store_value(tpu_dst, upload(cpu_src, tpu_dst.device().index()));
}

}  // namespace

void clear_fallback_warnings() {
  std::lock_guard<std::mutex> lock(g_warned_mutex);
  g_warned.clear();
}

void set_fallback_policy(const std::string& policy) {
  if (policy == "warn") g_fallback_policy = 0;
  else if (policy == "error") g_fallback_policy = 1;
  else if (policy == "silent") g_fallback_policy = 2;
  else throw std::invalid_argument("torchtpu: TORCHTPU_FALLBACK must be warn, error or silent, not '" + policy + "'");
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // PyTorch's structured kernels reach us as `op.out` after allocating the output; users
  // know the op by its functional name.
  std::string name = op.operator_name().overload_name == "out" ? op.operator_name().name : op_name(op);
  if (g_fallback_policy == 1)
    TORCH_CHECK_NOT_IMPLEMENTED(false, "torchtpu: op ", name, " has no tpu lowering and TORCHTPU_FALLBACK=error; "
                                "set TORCHTPU_FALLBACK=warn to run it on CPU");
  Engine::get().record_fallback(name);
  if (g_fallback_policy == 0) {
    std::lock_guard<std::mutex> lock(g_warned_mutex);
    if (g_warned.insert(name).second)
      TORCH_WARN("torchtpu: op ", name, " has no tpu lowering yet; it runs on CPU (copies to and from the device). "
                 "torchtpu.metrics.counters()['fallback_ops'] counts these; TORCHTPU_FALLBACK=error makes it an error.");
  }
  const auto& schema = op.schema();
  size_t n = schema.arguments().size();
  auto args = torch::jit::last(*stack, n);
  int device = device_of_args(std::vector<c10::IValue>(args.begin(), args.end()));
  std::vector<std::pair<at::Tensor, at::Tensor>> mutated;  // (tpu tensor, its CPU stand-in)
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = (*stack)[stack->size() - n + i];
    const auto* alias = schema.arguments()[i].alias_info();
    bool written = alias && alias->isWrite();
    if (v.isTensor()) {
      at::Tensor t = v.toTensor();
      if (is_tpu(t)) {
        at::Tensor cpu = to_cpu(t);
        if (written) mutated.emplace_back(t, cpu);
        v = cpu;
      }
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> cpu_list;
      for (const at::Tensor& t : v.toTensorList()) {
        at::Tensor cpu = to_cpu(t);
        if (written && is_tpu(t)) mutated.emplace_back(t, cpu);
        cpu_list.push_back(cpu);
      }
      v = cpu_list;
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> cpu_list;
      for (const auto& ref : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = ref;
        cpu_list.push_back(t.has_value() && t->defined() ? std::optional<at::Tensor>(to_cpu(*t)) : std::nullopt);
      }
      v = cpu_list;
    } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      v = c10::Device(c10::kCPU);
    } else if (v.isGenerator() && v.toGenerator().device().type() == c10::DeviceType::PrivateUse1) {
      v = c10::IValue();
    }
  }
  {
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }
  for (auto& [tpu, cpu] : mutated) write_back(tpu, cpu);
  size_t r = schema.returns().size();
  for (size_t i = 0; i < r; ++i) {
    c10::IValue& v = (*stack)[stack->size() - r + i];
    const auto* alias = schema.returns()[i].alias_info();
    if (alias && alias->isWrite()) {
      // Returns an argument it mutated (add_, out=): hand back the tpu tensor.
      for (auto& [tpu, cpu] : mutated)
        if (v.isTensor() && v.toTensor().is_same(cpu)) v = tpu;
      continue;
    }
    if (v.isTensor() && v.toTensor().defined()) {
      v = wrap_for_user(make_tensor(upload(v.toTensor(), device)));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(wrap_for_user(make_tensor(upload(t, device))));
      v = out;
    }
  }
}

namespace {

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

// An in-place or out= op on inner tensors (PyTorch's composite kernels issue these on fresh
// tensors below functionalization): run the functional op, then store into the written args.
bool lower_mutable(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
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
  if (call.size() != functional->schema().arguments().size()) return false;
  const LoweringRule* rule = find_lowering(op_name(*functional));
  if (!lower_op(*functional, rule, &call)) return false;
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

bool lower_raw_view(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool inplace) {
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

void tpu_boxed_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  translate_errors([&] {
    std::string name = op_name(op);
    const LoweringRule* rule = find_lowering(name);
    if (rule && !op.schema().is_mutable() && lower_op(op, rule, stack)) return;
    if (!rule && is_view_op(op.schema()) && lower_raw_view(op, stack, false)) return;
    if (!rule && is_inplace_view_op(name) && lower_raw_view(op, stack, true)) return;
    if (!rule && op.schema().is_mutable() && lower_mutable(op, stack)) return;
    if (!rule && name.rfind("aten::_foreach_", 0) == 0 && !op.schema().is_mutable() && decompose_foreach(op, stack))
      return;
    cpu_fallback(op, stack);
  });
}

// ---------------------------------------------------------------------------------------
// Kernels that are not plain ops on device values: allocation and copies.

at::Tensor tpu_empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                     std::optional<at::Device> device, std::optional<bool>, std::optional<at::MemoryFormat>) {
  return translate_errors([&] {
    TORCH_CHECK(!layout || *layout == at::kStrided, "torchtpu: only strided tensors are supported on tpu");
    for (int64_t d : size) TORCH_CHECK(d >= 0, "Trying to create tensor with negative dimension ", d, ": ", size);
    int index = device && device->has_index() ? device->index() : current_device();
    check_device_index(index);
    TensorType type{size.vec(), to_dtype(dtype.value_or(at::get_default_dtype_as_scalartype()))};
    return wrap_for_user(make_tensor(zeros_value(type, index)));
  });
}

at::Tensor tpu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout> layout, std::optional<at::Device> device,
                             std::optional<bool> pin) {
  return tpu_empty(size, dtype, layout, device, pin, std::nullopt);
}

// Writes src (any device) into the inner tpu tensor dst, converting and broadcasting.
void assign_to_tpu(const at::Tensor& dst, const at::Tensor& src) {
  int device = dst.device().index();
  ValuePtr v;
  if (is_tpu(src) && src.device().index() == device) {
    v = value_of(src, device);
  } else {
    at::Tensor host = is_tpu(src) ? download(value_of(src, src.device().index())) : src;
    v = upload(host, device);
  }
  store_value(dst, broadcast_value(convert_value(v, to_dtype(dst.scalar_type())), dst.sizes().vec()));
}

at::Tensor tpu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  return translate_errors([&] {
    if (is_tpu(dst)) {
      assign_to_tpu(dst, self);
    } else {
      at::Tensor host = download(value_of(self, self.device().index()));
      dst.copy_(host);
    }
    return dst;
  });
}

// copy(self, src): functionalization's form of self.copy_(src); a new value, src converted
// to self's dtype and broadcast to its shape.
at::Tensor tpu_copy(const at::Tensor& self, const at::Tensor& src, bool) {
  return translate_errors([&] {
    int device = self.device().index();
    ValuePtr v;
    if (is_tpu(src) && src.device().index() == device) {
      v = value_of(src, device);
    } else {
      v = upload(is_tpu(src) ? download(value_of(src, src.device().index())) : src, device);
    }
    v = broadcast_value(convert_value(v, to_dtype(self.scalar_type())), self.sizes().vec());
    return wrap_for_user(make_tensor(v));
  });
}

at::Tensor tpu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  return translate_errors([&] {
    if (is_tpu(dst)) {
      at::Tensor inner = unwrap(dst);
      auto* impl = static_cast<TpuTensorImpl*>(inner.unsafeGetTensorImpl());
      int device = dst.device().index();
      ValuePtr v = is_tpu(self) ? value_of(self, device) : upload(self, device);
      impl->set_value(convert_value(v, to_dtype(dst.scalar_type())));
    } else {
      at::Tensor host = download(value_of(self, self.device().index()));
      dst.resize_(host.sizes());
      dst.copy_(host);
    }
    return dst;
  });
}

at::Tensor tpu_to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                       std::optional<at::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                       std::optional<at::MemoryFormat>) {
  return translate_errors([&]() -> at::Tensor {
    TORCH_CHECK(!layout || *layout == at::kStrided, "torchtpu: only strided tensors are supported on tpu");
    at::ScalarType target = dtype.value_or(self.scalar_type());
    if (!is_tpu(self)) {
      // Host to device: PyTorch routes this here because the target device is tpu.
      int index = device && device->has_index() ? device->index() : current_device();
      check_device_index(index);
      at::Tensor host = self.scalar_type() == target ? self : self.to(target);
      return wrap_for_user(make_tensor(upload(host, index)));
    }
    int source = self.device().index();
    if (device && device->type() != c10::DeviceType::PrivateUse1) {
      at::Tensor host = download(value_of(self, source));
      at::Tensor out = host.to(*device, target, non_blocking, /*copy=*/false);
      if (pin_memory.value_or(false)) out = out.pin_memory();
      return out;
    }
    int index = device && device->has_index() ? device->index() : source;
    check_device_index(index);
    ValuePtr v = value_of(self, source);
    if (index != source) v = upload(download(v), index);
    return make_tensor(convert_value(v, to_dtype(target)));
  });
}

// resize_ on an inner tensor (out= kernels resize their outputs): new contents are zeros.
const at::Tensor& tpu_resize(const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat>) {
  return translate_errors([&]() -> const at::Tensor& {
    if (self.sizes() == size) return self;
    at::Tensor inner = unwrap(self);
    auto* impl = dynamic_cast<TpuTensorImpl*>(inner.unsafeGetTensorImpl());
    TORCH_CHECK(impl, "torchtpu: resize_ of a non-tpu tensor");
    impl->set_value(zeros_value(TensorType{size.vec(), to_dtype(self.scalar_type())}, self.device().index()));
    return self;
  });
}

c10::Scalar tpu_local_scalar_dense(const at::Tensor& self) {
  return translate_errors([&] {
    at::Tensor host = download(value_of(self, self.device().index()));
    return host.item();
  });
}

// Our own version of functionalization's _to_copy kernel: PyTorch's wraps the result only for
// XLA and Lazy devices; a tpu result must be wrapped too or a raw inner tensor would escape.
at::Tensor to_copy_functionalize(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                                 std::optional<at::Layout> layout, std::optional<at::Device> device,
                                 std::optional<bool> pin_memory, bool non_blocking,
                                 std::optional<at::MemoryFormat> memory_format) {
  at::Tensor inner = self;
  if (at::functionalization::impl::isFunctionalTensor(self)) {
    at::functionalization::impl::sync(self);
    inner = at::functionalization::impl::from_functional_tensor(self);
  }
  at::Tensor out;
  {
    at::AutoDispatchSkipFunctionalize guard;
    out = at::_to_copy(inner, dtype, layout, device, pin_memory, non_blocking, memory_format);
  }
  if (!c10::impl::tls_local_dispatch_key_set().included_.has(c10::DispatchKey::Functionalize)) {
    c10::DeviceType target = device ? device->type() : self.device().type();
    if (target != c10::DeviceType::PrivateUse1 && target != c10::DeviceType::XLA &&
        target != c10::DeviceType::Lazy)
      return out;
  }
  return at::functionalization::impl::to_functional_tensor(out);
}

// copy_ at the ADInplaceOrView key (same as PyTorch's generated kernel) plus one case:
// host_tensor.copy_(tpu_tensor). Functionalization rejects mutating a plain tensor from a
// functional one unless the source is an XLA tensor; a tpu source must be allowed too.
at::Tensor& copy_inplace_or_view(c10::DispatchKeySet ks, at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (is_tpu(src) && at::functionalization::impl::isFunctionalTensor(src) &&
      !at::functionalization::impl::isFunctionalTensor(self)) {
    at::Tensor inner = unwrap(src);
    {
      at::AutoDispatchBelowADInplaceOrView below;
      at::AutoDispatchSkipFunctionalize skip;
      self.copy_(inner, non_blocking);
    }
    torch::autograd::impl::bump_version(self);
    return self;
  }
  {
    at::AutoDispatchBelowADInplaceOrView below;
    at::_ops::copy_::redispatch(ks & c10::after_ADInplaceOrView_keyset, self, src, non_blocking);
  }
  torch::autograd::impl::bump_version(self);
  return self;
}

// Meta kernel for in-place foreach ops (optimizer updates). Functionalization checks every
// in-place op on Meta tensors first; without this, PyTorch's composite runs the per-tensor
// Python meta functions, which cost more than the whole optimizer step on the device.
void foreach_inplace_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t n = schema.arguments().size();
  auto args = torch::jit::last(*stack, n);
  auto self = args[0].toTensorList();
  for (size_t a = 1; a < n; ++a) {
    const c10::IValue& v = args[a];
    if (v.isTensorList()) {
      auto other = v.toTensorList();
      TORCH_CHECK(other.size() == self.size(), "Tensor lists must have the same number of tensors, got ",
                  self.size(), " and ", other.size());
      for (size_t i = 0; i < self.size(); ++i) {
        at::Tensor s = self.get(i), o = other.get(i);
        auto shape = at::infer_size(s.sizes(), o.sizes());
        TORCH_CHECK(c10::IntArrayRef(shape) == s.sizes(), "output with shape ", s.sizes(),
                    " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
      }
    } else if (v.isList() && !v.isTensorList()) {
      TORCH_CHECK(v.toListRef().size() == self.size(), "Scalar list must have the same number of elements as the "
                  "tensor list, got ", self.size(), " and ", v.toListRef().size());
    }
  }
  torch::jit::drop(*stack, n);
  for (size_t r = 0; r < schema.returns().size(); ++r) stack->push_back(c10::IValue());
}

}  // namespace

void register_kernels() {
  static bool done = false;
  if (done) return;
  done = true;
  // Registered here rather than with TORCH_LIBRARY_IMPL so that overriding PyTorch's
  // Functionalize kernel for _to_copy happens once, with its expected warning silenced.
  struct QuietHandler : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  static torch::Library fallback(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  fallback.fallback(torch::CppFunction::makeFromBoxedFunction<&tpu_boxed_kernel>());
  static torch::Library aten(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  aten.impl("empty.memory_format", TORCH_FN(tpu_empty));
  aten.impl("empty_strided", TORCH_FN(tpu_empty_strided));
  aten.impl("_copy_from", TORCH_FN(tpu_copy_from));
  aten.impl("copy", TORCH_FN(tpu_copy));
  aten.impl("resize_", TORCH_FN(tpu_resize));
  aten.impl("_copy_from_and_resize", TORCH_FN(tpu_copy_from_and_resize));
  aten.impl("_to_copy", TORCH_FN(tpu_to_copy));
  aten.impl("_local_scalar_dense", TORCH_FN(tpu_local_scalar_dense));
  // Ops with a lowering get the boxed kernel directly: a direct registration wins over
  // PyTorch's composite kernels (which would call the out= variant through the fallback).
  for (const std::string& full : lowered_ops()) {
    if (full.rfind("aten::", 0) != 0) continue;
    std::string name = full.substr(6);
    auto dot = name.find('.');
    std::string base = name.substr(0, dot), overload = dot == std::string::npos ? "" : name.substr(dot + 1);
    if (!c10::Dispatcher::singleton().findSchema({"aten::" + base, overload})) continue;  // not in this torch
    aten.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&tpu_boxed_kernel>());
  }
  static torch::Library functionalize(torch::Library::IMPL, "aten", c10::DispatchKey::Functionalize, __FILE__, __LINE__);
  functionalize.impl("_to_copy", TORCH_FN(to_copy_functionalize));
  static torch::Library meta(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    const std::string& base = name.name;
    if (base.rfind("aten::_foreach_", 0) != 0 || base.back() != '_') continue;
    auto handle = c10::Dispatcher::singleton().findOp(name);
    if (!handle || handle->hasKernelForDispatchKey(c10::DispatchKey::Meta)) continue;
    if (!handle->schema().returns().empty()) continue;
    std::string full = base.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    meta.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&foreach_inplace_meta>());
  }
  static torch::Library inplace_or_view(torch::Library::IMPL, "aten", c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);
  inplace_or_view.impl("copy_", TORCH_FN(copy_inplace_or_view));
}

}  // namespace torchtpu
