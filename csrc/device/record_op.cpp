// Ops with a lowering: the op's arguments become a graph node (tensors its operands,
// numbers lifted or static), PyTorch's meta kernel gives the output types (cached by the
// node's signature), and the engine records it.
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/_linalg_check_errors.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "device/explain.h"
#include "device/generator.h"
#include "device/kernels.h"
#include "device/spmd.h"
#include "engine/engine.h"

namespace torchtpu {
namespace {

bool is_type(const c10::TypePtr& type, c10::TypeKind kind) {
  c10::TypePtr t = type;
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  if (t->kind() == kind) return true;
  if (auto list = t->cast<c10::ListType>()) return list->getElementType()->kind() == kind;
  return false;
}

bool is_number_type(const c10::TypePtr& type) { return is_type(type, c10::TypeKind::NumberType); }

// ---------------------------------------------------------------------------------------
// Output types from PyTorch's meta kernels, cached per node signature: some meta kernels
// are Python decompositions (native_layer_norm_backward's runs ~30 ops) that would cost
// more than everything else in a fused training step if run on every call.

struct OutputSignature {
  // per return: -1 for a Tensor, -2 for an undefined Tensor (masked-out backward outputs),
  // N for a Tensor[] of N. Only defined tensors become node outputs.
  std::vector<int> list_sizes;
  std::vector<TensorType> types;
  int output_mask_arg = -1;  // the op's output_mask argument (backward ops), if it has one
};

std::unordered_map<uint64_t, OutputSignature>& meta_cache() {
  static std::unordered_map<uint64_t, OutputSignature> cache;
  return cache;
}
std::mutex g_meta_mutex;

}  // namespace

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

namespace {

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
  const auto& arguments = op.schema().arguments();
  for (size_t i = 0; i < arguments.size(); ++i)
    if (arguments[i].name() == "output_mask") sig.output_mask_arg = static_cast<int>(i);
  return sig;
}

// Backward ops with an output_mask return undefined tensors for the gradients not asked
// for, and their lowerings emit only the defined ones: the mask they read says which are
// (the meta kernel decides, as PyTorch's CPU kernels do).
void mask_defined_outputs(const OutputSignature& sig, std::vector<Arg>* args) {
  if (sig.output_mask_arg < 0) return;
  Arg& mask = (*args)[sig.output_mask_arg];
  for (size_t k = 0; k < mask.ints.size() && k < sig.list_sizes.size(); ++k) mask.ints[k] = sig.list_sizes[k] != -2;
}

// ---------------------------------------------------------------------------------------
// Arguments -> node.

struct ParsedOp {
  std::vector<Arg> args;
  std::vector<ValuePtr> operands;
  int device = -1;
  bool supported = true;
};

ParsedOp parse_args(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& args, const LoweringRule* rule) {
  ParsedOp p;
  p.args.reserve(args.size() + 2);  // + a random op's key and offset
  p.device = device_of_args(args);
  check_device_index(p.device);
  auto add_tensor = [&](const at::Tensor& t) {
    p.operands.push_back(value_of(t, p.device));
    return static_cast<int>(p.operands.size() - 1);
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    const c10::TypePtr& type = schema.arguments()[i].type();
    bool lift = !rule->static_scalars &&
                (is_number_type(type) || (rule->lifts_floats && is_type(type, c10::TypeKind::FloatType)));
    // 0 and 1 (alpha=1, beta=0, ...) stay constants: they rarely change, and keeping them
    // out of the scalar vector saves a host-to-device transfer per launch in strict mode.
    // A bool fill is the exception: torch.full(size, flag) (transformers' max-length
    // criterion builds its "done" row so) is a flag that flips when a loop ends, and as a
    // constant it would compile a second graph for its last step. lower_fill reads it
    // through the scalar packs.
    static const OpKind fill_scalar = OpKind::intern("aten::fill.Scalar");
    bool flag_fill = lift && v.isBool() && rule->kind == fill_scalar;
    if (lift && !flag_fill && (v.isInt() || v.isDouble() || v.isBool())) {
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
    } else if (v.isComplexDouble()) {
      c10::complex<double> c = v.toComplexDouble();
      a = Arg::complex(c.real(), c.imag(), lift && (c.real() != 0.0 || c.imag() != 0.0));
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

// Hashed in place: a probe node would copy every argument and operand per op.
uint64_t signature_hash(const LoweringRule* rule, const ParsedOp& p) {
  return hash_node_inputs(rule->kind, p.args, p.operands);
}

// Whether a tensor or scalar argument is complex (rules that do not declare kTakesComplex
// leave such calls to the CPU fallback).
bool touches_complex(const std::vector<c10::IValue>& args) {
  for (const auto& v : args) {
    if (v.isComplexDouble()) return true;
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_complex()) return true;
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList())
        if (t.is_complex()) return true;
    if (v.isOptionalTensorList())
      for (const auto& ref : v.toOptionalTensorList()) {
        std::optional<at::Tensor> t = ref;
        if (t.has_value() && t->defined() && t->is_complex()) return true;
      }
  }
  return false;
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

// Linear-algebra rules (RuleFlags::float32_or_float64) compute in float32 / float64 only:
// PyTorch's CPU and CUDA kernels raise for other dtypes, and the CPU kernel raises that error.
bool linalg_dtype(const LoweringRule* rule, const at::Tensor& t) {
  if (!rule->float32_or_float64) return true;
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble;
}

// The dtypes the rule refuses for this call (LoweringRule::refuses, refuses_for): the CPU
// kernel raises PyTorch's error for them.
DTypeSet refused_dtypes(const LoweringRule* rule, const ParsedOp& p) {
  return rule->refuses | (rule->refuses_for ? rule->refuses_for(p.args) : 0);
}

// The op's first defined tensor argument (self), or nullptr.
const at::Tensor* first_tensor(const std::vector<c10::IValue>& args) {
  for (const auto& v : args)
    if (v.isTensor() && v.toTensor().defined()) return &v.toTensor();
  return nullptr;
}

// The dtype of a tensor or number-Scalar argument (a Python bool is Bool, an int Int64).
std::optional<DType> argument_dtype(const c10::IValue& v, const c10::Argument& argument) {
  if (v.isTensor() && v.toTensor().defined()) return to_dtype(v.toTensor().scalar_type());
  if (v.isScalar() && is_number_type(argument.type())) return to_dtype(v.toScalar().type());
  return std::nullopt;
}

// Whether a refusal judged on the arguments (Judged::Self, Promoted, Operands) refuses this call.
bool refused_by_arguments(const LoweringRule* rule, DTypeSet refusing, const c10::FunctionSchema& schema,
                          const std::vector<c10::IValue>& args) {
  if (rule->judged_on == Judged::Self) {
    const at::Tensor* self = first_tensor(args);
    return self && (refusing & dtype_set(to_dtype(self->scalar_type())));
  }
  if (rule->judged_on == Judged::Operands) {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& name = schema.arguments()[i].name();
      if (name != "self" && name != "other") continue;
      std::optional<DType> dtype = argument_dtype(args[i], schema.arguments()[i]);
      if (dtype && (refusing & dtype_set(*dtype))) return true;
    }
    return false;
  }
  at::native::ResultTypeState state;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor() && v.toTensor().defined()) state = at::native::update_result_type_state(v.toTensor(), state);
    else if (v.isScalar() && is_number_type(schema.arguments()[i].type()))
      state = at::native::update_result_type_state(v.toScalar(), state);
  }
  return refusing & dtype_set(to_dtype(at::native::result_type(state)));
}

// An `_ex` op called with check_errors=True raises from its info output (its last), as
// PyTorch's kernels do: the host reads info, like CUDA's.
void check_linalg_errors(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                         const torch::jit::Stack& outputs) {
  const auto& arguments = op.schema().arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].name() != "check_errors" || !args[i].isBool() || !args[i].toBool()) continue;
    std::string api = op.schema().name().substr(6);  // "linalg_cholesky_ex" -> "linalg.cholesky_ex"
    if (api.rfind("linalg_", 0) == 0) api[6] = '.';
    at::_linalg_check_errors(outputs.back().toTensor(), api, args[0].toTensor().dim() == 2);
  }
}

}  // namespace

// Whether the op's index argument (LoweringRule::index_arg) has a dtype the rule refuses: a
// float index to index_put, whose CPU kernel raises for it.
bool refuses_index(const LoweringRule* rule, const std::vector<c10::IValue>& args) {
  if (rule->index_arg < 0 || static_cast<size_t>(rule->index_arg) >= args.size()) return false;
  auto refused = [&](const at::Tensor& t) {
    return t.defined() && is_supported_dtype(static_cast<int>(t.scalar_type())) &&
           (rule->index_refuses & dtype_set(to_dtype(t.scalar_type())));
  };
  const c10::IValue& v = args[rule->index_arg];
  if (v.isTensor()) return refused(v.toTensor());
  if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorList())
      if (refused(t)) return true;
  if (v.isOptionalTensorList())
    for (const auto& ref : v.toOptionalTensorList()) {
      std::optional<at::Tensor> t = ref;
      if (t.has_value() && refused(*t)) return true;
    }
  return false;
}

bool record_op(const c10::OperatorHandle& op, const LoweringRule* rule, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t n = schema.arguments().size();
  std::vector<c10::IValue> args(stack->end() - n, stack->end());
  for (const auto& v : args) {
    if (v.isTensor() && v.toTensor().defined()) {
      const auto& t = v.toTensor();
      if (!is_supported_dtype(static_cast<int>(t.scalar_type()))) return declined("a tensor's dtype tpu lacks");
      if (!is_tpu(t) && !t.device().is_cpu()) return declined("a tensor on another device");
      if (!linalg_dtype(rule, t)) return declined("linear algebra takes float32 and float64 only");
    }
  }
  if (!rule->complex && touches_complex(args)) return declined("a complex value its rule does not take");
  if (refuses_index(rule, args)) return declined("an index dtype CPU's kernel refuses");
  if (rule->refuses_empty) {
    const at::Tensor* self = first_tensor(args);
    if (self && self->numel() == 0) return declined("an empty input CPU's kernel refuses");
  }
  ParsedOp p = parse_args(schema, args, rule);
  if (!p.supported) return declined("an argument kind the lowering does not take");
  DTypeSet refusing = refused_dtypes(rule, p);
  if (refusing && rule->judged_on != Judged::Result && refused_by_arguments(rule, refusing, schema, args))
    return declined("a dtype CPU's kernel refuses (LoweringRule::refuses)");
  uint64_t key = signature_hash(rule, p);
  // Entries are never erased and unordered_map nodes do not move: the cached signature is
  // read in place, without copying its vectors per op.
  const OutputSignature* cached = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_meta_mutex);
    auto it = meta_cache().find(key);
    if (it != meta_cache().end()) cached = &it->second;
  }
  if (!cached) {
    OutputSignature inferred;
    try {
      inferred = infer_outputs(op, args);
    } catch (const std::exception&) {
      rethrow_if_interrupt();  // Ctrl-C in a Python meta kernel is no reason to fall back
      // No meta kernel, a data-dependent shape (nonzero, x[mask]) or invalid arguments:
      // the CPU kernel runs it, or raises the same error CPU users see.
      return declined("PyTorch's meta kernel raised: no meta kernel, a data-dependent shape or invalid arguments");
    }
    if (rule->judged_on == Judged::Result && !inferred.types.empty() && (refusing & dtype_set(inferred.types[0].dtype)))
      return declined("a result dtype CPU's kernel refuses (LoweringRule::refuses)");
    for (const TensorType& t : inferred.types) {
      if (!is_supported_dtype(static_cast<int>(t.dtype))) return declined("a result dtype tpu lacks");
      if (!rule->complex && is_complex(t.dtype)) return declined("a complex result its rule does not give");
    }
    std::lock_guard<std::mutex> lock(g_meta_mutex);
    cached = &meta_cache().emplace(key, std::move(inferred)).first->second;
  }
  const OutputSignature& sig = *cached;
  // clone/detach/alias of an unchanged type: values are immutable (in-place ops swap them),
  // so the result can share the input's value; no node, no launch.
  if (rule->identity && sig.types.size() == 1 && !p.operands.empty() &&
      p.operands[0]->type == sig.types[0]) {
    torch::jit::drop(*stack, n);
    stack->push_back(wrap_for_user(make_tensor(p.operands[0])));
    explain_lowered(rule->kind.name(), rule, "shares its input's value (no node)");
    return true;
  }
  if (rule->random) append_generator_args(p, args);
  mask_defined_outputs(sig, &p.args);
  check_one_mesh(rule->kind.name(), schema, p.args, p.operands);
  std::vector<ValuePtr> values;
  if (!sig.types.empty())  // every output masked out: nothing to compute
    values = Engine::get().record(rule->kind, std::move(p.args), std::move(p.operands), sig.types, p.device);
  explain_lowered(rule->kind.name(), rule, sig.types.empty() ? "every output masked out (nothing to compute)" : nullptr);
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
  check_linalg_errors(op, args, *stack);
  return true;
}

}  // namespace torchtpu
