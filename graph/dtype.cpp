#include "graph/dtype.h"

#include <cmath>

namespace nnfuse {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: case DType::Int32: case DType::UInt32: return 4;
    case DType::Float64: case DType::Int64: case DType::UInt64: return 8;
    case DType::UInt8: case DType::Int8: case DType::Bool: return 1;
    case DType::Float8E4M3FN: case DType::Float8E4M3FNUZ: case DType::Float8E5M2: case DType::Float8E5M2FNUZ:
    case DType::UInt4: case DType::Int4: case DType::Float4E2M1: case DType::Float8E8M0: case DType::UInt2:
    case DType::Int2: return 1;
    case DType::UInt16: case DType::Int16: case DType::Float16: case DType::BFloat16: return 2;
    default: return 0;
  }
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::UInt8: return "uint8";
    case DType::Int8: return "int8";
    case DType::UInt16: return "uint16";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::UInt32: return "uint32";
    case DType::UInt64: return "uint64";
    case DType::Bool: return "bool";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    // ml_dtypes' names (the numpy dtypes onnx.numpy_helper returns for these types).
    case DType::Float8E4M3FN: return "float8_e4m3fn";
    case DType::Float8E4M3FNUZ: return "float8_e4m3fnuz";
    case DType::Float8E5M2: return "float8_e5m2";
    case DType::Float8E5M2FNUZ: return "float8_e5m2fnuz";
    case DType::UInt4: return "uint4";
    case DType::Int4: return "int4";
    case DType::Float4E2M1: return "float4_e2m1fn";
    case DType::Float8E8M0: return "float8_e8m0fnu";
    case DType::UInt2: return "uint2";
    case DType::Int2: return "int2";
    case DType::String: return "string";
    case DType::Undefined: return "undefined";
  }
  return "undefined";
}

DType dtype_from_name(const std::string& n) {
  if (n == "undefined") return DType::Undefined;  // codes 14 and 15 (complex) are named so too
  for (int i = 1; i <= kMaxDTypeCode; ++i) {
    auto t = static_cast<DType>(i);
    if (n == dtype_name(t)) return t;
  }
  if (n == "float") return DType::Float32;
  if (n == "double") return DType::Float64;
  if (n == "half") return DType::Float16;
  return DType::Undefined;
}

bool dtype_is_float(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}
bool dtype_is_low_precision(DType t) { return int32_t(t) >= 17 && int32_t(t) <= kMaxDTypeCode; }

int dtype_packed_bits(DType t) {
  switch (t) {
    case DType::UInt4: case DType::Int4: case DType::Float4E2M1: return 4;
    case DType::UInt2: case DType::Int2: return 2;
    default: return int(dtype_size(t)) * 8;
  }
}

bool dtype_is_integer(DType t) {
  switch (t) {
    case DType::UInt8: case DType::Int8: case DType::UInt16: case DType::Int16: case DType::Int32:
    case DType::Int64: case DType::UInt32: case DType::UInt64: return true;
    default: return false;
  }
}
bool dtype_is_signed(DType t) {
  return dtype_is_float(t) || t == DType::Int8 || t == DType::Int16 || t == DType::Int32 || t == DType::Int64;
}

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; mant <<= 1; } while (!(mant & 0x400));
      mant &= 0x3ff;
      bits = sign | uint32_t(127 - 15 - e) << 23 | mant << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));  // inf/nan
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00);                                      // overflow
  if (absx < 0x38800000u) {  // subnormal half or zero: round to nearest even
    float a;
    std::memcpy(&a, &absx, 4);
    float scaled = a * 16777216.0f;  // 2^24
    uint32_t m = uint32_t(std::nearbyint(scaled));
    return uint16_t(sign | m);
  }
  uint32_t mant = absx & 0x7fffff;
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t h = exp << 10 | mant >> 13;
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // round to nearest even
  return uint16_t(sign | h);
}

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  uint32_t rounding = 0x7fff + ((u >> 16) & 1);
  return uint16_t((u + rounding) >> 16);
}

}  // namespace nnfuse
