// Order statistics and binning: kthvalue, median, nanmedian, mode (a stable sort along dim,
// NaN last, then a pick per slice), searchsorted and bucketize (CPU's binary search),
// histc (bin counts), isin (set membership).
// Among equal values CPU's index is whatever its quickselect or unstable sort leaves; here it
// is the first (kthvalue, median) or the last (mode, as CPU's small sorts give) occurrence.
#include <cmath>
#include <optional>
#include <string>

#include "lowering/common.h"

namespace torchtpu {
namespace {

struct Sorted {
  V values, indices;  // sorted along dim, NaN last; indices int64
  int64_t dim;
};

Sorted sort_along_dim(LoweringContext& ctx, const V& x, int64_t dim) {
  V order = ctx.iota(TensorType{x.type.shape, DType::Int64}, dim);
  std::vector<V> s = sort_stable(ctx, {x}, {order}, dim);
  return {s[0], s[1], dim};
}

// The elements of x at position `pos` along dim (pos: x's shape without dim, int64).
V take_at(LoweringContext& ctx, const V& x, int64_t dim, const V& pos) {
  std::vector<int64_t> strides = contiguous_strides(x.type.shape);
  const auto& shape = pos.type.shape;
  std::vector<int64_t> coefs;
  for (int64_t d = 0; d < x.type.rank(); ++d)
    if (d != dim) coefs.push_back(strides[d]);
  V linear = ctx.binary(Hlo::Add, affine_index(ctx, shape, coefs, 0, DType::Int64),
                        ctx.binary(Hlo::Multiply, pos, ctx.constant_int(strides[dim], DType::Int64, shape)));
  return gather_linear(ctx, x, linear);
}

std::vector<int64_t> without(const std::vector<int64_t>& shape, int64_t dim) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
    if (d != dim) out.push_back(shape[d]);
  return out;
}

V count_along(LoweringContext& ctx, const V& keep, int64_t dim) {
  return sum_dims(ctx, ctx.convert(keep, DType::Int64), {dim});
}

V isnan_of(LoweringContext& ctx, const V& x) {
  if (!is_floating(x.type.dtype)) return ctx.constant_int(0, DType::Bool, x.type.shape);
  return ctx.compare(Cmp::NE, x, x);
}

// The (value, index) of each slice at sorted position pos; results reshaped to the op's.
void set_picked(LoweringContext& ctx, const Node& node, const Sorted& s, const V& pos) {
  ctx.set_results({ctx.reshape(take_at(ctx, s.values, s.dim, pos), ctx.out(node, 0).shape),
                   ctx.reshape(take_at(ctx, s.indices, s.dim, pos), ctx.out(node, 1).shape)});
}

// A 0-d input is its own slice of one element.
bool scalar_pick(LoweringContext& ctx, const Node& node, const V& x) {
  if (x.type.rank() > 0) return false;
  ctx.set_results({ctx.reshape(x, ctx.out(node, 0).shape), ctx.constant_int(0, DType::Int64, ctx.out(node, 1).shape)});
  return true;
}

// Whether a median propagates NaN (median) or skips it (nanmedian).
enum class Nan : uint8_t { Propagate, Skip };

// kthvalue(self, k, dim, keepdim) -> (values, indices)
void lower_kthvalue(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  if (scalar_pick(ctx, node, x)) return;
  int64_t dim = wrap_dim(node.args[2].i, x.type.rank());
  Sorted s = sort_along_dim(ctx, x, dim);
  set_picked(ctx, node, s, ctx.constant_int(node.args[1].i - 1, DType::Int64, without(x.type.shape, dim)));
}

// median.dim / nanmedian.dim (self, dim, keepdim) -> (values, indices): the lower median;
// median gives NaN (at the first NaN's index) for a slice with NaN, nanmedian skips NaN.
void lower_median_dim(LoweringContext& ctx, const Node& node) {
  bool skip_nan = rule_param<Nan>(node) == Nan::Skip;
  V x = ctx.input(node, 0);
  if (scalar_pick(ctx, node, x)) return;
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  Sorted s = sort_along_dim(ctx, x, dim);
  std::vector<int64_t> shape = without(x.type.shape, dim);
  V numbers = count_along(ctx, ctx.unary(Hlo::Not, isnan_of(ctx, x)), dim);
  auto k = [&](int64_t v) { return ctx.constant_int(v, DType::Int64, shape); };
  V pos;
  if (skip_nan) {
    // (count - 1) / 2 truncating toward zero: an all-NaN slice picks position 0.
    pos = ctx.binary(Hlo::Divide, ctx.binary(Hlo::Subtract, numbers, k(1)), k(2));
  } else {
    V has_nan = ctx.compare(Cmp::LT, numbers, k(x.type.shape[dim]));
    pos = ctx.select(has_nan, numbers, k((x.type.shape[dim] - 1) / 2));
  }
  set_picked(ctx, node, s, pos);
}

// median(self) / nanmedian(self): over all elements; NaN (median: any NaN) as above.
void lower_median_all(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  bool skip_nan = rule_param<Nan>(node) == Nan::Skip;
  V x = ctx.input(node, 0);
  int64_t n = x.type.numel();
  if (n == 0) {
    ctx.set_result(ctx.constant(NAN, out.dtype, out.shape));
    return;
  }
  V flat = ctx.reshape(x, {n});
  Sorted s = sort_along_dim(ctx, flat, 0);
  V numbers = count_along(ctx, ctx.unary(Hlo::Not, isnan_of(ctx, flat)), 0);
  auto k = [&](int64_t v) { return ctx.constant_int(v, DType::Int64); };
  V pos = skip_nan ? ctx.binary(Hlo::Divide, ctx.binary(Hlo::Subtract, numbers, k(1)), k(2))
                   : ctx.select(ctx.compare(Cmp::LT, numbers, k(n)), numbers, k((n - 1) / 2));
  ctx.set_result(ctx.reshape(take_at(ctx, s.values, 0, pos), out.shape));
}

// A prefix (or, reversed, suffix) scan along dim with a two-argument op.
V scan(LoweringContext& ctx, const V& x, int64_t dim, Hlo op, const V& init, bool suffix) {
  int64_t rank = x.type.rank(), n = x.type.shape[dim];
  TensorType s{{}, x.type.dtype};
  std::string body = ctx.region({s, s}, [&](const std::vector<V>& a) { return std::vector<V>{ctx.binary(op, a[0], a[1])}; });
  std::vector<int64_t> window(rank, 1);
  window[dim] = n;
  std::string padding = "padding = dense<[";
  for (int64_t i = 0; i < rank; ++i) {
    std::string before = i == dim && !suffix ? std::to_string(n - 1) : "0";
    std::string after = i == dim && suffix ? std::to_string(n - 1) : "0";
    padding += std::string(i ? ", " : "") + "[" + before + ", " + after + "]";
  }
  padding += "]> : tensor<" + std::to_string(rank) + "x2xi64>";
  return ctx.emit(Hlo::ReduceWindow, {x, init}, x.type, "window_dimensions = " + format_dims(window) + ", " + padding,
                  body);
}

// mode(self, dim, keepdim) -> (values, indices): the most frequent value, the smallest among
// equally frequent ones, at the index of its last occurrence.
void lower_mode(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  if (scalar_pick(ctx, node, x)) return;
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  int64_t n = x.type.shape[dim];
  const auto& shape = x.type.shape;
  Sorted s = sort_along_dim(ctx, x, dim);
  auto k = [&](int64_t v) { return ctx.constant_int(v, DType::Int64, shape); };
  V position = ctx.iota(TensorType{shape, DType::Int64}, dim);
  // Run boundaries in sorted order: an element ends its run when the next one differs.
  std::vector<int64_t> zeros(shape.size(), 0), ones(shape.size(), 1), head = shape, tail_start(shape.size(), 0);
  head[dim] = n - 1;
  tail_start[dim] = 1;
  V differs = ctx.compare(Cmp::NE, ctx.slice(s.values, zeros, head, ones), ctx.slice(s.values, tail_start, shape, ones));
  std::vector<int64_t> edge_shape = shape;
  edge_shape[dim] = 1;
  V edge = ctx.constant_int(1, DType::Bool, edge_shape);
  V is_first = ctx.concatenate({edge, differs}, dim), is_last = ctx.concatenate({differs, edge}, dim);
  V start = scan(ctx, ctx.select(is_first, position, k(-1)), dim, Hlo::Maximum,
                 ctx.constant_int(-1, DType::Int64), false);
  V end = scan(ctx, ctx.select(is_last, position, k(n)), dim, Hlo::Minimum, ctx.constant_int(n, DType::Int64),
               true);
  V length = ctx.binary(Hlo::Add, ctx.binary(Hlo::Subtract, end, start), k(1));
  // Longest run first, then the earliest (smallest value): one integer key per run end.
  V key = ctx.binary(Hlo::Add, ctx.binary(Hlo::Multiply, length, k(n + 1)),
                     ctx.binary(Hlo::Subtract, k(n), position));
  key = ctx.select(is_last, key, k(-1));
  V best = ctx.reduce(key, {dim}, ctx.constant_int(-1, DType::Int64), Hlo::Maximum);
  std::vector<int64_t> rest = without(shape, dim);
  V n_k = ctx.constant_int(n, DType::Int64, rest);
  V pos = ctx.binary(Hlo::Subtract, n_k, ctx.binary(Hlo::Remainder, best, ctx.constant_int(n + 1, DType::Int64, rest)));
  set_picked(ctx, node, s, pos);
}

// The binary search of CPU's searchsorted for each value in its row of boundaries [..., M]
// (1-D: one row for all): left moves right while !(b[mid] >= v), right while !(b[mid] > v).
// The same steps as CPU's loop, so unsorted rows and NaN (which fails every comparison) give
// its answers, not a count of smaller boundaries.
V binary_search(LoweringContext& ctx, const V& boundaries, const V& values, bool right) {
  const auto& shape = values.type.shape;
  int64_t m = boundaries.type.shape.back();
  auto k = [&](int64_t v) { return ctx.constant_int(v, DType::Int64, shape); };
  if (m == 0) return k(0);
  V row = k(0);
  if (boundaries.type.rank() > 1) {
    std::vector<int64_t> coefs = contiguous_strides(boundaries.type.shape);
    coefs.back() = 0;
    row = affine_index(ctx, shape, coefs, 0, DType::Int64);
  }
  V start = k(0), end = k(m);
  for (int64_t size = m; size > 0; size >>= 1) {
    V active = ctx.compare(Cmp::LT, start, end);
    V mid = ctx.binary(Hlo::Add, start, ctx.binary(Hlo::Divide, ctx.binary(Hlo::Subtract, end, start), k(2)));
    V at = ctx.binary(Hlo::Add, row, ctx.binary(Hlo::Minimum, mid, k(m - 1)));
    V go_right = ctx.unary(Hlo::Not, ctx.compare(right ? Cmp::GT : Cmp::GE, gather_linear(ctx, boundaries, at), values));
    start = ctx.select(ctx.binary(Hlo::And, active, go_right), ctx.binary(Hlo::Add, mid, k(1)), start);
    end = ctx.select(ctx.binary(Hlo::And, active, ctx.unary(Hlo::Not, go_right)), mid, end);
  }
  return start;
}

enum class Search : uint8_t { Searchsorted, Bucketize };

// searchsorted(sorted_sequence, self, out_int32, right, side, sorter) and
// bucketize(self, boundaries, out_int32, right): CPU's binary search (above).
void lower_searchsorted(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  bool bucketize = rule_param<Search>(node) == Search::Bucketize;
  V boundaries = ctx.input(node, bucketize ? 1 : 0);
  bool right = node.args[3].as_bool();
  if (!bucketize && node.args.size() > 4 && node.args[4].kind == Arg::Kind::String) right = node.args[4].s == "right";
  if (!bucketize && ctx.has_input(node, 5)) {
    // boundaries[..., sorter[..., j]]
    const auto& shape = boundaries.type.shape;
    int64_t last = boundaries.type.rank() - 1;
    std::vector<int64_t> coefs = contiguous_strides(shape);
    coefs[last] = 0;
    V rows = affine_index(ctx, shape, coefs, 0, DType::Int64);
    boundaries = gather_linear(ctx, boundaries, ctx.binary(Hlo::Add, rows, ctx.convert(ctx.input(node, 5), DType::Int64)));
  }
  int value_arg = bucketize ? 0 : 1;
  DType dt = boundaries.type.dtype;
  V values = ctx.has_input(node, value_arg) ? ctx.input(node, value_arg) : ctx.scalar(node, value_arg, dt);
  DType common = promote_types(values.type.dtype, dt);
  V counts = binary_search(ctx, ctx.convert(boundaries, common), ctx.convert(values, common), right);
  ctx.set_result(ctx.reshape(ctx.convert(counts, out.dtype), out.shape));
}

// histc(self, bins, min, max): counts in `bins` equal bins over [min, max] (the data's range
// when min == max; widened by 1 each way if that is empty too; an error if not finite). Values outside, and NaN, are
// not counted; max falls in the last bin. The bin is CPU's: (x - min) * bins / (max - min),
// truncated, in the input's type.
void lower_histc(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType dt = out.dtype;
  Ex e = make_ex(ctx, dt, {});
  int64_t bins = node.args[1].i;
  int64_t n = ctx.input(node, 0).type.numel();
  if (n == 0) {
    ctx.set_result(ctx.constant(0, dt, out.shape));
    return;
  }
  V x = ctx.reshape(ctx.convert(ctx.input(node, 0), dt), {n});
  V lo = ctx.scalar(node, 2, dt), hi = ctx.scalar(node, 3, dt);
  V from_data = e.cmp(Cmp::EQ, lo, hi);
  lo = e.sel(from_data, ctx.reduce(x, {0}, ctx.constant(INFINITY, dt), Hlo::Minimum), lo);
  hi = e.sel(from_data, ctx.reduce(x, {0}, ctx.constant(-INFINITY, dt), Hlo::Maximum), hi);
  V empty = e.cmp(Cmp::EQ, lo, hi);
  lo = e.sel(empty, e.sub(lo, e.k(1.0)), lo);
  hi = e.sel(empty, e.add(hi, e.k(1.0)), hi);
  // CPU raises for a range taken from data holding inf or NaN; it prints the two edges, which
  // a check (an integer report) cannot.
  TensorType flag{{}, DType::Bool};
  V finite = e.band(ctx.emit(Hlo::IsFinite, {lo}, flag), ctx.emit(Hlo::IsFinite, {hi}, flag));
  ctx.check(e.bnot(finite), V{},
            RuntimeCheck{RuntimeCheck::Error::Runtime, "torch.histc: range of [min, max] is not finite (inf or NaN)"});
  Ex v = make_ex(ctx, dt, {n});
  V lo_n = ctx.broadcast_to(lo, {n}), hi_n = ctx.broadcast_to(hi, {n});
  V scaled = v.div(v.mul(v.sub(x, lo_n), v.k(static_cast<double>(bins))), v.sub(hi_n, lo_n));
  V bin = ctx.convert(v.un(Hlo::Floor, scaled), DType::Int64);
  auto ki = [&](int64_t value) { return ctx.constant_int(value, DType::Int64, {n}); };
  bin = ctx.select(ctx.compare(Cmp::EQ, bin, ki(bins)), ki(bins - 1), bin);
  V inside = v.band(v.cmp(Cmp::GE, x, lo_n), v.cmp(Cmp::LE, x, hi_n));
  bin = ctx.select(inside, bin, ki(bins));  // out of range: dropped by the scatter
  ctx.set_result(scatter_linear(ctx, ctx.constant(0, dt, out.shape), bin, v.k(1.0), Hlo::Add));
}

// isin.Tensor_Tensor(elements, test_elements, assume_unique, invert) / .Tensor_Scalar /
// .Scalar_Tensor: whether each element equals some test element, compared in the promoted
// dtype (NaN is in nothing). Few pairs compare all of them (logits processors and stopping
// criteria test a token row against a handful of ids); many sort the test elements once and
// binary-search each element, as CPU's kernel does past its size threshold.
void lower_isin(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  auto dtype_of_arg = [&](int arg) -> std::optional<DType> {
    if (ctx.has_input(node, arg)) return ctx.input(node, arg).type.dtype;
    return std::nullopt;
  };
  auto is_bool_scalar = [&](int arg) { return !ctx.has_input(node, arg) && node.args[arg].kind == Arg::Kind::Bool; };
  std::optional<DType> a = dtype_of_arg(0), b = dtype_of_arg(1);
  check_argument(a != DType::Bool && b != DType::Bool && !is_bool_scalar(0) && !is_bool_scalar(1),
                 "Unsupported input type encountered for isin(): Bool");
  // A Python number promotes like a 0-d tensor: a float number makes an integer tensor float.
  DType tensor_dtype = a ? *a : *b;
  int number_arg = a && b ? -1 : (a ? 1 : 0);
  DType common = a && b ? promote_types(*a, *b) : tensor_dtype;
  if (number_arg >= 0 && node.args[number_arg].kind == Arg::Kind::Double && !is_floating(common)) common = DType::Float32;
  auto operand = [&](int arg) {
    return ctx.has_input(node, arg) ? ctx.convert(ctx.input(node, arg), common) : ctx.scalar(node, arg, common);
  };
  V elements = operand(0), tests = operand(1);
  int64_t n = elements.type.numel(), m = tests.type.numel();
  V flat = ctx.reshape(elements, {n});
  V found;
  if (m == 0 || n == 0) {
    found = ctx.constant_int(0, DType::Bool, {n});
  } else if (n * m <= (int64_t{1} << 20)) {
    V pairs_e = ctx.broadcast_in_dim(flat, {n, m}, {0});
    V pairs_t = ctx.broadcast_in_dim(ctx.reshape(tests, {m}), {n, m}, {1});
    found = ctx.reduce(ctx.compare(Cmp::EQ, pairs_e, pairs_t), {1}, ctx.constant_int(0, DType::Bool), Hlo::Or);
  } else {
    V sorted = sort_stable(ctx, {ctx.reshape(tests, {m})}, {}, 0)[0];
    V pos = binary_search(ctx, sorted, flat, false);
    V at = ctx.binary(Hlo::Minimum, pos, ctx.constant_int(m - 1, DType::Int64, {n}));
    found = ctx.compare(Cmp::EQ, gather_linear(ctx, sorted, at), flat);
  }
  if (node.args[3].as_bool()) found = ctx.unary(Hlo::Not, found);
  ctx.set_result(ctx.reshape(found, out.shape));
}

LOWERING("aten::kthvalue", lower_kthvalue, nullptr, kNoBool);
LOWERING("aten::median.dim", lower_median_dim, Nan::Propagate, kNoBoolNotEmpty);
LOWERING("aten::nanmedian.dim", lower_median_dim, Nan::Skip, kNoBoolNotEmpty);
LOWERING("aten::median", lower_median_all, Nan::Propagate, kNoBool);
LOWERING("aten::nanmedian", lower_median_all, Nan::Skip, kNoBool);
LOWERING("aten::mode", lower_mode);
LOWERING("aten::isin.Tensor_Tensor", lower_isin);
LOWERING("aten::isin.Tensor_Scalar", lower_isin);
LOWERING("aten::isin.Scalar_Tensor", lower_isin);
LOWERING("aten::searchsorted.Tensor", lower_searchsorted, Search::Searchsorted);
LOWERING("aten::searchsorted.Scalar", lower_searchsorted, Search::Searchsorted);
LOWERING("aten::bucketize.Tensor", lower_searchsorted, Search::Bucketize, kSelfNotBool);
LOWERING("aten::bucketize.Scalar", lower_searchsorted, Search::Bucketize, kSelfNotBool);
LOWERING("aten::histc", lower_histc, nullptr, kFloatOnly);

}  // namespace
}  // namespace torchtpu
