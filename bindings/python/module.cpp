// nnfuse._core: pybind11 bindings of the public C++ API (include/nnfuse/nnfuse.h) and the CLI.
//
// The user-facing Python API (nnfuse.load, Graph, compile, InferenceSession, exceptions) is the pure
// Python package around this module; here are only the conversions that need C++: numpy arrays to
// and from tensors without copying where the layout allows, and nnfuse::api::Error to the package's
// exception classes (nnfuse._errors) with their file/line/col/node/op/opset attributes.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "nnfuse/nnfuse.h"

namespace nnfuse::cli {
int cli_main(int argc, char** argv);
}

namespace py = pybind11;
using namespace nnfuse::api;

namespace {

// Raises the package's exception for an Error (the translator runs with the GIL held): the class
// whose `kind` is the error's (nnfuse._errors._BY_KIND), with the place at fault as attributes.
void raise_error(const Error& e) {
  auto str_or_none = [](const std::string& s) { return s.empty() ? py::object(py::none()) : py::object(py::str(s)); };
  auto int_or_none = [](int v) { return v ? py::object(py::int_(v)) : py::object(py::none()); };
  py::object cls = py::module_::import("nnfuse._errors").attr("_BY_KIND")[py::str(error_kind_name(e.kind()))];
  py::object exc = cls(std::string(e.what()), py::arg("detail") = e.detail(), py::arg("file") = str_or_none(e.file()),
                       py::arg("line") = int_or_none(e.line()), py::arg("col") = int_or_none(e.col()),
                       py::arg("node") = str_or_none(e.node()), py::arg("op") = str_or_none(e.op()),
                       py::arg("opset") = int_or_none(e.opset()));
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

[[noreturn]] void invalid(const std::string& msg) { throw Error(ErrorKind::Invalid, msg); }

// float8, float4, int4/uint4, int2/uint2 (ONNX codes 17-26).
bool is_low_precision(DType t) { return int32_t(t) >= int32_t(DType::Float8E4M3FN) && int32_t(t) <= int32_t(DType::Int2); }

DType dtype_of(const py::dtype& dt, const std::string& what) {
  // Read through Python attributes: pybind11 2.10 reads kind/itemsize from the numpy 1.x struct
  // layout of PyArray_Descr, which numpy 2 changed.
  char kind = dt.attr("kind").cast<std::string>()[0];
  ssize_t size = dt.attr("itemsize").cast<ssize_t>();
  if (kind == 'f' && size == 4) return DType::Float32;
  if (kind == 'f' && size == 8) return DType::Float64;
  if (kind == 'f' && size == 2) return DType::Float16;
  if (kind == 'i' && size == 1) return DType::Int8;
  if (kind == 'i' && size == 2) return DType::Int16;
  if (kind == 'i' && size == 4) return DType::Int32;
  if (kind == 'i' && size == 8) return DType::Int64;
  if (kind == 'u' && size == 1) return DType::UInt8;
  if (kind == 'u' && size == 2) return DType::UInt16;
  if (kind == 'u' && size == 4) return DType::UInt32;
  if (kind == 'u' && size == 8) return DType::UInt64;
  if (kind == 'b' && size == 1) return DType::Bool;
  // ml_dtypes' types (bfloat16, float8_e4m3fn, int4, ...): their numpy names are nnfuse's names,
  // and their in-memory layout (2 bytes for bfloat16, one byte for the others) is nnfuse's.
  const std::string name = dt.attr("name").cast<std::string>();
  if (kind == 'V') {
    const DType t = dtype_from_name(name);
    if (t == DType::BFloat16 || is_low_precision(t)) return t;
  }
  invalid(what + " has numpy dtype " + name + ", which nnfuse does not support");
}

py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::Float32: return py::dtype("float32");
    case DType::Float64: return py::dtype("float64");
    case DType::Float16: return py::dtype("float16");
    case DType::Int8: return py::dtype("int8");
    case DType::Int16: return py::dtype("int16");
    case DType::Int32: return py::dtype("int32");
    case DType::Int64: return py::dtype("int64");
    case DType::UInt8: return py::dtype("uint8");
    case DType::UInt16: return py::dtype("uint16");
    case DType::UInt32: return py::dtype("uint32");
    case DType::UInt64: return py::dtype("uint64");
    case DType::Bool: return py::dtype("bool");
    default: break;
  }
  if (t == DType::BFloat16 || is_low_precision(t)) {
    // numpy has none of these; ml_dtypes (a dependency of onnx) defines them with nnfuse's layout.
    py::module_ ml;
    try {
      ml = py::module_::import("ml_dtypes");
    } catch (const py::error_already_set&) {
      throw Error(ErrorKind::Unsupported, std::string("dtype ") + dtype_name(t) + " needs the ml_dtypes package (pip install ml_dtypes)");
    }
    return py::dtype::from_args(ml.attr(dtype_name(t)));
  }
  throw Error(ErrorKind::Unsupported, std::string("dtype ") + dtype_name(t) + " has no numpy equivalent");
}

// A numpy array as a tensor. C-contiguous, native-endian arrays whose data is 64-byte aligned (what
// generated SIMD kernels may assume) are shared, the array kept alive by the tensor; others are copied.
Tensor to_tensor(const std::string& name, const py::array& arr) {
  DType dt = dtype_of(arr.dtype(), "input '" + name + "'");
  std::vector<int64_t> shape(arr.shape(), arr.shape() + arr.ndim());
  bool native = arr.dtype().attr("isnative").cast<bool>();
  if (!native) invalid("input '" + name + "' is not in the machine's byte order (use arr.astype(arr.dtype.newbyteorder('=')))");
  bool contiguous = (arr.flags() & py::array::c_style) != 0;
  auto addr = reinterpret_cast<std::uintptr_t>(arr.data());
  if (contiguous && addr % 64 == 0) {
    PyObject* obj = arr.ptr();
    Py_INCREF(obj);
    std::shared_ptr<void> owner(obj, [](void* p) {
      py::gil_scoped_acquire gil;
      Py_DECREF(static_cast<PyObject*>(p));
    });
    return Tensor::wrap(dt, shape, const_cast<void*>(arr.data()), owner);
  }
  Tensor t(dt, shape);
  py::array c = py::array::ensure(arr, py::array::c_style);
  if (!c) throw py::error_already_set();
  if (t.nbytes()) std::memcpy(t.data(), c.data(), t.nbytes());
  return t;
}

// A tensor as a numpy array sharing its buffer: the array's base is a capsule owning a copy of the
// tensor handle, which keeps the buffer alive.
py::array to_numpy(const Tensor& t) {
  py::dtype dt = numpy_dtype(t.dtype());
  auto* keep = new Tensor(t);
  py::capsule base(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<ssize_t> shape(t.shape().begin(), t.shape().end());
  // Strides spelled out (row-major) for the same numpy-2 reason as in dtype_of.
  std::vector<ssize_t> strides(shape.size());
  ssize_t step = ssize_t(dtype_size(t.dtype()));
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= shape[i];
  }
  return py::array(dt, shape, strides, const_cast<void*>(t.data()), base);
}

// An output value for Python: an array, a list of arrays (a sequence) or None (an empty optional).
py::object to_python(const Tensor& t) {
  if (t.is_none()) return py::none();
  if (t.is_sequence()) {
    py::list l;
    for (auto& e : t.elements()) l.append(to_numpy(e));
    return std::move(l);
  }
  return to_numpy(t);
}

// An input value from Python, as the input is declared: for a sequence a list or tuple of arrays
// (an empty one of the declared element type), for an optional also None (empty); for a tensor
// anything numpy makes an array of (nested lists too).
Tensor to_value(const std::string& name, const py::handle& obj, const ValueInfo* info) {
  const std::string kind = info ? info->kind : "tensor";
  const DType elem = info ? info->dtype : DType::Undefined;
  if (obj.is_none() && kind.rfind("optional_", 0) == 0) return Tensor::none();
  const bool seq = kind == "sequence" || kind == "optional_sequence";
  if (seq && !(py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)))
    invalid("input '" + name + "' is " + (info ? info->type_str : kind) + ": give a list of arrays");
  if (seq) {
    std::vector<Tensor> el;
    size_t i = 0;
    for (auto item : obj) {
      py::array arr = py::array::ensure(item);
      if (!arr) {
        PyErr_Clear();
        invalid("input '" + name + "' element " + std::to_string(i) + " is not an array");
      }
      el.push_back(to_tensor(name + "[" + std::to_string(i++) + "]", arr));
    }
    const DType dt = el.empty() ? (elem == DType::Undefined ? DType::Float32 : elem) : el[0].dtype();
    return Tensor::sequence(dt, std::move(el));
  }
  py::array arr = py::array::ensure(obj);
  if (!arr) {
    PyErr_Clear();
    invalid("input '" + name + "' is not an array (got " + std::string(py::str(py::type::of(obj).attr("__name__"))) + ")");
  }
  return to_tensor(name, arr);
}

std::map<std::string, std::vector<int64_t>> shapes_arg(const py::object& shapes) {
  std::map<std::string, std::vector<int64_t>> r;
  if (!shapes.is_none()) r = shapes.cast<std::map<std::string, std::vector<int64_t>>>();
  return r;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "nnfuse's compiled core: bindings of the public C++ API. Use the `nnfuse` package instead.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      raise_error(e);
    }
  });

  py::class_<ValueInfo>(m, "ValueInfo", "A graph input or output: name, dtype and dims.")
      .def_readonly("name", &ValueInfo::name)
      .def_property_readonly("dtype", [](const ValueInfo& v) { return std::string(dtype_name(v.dtype)); })
      .def_readonly("has_shape", &ValueInfo::has_shape)
      .def_readonly("dims", &ValueInfo::dims)
      .def_readonly("dim_names", &ValueInfo::dim_names)
      .def_readonly("type_str", &ValueInfo::type_str)
      .def_readonly("kind", &ValueInfo::kind)
      .def("__repr__", [](const ValueInfo& v) { return "<ValueInfo " + v.name + ": " + v.type_str + ">"; });

  py::class_<Model>(m, "Model", "An ONNX model as nnfuse's graph IR.")
      .def_static("load", [](const std::string& path, const py::object& shapes) {
            LoadOptions o;
            o.input_shapes = shapes_arg(shapes);
            return Model::load(path, o);
          }, py::arg("path"), py::arg("shapes") = py::none())
      .def_static("load_bytes", [](const py::bytes& data, const py::object& shapes, const std::string& label) {
            LoadOptions o;
            o.input_shapes = shapes_arg(shapes);
            return Model::load_bytes(std::string(data), o, label);
          }, py::arg("data"), py::arg("shapes") = py::none(), py::arg("label") = "<bytes>")
      .def_static("zoo", &Model::zoo, py::arg("name"), py::arg("seed") = 0)
      .def("copy", [](const Model& self) { return Model(self); })
      .def_property_readonly("name", &Model::name)
      .def("inputs", &Model::inputs)
      .def("outputs", &Model::outputs)
      .def("num_operators", &Model::num_operators)
      .def("optimize", [](Model& self, const std::string& pipeline, const std::string& pipeline_file,
                          const std::vector<std::string>& rules, const std::string& target, bool profile) {
            OptimizeOptions o;
            o.pipeline = pipeline;
            o.pipeline_file = pipeline_file;
            o.rule_files = rules;
            o.target = target;
            o.profile = profile;
            py::gil_scoped_release nogil;
            return self.optimize(o);
          }, py::arg("pipeline") = "auto", py::arg("pipeline_file") = "", py::arg("rules") = std::vector<std::string>{},
          py::arg("target") = "host", py::arg("profile") = true)
      .def_property_readonly("optimized", &Model::optimized)
      .def("report", &Model::report)
      .def("to_bytes", [](const Model& self) { return py::bytes(self.to_bytes()); })
      .def("save", &Model::save, py::arg("path"))
      .def("export_rewritten", &Model::export_rewritten, py::arg("path"))
      .def("export_fused", &Model::export_fused, py::arg("path"))
      .def("to_dot", &Model::to_dot);

  py::class_<CompiledModel>(m, "CompiledModel", "A model compiled for one target.")
      .def("run", [](const CompiledModel& self, const py::dict& feeds, const std::vector<std::string>& output_names) {
            TensorMap in;
            const std::vector<ValueInfo> declared = self.inputs();
            for (auto item : feeds) {
              std::string name = py::str(item.first);
              const ValueInfo* info = nullptr;
              for (auto& v : declared)
                if (v.name == name) info = &v;
              in[name] = to_value(name, item.second, info);
            }
            TensorMap out;
            {
              py::gil_scoped_release nogil;
              out = self.run(in, output_names);
            }
            py::dict r;
            for (auto& [name, t] : out) r[py::str(name)] = to_python(t);
            return r;
          }, py::arg("feeds"), py::arg("output_names") = std::vector<std::string>{})
      .def("inputs", &CompiledModel::inputs)
      .def("outputs", &CompiledModel::outputs)
      .def_property_readonly("target", &CompiledModel::target)
      .def("info", [](const CompiledModel& self) {
        py::gil_scoped_release nogil;
        return self.info();
      })
      .def("wait", [](const CompiledModel& self) {
        py::gil_scoped_release nogil;
        self.wait();
      });

  m.def("compile", [](const Model& model, const std::string& target, int threads, const std::string& cache_dir, bool profile,
                       bool background, const std::string& precision) {
        CompileOptions o;
        o.target = target;
        o.threads = threads;
        o.cache_dir = cache_dir;
        o.profile = profile;
        o.background = background;
        o.precision = precision;
        py::gil_scoped_release nogil;
        return compile(model, o);
      }, py::arg("model"), py::arg("target") = "host", py::arg("threads") = 0, py::arg("cache_dir") = "", py::arg("profile") = true,
      py::arg("background") = false, py::arg("precision") = "fp32");

  m.def("version", &version);
  m.def("zoo_names", &zoo_names);
  m.def("targets", &targets);
  m.def("set_data_dir", &set_data_dir, py::arg("dir"));
  m.def("data_dir", &data_dir);
  m.def("cli_main", [](const std::vector<std::string>& argv) {
        std::vector<std::string> args = argv;
        std::vector<char*> ptrs;
        for (auto& a : args) ptrs.push_back(a.data());
        ptrs.push_back(nullptr);
        int rc;
        {
          py::gil_scoped_release nogil;
          rc = nnfuse::cli::cli_main(int(args.size()), ptrs.data());
          std::cout.flush();
          std::cerr.flush();
        }
        return rc;
      }, py::arg("argv"), "Runs the nnfuse command-line tool; argv[0] is the program name. Returns the exit code.");
}
