#pragma once
// Dense tensor data. Copies share the buffer (weights are never duplicated when a graph is copied
// or rewritten); clone() makes an independent copy. Buffers are 64-byte aligned for SIMD kernels.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/dtype.h"
#include "graph/low_precision.h"

namespace nnfuse {

using Shape = std::vector<int64_t>;

// The most dims a tensor may have (numpy's limit); a shape input longer than this is an error.
constexpr int64_t kMaxRank = 64;
int64_t shape_numel(const Shape& s);  // fails (Shape error) past 2^63 elements
// The largest tensor nnfuse allocates: NNFUSE_MAX_TENSOR_BYTES, or the machine's physical memory.
size_t max_tensor_bytes();
// The most iterations a Loop runs before it is stopped with an error (a loop whose condition never
// turns false would otherwise run for ever): NNFUSE_MAX_LOOP_ITERATIONS, or 10^8. A trip count M
// above it is fine while the condition ends the loop in time (exporters write M = 2^63-1).
int64_t max_loop_iterations();
// The most nodes a model may hold, every graph and subgraph and the inlined bodies of its local
// functions counted (a few kilobytes of nested function calls can expand to 10^12 nodes):
// NNFUSE_MAX_GRAPH_NODES, or 4,000,000.
int64_t max_graph_nodes();
// Bytes of a tensor of `shape`, failing (Shape error naming the shape) where they overflow or pass
// max_tensor_bytes(): checked before anything is allocated or planned.
size_t tensor_bytes_checked(DType dtype, const Shape& shape);
std::string shape_str(const Shape& s);  // "[1,3,224,224]"
// Row-major strides in elements.
std::vector<int64_t> shape_strides(const Shape& s);

// Hands memory that the heap holds free back to the OS (glibc: malloc_trim). Freed tensor arrays
// below the allocator's mmap threshold (which glibc raises up to 32 MiB as large blocks are freed)
// stay in the heap otherwise; called after a load frees a large set of weights. No-op elsewhere.
void return_free_memory_to_os();

class Tensor {
 public:
  Tensor() = default;
  // Zero-initialised tensor.
  Tensor(DType dtype, Shape shape);
  // Tensor whose elements are left uninitialised, for callers that write every element next
  // (copies, concatenations, elementwise results): it skips the zero-fill pass over big weights.
  // (The alignment padding after the last element is still zeroed.)
  static Tensor uninitialized(DType dtype, Shape shape);

  template <class T>
  static Tensor from_vector(Shape shape, const std::vector<T>& values);
  template <class T>
  static Tensor scalar(T value) { return from_vector<T>({}, {value}); }
  // Wraps external memory without copying; `owner` keeps it alive.
  static Tensor wrap(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner);
  // A sequence of tensors (ONNX seq(tensor)): elem_dtype is its element type (every element
  // has it; an empty sequence still has one). An optional holding a value is that value; an
  // empty one is none().
  static Tensor sequence(DType elem_dtype, std::vector<Tensor> elements);
  static Tensor none();

  // Holds a tensor (not a sequence, not an empty optional). Kernels of tensor ops only ever see
  // tensors: the interpreter checks before calling them.
  bool is_tensor() const { return !seq_ && !none_; }
  bool is_sequence() const { return bool(seq_); }
  bool is_none() const { return none_; }
  const std::vector<Tensor>& elements() const;  // a sequence's; Invalid error otherwise
  std::string kind_str() const;  // "a tensor float32[2,3]", "a sequence of 3 float32", "an empty optional"

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t rank() const { return int64_t(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_[size_t(i < 0 ? i + rank() : i)]; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool empty_data() const { return !data_; }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  // The buffer, to be rewritten in place, or null when it may be seen elsewhere: another Tensor
  // shares it (a copy of this one: a copied graph, the caller's original model, a reshaped view)
  // or nnfuse did not allocate it (wrap: a NumPy array, a mapped file). A pass that replaces a
  // weight by a same-size function of itself (folding a per-channel scale) writes through it
  // instead of allocating and faulting in a second weight. Each call moves generation() on:
  // hashes that identify big weights by their buffer see the change.
  void* exclusive_raw();
  uint64_t generation() const { return generation_; }
  // Typed access; throws Invalid if T does not match dtype().
  template <class T> T* data();
  template <class T> const T* data() const;

  // Same data, new shape (numel must match).
  Tensor reshaped(Shape shape) const;
  Tensor clone() const;
  // Element i converted to double / int64 (any numeric dtype). For scalars and shape tensors.
  double as_double(int64_t i = 0) const;
  int64_t as_int(int64_t i = 0) const;
  // All elements as int64 (shape-like tensors).
  std::vector<int64_t> to_int_vector() const;
  std::vector<float> to_float_vector() const;
  std::vector<double> to_double_vector() const;  // every element as_double
  // Converts to another dtype (numeric conversions with C semantics; float->bool is x != 0).
  // The low-precision types convert as ONNX's Cast does (graph/low_precision.h): `lp` says how
  // floats saturate and round into float8.
  Tensor cast(DType to, const LowPrecisionCast& lp = {}) const;
  bool same_data(const Tensor& other) const { return data_ == other.data_; }
  // Bitwise equality of dtype, shape and contents.
  bool equals(const Tensor& other) const;

 private:
  DType dtype_ = DType::Undefined;
  Shape shape_;
  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
  bool allocated_here_ = false;  // owner_ is a buffer this class allocated (not wrap())
  uint64_t generation_ = 0;      // in-place rewrites through exclusive_raw()
  std::shared_ptr<const std::vector<Tensor>> seq_;  // set: a sequence (dtype_ its element type)
  bool none_ = false;                               // an empty optional
  void check(DType want) const;
  struct NoFill {};
  Tensor(DType dtype, Shape shape, NoFill);
};

template <class T>
Tensor Tensor::from_vector(Shape shape, const std::vector<T>& values) {
  Tensor t(DTypeOf<T>::value, std::move(shape));
  if (int64_t(values.size()) != t.numel()) fail(ErrorKind::Invalid, "Tensor::from_vector: " + std::to_string(values.size()) + " values for shape " + shape_str(t.shape()));
  T* p = static_cast<T*>(t.raw());
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}
template <class T> T* Tensor::data() {
  check(DTypeOf<T>::value);
  return static_cast<T*>(data_);
}
template <class T> const T* Tensor::data() const {
  check(DTypeOf<T>::value);
  return static_cast<const T*>(data_);
}

}  // namespace nnfuse
