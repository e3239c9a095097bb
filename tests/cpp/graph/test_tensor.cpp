#include <catch2/catch.hpp>

#include "graph/tensor.h"

using namespace nnfuse;

TEST_CASE("tensors share buffers on copy and clone deeply", "[tensor]") {
  Tensor a = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
  Tensor b = a;
  REQUIRE(a.same_data(b));
  Tensor c = a.clone();
  REQUIRE_FALSE(a.same_data(c));
  REQUIRE(c.equals(a));
  c.data<float>()[0] = 9;
  REQUIRE(a.data<float>()[0] == 1);
  REQUIRE(reinterpret_cast<uintptr_t>(a.raw()) % 64 == 0);
}

TEST_CASE("exclusive_raw hands out a buffer only its sole owner may rewrite", "[tensor]") {
  Tensor a = Tensor::from_vector<float>({4}, {1, 2, 3, 4});
  REQUIRE(a.generation() == 0);
  REQUIRE(a.exclusive_raw() == a.raw());
  REQUIRE(a.generation() == 1);  // hashes that key big weights by buffer see the rewrite
  {
    Tensor view = a.reshaped({2, 2});  // shares the buffer
    REQUIRE(a.exclusive_raw() == nullptr);
    REQUIRE(view.exclusive_raw() == nullptr);
  }
  REQUIRE(a.exclusive_raw() != nullptr);  // the view is gone
  std::vector<float> outside = {1, 2};
  Tensor wrapped = Tensor::wrap(DType::Float32, {2}, outside.data(), nullptr);  // not ours to write
  REQUIRE(wrapped.exclusive_raw() == nullptr);
  REQUIRE(Tensor().exclusive_raw() == nullptr);
}

TEST_CASE("typed access checks the dtype", "[tensor]") {
  Tensor a = Tensor::from_vector<int64_t>({3}, {1, 2, 3});
  REQUIRE_THROWS_AS(a.data<float>(), Error);
  REQUIRE(a.to_int_vector() == std::vector<int64_t>{1, 2, 3});
}

TEST_CASE("cast follows ONNX conversions", "[tensor]") {
  Tensor f = Tensor::from_vector<float>({4}, {1.7f, -1.7f, 0.0f, 2.5f});
  REQUIRE(f.cast(DType::Int32).to_int_vector() == std::vector<int64_t>{1, -1, 0, 2});
  Tensor b = f.cast(DType::Bool);
  REQUIRE(b.data<bool>()[0]);
  REQUIRE_FALSE(b.data<bool>()[2]);
  Tensor h = f.cast(DType::Float16);
  REQUIRE(h.as_double(3) == 2.5);
  REQUIRE(h.cast(DType::Float32).data<float>()[0] == Approx(1.7f).epsilon(1e-3));
}

TEST_CASE("half conversion is exact on representable values and rounds to nearest even", "[tensor]") {
  REQUIRE(half_to_float(float_to_half(1.0f)) == 1.0f);
  REQUIRE(half_to_float(float_to_half(-65504.0f)) == -65504.0f);
  REQUIRE(std::isinf(half_to_float(float_to_half(70000.0f))));
  REQUIRE(half_to_float(float_to_half(5.9604645e-08f)) == 5.9604645e-08f);  // smallest subnormal
  REQUIRE(float_to_half(1.0f + 1.0f / 2048) == float_to_half(1.0f));         // tie to even
  REQUIRE(bf16_to_float(float_to_bf16(3.0f)) == 3.0f);
}

TEST_CASE("reshape keeps data and checks element count", "[tensor]") {
  Tensor a = Tensor::from_vector<float>({2, 3}, {0, 1, 2, 3, 4, 5});
  Tensor r = a.reshaped({3, 2});
  REQUIRE(r.same_data(a));
  REQUIRE_THROWS_AS(a.reshaped({4}), Error);
  REQUIRE(shape_strides({2, 3, 4}) == std::vector<int64_t>{12, 4, 1});
}
