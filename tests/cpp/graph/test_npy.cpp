#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "graph/npy.h"

using namespace nnfuse;
namespace fs = std::filesystem;

namespace {

// A scratch folder per test process, removed at exit.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("nnfuse_npy_test_" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

const TempDir& temp() {
  static TempDir d;
  return d;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// A v1.0 file with the given dict text padded as numpy pads it (data at a multiple of 64).
std::string npy_v1(const std::string& dict, const std::string& data) {
  size_t total = 10 + dict.size() + 1;
  size_t pad = (64 - total % 64) % 64;
  std::string header = dict + std::string(pad, ' ') + "\n";
  std::string out = std::string("\x93NUMPY", 6) + char(1) + char(0);
  out += char(header.size() & 0xff);
  out += char(header.size() >> 8);
  return out + header + data;
}

std::string float_bytes(std::initializer_list<float> v) {
  std::string s;
  for (float f : v) s.append(reinterpret_cast<const char*>(&f), 4);
  return s;
}

Error load_error(const std::string& path) {
  try {
    load_npy(path);
  } catch (const Error& e) {
    return e;
  }
  FAIL("load_npy(" << path << ") did not throw");
  throw;  // unreachable
}

}  // namespace

TEST_CASE("npy: round trip of every dtype", "[npy]") {
  std::vector<Tensor> cases = {
      Tensor::from_vector<float>({2, 3}, {1.5f, -2, 0, 3.25f, 1e-7f, -0.0f}),
      Tensor::from_vector<double>({3}, {1.0 / 3, -1e300, 2}),
      Tensor::from_vector<Half>({2}, {Half{float_to_half(1.5f)}, Half{float_to_half(-2.0f)}}),
      Tensor::from_vector<int8_t>({4}, {-128, -1, 0, 127}),
      Tensor::from_vector<int16_t>({2}, {-32768, 32767}),
      Tensor::from_vector<int32_t>({2, 1}, {-7, 1 << 30}),
      Tensor::from_vector<int64_t>({2}, {int64_t(-1) << 40, 5}),
      Tensor::from_vector<uint8_t>({3}, {0, 128, 255}),
      Tensor::from_vector<uint16_t>({1}, {65535}),
      Tensor::from_vector<uint32_t>({2}, {0, 4000000000u}),
      Tensor::from_vector<uint64_t>({1}, {~uint64_t(0)}),
      Tensor::from_vector<bool>({2, 2}, {true, false, false, true}),
      Tensor::scalar<float>(42.5f),       // 0-d
      Tensor::scalar<int64_t>(-3),        // 0-d
      Tensor(DType::Float32, {0, 3}),     // empty
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Tensor& t = cases[i];
    INFO("case " << i << ": " << dtype_name(t.dtype()) << shape_str(t.shape()));
    std::string path = temp().file("rt" + std::to_string(i) + ".npy");
    save_npy(t, path);
    std::string bytes = read_bytes(path);
    // The data starts at a multiple of 64, as numpy writes it.
    REQUIRE((bytes.size() - t.nbytes()) % 64 == 0);
    Tensor back = load_npy(path);
    REQUIRE(back.dtype() == t.dtype());
    REQUIRE(back.shape() == t.shape());
    REQUIRE(back.equals(t));
  }
}

TEST_CASE("npy: save writes the exact header numpy writes", "[npy]") {
  std::string path = temp().file("exact.npy");
  save_npy(Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6}), path);
  REQUIRE(read_bytes(path) == npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", float_bytes({1, 2, 3, 4, 5, 6})));
  save_npy(Tensor::from_vector<uint8_t>({3}, {1, 2, 3}), path);
  REQUIRE(read_bytes(path) == npy_v1("{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }", std::string("\x01\x02\x03", 3)));
  save_npy(Tensor::scalar<bool>(true), path);
  REQUIRE(read_bytes(path) == npy_v1("{'descr': '|b1', 'fortran_order': False, 'shape': (), }", std::string("\x01", 1)));
}

TEST_CASE("npy: loads hand-written files of versions 1, 2 and 3", "[npy]") {
  std::string path = temp().file("hand.npy");
  // Keys in another order, double quotes, no trailing comma: still a valid dict.
  write_bytes(path, npy_v1("{\"shape\": (2,), \"fortran_order\": False, \"descr\": \"<f4\"}", float_bytes({0.5f, -4})));
  Tensor t = load_npy(path);
  REQUIRE(t.dtype() == DType::Float32);
  REQUIRE(t.shape() == Shape{2});
  REQUIRE(t.data<float>()[0] == 0.5f);
  REQUIRE(t.data<float>()[1] == -4.0f);

  for (char version : {char(2), char(3)}) {
    std::string dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 1), }";
    size_t total = 12 + dict.size() + 1;
    std::string header = dict + std::string((64 - total % 64) % 64, ' ') + "\n";
    std::string bytes = std::string("\x93NUMPY", 6) + version + char(0);
    uint32_t len = uint32_t(header.size());
    bytes.append(reinterpret_cast<const char*>(&len), 4);
    int64_t v = -9;
    bytes += header + std::string(reinterpret_cast<const char*>(&v), 8);
    write_bytes(path, bytes);
    Tensor x = load_npy(path);
    REQUIRE(x.dtype() == DType::Int64);
    REQUIRE(x.shape() == Shape{1, 1});
    REQUIRE(x.data<int64_t>()[0] == -9);
  }
}

TEST_CASE("npy: malformed files give errors naming the file and the fault", "[npy]") {
  std::string path = temp().file("bad.npy");
  auto check = [&](const std::string& bytes, ErrorKind kind, const std::string& says) {
    write_bytes(path, bytes);
    Error e = load_error(path);
    INFO(e.what());
    REQUIRE(e.kind() == kind);
    REQUIRE(e.context().file == path);
    REQUIRE(std::string(e.what()).find(says) != std::string::npos);
  };
  check("not a numpy file at all", ErrorKind::Invalid, "magic");
  check(npy_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", float_bytes({1, 2, 3, 4, 5, 6})),
        ErrorKind::Invalid, "fortran_order");
  check(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", float_bytes({1, 2})), ErrorKind::Invalid,
        "truncated");
  check(npy_v1("{'descr': '<f4', 'fortran_order': False}", float_bytes({1})), ErrorKind::Invalid, "'shape' key is missing");
  check(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", float_bytes({1, 2})), ErrorKind::Invalid,
        "shape");
  check(npy_v1("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", float_bytes({1})), ErrorKind::Unsupported,
        "big-endian");
  check(npy_v1("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", float_bytes({1, 2})), ErrorKind::Unsupported,
        "<c8");
  check(std::string("\x93NUMPY", 6) + char(1) + char(0) + char(100) + char(0) + "{'descr'", ErrorKind::Invalid,
        "header claims 100 bytes");
  check(std::string("\x93NUMPY", 6) + char(9) + char(0) + std::string(60, ' '), ErrorKind::Invalid, "version 9.0");

  // A file that is not there is an I/O error naming it.
  Error e = load_error(temp().file("does_not_exist.npy"));
  REQUIRE(e.kind() == ErrorKind::Io);
  REQUIRE(std::string(e.what()).find("does_not_exist.npy") != std::string::npos);
}

TEST_CASE("npy: saving to an unwritable place or an unsupported dtype fails clearly", "[npy]") {
  try {
    save_npy(Tensor::scalar<float>(1), temp().file("no/such/dir/x.npy"));
    FAIL("expected an error");
  } catch (const Error& e) {
    REQUIRE(e.kind() == ErrorKind::Io);
    REQUIRE(std::string(e.what()).find("x.npy") != std::string::npos);
  }
  try {
    save_npy(Tensor(DType::BFloat16, {2}), temp().file("bf16.npy"));
    FAIL("expected an error");
  } catch (const Error& e) {
    REQUIRE(e.kind() == ErrorKind::Unsupported);
  }
}
