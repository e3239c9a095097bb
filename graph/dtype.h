#pragma once
// Element types. The numeric codes are ONNX's TensorProto.DataType so import/export is a cast.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace nnfuse {

enum class DType : int32_t {
  Undefined = 0,
  Float32 = 1,
  UInt8 = 2,
  Int8 = 3,
  UInt16 = 4,
  Int16 = 5,
  Int32 = 6,
  Int64 = 7,
  String = 8,
  Bool = 9,
  Float16 = 10,
  Float64 = 11,
  UInt32 = 12,
  UInt64 = 13,
  BFloat16 = 16,
  // Low-precision storage types (ONNX 1.14+). In memory each element takes one byte, as in
  // ml_dtypes: a float8 or float4 bit pattern (float4 in the low nibble), an int4/int2 value
  // sign-extended, a uint4/uint2 value; ONNX files pack the 4- and 2-bit types (graph/onnx_tensor.h).
  // Only data movement, Cast/CastLike and QuantizeLinear/DequantizeLinear take them
  // (graph/low_precision.h); arithmetic ops refuse them.
  Float8E4M3FN = 17,
  Float8E4M3FNUZ = 18,
  Float8E5M2 = 19,
  Float8E5M2FNUZ = 20,
  UInt4 = 21,
  Int4 = 22,
  Float4E2M1 = 23,
  Float8E8M0 = 24,
  UInt2 = 25,
  Int2 = 26,
};
constexpr int32_t kMaxDTypeCode = 26;

// Bytes per element; 0 for Undefined and String (strings are not supported as tensor data).
size_t dtype_size(DType t);
// Lower-case name as numpy spells it ("float32", "int64", "bool", ...).
const char* dtype_name(DType t);
// Parses a numpy-style name; returns Undefined when unknown.
DType dtype_from_name(const std::string& name);
bool dtype_is_float(DType t);    // float16, bfloat16, float32, float64
bool dtype_is_integer(DType t);  // signed and unsigned integers (not bool)
bool dtype_is_signed(DType t);
// float8 (the five kinds), float4e2m1, int4/uint4 and int2/uint2.
bool dtype_is_low_precision(DType t);
// Bits per element in an ONNX file: 4 for int4/uint4/float4e2m1, 2 for int2/uint2, else 8 x size.
int dtype_packed_bits(DType t);

// IEEE half stored as its bit pattern.
struct Half {
  uint16_t bits = 0;
};
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
// bfloat16 stored as its bit pattern.
struct BFloat16 {
  uint16_t bits = 0;
};
inline float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f);

// Maps a C++ element type to its DType (used by Tensor::data<T>()).
template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::Float32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::Float64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::UInt8; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::Int8; };
template <> struct DTypeOf<uint16_t> { static constexpr DType value = DType::UInt16; };
template <> struct DTypeOf<int16_t> { static constexpr DType value = DType::Int16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct DTypeOf<uint32_t> { static constexpr DType value = DType::UInt32; };
template <> struct DTypeOf<uint64_t> { static constexpr DType value = DType::UInt64; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::Bool; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::Float16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::BFloat16; };

// Calls f(T{}) with T the C++ type of `t` (bool as bool, float16 as Half, bfloat16 as BFloat16).
// Throws Unsupported for String/Undefined.
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& f);

}  // namespace nnfuse

#include "graph/error.h"

namespace nnfuse {
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::UInt8: return f(uint8_t{});
    case DType::Int8: return f(int8_t{});
    case DType::UInt16: return f(uint16_t{});
    case DType::Int16: return f(int16_t{});
    case DType::Int32: return f(int32_t{});
    case DType::Int64: return f(int64_t{});
    case DType::UInt32: return f(uint32_t{});
    case DType::UInt64: return f(uint64_t{});
    case DType::Bool: return f(bool{});
    case DType::Float16: return f(Half{});
    case DType::BFloat16: return f(BFloat16{});
    default: break;
  }
  fail(ErrorKind::Unsupported, std::string("unsupported dtype ") + dtype_name(t));
}
}  // namespace nnfuse
