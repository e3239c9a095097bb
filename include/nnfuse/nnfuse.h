#pragma once
// nnfuse's public C++ API: load an ONNX model, optimize it (rewrite, classify, plan fusion),
// compile it for a target and run it.
//
//   #include <nnfuse/nnfuse.h>
//   nnfuse::api::Model model = nnfuse::api::Model::load("resnet18.onnx");
//   std::string report = model.optimize({.target = "reference"});   // the optimize report (JSON)
//   nnfuse::api::CompiledModel compiled = nnfuse::api::compile(model, {.target = "reference"});
//   nnfuse::api::TensorMap out = compiled.run({{"input", input_tensor}});
//
// This header is the whole stable surface: it includes only the standard library, and the library's
// internals (graph IR, passes, planner, kernels) stay behind pointers to implementation. The names
// live in nnfuse::api because the internal library already uses nnfuse::Graph, nnfuse::Tensor, ...
// Every failure is thrown as nnfuse::api::Error naming the file, node and op at fault.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace nnfuse::api {

// ---------------------------------------------------------------------------------------------
// Errors

enum class ErrorKind {
  Parse,        // rule/pipeline/model file syntax (file:line:col)
  Model,        // malformed model: bad protobuf, dangling edge, cycle, wrong arity, ...
  Unsupported,  // op, opset, dtype or target not implemented
  Shape,        // shape or dtype inference failed / inconsistent
  Invalid,      // invalid argument (bad feed, unknown target or pipeline, ...)
  Runtime,      // failure while executing (kernel, toolchain)
  Io            // file cannot be read or written
};

// "parse", "model", "unsupported", "shape", "invalid", "runtime", "io".
const char* error_kind_name(ErrorKind k);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what, std::string detail = "", std::string file = "", int line = 0, int col = 0,
        std::string node = "", std::string op = "", int opset = 0);
  ErrorKind kind() const { return kind_; }
  const std::string& detail() const { return detail_; }  // the message without the location prefix
  const std::string& file() const { return file_; }
  int line() const { return line_; }  // 1-based; 0 = unknown
  int col() const { return col_; }    // 1-based; 0 = unknown
  const std::string& node() const { return node_; }
  const std::string& op() const { return op_; }
  int opset() const { return opset_; }

 private:
  ErrorKind kind_;
  std::string detail_, file_;
  int line_, col_;
  std::string node_, op_;
  int opset_;
};

// ---------------------------------------------------------------------------------------------
// Tensors

// Element types; the codes are ONNX's TensorProto.DataType.
enum class DType : int32_t {
  Undefined = 0, Float32 = 1, UInt8 = 2, Int8 = 3, UInt16 = 4, Int16 = 5, Int32 = 6, Int64 = 7,
  String = 8, Bool = 9, Float16 = 10, Float64 = 11, UInt32 = 12, UInt64 = 13, BFloat16 = 16,
  // Low-precision storage types, one byte per element as in ml_dtypes (int4/int2 sign-extended,
  // float4 in the low nibble); only data movement, Cast and (De)QuantizeLinear take them.
  Float8E4M3FN = 17, Float8E4M3FNUZ = 18, Float8E5M2 = 19, Float8E5M2FNUZ = 20, UInt4 = 21, Int4 = 22,
  Float4E2M1 = 23, Float8E8M0 = 24, UInt2 = 25, Int2 = 26,
};
size_t dtype_size(DType t);       // bytes per element (0 for String/Undefined)
const char* dtype_name(DType t);  // numpy spelling: "float32", "int64", "bool", ...
DType dtype_from_name(const std::string& name);  // Undefined when unknown

template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::Float32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::Float64; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::Int8; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::UInt8; };
template <> struct DTypeOf<int16_t> { static constexpr DType value = DType::Int16; };
template <> struct DTypeOf<uint16_t> { static constexpr DType value = DType::UInt16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct DTypeOf<uint32_t> { static constexpr DType value = DType::UInt32; };
template <> struct DTypeOf<uint64_t> { static constexpr DType value = DType::UInt64; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::Bool; };

// A dense row-major tensor. Copies share the buffer. Buffers it allocates are 64-byte aligned.
class Tensor {
 public:
  Tensor() = default;
  // Zero-initialised tensor of the given type and shape.
  Tensor(DType dtype, std::vector<int64_t> shape);
  // Wraps caller memory without copying; `owner` (may be empty) is kept alive as long as any copy.
  static Tensor wrap(DType dtype, std::vector<int64_t> shape, void* data, std::shared_ptr<void> owner = {});
  template <class T>
  static Tensor from_vector(std::vector<int64_t> shape, const std::vector<T>& values) {
    Tensor t(DTypeOf<T>::value, std::move(shape));
    if (int64_t(values.size()) != t.numel())
      throw Error(ErrorKind::Invalid, "Tensor::from_vector: " + std::to_string(values.size()) + " values for " +
                                          std::to_string(t.numel()) + " elements");
    T* p = t.data<T>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
    return t;
  }

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  void* data() { return data_; }
  const void* data() const { return data_; }
  // Typed access; throws Invalid when T does not match dtype().
  template <class T> T* data() { check(DTypeOf<T>::value); return static_cast<T*>(data_); }
  template <class T> const T* data() const { check(DTypeOf<T>::value); return static_cast<const T*>(data_); }
  // The owner of the buffer (what keeps data() alive).
  const std::shared_ptr<void>& owner() const { return owner_; }

  // Sequence and optional values (ONNX seq(tensor), optional(...)): a sequence holds tensors of
  // one element type (dtype() is that type); an optional holding a value is that value, an empty
  // one is none(). They run on the "reference" target.
  static Tensor sequence(DType elem_dtype, std::vector<Tensor> elements);
  static Tensor none();
  bool is_tensor() const { return !elements_ && !none_; }
  bool is_sequence() const { return bool(elements_); }
  bool is_none() const { return none_; }
  const std::vector<Tensor>& elements() const;  // a sequence's; throws Invalid otherwise

 private:
  DType dtype_ = DType::Undefined;
  std::vector<int64_t> shape_;
  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
  std::shared_ptr<const std::vector<Tensor>> elements_;
  bool none_ = false;
  void check(DType want) const;
};

using TensorMap = std::map<std::string, Tensor>;

// A graph input or output: name, element type and dims (-1 where the dim is symbolic or unknown;
// `dim_names` then holds its symbol, "" otherwise). `has_shape` is false when even the rank is unknown.
struct ValueInfo {
  std::string name;
  DType dtype = DType::Undefined;
  bool has_shape = false;
  std::vector<int64_t> dims;
  std::vector<std::string> dim_names;
  std::string type_str;  // "float32[1,3,224,224]", "float32[N,3,224,224]", "seq(float32[?])"
  // "tensor", "sequence", "optional_tensor" or "optional_sequence" (dtype and dims then describe
  // the tensors held).
  std::string kind = "tensor";
};

// ---------------------------------------------------------------------------------------------
// Models

struct LoadOptions {
  std::map<std::string, std::vector<int64_t>> input_shapes;  // bind dynamic input dims
};

struct OptimizeOptions {
  std::string pipeline = "auto";        // auto | none | NAME (a shipped pipeline: full, residual_cnn, ...)
  std::string pipeline_file;            // a pipeline file, instead of `pipeline`
  std::vector<std::string> rule_files;  // user rule files on top of the shipped ones
  std::string target = "host";          // host, x86-avx2, x86-avx512, arm-neon, mali-opencl, volta-cuda, reference
  bool profile = true;                  // false: settle undecided fusions by the cost model alone
};

class CompiledModel;
struct CompileOptions;

// An ONNX model as nnfuse's graph IR. Copies are deep (optimizing a copy leaves the original alone).
class Model {
 public:
  static Model load(const std::string& path, const LoadOptions& opt = {});
  // From serialized ONNX bytes (`label` names it in error messages).
  static Model load_bytes(const std::string& bytes, const LoadOptions& opt = {}, const std::string& label = "<bytes>");
  // A model of the built-in zoo (see zoo_names()), with seeded random weights.
  static Model zoo(const std::string& name, uint64_t seed = 0);

  Model(const Model& other);
  Model& operator=(const Model& other);
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  std::string name() const;
  std::vector<ValueInfo> inputs() const;   // runtime inputs (initializers excluded)
  std::vector<ValueInfo> outputs() const;
  size_t num_operators() const;            // Constant nodes excluded

  // Rewrites, classifies and plans fusion in place; returns the optimize report as a JSON object text
  // (fields: model, ops_before, ops_after_rewrite, kernels, network_class, pipeline, passes, blocks,
  // rules_fired, flops_before, flops_after, ...). Optimizing twice re-optimizes the rewritten graph.
  std::string optimize(const OptimizeOptions& opt = {});
  bool optimized() const;
  std::string report() const;  // the last optimize report ("{}" before optimize)

  std::string to_bytes() const;                 // ONNX bytes of the current graph
  void save(const std::string& path) const;     // the current graph (after optimize: the rewritten one)
  void export_rewritten(const std::string& path) const;  // the graph after rewriting, before fusion
  void export_fused(const std::string& path) const;      // fused blocks as nnfuse-domain function nodes
  std::string to_dot() const;                   // Graphviz picture of the fusion blocks

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  explicit Model(std::unique_ptr<Impl> impl);
  friend CompiledModel compile(const Model&, const CompileOptions&);
};

struct CompileOptions {
  std::string target = "host";  // reference = the fusion plan run block by block with reference kernels
  int threads = 0;              // 0: physical cores
  std::string cache_dir;        // kernel cache; "" = $NNFUSE_CACHE_DIR or ~/.cache/nnfuse/kernels
  // Time each convolution's candidate algorithms (direct, Winograd) on this machine and keep the
  // fastest (timings cached per machine and layer shape); false: the cost model, deterministic.
  bool profile = true;
  // Return at once and build the generated kernels in a background thread: until the kernels for
  // a run's input shapes are ready, the run is served by the reference kernels (same fusion plan,
  // same results within float tolerance, much slower), then by the compiled ones. A model with
  // dynamic input dims starts a build for each new set of input shapes at its first run; builds
  // run one at a time, and choose conv algorithms by the cost model (as profile = false: timing
  // them while runs load the same cores would measure the load). A failed build is raised by
  // every later run() of its input shapes and by wait(). Destroying the last copy of the
  // CompiledModel waits for builds still going.
  bool background = false;
  // GPU targets: "fp32" (default), or "fp16": MatMul/Gemm/Conv tiles on tensor cores with fp16
  // operands and fp32 accumulation (volta-cuda, GPUs of sm_70 and later; about 1e-3 relative
  // error per product instead of 1e-6). Other targets take "fp32" only.
  std::string precision = "fp32";
};

// A model compiled for one target. run() may be called from several threads at once.
class CompiledModel {
 public:
  // Feeds by input name. Checks names, dtypes and dims against the model's inputs (Invalid errors
  // naming the input). `output_names` empty: every graph output.
  TensorMap run(const TensorMap& feeds, const std::vector<std::string>& output_names = {}) const;
  std::vector<ValueInfo> inputs() const;
  std::vector<ValueInfo> outputs() const;
  std::string target() const;
  std::string info() const;  // JSON object text: target, kernels, ...; "background": build states
  // Background builds (CompileOptions::background): waits until every build started so far has
  // finished; rethrows the first that failed. Returns at once otherwise.
  void wait() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  friend CompiledModel compile(const Model&, const CompileOptions&);
};

// Compiles the model as it stands (optimized: by its fusion plan; not optimized: one kernel per op).
CompiledModel compile(const Model& model, const CompileOptions& opt = {});

// ---------------------------------------------------------------------------------------------
// Misc

std::string version();
std::vector<std::string> zoo_names();
std::vector<std::string> targets();  // every target name the library knows
// Where the shipped rules/ and rules/pipelines/ are found: $NNFUSE_DATA_DIR, else the installed
// package's share/nnfuse, else the source tree the library was built from. set_data_dir() sets
// $NNFUSE_DATA_DIR for this process.
void set_data_dir(const std::string& dir);
std::string data_dir();

}  // namespace nnfuse::api

// An installed package tells the library where its rules are (nnfuseConfig.cmake defines this macro
// on nnfuse::nnfuse), so applications find the shipped pipelines without setting anything.
#if defined(NNFUSE_INSTALLED_DATA_DIR)
namespace nnfuse::api::detail {
void set_default_data_dir(const char* dir);
inline const bool installed_data_dir_registered = (set_default_data_dir(NNFUSE_INSTALLED_DATA_DIR), true);
}  // namespace nnfuse::api::detail
#endif
