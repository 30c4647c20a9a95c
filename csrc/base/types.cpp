// Element-type tables and tensor-type printing.
#include "base/types.h"

#include <sstream>
#include <stdexcept>

namespace torchtpu {

bool is_supported_dtype(int code) {
  switch (code) {
    case 0: case 1: case 2: case 3: case 4: case 5: case 6: case 7: case 9: case 10: case 11: case 15:
      return true;
    default:
      return false;
  }
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::UInt8: case DType::Int8: case DType::Bool: return 1;
    case DType::Int16: case DType::Float16: case DType::BFloat16: return 2;
    case DType::Int32: case DType::Float32: return 4;
    case DType::Int64: case DType::Float64: case DType::ComplexFloat: return 8;
    case DType::ComplexDouble: return 16;
  }
  throw std::runtime_error("torchtpu: unknown dtype");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::UInt8: return "uint8";
    case DType::Int8: return "int8";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::ComplexFloat: return "complex64";
    case DType::ComplexDouble: return "complex128";
    case DType::Bool: return "bool";
    case DType::BFloat16: return "bfloat16";
  }
  return "?";
}

const char* dtype_mlir(DType dtype) {
  switch (dtype) {
    case DType::UInt8: return "ui8";
    case DType::Int8: return "i8";
    case DType::Int16: return "i16";
    case DType::Int32: return "i32";
    case DType::Int64: return "i64";
    case DType::Float16: return "f16";
    case DType::Float32: return "f32";
    case DType::Float64: return "f64";
    case DType::ComplexFloat: return "complex<f32>";
    case DType::ComplexDouble: return "complex<f64>";
    case DType::Bool: return "i1";
    case DType::BFloat16: return "bf16";
  }
  return "?";
}

bool is_floating(DType dtype) {
  return dtype == DType::Float16 || dtype == DType::Float32 || dtype == DType::Float64 ||
         dtype == DType::BFloat16;
}

bool is_complex(DType dtype) { return dtype == DType::ComplexFloat || dtype == DType::ComplexDouble; }

DType real_part_type(DType dtype) {
  if (dtype == DType::ComplexFloat) return DType::Float32;
  if (dtype == DType::ComplexDouble) return DType::Float64;
  return dtype;
}

DType complex_type_of(DType dtype) {
  if (is_complex(dtype)) return dtype;
  return dtype == DType::Float64 ? DType::ComplexDouble : DType::ComplexFloat;
}

bool is_signed_integer(DType dtype) {
  return dtype == DType::Int8 || dtype == DType::Int16 || dtype == DType::Int32 ||
         dtype == DType::Int64;
}

int64_t TensorType::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorType::mlir() const {
  std::string s = "tensor<";
  for (int64_t d : shape) {
    s += std::to_string(d);
    s += 'x';
  }
  s += dtype_mlir(dtype);
  s += '>';
  return s;
}

std::string TensorType::str() const {
  std::ostringstream out;
  out << dtype_name(dtype) << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

uint64_t hash_bytes(uint64_t seed, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed ^ 0xCBF29CE484222325ull;
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001B3ull;
  }
  return hash_mix(seed, h);
}

uint64_t hash_type(uint64_t seed, const TensorType& type) {
  uint64_t h = hash_mix(seed, static_cast<uint64_t>(type.dtype) + 1000);
  h = hash_mix(h, type.shape.size());
  for (int64_t d : type.shape) h = hash_mix(h, static_cast<uint64_t>(d));
  return h;
}

}  // namespace torchtpu
