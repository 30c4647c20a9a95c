// Max pooling over the last two or three dims, and im2col / col2im.
// max_pool2d_with_indices follows CPU's loop over the window's positions (a variadic
// reduce_window for large windows); adaptive pools with uneven windows and fractional pools
// gather each cell's window and reduce it (max_over_cell_windows); every backward
// scatter-adds by index. Average pooling and
// upsampling are in resampling.cpp.
// im2col / col2im (nn.Unfold / nn.Fold) are strided windows of the zero-padded image.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "lowering/common.h"

namespace torchtpu {
namespace {

DType acc_dtype(DType t) { return t == DType::BFloat16 || t == DType::Float16 ? DType::Float32 : t; }

int64_t at(const std::vector<int64_t>& v, size_t i, int64_t fill) {
  if (v.empty()) return fill;
  return v.size() > i ? v[i] : v[0];
}

// -- max pooling ---------------------------------------------------------------------------------

// Reduction body over (value, index) pairs, CPU's choice in any order of combination: the
// larger value, the earlier index among equal values, a NaN over a number, and the later index
// among NaNs (CPU's loop takes `val > max || isnan(val)`, so the last NaN of a window wins).
std::string argmax_body(LoweringContext& ctx, DType dt) {
  TensorType sv{{}, dt}, si{{}, DType::Int64};
  return ctx.region({sv, si, sv, si}, [&](const std::vector<V>& a) {
    V av = a[0], ai = a[1], bv = a[2], bi = a[3];
    V b_nan = ctx.compare(Cmp::NE, bv, bv), a_nan = ctx.compare(Cmp::NE, av, av);
    V gt = ctx.compare(Cmp::GT, bv, av);
    V eq = ctx.compare(Cmp::EQ, bv, av);
    V earlier = ctx.compare(Cmp::LT, bi, ai);
    V both_nan = ctx.binary(Hlo::And, b_nan, a_nan);
    V take = ctx.binary(Hlo::Or, gt, ctx.binary(Hlo::And, eq, earlier));
    take = ctx.binary(Hlo::Or, take, ctx.binary(Hlo::And, b_nan, ctx.unary(Hlo::Not, a_nan)));
    take = ctx.binary(Hlo::Or, take, ctx.binary(Hlo::And, both_nan, ctx.compare(Cmp::GT, bi, ai)));
    return std::vector<V>{ctx.select(take, bv, av), ctx.select(take, bi, ai)};
  });
}

// A window geometry over the last n (2 or 3) dims of x: kernel, stride, dilation, low padding,
// and the high padding that makes every window of the output fit.
struct MaxWindow {
  int n = 2;
  int64_t k[3], s[3], d[3], lo[3], hi[3], in[3], out[3];
};

MaxWindow max_window_geometry(const V& x, const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                              const std::vector<int64_t>& pad_lo, const std::vector<int64_t>& dilation,
                              const TensorType& out) {
  int64_t r = x.type.rank();
  MaxWindow w;
  w.n = static_cast<int>(kernel.size());
  for (int k = 0; k < w.n; ++k) {
    w.k[k] = kernel[k];
    w.s[k] = stride[k];
    w.d[k] = dilation[k];
    w.lo[k] = pad_lo[k];
    w.in[k] = x.type.shape[r - w.n + k];
    w.out[k] = out.shape[r - w.n + k];
    w.hi[k] = std::max<int64_t>((w.out[k] - 1) * w.s[k] + w.d[k] * (w.k[k] - 1) + 1 - w.in[k] - w.lo[k], 0);
  }
  return w;
}

// The variadic reduce_window over (value, flat index) pairs: any window size, 2 or 3 dims (the
// flat index is CPU's: h*W + w, or d*H*W + h*W + w).
std::vector<V> max_window_reduce(LoweringContext& ctx, const V& x, const MaxWindow& w, const TensorType& out,
                                 const TensorType& idx_type) {
  int64_t r = x.type.rank();
  TensorType it{x.type.shape, DType::Int64};
  std::vector<V> positions;
  for (int k = 0; k < w.n; ++k) positions.push_back(ctx.iota(it, r - w.n + k));
  V flat = positions[0];
  for (int k = 1; k < w.n; ++k)
    flat = ctx.binary(Hlo::Add,
                      ctx.binary(Hlo::Multiply, flat, ctx.constant_int(w.in[k], DType::Int64, it.shape)),
                      positions[k]);
  DType dt = x.type.dtype;
  std::string body = argmax_body(ctx, dt);
  std::vector<int64_t> dims(r, 1), strides(r, 1), base(r, 1), wdil(r, 1);
  std::string padding = "dense<[";
  for (int64_t i = 0; i < r; ++i) {
    int64_t lo = 0, hi_pad = 0;
    if (i >= r - w.n) {
      int64_t k = i - (r - w.n);
      dims[i] = w.k[k];
      strides[i] = w.s[k];
      wdil[i] = w.d[k];
      lo = w.lo[k];
      hi_pad = w.hi[k];
    }
    padding += (i ? ", [" : "[") + std::to_string(lo) + ", " + std::to_string(hi_pad) + "]";
  }
  padding += "]> : tensor<" + std::to_string(r) + "x2xi64>";
  V init_v = lowest_scalar(ctx, dt);
  V init_i = ctx.constant_int(std::numeric_limits<int64_t>::max(), DType::Int64);
  std::string attrs = "window_dimensions = " + format_dims(dims) + ", window_strides = " + format_dims(strides) +
                      ", base_dilations = " + format_dims(base) + ", window_dilations = " + format_dims(wdil) +
                      ", padding = " + padding;
  return ctx.emit_multi(Hlo::ReduceWindow, {x, flat, init_v, init_i}, {out, idx_type}, attrs, body);
}

// Which window positions of one axis fall inside the image for every output cell: position p
// (0 <= p < k) of cell o reads input o*s - lo + p*d.
std::vector<bool> always_inside(const MaxWindow& w, int axis) {
  std::vector<bool> all(w.k[axis], true);
  for (int64_t p = 0; p < w.k[axis]; ++p)
    for (int64_t o = 0; o < w.out[axis]; ++o) {
      int64_t at = o * w.s[axis] - w.lo[axis] + p * w.d[axis];
      if (at < 0 || at >= w.in[axis]) all[p] = false;
    }
  return all;
}

// Window-position helpers over the output cells (oh, ow), as [Ho, Wo] planes broadcast to the
// output's `shape`: the input row and column a cell's window starts at (o*s - lo), whether
// position (i, j) of each cell's window lies inside the image, and the flat input index of each
// cell's window start.
struct WindowPlanes {
  LoweringContext& ctx;
  const MaxWindow& w;
  std::vector<int64_t> shape;
  TensorType plane{{w.out[0], w.out[1]}, DType::Int64};

  V i64(int64_t v) { return ctx.constant_int(v, DType::Int64, plane.shape); }
  V start(int axis) {
    return ctx.binary(Hlo::Subtract, ctx.binary(Hlo::Multiply, ctx.iota(plane, axis), i64(w.s[axis])),
                      i64(w.lo[axis]));
  }
  V broadcast(const V& v) {
    int64_t r = static_cast<int64_t>(shape.size());
    return ctx.broadcast_in_dim(v, shape, {r - 2, r - 1});
  }
  V valid(int64_t i, int64_t j) {
    auto inside = [&](int axis, int64_t p) {
      V at = ctx.binary(Hlo::Add, start(axis), i64(p * w.d[axis]));
      return ctx.binary(Hlo::And, ctx.compare(Cmp::GE, at, i64(0)), ctx.compare(Cmp::LT, at, i64(w.in[axis])));
    };
    return broadcast(ctx.binary(Hlo::And, inside(0, i), inside(1, j)));
  }
  // The flat input index of each cell's window start, (o_h*s_h - lo_h)*W + (o_w*s_w - lo_w).
  V window_start_index() {
    return broadcast(ctx.binary(Hlo::Add, ctx.binary(Hlo::Multiply, start(0), i64(w.in[1])), start(1)));
  }
};

// CPU's loop written out over the window's positions (row-major, as CPU visits them): one strided
// slice of the input padded with the lowest value per position and an elementwise update, taking
// a larger value or a NaN, or the window's first position inside the image. A padded position
// holds the lowest value, so it is never larger: the inside test is only needed until every
// cell has seen a position inside the image (the first positions, with padding). XLA fuses the
// whole into loops; the variadic reduce_window above runs several times slower on XLA:CPU.
std::vector<V> max_window_unrolled(LoweringContext& ctx, const V& x, const MaxWindow& w, const TensorType& out,
                                   const TensorType& idx_type) {
  int64_t r = x.type.rank();
  DType dt = x.type.dtype;
  std::vector<int64_t> padded = x.type.shape, edge_lo(r, 0), edge_hi(r, 0);
  for (int k = 0; k < 2; ++k) {
    padded[r - 2 + k] += w.lo[k] + w.hi[k];
    edge_lo[r - 2 + k] = w.lo[k];
    edge_hi[r - 2 + k] = w.hi[k];
  }
  V xp = ctx.emit(Hlo::Pad, {x, lowest_scalar(ctx, dt)}, TensorType{padded, dt},
                  "edge_padding_high = " + format_dims(edge_hi) + ", edge_padding_low = " + format_dims(edge_lo) +
                      ", interior_padding = " + format_dims(std::vector<int64_t>(r, 0)));
  std::vector<bool> rows_inside = always_inside(w, 0), cols_inside = always_inside(w, 1);
  WindowPlanes planes{ctx, w, out.shape};
  // Static bookkeeping of which cells have seen a position inside the image.
  std::vector<std::vector<bool>> seen_cell(w.out[0], std::vector<bool>(w.out[1], false));
  bool all_seen = false;
  // best_offset: the flat offset i*d_h*W + j*d_w of the chosen position from the window's start,
  // int32 (cheap on every platform; an int64 division per cell cost XLA:CPU more than the pool).
  V best, best_offset, seen;
  for (int64_t i = 0; i < w.k[0]; ++i)
    for (int64_t j = 0; j < w.k[1]; ++j) {
      std::vector<int64_t> start(r, 0), limit = padded, strides(r, 1);
      for (int k = 0; k < 2; ++k) {
        int64_t offset = (k == 0 ? i : j) * w.d[k];
        start[r - 2 + k] = offset;
        limit[r - 2 + k] = offset + w.s[k] * (w.out[k] - 1) + 1;
        strides[r - 2 + k] = w.s[k];
      }
      V value = ctx.slice(xp, start, limit, strides);
      V valid;  // empty: inside the image for every cell (or no longer needed)
      if (!all_seen && !(rows_inside[i] && cols_inside[j])) valid = planes.valid(i, j);
      V offset = ctx.constant_int(i * w.d[0] * w.in[1] + j * w.d[1], DType::Int32, out.shape);
      if (best.name.empty()) {
        best = value;
        best_offset = offset;
        seen = valid;
      } else {
        V take = ctx.compare(Cmp::GT, value, best);
        if (is_floating(dt)) take = ctx.binary(Hlo::Or, take, ctx.compare(Cmp::NE, value, value));
        if (!all_seen) {
          V first = ctx.unary(Hlo::Not, seen);
          if (!valid.name.empty()) first = ctx.binary(Hlo::And, first, valid);
          take = ctx.binary(Hlo::Or, take, first);
        }
        best = ctx.select(take, value, best);
        best_offset = ctx.select(take, offset, best_offset);
        if (!all_seen) seen = valid.name.empty() ? V{} : ctx.binary(Hlo::Or, seen, valid);
      }
      if (!all_seen) {
        all_seen = true;
        for (int64_t oh = 0; oh < w.out[0]; ++oh)
          for (int64_t ow = 0; ow < w.out[1]; ++ow) {
            int64_t h = oh * w.s[0] - w.lo[0] + i * w.d[0], c = ow * w.s[1] - w.lo[1] + j * w.d[1];
            if (h >= 0 && h < w.in[0] && c >= 0 && c < w.in[1]) seen_cell[oh][ow] = true;
            all_seen = all_seen && seen_cell[oh][ow];
          }
      }
    }
  V index = ctx.binary(Hlo::Add, planes.window_start_index(), ctx.convert(best_offset, DType::Int64));
  return {best, ctx.convert(index, idx_type.dtype)};
}

// Max over windows of x [..., H, W] returning (values, flat h*W+w indices) as CPU computes them.
// Small windows (every usual max pool) take the unrolled form; large ones (a global max pool)
// the reduce_window, whose module size does not grow with the window.
constexpr int64_t kMaxUnrolledWindow = 25;

std::vector<V> max_window(LoweringContext& ctx, const V& x, const MaxWindow& w, const TensorType& out,
                          const TensorType& idx_type) {
  if (w.n == 2 && w.k[0] * w.k[1] <= kMaxUnrolledWindow && out.numel() > 0)
    return max_window_unrolled(ctx, x, w, out, idx_type);
  return max_window_reduce(ctx, x, w, out, idx_type);
}

// max_pool{2,3}d's (kernel_size, stride, padding, dilation) arguments, from argument `first` on,
// over the last n dims of x and the pooled shape `out`.
MaxWindow max_pool_window(const Node& node, int first, int n, const V& x, const TensorType& out) {
  const auto& k = node.args[first].ints;
  const auto& s = node.args[first + 1].ints;
  const auto& p = node.args[first + 2].ints;
  const auto& d = node.args[first + 3].ints;
  std::vector<int64_t> kernel, stride, pad, dilation;
  for (int i = 0; i < n; ++i) {
    kernel.push_back(at(k, i, 1));
    stride.push_back(at(s, i, kernel[i]));  // no stride: the kernel size
    pad.push_back(at(p, i, 0));
    dilation.push_back(at(d, i, 1));
  }
  return max_window_geometry(x, kernel, stride, pad, dilation, out);
}

// max_pool2d_with_indices / max_pool3d_with_indices(self, kernel_size, stride, padding, dilation,
// ceil_mode); rule parameter: the number of pooled dims.
void lower_max_pool(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  int n = rule_param<int>(node);
  ctx.set_results(max_window(ctx, x, max_pool_window(node, 1, n, x, out), out, ctx.out(node, 1)));
}

// The window of an adaptive pool over the last n dims whose sizes divide evenly (kernel =
// stride = in / out), or none.
bool even_adaptive_window(const V& x, const TensorType& pooled, int n, MaxWindow* w) {
  int64_t r = x.type.rank();
  std::vector<int64_t> kernel, zero(n, 0), one(n, 1);
  for (int64_t d = r - n; d < r; ++d) {
    int64_t in = x.type.shape[d], out = pooled.shape[d];
    if (out == 0 || in % out != 0) return false;
    kernel.push_back(in / out);
  }
  *w = max_window_geometry(x, kernel, kernel, zero, one, pooled);
  return true;
}

// Windows placed per output cell (adaptive and fractional pooling), over the last n dims of
// x: for each axis, the first input position of each cell's window and the position after
// its last, int64 in the pooled shape, and the longest window along the axis.
struct CellWindows {
  std::vector<V> start, end;
  std::vector<int64_t> extent;
};

// Max over per-cell windows with CPU's choice of index (argmax_body): each cell's window is
// gathered into trailing window dims ([..., out dims, extent dims], positions past the
// window's end hold the lowest value and the largest index, so they never win) and reduced.
std::vector<V> max_over_cell_windows(LoweringContext& ctx, const V& x, const CellWindows& cells,
                                     const TensorType& out, const TensorType& idx_type) {
  int64_t r = x.type.rank(), n = static_cast<int64_t>(cells.extent.size());
  int64_t plane = 1;
  for (int64_t d = r - n; d < r; ++d) plane *= x.type.shape[d];
  std::vector<int64_t> big = out.shape, cell_dims(r), window_dims;
  for (int64_t a = 0; a < n; ++a) big.push_back(cells.extent[a]);
  for (int64_t d = 0; d < r; ++d) cell_dims[d] = d;
  for (int64_t a = 0; a < n; ++a) window_dims.push_back(r + a);
  TensorType it{big, DType::Int64};
  auto i64 = [&](int64_t v) { return ctx.constant_int(v, DType::Int64, big); };
  V flat = i64(0), valid;
  for (int64_t a = 0; a < n; ++a) {
    int64_t in = x.type.shape[r - n + a];
    V coord = ctx.binary(Hlo::Add, ctx.broadcast_in_dim(cells.start[a], big, cell_dims), ctx.iota(it, r + a));
    V inside = ctx.compare(Cmp::LT, coord, ctx.broadcast_in_dim(cells.end[a], big, cell_dims));
    valid = a == 0 ? inside : ctx.binary(Hlo::And, valid, inside);
    coord = ctx.binary(Hlo::Minimum, coord, i64(in - 1));  // stays in the plane
    flat = ctx.binary(Hlo::Add, ctx.binary(Hlo::Multiply, flat, i64(in)), coord);
  }
  std::vector<int64_t> plane_coefs(big.size(), 0), lead_strides =
      contiguous_strides(std::vector<int64_t>(x.type.shape.begin(), x.type.shape.end() - n));
  for (int64_t d = 0; d < r - n; ++d) plane_coefs[d] = lead_strides[d] * plane;
  V linear = ctx.binary(Hlo::Add, affine_index(ctx, big, plane_coefs, 0, DType::Int64), flat);
  DType dt = x.type.dtype;
  V vals = ctx.select(valid, gather_linear(ctx, x, linear), ctx.broadcast_to(lowest_scalar(ctx, dt), big));
  V idx = ctx.select(valid, flat, i64(std::numeric_limits<int64_t>::max()));
  V init_v = lowest_scalar(ctx, dt);
  V init_i = ctx.constant_int(std::numeric_limits<int64_t>::max(), DType::Int64);
  std::vector<V> best = ctx.emit_multi(Hlo::Reduce, {vals, idx, init_v, init_i}, {out, {out.shape, DType::Int64}},
                                       "dimensions = " + format_dims(window_dims), argmax_body(ctx, dt));
  return {best[0], ctx.convert(best[1], idx_type.dtype)};
}

// adaptive_max_pool{2,3}d(self, output_size); rule parameter: the number of pooled dims. A regular
// max pool when the sizes divide evenly; else cell o of an axis reads CPU's window
// [floor(o*in/out), ceil((o+1)*in/out)).
void lower_adaptive_max_pool(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  int n = rule_param<int>(node);
  int64_t r = x.type.rank();
  MaxWindow even;
  if (out.numel() == 0 || x.type.numel() == 0) {
    ctx.set_results({ctx.constant(0, out.dtype, out.shape), ctx.constant(0, ctx.out(node, 1).dtype, out.shape)});
    return;
  }
  if (even_adaptive_window(x, out, n, &even)) {
    ctx.set_results(max_window(ctx, x, even, out, ctx.out(node, 1)));
    return;
  }
  CellWindows cells;
  TensorType it{out.shape, DType::Int64};
  auto i64 = [&](int64_t v) { return ctx.constant_int(v, DType::Int64, out.shape); };
  for (int a = 0; a < n; ++a) {
    int64_t d = r - n + a, in = x.type.shape[d], outn = out.shape[d];
    V o = ctx.iota(it, d);
    cells.start.push_back(ctx.binary(Hlo::Divide, ctx.binary(Hlo::Multiply, o, i64(in)), i64(outn)));
    V next = ctx.binary(Hlo::Multiply, ctx.binary(Hlo::Add, o, i64(1)), i64(in));
    cells.end.push_back(ctx.binary(Hlo::Divide, ctx.binary(Hlo::Add, next, i64(outn - 1)), i64(outn)));
    int64_t extent = 0;
    for (int64_t c = 0; c < outn; ++c) extent = std::max(extent, ((c + 1) * in + outn - 1) / outn - c * in / outn);
    cells.extent.push_back(extent);
  }
  ctx.set_results(max_over_cell_windows(ctx, x, cells, out, ctx.out(node, 1)));
}

// fractional_max_pool{2,3}d(self, kernel_size, output_size, random_samples); rule parameter: the
// number of pooled dims. Each plane's windows start where CPU's generate_intervals puts them,
// from the plane's samples ([N or 1, C, n]; sample k drives axis n-1-k for 2-d pools, axis k
// for 3-d ones, as CPU reads them), computed in the input's dtype as CPU computes them:
// start(i) = int((i + u) * alpha) - int(u * alpha), alpha = (in - k) / (out - 1), and the last
// window ends at the input's end.
void lower_fractional_max_pool(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  int n = rule_param<int>(node);
  int64_t r = x.type.rank();
  const auto& kernel = node.args[1].ints;
  if (out.numel() == 0 || x.type.numel() == 0) {
    ctx.set_results({ctx.constant(0, out.dtype, out.shape), ctx.constant(0, ctx.out(node, 1).dtype, out.shape)});
    return;
  }
  DType dt = x.type.dtype;
  std::vector<int64_t> lead(x.type.shape.begin(), x.type.shape.end() - n), per_axis = lead;
  per_axis.push_back(n);
  // CPU reads the samples of batch item b (of item 0 for an unbatched input): a samples
  // tensor may hold more items than the input.
  V given = ctx.convert(ctx.input(node, 3), dt);
  std::vector<int64_t> items = given.type.shape;
  items[0] = lead.size() > 1 ? lead[0] : 1;
  V samples = ctx.reshape(ctx.slice(given, std::vector<int64_t>(items.size(), 0), items,
                                    std::vector<int64_t>(items.size(), 1)),
                          per_axis);
  std::vector<int64_t> lead_dims(lead.size());
  for (size_t d = 0; d < lead.size(); ++d) lead_dims[d] = static_cast<int64_t>(d);
  CellWindows cells;
  TensorType it{out.shape, DType::Int64};
  for (int a = 0; a < n; ++a) {
    int64_t d = r - n + a, in = x.type.shape[d], outn = out.shape[d], k = at(kernel, a, 1);
    int64_t sample_at = n == 2 ? n - 1 - a : a;
    std::vector<int64_t> lo(per_axis.size(), 0), hi = per_axis, step(per_axis.size(), 1);
    lo.back() = sample_at;
    hi.back() = sample_at + 1;
    V u = ctx.broadcast_in_dim(ctx.reshape(ctx.slice(samples, lo, hi, step), lead), out.shape, lead_dims);
    V o = ctx.iota(it, d);
    V start;
    if (outn > 1) {
      Ex e = make_ex(ctx, dt, out.shape);
      V alpha = e.div(e.k(static_cast<double>(in - k)), e.k(static_cast<double>(outn - 1)));
      V shifted = ctx.convert(e.mul(e.add(ctx.convert(o, dt), u), alpha), DType::Int32);
      V base = ctx.convert(e.mul(u, alpha), DType::Int32);
      start = ctx.convert(ctx.binary(Hlo::Subtract, shifted, base), DType::Int64);
      start = ctx.select(ctx.compare(Cmp::EQ, o, ctx.constant_int(outn - 1, DType::Int64, out.shape)),
                         ctx.constant_int(in - k, DType::Int64, out.shape), start);
    } else {
      start = ctx.constant_int(in - k, DType::Int64, out.shape);
    }
    cells.start.push_back(start);
    cells.end.push_back(ctx.binary(Hlo::Add, start, ctx.constant_int(k, DType::Int64, out.shape)));
    cells.extent.push_back(k);
  }
  ctx.set_results(max_over_cell_windows(ctx, x, cells, out, ctx.out(node, 1)));
}

// Scatter-adds grad [..., Ho, Wo] into [..., H, W] (n = 2; [..., D, H, W] for n = 3) at flat
// per-plane indices: one index per update into the flattened planes (plane * H*W + index), in
// grad's own shape (a (plane, index) pair built by concatenation cost XLA:CPU more than the
// scatter). An index outside its plane is sent past the end, so that the scatter drops it
// instead of writing a neighbouring plane.
V scatter_by_index(LoweringContext& ctx, const V& grad, const V& indices, const TensorType& out, int n = 2) {
  DType acc = acc_dtype(out.dtype);
  int64_t r = out.rank();
  int64_t hw = 1;
  for (int64_t d = r - n; d < r; ++d) hw *= out.shape[d];
  const std::vector<int64_t>& cells = grad.type.shape;
  auto i64 = [&](int64_t v) { return ctx.constant_int(v, DType::Int64, cells); };
  V idx = ctx.convert(indices, DType::Int64);
  V flat = idx;
  for (int64_t d = r - n - 1, stride = hw; d >= 0; stride *= out.shape[d], --d)
    flat = ctx.binary(Hlo::Add, flat,
                      ctx.binary(Hlo::Multiply, ctx.iota(TensorType{cells, DType::Int64}, d), i64(stride)));
  V inside = ctx.binary(Hlo::And, ctx.compare(Cmp::GE, idx, i64(0)), ctx.compare(Cmp::LT, idx, i64(hw)));
  flat = ctx.select(inside, flat, i64(out.numel()));
  V summed = scatter_linear(ctx, ctx.constant(0, acc, out.shape), flat, ctx.convert(grad, acc), Hlo::Add);
  return ctx.convert(summed, out.dtype);
}

// max_pool{2,3}d_with_indices_backward(grad_output, self, kernel, stride, padding, dilation,
// ceil_mode, indices); rule parameter: the number of pooled dims.
void lower_max_pool_backward(LoweringContext& ctx, const Node& node) {
  ctx.set_result(scatter_by_index(ctx, ctx.input(node, 0), ctx.input(node, 7), ctx.out(node), rule_param<int>(node)));
}

// adaptive_max_pool{2,3}d_backward(grad_output, self, indices); rule parameter: the number of
// pooled dims.
void lower_adaptive_max_pool_backward(LoweringContext& ctx, const Node& node) {
  ctx.set_result(scatter_by_index(ctx, ctx.input(node, 0), ctx.input(node, 2), ctx.out(node), rule_param<int>(node)));
}

// fractional_max_pool{2,3}d_backward(grad_output, self, kernel_size, output_size, indices);
// rule parameter: the number of pooled dims.
void lower_fractional_max_pool_backward(LoweringContext& ctx, const Node& node) {
  ctx.set_result(scatter_by_index(ctx, ctx.input(node, 0), ctx.input(node, 4), ctx.out(node), rule_param<int>(node)));
}

// -- im2col / col2im (nn.Unfold / nn.Fold) ----------------------------------------------------
// Both are sums of strided windows, one per kernel position (i, j): im2col reads the window
// of the zero-padded input at (i*dh, j*dw) with the stride; col2im adds each position's
// columns back into a zero image through a pad with interior padding (the stride). No
// multiplication is involved, so infinities and NaN stay where they are, and col2im adds
// the positions in CPU's order (ascending kernel position per pixel).

struct Window {
  int64_t kh, kw, dh, dw, ph, pw, sh, sw;
  int64_t oh, ow;  // output positions per axis
};

Window window_of(const Node& node, int first, int64_t h, int64_t w) {
  const auto& k = node.args[first].ints;
  const auto& d = node.args[first + 1].ints;
  const auto& p = node.args[first + 2].ints;
  const auto& s = node.args[first + 3].ints;
  Window win{k[0], k[1], d[0], d[1], p[0], p[1], s[0], s[1], 0, 0};
  win.oh = (h + 2 * win.ph - (win.dh * (win.kh - 1) + 1)) / win.sh + 1;
  win.ow = (w + 2 * win.pw - (win.dw * (win.kw - 1) + 1)) / win.sw + 1;
  return win;
}

// im2col(self [N,] C, H, W, kernel_size, dilation, padding, stride) -> [N,] C*kh*kw, oh*ow
void lower_im2col(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  std::vector<int64_t> shape = x.type.shape;
  bool batched = shape.size() == 4;
  if (!batched) shape.insert(shape.begin(), 1);
  int64_t n = shape[0], c = shape[1];
  Window win = window_of(node, 1, shape[2], shape[3]);
  if (out.numel() == 0) {
    ctx.set_result(ctx.constant(0, out.dtype, out.shape));
    return;
  }
  x = ctx.reshape(x, shape);
  V zero = ctx.constant(0, x.type.dtype);
  std::vector<int64_t> padded = {n, c, shape[2] + 2 * win.ph, shape[3] + 2 * win.pw};
  x = ctx.emit(Hlo::Pad, {x, zero}, TensorType{padded, x.type.dtype},
               "edge_padding_high = " + format_dims({0, 0, win.ph, win.pw}) +
                   ", edge_padding_low = " + format_dims({0, 0, win.ph, win.pw}) +
                   ", interior_padding = " + format_dims({0, 0, 0, 0}));
  std::vector<V> positions;
  for (int64_t i = 0; i < win.kh; ++i)
    for (int64_t j = 0; j < win.kw; ++j) {
      int64_t h0 = i * win.dh, w0 = j * win.dw;
      V part = ctx.slice(x, {0, 0, h0, w0}, {n, c, h0 + win.sh * (win.oh - 1) + 1, w0 + win.sw * (win.ow - 1) + 1},
                         {1, 1, win.sh, win.sw});
      positions.push_back(ctx.reshape(part, {n, c, 1, win.oh * win.ow}));
    }
  V cols = positions.size() == 1 ? positions[0] : ctx.concatenate(positions, 2);
  ctx.set_result(ctx.reshape(cols, out.shape));
}

// col2im(self [N,] C*kh*kw, L, output_size, kernel_size, dilation, padding, stride) -> [N,] C, H, W
void lower_col2im(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V cols = ctx.input(node, 0);
  const auto& size = node.args[1].ints;
  Window win = window_of(node, 2, size[0], size[1]);
  int64_t n = cols.type.rank() == 3 ? cols.type.shape[0] : 1;
  int64_t c = out.shape[out.rank() - 3];
  if (out.numel() == 0 || cols.type.numel() == 0) {
    ctx.set_result(ctx.constant(0, out.dtype, out.shape));
    return;
  }
  int64_t hp = size[0] + 2 * win.ph, wp = size[1] + 2 * win.pw, k = win.kh * win.kw;
  cols = ctx.reshape(cols, {n, c, k, win.oh, win.ow});
  TensorType image{{n, c, hp, wp}, out.dtype};
  V zero = ctx.constant(0, out.dtype);
  V sum = ctx.constant(0, out.dtype, image.shape);
  for (int64_t i = 0; i < win.kh; ++i)
    for (int64_t j = 0; j < win.kw; ++j) {
      int64_t at = i * win.kw + j, h0 = i * win.dh, w0 = j * win.dw;
      V part = ctx.reshape(ctx.slice(cols, {0, 0, at, 0, 0}, {n, c, at + 1, win.oh, win.ow}, {1, 1, 1, 1, 1}),
                           {n, c, win.oh, win.ow});
      int64_t h1 = hp - (h0 + win.sh * (win.oh - 1) + 1), w1 = wp - (w0 + win.sw * (win.ow - 1) + 1);
      V placed = ctx.emit(Hlo::Pad, {part, zero}, image,
                          "edge_padding_high = " + format_dims({0, 0, h1, w1}) +
                              ", edge_padding_low = " + format_dims({0, 0, h0, w0}) +
                              ", interior_padding = " + format_dims({0, 0, win.sh - 1, win.sw - 1}));
      sum = ctx.binary(Hlo::Add, sum, placed);
    }
  V cropped = ctx.slice(sum, {0, 0, win.ph, win.pw}, {n, c, win.ph + size[0], win.pw + size[1]}, {1, 1, 1, 1});
  ctx.set_result(ctx.reshape(cropped, out.shape));
}

LOWERING("aten::max_pool2d_with_indices", lower_max_pool, 2, kNoBool);
LOWERING("aten::max_pool2d_with_indices_backward", lower_max_pool_backward, 2, kFloatOnly);
LOWERING("aten::max_pool3d_with_indices", lower_max_pool, 3, kNoBool);
LOWERING("aten::max_pool3d_with_indices_backward", lower_max_pool_backward, 3, kFloatOnly);
LOWERING("aten::adaptive_max_pool2d", lower_adaptive_max_pool, 2, kFloatOnly);
LOWERING("aten::adaptive_max_pool2d_backward", lower_adaptive_max_pool_backward, 2, kFloatOnly);
LOWERING("aten::adaptive_max_pool3d", lower_adaptive_max_pool, 3, kFloatOnly);
LOWERING("aten::adaptive_max_pool3d_backward", lower_adaptive_max_pool_backward, 3, kFloatOnly);
LOWERING("aten::fractional_max_pool2d", lower_fractional_max_pool, 2, kFloatOnly);
LOWERING("aten::fractional_max_pool2d_backward", lower_fractional_max_pool_backward, 2, kFloatOnly);
LOWERING("aten::fractional_max_pool3d", lower_fractional_max_pool, 3, kFloatOnly);
LOWERING("aten::fractional_max_pool3d_backward", lower_fractional_max_pool_backward, 3, kFloatOnly);
LOWERING("aten::im2col", lower_im2col, nullptr, kFloatOnly);
LOWERING("aten::col2im", lower_col2im, nullptr, kFloatOnly);

}  // namespace
}  // namespace torchtpu
