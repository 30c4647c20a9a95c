// Indexing lowerings: advanced indexing (index, index_put), index_select, gather, scatter
// (and its reductions), index_add, masked_fill/masked_scatter, embedding, sort and topk.
// Index-driven ops compute the row-major position of every element they read or write and
// use one gather/scatter over the flattened operand (gather_linear / scatter_linear).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "lowering/common.h"

namespace torchtpu {
namespace {

// The _unsafe_ variants (used by PyTorch's decompositions, whose indices are in range by
// construction) skip the runtime check.
enum class Indices : uint8_t { Checked, Unchecked };

bool checked(const Node& node) { return rule_param<Indices>(node) == Indices::Checked; }

// scatter takes a reduce argument (or none: assign); scatter_add always adds.
enum class Scatter : uint8_t { FromArgument, Add };

std::vector<int64_t> broadcast_shapes(const std::vector<std::vector<int64_t>>& shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes)
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[rank - s.size() + i];
      if (s[i] != 1) o = s[i];
    }
  return out;
}

// Positions into x of the elements of x[indices] (PyTorch advanced indexing: the broadcast
// index dims replace the indexed dims in place when those are adjacent, else go first).
V advanced_positions(LoweringContext& ctx, const Node& node, const V& x, int arg, std::vector<int64_t>* result_shape) {
  const auto& shape = x.type.shape;
  int64_t rank = x.type.rank();
  std::vector<V> given = ctx.inputs(node, arg);
  const auto& slots = node.args[arg].operands;
  std::vector<int> dims;  // indexed dims, in order
  std::vector<V> idx;
  size_t next = 0;
  for (size_t k = 0; k < slots.size(); ++k) {
    if (slots[k] < 0) continue;
    V v = given.at(next++);
    if (v.type.dtype == DType::Bool || v.type.dtype == DType::UInt8)
      throw std::invalid_argument("torchtpu: boolean mask indices are not lowered");
    dims.push_back(static_cast<int>(k));
    idx.push_back(v);
  }
  bool check = checked(node);
  std::vector<std::vector<int64_t>> shapes;
  for (const V& v : idx) shapes.push_back(v.type.shape);
  std::vector<int64_t> b = broadcast_shapes(shapes);
  bool adjacent = dims.empty() || dims.back() - dims.front() + 1 == static_cast<int>(dims.size());
  std::vector<int64_t> out;
  std::vector<int64_t> position(rank, -1);  // position in out of each non-indexed dim
  int64_t b_start = 0;
  auto indexed = [&](int64_t d) { return std::find(dims.begin(), dims.end(), d) != dims.end(); };
  if (adjacent && !dims.empty()) {
    for (int64_t d = 0; d < dims.front(); ++d) { position[d] = out.size(); out.push_back(shape[d]); }
    b_start = out.size();
    out.insert(out.end(), b.begin(), b.end());
    for (int64_t d = dims.back() + 1; d < rank; ++d) { position[d] = out.size(); out.push_back(shape[d]); }
  } else {
    out = b;
    for (int64_t d = 0; d < rank; ++d)
      if (!indexed(d)) { position[d] = out.size(); out.push_back(shape[d]); }
  }
  *result_shape = out;
  std::vector<int64_t> strides = contiguous_strides(shape);
  DType it = index_dtype(x.type.numel());
  std::vector<int64_t> coefs(out.size(), 0);
  for (int64_t d = 0; d < rank; ++d)
    if (position[d] >= 0) coefs[position[d]] = strides[d];
  V total = affine_index(ctx, out, coefs, 0, it);
  std::vector<int64_t> b_dims;
  for (size_t i = 0; i < b.size(); ++i) b_dims.push_back(b_start + static_cast<int64_t>(i));
  for (size_t k = 0; k < dims.size(); ++k) {
    // CPU names the k-th index tensor's position among those given as its dimension.
    IndexCheck bounds = bounds_check(static_cast<int64_t>(k), shape[dims[k]], true, RuntimeCheck::Error::Index);
    V i = checked_index(ctx, idx[k], shape[dims[k]], it, check ? &bounds : nullptr);
    i = ctx.broadcast_to(i, b);
    if (strides[dims[k]] != 1) i = ctx.binary(Hlo::Multiply, i, ctx.constant_int(strides[dims[k]], it, b));
    total = ctx.binary(Hlo::Add, total, ctx.broadcast_in_dim(i, out, b_dims));
  }
  return total;
}

// index.Tensor(self, indices)
void lower_index(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  std::vector<int64_t> shape;
  V pos = advanced_positions(ctx, node, x, 1, &shape);
  ctx.set_result(ctx.reshape(gather_linear(ctx, x, pos), ctx.out(node).shape));
}

// Inclusive prefix sum of a 1-d integer vector.
V cumsum_1d(LoweringContext& ctx, const V& x);

// index_put with one boolean mask index (x[mask] = v, x[:, mask] += v): the i-th true
// position takes element i of values along the masked dim (or its only element).
bool lower_mask_put(LoweringContext& ctx, const Node& node, const V& x, bool accumulate) {
  const auto& slots = node.args[1].operands;
  std::vector<V> given = ctx.inputs(node, 1);
  if (given.size() != 1 || (given[0].type.dtype != DType::Bool && given[0].type.dtype != DType::UInt8)) return false;
  int64_t k = 0;
  while (slots[k] < 0) ++k;
  V mask = ctx.convert(given[0], DType::Bool);
  int64_t m = mask.type.rank(), rank = x.type.rank();
  const auto& shape = x.type.shape;
  // values as pre + [n] + post
  std::vector<int64_t> vshape(shape.begin(), shape.begin() + k);
  V values = ctx.convert(ctx.input(node, 2), x.type.dtype);
  const auto& vs = values.type.shape;
  int64_t post = rank - k - m;
  int64_t n = static_cast<int64_t>(vs.size()) > post ? vs[vs.size() - 1 - post] : 1;
  vshape.push_back(n);
  vshape.insert(vshape.end(), shape.begin() + k + m, shape.end());
  values = ctx.broadcast_to(values, vshape);
  std::vector<int64_t> vstrides = contiguous_strides(vshape);
  DType it = index_dtype(std::max(values.type.numel(), x.type.numel()) + 1);
  std::vector<int64_t> coefs(rank, 0);
  for (int64_t d = 0; d < k; ++d) coefs[d] = vstrides[d];
  for (int64_t d = k + m; d < rank; ++d) coefs[d] = vstrides[d - m + 1];
  V pos = affine_index(ctx, shape, coefs, 0, it);
  std::vector<int64_t> mask_dims;
  for (int64_t d = k; d < k + m; ++d) mask_dims.push_back(d);
  if (n > 1 && mask.type.numel() > 0) {
    int64_t count = mask.type.numel();
    V running = ctx.binary(Hlo::Subtract, cumsum_1d(ctx, ctx.convert(ctx.reshape(mask, {count}), it)),
                           ctx.constant_int(1, it, {count}));
    running = ctx.binary(Hlo::Maximum, running, ctx.constant_int(0, it, {count}));
    running = ctx.binary(Hlo::Multiply, running, ctx.constant_int(vstrides[k], it, {count}));
    pos = ctx.binary(Hlo::Add, pos, ctx.broadcast_in_dim(ctx.reshape(running, mask.type.shape), shape, mask_dims));
  }
  V update = ctx.reshape(gather_linear(ctx, values, pos), shape);
  if (accumulate) update = ctx.binary(x.type.dtype == DType::Bool ? Hlo::Or : Hlo::Add, x, update);
  ctx.set_result(ctx.select(ctx.broadcast_in_dim(mask, shape, mask_dims), update, x));
  return true;
}

// index_put / _index_put_impl(self, indices, values, accumulate[, unsafe])
void lower_index_put(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  if (lower_mask_put(ctx, node, x, node.args.size() > 3 && node.args[3].as_bool())) return;
  std::vector<int64_t> shape;
  V pos = advanced_positions(ctx, node, x, 1, &shape);
  V values = to_type(ctx, ctx.input(node, 2), x.type.dtype, shape);
  bool accumulate = node.args.size() > 3 && node.args[3].as_bool();
  Hlo add = x.type.dtype == DType::Bool ? Hlo::Or : Hlo::Add;
  ctx.set_result(scatter_linear(ctx, x, pos, values, accumulate ? std::optional<Hlo>(add) : std::nullopt));
}

// Positions for gather/scatter along `dim`: element p of `index` addresses
// self[p_0, ..., index[p], ..., p_n].
V along_dim_positions(LoweringContext& ctx, const V& self, int64_t dim, const V& index) {
  std::vector<int64_t> strides = contiguous_strides(self.type.shape);
  const auto& shape = index.type.shape;
  DType it = index_dtype(self.type.numel());
  int64_t size = self.type.rank() == 0 ? 1 : self.type.shape[dim];
  IndexCheck bounds = bounds_check(dim, size, false, RuntimeCheck::Error::Runtime);
  if (self.type.rank() == 0) {
    checked_index(ctx, index, size, it, &bounds);
    return ctx.constant_int(0, it, shape);
  }
  std::vector<int64_t> coefs(shape.size(), 0);
  for (size_t d = 0; d < shape.size(); ++d)
    if (static_cast<int64_t>(d) != dim) coefs[d] = strides[d];
  V total = affine_index(ctx, shape, coefs, 0, it);
  V i = checked_index(ctx, index, size, it, &bounds);
  if (strides[dim] != 1) i = ctx.binary(Hlo::Multiply, i, ctx.constant_int(strides[dim], it, shape));
  return ctx.binary(Hlo::Add, total, i);
}

// gather(self, dim, index, sparse_grad)
void lower_gather(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  V index = ctx.input(node, 2);
  ctx.set_result(gather_linear(ctx, x, along_dim_positions(ctx, x, dim, index)));
}

// index_select(self, dim, index): index is 1-d (or 0-d).
void lower_index_select(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  V index = ctx.input(node, 2);
  // CPU's check of the index, which the meta kernel lacks (its dtype: the rule's index_refuses).
  check_index_argument(index.type.rank() <= 1, "index_select(): Index is supposed to be a vector");
  IndexCheck range = range_check();
  if (x.type.rank() == 0) {
    checked_index(ctx, index, 1, DType::Int64, &range);
    ctx.set_result(ctx.reshape(x, out.shape));
    return;
  }
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  std::vector<int64_t> strides = contiguous_strides(x.type.shape);
  DType it = index_dtype(x.type.numel());
  std::vector<int64_t> coefs = strides;
  coefs[dim] = 0;
  V total = affine_index(ctx, out.shape, coefs, 0, it);
  V i = checked_index(ctx, ctx.reshape(index, {out.shape[dim]}), x.type.shape[dim], it, &range);
  if (strides[dim] != 1) i = ctx.binary(Hlo::Multiply, i, ctx.constant_int(strides[dim], it, i.type.shape));
  total = ctx.binary(Hlo::Add, total, ctx.broadcast_in_dim(i, out.shape, {dim}));
  ctx.set_result(gather_linear(ctx, x, total));
}

Hlo combiner(const std::string& reduce, DType dtype) {
  bool is_bool = dtype == DType::Bool;
  if (reduce == "add" || reduce == "sum" || reduce == "mean") return is_bool ? Hlo::Or : Hlo::Add;
  if (reduce == "multiply" || reduce == "prod") return is_bool ? Hlo::And : Hlo::Multiply;
  if (reduce == "amax") return is_bool ? Hlo::Or : Hlo::Maximum;
  if (reduce == "amin") return is_bool ? Hlo::And : Hlo::Minimum;
  throw std::invalid_argument("torchtpu: unknown scatter reduction " + reduce);
}

// The updates of a scatter: src restricted to index's shape, or a scalar value broadcast.
V scatter_updates(LoweringContext& ctx, const Node& node, int arg, const V& index, DType dtype) {
  const auto& shape = index.type.shape;
  if (!ctx.has_input(node, arg)) return ctx.broadcast_to(ctx.scalar(node, arg, dtype), shape);
  V src = ctx.convert(ctx.input(node, arg), dtype);
  if (src.type.shape != shape) {
    if (src.type.rank() == 0) return ctx.broadcast_to(src, shape);
    std::vector<int64_t> zeros(shape.size(), 0), ones(shape.size(), 1);
    src = ctx.slice(src, zeros, shape, ones);
  }
  return src;
}

// scatter.src / scatter.value / scatter.reduce / scatter.value_reduce / scatter_add
// (self, dim, index, src|value[, reduce])
void lower_scatter(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  V index = ctx.input(node, 2);
  V updates = scatter_updates(ctx, node, 3, index, x.type.dtype);
  std::optional<Hlo> combine;
  if (rule_param<Scatter>(node) == Scatter::Add) combine = combiner("add", x.type.dtype);
  if (node.args.size() > 4 && node.args[4].kind == Arg::Kind::String) combine = combiner(node.args[4].s, x.type.dtype);
  ctx.set_result(scatter_linear(ctx, x, along_dim_positions(ctx, x, dim, index), updates, combine));
}

// scatter_reduce.two(self, dim, index, src, reduce, include_self)
void lower_scatter_reduce(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  DType dt = x.type.dtype;
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  V index = ctx.input(node, 2);
  V updates = scatter_updates(ctx, node, 3, index, dt);
  std::string reduce = node.args[4].s;
  bool include_self = node.args.size() <= 5 || node.args[5].is_none() || node.args[5].as_bool();
  V pos = along_dim_positions(ctx, x, dim, index);
  V base = x;
  if (!include_self) {
    V identity = reduce == "prod" ? ctx.constant(1, dt)
                 : reduce == "amax" ? lowest_scalar(ctx, dt)
                 : reduce == "amin" ? highest_scalar(ctx, dt)
                                    : ctx.constant(0, dt);
    base = scatter_linear(ctx, x, pos, ctx.broadcast_to(identity, index.type.shape), std::nullopt);
  }
  V result = scatter_linear(ctx, base, pos, updates, combiner(reduce, dt));
  if (reduce == "mean") {
    V count = ctx.constant(include_self ? 1 : 0, dt, x.type.shape);
    count = scatter_linear(ctx, count, pos, ctx.constant(1, dt, index.type.shape), Hlo::Add);
    V zero = ctx.constant(0, dt, x.type.shape);
    count = ctx.select(ctx.compare(Cmp::EQ, count, zero), ctx.constant(1, dt, x.type.shape), count);
    V q = ctx.binary(Hlo::Divide, result, count);
    if (!is_floating(dt)) {
      // floor division (PyTorch's integer mean); counts are positive
      V r = ctx.binary(Hlo::Remainder, result, count);
      V adjust = ctx.emit(Hlo::And, {ctx.compare(Cmp::NE, r, zero), ctx.compare(Cmp::LT, r, zero)},
                          TensorType{x.type.shape, DType::Bool});
      q = ctx.select(adjust, ctx.binary(Hlo::Subtract, q, ctx.constant(1, dt, x.type.shape)), q);
    }
    result = q;
  }
  ctx.set_result(result);
}

// index_add(self, dim, index, source, alpha)
void lower_index_add(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  DType dt = x.type.dtype;
  V source = ctx.convert(ctx.input(node, 3), dt);
  if (node.args.size() > 4 && !node.args[4].is_none()) {
    const Arg& alpha = node.args[4];
    if (!alpha.is_constant(1.0))
      source = ctx.binary(Hlo::Multiply, source, ctx.broadcast_to(ctx.scalar(node, 4, dt), source.type.shape));
  }
  IndexCheck range = range_check();
  if (x.type.rank() == 0) {
    checked_index(ctx, ctx.input(node, 2), 1, DType::Int64, &range);
    V pos = ctx.constant_int(0, DType::Int32, source.type.shape);
    ctx.set_result(scatter_linear(ctx, x, pos, source, combiner("add", dt)));
    return;
  }
  int64_t dim = wrap_dim(node.args[1].i, x.type.rank());
  const auto& shape = source.type.shape;
  std::vector<int64_t> strides = contiguous_strides(x.type.shape);
  DType it = index_dtype(x.type.numel());
  std::vector<int64_t> coefs = strides;
  coefs[dim] = 0;
  std::vector<int64_t> src_shape = shape;
  if (src_shape.empty()) src_shape = {1};
  V total = affine_index(ctx, src_shape, coefs, 0, it);
  V i = checked_index(ctx, ctx.reshape(ctx.input(node, 2), {src_shape[dim]}), x.type.shape[dim], it, &range);
  if (strides[dim] != 1) i = ctx.binary(Hlo::Multiply, i, ctx.constant_int(strides[dim], it, i.type.shape));
  total = ctx.binary(Hlo::Add, total, ctx.broadcast_in_dim(i, src_shape, {dim}));
  ctx.set_result(scatter_linear(ctx, x, total, ctx.reshape(source, src_shape), combiner("add", dt)));
}

// masked_fill.Scalar / masked_fill.Tensor(self, mask, value)
void lower_masked_fill(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  V mask = to_type(ctx, ctx.input(node, 1), DType::Bool, out.shape);
  V value = ctx.has_input(node, 2) ? ctx.convert(ctx.reshape(ctx.input(node, 2), {}), out.dtype)
                                   : ctx.scalar(node, 2, out.dtype);
  ctx.set_result(ctx.select(mask, ctx.broadcast_to(value, out.shape), to_type(ctx, x, out.dtype, out.shape)));
}

// Inclusive prefix sum of a 1-d integer vector.
V cumsum_1d(LoweringContext& ctx, const V& x) {
  int64_t n = x.type.shape[0];
  TensorType scalar{{}, x.type.dtype};
  std::string body = ctx.region({scalar, scalar}, [&](const std::vector<V>& args) {
    return std::vector<V>{ctx.binary(Hlo::Add, args[0], args[1])};
  });
  std::string attrs = "padding = dense<[[" + std::to_string(n - 1) + ", 0]]> : tensor<1x2xi64>, window_dimensions = " +
                      format_dims({n});
  return ctx.emit(Hlo::ReduceWindow, {x, ctx.constant(0, x.type.dtype)}, x.type, attrs, body);
}

// masked_scatter(self, mask, source): the i-th true position takes source.flatten()[i].
void lower_masked_scatter(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = to_type(ctx, ctx.input(node, 0), out.dtype, out.shape);
  V mask = to_type(ctx, ctx.input(node, 1), DType::Bool, out.shape);
  V source = ctx.input(node, 2);
  if (out.numel() == 0) {
    ctx.set_result(x);
    return;
  }
  DType it = index_dtype(std::max(out.numel(), source.type.numel()) + 1);
  V flat_mask = ctx.reshape(mask, {out.numel()});
  V count = ctx.reduce(ctx.convert(flat_mask, DType::Int64), {0}, ctx.constant_int(0, DType::Int64), Hlo::Add);
  ctx.check(ctx.compare(Cmp::GT, count, ctx.constant_int(source.type.numel(), DType::Int64)), V{},
            RuntimeCheck{RuntimeCheck::Error::Runtime, "Number of elements of source < number of ones in mask"});
  V pos = ctx.binary(Hlo::Subtract, cumsum_1d(ctx, ctx.convert(flat_mask, it)),
                     ctx.constant_int(1, it, {out.numel()}));
  pos = ctx.binary(Hlo::Maximum, pos, ctx.constant_int(0, it, {out.numel()}));
  V taken = ctx.reshape(gather_linear(ctx, source, pos), out.shape);
  ctx.set_result(ctx.select(mask, ctx.convert(taken, out.dtype), x));
}

// masked_scatter_backward(grad_output, mask, sizes): grad at true positions, packed.
void lower_masked_scatter_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V grad = ctx.input(node, 0);
  V mask = to_type(ctx, ctx.input(node, 1), DType::Bool, grad.type.shape);
  int64_t n = grad.type.numel();
  V zeros = ctx.constant(0, out.dtype, out.shape);
  if (n == 0 || out.numel() == 0) {
    ctx.set_result(zeros);
    return;
  }
  DType it = index_dtype(std::max(n, out.numel()) + 1);
  V flat_mask = ctx.reshape(mask, {n});
  V pos = ctx.binary(Hlo::Subtract, cumsum_1d(ctx, ctx.convert(flat_mask, it)), ctx.constant_int(1, it, {n}));
  // Unselected elements go out of bounds, which scatter drops.
  pos = ctx.select(flat_mask, pos, ctx.constant_int(out.numel(), it, {n}));
  ctx.set_result(scatter_linear(ctx, zeros, pos, ctx.reshape(ctx.convert(grad, out.dtype), {n}), Hlo::Add));
}

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse): rows of weight.
void lower_embedding(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V w = ctx.input(node, 0);
  V idx = ctx.input(node, 1);
  int64_t rows = w.type.shape[0], width = w.type.rank() > 1 ? w.type.shape[1] : 1;
  DType it = index_dtype(w.type.numel());
  std::vector<int64_t> coefs(out.rank(), 0);
  coefs.back() = 1;
  V pos = affine_index(ctx, out.shape, coefs, 0, it);
  std::vector<int64_t> lead;
  for (int64_t d = 0; d < idx.type.rank(); ++d) lead.push_back(d);
  IndexCheck range = range_check();
  V i = checked_index(ctx, idx, rows, it, &range);
  i = ctx.binary(Hlo::Multiply, i, ctx.constant_int(width, it, i.type.shape));
  pos = ctx.binary(Hlo::Add, pos, ctx.broadcast_in_dim(i, out.shape, lead));
  ctx.set_result(gather_linear(ctx, w, pos));
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
void lower_embedding_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V grad = ctx.convert(ctx.input(node, 0), out.dtype);
  V idx = ctx.input(node, 1);
  int64_t rows = out.shape[0], width = out.shape[1];
  int64_t padding_idx = node.args[3].i;
  bool scale = node.args[4].as_bool();
  DType it = index_dtype(out.numel() + 1);
  int64_t n = idx.type.numel();
  grad = ctx.reshape(grad, {n, width});
  V flat_idx = checked_index(ctx, ctx.reshape(idx, {n}), rows, it, nullptr);  // embedding checked them
  std::vector<int64_t> gshape{n, width};
  if (padding_idx >= 0) {
    V keep = ctx.compare(Cmp::NE, flat_idx, ctx.constant_int(padding_idx, it, {n}));
    grad = ctx.select(ctx.broadcast_in_dim(keep, gshape, {0}), grad, ctx.constant(0, out.dtype, gshape));
  }
  if (scale && n > 0) {
    V counts = scatter_linear(ctx, ctx.constant(0, out.dtype, {rows}), flat_idx, ctx.constant(1, out.dtype, {n}),
                              Hlo::Add);
    V per = gather_linear(ctx, counts, flat_idx);
    grad = ctx.binary(Hlo::Divide, grad, ctx.broadcast_in_dim(per, gshape, {0}));
  }
  V pos = ctx.binary(Hlo::Add, affine_index(ctx, gshape, {0, 1}, 0, it),
                     ctx.broadcast_in_dim(ctx.binary(Hlo::Multiply, flat_idx, ctx.constant_int(width, it, {n})),
                                          gshape, {0}));
  ctx.set_result(scatter_linear(ctx, ctx.constant(0, out.dtype, out.shape), pos, grad, Hlo::Add));
}

// Sorts x along dim (stable); returns (values, int64 indices). NaN sorts as the largest value.
std::vector<V> sort_along(LoweringContext& ctx, const V& x, int64_t dim, bool descending) {
  TensorType index_type{x.type.shape, DType::Int64};
  V iota = ctx.iota(index_type, dim);
  TensorType s{{}, x.type.dtype}, si{{}, DType::Int64};
  bool fp = is_floating(x.type.dtype);
  std::string body = ctx.region({s, s, si, si}, [&](const std::vector<V>& a) {
    V lhs = a[0], rhs = a[1];
    V less = ctx.compare(descending ? Cmp::GT : Cmp::LT, lhs, rhs);
    if (fp) {
      V lhs_nan = ctx.compare(Cmp::NE, lhs, lhs), rhs_nan = ctx.compare(Cmp::NE, rhs, rhs);
      // ascending: non-NaN before NaN; descending: NaN first.
      V nan_order = descending ? ctx.emit(Hlo::And, {lhs_nan, ctx.unary(Hlo::Not, rhs_nan)}, lhs_nan.type)
                               : ctx.emit(Hlo::And, {rhs_nan, ctx.unary(Hlo::Not, lhs_nan)}, lhs_nan.type);
      less = ctx.emit(Hlo::Or, {less, nan_order}, less.type);
    }
    return std::vector<V>{less};
  });
  return ctx.emit_multi(Hlo::Sort, {x, iota}, {x.type, index_type},
                        "dimension = " + std::to_string(dim) + " : i64, is_stable = true", body);
}

// sort(self, dim, descending) / sort.stable(self, *, stable, dim, descending)
void lower_sort(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  bool stable_overload = node.args.size() == 4;
  int64_t dim = node.args[stable_overload ? 2 : 1].i;
  bool descending = node.args[stable_overload ? 3 : 2].as_bool();
  if (x.type.rank() == 0 || x.type.numel() == 0) {
    ctx.set_results({x, ctx.constant(0, DType::Int64, x.type.shape)});
    return;
  }
  ctx.set_results(sort_along(ctx, x, wrap_dim(dim, x.type.rank()), descending));
}

// topk(self, k, dim, largest, sorted): a full sort, then the first k.
void lower_topk(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  const TensorType& out = ctx.out(node);
  int64_t k = node.args[1].i;
  bool largest = node.args[3].as_bool();
  if (out.numel() == 0) {  // k = 0, or an empty slice count
    ctx.set_results({ctx.constant(0, out.dtype, out.shape), ctx.constant(0, DType::Int64, out.shape)});
    return;
  }
  if (x.type.rank() == 0) {
    ctx.set_results({x, ctx.constant(0, DType::Int64, out.shape)});
    return;
  }
  int64_t dim = wrap_dim(node.args[2].i, x.type.rank());
  std::vector<V> sorted = sort_along(ctx, x, dim, largest);
  std::vector<int64_t> starts(x.type.rank(), 0), limits = x.type.shape, strides(x.type.rank(), 1);
  limits[dim] = k;
  ctx.set_results({ctx.slice(sorted[0], starts, limits, strides), ctx.slice(sorted[1], starts, limits, strides)});
}

// one_hot(self, num_classes)
void lower_one_hot(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V idx = ctx.convert(ctx.input(node, 0), DType::Int64);
  // CPU checks the smallest class first, then the largest.
  const auto& shape = idx.type.shape;
  ctx.check(ctx.compare(Cmp::LT, idx, ctx.constant_int(0, DType::Int64, shape)), idx,
            RuntimeCheck{RuntimeCheck::Error::Runtime, "Class values must be non-negative."});
  ctx.check(ctx.compare(Cmp::GE, idx, ctx.constant_int(out.shape.back(), DType::Int64, shape)), idx,
            RuntimeCheck{RuntimeCheck::Error::Runtime, "Class values must be smaller than num_classes."});
  std::vector<int64_t> lead;
  for (int64_t d = 0; d < idx.type.rank(); ++d) lead.push_back(d);
  V hot = ctx.compare(Cmp::EQ, ctx.broadcast_in_dim(idx, out.shape, lead),
                      ctx.iota(TensorType{out.shape, DType::Int64}, out.rank() - 1));
  ctx.set_result(ctx.convert(hot, out.dtype));
}

LOWERING("aten::one_hot", lower_one_hot);
// index.Tensor's meta kernel checks its indices' dtypes as CPU does; index_put's does not.
LOWERING("aten::index.Tensor", lower_index, Indices::Checked, kTakesComplex);
// "_unsafe_index found unexpected index type Byte": no masks.
LOWERING("aten::_unsafe_index.Tensor", lower_index, Indices::Unchecked, RuleFlags{.complex = true, .index_arg = 1, .index_refuses = kIndexNotInt});
constexpr RuleFlags kIndexPut{.complex = true, .index_arg = 1, .index_refuses = kIndicesNotIntOrBool};
LOWERING("aten::index_put", lower_index_put, Indices::Checked, kIndexPut);
LOWERING("aten::_index_put_impl", lower_index_put, Indices::Checked, kIndexPut);
LOWERING("aten::_unsafe_index_put", lower_index_put, Indices::Unchecked, kIndexPut);
LOWERING("aten::index_select", lower_index_select, nullptr, RuleFlags{.complex = true, .index_arg = 2, .index_refuses = kIndexNotInt});
LOWERING("aten::gather", lower_gather, nullptr, kTakesComplex);
LOWERING("aten::scatter.src", lower_scatter, Scatter::FromArgument, kTakesComplex);
LOWERING("aten::scatter.value", lower_scatter, Scatter::FromArgument, kTakesComplex);
LOWERING("aten::scatter.reduce", lower_scatter, Scatter::FromArgument, kTakesComplex);
LOWERING("aten::scatter.value_reduce", lower_scatter, Scatter::FromArgument, kTakesComplex);
LOWERING("aten::scatter_add", lower_scatter, Scatter::Add, kTakesComplex);
LOWERING("aten::scatter_reduce.two", lower_scatter_reduce, nullptr, kNoBool);
LOWERING("aten::index_add", lower_index_add, nullptr, RuleFlags{.complex = true, .index_arg = 2, .index_refuses = kIndexNotInt});
LOWERING("aten::masked_fill.Scalar", lower_masked_fill, nullptr, kTakesComplex);
LOWERING("aten::masked_fill.Tensor", lower_masked_fill, nullptr, kTakesComplex);
// "masked_scatter_ only supports boolean masks, but got mask with dtype Byte" (masked_fill's meta
// kernel checks its mask, masked_scatter's does not).
LOWERING("aten::masked_scatter", lower_masked_scatter, nullptr,
         RuleFlags{.complex = true, .index_arg = 1, .index_refuses = kAllDTypes & ~kBoolDTypes});
LOWERING("aten::masked_scatter_backward", lower_masked_scatter_backward, nullptr, kTakesComplex);
LOWERING("aten::embedding", lower_embedding);
LOWERING("aten::embedding_dense_backward", lower_embedding_backward, nullptr, RuleFlags{.index_arg = 1, .index_refuses = kIndexNotInt});
LOWERING("aten::sort", lower_sort);
LOWERING("aten::sort.stable", lower_sort);
LOWERING("aten::topk", lower_topk, nullptr, kNoBool);

}  // namespace
}  // namespace torchtpu
