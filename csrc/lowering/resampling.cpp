// Average pooling (avg_pool2d/3d, adaptive) and upsampling (nearest, bilinear) over the trailing
// spatial dims, and their backward ops: each output is a sum (divided), a copy or a weighted
// pair of input elements along each axis. They are computed as window sums (reduce_window),
// strided placements and static gathers, never as products with 0/1 matrices: a product
// multiplies every element by the zeros outside its window, so one NaN or infinity would turn
// its whole row into NaN where CPU's kernels keep it to the windows that hold it.
#include <algorithm>
#include <cmath>

#include "lowering/common.h"

namespace torchtpu {
namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t at(const std::vector<int64_t>& v, size_t i, int64_t fill) {
  if (v.empty()) return fill;
  return v.size() > i ? v[i] : v[0];
}

// A constant tensor of `shape` holding `values` (row-major) in an integer or float dtype.
V constant_of(LoweringContext& ctx, const std::vector<double>& values, const std::vector<int64_t>& shape, DType dtype) {
  TensorType type{shape, dtype};
  std::string lit;
  char buf[64];
  for (size_t i = 0; i < values.size(); ++i) {
    if (is_floating(dtype)) std::snprintf(buf, sizeof(buf), "%.17e", values[i]);
    else std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(std::llround(values[i])));
    lit += (i ? ", " : "") + std::string(buf);
  }
  // A flat literal reshaped: dense<> of a rank-n type needs nested brackets, a vector does not.
  TensorType flat{{static_cast<int64_t>(values.size())}, dtype};
  V v = ctx.emit(Hlo::Constant, {}, flat, "value = dense<[" + lit + "]> : " + flat.mlir());
  return ctx.reshape(v, type.shape);
}

// `values` laid along dim `axis` of `shape` (the same along every other dim).
V along_axis(LoweringContext& ctx, const std::vector<double>& values, int64_t axis, const std::vector<int64_t>& shape,
             DType dtype) {
  V v = constant_of(ctx, values, {static_cast<int64_t>(values.size())}, dtype);
  return ctx.broadcast_in_dim(v, shape, {axis});
}

std::vector<int64_t> unit_strides(int64_t rank) { return std::vector<int64_t>(rank, 1); }

// x[start:limit:stride] along `axis`.
V slice_along(LoweringContext& ctx, const V& x, int64_t axis, int64_t start, int64_t limit, int64_t stride) {
  std::vector<int64_t> begin(x.type.rank(), 0), end = x.type.shape, strides = unit_strides(x.type.rank());
  begin[axis] = start;
  end[axis] = limit;
  strides[axis] = stride;
  return ctx.slice(x, begin, end, strides);
}

// x padded with zeros along `axis`: `low` before, `high` after (negative: cropped), `interior`
// between neighbours.
V pad_along(LoweringContext& ctx, const V& x, int64_t axis, int64_t low, int64_t high, int64_t interior) {
  int64_t r = x.type.rank(), n = x.type.shape[axis];
  std::vector<int64_t> lo(r, 0), hi(r, 0), in(r, 0), shape = x.type.shape;
  lo[axis] = low;
  hi[axis] = high;
  in[axis] = interior;
  shape[axis] = low + high + (n == 0 ? 0 : n + (n - 1) * interior);
  return ctx.emit(Hlo::Pad, {x, ctx.constant(0, x.type.dtype)}, TensorType{shape, x.type.dtype},
                  "edge_padding_high = " + format_dims(hi) + ", edge_padding_low = " + format_dims(lo) +
                      ", interior_padding = " + format_dims(in));
}

std::vector<int64_t> all_dims(int64_t rank) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
  return dims;
}

// True at position `at` along `axis` of `shape`.
V at_position(LoweringContext& ctx, const std::vector<int64_t>& shape, int64_t axis, int64_t at) {
  TensorType positions{shape, DType::Int64};
  return ctx.compare(Cmp::EQ, ctx.iota(positions, axis), ctx.constant_int(at, DType::Int64, shape));
}

// -- maps along one axis ---------------------------------------------------------------------
// Every resampling here is, along each axis, a map out[i] = sum over taps t of
// f_t(x[index_t[i]]), where f_t multiplies by a weight per output (bilinear), keeps or zeroes
// per output (a window shorter than the longest; selected, never multiplied by 0), or copies.

struct Tap {
  std::vector<int64_t> index;
  std::vector<double> weight;  // empty: none
  std::vector<double> inside;  // empty: every output reads this tap
};
using Taps = std::vector<Tap>;

// f_t on values laid along `axis` for the outputs `positions` (all of them when empty).
V apply_tap(LoweringContext& ctx, const Tap& tap, const V& v, int64_t axis, const std::vector<int64_t>& positions) {
  auto pick = [&](const std::vector<double>& all) {
    if (positions.empty()) return all;
    std::vector<double> some;
    for (int64_t o : positions) some.push_back(all[o]);
    return some;
  };
  if (!tap.weight.empty())
    return ctx.binary(Hlo::Multiply, along_axis(ctx, pick(tap.weight), axis, v.type.shape, v.type.dtype), v);
  if (!tap.inside.empty()) {
    V keep = ctx.convert(along_axis(ctx, pick(tap.inside), axis, v.type.shape, DType::Int64), DType::Bool);
    return ctx.select(keep, v, ctx.constant(0, v.type.dtype, v.type.shape));
  }
  return v;
}

// A map's taps repeat: with out = period * n, output i * period + r of tap t reads
// clamp(i * step_t + offset_t[r], 0, in - 1) (integer up- and downscales, most adaptive
// windows), but for a few exceptional outputs (bilinear's second tap at a clamped first
// output, which CPU reads weighted 0), computed on their own.
struct Periodic {
  int64_t period = 0, n = 0;
  std::vector<int64_t> step;                 // per tap
  std::vector<std::vector<int64_t>> offset;  // per tap, per residue
  std::vector<int64_t> exceptions;           // outputs
  int64_t low = 0, high = 0;                 // copies of the first (last) element the edge-padded input needs
};

constexpr int64_t kMaxPeriod = 16;
constexpr size_t kMaxExceptions = 4;

bool find_periodic(const Taps& taps, int64_t in, Periodic* found) {
  int64_t out = taps[0].index.size();
  for (int64_t period = 1; period <= std::min<int64_t>(out, kMaxPeriod); ++period) {
    if (out % period != 0) continue;
    Periodic p;
    p.period = period;
    p.n = out / period;
    int64_t mid = (p.n - 1) / 2;
    std::vector<bool> exceptional(out, false);
    bool ok = true;
    for (const Tap& tap : taps) {
      int64_t step = p.n > 1 ? tap.index[(mid + 1) * period] - tap.index[mid * period] : 1;
      ok = ok && step >= 1;
      p.step.push_back(step);
      p.offset.emplace_back();
      for (int64_t r = 0; r < period && ok; ++r) {
        int64_t c = tap.index[mid * period + r] - mid * step;
        p.offset.back().push_back(c);
        p.low = std::max(p.low, -c);
        p.high = std::max(p.high, (p.n - 1) * step + c - (in - 1));
        for (int64_t i = 0; i < p.n; ++i)
          if (tap.index[i * period + r] != std::clamp<int64_t>(i * step + c, 0, in - 1)) exceptional[i * period + r] = true;
      }
    }
    for (int64_t o = 0; o < out; ++o)
      if (exceptional[o]) p.exceptions.push_back(o);
    // A map clamped at length (much of it reading one edge) is a gather's job.
    if (ok && p.exceptions.size() <= kMaxExceptions && p.low <= kMaxPeriod && p.high <= kMaxPeriod) {
      *found = p;
      return true;
    }
  }
  return false;
}

std::vector<int64_t> residue_positions(const Periodic& p, int64_t r) {
  std::vector<int64_t> positions;
  for (int64_t i = 0; i < p.n; ++i) positions.push_back(i * p.period + r);
  return positions;
}

// x with `low` copies of its first element before it and `high` of its last after it.
V pad_with_edges(LoweringContext& ctx, const V& x, int64_t axis, int64_t low, int64_t high) {
  int64_t in = x.type.shape[axis];
  std::vector<V> parts;
  if (low > 0) parts.push_back(ctx.concatenate(std::vector<V>(low, slice_along(ctx, x, axis, 0, 1, 1)), axis));
  parts.push_back(x);
  if (high > 0) parts.push_back(ctx.concatenate(std::vector<V>(high, slice_along(ctx, x, axis, in - 1, in, 1)), axis));
  return parts.size() == 1 ? x : ctx.concatenate(parts, axis);
}

// One exceptional output's value: its taps read one by one.
V exceptional_output(LoweringContext& ctx, const V& x, int64_t axis, const Taps& taps, int64_t o) {
  V sum;
  for (const Tap& tap : taps) {
    V column = apply_tap(ctx, tap, slice_along(ctx, x, axis, tap.index[o], tap.index[o] + 1, 1), axis, {o});
    sum = sum.name.empty() ? column : ctx.binary(Hlo::Add, sum, column);
  }
  return sum;
}

// A periodic map: per residue, each tap a strided slice of the edge-padded x, combined; the
// residues stacked on a new dim after `axis` and merged into it. XLA fuses this into loops on
// every platform (a gather does not; interleaving by zero padding and sums ran 3x slower on
// XLA:CPU along a major dim), and it reads only the taps, so a NaN or infinity stays in the
// outputs that read it.
V apply_periodic(LoweringContext& ctx, const V& x, int64_t axis, const Taps& taps, const Periodic& p) {
  V padded = pad_with_edges(ctx, x, axis, p.low, p.high);
  std::vector<int64_t> part_shape = x.type.shape, out_shape = x.type.shape;
  part_shape[axis] = p.n;
  part_shape.insert(part_shape.begin() + axis + 1, 1);
  out_shape[axis] = p.n * p.period;
  std::vector<V> parts;
  for (int64_t r = 0; r < p.period; ++r) {
    V sum;
    for (size_t t = 0; t < taps.size(); ++t) {
      int64_t start = p.offset[t][r] + p.low;
      V slice = slice_along(ctx, padded, axis, start, start + (p.n - 1) * p.step[t] + 1, p.step[t]);
      V v = apply_tap(ctx, taps[t], slice, axis, residue_positions(p, r));
      sum = t == 0 ? v : ctx.binary(Hlo::Add, sum, v);
    }
    parts.push_back(ctx.reshape(sum, part_shape));
  }
  V y = ctx.reshape(parts.size() == 1 ? parts[0] : ctx.concatenate(parts, axis + 1), out_shape);
  if (p.exceptions.empty()) return y;
  // Exceptions at the ends (the usual place: clamping) are concatenated around the periodic
  // middle; others selected in (a pass over the whole result each).
  int64_t out = out_shape[axis], first = 0, last = out;
  for (int64_t o : p.exceptions) first += o == first ? 1 : 0;
  for (auto it = p.exceptions.rbegin(); it != p.exceptions.rend(); ++it) last -= *it == last - 1 ? 1 : 0;
  if (first + (out - last) == static_cast<int64_t>(p.exceptions.size()) && first < last) {
    std::vector<V> parts;
    for (int64_t o = 0; o < first; ++o) parts.push_back(exceptional_output(ctx, x, axis, taps, o));
    parts.push_back(slice_along(ctx, y, axis, first, last, 1));
    for (int64_t o = last; o < out; ++o) parts.push_back(exceptional_output(ctx, x, axis, taps, o));
    return ctx.concatenate(parts, axis);
  }
  for (int64_t o : p.exceptions) {
    V column = ctx.broadcast_in_dim(exceptional_output(ctx, x, axis, taps, o), out_shape, all_dims(x.type.rank()));
    y = ctx.select(at_position(ctx, out_shape, axis, o), column, y);
  }
  return y;
}

// A gather with constant indices along `axis`.
V gather_along(LoweringContext& ctx, const V& x, int64_t axis, const std::vector<int64_t>& index) {
  int64_t r = x.type.rank(), n = static_cast<int64_t>(index.size());
  std::vector<int64_t> out_shape = x.type.shape;
  out_shape[axis] = n;
  V idx = constant_of(ctx, std::vector<double>(index.begin(), index.end()), {n, 1}, DType::Int64);
  std::vector<int64_t> offset_dims, slice_sizes = x.type.shape;
  for (int64_t d = 0; d < r; ++d)
    if (d != axis) offset_dims.push_back(d);
  slice_sizes[axis] = 1;
  GatherDimensionNumbers numbers{offset_dims, {axis}, {axis}, 1};
  std::string attrs = "dimension_numbers = " + numbers.attribute() + ", indices_are_sorted = true, slice_sizes = " +
                      format_dims(slice_sizes);
  return ctx.emit(Hlo::Gather, {x, idx}, TensorType{out_shape, x.type.dtype}, attrs);
}

// The map applied to x along `axis`: periodic maps by slices, others by gathers.
V apply_taps(LoweringContext& ctx, const V& x, int64_t axis, const Taps& taps) {
  std::vector<int64_t> out_shape = x.type.shape;
  out_shape[axis] = taps.empty() ? 0 : taps[0].index.size();
  if (taps.empty() || numel(out_shape) == 0 || x.type.numel() == 0) return ctx.constant(0, x.type.dtype, out_shape);
  Periodic periodic;
  if (find_periodic(taps, x.type.shape[axis], &periodic)) return apply_periodic(ctx, x, axis, taps, periodic);
  V sum;
  for (const Tap& tap : taps) {
    V v = apply_tap(ctx, tap, gather_along(ctx, x, axis, tap.index), axis, {});
    sum = sum.name.empty() ? v : ctx.binary(Hlo::Add, sum, v);
  }
  return sum;
}

// For each input position, the outputs whose tap reads it (contiguous: an index never
// decreases), as a window-sum map from outputs to inputs.
Taps readers(const std::vector<int64_t>& index, int64_t in) {
  std::vector<int64_t> lo, hi;
  int64_t n = index.size(), first = 0;
  for (int64_t h = 0; h < in; ++h) {
    while (first < n && index[first] < h) ++first;
    int64_t last = first;
    while (last < n && index[last] == h) ++last;
    lo.push_back(first);
    hi.push_back(last);
  }
  Taps taps;
  int64_t longest = 0;
  for (int64_t h = 0; h < in; ++h) longest = std::max(longest, hi[h] - lo[h]);
  for (int64_t j = 0; j < longest; ++j) {
    Tap tap;
    bool all = true;
    for (int64_t h = 0; h < in; ++h) {
      tap.index.push_back(std::min(lo[h] + j, std::max<int64_t>(n - 1, 0)));
      tap.inside.push_back(lo[h] + j < hi[h] ? 1 : 0);
      all = all && lo[h] + j < hi[h];
    }
    if (all) tap.inside.clear();
    taps.push_back(tap);
  }
  return taps;
}

// The transpose of a map whose taps are strided slices (a downscale, adaptive windows): each
// tap's gradients placed back at its step in the edge-padded input (zero padding between) and
// summed; the padding's sums folded into the first and last elements; an exceptional output's
// gradient added where its taps read.
V strided_taps_transposed(LoweringContext& ctx, const V& g, int64_t axis, const Taps& taps, const Periodic& p,
                          int64_t in) {
  V regular = g;
  for (int64_t o : p.exceptions)
    regular = ctx.select(at_position(ctx, g.type.shape, axis, o), ctx.constant(0, g.type.dtype, g.type.shape), regular);
  int64_t padded = p.low + in + p.high;
  V sum;
  for (size_t t = 0; t < taps.size(); ++t) {
    int64_t start = p.offset[t][0] + p.low;
    V placed = pad_along(ctx, apply_tap(ctx, taps[t], regular, axis, {}), axis, start,
                         padded - (start + (p.n - 1) * p.step[t] + 1), p.step[t] - 1);
    sum = t == 0 ? placed : ctx.binary(Hlo::Add, sum, placed);
  }
  V grad = slice_along(ctx, sum, axis, p.low, p.low + in, 1);
  auto fold = [&](int64_t from, int64_t to, int64_t at) {
    V total = ctx.reduce(slice_along(ctx, sum, axis, from, to, 1), {axis}, ctx.constant(0, g.type.dtype), Hlo::Add);
    std::vector<int64_t> one = grad.type.shape, dims;
    one[axis] = 1;
    for (int64_t d = 0; d < grad.type.rank(); ++d)
      if (d != axis) dims.push_back(d);
    return pad_along(ctx, ctx.broadcast_in_dim(total, one, dims), axis, at, in - 1 - at, 0);
  };
  if (p.low > 0) grad = ctx.binary(Hlo::Add, grad, fold(0, p.low, 0));
  if (p.high > 0) grad = ctx.binary(Hlo::Add, grad, fold(p.low + in, padded, in - 1));
  for (int64_t o : p.exceptions)
    for (const Tap& tap : taps) {
      V column = apply_tap(ctx, tap, slice_along(ctx, g, axis, o, o + 1, 1), axis, {o});
      grad = ctx.binary(Hlo::Add, grad, pad_along(ctx, column, axis, tap.index[o], in - 1 - tap.index[o], 0));
    }
  return grad;
}

// The transpose of apply_taps: input h sums f_t of the gradients of the outputs reading it.
// Strided taps are placed back; other maps (upscales) transpose into window-sum maps per tap
// (the readers of an upscale are a downscale: strided slices again).
V apply_taps_transposed(LoweringContext& ctx, const V& g, int64_t axis, const Taps& taps, int64_t in) {
  std::vector<int64_t> shape = g.type.shape;
  shape[axis] = in;
  V sum = ctx.constant(0, g.type.dtype, shape);
  if (taps.empty() || numel(shape) == 0 || g.type.numel() == 0) return sum;
  Periodic p;
  if (find_periodic(taps, in, &p) && p.period == 1) return strided_taps_transposed(ctx, g, axis, taps, p, in);
  for (size_t t = 0; t < taps.size(); ++t) {
    V part = apply_taps(ctx, apply_tap(ctx, taps[t], g, axis, {}), axis, readers(taps[t].index, in));
    sum = t == 0 ? part : ctx.binary(Hlo::Add, sum, part);
  }
  return sum;
}

// Windows along one axis given per output position: output i sums input positions [lo, hi).
struct Windows {
  std::vector<int64_t> lo, hi;
};

// A window sum as taps: position j of every window (clamped into the input where a window is
// shorter, and then zeroed).
Taps window_taps(const Windows& w, int64_t in) {
  int64_t longest = 0;
  for (size_t i = 0; i < w.lo.size(); ++i) longest = std::max(longest, w.hi[i] - w.lo[i]);
  Taps taps;
  for (int64_t j = 0; j < longest; ++j) {
    Tap tap;
    bool all = true;
    for (size_t i = 0; i < w.lo.size(); ++i) {
      tap.index.push_back(std::min(w.lo[i] + j, in - 1));
      tap.inside.push_back(w.lo[i] + j < w.hi[i] ? 1 : 0);
      all = all && w.lo[i] + j < w.hi[i];
    }
    if (all) tap.inside.clear();
    taps.push_back(tap);
  }
  return taps;
}

// One axis of windows of one size at one stride: output o sums positions [o*stride, o*stride +
// kernel) of the input with pad_lo zeros before it (and as many after as the last window needs).
struct UniformAxis {
  int64_t in, out, kernel, stride, pad_lo;
  int64_t pad_hi() const { return std::max<int64_t>((out - 1) * stride + kernel - in - pad_lo, 0); }
  // Windows side by side from the start, none past the end (the input's tail may go unread).
  bool tiles() const { return stride == kernel && pad_lo == 0 && out * kernel <= in; }
};

// The tiled axes of x [..., in_d...] cut to whole tiles and split: [..., out_d, kernel_d, ...].
std::vector<int64_t> tile_shape(const std::vector<int64_t>& lead, const std::vector<UniformAxis>& axes) {
  std::vector<int64_t> shape = lead;
  for (const UniformAxis& a : axes) {
    shape.push_back(a.out);
    shape.push_back(a.kernel);
  }
  return shape;
}

std::string window_attrs(const std::vector<UniformAxis>& axes, int64_t rank, bool transposed_form) {
  int64_t lead = rank - static_cast<int64_t>(axes.size());
  std::vector<int64_t> dims(rank, 1), strides(rank, 1);
  std::string padding = "padding = dense<[";
  for (int64_t d = 0; d < rank; ++d) {
    int64_t lo = 0, hi = 0;
    if (d >= lead && !transposed_form) {
      const UniformAxis& a = axes[d - lead];
      dims[d] = a.kernel;
      strides[d] = a.stride;
      lo = a.pad_lo;
      hi = a.pad_hi();
    } else if (d >= lead) {
      dims[d] = axes[d - lead].kernel;
    }
    padding += (d ? ", [" : "[") + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  }
  padding += "]> : tensor<" + std::to_string(rank) + "x2xi64>";
  return "window_dimensions = " + format_dims(dims) + ", window_strides = " + format_dims(strides) + ", " + padding;
}

V add_window(LoweringContext& ctx, const V& x, const TensorType& out, const std::string& attrs) {
  TensorType scalar{{}, x.type.dtype};
  std::string body = ctx.region({scalar, scalar}, [&](const std::vector<V>& a) {
    return std::vector<V>{ctx.binary(Hlo::Add, a[0], a[1])};
  });
  return ctx.emit(Hlo::ReduceWindow, {x, ctx.constant(0, x.type.dtype)}, out, attrs, body);
}

// Sums of x over uniform windows on its trailing axes.size() dims: windows that tile the plane
// (a global pool among them) reduce a reshape, others take one reduce_window.
V uniform_window_sums(LoweringContext& ctx, const V& x, const std::vector<UniformAxis>& axes) {
  int64_t r = x.type.rank(), n = static_cast<int64_t>(axes.size()), lead = r - n;
  std::vector<int64_t> shape = x.type.shape;
  bool tiles = true;
  for (int64_t d = 0; d < n; ++d) {
    shape[lead + d] = axes[d].out;
    tiles = tiles && axes[d].tiles();
  }
  if (numel(shape) == 0 || x.type.numel() == 0) return ctx.constant(0, x.type.dtype, shape);
  if (!tiles) return add_window(ctx, x, TensorType{shape, x.type.dtype}, window_attrs(axes, r, false));
  std::vector<int64_t> start(r, 0), limit = x.type.shape, dims;
  for (int64_t d = 0; d < n; ++d) {
    limit[lead + d] = axes[d].out * axes[d].kernel;
    dims.push_back(lead + 2 * d + 1);
  }
  V whole_tiles = ctx.slice(x, start, limit, std::vector<int64_t>(r, 1));
  V split = ctx.reshape(whole_tiles, tile_shape({x.type.shape.begin(), x.type.shape.begin() + lead}, axes));
  return ctx.reshape(ctx.reduce(split, dims, ctx.constant(0, x.type.dtype), Hlo::Add), shape);
}

// Windows up to this many positions spread their gradient by one strided placement per
// position (XLA fuses the pads and adds into one loop); larger ones by a reduce_window.
constexpr int64_t kMaxUnrolledWindow = 25;

// The transpose of uniform_window_sums: each input element gets the sum of g over the windows
// that hold it; the result has the trailing dims of `in_shape`.
V uniform_window_sums_transposed(LoweringContext& ctx, const V& g, const std::vector<UniformAxis>& axes,
                                 const std::vector<int64_t>& in_shape) {
  int64_t r = g.type.rank(), n = static_cast<int64_t>(axes.size()), lead = r - n;
  DType dt = g.type.dtype;
  TensorType out{in_shape, dt};
  if (out.numel() == 0 || g.type.numel() == 0) return ctx.constant(0, dt, in_shape);
  bool tiles = true;
  int64_t positions = 1;
  for (const UniformAxis& a : axes) {
    tiles = tiles && a.tiles();
    positions *= a.kernel;
  }
  V zero = ctx.constant(0, dt);
  if (tiles) {  // each tile's gradient broadcast over it, zeros for an unread tail
    std::vector<int64_t> dims, hi(r, 0), covered = in_shape;
    for (int64_t d = 0; d < lead; ++d) dims.push_back(d);
    for (int64_t d = 0; d < n; ++d) {
      dims.push_back(lead + 2 * d);
      covered[lead + d] = axes[d].out * axes[d].kernel;
      hi[lead + d] = axes[d].in - covered[lead + d];
    }
    std::vector<int64_t> split = tile_shape({in_shape.begin(), in_shape.begin() + lead}, axes);
    V spread = ctx.reshape(ctx.broadcast_in_dim(g, split, dims), covered);
    if (covered == in_shape) return spread;
    return ctx.emit(Hlo::Pad, {spread, zero}, out,
                    "edge_padding_high = " + format_dims(hi) + ", edge_padding_low = " +
                        format_dims(std::vector<int64_t>(r, 0)) + ", interior_padding = " +
                        format_dims(std::vector<int64_t>(r, 0)));
  }
  auto pad = [&](const V& v, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi,
                 const std::vector<int64_t>& interior, const std::vector<int64_t>& shape) {
    return ctx.emit(Hlo::Pad, {v, zero}, TensorType{shape, dt},
                    "edge_padding_high = " + format_dims(hi) + ", edge_padding_low = " + format_dims(lo) +
                        ", interior_padding = " + format_dims(interior));
  };
  std::vector<int64_t> interior(r, 0);
  for (int64_t d = 0; d < n; ++d) interior[lead + d] = axes[d].stride - 1;
  if (positions > kMaxUnrolledWindow) {
    // Dilate g by the stride, pad it by kernel - 1 - pad_lo before, and sum windows at stride 1.
    std::vector<int64_t> lo(r, 0), hi(r, 0), padded = in_shape;
    for (int64_t d = 0; d < n; ++d) {
      const UniformAxis& a = axes[d];
      lo[lead + d] = a.kernel - 1 - a.pad_lo;
      hi[lead + d] = a.in + a.pad_lo - (a.out - 1) * a.stride - 1;
      padded[lead + d] = a.in + a.kernel - 1;
    }
    return add_window(ctx, pad(g, lo, hi, interior, padded), out, window_attrs(axes, r, true));
  }
  // Position p of output o's window reads input o*stride + p - pad_lo: g dilated by the stride
  // and shifted by p - pad_lo, cropped to the input (negative edge padding crops).
  V sum;
  std::vector<int64_t> p(n, 0);
  for (int64_t k = 0; k < positions; ++k) {
    std::vector<int64_t> lo(r, 0), hi(r, 0);
    for (int64_t d = 0, rest = k; d < n; ++d) {
      int64_t stride_below = 1;
      for (int64_t e = d + 1; e < n; ++e) stride_below *= axes[e].kernel;
      p[d] = rest / stride_below;
      rest %= stride_below;
      const UniformAxis& a = axes[d];
      lo[lead + d] = p[d] - a.pad_lo;
      hi[lead + d] = a.in - (p[d] - a.pad_lo + (a.out - 1) * a.stride + 1);
    }
    V placed = pad(g, lo, hi, interior, in_shape);
    sum = k == 0 ? placed : ctx.binary(Hlo::Add, sum, placed);
  }
  return sum;
}

// -- avg_pool2d / avg_pool3d ---------------------------------------------------------------------

// PyTorch's windows and divisors: per axis, the windows and each output position's factor of
// the divisor (the window's size, padding counted or not; 1 with divisor_override, which
// divides once by its own value).
struct AvgPool {
  std::vector<UniformAxis> axes;
  std::vector<std::vector<double>> factors;
  int64_t divisor_override = 0;  // 0: none (PyTorch rejects a zero divisor; a negative one divides)
};

// The pool's kernel_size, stride, padding, ceil_mode, count_include_pad and divisor_override
// from argument `kernel_arg` on, over the trailing `n` dims of `in_shape` pooled to `out_shape`.
AvgPool avg_pool(const Node& node, int kernel_arg, int64_t n, const std::vector<int64_t>& in_shape,
                 const std::vector<int64_t>& out_shape) {
  const auto& k = node.args[kernel_arg].ints;
  const auto& s = node.args[kernel_arg + 1].ints;
  const auto& p = node.args[kernel_arg + 2].ints;
  bool include = node.args[kernel_arg + 4].as_bool();
  AvgPool pool;
  pool.divisor_override = node.args[kernel_arg + 5].is_none() ? 0 : node.args[kernel_arg + 5].as_int();
  int64_t lead = static_cast<int64_t>(in_shape.size()) - n;
  for (int64_t d = 0; d < n; ++d) {
    int64_t kernel = at(k, d, 1);
    UniformAxis a{in_shape[lead + d], out_shape[lead + d], kernel, at(s, d, kernel), at(p, d, 0)};
    std::vector<double> factor;
    for (int64_t o = 0; o < a.out; ++o) {
      int64_t start = o * a.stride - a.pad_lo;
      int64_t end = std::min(start + kernel, a.in + a.pad_lo);
      int64_t size = include ? end - start : std::min(end, a.in) - std::max<int64_t>(start, 0);
      // A window wholly in the padding sums to 0; an integer pool writes 0 there, as CPU does.
      factor.push_back(pool.divisor_override != 0 ? 1.0 : static_cast<double>(std::max<int64_t>(size, 1)));
    }
    pool.axes.push_back(a);
    pool.factors.push_back(factor);
  }
  return pool;
}

// Each pooled position's divisor, broadcast over `shape` in `dtype`: the product of the axes'
// factors (exact in float), or divisor_override.
V divisors(LoweringContext& ctx, const AvgPool& pool, const std::vector<int64_t>& shape, DType dtype) {
  if (pool.divisor_override != 0) return ctx.constant(static_cast<double>(pool.divisor_override), dtype, shape);
  int64_t lead = static_cast<int64_t>(shape.size() - pool.axes.size());
  V product;
  for (size_t d = 0; d < pool.axes.size(); ++d) {
    V f = along_axis(ctx, pool.factors[d], lead + d, shape, dtype);
    product = d == 0 ? f : ctx.binary(Hlo::Multiply, product, f);
  }
  return product;
}

int64_t spatial_dims(const Node& node) { return rule_param<int>(node); }

// avg_pool2d / avg_pool3d(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
// divisor_override): each window's sum divided by its divisor, as CPU's kernel does; integer
// pools (int64, the only integer type CPU takes) divide truncating.
void lower_avg_pool(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType acc = compute_dtype(out.dtype);
  V x = ctx.convert(ctx.input(node, 0), acc);
  AvgPool pool = avg_pool(node, 1, spatial_dims(node), x.type.shape, out.shape);
  V sums = uniform_window_sums(ctx, x, pool.axes);
  ctx.set_result(ctx.convert(ctx.binary(Hlo::Divide, sums, divisors(ctx, pool, out.shape, acc)), out.dtype));
}

// avg_pool2d_backward / avg_pool3d_backward(grad_output, self, kernel_size, stride, padding,
// ceil_mode, count_include_pad, divisor_override): each gradient divided by its divisor
// (truncating for integers, as CPU does) and spread over its window.
void lower_avg_pool_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType acc = compute_dtype(out.dtype);
  V g = ctx.convert(ctx.input(node, 0), acc);
  AvgPool pool = avg_pool(node, 2, spatial_dims(node), out.shape, g.type.shape);
  V shares = ctx.binary(Hlo::Divide, g, divisors(ctx, pool, g.type.shape, acc));
  ctx.set_result(ctx.convert(uniform_window_sums_transposed(ctx, shares, pool.axes, out.shape), out.dtype));
}

// -- adaptive avg pool --------------------------------------------------------------------------

// Output i averages input positions [floor(i*in/out), ceil((i+1)*in/out)).
Windows adaptive_windows(int64_t in, int64_t out) {
  Windows w;
  for (int64_t i = 0; i < out; ++i) {
    w.lo.push_back((i * in) / out);
    w.hi.push_back(((i + 1) * in + out - 1) / out);
  }
  return w;
}

// The pooled dims' sizes (the trailing n of in_shape and out_shape): uniform windows when
// every axis divides evenly (kernel = stride = in/out), which a global pool is.
bool adaptive_uniform(int64_t n, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& out_shape,
                      std::vector<UniformAxis>* axes) {
  int64_t lead = static_cast<int64_t>(in_shape.size()) - n;
  for (int64_t d = 0; d < n; ++d) {
    int64_t in = in_shape[lead + d], out = out_shape[lead + d];
    if (out == 0 || in % out != 0) return false;
    axes->push_back(UniformAxis{in, out, in / out, in / out, 0});
  }
  return true;
}

// The window sizes of each pooled position multiplied over the axes, broadcast over `shape`.
V adaptive_divisors(LoweringContext& ctx, int64_t n, const std::vector<int64_t>& in_shape,
                    const std::vector<int64_t>& shape, DType dtype) {
  int64_t lead = static_cast<int64_t>(shape.size()) - n;
  V product;
  for (int64_t d = 0; d < n; ++d) {
    Windows w = adaptive_windows(in_shape[lead + d], shape[lead + d]);
    std::vector<double> size;
    for (size_t i = 0; i < w.lo.size(); ++i) size.push_back(static_cast<double>(w.hi[i] - w.lo[i]));
    V f = along_axis(ctx, size, lead + d, shape, dtype);
    product = d == 0 ? f : ctx.binary(Hlo::Multiply, product, f);
  }
  return product;
}

// _adaptive_avg_pool2d / _adaptive_avg_pool3d(self, output_size): uneven windows sum one axis
// at a time (a sum over a box is the sum over its rows of the sums along each row).
void lower_adaptive_avg_pool(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  int64_t n = spatial_dims(node);
  DType acc = compute_dtype(out.dtype);
  V x = ctx.convert(ctx.input(node, 0), acc);
  std::vector<int64_t> in_shape = x.type.shape;
  std::vector<UniformAxis> axes;
  V sums;
  if (adaptive_uniform(n, in_shape, out.shape, &axes)) {
    sums = uniform_window_sums(ctx, x, axes);
  } else {
    sums = x;
    for (int64_t d = 0; d < n; ++d) {
      int64_t axis = out.rank() - n + d;
      sums = apply_taps(ctx, sums, axis, window_taps(adaptive_windows(in_shape[axis], out.shape[axis]), in_shape[axis]));
    }
  }
  V mean = ctx.binary(Hlo::Divide, sums, adaptive_divisors(ctx, n, in_shape, out.shape, acc));
  ctx.set_result(ctx.convert(mean, out.dtype));
}

// _adaptive_avg_pool2d_backward / _adaptive_avg_pool3d_backward(grad_output, self)
void lower_adaptive_avg_pool_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  int64_t n = spatial_dims(node);
  DType acc = compute_dtype(out.dtype);
  V g = ctx.convert(ctx.input(node, 0), acc);
  std::vector<int64_t> pooled = g.type.shape;
  V shares = ctx.binary(Hlo::Divide, g, adaptive_divisors(ctx, n, out.shape, pooled, acc));
  std::vector<UniformAxis> axes;
  V grad;
  if (adaptive_uniform(n, out.shape, pooled, &axes)) {
    grad = uniform_window_sums_transposed(ctx, shares, axes, out.shape);
  } else {
    grad = shares;
    for (int64_t d = 0; d < n; ++d) {
      int64_t axis = out.rank() - n + d;
      int64_t in = out.shape[axis];
      grad = apply_taps_transposed(ctx, grad, axis, window_taps(adaptive_windows(in, pooled[axis]), in), in);
    }
  }
  ctx.set_result(ctx.convert(grad, out.dtype));
}

// -- upsampling ----------------------------------------------------------------------------------

// PyTorch's area_pixel_compute_scale (float math like the CPU kernels).
float pixel_scale(int64_t in, int64_t out, bool align_corners, const Arg& scale) {
  if (align_corners) return out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.0f;
  if (!scale.is_none() && scale.as_double() > 0) return static_cast<float>(1.0 / scale.as_double());
  return static_cast<float>(in) / static_cast<float>(out);
}

// Nearest: output i copies input min(floor(i * scale), in - 1).
Taps nearest_taps(int64_t in, int64_t out, const Arg& scale) {
  Tap tap;
  float s = pixel_scale(in, out, false, scale);
  for (int64_t i = 0; i < out; ++i)
    tap.index.push_back(std::min(static_cast<int64_t>(std::floor(static_cast<float>(i) * s)), in - 1));
  return {tap};
}

// upsample_nearest2d(self, output_size, scales_h, scales_w)
void lower_upsample_nearest2d(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  V y = apply_taps(ctx, x, 3, nearest_taps(x.type.shape[3], out.shape[3], node.args[3]));
  ctx.set_result(apply_taps(ctx, y, 2, nearest_taps(x.type.shape[2], out.shape[2], node.args[2])));
}

// upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h, scales_w)
void lower_upsample_nearest2d_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType acc = compute_dtype(out.dtype);
  V g = ctx.convert(ctx.input(node, 0), acc);
  int64_t h = out.shape[2], w = out.shape[3];
  V rows = apply_taps_transposed(ctx, g, 2, nearest_taps(h, g.type.shape[2], node.args[3]), h);
  V grad = apply_taps_transposed(ctx, rows, 3, nearest_taps(w, g.type.shape[3], node.args[4]), w);
  ctx.set_result(ctx.convert(grad, out.dtype));
}

// Bilinear along one axis: output i blends inputs i0 and i1 with weights l0 and l1 (CPU's
// source index rule, in float), reading both even where a weight is 0 (a zero weight times an
// infinity is NaN on CPU too).
Taps linear_taps(int64_t in, int64_t out, bool align_corners, const Arg& scale) {
  Tap first, second;
  float s = pixel_scale(in, out, align_corners, scale);
  for (int64_t i = 0; i < out; ++i) {
    if (in == out) {  // CPU copies (reading the same element twice, the second time weighted 0)
      first.index.push_back(i);
      second.index.push_back(i);
      first.weight.push_back(1.0);
      second.weight.push_back(0.0);
      continue;
    }
    // CPU's kernels are built with FMA contraction: scale * (i + 0.5) - 0.5 rounds once (with
    // two roundings an output that should read 1e-8 of its second tap reads none of it).
    float src = align_corners ? s * static_cast<float>(i) : std::max(std::fma(s, static_cast<float>(i) + 0.5f, -0.5f), 0.0f);
    int64_t i0 = std::min(static_cast<int64_t>(src), in - 1);
    float l1 = src - static_cast<float>(i0);
    first.index.push_back(i0);
    second.index.push_back(i0 + (i0 < in - 1 ? 1 : 0));
    first.weight.push_back(1.0f - l1);
    second.weight.push_back(l1);
  }
  return {first, second};
}

// upsample_bilinear2d(self, output_size, align_corners, scales_h, scales_w): along the width,
// then the height, in float for half types (CPU's order).
void lower_upsample_bilinear2d(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType acc = compute_dtype(out.dtype);
  V x = ctx.convert(ctx.input(node, 0), acc);
  bool ac = node.args[2].as_bool();
  V y = apply_taps(ctx, x, 3, linear_taps(x.type.shape[3], out.shape[3], ac, node.args[4]));
  y = apply_taps(ctx, y, 2, linear_taps(x.type.shape[2], out.shape[2], ac, node.args[3]));
  ctx.set_result(ctx.convert(y, out.dtype));
}

// upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners, scales_h, scales_w)
void lower_upsample_bilinear2d_backward(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  DType acc = compute_dtype(out.dtype);
  V g = ctx.convert(ctx.input(node, 0), acc);
  bool ac = node.args[3].as_bool();
  int64_t h = out.shape[2], w = out.shape[3];
  V rows = apply_taps_transposed(ctx, g, 2, linear_taps(h, g.type.shape[2], ac, node.args[4]), h);
  V grad = apply_taps_transposed(ctx, rows, 3, linear_taps(w, g.type.shape[3], ac, node.args[5]), w);
  ctx.set_result(ctx.convert(grad, out.dtype));
}

LOWERING("aten::avg_pool2d", lower_avg_pool, 2, kFloatOrInt64);
LOWERING("aten::avg_pool2d_backward", lower_avg_pool_backward, 2, kFloatOrInt64);
LOWERING("aten::avg_pool3d", lower_avg_pool, 3, kFloatOrInt64);
LOWERING("aten::avg_pool3d_backward", lower_avg_pool_backward, 3, kFloatOrInt64);
LOWERING("aten::_adaptive_avg_pool2d", lower_adaptive_avg_pool, 2, kFloatOnly);
LOWERING("aten::_adaptive_avg_pool2d_backward", lower_adaptive_avg_pool_backward, 2);
LOWERING("aten::_adaptive_avg_pool3d", lower_adaptive_avg_pool, 3, kFloatOnly);
LOWERING("aten::_adaptive_avg_pool3d_backward", lower_adaptive_avg_pool_backward, 3);
LOWERING("aten::upsample_nearest2d", lower_upsample_nearest2d);
LOWERING("aten::upsample_nearest2d_backward", lower_upsample_nearest2d_backward);
LOWERING("aten::upsample_bilinear2d", lower_upsample_bilinear2d, nullptr, kFloatOnly);
LOWERING("aten::upsample_bilinear2d_backward", lower_upsample_bilinear2d_backward);

}  // namespace
}  // namespace torchtpu
