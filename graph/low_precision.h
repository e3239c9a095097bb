#pragma once
// The low-precision storage types: float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0), float4
// (E2M1), int4/uint4 and int2/uint2. One byte per element in memory (graph/dtype.h); these are the
// conversions that ONNX's Cast, CastLike, QuantizeLinear and DequantizeLinear define for them, with
// the rounding and saturation of the ONNX reference (ml_dtypes for float8 and float4).
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "graph/dtype.h"

namespace nnfuse {

// How a float becomes float8e8m0 (Cast's round_mode, opset 24): the next power of two up, down,
// or the nearer one.
enum class E8M0Rounding { Up, Down, Nearest };

struct LowPrecisionCast {
  // Values past the largest finite one (and infinities) become it (with their sign), as Cast's
  // and QuantizeLinear's `saturate` (default 1) asks; else they become inf (E5M2) or NaN.
  bool saturate = true;
  E8M0Rounding e8m0 = E8M0Rounding::Up;
};

// The value a float8/float4 code stands for (NaN where the type has NaN), or the integer value
// of an int4/uint4/int2/uint2 element.
double low_precision_to_double(DType t, uint8_t code);

// A float to the code of the float8/float4 type t: rounded to nearest, ties to even (E8M0 by
// `o.e8m0`). float4e2m1 has no inf or NaN: it always saturates, and NaN becomes a zero.
uint8_t float_to_low_precision(DType t, double v, const LowPrecisionCast& o = {});

// An integer to int4/uint4/int2/uint2, wrapping around like any narrowing integer conversion
// (Cast truncates a float towards zero first).
uint8_t wrap_to_low_precision_int(DType t, int64_t v);

// The value range of int4/uint4/int2/uint2 (QuantizeLinear clamps to it).
std::pair<int64_t, int64_t> low_precision_int_range(DType t);

// True for int4/uint4/int2/uint2 (integers), false for the float8 and float4 types.
bool low_precision_is_integer(DType t);

// ONNX's packing of the sub-byte types in raw data and int32_data: two 4-bit elements per byte or
// four 2-bit ones, the first element in the lowest bits. Other types are one byte per element.
size_t packed_size(DType t, size_t n);
std::string pack_low_precision(DType t, const uint8_t* elems, size_t n);
// Unpacks n elements (sign-extending int4 and int2) from packed_size(t, n) bytes; any other
// type's bytes are copied as they are.
void unpack_low_precision(DType t, const uint8_t* packed, size_t n, uint8_t* elems);

}  // namespace nnfuse
