// The low-precision storage types (graph/low_precision.h): float8, float4, int4/uint4, int2/uint2.
// Expected codes are ml_dtypes' (which the ONNX reference and ONNX Runtime follow), written out
// by hand from the formats' definitions.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "graph/builder.h"
#include "graph/interpreter.h"
#include "graph/low_precision.h"
#include "graph/onnx_io.h"
#include "graph/tensor.h"

using namespace nnfuse;

namespace {

const DType kFloat8[] = {DType::Float8E4M3FN, DType::Float8E4M3FNUZ, DType::Float8E5M2, DType::Float8E5M2FNUZ};

template <class T>
Tensor tv(const std::vector<T>& values, const Shape& shape) {
  return Tensor::from_vector<T>(shape, values);
}

uint8_t enc(DType t, double v, bool saturate = true) {
  LowPrecisionCast o;
  o.saturate = saturate;
  return float_to_low_precision(t, v, o);
}

}  // namespace

TEST_CASE("float8 and float4: largest finite values, NaN and infinity codes", "[dtype][lowp]") {
  CHECK(low_precision_to_double(DType::Float8E4M3FN, 0x7E) == 448.0);
  CHECK(std::isnan(low_precision_to_double(DType::Float8E4M3FN, 0x7F)));
  CHECK(std::isnan(low_precision_to_double(DType::Float8E4M3FN, 0xFF)));
  CHECK(low_precision_to_double(DType::Float8E4M3FNUZ, 0x7F) == 240.0);
  CHECK(std::isnan(low_precision_to_double(DType::Float8E4M3FNUZ, 0x80)));
  CHECK(low_precision_to_double(DType::Float8E5M2, 0x7B) == 57344.0);
  CHECK(low_precision_to_double(DType::Float8E5M2, 0x7C) == HUGE_VAL);
  CHECK(low_precision_to_double(DType::Float8E5M2, 0xFC) == -HUGE_VAL);
  CHECK(std::isnan(low_precision_to_double(DType::Float8E5M2, 0x7E)));
  CHECK(low_precision_to_double(DType::Float8E5M2FNUZ, 0x7F) == 57344.0);
  CHECK(low_precision_to_double(DType::Float4E2M1, 0x7) == 6.0);
  CHECK(low_precision_to_double(DType::Float4E2M1, 0x1) == 0.5);  // the one subnormal
  CHECK(low_precision_to_double(DType::Float4E2M1, 0xB) == -1.5);
  CHECK(low_precision_to_double(DType::Float8E4M3FN, 0x01) == std::ldexp(1.0, -9));  // smallest subnormal
  CHECK(low_precision_to_double(DType::Float8E8M0, 127) == 1.0);
  CHECK(low_precision_to_double(DType::Float8E8M0, 0) == std::ldexp(1.0, -127));
  CHECK(std::isnan(low_precision_to_double(DType::Float8E8M0, 0xFF)));
}

TEST_CASE("float8 and float4: every finite code converts back to itself", "[dtype][lowp]") {
  for (DType t : {DType::Float8E4M3FN, DType::Float8E4M3FNUZ, DType::Float8E5M2, DType::Float8E5M2FNUZ, DType::Float4E2M1}) {
    const int codes = t == DType::Float4E2M1 ? 16 : 256;
    int finite = 0;
    for (int c = 0; c < codes; ++c) {
      const double v = low_precision_to_double(t, uint8_t(c));
      if (std::isnan(v)) continue;
      INFO(dtype_name(t) << " code " << c << " value " << v);
      CHECK(int(enc(t, v, false)) == c);
      ++finite;
    }
    // NaN codes: two for E4M3FN (+-), one for the FNUZ types, six for E5M2 (+-, three
    // mantissas), none for float4.
    const int nans = t == DType::Float8E4M3FN ? 2 : t == DType::Float8E5M2 ? 6 : t == DType::Float4E2M1 ? 0 : 1;
    CHECK(finite == codes - nans);
  }
}

TEST_CASE("float8: round to nearest even, saturation, overflow to NaN or inf", "[dtype][lowp]") {
  // 464 lies halfway between 448 (mantissa 110, even) and 480 (E4M3FN's NaN code).
  CHECK(enc(DType::Float8E4M3FN, 464, false) == 0x7E);
  CHECK(enc(DType::Float8E4M3FN, 465, false) == 0x7F);  // rounds past the largest: NaN
  CHECK(enc(DType::Float8E4M3FN, 465, true) == 0x7E);
  CHECK(enc(DType::Float8E4M3FN, -1e6, true) == 0xFE);
  CHECK(enc(DType::Float8E4M3FN, HUGE_VAL, true) == 0x7E);
  CHECK(enc(DType::Float8E4M3FN, HUGE_VAL, false) == 0x7F);
  CHECK(enc(DType::Float8E5M2, 1e6, false) == 0x7C);  // E5M2 has inf
  CHECK(enc(DType::Float8E5M2, -HUGE_VAL, false) == 0xFC);
  CHECK(enc(DType::Float8E5M2, 1e6, true) == 0x7B);
  CHECK(enc(DType::Float8E5M2FNUZ, 1e6, false) == 0x80);  // FNUZ: NaN is 0x80
  // Ties in the subnormal range: 2^-10 is halfway between 0 and E4M3FN's smallest, 2^-9.
  CHECK(enc(DType::Float8E4M3FN, std::ldexp(1.0, -10)) == 0x00);
  CHECK(enc(DType::Float8E4M3FN, std::ldexp(3.0, -10)) == 0x02);  // 1.5 x 2^-9 -> 2 x 2^-9 (even)
  CHECK(enc(DType::Float8E4M3FN, -std::ldexp(1.0, -12)) == 0x80);  // negative zero
  CHECK(enc(DType::Float8E4M3FNUZ, -std::ldexp(1.0, -12)) == 0x00);  // FNUZ has no negative zero
  CHECK(enc(DType::Float8E4M3FNUZ, -0.0) == 0x00);
  CHECK(enc(DType::Float8E4M3FN, 0.48033667) == 0x2F);  // 0.46875 (ONNX's test_cast_FLOAT_to_FLOAT8E4M3FN)
  for (DType t : kFloat8) {
    INFO(dtype_name(t));
    CHECK(std::isnan(low_precision_to_double(t, enc(t, std::nan("")))));
  }
}

TEST_CASE("float4e2m1: always saturates, NaN becomes a zero", "[dtype][lowp]") {
  CHECK(enc(DType::Float4E2M1, 0.25) == 0x0);  // halfway between 0 and 0.5: even
  CHECK(enc(DType::Float4E2M1, 0.75) == 0x2);  // halfway between 0.5 and 1: 1 (mantissa 0)
  CHECK(enc(DType::Float4E2M1, -3.5) == 0xE);  // -4
  CHECK(enc(DType::Float4E2M1, 9.0, false) == 0x7);
  CHECK(enc(DType::Float4E2M1, -HUGE_VAL, false) == 0xF);
  CHECK(enc(DType::Float4E2M1, std::nan("")) == 0x8);  // ml_dtypes: NaN -> -0
}

TEST_CASE("float8e8m0: powers of two rounded up, down or to the nearer", "[dtype][lowp]") {
  LowPrecisionCast up, down, nearest;
  down.e8m0 = E8M0Rounding::Down;
  nearest.e8m0 = E8M0Rounding::Nearest;
  CHECK(float_to_low_precision(DType::Float8E8M0, 1.0, up) == 127);
  CHECK(float_to_low_precision(DType::Float8E8M0, 1.5, up) == 128);
  CHECK(float_to_low_precision(DType::Float8E8M0, 1.5, down) == 127);
  CHECK(float_to_low_precision(DType::Float8E8M0, 1.5, nearest) == 128);
  CHECK(float_to_low_precision(DType::Float8E8M0, 1.25, nearest) == 127);
  CHECK(float_to_low_precision(DType::Float8E8M0, -4.0, up) == 129);  // no sign bit
  CHECK(float_to_low_precision(DType::Float8E8M0, std::nan(""), up) == 0xFF);
  CHECK(float_to_low_precision(DType::Float8E8M0, 3e38, up) == 0xFE);  // saturates below NaN
  LowPrecisionCast wrap = up;
  wrap.saturate = false;
  CHECK(float_to_low_precision(DType::Float8E8M0, 3e38, wrap) == 0xFF);
}

TEST_CASE("int4, uint4, int2, uint2: wrap-around, ranges, packing", "[dtype][lowp]") {
  CHECK(int8_t(wrap_to_low_precision_int(DType::Int4, 8)) == -8);
  CHECK(int8_t(wrap_to_low_precision_int(DType::Int4, -9)) == 7);
  CHECK(wrap_to_low_precision_int(DType::UInt4, 17) == 1);
  CHECK(wrap_to_low_precision_int(DType::UInt2, -3) == 1);
  CHECK(int8_t(wrap_to_low_precision_int(DType::Int2, 2)) == -2);
  CHECK(low_precision_int_range(DType::Int4) == std::pair<int64_t, int64_t>{-8, 7});
  CHECK(low_precision_int_range(DType::UInt2) == std::pair<int64_t, int64_t>{0, 3});

  const uint8_t i4[] = {uint8_t(-8), 7, uint8_t(-1)};
  const std::string packed = pack_low_precision(DType::Int4, i4, 3);
  REQUIRE(packed.size() == 2);
  CHECK(uint8_t(packed[0]) == 0x78);  // first element in the low nibble
  CHECK(uint8_t(packed[1]) == 0x0F);
  uint8_t back[3];
  unpack_low_precision(DType::Int4, reinterpret_cast<const uint8_t*>(packed.data()), 3, back);
  CHECK(int8_t(back[0]) == -8);
  CHECK(int8_t(back[1]) == 7);
  CHECK(int8_t(back[2]) == -1);
  const uint8_t u2[] = {3, 0, 1, 2, 3};
  const std::string p2 = pack_low_precision(DType::UInt2, u2, 5);
  REQUIRE(p2.size() == 2);
  CHECK(uint8_t(p2[0]) == (3 | 0 << 2 | 1 << 4 | 2 << 6));
  CHECK(uint8_t(p2[1]) == 3);
  CHECK(packed_size(DType::Float8E5M2, 5) == 5);
}

TEST_CASE("Tensor::cast to and from the low-precision types, as ONNX's Cast", "[dtype][lowp]") {
  Tensor x = tv<float>({-9.f, 8.f, 2.7f, -2.7f, std::nanf("")}, {5});
  Tensor i4 = x.cast(DType::Int4);
  REQUIRE(i4.dtype() == DType::Int4);
  // Truncated towards zero, then wrapped (test_cast_FLOAT_to_INT4); NaN becomes 0.
  CHECK(i4.cast(DType::Int64).to_int_vector() == std::vector<int64_t>{7, -8, 2, -2, 0});
  CHECK(tv<int64_t>({-3, 4}, {2}).cast(DType::UInt2).cast(DType::Int32).to_int_vector() == std::vector<int64_t>{1, 0});
  Tensor f8 = tv<float>({0.5f, 1e6f, -1e-7f}, {3}).cast(DType::Float8E4M3FNUZ);
  CHECK(f8.to_float_vector() == std::vector<float>{0.5f, 240.f, 0.f});
  LowPrecisionCast no_sat;
  no_sat.saturate = false;
  CHECK(std::isnan(tv<float>({1e6f}, {1}).cast(DType::Float8E4M3FN, no_sat).as_double(0)));
  // float8 to float16 and to int4 go through the exact value.
  Tensor e5 = tv<float>({57344.f, -3.5f}, {2}).cast(DType::Float8E5M2);
  CHECK(e5.cast(DType::Float16).to_float_vector() == std::vector<float>{57344.f, -3.5f});
  CHECK(e5.cast(DType::Int4).cast(DType::Int64).to_int_vector() == std::vector<int64_t>{0, -3});  // 57344 = 0 mod 16
}

TEST_CASE("ONNX files: 4-bit and 2-bit initializers are stored packed and read back", "[dtype][lowp][onnx]") {
  GraphBuilder gb("lowp", 21);
  auto x = gb.input("x", DType::Float32, {5});
  Tensor w = tv<float>({-8.f, 7.f, -1.f, 3.f, 0.f}, {5}).cast(DType::Int4);
  auto wi = gb.constant("w", w);
  auto s = gb.constant("s", tv<float>({0.5f}, {}));
  gb.output(gb.op("Add", {x, gb.op("DequantizeLinear", {wi, s})}));
  Model m = gb.finish();
  const std::string bytes = save_model_bytes(m);
  Model back = load_model_bytes(bytes);
  REQUIRE(back.graph.initializer(wi).dtype() == DType::Int4);
  CHECK(back.graph.initializer(wi).cast(DType::Int64).to_int_vector() == std::vector<int64_t>{-8, 7, -1, 3, 0});
  TensorMap out = run_reference(back.graph, {{"x", tv<float>({1, 1, 1, 1, 1}, {5})}});
  CHECK(out.begin()->second.to_float_vector() == std::vector<float>{-3.f, 4.5f, 0.5f, 2.5f, 1.f});

  namespace fs = std::filesystem;
  const fs::path pb = fs::temp_directory_path() / ("nnfuse_lowp_" + std::to_string(::getpid()) + ".pb");
  save_tensor_pb(w, "w", pb.string());
  std::string name;
  Tensor w2 = load_tensor_pb(pb.string(), &name);
  fs::remove(pb);
  CHECK(name == "w");
  CHECK(w2.equals(w));
}
