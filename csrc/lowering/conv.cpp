// Convolutions: aten::convolution (1d/2d/3d, transposed, groups) and convolution_backward,
// as stablehlo.convolution. Gradients follow JAX's transpose rules for conv_general_dilated.
#include "lowering/common.h"

namespace torchtpu {
namespace {

using Pads = std::vector<std::pair<int64_t, int64_t>>;

// PyTorch's layout (ConvDimensionNumbers' default roles) with `spatial` spatial dims after them.
ConvDimensionNumbers channels_first(int64_t spatial) {
  ConvDimensionNumbers d;
  for (int64_t i = 0; i < spatial; ++i) {
    d.input_spatial_dimensions.push_back(2 + i);
    d.kernel_spatial_dimensions.push_back(2 + i);
    d.output_spatial_dimensions.push_back(2 + i);
  }
  return d;
}

// The weight gradient's: the input [N, C, ...] has its batch summed over as the features and
// its channels as the batch, the output cotangent [N, O, ...] is the kernel, and the result
// comes out [O, C, ...], the weight's layout.
ConvDimensionNumbers weight_gradient_roles(int64_t spatial) {
  ConvDimensionNumbers d = channels_first(spatial);
  std::swap(d.input_batch_dimension, d.input_feature_dimension);
  std::swap(d.kernel_input_feature_dimension, d.kernel_output_feature_dimension);
  std::swap(d.output_batch_dimension, d.output_feature_dimension);
  return d;
}

// Generic stablehlo.convolution.
V conv(LoweringContext& ctx, const V& lhs, const V& rhs, const ConvDimensionNumbers& roles,
       const std::vector<int64_t>& strides, const Pads& pads, const std::vector<int64_t>& lhs_dil,
       const std::vector<int64_t>& rhs_dil, int64_t feature_groups, int64_t batch_groups, const TensorType& result) {
  int64_t k = static_cast<int64_t>(strides.size());
  std::string padding = "dense<[";
  for (int64_t i = 0; i < k; ++i)
    padding += (i ? ", [" : "[") + std::to_string(pads[i].first) + ", " + std::to_string(pads[i].second) + "]";
  padding += "]> : tensor<" + std::to_string(k) + "x2xi64>";
  std::string attrs = "dimension_numbers = " + roles.attribute() + ", window_strides = " + format_dims(strides) +
                      ", padding = " + padding + ", lhs_dilation = " + format_dims(lhs_dil) +
                      ", rhs_dilation = " + format_dims(rhs_dil) + ", feature_group_count = " +
                      std::to_string(feature_groups) + " : i64, batch_group_count = " + std::to_string(batch_groups) +
                      " : i64";
  return ctx.emit(Hlo::Convolution, {lhs, rhs}, result, attrs);
}

struct ConvParams {
  std::vector<int64_t> stride, padding, dilation, output_padding;
  int64_t groups = 1;
  bool transposed = false;
  int64_t spatial = 0;
};

// Expands a 1-element list to `n` entries.
std::vector<int64_t> expand(const std::vector<int64_t>& v, int64_t n, int64_t fill) {
  if (v.empty()) return std::vector<int64_t>(n, fill);
  if (static_cast<int64_t>(v.size()) == 1 && n > 1) return std::vector<int64_t>(n, v[0]);
  return v;
}

ConvParams params(const Node& node, int first, int64_t spatial) {
  // first = index of `stride`; then padding, dilation, transposed, output_padding, groups.
  ConvParams p;
  p.spatial = spatial;
  p.stride = expand(node.args[first].ints, spatial, 1);
  p.padding = expand(node.args[first + 1].ints, spatial, 0);
  p.dilation = expand(node.args[first + 2].ints, spatial, 1);
  p.transposed = node.args[first + 3].as_bool();
  p.output_padding = expand(node.args[first + 4].ints, spatial, 0);
  p.groups = node.args[first + 5].as_int();
  return p;
}

std::vector<int64_t> ones(int64_t n) { return std::vector<int64_t>(n, 1); }

// Transposed convolution of x [N, Cx, ...] with w [Cx, Cy/g, k...] (PyTorch's conv_transpose
// weight layout): flip the kernel, swap its feature dims per group and convolve the
// stride-dilated input. pads are the effective (low, high) paddings of the dilated input.
V conv_transpose(LoweringContext& ctx, const V& x, const V& w, const ConvParams& p, const Pads& pads,
                 const TensorType& result) {
  int64_t g = p.groups, k = p.spatial;
  const auto& ws = w.type.shape;
  int64_t cx = ws[0], cy_g = ws[1];
  std::vector<int64_t> grouped = {g, cx / g, cy_g};
  for (int64_t i = 0; i < k; ++i) grouped.push_back(ws[2 + i]);
  V kernel = ctx.reshape(w, grouped);
  std::vector<int64_t> perm = {0, 2, 1};
  for (int64_t i = 0; i < k; ++i) perm.push_back(3 + i);
  kernel = ctx.transpose(kernel, perm);
  std::vector<int64_t> flat = {g * cy_g, cx / g};
  for (int64_t i = 0; i < k; ++i) flat.push_back(ws[2 + i]);
  kernel = ctx.reshape(kernel, flat);
  std::vector<int64_t> spatial_dims;
  for (int64_t i = 0; i < k; ++i) spatial_dims.push_back(2 + i);
  kernel = ctx.emit(Hlo::Reverse, {kernel}, kernel.type, "dimensions = " + format_dims(spatial_dims));
  return conv(ctx, x, kernel, channels_first(k), ones(k), pads, p.stride, p.dilation, g, 1, result);
}

// Gradient of conv(lhs, w) (stride/padding/dilation of p, groups) w.r.t. w, given the
// output cotangent `g`; returns w's shape [O, I/groups, k...].
V conv_weight_grad(LoweringContext& ctx, const V& lhs, const V& g, const ConvParams& p,
                   const std::vector<int64_t>& kernel_size, const TensorType& result) {
  int64_t k = p.spatial;
  Pads pads;
  for (int64_t i = 0; i < k; ++i) {
    int64_t in = lhs.type.shape[2 + i], out = g.type.shape[2 + i];
    auto dilate = [](int64_t s, int64_t d) { return s == 0 ? 0 : 1 + d * (s - 1); };
    int64_t lo = p.padding[i];
    int64_t hi = (dilate(out, p.stride[i]) - dilate(in, 1)) + (dilate(kernel_size[i], p.dilation[i]) - lo - 1);
    pads.push_back({lo, hi});
  }
  return conv(ctx, lhs, g, weight_gradient_roles(k), p.dilation, pads, ones(k), p.stride, 1, p.groups, result);
}

// convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
void lower_convolution(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  // CPU's checks, in its order and words.
  DType input = ctx.input(node, 0).type.dtype, weight = ctx.input(node, 1).type.dtype;
  check_argument(input == weight, std::string("expected scalar type ") + scalar_type_name(input) + " but found " +
                                      scalar_type_name(weight));
  if (ctx.has_input(node, 2)) {
    DType bias = ctx.input(node, 2).type.dtype;
    check_argument(input == bias, std::string("Input type (") + cpp_type_name(input) + ") and bias type (" +
                                      cpp_type_name(bias) + ") should be the same");
  }
  V x = ctx.convert(ctx.input(node, 0), out.dtype);
  V w = ctx.convert(ctx.input(node, 1), out.dtype);
  int64_t k = x.type.rank() - 2;
  ConvParams p = params(node, 3, k);
  V y;
  if (!p.transposed) {
    Pads pads;
    for (int64_t i = 0; i < k; ++i) pads.push_back({p.padding[i], p.padding[i]});
    y = conv(ctx, x, w, channels_first(k), p.stride, pads, ones(k), p.dilation, p.groups, 1, out);
  } else {
    Pads pads;
    for (int64_t i = 0; i < k; ++i) {
      int64_t span = p.dilation[i] * (w.type.shape[2 + i] - 1);
      pads.push_back({span - p.padding[i], span - p.padding[i] + p.output_padding[i]});
    }
    y = conv_transpose(ctx, x, w, p, pads, out);
  }
  if (ctx.has_input(node, 2))
    y = ctx.binary(Hlo::Add, y,
                   ctx.broadcast_in_dim(ctx.convert(ctx.input(node, 2), out.dtype), out.shape, {1}));
  ctx.set_result(y);
}

// convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
//                      transposed, output_padding, groups, output_mask) -> (gi, gw, gb)
// Only the outputs in output_mask are node outputs (in order): the device layer records
// the gradients PyTorch's meta kernel returns defined and sets output_mask to match.
void lower_convolution_backward(LoweringContext& ctx, const Node& node) {
  V g = ctx.input(node, 0);
  V x = ctx.input(node, 1);
  V w = ctx.input(node, 2);
  int64_t k = x.type.rank() - 2;
  ConvParams p = params(node, 4, k);
  const auto& mask = node.args[10].ints;
  std::vector<int64_t> kernel_size(w.type.shape.begin() + 2, w.type.shape.end());
  std::vector<V> results;
  size_t next = 0;
  if (mask[0]) {
    const TensorType& t = node.outputs[next++];
    V gc = ctx.convert(g, t.dtype), wc = ctx.convert(w, t.dtype);
    if (!p.transposed) {
      Pads pads;
      for (int64_t i = 0; i < k; ++i) {
        int64_t span = p.dilation[i] * (kernel_size[i] - 1);
        int64_t lo = span - p.padding[i];
        int64_t hi = x.type.shape[2 + i] - 1 - (g.type.shape[2 + i] - 1) * p.stride[i] + p.padding[i];
        pads.push_back({lo, hi});
      }
      results.push_back(conv_transpose(ctx, gc, wc, p, pads, t));
    } else {
      Pads pads;
      for (int64_t i = 0; i < k; ++i) pads.push_back({p.padding[i], p.padding[i]});
      results.push_back(conv(ctx, gc, wc, channels_first(k), p.stride, pads, ones(k), p.dilation, p.groups, 1, t));
    }
  }
  if (mask[1]) {
    const TensorType& t = node.outputs[next++];
    V gc = ctx.convert(g, t.dtype), xc = ctx.convert(x, t.dtype);
    if (!p.transposed) {
      results.push_back(conv_weight_grad(ctx, xc, gc, p, kernel_size, t));
    } else {
      // y = conv_transpose(x, w) is the adjoint of conv(., w): dw = weight grad of conv(g, w) at x.
      results.push_back(conv_weight_grad(ctx, gc, xc, p, kernel_size, t));
    }
  }
  if (mask[2]) {
    const TensorType& t = node.outputs[next++];
    DType acc = t.dtype == DType::BFloat16 || t.dtype == DType::Float16 ? DType::Float32 : t.dtype;
    std::vector<int64_t> dims = {0};
    for (int64_t i = 0; i < k; ++i) dims.push_back(2 + i);
    results.push_back(ctx.convert(sum_dims(ctx, ctx.convert(g, acc), dims), t.dtype));
  }
  ctx.set_results(results);
}

// convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
// CPU's slow transposed and dilated convolutions take int64 but no other integer type
// ("slow_conv_transpose2d_out_cpu" not implemented for 'Int'); its direct one takes them all.
DTypeSet convolution_refuses(const std::vector<Arg>& args) {
  bool dilated = false;
  for (int64_t d : args[5].ints) dilated = dilated || d != 1;
  return args[6].as_bool() || dilated ? kIntegerDTypes & ~dtype_set(DType::Int64) : 0;
}

LOWERING("aten::convolution", lower_convolution, nullptr, RuleFlags{.refuses = kBoolDTypes, .refuses_for = convolution_refuses});
LOWERING("aten::convolution_backward", lower_convolution_backward, nullptr, kNoBool);

}  // namespace
}  // namespace torchtpu
