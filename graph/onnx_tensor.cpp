// onnx.TensorProto <-> Tensor (graph/onnx_tensor.h) and the .pb tensor files of graph/onnx_io.h.
#include "graph/onnx_tensor.h"

#include <onnx/onnx-data_pb.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>

#include "graph/low_precision.h"
#include "graph/onnx_io.h"

namespace nnfuse {

namespace fs = std::filesystem;

namespace onnx_tensor {

ErrorContext in_file(const std::string& file) {
  ErrorContext c;
  c.file = file;
  return c;
}

bool dtype_supported(int32_t t) {
  switch (t) {
    case 1: case 2: case 3: case 4: case 5: case 6: case 7: case 9: case 10: case 11: case 12: case 13: case 16:
      return true;
    default:
      return t >= 17 && t <= kMaxDTypeCode;  // float8, float4, int4/uint4, int2/uint2
  }
}

const char* onnx_dtype_name(int32_t t) {
  switch (t) {
    case 8: return "string";
    case 14: return "complex64";
    case 15: return "complex128";
    default: return dtype_supported(t) ? dtype_name(DType(t)) : "unknown";
  }
}

namespace {

[[noreturn]] void model_error(const Source& src, const std::string& msg) { fail(ErrorKind::Model, msg, in_file(src.label)); }

std::string read_external(const onnx::TensorProto& tp, size_t nbytes, const Source& src) {
  std::string location;
  int64_t offset = 0, length = -1;
  auto number = [&](const std::string& key, const std::string& v) -> int64_t {
    try {
      size_t used = 0;
      long long n = std::stoll(v, &used);
      if (used == v.size() && n >= 0) return n;
    } catch (const std::exception&) {
    }
    model_error(src, "tensor '" + tp.name() + "': external data " + key + " '" + v + "' is not a non-negative integer");
  };
  for (auto& kv : tp.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = number("offset", kv.value());
    else if (kv.key() == "length") length = number("length", kv.value());
  }
  if (location.empty()) model_error(src, "tensor '" + tp.name() + "' has external data without a location");
  fs::path rel(location);
  // Like onnx.checker and ONNX Runtime: external data stays inside the model's directory.
  if (rel.is_absolute()) model_error(src, "tensor '" + tp.name() + "': external data location '" + location + "' must be relative to the model's directory");
  for (auto& part : rel)
    if (part == "..") model_error(src, "tensor '" + tp.name() + "': external data location '" + location + "' leaves the model's directory");
  fs::path full = src.base_dir.empty() ? rel : fs::path(src.base_dir) / rel;
  if (length >= 0 && size_t(length) != nbytes)
    model_error(src, "tensor '" + tp.name() + "': external data length " + std::to_string(length) + " does not match its " +
                std::to_string(nbytes) + " bytes");
  std::ifstream in(full, std::ios::binary);
  if (!in) fail(ErrorKind::Io, "tensor '" + tp.name() + "': cannot open external data file '" + full.string() + "'", in_file(src.label));
  in.seekg(0, std::ios::end);
  int64_t size = int64_t(in.tellg());
  if (offset < 0 || offset + int64_t(nbytes) > size)
    model_error(src, "tensor '" + tp.name() + "': external data file '" + full.string() + "' has " + std::to_string(size) +
                " bytes, too few for " + std::to_string(nbytes) + " bytes at offset " + std::to_string(offset));
  std::string buf(nbytes, '\0');
  in.seekg(offset);
  in.read(buf.data(), std::streamsize(nbytes));
  if (!in) fail(ErrorKind::Io, "tensor '" + tp.name() + "': reading external data file '" + full.string() + "' failed", in_file(src.label));
  return buf;
}

}  // namespace

Tensor from_proto(const onnx::TensorProto& tp, const std::string& what, const Source& src) {
  const std::string name = tp.name().empty() ? what : "'" + tp.name() + "'";
  int32_t dt = tp.data_type();
  if (!dtype_supported(dt))
    fail(ErrorKind::Unsupported, "tensor " + name + " has element type " + onnx_dtype_name(dt) + " (" + std::to_string(dt) + "), which nnfuse does not support", in_file(src.label));
  Shape shape;
  for (int64_t d : tp.dims()) {
    if (d < 0) model_error(src, "tensor " + name + " has a negative dimension " + std::to_string(d));
    shape.push_back(d);
  }
  if (tp.has_segment()) fail(ErrorKind::Unsupported, "tensor " + name + " is segmented, which nnfuse does not support", in_file(src.label));
  DType dtype = DType(dt);
  Tensor t = Tensor::uninitialized(dtype, shape);  // every path below fills it or throws
  const size_t n = size_t(t.numel());
  const size_t esize = dtype_size(dtype);
  auto count_error = [&](size_t got, const char* field) {
    model_error(src, "tensor " + name + " of shape " + shape_str(shape) + " needs " + std::to_string(n) + " elements but " + field +
                " holds " + std::to_string(got));
  };
  // Stored little-endian; every host we target is little-endian. The 4- and 2-bit types are
  // stored packed (two or four to a byte) and unpacked here to one byte per element.
  const size_t stored = packed_size(dtype, n);
  auto unpack = [&](const char* bytes) {
    if (n) unpack_low_precision(dtype, reinterpret_cast<const uint8_t*>(bytes), n, static_cast<uint8_t*>(t.raw()));
  };
  if (tp.data_location() == onnx::TensorProto::EXTERNAL) {
    std::string buf = read_external(tp, stored, src);
    unpack(buf.data());
    return t;
  }
  if (tp.has_raw_data()) {
    if (tp.raw_data().size() != stored)
      model_error(src, "tensor " + name + " of shape " + shape_str(shape) + " and type " + dtype_name(dtype) + " needs " +
                  std::to_string(stored) + " bytes but raw_data holds " + std::to_string(tp.raw_data().size()));
    unpack(tp.raw_data().data());
    return t;
  }
  if (dtype_is_low_precision(dtype)) {
    // int32_data: one float8 code, or one packed byte of 4/2-bit elements, per entry.
    if (size_t(tp.int32_data_size()) != stored) count_error(size_t(tp.int32_data_size()), "int32_data");
    std::string bytes(stored, '\0');
    for (size_t i = 0; i < stored; ++i) bytes[i] = char(uint8_t(tp.int32_data(int(i))));
    unpack(bytes.data());
    return t;
  }
  auto* out = static_cast<char*>(t.raw());
  switch (dtype) {
    case DType::Float32:
      if (size_t(tp.float_data_size()) != n) count_error(size_t(tp.float_data_size()), "float_data");
      if (n) std::memcpy(out, tp.float_data().data(), n * 4);
      break;
    case DType::Float64:
      if (size_t(tp.double_data_size()) != n) count_error(size_t(tp.double_data_size()), "double_data");
      if (n) std::memcpy(out, tp.double_data().data(), n * 8);
      break;
    case DType::Int64:
      if (size_t(tp.int64_data_size()) != n) count_error(size_t(tp.int64_data_size()), "int64_data");
      if (n) std::memcpy(out, tp.int64_data().data(), n * 8);
      break;
    case DType::UInt64:
    case DType::UInt32:
      if (size_t(tp.uint64_data_size()) != n) count_error(size_t(tp.uint64_data_size()), "uint64_data");
      for (size_t i = 0; i < n; ++i) {
        uint64_t v = tp.uint64_data(int(i));
        if (dtype == DType::UInt32) {
          uint32_t w = uint32_t(v);
          std::memcpy(out + i * 4, &w, 4);
        } else {
          std::memcpy(out + i * 8, &v, 8);
        }
      }
      break;
    default: {
      // int32, int16, int8, uint16, uint8, bool, float16 and bfloat16 (bit patterns) all
      // live in int32_data, one element per entry.
      if (size_t(tp.int32_data_size()) != n) count_error(size_t(tp.int32_data_size()), "int32_data");
      for (size_t i = 0; i < n; ++i) {
        int32_t v = tp.int32_data(int(i));
        switch (esize) {
          case 1: { uint8_t b = dtype == DType::Bool ? uint8_t(v != 0) : uint8_t(v); out[i] = char(b); break; }
          case 2: { uint16_t h = uint16_t(v); std::memcpy(out + i * 2, &h, 2); break; }
          default: std::memcpy(out + i * 4, &v, 4); break;
        }
      }
      break;
    }
  }
  return t;
}

Tensor sparse_from_proto(const onnx::SparseTensorProto& sp, const std::string& what, const Source& src) {
  Tensor values = from_proto(sp.values(), what + " values", src);
  Tensor indices = from_proto(sp.indices(), what + " indices", src);
  Shape shape(sp.dims().begin(), sp.dims().end());
  Tensor dense(values.dtype(), shape);
  const int64_t nnz = values.numel();
  const int64_t rank = int64_t(shape.size());
  auto strides = shape_strides(shape);
  const int64_t total = dense.numel();
  size_t es = dtype_size(values.dtype());
  for (int64_t k = 0; k < nnz; ++k) {
    int64_t flat = 0;
    if (indices.rank() == 1) {
      flat = indices.as_int(k);
    } else if (indices.rank() == 2 && indices.dim(1) == rank) {
      for (int64_t d = 0; d < rank; ++d) flat += indices.as_int(k * rank + d) * strides[size_t(d)];
    } else {
      model_error(src, "sparse tensor " + what + " has indices of shape " + shape_str(indices.shape()));
    }
    if (flat < 0 || flat >= total) model_error(src, "sparse tensor " + what + " has an index out of range");
    std::memcpy(static_cast<char*>(dense.raw()) + flat * int64_t(es), static_cast<const char*>(values.raw()) + k * int64_t(es), es);
  }
  return dense;
}

namespace {

// The bytes ONNX stores for `t`: its memory as it is, except the 4- and 2-bit types, which are
// packed two or four to a byte (into `packed`, which the view then points into).
std::string_view stored_bytes(const Tensor& t, std::string& packed) {
  if (dtype_packed_bits(t.dtype()) >= 8) return {static_cast<const char*>(t.raw()), t.nbytes()};
  packed = pack_low_precision(t.dtype(), static_cast<const uint8_t*>(t.raw()), size_t(t.numel()));
  return packed;
}

}  // namespace

void to_proto(const Tensor& t, const std::string& name, onnx::TensorProto& tp, ExternalWriter* external) {
  if (!name.empty()) tp.set_name(name);
  tp.set_data_type(int32_t(t.dtype()));
  for (int64_t d : t.shape()) tp.add_dims(d);
  if (t.dtype() == DType::String || t.dtype() == DType::Undefined)
    fail(ErrorKind::Unsupported, "tensor '" + name + "' has element type " + dtype_name(t.dtype()) + ", which cannot be exported");
  std::string packed;
  const std::string_view bytes = t.nbytes() ? stored_bytes(t, packed) : std::string_view();
  if (external && t.nbytes() >= external->min_bytes) {
    // Aligned so that runtimes can map the weights straight from the file.
    constexpr int64_t align = 4096;
    int64_t pad = (align - external->offset % align) % align;
    static const char zeros[align] = {};
    external->out->write(zeros, pad);
    external->offset += pad;
    external->out->write(bytes.data(), std::streamsize(bytes.size()));
    if (!*external->out) fail(ErrorKind::Io, "writing external data file '" + external->location + "' failed");
    tp.set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const char* k, const std::string& v) {
      auto* e = tp.add_external_data();
      e->set_key(k);
      e->set_value(v);
    };
    add("location", external->location);
    add("offset", std::to_string(external->offset));
    add("length", std::to_string(bytes.size()));
    external->offset += int64_t(bytes.size());
    return;
  }
  if (bytes.empty()) tp.set_raw_data("");
  else tp.set_raw_data(bytes.data(), bytes.size());
}

void write_message(const google::protobuf::MessageLite& msg, const std::string& path, const std::string& kind) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(ErrorKind::Io, "cannot write " + kind + " '" + path + "'", in_file(path));
  if (!msg.SerializeToOstream(&out)) fail(ErrorKind::Io, "writing " + kind + " '" + path + "' failed", in_file(path));
  out.close();
  if (!out) fail(ErrorKind::Io, "writing " + kind + " '" + path + "' failed", in_file(path));
}

}  // namespace onnx_tensor

using onnx_tensor::in_file;

Tensor load_tensor_pb(const std::string& path, std::string* name) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::Io, "cannot open tensor file '" + path + "'", in_file(path));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(ErrorKind::Io, "reading tensor file '" + path + "' failed", in_file(path));
  return load_tensor_pb_bytes(bytes, path, fs::path(path).parent_path().string(), name);
}

Tensor load_tensor_pb_bytes(const std::string& bytes, const std::string& label, const std::string& base_dir, std::string* name) {
  onnx::TensorProto tp;
  if (bytes.size() > size_t(INT_MAX) || !tp.ParseFromString(bytes))
    fail(ErrorKind::Invalid, "not a serialized onnx.TensorProto (protobuf parse failed)", in_file(label));
  try {
    Tensor t = onnx_tensor::from_proto(tp, "in '" + label + "'", {label, base_dir});
    if (name) *name = tp.name();
    return t;
  } catch (const Error& e) {
    if (!e.context().file.empty()) throw;
    ErrorContext c = e.context();  // a size refused before allocating: name the file too
    c.file = label;
    throw Error(e.kind(), e.detail(), c);
  }
}

void save_tensor_pb(const Tensor& t, const std::string& name, const std::string& path) {
  onnx::TensorProto tp;
  onnx_tensor::to_proto(t, name, tp, nullptr);
  onnx_tensor::write_message(tp, path, "tensor file");
}

namespace {

Tensor from_sequence_proto(const onnx::SequenceProto& sp, const std::string& label, const std::string& base_dir, DType want) {
  // Protobuf parses another message's bytes without complaint (a TensorProto reads as a
  // SequenceProto with a strange name and no elements): fields it does not know, or of the wrong
  // kind, mean the file is not a sequence.
  if (!sp.unknown_fields().empty() || sp.sparse_tensor_values_size() || sp.sequence_values_size() || sp.map_values_size() ||
      sp.optional_values_size())
    fail(ErrorKind::Invalid, "not an onnx.SequenceProto of tensors (a tensor file, or a sequence of sequences, maps or optionals)", in_file(label));
  if (sp.elem_type() != onnx::SequenceProto::TENSOR && sp.elem_type() != onnx::SequenceProto::UNDEFINED)
    fail(ErrorKind::Unsupported, "a sequence of non-tensors (elem_type " + std::to_string(sp.elem_type()) + ")", in_file(label));
  std::vector<Tensor> el;
  for (int i = 0; i < sp.tensor_values_size(); ++i)
    el.push_back(onnx_tensor::from_proto(sp.tensor_values(i), "sequence element " + std::to_string(i) + " in '" + label + "'", {label, base_dir}));
  DType dt = el.empty() ? want : el[0].dtype();
  if (dt == DType::Undefined) dt = DType::Float32;
  try {
    return Tensor::sequence(dt, std::move(el));
  } catch (const Error& e) {
    fail(ErrorKind::Invalid, e.detail(), in_file(label));
  }
}

void to_sequence_proto(const Tensor& t, const std::string& name, onnx::SequenceProto& sp) {
  sp.set_name(name);
  sp.set_elem_type(onnx::SequenceProto::TENSOR);
  for (auto& e : t.elements()) onnx_tensor::to_proto(e, "", *sp.add_tensor_values(), nullptr);
}

}  // namespace

Tensor load_value_pb(const std::string& path, const TensorType& want) {
  if (want.is_tensor()) return load_tensor_pb(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::Io, "cannot open value file '" + path + "'", in_file(path));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string base = fs::path(path).parent_path().string();
  if (want.kind == ValueKind::Sequence) {
    onnx::SequenceProto sp;
    if (bytes.size() > size_t(INT_MAX) || !sp.ParseFromString(bytes))
      fail(ErrorKind::Invalid, "not a serialized onnx.SequenceProto (the input is " + want.str() + ")", in_file(path));
    return from_sequence_proto(sp, path, base, want.dtype);
  }
  onnx::OptionalProto op;
  if (bytes.size() > size_t(INT_MAX) || !op.ParseFromString(bytes) || !op.unknown_fields().empty())
    fail(ErrorKind::Invalid, "not a serialized onnx.OptionalProto (the input is " + want.str() + ")", in_file(path));
  if (op.has_tensor_value()) return onnx_tensor::from_proto(op.tensor_value(), "in '" + path + "'", {path, base});
  if (op.has_sequence_value()) return from_sequence_proto(op.sequence_value(), path, base, want.dtype);
  if (op.has_sparse_tensor_value() || op.has_map_value() || op.has_optional_value())
    fail(ErrorKind::Unsupported, "an optional holding a sparse tensor, map or optional", in_file(path));
  return Tensor::none();
}

void save_value_pb(const Tensor& t, const TensorType& declared, const std::string& name, const std::string& path) {
  if (declared.kind == ValueKind::Optional || t.is_none()) {
    onnx::OptionalProto op;
    op.set_name(name);
    if (t.is_sequence()) {
      op.set_elem_type(onnx::OptionalProto::SEQUENCE);
      to_sequence_proto(t, "", *op.mutable_sequence_value());
    } else if (t.is_tensor()) {
      op.set_elem_type(onnx::OptionalProto::TENSOR);
      onnx_tensor::to_proto(t, "", *op.mutable_tensor_value(), nullptr);
    } else {
      op.set_elem_type(declared.optional_of == ValueKind::Sequence ? onnx::OptionalProto::SEQUENCE : onnx::OptionalProto::TENSOR);
    }
    onnx_tensor::write_message(op, path, "value file");
  } else if (t.is_sequence()) {
    onnx::SequenceProto sp;
    to_sequence_proto(t, name, sp);
    onnx_tensor::write_message(sp, path, "value file");
  } else {
    save_tensor_pb(t, name, path);
  }
}

}  // namespace nnfuse
