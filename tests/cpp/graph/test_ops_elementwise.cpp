// The elementwise op family: hand-computed values for every op, broadcasting, dtypes, opset
// differences (Clip, Dropout, Pow), symbolic inference and dim values, mapping types and errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "graph/builder.h"
#include "graph/interpreter.h"
#include "graph/op_registry.h"

using namespace nnfuse;

namespace {

// Runs one node of `op` on `inputs` (nullptr = absent optional input) with the reference kernel.
std::vector<Tensor> run_op(const std::string& op, const std::vector<const Tensor*>& inputs, Attributes attrs = {},
                           int64_t opset = 17, int outputs = 1) {
  Node n;
  n.id = 0;
  n.name = op + "_under_test";
  n.op_type = op;
  for (size_t i = 0; i < inputs.size(); ++i) n.inputs.push_back(inputs[i] ? "in" + std::to_string(i) : "");
  for (int i = 0; i < outputs; ++i) n.outputs.push_back("out" + std::to_string(i));
  n.attrs = std::move(attrs);
  return run_node(n, opset, inputs);
}
Tensor run1(const std::string& op, const std::vector<const Tensor*>& inputs, Attributes attrs = {}, int64_t opset = 17) {
  auto r = run_op(op, inputs, std::move(attrs), opset);
  REQUIRE(r.size() >= 1);
  return r[0];
}

Tensor f32(Shape s, std::vector<float> v) { return Tensor::from_vector<float>(std::move(s), v); }
Tensor f32v(std::vector<float> v) { return Tensor::from_vector<float>({int64_t(v.size())}, v); }
Tensor i64v(std::vector<int64_t> v) { return Tensor::from_vector<int64_t>({int64_t(v.size())}, v); }
Tensor i32v(std::vector<int32_t> v) { return Tensor::from_vector<int32_t>({int64_t(v.size())}, v); }
Tensor bv(std::vector<bool> v) { return Tensor::from_vector<bool>({int64_t(v.size())}, v); }

void check_floats(const Tensor& t, const std::vector<float>& want, double tol = 1e-6) {
  auto got = t.to_float_vector();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    if (std::isnan(want[i])) CHECK(std::isnan(got[i]));
    else if (std::isinf(want[i])) CHECK(got[i] == want[i]);
    else CHECK(std::abs(double(got[i]) - double(want[i])) <= tol * std::max(1.0, std::abs(double(want[i]))));
  }
}
template <class T>
void check_exact(const Tensor& t, const std::vector<T>& want) {
  REQUIRE(t.dtype() == DTypeOf<T>::value);
  REQUIRE(t.numel() == int64_t(want.size()));
  const T* p = t.data<T>();
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    CHECK(p[i] == want[i]);
  }
}

// Runs f and returns the nnfuse::Error it throws (fails the test if none).
template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected an nnfuse::Error");
  return Error(ErrorKind::Invalid, "unreachable");
}

Attributes attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) { return GraphBuilder::attrs(kv); }

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

// ---------------------------------------------------------------------------------------------
// Unary math
// ---------------------------------------------------------------------------------------------

TEST_CASE("unary math ops on hand-computed values", "[ops][elementwise]") {
  Tensor x = f32v({-2.5f, -0.5f, 0.0f, 0.5f, 1.5f, 2.5f});
  check_floats(run1("Abs", {&x}), {2.5f, 0.5f, 0, 0.5f, 1.5f, 2.5f});
  check_floats(run1("Neg", {&x}), {2.5f, 0.5f, 0, -0.5f, -1.5f, -2.5f});
  check_floats(run1("Floor", {&x}), {-3, -1, 0, 0, 1, 2});
  check_floats(run1("Ceil", {&x}), {-2, -0.0f, 0, 1, 2, 3});
  // Half to even: -2.5 -> -2, -0.5 -> -0, 0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
  check_floats(run1("Round", {&x}), {-2, 0, 0, 0, 2, 2});
  check_floats(run1("Sign", {&x}), {-1, -1, 0, 1, 1, 1});

  Tensor p = f32v({0.25f, 1.0f, 4.0f});
  check_floats(run1("Sqrt", {&p}), {0.5f, 1, 2});
  check_floats(run1("Reciprocal", {&p}), {4, 1, 0.25f});
  check_floats(run1("Log", {&p}), {-1.3862943611f, 0, 1.3862943611f});
  Tensor e = f32v({0, 1, -1});
  check_floats(run1("Exp", {&e}), {1, 2.718281828f, 0.3678794412f});

  Tensor t = f32v({0, 0.5f, -1});
  check_floats(run1("Sin", {&t}), {0, 0.4794255386f, -0.8414709848f});
  check_floats(run1("Cos", {&t}), {1, 0.8775825619f, 0.5403023059f});
  check_floats(run1("Tan", {&t}), {0, 0.5463024898f, -1.5574077247f});
  check_floats(run1("Asin", {&t}), {0, 0.5235987756f, -1.5707963268f});
  check_floats(run1("Acos", {&t}), {1.5707963268f, 1.0471975512f, 3.1415926536f});
  check_floats(run1("Atan", {&t}), {0, 0.463647609f, -0.7853981634f});
  check_floats(run1("Sinh", {&t}), {0, 0.5210953055f, -1.1752011936f});
  check_floats(run1("Cosh", {&t}), {1, 1.1276259652f, 1.5430806348f});
  check_floats(run1("Asinh", {&t}), {0, 0.4812118251f, -0.881373587f});
  check_floats(run1("Atanh", {&t}), {0, 0.5493061443f, -kInf});
  check_floats(run1("Erf", {&t}), {0, 0.5204998778f, -0.8427007929f});
  Tensor ge1 = f32v({1, 2, 10});
  check_floats(run1("Acosh", {&ge1}), {0, 1.3169578969f, 2.9932228461f});
}

TEST_CASE("IsNaN, IsInf with its attributes, Not and BitwiseNot", "[ops][elementwise]") {
  Tensor x = f32v({1.0f, kNaN, kInf, -kInf});
  check_exact<bool>(run1("IsNaN", {&x}), {false, true, false, false});
  check_exact<bool>(run1("IsInf", {&x}), {false, false, true, true});
  check_exact<bool>(run1("IsInf", {&x}, attrs({{"detect_negative", A::i(0)}})), {false, false, true, false});
  check_exact<bool>(run1("IsInf", {&x}, attrs({{"detect_positive", A::i(0)}})), {false, false, false, true});

  Tensor b = bv({true, false});
  check_exact<bool>(run1("Not", {&b}), {false, true});

  Tensor i8 = Tensor::from_vector<int8_t>({3}, {5, 0, -128});
  check_exact<int8_t>(run1("BitwiseNot", {&i8}, {}, 18), {-6, -1, 127});
  Tensor u8 = Tensor::from_vector<uint8_t>({2}, {0, 0x0f});
  check_exact<uint8_t>(run1("BitwiseNot", {&u8}, {}, 18), {255, 0xf0});
}

TEST_CASE("integer unary ops: Abs, Neg, Sign, Relu on signed ints", "[ops][elementwise]") {
  Tensor x = i32v({-7, 0, 3});
  check_exact<int32_t>(run1("Abs", {&x}), {7, 0, 3});
  check_exact<int32_t>(run1("Neg", {&x}), {7, 0, -3});
  check_exact<int32_t>(run1("Sign", {&x}), {-1, 0, 1});
  check_exact<int32_t>(run1("Relu", {&x}, {}, 14), {0, 0, 3});
  Tensor u = Tensor::from_vector<uint8_t>({2}, {0, 200});
  check_exact<uint8_t>(run1("Abs", {&u}), {0, 200});
  // Neg on unsigned is not an ONNX op signature: Unsupported, naming the dtype.
  Error err = error_of([&] { run1("Neg", {&u}); });
  CHECK(err.kind() == ErrorKind::Unsupported);
  CHECK_THAT(err.what(), Catch::Contains("uint8"));
  CHECK(err.context().node == "Neg_under_test");
}

TEST_CASE("float-only ops reject integer and bool inputs naming the dtype", "[ops][elementwise]") {
  Tensor x = i32v({1, 4});
  Error err = error_of([&] { run1("Sqrt", {&x}); });
  CHECK(err.kind() == ErrorKind::Unsupported);
  CHECK_THAT(err.what(), Catch::Contains("int32"));
  Tensor b = bv({true});
  CHECK(error_of([&] { run1("Add", {&b, &b}); }).kind() == ErrorKind::Unsupported);
  Tensor f = f32v({1});
  CHECK(error_of([&] { run1("Not", {&f}); }).kind() == ErrorKind::Unsupported);
}

TEST_CASE("float16 and bfloat16 are computed in float", "[ops][elementwise]") {
  Tensor h = f32v({-1.0f, 0.5f, 4.0f}).cast(DType::Float16);
  Tensor r = run1("Sqrt", {&h});
  CHECK(r.dtype() == DType::Float16);
  check_floats(r, {kNaN, 0.70703125f, 2.0f}, 1e-3);
  Tensor bf = f32v({1.0f, 2.0f}).cast(DType::BFloat16);
  Tensor s = run1("Add", {&bf, &bf});
  CHECK(s.dtype() == DType::BFloat16);
  check_floats(s, {2, 4});
  Tensor hs = run1("Sigmoid", {&h});
  check_floats(hs, {0.2689414214f, 0.6224593312f, 0.9820137900f}, 2e-3);
  Tensor d = Tensor::from_vector<double>({2}, {1.0, 2.0});
  Tensor dd = run1("Exp", {&d});
  CHECK(dd.dtype() == DType::Float64);
  CHECK(dd.data<double>()[1] == Approx(7.38905609893065).epsilon(1e-14));
}

// ---------------------------------------------------------------------------------------------
// Activations
// ---------------------------------------------------------------------------------------------

TEST_CASE("activations on hand-computed values", "[ops][elementwise]") {
  Tensor x = f32v({-2, -0.5f, 0, 0.5f, 2});
  check_floats(run1("Relu", {&x}), {0, 0, 0, 0.5f, 2});
  check_floats(run1("LeakyRelu", {&x}), {-0.02f, -0.005f, 0, 0.5f, 2});
  check_floats(run1("LeakyRelu", {&x}, attrs({{"alpha", A::f(0.5f)}})), {-1, -0.25f, 0, 0.5f, 2});
  // Elu: alpha * (e^x - 1) below zero.
  check_floats(run1("Elu", {&x}), {-0.8646647168f, -0.3934693403f, 0, 0.5f, 2});
  check_floats(run1("Elu", {&x}, attrs({{"alpha", A::f(2.0f)}})), {-1.7293294335f, -0.7869386806f, 0, 0.5f, 2});
  // Selu: gamma * (x or alpha * (e^x - 1)).
  check_floats(run1("Selu", {&x}, attrs({{"alpha", A::f(2.0f)}, {"gamma", A::f(3.0f)}})),
               {-5.1879883f, -2.3608160f, 0, 1.5f, 6});
  check_floats(run1("Selu", {&x}), {-1.5201665f, -0.6917582f, 0, 0.5253505f, 2.1014020f}, 1e-5);
  // Celu(alpha=2): max(0,x) + min(0, 2 * (e^(x/2) - 1)).
  check_floats(run1("Celu", {&x}, attrs({{"alpha", A::f(2.0f)}})), {-1.2642411177f, -0.4423984338f, 0, 0.5f, 2});
  check_floats(run1("Sigmoid", {&x}), {0.1192029220f, 0.3775406688f, 0.5f, 0.6224593312f, 0.8807970780f});
  // HardSigmoid(0.2x + 0.5) clamped to [0, 1].
  Tensor wide = f32v({-4, -1, 0, 1, 4});
  check_floats(run1("HardSigmoid", {&wide}), {0, 0.3f, 0.5f, 0.7f, 1});
  check_floats(run1("HardSigmoid", {&wide}, attrs({{"alpha", A::f(0.5f)}, {"beta", A::f(0.6f)}})), {0, 0.1f, 0.6f, 1, 1});
  // HardSwish: x * clamp(x/6 + 0.5, 0, 1).
  check_floats(run1("HardSwish", {&wide}, {}, 14), {-0.0f, -0.3333333333f, 0, 0.6666666667f, 4});
  check_floats(run1("Tanh", {&x}), {-0.9640275801f, -0.4621171573f, 0, 0.4621171573f, 0.9640275801f});
  check_floats(run1("Softplus", {&x}), {0.1269280110f, 0.4740769842f, 0.6931471806f, 0.9740769842f, 2.1269280110f});
  check_floats(run1("Softsign", {&x}), {-0.6666666667f, -0.3333333333f, 0, 0.3333333333f, 0.6666666667f});
  // Mish: x * tanh(softplus(x)).
  check_floats(run1("Mish", {&x}, {}, 18), {-0.2525014686f, -0.2207437700f, 0, 0.3752452100f, 1.9439589595f}, 1e-5);
  check_floats(run1("ThresholdedRelu", {&x}), {0, 0, 0, 0, 2});
  check_floats(run1("ThresholdedRelu", {&x}, attrs({{"alpha", A::f(0.25f)}})), {0, 0, 0, 0.5f, 2});
  // Shrink(lambd=0.5, bias=0.25): x+0.25 below -0.5, x-0.25 above 0.5, else 0.
  check_floats(run1("Shrink", {&x}, attrs({{"lambd", A::f(0.5f)}, {"bias", A::f(0.25f)}})), {-1.75f, 0, 0, 0, 1.75f});
  Tensor xi = i32v({-3, 0, 3});
  check_exact<int32_t>(run1("Shrink", {&xi}, attrs({{"lambd", A::f(1.0f)}, {"bias", A::f(1.0f)}})), {-2, 0, 2});
}

TEST_CASE("activations stay finite at the extremes", "[ops][elementwise]") {
  Tensor x = f32v({-1000, 1000});
  check_floats(run1("Sigmoid", {&x}), {0, 1});
  check_floats(run1("Softplus", {&x}), {0, 1000});
  check_floats(run1("Mish", {&x}, {}, 18), {-0.0f, 1000});
  check_floats(run1("Tanh", {&x}), {-1, 1});
}

TEST_CASE("Gelu exact and tanh forms", "[ops][elementwise]") {
  Tensor x = f32v({-3, -1, 0, 1, 3});
  // 0.5 x (1 + erf(x / sqrt 2))
  check_floats(run1("Gelu", {&x}, {}, 20), {-0.0040496941f, -0.1586552539f, 0, 0.8413447461f, 2.9959503059f}, 1e-5);
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  check_floats(run1("Gelu", {&x}, attrs({{"approximate", A::s("tanh")}}), 20),
               {-0.0036373920f, -0.1588080094f, 0, 0.8411919906f, 2.9963626080f}, 1e-5);
  CHECK(error_of([&] { run1("Gelu", {&x}, attrs({{"approximate", A::s("fast")}}), 20); }).kind() == ErrorKind::Model);
  GraphBuilder b("gelu", 20);
  auto in = b.input("x", DType::Float32, {5});
  b.output(b.op("Gelu", {in}, attrs({{"approximate", A::s("fast")}})));
  CHECK(error_of([&] { b.finish(); }).kind() == ErrorKind::Model);  // rejected at import, not at run
  // Gelu is an opset-20 op.
  CHECK(error_of([&] { run1("Gelu", {&x}, {}, 19); }).kind() == ErrorKind::Unsupported);
}

TEST_CASE("PRelu broadcasts its slope to X", "[ops][elementwise]") {
  Tensor x = f32({2, 2}, {-1, 2, -3, 4});
  Tensor slope = f32({2}, {0.5f, 0.25f});
  check_floats(run1("PRelu", {&x, &slope}), {-0.5f, 2, -1.5f, 4});
  Tensor slope_col = f32({2, 1}, {0.1f, 0.2f});
  check_floats(run1("PRelu", {&x, &slope_col}), {-0.1f, 2, -0.6f, 4});
  Tensor big = f32({3, 2, 2}, std::vector<float>(12, 1.0f));
  Error err = error_of([&] { run1("PRelu", {&x, &big}); });
  CHECK(err.kind() == ErrorKind::Shape);
}

// ---------------------------------------------------------------------------------------------
// Clip across opsets
// ---------------------------------------------------------------------------------------------

TEST_CASE("Clip across opsets", "[ops][elementwise]") {
  Tensor x = f32v({-2, -0.5f, 0.5f, 2});
  SECTION("opset 6 is outside the supported range") {
    CHECK(error_of([&] { run1("Clip", {&x}, attrs({{"min", A::f(-1)}}), 6); }).kind() == ErrorKind::Unsupported);
  }
  SECTION("opsets 7-10 take attributes") {
    check_floats(run1("Clip", {&x}, attrs({{"min", A::f(-1)}, {"max", A::f(1)}}), 7), {-1, -0.5f, 0.5f, 1});
    check_floats(run1("Clip", {&x}, attrs({{"max", A::f(0)}}), 10), {-2, -0.5f, 0, 0});
    check_floats(run1("Clip", {&x}, {}, 10), {-2, -0.5f, 0.5f, 2});
  }
  SECTION("opset 11+ takes optional scalar inputs") {
    Tensor lo = Tensor::scalar<float>(-1), hi = Tensor::scalar<float>(1);
    check_floats(run1("Clip", {&x, &lo, &hi}, {}, 11), {-1, -0.5f, 0.5f, 1});
    check_floats(run1("Clip", {&x, nullptr, &hi}, {}, 13), {-2, -0.5f, 0.5f, 1});  // absent min
    check_floats(run1("Clip", {&x, &lo}, {}, 13), {-1, -0.5f, 0.5f, 2});           // absent max
    check_floats(run1("Clip", {&x}, {}, 13), {-2, -0.5f, 0.5f, 2});                // no bounds
    // min > max: every element becomes max.
    check_floats(run1("Clip", {&x, &hi, &lo}, {}, 13), {-1, -1, -1, -1});
    Tensor lo_int = Tensor::scalar<int64_t>(0);
    CHECK(error_of([&] { run1("Clip", {&x, &lo_int}, {}, 13); }).kind() == ErrorKind::Runtime);
  }
  SECTION("integers from opset 12") {
    Tensor xi = i32v({-5, 0, 5});
    Tensor lo = Tensor::scalar<int32_t>(-2), hi = Tensor::scalar<int32_t>(3);
    check_exact<int32_t>(run1("Clip", {&xi, &lo, &hi}, {}, 12), {-2, 0, 3});
    check_exact<int32_t>(run1("Clip", {&xi, nullptr, &hi}, {}, 12), {-5, 0, 3});
    CHECK(error_of([&] { run1("Clip", {&xi, &lo, &hi}, {}, 11); }).kind() == ErrorKind::Unsupported);
  }
  SECTION("inference rejects the wrong form for the opset") {
    GraphBuilder b("clip", 11);
    auto in = b.input("x", DType::Float32, {4});
    b.output(b.op("Clip", {in}, attrs({{"min", A::f(0)}})));
    CHECK(error_of([&] { b.finish(); }).kind() == ErrorKind::Model);
  }
}

// ---------------------------------------------------------------------------------------------
// Binary and variadic
// ---------------------------------------------------------------------------------------------

TEST_CASE("binary arithmetic on equal shapes", "[ops][elementwise]") {
  Tensor a = f32v({1, -2, 3, 8}), b = f32v({4, 5, -6, 0.5f});
  check_floats(run1("Add", {&a, &b}), {5, 3, -3, 8.5f});
  check_floats(run1("Sub", {&a, &b}), {-3, -7, 9, 7.5f});
  check_floats(run1("Mul", {&a, &b}), {4, -10, -18, 4});
  check_floats(run1("Div", {&a, &b}), {0.25f, -0.4f, -0.5f, 16});
  Tensor z = f32v({1, -1, 0, 1}), zz = f32v({0, 0, 0, 1});
  check_floats(run1("Div", {&z, &zz}), {kInf, -kInf, kNaN, 1});
}

TEST_CASE("broadcasting: scalar, row, column, rank mismatch", "[ops][elementwise]") {
  Tensor m = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor s = Tensor::scalar<float>(10);
  Tensor row = f32({3}, {10, 20, 30});
  Tensor col = f32({2, 1}, {100, 200});
  check_floats(run1("Add", {&m, &s}), {11, 12, 13, 14, 15, 16});
  check_floats(run1("Sub", {&s, &m}), {9, 8, 7, 6, 5, 4});
  check_floats(run1("Add", {&m, &row}), {11, 22, 33, 14, 25, 36});
  check_floats(run1("Mul", {&col, &m}), {100, 200, 300, 800, 1000, 1200});
  // Outer "product": column [2,1] and row [3] -> [2,3].
  Tensor outer = run1("Add", {&col, &row});
  CHECK(outer.shape() == Shape{2, 3});
  check_floats(outer, {110, 120, 130, 210, 220, 230});
  // Rank mismatch with a middle broadcast: [2,1,3] + [2,1] -> [2,2,3].
  Tensor a3 = f32({2, 1, 3}, {1, 2, 3, 4, 5, 6});
  Tensor c2 = f32({2, 1}, {10, 20});
  Tensor r = run1("Add", {&a3, &c2});
  CHECK(r.shape() == Shape{2, 2, 3});
  check_floats(r, {11, 12, 13, 21, 22, 23, 14, 15, 16, 24, 25, 26});
  // A bias over channels: [1,2,2,2] + [2,1,1].
  Tensor nchw = f32({1, 2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  Tensor bias = f32({2, 1, 1}, {100, 200});
  check_floats(run1("Add", {&nchw, &bias}), {100, 101, 102, 103, 204, 205, 206, 207});
  // Zero-size dims broadcast to zero elements.
  Tensor empty = f32({0, 3}, {});
  CHECK(run1("Add", {&empty, &row}).shape() == Shape{0, 3});
  // A mismatch is a Shape error naming the node.
  Tensor four = f32({4}, {1, 2, 3, 4});
  Error err = error_of([&] { run1("Add", {&m, &four}); });
  CHECK(err.kind() == ErrorKind::Shape);
  CHECK(err.context().node == "Add_under_test");
}

TEST_CASE("integer arithmetic: truncating Div, wrapping, zero divisor", "[ops][elementwise]") {
  Tensor a = i32v({7, -7, 7, -7}), b = i32v({2, 2, -2, -2});
  check_exact<int32_t>(run1("Div", {&a, &b}), {3, -3, -3, 3});
  check_exact<int32_t>(run1("Add", {&a, &b}), {9, -5, 5, -9});
  check_exact<int32_t>(run1("Mul", {&a, &b}), {14, -14, -14, 14});
  Tensor u8a = Tensor::from_vector<uint8_t>({2}, {250, 3}), u8b = Tensor::from_vector<uint8_t>({2}, {10, 5});
  check_exact<uint8_t>(run1("Add", {&u8a, &u8b}), {4, 8});  // wraps mod 256
  check_exact<uint8_t>(run1("Sub", {&u8b, &u8a}), {16, 2});
  Tensor big = Tensor::from_vector<int64_t>({1}, {std::numeric_limits<int64_t>::min()});
  Tensor m1 = Tensor::from_vector<int64_t>({1}, {-1});
  check_exact<int64_t>(run1("Div", {&big, &m1}), {std::numeric_limits<int64_t>::min()});
  Tensor zero = i32v({1, 0, 1, 1});
  Error err = error_of([&] { run1("Div", {&a, &zero}); });
  CHECK(err.kind() == ErrorKind::Runtime);
  CHECK_THAT(err.what(), Catch::Contains("division by zero"));
}

TEST_CASE("Pow: float, integer and mixed dtypes", "[ops][elementwise]") {
  Tensor a = f32v({2, 4, 9}), e = f32v({3, 0.5f, -1});
  check_floats(run1("Pow", {&a, &e}), {8, 2, 0.1111111111f});
  Tensor ai = i64v({2, 3, -2}), ei = i64v({10, 0, 3});
  check_exact<int64_t>(run1("Pow", {&ai, &ei}), {1024, 1, -8});
  // Opset 12+: base and exponent may differ; the output has the base's dtype.
  Tensor base = i32v({1, 2, 3}), expf = f32v({4, 5, 6});
  check_exact<int32_t>(run1("Pow", {&base, &expf}, {}, 15), {1, 32, 729});
  Tensor fb = f32v({1.5f, 2}), ie = i64v({2, -1});
  check_floats(run1("Pow", {&fb, &ie}, {}, 15), {2.25f, 0.5f});
  // Scalar exponent broadcast.
  Tensor two = Tensor::scalar<float>(2);
  check_floats(run1("Pow", {&a, &two}), {4, 16, 81});
  // Before opset 12 mixed dtypes are a model error at inference.
  GraphBuilder b("pow", 11);
  auto x = b.input("x", DType::Float32, {3});
  auto y = b.input("y", DType::Int64, {3});
  b.output(b.op("Pow", {x, y}));
  CHECK(error_of([&] { b.finish(); }).kind() == ErrorKind::Shape);
}

TEST_CASE("Mod with and without fmod", "[ops][elementwise]") {
  Tensor a = i32v({-7, 7, -7, 7}), b = i32v({3, -3, -3, 3});
  // fmod=0: the sign of the divisor (Python): -7 % 3 = 2, 7 % -3 = -2.
  check_exact<int32_t>(run1("Mod", {&a, &b}, {}, 13), {2, -2, -1, 1});
  // fmod=1: the sign of the dividend (C fmod).
  check_exact<int32_t>(run1("Mod", {&a, &b}, attrs({{"fmod", A::i(1)}}), 13), {-1, 1, -1, 1});
  Tensor fa = f32v({-7.5f, 7.5f}), fb = f32v({2, -2});
  check_floats(run1("Mod", {&fa, &fb}, attrs({{"fmod", A::i(1)}}), 13), {-1.5f, 1.5f});
  // fmod=0 on floats (ONNX defines it from opset 22; accepted at every opset) is numpy.mod.
  check_floats(run1("Mod", {&fa, &fb}, {}, 13), {0.5f, -0.5f});
  Tensor zx = f32v({0.0f, -3.0f, kInf}), zy = f32v({-2.0f, kInf, 2.0f});
  Tensor zm = run1("Mod", {&zx, &zy}, {}, 13);
  check_floats(zm, {0.0f, kInf, kNaN});
  CHECK(std::signbit(zm.data<float>()[0]));  // a zero result takes the divisor's sign
  Tensor zero = i32v({1, 0, 1, 1});
  CHECK(error_of([&] { run1("Mod", {&a, &zero}, {}, 13); }).kind() == ErrorKind::Runtime);
}

TEST_CASE("variadic Max, Min, Sum, Mean with broadcasting", "[ops][elementwise]") {
  Tensor a = f32({2, 2}, {1, 5, 3, 7}), b = f32({2}, {4, 4}), c = Tensor::scalar<float>(2);
  check_floats(run1("Max", {&a, &b, &c}), {4, 5, 4, 7});
  check_floats(run1("Min", {&a, &b, &c}), {1, 2, 2, 2});
  check_floats(run1("Sum", {&a, &b, &c}), {7, 11, 9, 13});
  check_floats(run1("Mean", {&a, &b, &c}), {7.0f / 3, 11.0f / 3, 3, 13.0f / 3});
  check_floats(run1("Sum", {&a}), {1, 5, 3, 7});
  check_floats(run1("Mean", {&a}), {1, 5, 3, 7});
  check_floats(run1("Max", {&a, &b}), {4, 5, 4, 7});
  Tensor n = f32v({kNaN, 1}), m = f32v({0, kNaN});
  check_floats(run1("Max", {&n, &m}), {kNaN, kNaN});
  Tensor ia = i64v({3, -1}), ib = i64v({2, 2});
  check_exact<int64_t>(run1("Max", {&ia, &ib}, {}, 13), {3, 2});
  check_exact<int64_t>(run1("Min", {&ia, &ib}, {}, 13), {2, -1});
}

TEST_CASE("bit shifts and bitwise ops", "[ops][elementwise]") {
  Tensor x = Tensor::from_vector<uint32_t>({3}, {16, 4, 1});
  Tensor s = Tensor::from_vector<uint32_t>({3}, {1, 2, 40});
  check_exact<uint32_t>(run1("BitShift", {&x, &s}, attrs({{"direction", A::s("RIGHT")}})), {8, 1, 0});
  check_exact<uint32_t>(run1("BitShift", {&x, &s}, attrs({{"direction", A::s("LEFT")}})), {32, 16, 0});
  CHECK(error_of([&] { run1("BitShift", {&x, &s}); }).kind() == ErrorKind::Model);
  // Signed shifts: arithmetic right shift; out-of-range counts give 0 or -1; left shifts wrap.
  Tensor sx = Tensor::from_vector<int8_t>({4}, {-8, 64, -1, 4});
  Tensor sy = Tensor::from_vector<int8_t>({4}, {1, 1, 8, -1});
  check_exact<int8_t>(run1("BitShift", {&sx, &sy}, attrs({{"direction", A::s("RIGHT")}})), {-4, 32, -1, 0});
  check_exact<int8_t>(run1("BitShift", {&sx, &sy}, attrs({{"direction", A::s("LEFT")}})), {-16, -128, 0, 0});
  Tensor a = i32v({12, -1}), b = i32v({10, 5});
  check_exact<int32_t>(run1("BitwiseAnd", {&a, &b}, {}, 18), {8, 5});
  check_exact<int32_t>(run1("BitwiseOr", {&a, &b}, {}, 18), {14, -1});
  check_exact<int32_t>(run1("BitwiseXor", {&a, &b}, {}, 18), {6, -6});
}

TEST_CASE("comparisons output bool; logic ops on bool", "[ops][elementwise]") {
  Tensor a = f32v({1, 2, 3}), b = f32v({2, 2, 2});
  check_exact<bool>(run1("Equal", {&a, &b}), {false, true, false});
  check_exact<bool>(run1("Less", {&a, &b}), {true, false, false});
  check_exact<bool>(run1("Greater", {&a, &b}), {false, false, true});
  check_exact<bool>(run1("LessOrEqual", {&a, &b}), {true, true, false});
  check_exact<bool>(run1("GreaterOrEqual", {&a, &b}), {false, true, true});
  Tensor two = Tensor::scalar<float>(2);
  check_exact<bool>(run1("Less", {&a, &two}), {true, false, false});
  Tensor ia = i64v({-1, 5}), ib = i64v({-1, 6});
  check_exact<bool>(run1("Equal", {&ia, &ib}), {true, false});
  Tensor p = bv({true, true, false, false}), q = bv({true, false, true, false});
  check_exact<bool>(run1("And", {&p, &q}), {true, false, false, false});
  check_exact<bool>(run1("Or", {&p, &q}), {true, true, true, false});
  check_exact<bool>(run1("Xor", {&p, &q}), {false, true, true, false});
  check_exact<bool>(run1("Equal", {&p, &q}), {true, false, false, true});
  Tensor col = Tensor::from_vector<bool>({2, 1}, {true, false});
  Tensor row = bv({true, false});
  check_exact<bool>(run1("And", {&col, &row}), {true, false, false, false});
  // NaN compares unequal to everything.
  Tensor n = f32v({kNaN});
  check_exact<bool>(run1("Equal", {&n, &n}), {false});
  CHECK(error_of([&] { run1("Less", {&a, &ia}); }).kind() == ErrorKind::Runtime);
  CHECK(error_of([&] { run1("LessOrEqual", {&a, &b}, {}, 11); }).kind() == ErrorKind::Unsupported);
}

TEST_CASE("Where broadcasts condition, X and Y", "[ops][elementwise]") {
  Tensor cond = Tensor::from_vector<bool>({2, 1}, {true, false});
  Tensor x = f32({3}, {1, 2, 3});
  Tensor y = Tensor::scalar<float>(-1);
  Tensor r = run1("Where", {&cond, &x, &y});
  CHECK(r.shape() == Shape{2, 3});
  check_floats(r, {1, 2, 3, -1, -1, -1});
  Tensor c2 = bv({true, false, true});
  Tensor xi = i64v({1, 2, 3}), yi = i64v({10, 20, 30});
  check_exact<int64_t>(run1("Where", {&c2, &xi, &yi}), {1, 20, 3});
  Tensor not_bool = f32v({1, 0, 1});
  CHECK(error_of([&] { run1("Where", {&not_bool, &xi, &yi}); }).kind() == ErrorKind::Runtime);
}

// ---------------------------------------------------------------------------------------------
// Cast, CastLike, Identity, Dropout
// ---------------------------------------------------------------------------------------------

TEST_CASE("Cast follows ONNX conversions", "[ops][elementwise]") {
  Tensor f = f32v({2.7f, -2.7f, 0.0f, 0.5f});
  auto cast = [](const Tensor& t, DType to) { return run1("Cast", {&t}, attrs({{"to", A::i(int64_t(to))}})); };
  check_exact<int32_t>(cast(f, DType::Int32), {2, -2, 0, 0});         // truncation toward zero
  check_exact<int64_t>(cast(f, DType::Int64), {2, -2, 0, 0});
  check_exact<bool>(cast(f, DType::Bool), {true, true, false, true});  // x != 0
  check_exact<double>(cast(f, DType::Float64), {double(2.7f), double(-2.7f), 0.0, 0.5});
  Tensor b = bv({true, false});
  check_exact<float>(cast(b, DType::Float32), {1.0f, 0.0f});
  check_exact<int64_t>(cast(b, DType::Int64), {1, 0});
  Tensor i = i64v({-1, 300});
  check_exact<uint8_t>(cast(i, DType::UInt8), {255, 44});  // integer narrowing wraps
  check_exact<bool>(cast(i, DType::Bool), {true, true});
  Tensor h = cast(f, DType::Float16);
  CHECK(h.dtype() == DType::Float16);
  check_floats(h, {2.69921875f, -2.69921875f, 0, 0.5f}, 1e-6);
  check_exact<int32_t>(cast(h, DType::Int32), {2, -2, 0, 0});
  Tensor same = cast(f, DType::Float32);
  check_exact<float>(same, {2.7f, -2.7f, 0.0f, 0.5f});
  Error err = error_of([&] { cast(f, DType::String); });
  CHECK(err.kind() == ErrorKind::Unsupported);
  CHECK_THAT(err.what(), Catch::Contains("string"));
  // CastLike takes the target dtype from its second input.
  Tensor like = i32v({0});
  check_exact<int32_t>(run1("CastLike", {&f, &like}, {}, 15), {2, -2, 0, 0});
}

TEST_CASE("Identity and Dropout pass their input through", "[ops][elementwise]") {
  Tensor x = f32({2, 2}, {1, 2, 3, 4});
  Tensor id = run1("Identity", {&x});
  CHECK(id.equals(x));
  auto d7 = run_op("Dropout", {&x}, attrs({{"ratio", A::f(0.5f)}}), 7, 2);
  CHECK(d7[0].equals(x));
  CHECK(d7[1].dtype() == DType::Float32);  // the mask was of the input's type before opset 10
  check_floats(d7[1], {1, 1, 1, 1});
  auto d10 = run_op("Dropout", {&x}, {}, 10, 2);
  check_exact<bool>(d10[1], {true, true, true, true});
  Tensor ratio = Tensor::scalar<float>(0.3f), off = Tensor::scalar<bool>(false), on = Tensor::scalar<bool>(true);
  auto d13 = run_op("Dropout", {&x, &ratio, &off}, {}, 13, 2);
  CHECK(d13[0].equals(x));
  check_exact<bool>(d13[1], {true, true, true, true});
  CHECK(run_op("Dropout", {&x, &ratio}, {}, 13, 1)[0].equals(x));
  Error err = error_of([&] { run_op("Dropout", {&x, &ratio, &on}, {}, 13, 1); });
  CHECK(err.kind() == ErrorKind::Unsupported);
  CHECK_THAT(err.what(), Catch::Contains("training_mode"));
  // Training mode drops nothing at ratio 0: Identity with an all-true mask.
  Tensor zero = Tensor::scalar<float>(0.f);
  auto t0 = run_op("Dropout", {&x, &zero, &on}, {}, 13, 2);
  CHECK(t0[0].equals(x));
  check_exact<bool>(t0[1], {true, true, true, true});
  // Training mode without a ratio input takes the default 0.5: random, refused.
  CHECK(error_of([&] { run_op("Dropout", {&x, nullptr, &on}, {}, 13, 1); }).kind() == ErrorKind::Unsupported);
}

// ---------------------------------------------------------------------------------------------
// Graph-level: inference, dim values, mapping types, FLOPs, errors
// ---------------------------------------------------------------------------------------------

TEST_CASE("symbolic dims survive broadcast inference", "[ops][elementwise]") {
  GraphBuilder b("sym", 17);
  auto x = b.input("x", DType::Float32, {Dim::sym("N"), 1, 768});
  auto y = b.input("y", DType::Float32, {Dim::sym("S"), 1});
  auto bias = b.weight("bias", {768});
  auto add = b.op("Add", {x, bias});
  auto mul = b.op("Mul", {add, y});
  auto cmp = b.op("Less", {mul, b.scalar("zero", 0)});
  auto sel = b.op("Where", {cmp, mul, add});
  auto cast = b.op("Cast", {sel}, attrs({{"to", A::i(int64_t(DType::Float16))}}));
  auto relu = b.op("Relu", {cast});
  b.output(relu);
  Model m = b.finish();
  const Graph& g = m.graph;
  CHECK(g.type(add).str() == "float32[N,1,768]");
  CHECK(g.type(mul).str() == "float32[N,S,768]");
  CHECK(g.type(cmp).str() == "bool[N,S,768]");
  CHECK(g.type(sel).str() == "float32[N,S,768]");
  CHECK(g.type(relu).str() == "float16[N,S,768]");
}

TEST_CASE("a shape mismatch in inference is a Shape error naming the node", "[ops][elementwise]") {
  GraphBuilder b("bad", 17);
  auto x = b.input("x", DType::Float32, {2, 3});
  auto y = b.input("y", DType::Float32, {4});
  b.output(b.op("Add", {x, y}, {}, "the_bad_add"));
  Error err = error_of([&] { b.finish(); });
  CHECK(err.kind() == ErrorKind::Shape);
  CHECK(err.context().node == "the_bad_add");
  CHECK(err.context().op == "Add");

  GraphBuilder d("dtype", 17);
  auto p = d.input("p", DType::Float32, {2});
  auto q = d.input("q", DType::Int64, {2});
  d.output(d.op("Mul", {p, q}, {}, "mixed"));
  Error e2 = error_of([&] { d.finish(); });
  CHECK(e2.kind() == ErrorKind::Shape);
  CHECK(e2.context().node == "mixed");

  GraphBuilder u("unsupported", 17);
  auto i = u.input("i", DType::Int32, {2});
  u.output(u.op("Exp", {i}, {}, "int_exp"));
  Error e3 = error_of([&] { u.finish(); });
  CHECK(e3.kind() == ErrorKind::Unsupported);
  CHECK(e3.context().node == "int_exp");
  CHECK_THAT(e3.what(), Catch::Contains("int32"));
}

TEST_CASE("mapping types: One-to-One unless an input is broadcast", "[ops][elementwise]") {
  GraphBuilder b("map", 17);
  auto x = b.input("x", DType::Float32, {Dim::sym("N"), 4});
  auto y = b.input("y", DType::Float32, {Dim::sym("N"), 4});
  auto same = b.op("Add", {x, y});
  auto bcast = b.op("Mul", {same, b.weight("w", {4})});
  auto relu = b.op("Relu", {bcast});
  auto cast = b.op("Cast", {relu}, attrs({{"to", A::i(int64_t(DType::Float64))}}));
  auto cond = b.op("Greater", {x, y});
  auto where_same = b.op("Where", {cond, x, y});
  auto where_b = b.op("Where", {cond, x, b.scalar("zero", 0)});
  auto clip = b.op("Clip", {x});
  auto prelu = b.op("PRelu", {x, b.weight("slope", {1})});
  auto sum3 = b.op("Sum", {x, y, same});
  for (auto& o : {cast, where_same, where_b, clip, prelu, sum3}) b.output(o);
  Model m = b.finish();
  const Graph& g = m.graph;
  auto type_of = [&](const std::string& out) { return node_mapping_type(g, *g.producer(out)); };
  CHECK(type_of(same) == MappingType::OneToOne);
  CHECK(type_of(bcast) == MappingType::OneToMany);
  CHECK(type_of(relu) == MappingType::OneToOne);
  CHECK(type_of(cast) == MappingType::OneToOne);
  CHECK(type_of(cond) == MappingType::OneToOne);
  CHECK(type_of(where_same) == MappingType::OneToOne);
  CHECK(type_of(where_b) == MappingType::OneToMany);
  CHECK(type_of(clip) == MappingType::OneToOne);
  CHECK(type_of(prelu) == MappingType::OneToMany);
  CHECK(type_of(sum3) == MappingType::OneToOne);
  // FLOPs: one per output element for simple ops (N unknown: none counted); static shapes below.
  GraphBuilder f("flops", 17);
  auto a = f.input("a", DType::Float32, {2, 8});
  auto s = f.op("Sum", {a, a, a});
  auto e = f.op("Exp", {s});
  auto i = f.op("Identity", {e});
  f.output(i);
  Model fm = f.finish();
  CHECK(node_flops(fm.graph, *fm.graph.producer(s)) == 32);  // two adds per element
  CHECK(node_flops(fm.graph, *fm.graph.producer(e)) == 16);
  CHECK(node_flops(fm.graph, *fm.graph.producer(i)) == 0);
  const OpSchema* add = OpRegistry::global().find("", "Add");
  REQUIRE(add);
  CHECK(add->commutative);
  CHECK(add->family == "elementwise");
  CHECK_FALSE(OpRegistry::global().find("", "Sub")->commutative);
  CHECK(OpRegistry::global().find("", "Equal")->commutative);
}

namespace {
// Runs the registry's inference of `op` on inputs given as (type, dim values) pairs.
InferResult infer_with_dims(const std::string& op, const std::vector<TensorType>& types,
                            const std::vector<std::optional<std::vector<Dim>>>& dims,
                            const std::vector<const Tensor*>& values = {}, Attributes a = {}) {
  Node n;
  n.id = 0;
  n.name = op + "_infer";
  n.op_type = op;
  n.attrs = std::move(a);
  for (size_t i = 0; i < types.size(); ++i) n.inputs.push_back("v" + std::to_string(i));
  n.outputs.push_back("o");
  InferContext c{n, 17, types, {}, dims};
  c.values.resize(types.size(), nullptr);
  for (size_t i = 0; i < values.size(); ++i) c.values[i] = values[i];
  return OpRegistry::global().find("", op)->infer(c);
}
std::string dims_str(const std::optional<std::vector<Dim>>& d) {
  if (!d) return "none";
  std::string s;
  for (auto& x : *d) s += (s.empty() ? "" : ",") + x.str();
  return s;
}
}  // namespace

TEST_CASE("dim values flow through arithmetic, Equal, Where, Cast and Identity", "[ops][elementwise]") {
  TensorType vec3(DType::Int64, {3});
  TensorType scal(DType::Int64, {});
  std::vector<Dim> shape{Dim::sym("batch"), Dim(128), Dim(768)};
  std::vector<Dim> twelve{Dim(12)};
  auto mul = infer_with_dims("Mul", {vec3, scal}, {shape, std::vector<Dim>{Dim(2)}});
  CHECK(mul.outputs[0].str() == "int64[3]");
  REQUIRE(mul.dim_values.size() == 1);
  CHECK(dims_str(mul.dim_values[0]) == "?,256,1536");
  auto mul1 = infer_with_dims("Mul", {vec3, scal}, {shape, std::vector<Dim>{Dim(1)}});
  CHECK(dims_str(mul1.dim_values[0]) == "batch,128,768");
  auto div = infer_with_dims("Div", {vec3, scal}, {shape, twelve});
  CHECK(dims_str(div.dim_values[0]) == "?,10,64");
  auto add = infer_with_dims("Add", {scal, scal}, {std::vector<Dim>{Dim(3)}, std::vector<Dim>{Dim(4)}});
  CHECK(dims_str(add.dim_values[0]) == "7");
  auto sub = infer_with_dims("Sub", {vec3, vec3}, {shape, shape});
  CHECK(dims_str(sub.dim_values[0]) == "0,0,0");
  auto mx = infer_with_dims("Max", {vec3, scal}, {shape, std::vector<Dim>{Dim(0)}});
  CHECK(dims_str(mx.dim_values[0]) == "batch,128,768");
  auto mn = infer_with_dims("Min", {vec3, scal}, {shape, std::vector<Dim>{Dim(100)}});
  CHECK(dims_str(mn.dim_values[0]) == "?,100,100");
  // Equal(shape, -1) with the -1 as a constant: a dim is never -1.
  Tensor minus1 = Tensor::from_vector<int64_t>({3}, {-1, -1, 768});
  auto eq = infer_with_dims("Equal", {vec3, vec3}, {shape, std::nullopt}, {nullptr, &minus1});
  CHECK(eq.outputs[0].dtype == DType::Bool);
  CHECK(dims_str(eq.dim_values[0]) == "0,0,1");
  // Where(cond, ones, shape) picks per element.
  TensorType bvec(DType::Bool, {3});
  auto wh = infer_with_dims("Where", {bvec, vec3, vec3},
                            {std::vector<Dim>{Dim(0), Dim(1), Dim(0)}, std::vector<Dim>{Dim(1), Dim(1), Dim(1)}, shape});
  CHECK(dims_str(wh.dim_values[0]) == "batch,1,768");
  auto unknown_cond = infer_with_dims("Where", {bvec, vec3, vec3}, {std::nullopt, shape, shape});
  CHECK((unknown_cond.dim_values.empty() || !unknown_cond.dim_values[0]));
  auto cast = infer_with_dims("Cast", {vec3}, {shape}, {}, attrs({{"to", A::i(int64_t(DType::Int32))}}));
  CHECK(cast.outputs[0].dtype == DType::Int32);
  CHECK(dims_str(cast.dim_values[0]) == "batch,128,768");
  auto castf = infer_with_dims("Cast", {vec3}, {shape}, {}, attrs({{"to", A::i(int64_t(DType::Float32))}}));
  CHECK((castf.dim_values.empty() || !castf.dim_values[0]));
  auto id = infer_with_dims("Identity", {vec3}, {shape});
  CHECK(dims_str(id.dim_values[0]) == "batch,128,768");
  // Floats never carry dim values.
  TensorType fvec(DType::Float32, {3});
  auto fadd = infer_with_dims("Add", {fvec, fvec}, {std::nullopt, std::nullopt});
  CHECK((fadd.dim_values.empty() || !fadd.dim_values[0]));
}

TEST_CASE("an elementwise graph runs end to end in the interpreter", "[ops][elementwise]") {
  GraphBuilder b("mlp_tail", 17);
  auto x = b.input("x", DType::Float32, {2, 3});
  auto bias = b.constant("bias", f32({3}, {1, -1, 0.5f}));
  auto h = b.op("Add", {x, bias});
  auto r = b.op("Relu", {h});
  auto s = b.op("Sigmoid", {r});
  b.output(s);
  Model m = b.finish();
  Tensor in = f32({2, 3}, {-2, 0, 1, 3, 2, -1});
  auto out = run_reference(m.graph, {{"x", in}});
  // h = [-1,-1,1.5, 4,1,-0.5]; relu -> [0,0,1.5,4,1,0]; sigmoid.
  check_floats(out.at(s), {0.5f, 0.5f, 0.8175744762f, 0.9820137900f, 0.7310585786f, 0.5f});
}

TEST_CASE("shape-computation chains through elementwise ops resolve Reshape targets", "[ops][elementwise]") {
  // The shape arithmetic PyTorch exporters emit around Reshape: Shape -> Mul/Div -> Where(Equal)
  // -> Cast -> Reshape. The batch dim stays symbolic; the rest become known.
  GraphBuilder b("chain", 17);
  auto x = b.input("x", DType::Float32, {Dim::sym("N"), 128, 768});
  auto shape = b.op("Shape", {x});
  auto twice = b.op("Mul", {shape, b.ints("one_two_one", {1, 2, 1})});
  auto halved = b.op("Div", {twice, b.ints("one_one_two", {1, 1, 2})});
  auto is_neg = b.op("Equal", {halved, b.ints("minus_ones", {-1, -1, -1})});
  auto target = b.op("Where", {is_neg, b.ints("ones", {1, 1, 1}), halved});
  auto as32 = b.op("Cast", {target}, attrs({{"to", A::i(int64_t(DType::Int32))}}));
  auto back = b.op("Cast", {as32}, attrs({{"to", A::i(int64_t(DType::Int64))}}));
  auto same = b.op("Identity", {back});
  auto y = b.op("Reshape", {x, same});
  b.output(y);
  Model m = b.finish();
  CHECK(m.graph.type(y).str() == "float32[N,256,384]");
  // And it runs: the values the interpreter computes agree with what inference derived.
  Tensor in(DType::Float32, {2, 128, 768});
  auto out = run_reference(m.graph, {{"x", in}});
  CHECK(out.at(y).shape() == Shape{2, 256, 384});
}
