// FFTs: aten::_fft_r2c / _fft_c2r / _fft_c2c, which every torch.fft function, stft/istft and
// their backward formulas reach, lowered to stablehlo.fft.
// stablehlo.fft transforms at most the 3 trailing dims: the transformed dims are moved to the
// end in groups of up to 3 and moved back. XLA's inverse transforms divide by the signal
// size; PyTorch's are unnormalized and then scaled by the normalization mode.
#include <algorithm>
#include <cmath>

#include "lowering/common.h"

namespace torchtpu {
namespace {

// PyTorch's fft_norm_mode (the `normalization` argument).
enum class FftNorm : int64_t { none = 0, by_root_n = 1, by_n = 2 };

constexpr size_t kMaxFftRank = 3;  // stablehlo.fft's fft_length holds 1 to 3 dims

// x with `dims` moved, in order, behind all other dims.
std::vector<int64_t> dims_last_permutation(int64_t rank, const std::vector<int64_t>& dims) {
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i)
    if (std::find(dims.begin(), dims.end(), i) == dims.end()) perm.push_back(i);
  perm.insert(perm.end(), dims.begin(), dims.end());
  return perm;
}

std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  return inverse;
}

// stablehlo.fft's fft_type.
enum class FftType : uint8_t { FFT, IFFT, RFFT, IRFFT };

const char* fft_type_name(FftType type) {
  static const char* const names[] = {"FFT", "IFFT", "RFFT", "IRFFT"};
  return names[static_cast<size_t>(type)];
}

// One stablehlo.fft of `type` over `dims` of x (at most 3, the last one the halved dim of
// RFFT/IRFFT); `lengths` are the transform sizes (the real signal's).
V fft_over(LoweringContext& ctx, const V& x, const std::vector<int64_t>& dims, FftType type,
           const std::vector<int64_t>& lengths) {
  int64_t rank = x.type.rank();
  std::vector<int64_t> perm = dims_last_permutation(rank, dims);
  V moved = ctx.transpose(x, perm);
  TensorType result = moved.type;
  if (type == FftType::RFFT) {
    result.dtype = complex_type_of(x.type.dtype);
    result.shape.back() = lengths.back() / 2 + 1;
  } else if (type == FftType::IRFFT) {
    result.dtype = real_part_type(x.type.dtype);
    result.shape.back() = lengths.back();
  }
  V y = ctx.emit(Hlo::Fft, {moved}, result,
                 std::string("fft_type = #stablehlo<fft_type ") + fft_type_name(type) + ">, fft_length = " + format_dims(lengths));
  return ctx.transpose(y, inverse_permutation(perm));
}

// Complex transforms over any number of dims, in groups of at most 3.
V c2c_over(LoweringContext& ctx, V x, const std::vector<int64_t>& dims, bool forward) {
  for (size_t start = 0; start < dims.size(); start += kMaxFftRank) {
    std::vector<int64_t> group(dims.begin() + start, dims.begin() + std::min(dims.size(), start + kMaxFftRank));
    std::vector<int64_t> lengths;
    for (int64_t d : group) lengths.push_back(x.type.shape[d]);
    x = fft_over(ctx, x, group, forward ? FftType::FFT : FftType::IFFT, lengths);
  }
  return x;
}

// PyTorch's scale for a transform of `signal_numel` points; an XLA inverse transform has
// already divided by signal_numel.
V normalize(LoweringContext& ctx, const V& x, const Node& node, int norm_arg, int64_t signal_numel, bool xla_inverse) {
  auto norm = static_cast<FftNorm>(node.args[norm_arg].as_int());
  double n = static_cast<double>(signal_numel);
  double scale = norm == FftNorm::none ? 1.0 : norm == FftNorm::by_root_n ? 1.0 / std::sqrt(n) : 1.0 / n;
  if (xla_inverse) scale *= n;
  if (scale == 1.0) return x;
  return ctx.binary(Hlo::Multiply, x, ctx.constant(scale, x.type.dtype, x.type.shape));
}

int64_t signal_numel(const std::vector<int64_t>& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[d];
  return n;
}

// _fft_c2c(self, dim[], normalization, forward)
void lower_fft_c2c(LoweringContext& ctx, const Node& node) {
  V x = ctx.input(node, 0);
  std::vector<int64_t> dims = wrap_dims(node.args[1].ints, x.type.rank());
  bool forward = node.args[3].as_bool();
  V y = c2c_over(ctx, x, dims, forward);
  ctx.set_result(normalize(ctx, y, node, 2, signal_numel(x.type.shape, dims), !forward && !dims.empty()));
}

// _fft_r2c(self, dim[], normalization, onesided): the last dim in `dim` is halved when
// onesided; the others are complex transforms.
void lower_fft_r2c(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  std::vector<int64_t> dims = wrap_dims(node.args[1].ints, x.type.rank());
  bool onesided = node.args[3].as_bool();
  V y;
  if (!onesided || dims.empty()) {
    y = c2c_over(ctx, ctx.convert(x, out.dtype), dims, true);
  } else {
    size_t split = dims.size() > kMaxFftRank ? dims.size() - kMaxFftRank : 0;
    std::vector<int64_t> leading(dims.begin(), dims.begin() + split), trailing(dims.begin() + split, dims.end());
    std::vector<int64_t> lengths;
    for (int64_t d : trailing) lengths.push_back(x.type.shape[d]);
    y = c2c_over(ctx, fft_over(ctx, x, trailing, FftType::RFFT, lengths), leading, true);
  }
  ctx.set_result(normalize(ctx, y, node, 2, signal_numel(x.type.shape, dims), false));
}

// _fft_c2r(self, dim[], normalization, last_dim_size): the inverse of a onesided r2c; the
// output's last transformed dim has last_dim_size points.
void lower_fft_c2r(LoweringContext& ctx, const Node& node) {
  const TensorType& out = ctx.out(node);
  V x = ctx.input(node, 0);
  std::vector<int64_t> dims = wrap_dims(node.args[1].ints, x.type.rank());
  size_t split = dims.size() > kMaxFftRank ? dims.size() - kMaxFftRank : 0;
  std::vector<int64_t> leading(dims.begin(), dims.begin() + split), trailing(dims.begin() + split, dims.end());
  V y = c2c_over(ctx, x, leading, false);
  std::vector<int64_t> lengths;
  for (int64_t d : trailing) lengths.push_back(out.shape[d]);
  y = fft_over(ctx, y, trailing, FftType::IRFFT, lengths);
  ctx.set_result(normalize(ctx, y, node, 2, signal_numel(out.shape, dims), true));
}

LOWERING("aten::_fft_c2c", lower_fft_c2c, nullptr, kTakesComplex);
LOWERING("aten::_fft_r2c", lower_fft_r2c, nullptr, kTakesComplex);
LOWERING("aten::_fft_c2r", lower_fft_c2r, nullptr, kTakesComplex);

}  // namespace
}  // namespace torchtpu
