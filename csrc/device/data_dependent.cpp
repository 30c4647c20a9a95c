// Ops whose result shape depends on the data: nonzero (argwhere), masked_select, indexing
// with boolean masks (x[mask], index_put with a mask among other indices) and the unique
// family. Each runs in two device stages (lowering/data_dependent.cpp): a count, read back
// once (one 8-byte download, which flushes the pending graph that produces it), then the
// result at that size, an ordinary node that joins the pending graph in fused mode. The
// data never travels to the host. Also equal, whose bool result is the one value read back,
// and the CTC loss with lengths given as tensors, whose lengths are read back (CUDA's
// kernels read them to the host too; log_alpha's shape depends on the longest target).
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>

#include <sstream>
#include <unordered_map>

#include "device/kernels.h"
#include "engine/engine.h"

namespace torchtpu {
namespace {

Arg int_list(const std::vector<int64_t>& values) {
  Arg a;
  a.kind = Arg::Kind::IntList;
  a.ints = values;
  return a;
}

ValuePtr record_one(const char* op, std::vector<Arg> args, std::vector<ValuePtr> operands, TensorType out) {
  int device = operands.at(0)->device;
  return Engine::get().record(lowered_kind(op), std::move(args), std::move(operands), {std::move(out)}, device)[0];
}

// The value of a 0-d int64 count: the one read back to the host.
int64_t read_count(const ValuePtr& count) { return download(count).item<int64_t>(); }

at::Tensor user_tensor(const ValuePtr& value) { return wrap_for_user(make_tensor(value)); }

bool is_mask(const at::Tensor& t) { return t.scalar_type() == at::kBool || t.scalar_type() == at::kByte; }

bool supported(const at::Tensor& t) { return is_supported_dtype(static_cast<int>(t.scalar_type())); }

ValuePtr bool_value(const at::Tensor& t, int device) { return convert_value(value_of(t, device), DType::Bool); }

// nonzero(self) -> int64 [count, self.dim()]
bool nonzero(const c10::OperatorHandle&, const LoweringRule*, torch::jit::Stack* stack) {
  at::Tensor self = (*stack)[stack->size() - 1].toTensor();
  if (!supported(self)) return false;
  ValuePtr x = value_of(self, self.device().index());
  int64_t rank = x->type.rank();
  int64_t n = read_count(record_one("aten::count_nonzero", {Arg::tensor(0), Arg::none()}, {x}, {{}, DType::Int64}));
  ValuePtr out = record_one("aten::nonzero_static", {Arg::tensor(0), Arg::integer(n), Arg::integer(-1)}, {x},
                            {{n, rank}, DType::Int64});
  torch::jit::drop(*stack, 1);
  stack->push_back(user_tensor(out));
  return true;
}

// masked_select(self, mask) -> [count]: the elements of the broadcast self where mask is true.
bool masked_select(const c10::OperatorHandle&, const LoweringRule*, torch::jit::Stack* stack) {
  at::Tensor self = (*stack)[stack->size() - 2].toTensor(), mask = (*stack)[stack->size() - 1].toTensor();
  if (!supported(self)) return false;
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask");
  std::vector<int64_t> shape = at::infer_size(self.sizes(), mask.sizes());
  int device = is_tpu(self) ? self.device().index() : mask.device().index();
  ValuePtr x = value_of(self, device), m = value_of(mask, device);
  int64_t n = read_count(record_one("torchtpu::masked_count", {Arg::tensor(0), int_list(shape)}, {m}, {{}, DType::Int64}));
  ValuePtr out = record_one("torchtpu::masked_select", {Arg::tensor(0), Arg::tensor(1), Arg::integer(n), int_list(shape)},
                            {x, m}, {{n}, x->type.dtype});
  torch::jit::drop(*stack, 2);
  stack->push_back(user_tensor(out));
  return true;
}

std::string format_sizes(c10::IntArrayRef sizes) {
  std::ostringstream s;
  s << sizes;
  return s.str();
}

// The indices of an index/index_put with each boolean mask replaced by the int64
// coordinates of its true elements (one index per mask dimension), as PyTorch's CPU
// kernels do. Masks are checked against the dims they index; their counts are read together.
c10::List<std::optional<at::Tensor>> expand_masks(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  int device = self.device().index();
  struct Mask {
    ValuePtr value, count;
  };
  std::vector<Mask> masks;
  int64_t dim = 0;
  for (const auto& ref : indices) {
    std::optional<at::Tensor> index = ref;
    if (!index.has_value() || !index->defined() || !is_mask(*index)) {
      ++dim;
      continue;
    }
    const at::Tensor& mask = *index;
    for (int64_t j = 0; j < mask.dim(); ++j) {
      TORCH_CHECK_INDEX(dim + j < self.dim() && mask.size(j) == self.size(dim + j), "The shape of the mask ",
                        format_sizes(mask.sizes()), " at index ", j, " does not match the shape of the indexed tensor ",
                        format_sizes(self.sizes()), " at index ", dim + j);
    }
    dim += mask.dim();
    ValuePtr m = bool_value(mask, device);
    masks.push_back({m, record_one("aten::count_nonzero", {Arg::tensor(0), Arg::none()}, {m}, {{}, DType::Int64})});
  }
  c10::List<std::optional<at::Tensor>> expanded;
  size_t next = 0;
  for (const auto& ref : indices) {
    std::optional<at::Tensor> index = ref;
    if (!index.has_value() || !index->defined() || !is_mask(*index)) {
      expanded.push_back(index);
      continue;
    }
    const Mask& mask = masks[next++];
    int64_t n = read_count(mask.count);
    static const OpKind op = lowered_kind("torchtpu::mask_indices");
    std::vector<TensorType> outs(mask.value->type.rank(), TensorType{{n}, DType::Int64});
    auto columns = Engine::get().record(op, {Arg::tensor(0), Arg::integer(n)}, {mask.value}, outs, device);
    for (const ValuePtr& c : columns) expanded.push_back(make_tensor(c));
  }
  return expanded;
}

bool has_mask(const c10::List<std::optional<at::Tensor>>& indices, int* tensors) {
  bool any = false;
  *tensors = 0;
  for (const auto& ref : indices) {
    std::optional<at::Tensor> index = ref;
    if (!index.has_value() || !index->defined()) continue;
    ++*tensors;
    any |= is_mask(*index);
  }
  return any;
}

// (self, indices, ...) with boolean masks among the indices: the masks become integer
// indices (one count read), then the op records as usual. With `lone_mask_direct`, a mask
// that is the only index tensor is left to the op's own lowering (no count needed).
bool record_with_expanded_masks(const c10::OperatorHandle& op, const LoweringRule* rule, torch::jit::Stack* stack,
                                bool lone_mask_direct) {
  size_t n = op.schema().arguments().size();
  c10::IValue& self_arg = (*stack)[stack->size() - n];
  c10::IValue& indices_arg = (*stack)[stack->size() - n + 1];
  if (!self_arg.isTensor() || !is_tpu(self_arg.toTensor()) || !supported(self_arg.toTensor())) return false;
  // A refused index (a uint8 mask to _unsafe_index): CPU's kernel decides it as given.
  if (rule && refuses_index(rule, std::vector<c10::IValue>(stack->end() - n, stack->end()))) return false;
  auto indices = indices_arg.toOptionalTensorList();
  int tensors = 0;
  if (!has_mask(indices, &tensors) || (lone_mask_direct && tensors == 1)) return false;
  indices_arg = expand_masks(self_arg.toTensor(), indices);
  return record_op(op, rule, stack);
}

// index.Tensor(self, indices) with boolean masks among the indices.
bool index_with_masks(const c10::OperatorHandle& op, const LoweringRule* rule, torch::jit::Stack* stack) {
  return record_with_expanded_masks(op, rule, stack, /*lone_mask_direct=*/false);
}

// index_put / _index_put_impl / _unsafe_index_put(self, indices, values, accumulate...):
// a lone mask is lowered directly (no count needed); a mask among other indices is expanded.
bool index_put_with_masks(const c10::OperatorHandle& op, const LoweringRule* rule, torch::jit::Stack* stack) {
  return record_with_expanded_masks(op, rule, stack, /*lone_mask_direct=*/true);
}

// The unique family, one shape: (values, inverse, counts), computed over the flattened
// input or over slices along `dim`; `consecutive` merges only neighbouring duplicates.
struct UniqueCall {
  at::Tensor self;
  std::optional<int64_t> dim;
  bool consecutive = false;
  bool inverse = true, counts = true;  // outputs CPU returns full; else empty
  int results = 3;
};

void run_unique(const UniqueCall& call, torch::jit::Stack* stack, size_t args) {
  int device = call.self.device().index();
  ValuePtr x = value_of(call.self, device);
  Arg dim_arg = Arg::none();
  int64_t rows = x->type.numel();
  std::vector<int64_t> values_shape;
  if (call.dim) {
    int64_t d = at::maybe_wrap_dim(*call.dim, call.self.dim());
    for (int64_t i = 0; i < call.self.dim(); ++i)
      TORCH_CHECK(i == d || call.self.size(i) != 0,
                  "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied");
    dim_arg = Arg::integer(d);
    rows = call.self.size(d);
    values_shape = call.self.sizes().vec();
  }
  ValuePtr count = record_one("torchtpu::unique_count", {Arg::tensor(0), Arg::boolean(call.consecutive), dim_arg}, {x},
                              {{}, DType::Int64});
  int64_t n = read_count(count);
  if (call.dim) values_shape[dim_arg.i] = n;
  else values_shape = {n};
  std::vector<int64_t> inverse_shape = call.dim ? std::vector<int64_t>{rows} : x->type.shape;
  if (!call.inverse) inverse_shape = {0};
  std::vector<int64_t> counts_shape = call.counts ? std::vector<int64_t>{n} : std::vector<int64_t>{0};
  static const OpKind op = lowered_kind("torchtpu::unique");
  auto out = Engine::get().record(
      op, {Arg::tensor(0), Arg::integer(n), Arg::boolean(call.consecutive), dim_arg}, {x},
      {{values_shape, x->type.dtype}, {inverse_shape, DType::Int64}, {counts_shape, DType::Int64}}, device);
  torch::jit::drop(*stack, args);
  for (int i = 0; i < call.results; ++i) stack->push_back(user_tensor(out[i]));
}

// _unique2(self, sorted, return_inverse, return_counts); _unique(self, sorted, return_inverse);
// unique_dim(self, dim, sorted, return_inverse, return_counts);
// unique_consecutive(self, return_inverse, return_counts, dim?);
// unique_dim_consecutive(self, dim, return_inverse, return_counts).
// CPU always sorts (sorted=False too); the dim variants always return inverse and counts.
bool unique(const c10::OperatorHandle& op, const LoweringRule*, torch::jit::Stack* stack) {
  const std::string& name = op.operator_name().name;
  size_t n = op.schema().arguments().size();
  auto arg = [&](size_t i) -> const c10::IValue& { return (*stack)[stack->size() - n + i]; };
  UniqueCall call;
  call.self = arg(0).toTensor();
  if (!is_tpu(call.self) || !supported(call.self)) return false;
  if (name == "aten::_unique2") {
    call.inverse = arg(2).toBool();
    call.counts = arg(3).toBool();
  } else if (name == "aten::_unique") {
    call.inverse = arg(2).toBool();
    call.results = 2;
  } else if (name == "aten::unique_dim") {
    call.dim = arg(1).toInt();
  } else if (name == "aten::unique_consecutive") {
    call.consecutive = true;
    if (arg(3).isInt()) {
      call.dim = arg(3).toInt();
    } else {
      call.inverse = arg(1).toBool();
      call.counts = arg(2).toBool();
    }
  } else {  // unique_dim_consecutive
    call.consecutive = true;
    call.dim = arg(1).toInt();
  }
  run_unique(call, stack, n);
  return true;
}

// equal(self, other) -> bool: same sizes and every element equal (after type promotion, as
// on CPU; NaN is unequal), computed on the device; one bool read back.
bool equal(const c10::OperatorHandle&, const LoweringRule*, torch::jit::Stack* stack) {
  at::Tensor self = (*stack)[stack->size() - 2].toTensor(), other = (*stack)[stack->size() - 1].toTensor();
  if (!supported(self) || !supported(other)) return false;
  bool result = false;
  if (self.sizes() == other.sizes()) {
    int device = is_tpu(self) ? self.device().index() : other.device().index();
    ValuePtr a = value_of(self, device), b = value_of(other, device);
    const std::vector<int64_t>& shape = a->type.shape;
    ValuePtr same = Engine::get().record(lowered_kind("aten::eq.Tensor"), {Arg::tensor(0), Arg::tensor(1)}, {a, b},
                                         {{shape, DType::Bool}}, device)[0];
    ValuePtr all = record_one("aten::all", {Arg::tensor(0)}, {same}, {{}, DType::Bool});
    result = download(all).item<bool>();
  }
  torch::jit::drop(*stack, 2);
  stack->push_back(result);
  return true;
}

// A lengths tensor of _ctc_loss.Tensor / _ctc_loss_backward.Tensor as numbers, as CPU's and
// CUDA's kernels read it (integral dtypes only).
std::vector<int64_t> host_lengths(const at::Tensor& lengths, const char* name) {
  TORCH_CHECK(at::isIntegralType(lengths.scalar_type(), /*includeBool=*/false), name, " must be integral");
  at::Tensor host = is_tpu(lengths) ? download(value_of(lengths, lengths.device().index())) : lengths;
  host = host.to(at::kLong).contiguous();
  return std::vector<int64_t>(host.const_data_ptr<int64_t>(), host.const_data_ptr<int64_t>() + host.numel());
}

// _ctc_loss.Tensor(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity) and
// _ctc_loss_backward.Tensor(grad, log_probs, targets, input_lengths, target_lengths, ...): the
// lengths are read back, then the int-lengths overload records as usual.
bool ctc_loss_with_tensor_lengths(const c10::OperatorHandle& op, const LoweringRule*, torch::jit::Stack* stack) {
  size_t n = op.schema().arguments().size();
  auto arg = [&](size_t i) -> c10::IValue& { return (*stack)[stack->size() - n + i]; };
  const std::string& base = op.operator_name().name;
  size_t lengths = base == "aten::_ctc_loss_backward" ? 3 : 2;
  if (!arg(lengths).isTensor() || !arg(lengths + 1).isTensor()) return false;
  arg(lengths) = c10::IValue(host_lengths(arg(lengths).toTensor(), "input_lengths"));
  arg(lengths + 1) = c10::IValue(host_lengths(arg(lengths + 1).toTensor(), "target_lengths"));
  c10::Dispatcher::singleton().findSchemaOrThrow(base.c_str(), "").callBoxed(stack);
  return true;
}

using Handler = bool (*)(const c10::OperatorHandle&, const LoweringRule*, torch::jit::Stack*);

const std::unordered_map<std::string, Handler>& handlers() {
  static const std::unordered_map<std::string, Handler> table = {
      {"aten::nonzero", nonzero},
      {"aten::masked_select", masked_select},
      {"aten::equal", equal},
      {"aten::index.Tensor", index_with_masks},
      {"aten::_unsafe_index.Tensor", index_with_masks},
      {"aten::index_put", index_put_with_masks},
      {"aten::_index_put_impl", index_put_with_masks},
      {"aten::_unsafe_index_put", index_put_with_masks},
      {"aten::_unique2", unique},
      {"aten::_unique", unique},
      {"aten::unique_dim", unique},
      {"aten::unique_consecutive", unique},
      {"aten::unique_dim_consecutive", unique},
      {"aten::_ctc_loss.Tensor", ctc_loss_with_tensor_lengths},
      {"aten::_ctc_loss_backward.Tensor", ctc_loss_with_tensor_lengths},
  };
  return table;
}

}  // namespace

bool record_data_dependent(const std::string& name, const c10::OperatorHandle& op, const LoweringRule* rule,
                           torch::jit::Stack* stack) {
  auto it = handlers().find(name);
  if (it == handlers().end()) return false;
  return it->second(op, rule, stack);
}

}  // namespace torchtpu
