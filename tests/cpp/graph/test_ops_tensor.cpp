// Tests of the tensor / data-movement / shape op family (graph/ops_tensor*.cpp). Expected values
// are computed by hand (or are the ONNX spec's own examples).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "graph/builder.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"

using namespace nnfuse;

namespace {

// A tensor that stands for an absent optional input.
Tensor absent() { return Tensor(); }

std::vector<Tensor> run(const std::string& op, const std::vector<Tensor>& ins, Attributes attrs = {}, int64_t opset = 17,
                        int num_outputs = 1) {
  Node n;
  n.id = 0;
  n.name = "test_" + op;
  n.op_type = op;
  n.attrs = std::move(attrs);
  std::vector<const Tensor*> ptrs;
  for (size_t i = 0; i < ins.size(); ++i) {
    bool present = ins[i].dtype() != DType::Undefined;
    n.inputs.push_back(present ? "in" + std::to_string(i) : "");
    ptrs.push_back(present ? &ins[i] : nullptr);
  }
  for (int k = 0; k < num_outputs; ++k) n.outputs.push_back("out" + std::to_string(k));
  return run_node(n, opset, ptrs);
}

Tensor run1(const std::string& op, const std::vector<Tensor>& ins, Attributes attrs = {}, int64_t opset = 17) {
  auto r = run(op, ins, std::move(attrs), opset);
  REQUIRE(r.size() >= 1);
  return r[0];
}

Tensor F(Shape s, std::vector<float> v) { return Tensor::from_vector<float>(std::move(s), v); }
Tensor I64(Shape s, std::vector<int64_t> v) { return Tensor::from_vector<int64_t>(std::move(s), v); }
Tensor I32(Shape s, std::vector<int32_t> v) { return Tensor::from_vector<int32_t>(std::move(s), v); }
Tensor iota_f(Shape s) {
  Tensor t(DType::Float32, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(i);
  return t;
}

void check_f(const Tensor& t, const Shape& shape, const std::vector<float>& want, float tol = 1e-5f) {
  REQUIRE(t.shape() == shape);
  auto got = t.to_float_vector();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == Approx(want[i]).margin(tol));
  }
}

void check_i(const Tensor& t, const Shape& shape, const std::vector<int64_t>& want) {
  REQUIRE(t.shape() == shape);
  CHECK(t.to_int_vector() == want);
}

using A2 = GraphBuilder;

}  // namespace

// ------------------------------------------------------------------------- shape ops

TEST_CASE("Reshape: 0 copies, -1 infers, allowzero, errors name shapes", "[ops][tensor]") {
  Tensor x = iota_f({2, 3, 4});
  check_f(run1("Reshape", {x, I64({2}, {4, -1})}), {4, 6}, x.to_float_vector());
  CHECK(run1("Reshape", {x, I64({2}, {0, -1})}).shape() == Shape{2, 12});
  CHECK(run1("Reshape", {x, I64({3}, {-1, 0, 2})}).shape() == Shape{4, 3, 2});
  // allowzero (opset 14): a 0 is a real zero-size dim.
  Tensor empty(DType::Float32, {0, 3});
  CHECK(run1("Reshape", {empty, I64({2}, {3, 0})}, A2::attrs({{"allowzero", A::i(1)}}), 14).shape() == Shape{3, 0});
  try {
    run1("Reshape", {x, I64({2}, {5, -1})});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.context().node == "test_Reshape");
    CHECK(std::string(e.what()).find("cannot reshape [2,3,4] (24 elements) to [5,-1]") != std::string::npos);
  }
}

TEST_CASE("Reshape inference error names node and shapes", "[ops][tensor]") {
  GraphBuilder b("g", 17);
  auto x = b.input("x", DType::Float32, {2, 3, 4});
  auto t = b.ints("target", {5, -1});
  auto y = b.op("Reshape", {x, t}, {}, "bad_reshape");
  b.output(y);
  try {
    infer_shapes(b.graph());
    FAIL("expected a shape error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Shape);
    CHECK(e.context().node == "bad_reshape");
    CHECK(std::string(e.what()).find("[2,3,4] (24 elements) to [5,-1]") != std::string::npos);
  }
}

TEST_CASE("Reshape to a target of very high rank fails at once with a short message (fuzz finding)", "[ops][tensor]") {
  // 32769 ones: the message had every dim (64 KB), and building it once per dim took minutes (the
  // regression input tests/fuzz/regressions/model/reshape-target-rank-32769 replays that case).
  GraphBuilder b("g", 17);
  auto x = b.input("x", DType::Float32, {24, 1});
  auto y = b.op("Reshape", {x, b.ints("target", std::vector<int64_t>(32769, 1))}, {}, "deep_reshape");
  b.output(y);
  try {
    infer_shapes(b.graph());
    FAIL("expected a shape error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(e.context().node == "deep_reshape");
    CHECK(msg.find("(24 elements) to [1,1,") != std::string::npos);
    CHECK(msg.find(",... (32769 dims)]") != std::string::npos);
    CHECK(msg.size() < 1000);
  }
}

TEST_CASE("Shape, Size, Flatten, Constant", "[ops][tensor]") {
  Tensor x = iota_f({2, 3, 4, 5});
  check_i(run1("Shape", {x}), {4}, {2, 3, 4, 5});
  check_i(run1("Shape", {x}, A2::attrs({{"start", A::i(1)}, {"end", A::i(-1)}}), 15), {2}, {3, 4});
  check_i(run1("Shape", {x}, A2::attrs({{"start", A::i(-10)}}), 15), {4}, {2, 3, 4, 5});  // clamped
  check_i(run1("Size", {x}), {}, {120});
  CHECK(run1("Flatten", {x}).shape() == Shape{2, 60});
  CHECK(run1("Flatten", {x}, A2::attrs({{"axis", A::i(-1)}})).shape() == Shape{24, 5});
  CHECK(run1("Flatten", {x}, A2::attrs({{"axis", A::i(0)}})).shape() == Shape{1, 120});
  CHECK(run1("Flatten", {x}, A2::attrs({{"axis", A::i(4)}})).shape() == Shape{120, 1});
  check_i(run1("Constant", {}, A2::attrs({{"value_ints", A::is({3, 1})}})), {2}, {3, 1});
  check_f(run1("Constant", {}, A2::attrs({{"value_float", A::f(2.5f)}})), {}, {2.5f});
  try {
    run1("Constant", {}, A2::attrs({{"value_string", A::s("x")}}));
    FAIL("expected Unsupported");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Unsupported);
  }
}

TEST_CASE("Squeeze and Unsqueeze: attribute (< 13) and input (>= 13) forms, negative axes", "[ops][tensor]") {
  Tensor x = iota_f({1, 3, 1, 2});
  CHECK(run1("Squeeze", {x}, A2::attrs({{"axes", A::is({0})}}), 11).shape() == Shape{3, 1, 2});
  CHECK(run1("Squeeze", {x, I64({1}, {-2})}, {}, 13).shape() == Shape{1, 3, 2});
  CHECK(run1("Squeeze", {x}, {}, 13).shape() == Shape{3, 2});
  CHECK_THROWS_AS(run1("Squeeze", {x, I64({1}, {1})}, {}, 13), Error);
  Tensor v = iota_f({3});
  CHECK(run1("Unsqueeze", {v}, A2::attrs({{"axes", A::is({0, 2})}}), 11).shape() == Shape{1, 3, 1});
  CHECK(run1("Unsqueeze", {v, I64({1}, {-1})}, {}, 13).shape() == Shape{3, 1});
  CHECK(run1("Unsqueeze", {v, I64({2}, {0, -1})}, {}, 13).shape() == Shape{1, 3, 1});
}

TEST_CASE("Range and ConstantOfShape past any memory fail before allocating, naming the node and shape", "[ops][tensor][malformed]") {
  // Range to 2^62 (issue 20: it crashed, its byte count wrapping around to a tiny buffer), and a
  // ConstantOfShape whose dims multiply past 2^63.
  const std::vector<Tensor> range_in = {Tensor::scalar<int64_t>(0), Tensor::scalar<int64_t>(int64_t(1) << 62), Tensor::scalar<int64_t>(1)};
  const std::vector<Tensor> cos_in = {I64({3}, {int64_t(1) << 31, int64_t(1) << 31, int64_t(1) << 31})};
  for (const auto* c : {&range_in, &cos_in}) {
    const std::string op = c == &range_in ? "Range" : "ConstantOfShape";
    try {
      run1(op, *c);
      FAIL(op << " ran");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::Shape);
      CHECK_THAT(e.what(), Catch::Contains("test_" + op) && Catch::Contains("op " + op) && Catch::Contains("needs more than 2^64 bytes"));
    }
  }
  // Within 2^64 bytes but past the cap (physical memory unless NNFUSE_MAX_TENSOR_BYTES says).
  try {
    Tensor t(DType::Float32, {int64_t(1) << 40, 1024});
    FAIL("allocated 4 PiB");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("[1099511627776,1024]") && Catch::Contains("4503599627370496 bytes") && Catch::Contains("over the limit"));
  }
}

TEST_CASE("ConstantOfShape, Range, EyeLike, Trilu", "[ops][tensor]") {
  Tensor c = run1("ConstantOfShape", {I64({2}, {2, 3})}, A2::attrs({{"value", A::t(Tensor::from_vector<int32_t>({1}, {7}))}}));
  CHECK(c.dtype() == DType::Int32);
  check_i(c, {2, 3}, {7, 7, 7, 7, 7, 7});
  check_f(run1("ConstantOfShape", {I64({1}, {2})}), {2}, {0, 0});
  check_i(run1("Range", {Tensor::scalar<int64_t>(3), Tensor::scalar<int64_t>(9), Tensor::scalar<int64_t>(3)}), {2}, {3, 6});
  check_i(run1("Range", {Tensor::scalar<int32_t>(10), Tensor::scalar<int32_t>(4), Tensor::scalar<int32_t>(-3)}), {2}, {10, 7});
  check_f(run1("Range", {Tensor::scalar<float>(0), Tensor::scalar<float>(1), Tensor::scalar<float>(0.3f)}), {4}, {0, 0.3f, 0.6f, 0.9f});
  check_f(run1("EyeLike", {iota_f({2, 3})}, A2::attrs({{"k", A::i(1)}})), {2, 3}, {0, 1, 0, 0, 0, 1});
  Tensor m = iota_f({3, 3});
  check_f(run1("Trilu", {m}), {3, 3}, {0, 1, 2, 0, 4, 5, 0, 0, 8});
  check_f(run1("Trilu", {m, Tensor::scalar<int64_t>(-1)}, A2::attrs({{"upper", A::i(0)}})), {3, 3}, {0, 0, 0, 3, 0, 0, 6, 7, 0});
  check_f(run1("Trilu", {m, Tensor::scalar<int64_t>(1)}), {3, 3}, {0, 1, 2, 0, 0, 5, 0, 0, 0});
}

// ------------------------------------------------------------------------- data movement

TEST_CASE("Transpose: default reverse, perm, every dtype", "[ops][tensor]") {
  Tensor x = iota_f({2, 3});
  check_f(run1("Transpose", {x}), {3, 2}, {0, 3, 1, 4, 2, 5});
  Tensor y = iota_f({2, 2, 3});
  check_f(run1("Transpose", {y}, A2::attrs({{"perm", A::is({1, 0, 2})}})), {2, 2, 3}, {0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11});
  check_f(run1("Transpose", {y}, A2::attrs({{"perm", A::is({2, 0, 1})}})), {3, 2, 2}, {0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11});
  Tensor h = x.cast(DType::Float16);
  Tensor th = run1("Transpose", {h});
  CHECK(th.dtype() == DType::Float16);
  check_f(th, {3, 2}, {0, 3, 1, 4, 2, 5});
  Tensor bx = Tensor::from_vector<bool>({2, 2}, {true, false, false, false});
  Tensor tb = run1("Transpose", {bx});
  CHECK(tb.data<bool>()[0] == true);
  CHECK(tb.data<bool>()[1] == false);
  CHECK_THROWS_AS(run1("Transpose", {x}, A2::attrs({{"perm", A::is({0, 0})}})), Error);
}

TEST_CASE("Transpose of tiles larger than the copy tile, all 4-D permutations, 1/2/4/8-byte types", "[ops][tensor]") {
  const Shape shape{3, 37, 41, 5};
  Tensor base(DType::Int32, shape);
  for (int64_t i = 0; i < base.numel(); ++i) base.data<int32_t>()[i] = int32_t(i);
  auto strides = shape_strides(shape);
  std::vector<int64_t> perm{0, 1, 2, 3};
  do {
    Shape out;
    for (auto p : perm) out.push_back(shape[size_t(p)]);
    // Expected: out[i0,i1,i2,i3] = in at index with in-dim perm[k] = ik, walked naively.
    std::vector<int32_t> want;
    for (int64_t a = 0; a < out[0]; ++a)
      for (int64_t b = 0; b < out[1]; ++b)
        for (int64_t c = 0; c < out[2]; ++c)
          for (int64_t d = 0; d < out[3]; ++d) {
            int64_t idx[4] = {a, b, c, d}, off = 0;
            for (int k = 0; k < 4; ++k) off += idx[k] * strides[size_t(perm[size_t(k)])];
            want.push_back(int32_t(off));
          }
    for (DType t : {DType::Int32, DType::Int16, DType::Float64, DType::UInt8}) {
      INFO("perm " << perm[0] << perm[1] << perm[2] << perm[3] << " dtype " << dtype_name(t));
      Tensor y = run1("Transpose", {base.cast(t)}, A2::attrs({{"perm", A::is(perm)}}));
      REQUIRE(y.shape() == out);
      Tensor expect = Tensor::from_vector<int32_t>(out, want).cast(t);
      CHECK(y.equals(expect));
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
}

TEST_CASE("Concat and Split (attr, input, num_outputs)", "[ops][tensor]") {
  Tensor a = iota_f({2, 2}), b = F({2, 1}, {10, 11});
  check_f(run1("Concat", {a, b}, A2::attrs({{"axis", A::i(1)}})), {2, 3}, {0, 1, 10, 2, 3, 11});
  check_f(run1("Concat", {a, a}, A2::attrs({{"axis", A::i(-2)}})), {4, 2}, {0, 1, 2, 3, 0, 1, 2, 3});
  check_i(run1("Concat", {I32({1}, {1}), I32({2}, {2, 3})}, A2::attrs({{"axis", A::i(0)}})), {3}, {1, 2, 3});
  CHECK_THROWS_AS(run1("Concat", {a, F({3, 1}, {1, 2, 3})}, A2::attrs({{"axis", A::i(1)}})), Error);

  Tensor x = iota_f({2, 5});
  auto s1 = run("Split", {x}, A2::attrs({{"axis", A::i(1)}, {"split", A::is({2, 3})}}), 11, 2);
  check_f(s1[0], {2, 2}, {0, 1, 5, 6});
  check_f(s1[1], {2, 3}, {2, 3, 4, 7, 8, 9});
  auto s2 = run("Split", {x, I64({2}, {4, 1})}, A2::attrs({{"axis", A::i(-1)}}), 13, 2);
  check_f(s2[1], {2, 1}, {4, 9});
  auto s3 = run("Split", {x}, A2::attrs({{"axis", A::i(1)}, {"num_outputs", A::i(2)}}), 18, 2);
  check_f(s3[0], {2, 3}, {0, 1, 2, 5, 6, 7});
  check_f(s3[1], {2, 2}, {3, 4, 8, 9});
  auto s4 = run("Split", {iota_f({4})}, {}, 13, 2);
  check_f(s4[1], {2}, {2, 3});
  CHECK_THROWS_AS(run("Split", {iota_f({5})}, {}, 13, 2), Error);  // uneven without num_outputs
}

TEST_CASE("Slice: attribute form, input form, negative steps, clamping", "[ops][tensor]") {
  Tensor x = F({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  // The spec's example: starts [1,0], ends [2,3], steps [1,2].
  check_f(run1("Slice", {x, I64({2}, {1, 0}), I64({2}, {2, 3}), I64({2}, {0, 1}), I64({2}, {1, 2})}, {}, 13), {1, 2}, {5, 7});
  // Opset 9: attributes; ends past the end clamp.
  check_f(run1("Slice", {x}, A2::attrs({{"starts", A::is({0, 1})}, {"ends", A::is({-1, 1000})}}), 9), {1, 3}, {2, 3, 4});
  Tensor v = iota_f({10});
  check_f(run1("Slice", {v, I64({1}, {8}), I64({1}, {1}), I64({1}, {0}), I64({1}, {-3})}, {}, 13), {3}, {8, 5, 2});
  const int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
  check_f(run1("Slice", {v, I64({1}, {-1}), I64({1}, {small}), Tensor(), I64({1}, {-4})}, {}, 13), {3}, {9, 5, 1});
  check_f(run1("Slice", {v, I64({1}, {-3}), I64({1}, {big})}, {}, 13), {3}, {7, 8, 9});
  CHECK(run1("Slice", {v, I64({1}, {5}), I64({1}, {2})}, {}, 13).shape() == Shape{0});
  // Negative axis, int32 indices.
  check_f(run1("Slice", {x, I32({1}, {2}), I32({1}, {4}), I32({1}, {-1})}, {}, 13), {2, 2}, {3, 4, 7, 8});
}

TEST_CASE("Expand and Tile", "[ops][tensor]") {
  Tensor x = F({3, 1}, {1, 2, 3});
  check_f(run1("Expand", {x, I64({3}, {2, 1, 2})}), {2, 3, 2}, {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  check_f(run1("Expand", {x, I64({1}, {1})}), {3, 1}, {1, 2, 3});  // shape may be smaller
  CHECK_THROWS_AS(run1("Expand", {x, I64({2}, {2, 2})}), Error);
  Tensor t = F({2, 2}, {1, 2, 3, 4});
  check_f(run1("Tile", {t, I64({2}, {1, 2})}), {2, 4}, {1, 2, 1, 2, 3, 4, 3, 4});
  check_f(run1("Tile", {t, I64({2}, {2, 1})}), {4, 2}, {1, 2, 3, 4, 1, 2, 3, 4});
}

TEST_CASE("Pad: constant/reflect/edge/wrap, attr (opset 2) and input forms, axes", "[ops][tensor]") {
  Tensor x = F({3, 2}, {1.0f, 1.2f, 2.3f, 3.4f, 4.5f, 5.7f});
  // Spec examples: pads [0, 2, 0, 0].
  check_f(run1("Pad", {x, I64({4}, {0, 2, 0, 0})}, A2::attrs({{"mode", A::s("reflect")}}), 13), {3, 4},
          {1.0f, 1.2f, 1.0f, 1.2f, 2.3f, 3.4f, 2.3f, 3.4f, 4.5f, 5.7f, 4.5f, 5.7f});
  check_f(run1("Pad", {x, I64({4}, {0, 2, 0, 0})}, A2::attrs({{"mode", A::s("edge")}}), 13), {3, 4},
          {1.0f, 1.0f, 1.0f, 1.2f, 2.3f, 2.3f, 2.3f, 3.4f, 4.5f, 4.5f, 4.5f, 5.7f});
  check_f(run1("Pad", {x, I64({4}, {0, 2, 0, 0}), Tensor::scalar<float>(0)}, {}, 11), {3, 4},
          {0, 0, 1.0f, 1.2f, 0, 0, 2.3f, 3.4f, 0, 0, 4.5f, 5.7f});
  Tensor v = F({3}, {1, 2, 3});
  check_f(run1("Pad", {v, I64({2}, {2, 2})}, A2::attrs({{"mode", A::s("wrap")}}), 19), {7}, {2, 3, 1, 2, 3, 1, 2});
  check_f(run1("Pad", {v, I64({2}, {3, 0})}, A2::attrs({{"mode", A::s("reflect")}}), 13), {6}, {2, 3, 2, 1, 2, 3});
  check_f(run1("Pad", {v}, A2::attrs({{"pads", A::is({1, 0})}, {"value", A::f(9)}}), 2), {4}, {9, 1, 2, 3});
  check_f(run1("Pad", {v, I64({2}, {-1, 1}), Tensor::scalar<float>(7)}, {}, 11), {3}, {2, 3, 7});  // negative pad crops
  // Opset 18 axes input: pad only the last axis.
  check_f(run1("Pad", {F({2, 1}, {1, 2}), I64({2}, {1, 1}), Tensor::scalar<float>(5), I64({1}, {-1})}, {}, 18), {2, 3},
          {5, 1, 5, 5, 2, 5});
  CHECK_THROWS_AS(run1("Pad", {v, I64({2}, {1, 1})}, A2::attrs({{"mode", A::s("wrap")}}), 18), Error);
}

TEST_CASE("DepthToSpace (DCR, CRD) and SpaceToDepth", "[ops][tensor]") {
  Tensor x = iota_f({1, 8, 2, 3});
  Tensor dcr = run1("DepthToSpace", {x}, A2::attrs({{"blocksize", A::i(2)}}));
  REQUIRE(dcr.shape() == Shape{1, 2, 4, 6});
  auto d = dcr.to_float_vector();
  // Output (c, y, x) reads channel (y%2)*4 + (x%2)*2 + c at (y/2, x/2).
  CHECK(std::vector<float>(d.begin(), d.begin() + 6) == std::vector<float>{0, 12, 1, 13, 2, 14});
  CHECK(std::vector<float>(d.begin() + 6, d.begin() + 12) == std::vector<float>{24, 36, 25, 37, 26, 38});
  Tensor crd = run1("DepthToSpace", {x}, A2::attrs({{"blocksize", A::i(2)}, {"mode", A::s("CRD")}}));
  auto e = crd.to_float_vector();
  // CRD: channel c*4 + (y%2)*2 + (x%2).
  CHECK(std::vector<float>(e.begin(), e.begin() + 6) == std::vector<float>{0, 6, 1, 7, 2, 8});
  CHECK(std::vector<float>(e.begin() + 6, e.begin() + 12) == std::vector<float>{12, 18, 13, 19, 14, 20});
  // SpaceToDepth inverts DCR.
  Tensor back = run1("SpaceToDepth", {dcr}, A2::attrs({{"blocksize", A::i(2)}}));
  CHECK(back.shape() == x.shape());
  CHECK(back.to_float_vector() == x.to_float_vector());
}

TEST_CASE("Compress and ReverseSequence", "[ops][tensor]") {
  Tensor x = F({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor cond = Tensor::from_vector<bool>({3}, {false, true, true});
  check_f(run1("Compress", {x, cond}, A2::attrs({{"axis", A::i(0)}})), {2, 2}, {3, 4, 5, 6});
  check_f(run1("Compress", {x, Tensor::from_vector<bool>({2}, {false, true})}, A2::attrs({{"axis", A::i(1)}})), {3, 1}, {2, 4, 6});
  check_f(run1("Compress", {x, cond}), {2}, {2, 3});  // flattened
  // time_axis 0, batch_axis 1: x is [T=3, B=2].
  check_f(run1("ReverseSequence", {x, I64({2}, {3, 2})}), {3, 2}, {5, 4, 3, 2, 1, 6});
}

// ------------------------------------------------------------------------- indexing

TEST_CASE("Gather, GatherElements, GatherND", "[ops][tensor]") {
  Tensor x = F({3, 2}, {1.0f, 1.2f, 2.3f, 3.4f, 4.5f, 5.7f});
  check_f(run1("Gather", {x, I64({2, 2}, {0, 1, 1, 2})}), {2, 2, 2}, {1.0f, 1.2f, 2.3f, 3.4f, 2.3f, 3.4f, 4.5f, 5.7f});
  check_f(run1("Gather", {x, I32({1}, {-1})}, A2::attrs({{"axis", A::i(1)}})), {3, 1}, {1.2f, 3.4f, 5.7f});
  check_f(run1("Gather", {x, Tensor::scalar<int64_t>(2)}), {2}, {4.5f, 5.7f});
  try {
    run1("Gather", {x, I64({1}, {3})});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.context().node == "test_Gather");
    CHECK(std::string(e.what()).find("out of range") != std::string::npos);
  }
  check_f(run1("GatherElements", {F({2, 2}, {1, 2, 3, 4}), I64({2, 2}, {0, 0, 1, 0})}, A2::attrs({{"axis", A::i(1)}})), {2, 2}, {1, 1, 4, 3});
  check_f(run1("GatherElements", {iota_f({3, 3}), I32({2, 3}, {1, 2, 0, 2, 0, -3})}), {2, 3}, {3, 7, 2, 6, 1, 2});
  Tensor d = iota_f({2, 2, 2});
  check_f(run1("GatherND", {d, I64({2, 1}, {1, 0}), }, A2::attrs({{"batch_dims", A::i(1)}})), {2, 2}, {2, 3, 4, 5});
  check_f(run1("GatherND", {F({2, 2}, {0, 1, 2, 3}), I64({2, 2}, {0, 0, 1, 1})}), {2}, {0, 3});
  check_f(run1("GatherND", {F({2, 2}, {0, 1, 2, 3}), I64({2, 1}, {1, 0})}), {2, 2}, {2, 3, 0, 1});
}

TEST_CASE("ScatterND and ScatterElements with reductions", "[ops][tensor]") {
  Tensor data = F({8}, {1, 2, 3, 4, 5, 6, 7, 8});
  check_f(run1("ScatterND", {data, I64({4, 1}, {4, 3, 1, 7}), F({4}, {9, 10, 11, 12})}), {8}, {1, 11, 3, 10, 9, 6, 7, 12});
  check_f(run1("ScatterND", {F({2}, {1, 1}), I64({2, 1}, {0, 0}), F({2}, {2, 3})}, A2::attrs({{"reduction", A::s("add")}}), 16), {2}, {6, 1});
  check_f(run1("ScatterND", {F({2}, {1, 1}), I64({2, 1}, {0, 0}), F({2}, {2, 3})}, A2::attrs({{"reduction", A::s("mul")}}), 16), {2}, {6, 1});
  check_f(run1("ScatterND", {F({2}, {1, 1}), I64({2, 1}, {1, 1}), F({2}, {5, 3})}, A2::attrs({{"reduction", A::s("max")}}), 18), {2}, {1, 5});
  Tensor zeros(DType::Float32, {3, 3});
  check_f(run1("ScatterElements", {zeros, I64({2, 3}, {1, 0, 2, 0, 2, 1}), F({2, 3}, {1.0f, 1.1f, 1.2f, 2.0f, 2.1f, 2.2f})}), {3, 3},
          {2.0f, 1.1f, 0, 1.0f, 0, 2.2f, 0, 2.1f, 1.2f});
  check_f(run1("ScatterElements", {F({1, 5}, {1, 2, 3, 4, 5}), I64({1, 2}, {1, -2}), F({1, 2}, {1.1f, 2.1f})}, A2::attrs({{"axis", A::i(1)}})),
          {1, 5}, {1, 1.1f, 3, 2.1f, 5});
  check_f(run1("ScatterElements", {F({1, 5}, {1, 2, 3, 4, 5}), I64({1, 2}, {1, 1}), F({1, 2}, {1.1f, 2.1f})},
               A2::attrs({{"axis", A::i(1)}, {"reduction", A::s("add")}}), 16),
          {1, 5}, {1, 5.2f, 3, 4, 5});
}

TEST_CASE("TopK: k attribute (< 10) and input, largest/smallest, ties", "[ops][tensor]") {
  Tensor x = F({2, 4}, {1, 3, 3, 2, 5, 4, 6, 0});
  auto r9 = run("TopK", {x}, A2::attrs({{"k", A::i(2)}}), 9, 2);
  check_f(r9[0], {2, 2}, {3, 3, 6, 5});
  check_i(r9[1], {2, 2}, {1, 2, 2, 0});  // tie: lower index first
  auto r11 = run("TopK", {x, I64({1}, {3})}, A2::attrs({{"largest", A::i(0)}}), 11, 2);
  check_f(r11[0], {2, 3}, {1, 2, 3, 0, 4, 5});
  check_i(r11[1], {2, 3}, {0, 3, 1, 3, 1, 0});
  auto r0 = run("TopK", {x, I64({1}, {1})}, A2::attrs({{"axis", A::i(0)}}), 11, 2);
  check_f(r0[0], {1, 4}, {5, 4, 6, 2});
  check_i(r0[1], {1, 4}, {1, 1, 1, 0});
}

TEST_CASE("NonZero and OneHot", "[ops][tensor]") {
  check_i(run1("NonZero", {Tensor::from_vector<bool>({2, 2}, {true, false, true, true})}), {2, 3}, {0, 1, 1, 0, 0, 1});
  check_i(run1("NonZero", {F({3}, {0, -0.0f, 2})}), {1, 1}, {2});
  Tensor oh = run1("OneHot", {I64({3}, {0, 2, -1}), Tensor::scalar<int64_t>(3), F({2}, {0, 1})});
  check_f(oh, {3, 3}, {1, 0, 0, 0, 0, 1, 0, 0, 1});
  Tensor oh0 = run1("OneHot", {I64({2}, {1, 5}), Tensor::scalar<float>(3), I32({2}, {-1, 7})}, A2::attrs({{"axis", A::i(0)}}));
  check_i(oh0, {3, 2}, {-1, -1, 7, -1, -1, -1});
}

TEST_CASE("NonMaxSuppression: suppress by IoU, center boxes, score threshold", "[ops][tensor]") {
  Tensor boxes = F({1, 6, 4}, {0, 0, 1, 1, 0, 0.1f, 1, 1.1f, 0, -0.1f, 1, 0.9f, 0, 10, 1, 11, 0, 10.1f, 1, 11.1f, 0, 100, 1, 101});
  Tensor scores = F({1, 1, 6}, {0.9f, 0.75f, 0.6f, 0.95f, 0.5f, 0.3f});
  Tensor sel = run1("NonMaxSuppression", {boxes, scores, I64({1}, {3}), F({1}, {0.5f}), F({1}, {0.0f})});
  check_i(sel, {3, 3}, {0, 0, 3, 0, 0, 0, 0, 0, 5});
  // Score threshold 0.4 drops box 5; limit 2 per class.
  Tensor sel2 = run1("NonMaxSuppression", {boxes, scores, I64({1}, {2}), F({1}, {0.5f}), F({1}, {0.4f})});
  check_i(sel2, {2, 3}, {0, 0, 3, 0, 0, 0});
  // Same boxes as centers [xc, yc, w, h].
  Tensor cboxes = F({1, 6, 4}, {0.5f, 0.5f, 1, 1, 0.5f, 0.6f, 1, 1, 0.5f, 0.4f, 1, 1, 0.5f, 10.5f, 1, 1, 0.5f, 10.6f, 1, 1, 0.5f, 100.5f, 1, 1});
  Tensor sel3 = run1("NonMaxSuppression", {cboxes, scores, I64({1}, {3}), F({1}, {0.5f})}, A2::attrs({{"center_point_box", A::i(1)}}));
  check_i(sel3, {3, 3}, {0, 0, 3, 0, 0, 0, 0, 0, 5});
  // No max_output_boxes_per_class: nothing selected.
  CHECK(run1("NonMaxSuppression", {boxes, scores}).shape() == Shape{0, 3});
}

// ------------------------------------------------------------------------- Resize / Upsample

TEST_CASE("Resize nearest: opset 10 vs 13, scales vs sizes", "[ops][tensor]") {
  Tensor x = F({1, 1, 2, 2}, {1, 2, 3, 4});
  const std::vector<float> up = {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4};
  check_f(run1("Resize", {x, F({4}, {1, 1, 2, 2})}, {}, 10), {1, 1, 4, 4}, up);
  check_f(run1("Resize", {x, absent(), F({4}, {1, 1, 2, 2})}, {}, 13), {1, 1, 4, 4}, up);
  check_f(run1("Resize", {x, absent(), absent(), I64({4}, {1, 1, 4, 4})}, {}, 13), {1, 1, 4, 4}, up);
  check_f(run1("Upsample", {x}, A2::attrs({{"scales", A::fs({1, 1, 2, 2})}}), 7), {1, 1, 4, 4}, up);
  check_f(run1("Upsample", {x, F({4}, {1, 1, 2, 2})}, {}, 9), {1, 1, 4, 4}, up);
  // Downsample 2x4 by 0.6 -> 1x2 (spec example): picks columns 0 and 2.
  Tensor y = F({1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  check_f(run1("Resize", {y, F({4}, {1, 1, 0.6f, 0.6f})}, {}, 10), {1, 1, 1, 2}, {1, 3});
  check_f(run1("Resize", {y, absent(), F({4}, {1, 1, 0.6f, 0.6f})}, {}, 13), {1, 1, 1, 2}, {1, 3});
  // 1x2 -> 1x4 under asymmetric: source x = o / 2 = 0, 0.5, 1, 1.5 (ties at .5).
  Tensor z = F({1, 2}, {10, 20});
  Attributes asym = A2::attrs({{"coordinate_transformation_mode", A::s("asymmetric")}, {"nearest_mode", A::s("round_prefer_ceil")}});
  check_f(run1("Resize", {z, absent(), F({2}, {1, 2})}, asym, 13), {1, 4}, {10, 20, 20, 20});
  asym.set("nearest_mode", A::s("round_prefer_floor"));
  check_f(run1("Resize", {z, absent(), F({2}, {1, 2})}, asym, 13), {1, 4}, {10, 10, 20, 20});
  asym.set("nearest_mode", A::s("ceil"));
  check_f(run1("Resize", {z, absent(), F({2}, {1, 2})}, asym, 13), {1, 4}, {10, 20, 20, 20});
  // Integer data moves as bytes.
  Tensor xi = I32({1, 2}, {5, 6});
  check_i(run1("Resize", {xi, absent(), F({2}, {1, 2})}, {}, 13), {1, 4}, {5, 5, 6, 6});
}

TEST_CASE("Resize linear: half_pixel, align_corners, asymmetric, downsample, axes", "[ops][tensor]") {
  Tensor x = F({1, 1, 2, 2}, {1, 2, 3, 4});
  Attributes lin = A2::attrs({{"mode", A::s("linear")}});
  // half_pixel: source coords -0.25 (clamped to 0), 0.25, 0.75, 1.25 (clamped to 1).
  check_f(run1("Resize", {x, absent(), F({4}, {1, 1, 2, 2})}, lin, 13), {1, 1, 4, 4},
          {1, 1.25f, 1.75f, 2, 1.5f, 1.75f, 2.25f, 2.5f, 2.5f, 2.75f, 3.25f, 3.5f, 3, 3.25f, 3.75f, 4});
  Attributes ac = lin;
  ac.set("coordinate_transformation_mode", A::s("align_corners"));
  Tensor r = run1("Resize", {F({1, 2}, {1, 2}), absent(), F({2}, {1, 2})}, ac, 13);
  check_f(r, {1, 4}, {1, 1 + 1.0f / 3, 1 + 2.0f / 3, 2});
  // Opset 10 linear = asymmetric: x / 2 -> 0, 0.5, 1 (clamped), 1.5 (clamped).
  check_f(run1("Resize", {F({1, 2}, {1, 2}), F({2}, {1, 2})}, lin, 10), {1, 4}, {1, 1.5f, 2, 2});
  // Downsample 2x2 -> 1x1 with sizes: source coord 0.5 on both axes -> the mean.
  check_f(run1("Resize", {x, absent(), absent(), I64({4}, {1, 1, 1, 1})}, lin, 13), {1, 1, 1, 1}, {2.5f});
  // Opset 18 axes: only the last axis is resized.
  Attributes ax = lin;
  ax.set("axes", A::is({-1}));
  check_f(run1("Resize", {F({2, 2}, {1, 2, 3, 4}), absent(), F({1}, {2})}, ax, 18), {2, 4}, {1, 1.25f, 1.75f, 2, 3, 3.25f, 3.75f, 4});
  // tf_crop_and_resize: roi [0.5, 1] of a 1x3 row -> coords 1 and 2 -> values 20, 30; with roi
  // going outside the input the extrapolation value appears.
  Attributes crop = lin;
  crop.set("coordinate_transformation_mode", A::s("tf_crop_and_resize"));
  crop.set("extrapolation_value", A::f(-1));
  check_f(run1("Resize", {F({1, 3}, {10, 20, 30}), F({4}, {0, 0.5f, 1, 1}), absent(), I64({2}, {1, 2})}, crop, 13), {1, 2}, {20, 30});
  check_f(run1("Resize", {F({1, 3}, {10, 20, 30}), F({4}, {0, 0.5f, 1, 2}), absent(), I64({2}, {1, 2})}, crop, 13), {1, 2}, {20, -1});
}

TEST_CASE("Resize linear antialias widens the filter when downsampling", "[ops][tensor]") {
  // 1x4 -> 1x2, half_pixel: x = 0.5 and 2.5. The tent widens to 1/scale = 2 inputs each side:
  // weights at offsets -1.5, -0.5, 0.5, 1.5 (times scale 0.5) are 0.25, 0.75, 0.75, 0.25, summing
  // to 2; edge-clamped indices.
  Attributes aa = A2::attrs({{"mode", A::s("linear")}, {"antialias", A::i(1)}});
  check_f(run1("Resize", {F({1, 4}, {1, 2, 3, 4}), absent(), F({2}, {1, 0.5f})}, aa, 18), {1, 2},
          {(0.25f * 1 + 0.75f * 1 + 0.75f * 2 + 0.25f * 3) / 2, (0.25f * 2 + 0.75f * 3 + 0.75f * 4 + 0.25f * 4) / 2});
}

TEST_CASE("Resize cubic matches the Keys kernel at A=-0.75", "[ops][tensor]") {
  // Upsampling 1x4 by 2 with asymmetric coords: output 1 sits at 0.5, taps -1(clamped to 0),0,1,2
  // with weights c(1.5), c(0.5), c(0.5), c(1.5) where c(0.5) = 0.59375, c(1.5) = -0.09375.
  Attributes cub = A2::attrs({{"mode", A::s("cubic")}, {"coordinate_transformation_mode", A::s("asymmetric")}});
  Tensor r = run1("Resize", {F({1, 4}, {1, 2, 4, 8}), absent(), F({2}, {1, 2})}, cub, 13);
  REQUIRE(r.shape() == Shape{1, 8});
  auto v = r.to_float_vector();
  CHECK(v[0] == Approx(1.0f));
  CHECK(v[1] == Approx(-0.09375f * 1 + 0.59375f * 1 + 0.59375f * 2 - 0.09375f * 4));
  CHECK(v[2] == Approx(2.0f));
}

// ------------------------------------------------------------------------- shape inference

TEST_CASE("Symbolic batch survives Shape -> Gather -> Unsqueeze -> Concat -> Reshape", "[ops][tensor]") {
  GraphBuilder b("chain", 13);
  auto x = b.input("x", DType::Float32, {Dim::sym("N"), 3, 4});
  auto shape = b.op("Shape", {x});
  auto batch = b.op("Gather", {shape, b.constant("zero", Tensor::scalar<int64_t>(0))}, A2::attrs({{"axis", A::i(0)}}));
  auto batch1 = b.op("Unsqueeze", {batch, b.ints("axes", {0})});
  auto target = b.op("Concat", {batch1, b.ints("minus_one", {-1})}, A2::attrs({{"axis", A::i(0)}}));
  auto y = b.op("Reshape", {x, target});
  // Same with an explicit 12 and with Slice of the shape.
  auto target12 = b.op("Concat", {batch1, b.ints("twelve", {12})}, A2::attrs({{"axis", A::i(0)}}));
  auto y12 = b.op("Reshape", {x, target12});
  auto head = b.op("Slice", {shape, b.ints("s0", {0}), b.ints("s1", {1})});
  auto target_s = b.op("Concat", {head, b.ints("m1", {-1})}, A2::attrs({{"axis", A::i(0)}}));
  auto ys = b.op("Reshape", {x, target_s});
  // Expand and ConstantOfShape from symbolic shape data.
  auto filled = b.op("ConstantOfShape", {shape});
  auto expanded = b.op("Expand", {b.constant("one", Tensor::from_vector<float>({1}, {1.f})), shape});
  // Reshape with 0 (copy the symbolic dim).
  auto y0 = b.op("Reshape", {x, b.ints("zero_m1", {0, -1})});
  // Range(0, N, 1) has length N; Resize to sizes Concat(Shape[:1], [3, 8]) keeps N.
  auto range = b.op("Range", {b.constant("r0", Tensor::scalar<int64_t>(0)), batch, b.constant("r1", Tensor::scalar<int64_t>(1))});
  auto sizes = b.op("Concat", {head, b.ints("hw", {3, 8})}, A2::attrs({{"axis", A::i(0)}}));
  auto resized = b.op("Resize", {x, "", "", sizes});
  for (auto& o : {y, y12, ys, filled, expanded, y0, range, resized}) b.output(o);
  Model m = b.finish();
  const Graph& g = m.graph;
  for (auto& o : {y, y12, ys, y0}) {
    INFO(o << " is " << g.type(o).str());
    const TensorType& t = g.type(o);
    REQUIRE(t.rank() == 2);
    CHECK(t.dims[0].symbol == "N");
    CHECK(!t.dims[0].known());
    CHECK(t.dims[1].value == 12);
  }
  CHECK(g.type(filled).str() == TensorType(DType::Float32, {Dim::sym("N"), 3, 4}).str());
  CHECK(g.type(expanded).str() == TensorType(DType::Float32, {Dim::sym("N"), 3, 4}).str());
  CHECK(g.type(shape).str() == "int64[3]");
  CHECK(g.type(range).str() == "int64[N]");
  CHECK(g.type(resized).str() == "float32[N,3,8]");
}

TEST_CASE("Slice to a symbolic end keeps the symbol (dynamic-axes position tables)", "[ops][tensor]") {
  // position_ids[:, :S] with S = Shape(ids)[1], as PyTorch exports BERT/GPT-2 with dynamic axes.
  GraphBuilder b("pos", 13);
  auto ids = b.input("ids", DType::Int64, {Dim::sym("B"), Dim::sym("S")});
  auto table = b.constant("table", I64({1, 16}, std::vector<int64_t>(16, 0)));
  auto seq = b.op("Gather", {b.op("Shape", {ids}), b.constant("one", Tensor::scalar<int64_t>(1))});
  auto end = b.op("Unsqueeze", {seq, b.ints("ax0", {0})});
  auto pos = b.op("Slice", {table, b.ints("s0", {0}), end, b.ints("ax1", {1})});
  // Not from 0, or a step other than 1: the length is not the symbol.
  auto from1 = b.op("Slice", {table, b.ints("s1", {1}), end, b.ints("ax1b", {1})});
  auto step2 = b.op("Slice", {table, b.ints("s0b", {0}), end, b.ints("ax1c", {1}), b.ints("st2", {2})});
  // Known end against a known dim still clamps.
  auto known = b.op("Slice", {table, b.ints("s0c", {0}), b.ints("e99", {99}), b.ints("ax1d", {1})});
  for (auto& o : {pos, from1, step2, known}) b.output(o);
  Model m = b.finish();
  const Graph& g = m.graph;
  CHECK(g.type(pos).str() == "int64[1,S]");
  CHECK(g.type(from1).str() == "int64[1,?]");
  CHECK(g.type(step2).str() == "int64[1,?]");
  CHECK(g.type(known).str() == "int64[1,16]");
  // Once S is bound the exact (clamped) length comes back.
  Graph bound = g;
  bind_input_shapes(bound, {{"ids", Shape{2, 5}}});
  CHECK(bound.type(pos).str() == "int64[1,5]");
}

TEST_CASE("Inference of ranks and dims when data is unknown", "[ops][tensor]") {
  GraphBuilder b("ranks", 13);
  auto x = b.input("x", DType::Float32, {Dim::sym("N"), 3, 8, 8});
  auto dyn = b.input("target", DType::Int64, {3});
  auto r = b.op("Reshape", {x, dyn});
  auto t = b.op("Transpose", {x}, A2::attrs({{"perm", A::is({0, 2, 3, 1})}}));
  auto sl = b.op("Slice", {x, b.ints("st", {1}), b.ints("en", {3}), b.ints("ax", {1})});
  auto pad = b.op("Pad", {x, b.ints("pads", {0, 0, 1, 1, 0, 0, 1, 1})});
  auto rs = b.op("Resize", {x, "", b.constant("sc", F({4}, {1, 1, 2, 2}))});
  auto tile = b.op("Tile", {x, b.ints("reps", {1, 2, 1, 1})});
  auto fl = b.op("Flatten", {x});
  auto sq = b.op("Unsqueeze", {x, b.ints("ua", {-1})});
  auto parts = b.op_n("Split", {x, b.ints("sp", {1, 2})}, 2, A2::attrs({{"axis", A::i(1)}}));
  auto topk = b.op_n("TopK", {x, b.ints("k", {5})}, 2);
  auto nz = b.op("NonZero", {x});
  auto gnd = b.op("GatherND", {x, b.constant("idx", I64({2, 2}, {0, 0, 0, 1}))});
  // A known entry of a partly symbolic shape is a scalar value (not a [1] tensor) downstream.
  auto channels = b.op("Gather", {b.op("Shape", {x}), b.constant("one", Tensor::scalar<int64_t>(1))});
  auto channels1 = b.op("Unsqueeze", {channels, b.ints("ax0", {0})});
  for (auto& o : {r, t, sl, pad, rs, tile, fl, sq, parts[0], parts[1], topk[0], topk[1], nz, gnd, channels, channels1}) b.output(o);
  Model m = b.finish();
  const Graph& g = m.graph;
  CHECK(g.type(r).str() == "float32[?,?,?]");
  CHECK(g.type(t).str() == "float32[N,8,8,3]");
  CHECK(g.type(sl).str() == "float32[N,2,8,8]");
  CHECK(g.type(pad).str() == "float32[N,3,10,10]");
  CHECK(g.type(rs).str() == "float32[N,3,16,16]");
  CHECK(g.type(tile).str() == "float32[N,6,8,8]");
  CHECK(g.type(fl).str() == "float32[N,192]");
  CHECK(g.type(sq).str() == "float32[N,3,8,8,1]");
  CHECK(g.type(parts[1]).str() == "float32[N,2,8,8]");
  CHECK(g.type(topk[0]).str() == "float32[N,3,8,5]");
  CHECK(g.type(topk[1]).str() == "int64[N,3,8,5]");
  CHECK(g.type(nz).str() == "int64[4,?]");
  CHECK(g.type(gnd).str() == "float32[2,8,8]");
  CHECK(g.type(channels).str() == "int64[]");
  CHECK(g.type(channels1).str() == "int64[1]");
}

TEST_CASE("Mapping types of tensor ops", "[ops][tensor]") {
  GraphBuilder b("maps", 13);
  auto x = b.input("x", DType::Float32, {1, 3, 4, 4});
  auto g1 = b.op("Gather", {x, b.constant("i0", Tensor::scalar<int64_t>(0))}, A2::attrs({{"axis", A::i(1)}}));
  auto g2 = b.op("Gather", {x, b.ints("i2", {0, 0, 1})}, A2::attrs({{"axis", A::i(1)}}));
  auto same = b.op("Resize", {x, "", b.constant("s1", F({4}, {1, 1, 1, 1}))});
  auto up = b.op("Resize", {x, "", b.constant("s2", F({4}, {1, 1, 2, 2}))});
  auto down = b.op("Resize", {x, "", b.constant("s3", F({4}, {1, 1, 0.5f, 0.5f}))}, A2::attrs({{"mode", A::s("linear")}}));
  auto tr = b.op("Transpose", {x});
  for (auto& o : {g1, g2, same, up, down, tr}) b.output(o);
  Model m = b.finish();
  const Graph& g = m.graph;
  auto mt = [&](const std::string& out) { return node_mapping_type(g, *g.producer(out)); };
  CHECK(mt(g1) == MappingType::Reorganize);
  CHECK(mt(g2) == MappingType::OneToMany);
  CHECK(mt(same) == MappingType::OneToOne);
  CHECK(mt(up) == MappingType::OneToMany);
  CHECK(mt(down) == MappingType::ManyToMany);
  CHECK(mt(tr) == MappingType::Shuffle);
  CHECK(node_flops(g, *g.producer(tr)) == 0);
}

TEST_CASE("Unique keeps int64 values past 2^53 apart and counts them", "[ops][tensor]") {
  const int64_t big = int64_t(1) << 60;
  auto r = run("Unique", {I64({4}, {big + 1, big, big + 1, -5})}, {}, 11, 4);
  REQUIRE(r.size() == 4);
  auto vals = [](const Tensor& t) { return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel()); };
  CHECK(vals(r[0]) == std::vector<int64_t>{-5, big, big + 1});
  CHECK(vals(r[1]) == std::vector<int64_t>{3, 1, 0});     // first occurrences
  CHECK(vals(r[2]) == std::vector<int64_t>{2, 1, 2, 0});  // inverse indices
  CHECK(vals(r[3]) == std::vector<int64_t>{1, 1, 2});     // counts
  Attributes unsorted;
  unsorted.set("sorted", Attribute::make_int(0));
  auto u = run("Unique", {I64({4}, {big + 1, big, big + 1, -5})}, unsorted, 11, 4);
  CHECK(vals(u[0]) == std::vector<int64_t>{big + 1, big, -5});  // in order of first occurrence
}

TEST_CASE("BitCast keeps the bits; CenterCropPad crops and pads around the centre", "[ops][tensor]") {
  Attributes to;
  to.set("to", Attribute::make_int(int64_t(DType::Int32)));
  Tensor b = run1("BitCast", {F({2}, {1.0f, -2.0f})}, to, 26);
  CHECK(b.dtype() == DType::Int32);
  CHECK(b.data<int32_t>()[0] == 0x3f800000);
  CHECK(uint32_t(b.data<int32_t>()[1]) == 0xc0000000u);
  to.set("to", Attribute::make_int(int64_t(DType::Int64)));
  CHECK_THROWS_WITH(run1("BitCast", {F({2}, {1.0f, -2.0f})}, to, 26), Catch::Contains("widths differ"));
  // 1x5 -> 1x2 (crop from floor(3/2) = 1) along axis 1; 1x5 -> 1x8 pads 1 before, 2 after.
  Attributes ax;
  ax.set("axes", Attribute::make_ints({1}));
  check_f(run1("CenterCropPad", {F({1, 5}, {0, 1, 2, 3, 4}), I64({1}, {2})}, ax, 18), {1, 2}, {1, 2});
  check_f(run1("CenterCropPad", {F({1, 5}, {0, 1, 2, 3, 4}), I64({1}, {8})}, ax, 18), {1, 8}, {0, 0, 1, 2, 3, 4, 0, 0});
}

namespace {
// One node of the ai.onnx.ml domain (opset 1 there).
Tensor run_ml(const std::string& op, const std::vector<Tensor>& ins, Attributes attrs = {}) {
  Node n;
  n.id = 0;
  n.name = "test_" + op;
  n.op_type = op;
  n.domain = "ai.onnx.ml";
  n.attrs = std::move(attrs);
  std::vector<const Tensor*> ptrs;
  for (size_t i = 0; i < ins.size(); ++i) n.inputs.push_back("in" + std::to_string(i)), ptrs.push_back(&ins[i]);
  n.outputs.push_back("out0");
  return run_node(n, 1, ptrs).at(0);
}
}  // namespace

TEST_CASE("Binarizer and ArrayFeatureExtractor (ai.onnx.ml)", "[ops][tensor]") {
  check_f(run_ml("Binarizer", {F({2, 3}, {-1, 0.5f, 2, 0.7f, 0.4f, 9})}, A2::attrs({{"threshold", A::f(0.5f)}})), {2, 3}, {0, 0, 1, 1, 0, 1});
  const Tensor yi = run_ml("Binarizer", {I64({3}, {-2, 0, 3})});
  CHECK(yi.dtype() == DType::Int64);
  check_i(yi, {3}, {0, 0, 1});
  const Tensor x = iota_f({2, 2, 4});
  check_f(run_ml("ArrayFeatureExtractor", {x, I64({3}, {3, 0, 3})}), {2, 2, 3}, {3, 0, 3, 7, 4, 7, 11, 8, 11, 15, 12, 15});
  // A 1-D X is one row; indices of any shape are read flat.
  check_f(run_ml("ArrayFeatureExtractor", {iota_f({5}), I64({1, 2}, {4, 1})}), {1, 2}, {4, 1});
  REQUIRE_THROWS_WITH(run_ml("ArrayFeatureExtractor", {x, I64({1}, {4})}),
                      Catch::Contains("test_ArrayFeatureExtractor") && Catch::Contains("Y[0] = 4 is outside the last axis of X, of size 4"));
}

TEST_CASE("TfIdfVectorizer counts pool n-grams with skips in TF, IDF and TFIDF modes", "[ops][tensor]") {
  // Pool: unigrams 2, 3 (slots 0, 1) and bigrams (2, 3), (3, 5) (slots 2, 3).
  auto attrs = [](const char* mode, int64_t min_g, int64_t max_g, int64_t skip, std::vector<float> w = {}) {
    Attributes a = A2::attrs({{"mode", A::s(mode)},
                              {"min_gram_length", A::i(min_g)},
                              {"max_gram_length", A::i(max_g)},
                              {"max_skip_count", A::i(skip)},
                              {"ngram_counts", A::is({0, 2})},
                              {"ngram_indexes", A::is({0, 1, 2, 3})},
                              {"pool_int64s", A::is({2, 3, 2, 3, 3, 5})}});
    if (!w.empty()) a.set("weights", A::fs(std::move(w)));
    return a;
  };
  const Tensor x = I64({2, 5}, {2, 3, 5, 2, 3, /**/ 2, 7, 3, 9, 5});
  // Row 0: unigrams 2 x2, 3 x2; bigrams (2,3) x2, (3,5) x1 adjacent. Row 1: 2, 3 once; no adjacent bigram.
  check_f(run1("TfIdfVectorizer", {x}, attrs("TF", 1, 2, 0), 9), {2, 4}, {2, 2, 2, 1, 1, 1, 0, 0});
  // Skips up to 1: row 1 gains (2,3) and (3,5), one item apart; row 0's skipped pairs (2,5),
  // (3,2), (5,3) are not in the pool; unigrams are counted once whatever the skip. (Every
  // expectation here is what onnx.reference gives.)
  check_f(run1("TfIdfVectorizer", {x}, attrs("TF", 1, 2, 1), 9), {2, 4}, {2, 2, 2, 1, 1, 1, 1, 1});
  check_f(run1("TfIdfVectorizer", {x}, attrs("TF", 2, 2, 1), 9), {2, 4}, {0, 0, 2, 1, 0, 0, 1, 1});
  check_f(run1("TfIdfVectorizer", {x}, attrs("IDF", 1, 2, 0, {0.5f, 2, 3, 4}), 9), {2, 4}, {0.5f, 2, 3, 4, 0.5f, 2, 0, 0});
  check_f(run1("TfIdfVectorizer", {x}, attrs("IDF", 1, 2, 0), 9), {2, 4}, {1, 1, 1, 1, 1, 1, 0, 0});
  check_f(run1("TfIdfVectorizer", {x}, attrs("TFIDF", 1, 2, 0, {0.5f, 2, 3, 4}), 9), {2, 4}, {1, 4, 6, 4, 0.5f, 2, 0, 0});
  // A 1-D input gives a 1-D output.
  check_f(run1("TfIdfVectorizer", {I32({4}, {3, 5, 3, 5})}, attrs("TF", 2, 2, 0), 9), {4}, {0, 0, 0, 2});
  REQUIRE_THROWS_WITH(run1("TfIdfVectorizer", {x}, attrs("BM25", 1, 2, 0), 9), Catch::Contains("mode 'BM25'"));
  Attributes bad = attrs("TF", 1, 2, 0);
  bad.set("ngram_counts", A::is({0, 3}));  // 3 unigrams, then 3 items: not whole bigrams
  REQUIRE_THROWS_WITH(run1("TfIdfVectorizer", {x}, bad, 9), Catch::Contains("does not start whole 2-grams"));
}

TEST_CASE("MelWeightMatrix: triangles between mel-spaced bins", "[ops][tensor]") {
  auto s64 = [](int64_t v) { return I64({}, {v}); };
  auto sf = [](float v) { return F({}, {v}); };
  // The ONNX reference's matrix for these inputs (onnx.reference): points 0 0 1 2 3 5 (bins of
  // mel-spaced frequencies, the mel range cut in num_mel_bins + 2 steps), one triangle per band.
  check_f(run1("MelWeightMatrix", {s64(4), s64(16), s64(8000), sf(0), sf(4000)}, {}, 17), {9, 4},
          {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0.5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  const Tensor d = run1("MelWeightMatrix", {s64(2), s64(8), s64(100), sf(0), sf(50)}, A2::attrs({{"output_datatype", A::i(11)}}), 17);
  CHECK(d.dtype() == DType::Float64);
  CHECK(d.shape() == Shape{5, 2});
  REQUIRE_THROWS_WITH(run1("MelWeightMatrix", {s64(4), s64(16), s64(8000), sf(0), sf(9000)}, {}, 17),
                      Catch::Contains("above the Nyquist frequency"));
  REQUIRE_THROWS_WITH(run1("MelWeightMatrix", {s64(4), s64(0), s64(8000), sf(0), sf(4000)}, {}, 17), Catch::Contains("dft_length"));
}

TEST_CASE("GridSample: far, NaN and one-point coordinates, and an empty input, stay defined", "[ops][tensor][malformed]") {
  // fuzz_model found GridSample converting inf to an integer (reflection over an input of width 0);
  // far coordinates overflowed the same conversions.
  auto attrs = [](const char* pad, int align = 0) {
    Attributes a;
    a.set("padding_mode", Attribute::make_string(pad));
    a.set("align_corners", Attribute::make_int(align));
    return a;
  };
  const Tensor X = F({1, 1, 2, 3}, {1, 2, 3, 4, 5, 6});
  // Grid points (x, y): 1e30 and -1e30 far outside, inf, and one inside at the centre of pixel (1, 0).
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor G = F({1, 1, 4, 2}, {1e30f, 0.f, -1e30f, 1e30f, inf, -inf, 0.f, -0.5f});
  check_f(run1("GridSample", {X, G}, attrs("zeros"), 20), {1, 1, 1, 4}, {0, 0, 0, 2});
  check_f(run1("GridSample", {X, G}, attrs("border"), 20), {1, 1, 1, 4}, {4.5f, 4, 3, 2});
  const Tensor yr = run1("GridSample", {X, G}, attrs("reflection"), 20);
  REQUIRE(yr.shape() == Shape{1, 1, 1, 4});
  for (int i = 0; i < 2; ++i) CHECK(std::isfinite(yr.data<float>()[i]));  // reflected somewhere inside: finite
  CHECK(std::isnan(yr.data<float>()[2]));                                   // infinity has no reflection
  CHECK(yr.data<float>()[3] == Approx(2));
  // A NaN coordinate gives NaN; a one-pixel input with align_corners reflects everything onto it.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(run1("GridSample", {X, F({1, 1, 1, 2}, {nan, 0.f})}, attrs("zeros"), 20).data<float>()[0]));
  check_f(run1("GridSample", {F({1, 1, 1, 1}, {7}), F({1, 1, 2, 2}, {3.f, -5.f, 0.25f, 1e20f})}, attrs("reflection", 1), 20), {1, 1, 1, 2}, {7, 7});
  // No pixels: zero padding samples zeros, the others have nothing to read.
  const Tensor empty(DType::Float32, {1, 1, 7, 0});
  check_f(run1("GridSample", {empty, G}, attrs("zeros"), 20), {1, 1, 1, 4}, {0, 0, 0, 0});
  CHECK_THROWS_WITH(run1("GridSample", {empty, G}, attrs("reflection"), 20), Catch::Contains("has no pixels"));
}
