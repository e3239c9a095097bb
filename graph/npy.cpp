// numpy .npy files. The format: magic "\x93NUMPY", a major/minor version byte pair, the header
// length (uint16 little-endian in v1.0, uint32 in v2.0/3.0), then a Python dict literal
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and a final '\n' so that the data starts at a multiple of 64 bytes, then the
// raw elements. We read and write little-endian C-order arrays only.
#include "graph/npy.h"

#include <cctype>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

namespace nnfuse {

namespace {

const char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

[[noreturn]] void bad_header(const std::string& path, const std::string& what) {
  ErrorContext ctx;
  ctx.file = path;
  fail(ErrorKind::Invalid, "malformed .npy header: " + what, ctx);
}

struct DescrEntry {
  const char* code;  // without the byte-order character
  DType dtype;
};
const DescrEntry kDescrs[] = {
    {"f2", DType::Float16}, {"f4", DType::Float32}, {"f8", DType::Float64}, {"i1", DType::Int8},
    {"i2", DType::Int16},   {"i4", DType::Int32},   {"i8", DType::Int64},   {"u1", DType::UInt8},
    {"u2", DType::UInt16},  {"u4", DType::UInt32},  {"u8", DType::UInt64},  {"b1", DType::Bool},
};

// A tiny reader for the header dict: only the literals numpy writes there.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  void parse(std::string& descr, bool& fortran, Shape& shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_ws();
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') { ++i_; break; }
      std::string key = string_literal("a key");
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (peek() == '[') bad_header(path_, "'descr' is a structured dtype (a list of fields); only plain numeric arrays are supported");
        descr = string_literal("the 'descr' value");
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        have_fortran = true;
      } else if (key == "shape") {
        shape = tuple();
        have_shape = true;
      } else {
        bad_header(path_, "unexpected key '" + key + "' (expected descr, fortran_order, shape)");
      }
      skip_ws();
      if (peek() == ',') { ++i_; continue; }
      skip_ws();
      if (peek() == '}') { ++i_; break; }
      bad_header(path_, std::string("expected ',' or '}' at offset ") + std::to_string(i_) + " of the header dict");
    }
    if (!have_descr) bad_header(path_, "the 'descr' key is missing");
    if (!have_fortran) bad_header(path_, "the 'fortran_order' key is missing");
    if (!have_shape) bad_header(path_, "the 'shape' key is missing");
  }

 private:
  const std::string& s_;
  const std::string& path_;
  size_t i_ = 0;

  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char ch) {
    if (peek() != ch)
      bad_header(path_, std::string("expected '") + ch + "' at offset " + std::to_string(i_) + " of the header dict" +
                            (i_ < s_.size() ? std::string(", found '") + s_[i_] + "'" : std::string(", found the end")));
    ++i_;
  }
  std::string string_literal(const char* what) {
    char q = peek();
    if (q != '\'' && q != '"') bad_header(path_, std::string("expected a quoted string for ") + what + " at offset " + std::to_string(i_));
    ++i_;
    size_t start = i_;
    while (i_ < s_.size() && s_[i_] != q) ++i_;
    if (i_ >= s_.size()) bad_header(path_, std::string("unterminated string for ") + what);
    return s_.substr(start, i_++ - start);
  }
  bool boolean() {
    if (s_.compare(i_, 4, "True") == 0) { i_ += 4; return true; }
    if (s_.compare(i_, 5, "False") == 0) { i_ += 5; return false; }
    bad_header(path_, "'fortran_order' must be True or False");
  }
  Shape tuple() {
    expect('(');
    Shape shape;
    while (true) {
      skip_ws();
      if (peek() == ')') { ++i_; break; }
      if (!std::isdigit(static_cast<unsigned char>(peek())))
        bad_header(path_, "'shape' must be a tuple of non-negative integers (offset " + std::to_string(i_) + ")");
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (v > (int64_t(1) << 56)) bad_header(path_, "a dimension in 'shape' is too large");
        v = v * 10 + (s_[i_++] - '0');
      }
      if (peek() == 'L') ++i_;  // Python 2 longs
      shape.push_back(v);
      skip_ws();
      if (peek() == ',') { ++i_; continue; }
      skip_ws();
      if (peek() == ')') { ++i_; break; }
      bad_header(path_, "expected ',' or ')' in 'shape' at offset " + std::to_string(i_));
    }
    return shape;
  }
};

DType dtype_from_descr(const std::string& descr, const std::string& path) {
  if (descr.size() < 2) bad_header(path, "'descr' is '" + descr + "', not a numpy type string such as '<f4'");
  char order = descr[0];
  std::string code = descr.substr(1);
  for (auto& e : kDescrs) {
    if (code != e.code) continue;
    bool single = dtype_size(e.dtype) == 1;
    if (order == '<' || order == '|' || (single && order == '>') || order == '=') return e.dtype;
    if (order == '>') {
      ErrorContext ctx;
      ctx.file = path;
      fail(ErrorKind::Unsupported, "big-endian dtype '" + descr + "' is not supported; save it little-endian (astype('<" + code + "'))", ctx);
    }
    bad_header(path, "'descr' is '" + descr + "': unknown byte order '" + std::string(1, order) + "'");
  }
  ErrorContext ctx;
  ctx.file = path;
  fail(ErrorKind::Unsupported,
       "dtype '" + descr + "' is not supported (supported: float16/32/64, int8/16/32/64, uint8/16/32/64, bool)", ctx);
}

std::string descr_of(DType t) {
  for (auto& e : kDescrs)
    if (e.dtype == t) return std::string(dtype_size(t) == 1 ? "|" : "<") + e.code;
  fail(ErrorKind::Unsupported, std::string("dtype ") + dtype_name(t) + " cannot be saved as .npy (numpy has no such dtype)");
}

}  // namespace

Tensor load_npy(const std::string& path) {
  ErrorContext ctx;
  ctx.file = path;
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(ErrorKind::Io, "cannot open .npy file for reading", ctx);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) fail(ErrorKind::Io, "error while reading the file", ctx);
  return load_npy_bytes(bytes, path);
}

Tensor load_npy_bytes(const std::string& bytes, const std::string& path) {
  ErrorContext ctx;
  ctx.file = path;
  if (bytes.size() < kMagicLen + 2 || bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0)
    bad_header(path, "the file does not start with the .npy magic \"\\x93NUMPY\"");
  const unsigned major = static_cast<unsigned char>(bytes[6]), minor = static_cast<unsigned char>(bytes[7]);
  size_t pos = 8, header_len = 0;
  if (major == 1) {
    if (bytes.size() < pos + 2) bad_header(path, "the file ends inside the header length");
    header_len = size_t(static_cast<unsigned char>(bytes[8])) | size_t(static_cast<unsigned char>(bytes[9])) << 8;
    pos += 2;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < pos + 4) bad_header(path, "the file ends inside the header length");
    for (int k = 0; k < 4; ++k) header_len |= size_t(static_cast<unsigned char>(bytes[8 + size_t(k)])) << (8 * k);
    pos += 4;
  } else {
    bad_header(path, "format version " + std::to_string(major) + "." + std::to_string(minor) + " is not supported (1.0, 2.0, 3.0 are)");
  }
  if (bytes.size() < pos + header_len)
    bad_header(path, "the header claims " + std::to_string(header_len) + " bytes but the file has only " +
                         std::to_string(bytes.size() - pos) + " after the length field");
  std::string header = bytes.substr(pos, header_len);
  pos += header_len;
  std::string descr;
  bool fortran = false;
  Shape shape;
  HeaderParser(header, path).parse(descr, fortran, shape);
  DType dt = dtype_from_descr(descr, path);
  int64_t numel = shape_numel(shape);
  if (fortran) {
    bool trivially_same = true;  // 0-d, 1-d and single-element arrays are identical in both orders
    int64_t non_unit = 0;
    for (auto d : shape) non_unit += d != 1;
    trivially_same = non_unit <= 1;
    if (!trivially_same)
      fail(ErrorKind::Invalid,
           "fortran_order is True: only C-order arrays are supported (save with np.ascontiguousarray)", ctx);
  }
  // The size the header claims is checked against the file before anything is allocated: a
  // 100-byte file claiming a terabyte is an error, not an allocation.
  const size_t want = size_t(numel) * dtype_size(dt);
  if (numel > 0 && want / size_t(numel) != dtype_size(dt))
    fail(ErrorKind::Invalid, "shape " + shape_str(shape) + " of " + dtype_name(dt) + " is too large", ctx);
  if (bytes.size() - pos < want)
    fail(ErrorKind::Invalid, "truncated .npy data: shape " + shape_str(shape) + " of " + dtype_name(dt) + " needs " +
                                 std::to_string(want) + " bytes, the file has " + std::to_string(bytes.size() - pos),
         ctx);
  if (bytes.size() - pos > want)
    fail(ErrorKind::Invalid, "the .npy file has " + std::to_string(bytes.size() - pos - want) +
                                 " bytes after the data of shape " + shape_str(shape) + " (" + dtype_name(dt) + ")", ctx);
  Tensor t(dt, shape);
  if (want) std::memcpy(t.raw(), bytes.data() + pos, want);
  if (dt == DType::Bool) {
    auto* p = static_cast<uint8_t*>(t.raw());
    for (int64_t i = 0; i < numel; ++i)
      if (p[i] > 1) fail(ErrorKind::Invalid, "bool element " + std::to_string(i) + " has byte value " + std::to_string(p[i]) + " (not 0 or 1)", ctx);
  }
  return t;
}

void save_npy(const Tensor& t, const std::string& path) {
  ErrorContext ctx;
  ctx.file = path;
  std::string descr;
  try {
    descr = descr_of(t.dtype());
  } catch (const Error& e) {
    fail(e.kind(), e.detail(), ctx);
  }
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < t.shape().size(); ++i) dict += std::to_string(t.shape()[i]) + (t.shape().size() == 1 || i + 1 < t.shape().size() ? ", " : "");
  if (t.shape().size() == 1) dict.pop_back();  // "(3,)" as Python writes a 1-tuple
  dict += "), }";
  // Version 1.0 unless the header does not fit its 16-bit length.
  size_t len_field = 2;
  unsigned major = 1;
  size_t total = kMagicLen + 2 + len_field + dict.size() + 1;
  if (total + 64 > 65535 + kMagicLen + 2 + len_field) {
    major = 2;
    len_field = 4;
    total = kMagicLen + 2 + len_field + dict.size() + 1;
  }
  size_t pad = (64 - total % 64) % 64;
  std::string header = dict + std::string(pad, ' ') + "\n";
  std::string out(kMagic, kMagicLen);
  out += char(major);
  out += char(0);
  for (size_t k = 0; k < len_field; ++k) out += char((header.size() >> (8 * k)) & 0xff);
  out += header;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail(ErrorKind::Io, "cannot open .npy file for writing", ctx);
  f.write(out.data(), std::streamsize(out.size()));
  if (t.nbytes()) f.write(static_cast<const char*>(t.raw()), std::streamsize(t.nbytes()));
  f.close();
  if (!f) fail(ErrorKind::Io, "error while writing the file (disk full?)", ctx);
}

}  // namespace nnfuse
