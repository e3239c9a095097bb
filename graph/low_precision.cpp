#include "graph/low_precision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "graph/error.h"

namespace nnfuse {

namespace {

// A small float format: sign bit, `ebits` exponent bits with `bias`, `mbits` mantissa bits.
//   IEEE     all-ones exponent is inf (mantissa 0) or NaN (E5M2)
//   FN       no inf; only all-ones exponent and mantissa is NaN (E4M3FN)
//   FNUZ     no inf, no negative zero; the code 0x80 (negative zero's) is NaN (E4M3FNUZ, E5M2FNUZ)
//   Finite   no inf, no NaN (E2M1)
enum class Special { IEEE, FN, FNUZ, Finite };
struct MiniFloat {
  int ebits, mbits, bias;
  Special special;
  int bits() const { return 1 + ebits + mbits; }
  uint8_t sign_bit() const { return uint8_t(1u << (ebits + mbits)); }
  // The largest finite code without its sign.
  uint8_t max_code() const {
    const uint8_t all = uint8_t(sign_bit() - 1);
    switch (special) {
      case Special::IEEE: return uint8_t(all - (1u << mbits));  // exponent all-ones less one, mantissa all-ones
      case Special::FN: return uint8_t(all - 1);
      default: return all;
    }
  }
};

MiniFloat format_of(DType t) {
  switch (t) {
    case DType::Float8E4M3FN: return {4, 3, 7, Special::FN};
    case DType::Float8E4M3FNUZ: return {4, 3, 8, Special::FNUZ};
    case DType::Float8E5M2: return {5, 2, 15, Special::IEEE};
    case DType::Float8E5M2FNUZ: return {5, 2, 16, Special::FNUZ};
    case DType::Float4E2M1: return {2, 1, 1, Special::Finite};
    default: break;
  }
  fail(ErrorKind::Invalid, std::string("no small-float format for ") + dtype_name(t));
}

double decode(const MiniFloat& f, uint8_t code) {
  const uint8_t sign = code & f.sign_bit();
  const uint8_t mag = code & uint8_t(f.sign_bit() - 1);
  const int exp = mag >> f.mbits, man = mag & ((1 << f.mbits) - 1);
  const int exp_all = (1 << f.ebits) - 1;
  if (f.special == Special::FNUZ && code == f.sign_bit()) return std::numeric_limits<double>::quiet_NaN();
  if (f.special == Special::FN && exp == exp_all && man == (1 << f.mbits) - 1) return std::numeric_limits<double>::quiet_NaN();
  if (f.special == Special::IEEE && exp == exp_all)
    return man ? std::numeric_limits<double>::quiet_NaN() : (sign ? -HUGE_VAL : HUGE_VAL);
  const double v = exp == 0 ? std::ldexp(double(man), 1 - f.bias - f.mbits)
                            : std::ldexp(double(man + (1 << f.mbits)), exp - f.bias - f.mbits);
  return sign ? -v : v;
}

// The code of a finite, non-negative value that the format holds exactly.
uint8_t encode_exact(const MiniFloat& f, double r) {
  if (r == 0) return 0;
  const int emin = 1 - f.bias;
  const int e = std::ilogb(r);
  if (e < emin) return uint8_t(std::ldexp(r, f.bias - 1 + f.mbits));  // subnormal: exponent field 0
  const int man = int(std::ldexp(r, f.mbits - e)) - (1 << f.mbits);
  return uint8_t(((e + f.bias) << f.mbits) | man);
}

uint8_t nan_code(const MiniFloat& f, uint8_t sign) {
  const unsigned exp_all = (1u << f.ebits) - 1;
  switch (f.special) {
    case Special::FNUZ: return f.sign_bit();
    case Special::FN: return uint8_t(sign | (f.sign_bit() - 1));
    case Special::IEEE: return uint8_t(sign | (exp_all << f.mbits) | (1u << (f.mbits - 1)));  // quiet NaN
    case Special::Finite: break;
  }
  return uint8_t(sign ^ f.sign_bit());  // no NaN: a zero of the other sign, as ml_dtypes does
}

uint8_t encode(const MiniFloat& f, double v, bool saturate) {
  const uint8_t sign = std::signbit(v) ? f.sign_bit() : 0;
  if (std::isnan(v)) return nan_code(f, sign);
  const double a = std::fabs(v);
  const double maxv = decode(f, f.max_code());
  const bool clamp = saturate || f.special == Special::Finite;
  auto overflow = [&]() -> uint8_t {
    if (clamp) return uint8_t(sign | f.max_code());
    if (f.special == Special::IEEE) return uint8_t(sign | (((1u << f.ebits) - 1) << f.mbits));  // inf
    return nan_code(f, sign);
  };
  if (std::isinf(a)) return overflow();
  if (clamp && a > maxv) return uint8_t(sign | f.max_code());
  // Round to the format's spacing at a's exponent (subnormal spacing below the normal range);
  // the quotient is exact, being a power-of-two scaling, and rint rounds ties to even.
  const int e = a == 0 ? 1 - f.bias : std::max(std::ilogb(a), 1 - f.bias);
  const double r = std::ldexp(std::nearbyint(std::ldexp(a, f.mbits - e)), e - f.mbits);
  if (r > maxv) return overflow();
  const uint8_t code = encode_exact(f, r);
  if (code == 0 && f.special == Special::FNUZ) return 0;  // no negative zero: 0x80 is NaN
  return uint8_t(sign | code);
}

// float8e8m0: an unsigned power of two 2^(code-127), 0xFF NaN. Rounded from float32's exponent
// and mantissa bits, as the ONNX reference (onnx.numpy_helper.to_float8e8m0) does: `up` rounds any
// fraction up, `down` drops it, `nearest` rounds up from the midpoint (ties up, except in the
// subnormal range); the sign is ignored.
uint8_t encode_e8m0(double v, const LowPrecisionCast& o) {
  const float fv = float(v);
  uint32_t bits;
  std::memcpy(&bits, &fv, 4);
  uint32_t exponent = (bits >> 23) & 0xFF;
  if (exponent == 0xFF) return 0xFF;
  bool round_up = false;
  if (o.e8m0 == E8M0Rounding::Nearest) {
    const bool g = bits & 0x400000, r = bits & 0x200000, s = bits & 0x1FFFFF, lsb = exponent > 0;
    round_up = g && (r || s || lsb);
  } else if (o.e8m0 == E8M0Rounding::Up) {
    round_up = (bits & 0x7FFFFF) != 0;
  }
  if (round_up && !(o.saturate && exponent == 0xFE)) ++exponent;
  return uint8_t(exponent);
}

int low_bits(DType t) { return dtype_packed_bits(t); }

}  // namespace

bool low_precision_is_integer(DType t) {
  return t == DType::Int4 || t == DType::UInt4 || t == DType::Int2 || t == DType::UInt2;
}

std::pair<int64_t, int64_t> low_precision_int_range(DType t) {
  switch (t) {
    case DType::Int4: return {-8, 7};
    case DType::UInt4: return {0, 15};
    case DType::Int2: return {-2, 1};
    case DType::UInt2: return {0, 3};
    default: break;
  }
  fail(ErrorKind::Invalid, std::string(dtype_name(t)) + " is not a low-precision integer type");
}

double low_precision_to_double(DType t, uint8_t code) {
  if (low_precision_is_integer(t)) return t == DType::Int4 || t == DType::Int2 ? double(int8_t(code)) : double(code);
  if (t == DType::Float8E8M0) return code == 0xFF ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, int(code) - 127);
  return decode(format_of(t), code);
}

uint8_t float_to_low_precision(DType t, double v, const LowPrecisionCast& o) {
  if (t == DType::Float8E8M0) return encode_e8m0(v, o);
  return encode(format_of(t), v, o.saturate);
}

uint8_t wrap_to_low_precision_int(DType t, int64_t v) {
  const int bits = low_bits(t);
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  const uint64_t low = uint64_t(v) & mask;
  if (t == DType::Int4 || t == DType::Int2) {
    const int64_t half = int64_t(1) << (bits - 1);
    return uint8_t(int8_t(int64_t(low) >= half ? int64_t(low) - 2 * half : int64_t(low)));
  }
  return uint8_t(low);
}

size_t packed_size(DType t, size_t n) {
  const size_t per_byte = size_t(8 / low_bits(t));
  return per_byte <= 1 ? n * dtype_size(t) : (n + per_byte - 1) / per_byte;
}

std::string pack_low_precision(DType t, const uint8_t* elems, size_t n) {
  const int bits = low_bits(t);
  if (bits >= 8) return std::string(reinterpret_cast<const char*>(elems), n);
  std::string out(packed_size(t, n), '\0');
  const unsigned mask = (1u << bits) - 1;
  const size_t per_byte = size_t(8 / bits);
  for (size_t i = 0; i < n; ++i)
    out[i / per_byte] = char(uint8_t(out[i / per_byte]) | ((elems[i] & mask) << (bits * (i % per_byte))));
  return out;
}

void unpack_low_precision(DType t, const uint8_t* packed, size_t n, uint8_t* elems) {
  const int bits = low_bits(t);
  if (bits >= 8) {  // stored as in memory
    if (n) std::memcpy(elems, packed, n * dtype_size(t));
    return;
  }
  const unsigned mask = (1u << bits) - 1;
  const size_t per_byte = size_t(8 / bits);
  const bool is_signed = t == DType::Int4 || t == DType::Int2;
  for (size_t i = 0; i < n; ++i) {
    uint8_t v = uint8_t((packed[i / per_byte] >> (bits * (i % per_byte))) & mask);
    elems[i] = is_signed ? wrap_to_low_precision_int(t, v) : v;
  }
}

}  // namespace nnfuse
