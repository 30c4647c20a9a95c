// The fused LSTM and GRU cells ATen's RNN modules call on accelerators (nn.LSTM, nn.GRU and
// their cells on tpu tensors), forward and backward: the pointwise gate math of CUDA's fused
// kernels, with the same workspace layout, so PyTorch's autograd formulas work unchanged.
// The matmuls before the cell (input and hidden gates) are ordinary ops.
#include "lowering/common.h"

namespace torchtpu {
namespace {

// Column block k (of `parts`) of a [B, parts * H] value.
V block(LoweringContext& ctx, const V& x, int64_t k, int64_t parts) {
  int64_t b = x.type.shape[0], h = x.type.shape[1] / parts;
  return ctx.slice(x, {0, k * h}, {b, (k + 1) * h}, {1, 1});
}

// A bias [parts * H] (arg `arg`, may be absent) broadcast to block k of [B, H] values.
V bias_block(LoweringContext& ctx, const Node& node, int arg, int64_t k, int64_t parts, const Ex& e) {
  if (!ctx.has_input(node, arg)) return V{};
  V b = ctx.convert(ctx.input(node, arg), e.dt);
  int64_t h = b.type.shape[0] / parts;
  return ctx.broadcast_in_dim(ctx.slice(b, {k * h}, {(k + 1) * h}, {1}), e.shape, {1});
}

V plus(const Ex& e, V a, const V& b) { return b.name.empty() ? a : e.add(a, b); }

V sigmoid(const Ex& e, const V& x) { return e.un(Hlo::Logistic, x); }

// _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias?, hidden_bias?)
//   -> (hy, cy, workspace = the activated gates [i, f, g, o])
void lower_fused_lstm_cell(LoweringContext& ctx, const Node& node) {
  const TensorType& hy_type = ctx.out(node);
  DType acc = compute_dtype(hy_type.dtype);
  Ex e = make_ex(ctx, acc, hy_type.shape);
  V ig = ctx.convert(ctx.input(node, 0), acc), hg = ctx.convert(ctx.input(node, 1), acc);
  V cx = ctx.convert(ctx.input(node, 2), acc);
  auto gate = [&](int64_t k) {  // input + hidden + input bias + hidden bias, CUDA's order
    V sum = e.add(block(ctx, ig, k, 4), block(ctx, hg, k, 4));
    return plus(e, plus(e, sum, bias_block(ctx, node, 3, k, 4, e)), bias_block(ctx, node, 4, k, 4, e));
  };
  V i = sigmoid(e, gate(0)), f = sigmoid(e, gate(1)), g = e.un(Hlo::Tanh, gate(2)), o = sigmoid(e, gate(3));
  V cy = e.add(e.mul(f, cx), e.mul(i, g));
  V hy = e.mul(o, e.un(Hlo::Tanh, cy));
  DType dt = hy_type.dtype;
  V workspace = ctx.concatenate({ctx.convert(i, dt), ctx.convert(f, dt), ctx.convert(g, dt), ctx.convert(o, dt)}, 1);
  ctx.set_results({ctx.convert(hy, dt), ctx.convert(cy, dt), workspace});
}

// _thnn_fused_lstm_cell_backward_impl(grad_hy?, grad_cy?, cx, cy, workspace, has_bias)
//   -> (grad_gates, grad_cx, grad_bias)
void lower_fused_lstm_cell_backward(LoweringContext& ctx, const Node& node) {
  V cx0 = ctx.input(node, 2);
  DType dt = cx0.type.dtype, acc = compute_dtype(dt);
  Ex e = make_ex(ctx, acc, cx0.type.shape);
  V cx = ctx.convert(cx0, acc), cy = ctx.convert(ctx.input(node, 3), acc), ws = ctx.convert(ctx.input(node, 4), acc);
  V zero = e.k(0.0), one = e.k(1.0);
  V ghy = ctx.has_input(node, 0) ? ctx.convert(ctx.input(node, 0), acc) : zero;
  V gcy = ctx.has_input(node, 1) ? ctx.convert(ctx.input(node, 1), acc) : zero;
  V i = block(ctx, ws, 0, 4), f = block(ctx, ws, 1, 4), g = block(ctx, ws, 2, 4), o = block(ctx, ws, 3, 4);
  V tanh_cy = e.un(Hlo::Tanh, cy);
  V gc = e.add(e.mul(e.mul(ghy, o), e.sub(one, e.mul(tanh_cy, tanh_cy))), gcy);
  V gi = e.mul(e.mul(e.mul(gc, g), e.sub(one, i)), i);
  V gf = e.mul(e.mul(e.mul(gc, cx), e.sub(one, f)), f);
  V gg = e.mul(e.mul(gc, i), e.sub(one, e.mul(g, g)));
  V go = e.mul(e.mul(e.mul(ghy, tanh_cy), e.sub(one, o)), o);
  V gates = ctx.concatenate({gi, gf, gg, go}, 1);
  std::vector<V> results = {ctx.convert(gates, dt), ctx.convert(e.mul(gc, f), dt)};
  if (node.outputs.size() > 2) results.push_back(ctx.convert(sum_dims(ctx, gates, {0}), dt));
  ctx.set_results(results);
}

// _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias?, hidden_bias?)
//   -> (hy, workspace = [r, z, n, hx, hidden n gate + its bias])
void lower_fused_gru_cell(LoweringContext& ctx, const Node& node) {
  const TensorType& hy_type = ctx.out(node);
  DType dt = hy_type.dtype, acc = compute_dtype(dt);
  Ex e = make_ex(ctx, acc, hy_type.shape);
  V ig = ctx.convert(ctx.input(node, 0), acc), hg = ctx.convert(ctx.input(node, 1), acc);
  V hx = ctx.convert(ctx.input(node, 2), acc);
  auto in = [&](int64_t k) { return plus(e, block(ctx, ig, k, 3), bias_block(ctx, node, 3, k, 3, e)); };
  auto hid = [&](int64_t k) { return plus(e, block(ctx, hg, k, 3), bias_block(ctx, node, 4, k, 3, e)); };
  V r = sigmoid(e, e.add(in(0), hid(0)));
  V z = sigmoid(e, e.add(in(1), hid(1)));
  V hn = hid(2);
  V n = e.un(Hlo::Tanh, e.add(in(2), e.mul(r, hn)));
  V hy = e.add(n, e.mul(z, e.sub(hx, n)));
  V workspace = ctx.concatenate({ctx.convert(r, dt), ctx.convert(z, dt), ctx.convert(n, dt), ctx.convert(hx, dt),
                                 ctx.convert(hn, dt)}, 1);
  ctx.set_results({ctx.convert(hy, dt), workspace});
}

// _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias)
//   -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)
void lower_fused_gru_cell_backward(LoweringContext& ctx, const Node& node) {
  V ghy0 = ctx.input(node, 0);
  DType dt = ghy0.type.dtype, acc = compute_dtype(dt);
  Ex e = make_ex(ctx, acc, ghy0.type.shape);
  V ghy = ctx.convert(ghy0, acc), ws = ctx.convert(ctx.input(node, 1), acc);
  V one = e.k(1.0);
  V r = block(ctx, ws, 0, 5), z = block(ctx, ws, 1, 5), n = block(ctx, ws, 2, 5), hx = block(ctx, ws, 3, 5),
    hn = block(ctx, ws, 4, 5);
  V gz = e.mul(e.mul(e.mul(ghy, e.sub(hx, n)), e.sub(one, z)), z);
  V ghx = e.mul(ghy, z);
  V gn = e.mul(e.mul(ghy, e.sub(one, z)), e.sub(one, e.mul(n, n)));
  V ghn = e.mul(gn, r);
  V gr = e.mul(e.mul(e.mul(gn, hn), e.sub(one, r)), r);
  V input_gates = ctx.concatenate({gr, gz, gn}, 1), hidden_gates = ctx.concatenate({gr, gz, ghn}, 1);
  std::vector<V> results = {ctx.convert(input_gates, dt), ctx.convert(hidden_gates, dt), ctx.convert(ghx, dt)};
  if (node.outputs.size() > 3) {
    results.push_back(ctx.convert(sum_dims(ctx, input_gates, {0}), dt));
    results.push_back(ctx.convert(sum_dims(ctx, hidden_gates, {0}), dt));
  }
  ctx.set_results(results);
}

LOWERING("aten::_thnn_fused_lstm_cell", lower_fused_lstm_cell, nullptr, kFloatOnly);
LOWERING("aten::_thnn_fused_lstm_cell_backward_impl", lower_fused_lstm_cell_backward, nullptr, kFloatOnly);
LOWERING("aten::_thnn_fused_gru_cell", lower_fused_gru_cell, nullptr, kFloatOnly);
LOWERING("aten::_thnn_fused_gru_cell_backward", lower_fused_gru_cell_backward, nullptr, kFloatOnly);

}  // namespace
}  // namespace torchtpu
