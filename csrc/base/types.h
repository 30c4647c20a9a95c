// Element types and tensor types shared by every layer (no torch headers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torchtpu {

// Codes equal c10::ScalarType's so the device layer converts with a cast.
enum class DType : int8_t {
  UInt8 = 0,
  Int8 = 1,
  Int16 = 2,
  Int32 = 3,
  Int64 = 4,
  Float16 = 5,
  Float32 = 6,
  Float64 = 7,
  ComplexFloat = 9,   // complex64: two float32
  ComplexDouble = 10, // complex128: two float64 (platforms with float64 only)
  Bool = 11,
  BFloat16 = 15,
};

bool is_supported_dtype(int code);
size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);     // "float32"
const char* dtype_mlir(DType dtype);     // "f32", "i64", "i1", "ui8", "complex<f32>"
bool is_floating(DType dtype);           // real floating types only
bool is_complex(DType dtype);
// The real type of a complex type's parts (complex64 -> float32); other types map to themselves.
DType real_part_type(DType dtype);
// The complex type with parts of a floating type (float32 -> complex64; float16/bfloat16 ->
// complex64, as PyTorch's promotion of a real half type with complex64 gives).
DType complex_type_of(DType dtype);
bool is_signed_integer(DType dtype);

struct TensorType {
  std::vector<int64_t> shape;
  DType dtype = DType::Float32;

  int64_t numel() const;
  int64_t nbytes() const { return numel() * static_cast<int64_t>(dtype_size(dtype)); }
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  std::string mlir() const;  // tensor<2x3xf32>
  std::string str() const;   // float32[2, 3]
  bool operator==(const TensorType& other) const {
    return dtype == other.dtype && shape == other.shape;
  }
  bool operator!=(const TensorType& other) const { return !(*this == other); }
};

// 64-bit FNV-1a style mixing used for graph and node hashes.
inline uint64_t hash_mix(uint64_t seed, uint64_t value) {
  value *= 0x9E3779B97F4A7C15ull;
  value ^= value >> 29;
  return (seed ^ value) * 0x100000001B3ull + 0x632BE59BD9B4E019ull;
}
uint64_t hash_bytes(uint64_t seed, const void* data, size_t size);
inline uint64_t hash_string(uint64_t seed, const std::string& s) {
  return hash_bytes(seed, s.data(), s.size());
}
uint64_t hash_type(uint64_t seed, const TensorType& type);

}  // namespace torchtpu
