#include "graph/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include <unistd.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace nnfuse {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  bool overflow = false;
  for (auto d : s) overflow |= __builtin_mul_overflow(n, d, &n);
  // A product past 2^63 wrapped around to a small or zero count: a model that asks for such a
  // tensor gets an error, not a tiny buffer or a reduction over nothing.
  if (overflow) fail(ErrorKind::Shape, "shape " + shape_str(s) + " has more than 2^63 elements");
  return n;
}

// The largest tensor a Tensor allocates: NNFUSE_MAX_TENSOR_BYTES, or the machine's physical
// memory. Larger requests are refused before allocating: with overcommit, malloc grants them and
// the zero fill that follows is killed by the OOM killer instead of failing cleanly.
size_t max_tensor_bytes() {
  static const size_t cap = [] {
    if (const char* e = std::getenv("NNFUSE_MAX_TENSOR_BYTES"); e && *e) {
      char* end = nullptr;
      unsigned long long v = std::strtoull(e, &end, 10);
      if (end && *end == 0 && v > 0) return size_t(v);
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : size_t(1) << 40;
  }();
  return cap;
}

namespace {
// A positive whole number from the environment variable `name`, else `fallback` (read once per
// limit: the callers keep it in a static).
int64_t env_limit(const char* name, int64_t fallback) {
  if (const char* e = std::getenv(name); e && *e) {
    char* end = nullptr;
    long long v = std::strtoll(e, &end, 10);
    if (end && *end == 0 && v > 0) return int64_t(v);
  }
  return fallback;
}
}  // namespace

int64_t max_loop_iterations() {
  static const int64_t cap = env_limit("NNFUSE_MAX_LOOP_ITERATIONS", 100000000);
  return cap;
}

int64_t max_graph_nodes() {
  static const int64_t cap = env_limit("NNFUSE_MAX_GRAPH_NODES", 4000000);
  return cap;
}

size_t tensor_bytes_checked(DType dtype, const Shape& shape) {
  uint64_t bytes = dtype_size(dtype);
  bool overflow = false;
  for (auto d : shape) overflow |= __builtin_mul_overflow(bytes, uint64_t(d), &bytes);
  if (overflow || bytes > max_tensor_bytes())
    fail(ErrorKind::Shape, "tensor of shape " + shape_str(shape) + " (" + dtype_name(dtype) + ") needs " +
                               (overflow ? std::string("more than 2^64") : std::to_string(bytes)) + " bytes, over the limit of " +
                               std::to_string(max_tensor_bytes()) + " (physical memory, or NNFUSE_MAX_TENSOR_BYTES)");
  return size_t(bytes);
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

std::vector<int64_t> shape_strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int64_t i = int64_t(s.size()) - 2; i >= 0; --i) st[size_t(i)] = st[size_t(i + 1)] * s[size_t(i + 1)];
  return st;
}

void return_free_memory_to_os() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

Tensor::Tensor(DType dtype, Shape shape) : Tensor(dtype, std::move(shape), NoFill{}) {
  std::memset(data_, 0, nbytes());
}

Tensor Tensor::uninitialized(DType dtype, Shape shape) { return Tensor(dtype, std::move(shape), NoFill{}); }

Tensor::Tensor(DType dtype, Shape shape, NoFill) : dtype_(dtype), shape_(std::move(shape)) {
  for (auto d : shape_)
    if (d < 0) fail(ErrorKind::Shape, "tensor shape " + shape_str(shape_) + " has a negative dimension");
  size_t es = dtype_size(dtype);
  if (es == 0) fail(ErrorKind::Unsupported, std::string("tensors of dtype ") + dtype_name(dtype) + " are not supported");
  const size_t bytes = tensor_bytes_checked(dtype, shape_);
  size_t alloc = (bytes + 63) / 64 * 64;
  if (alloc == 0) alloc = 64;
  // Plain malloc with 64 bytes of slack, aligned by hand, rather than aligned_alloc: glibc's
  // heap hands a just-freed block back to the next malloc of the same size far more often than
  // to an aligned request (which needs more than the freed chunk holds). Passes that replace a
  // weight by a new one of the same size (folding a scale or a BatchNormalization into it) then
  // reuse the old weight's pages instead of faulting in fresh ones.
  void* block = std::malloc(alloc + 64);
  if (!block) fail(ErrorKind::Runtime, "out of memory allocating " + std::to_string(bytes) + " bytes");
  auto* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(block) + 63) & ~uintptr_t(63));
  std::memset(p + bytes, 0, alloc - bytes);  // padding: never garbage
  owner_ = std::shared_ptr<void>(block, [](void* q) { std::free(q); });
  data_ = p;
  allocated_here_ = true;
}

void* Tensor::exclusive_raw() {
  // use_count() is exact here: every Tensor sharing the buffer holds owner_, and graphs are not
  // edited from two threads at once.
  if (!data_ || !allocated_here_ || owner_.use_count() != 1) return nullptr;
  ++generation_;
  return data_;
}

Tensor Tensor::wrap(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.owner_ = std::move(owner);
  return t;
}

Tensor Tensor::sequence(DType elem_dtype, std::vector<Tensor> elements) {
  for (size_t i = 0; i < elements.size(); ++i) {
    if (!elements[i].is_tensor())
      fail(ErrorKind::Invalid, "sequence element " + std::to_string(i) + " is " + elements[i].kind_str() + ", not a tensor");
    if (elements[i].dtype() != elem_dtype)
      fail(ErrorKind::Invalid, "sequence of " + std::string(dtype_name(elem_dtype)) + ": element " + std::to_string(i) + " is " +
                                   dtype_name(elements[i].dtype()));
  }
  Tensor t;
  t.dtype_ = elem_dtype;
  t.seq_ = std::make_shared<const std::vector<Tensor>>(std::move(elements));
  return t;
}

Tensor Tensor::none() {
  Tensor t;
  t.none_ = true;
  return t;
}

const std::vector<Tensor>& Tensor::elements() const {
  if (!seq_) fail(ErrorKind::Invalid, "value is " + kind_str() + ", not a sequence");
  return *seq_;
}

std::string Tensor::kind_str() const {
  if (none_) return "an empty optional";
  if (seq_) return "a sequence of " + std::to_string(seq_->size()) + " " + dtype_name(dtype_);
  return std::string("a tensor ") + dtype_name(dtype_) + shape_str(shape_);
}

void Tensor::check(DType want) const {
  if (want != dtype_)
    fail(ErrorKind::Invalid, std::string("tensor holds ") + dtype_name(dtype_) + ", accessed as " + dtype_name(want));
}

Tensor Tensor::reshaped(Shape shape) const {
  if (shape_numel(shape) != numel())
    fail(ErrorKind::Shape, "cannot reshape " + shape_str(shape_) + " to " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = uninitialized(dtype_, shape_);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

namespace {
template <class T> double to_d(T v) { return double(v); }
template <> double to_d(Half v) { return half_to_float(v.bits); }
template <> double to_d(BFloat16 v) { return bf16_to_float(v.bits); }
template <class T> T from_d(double v) { return T(v); }
template <> bool from_d(double v) { return v != 0; }
template <> Half from_d(double v) { return Half{float_to_half(float(v))}; }
template <> BFloat16 from_d(double v) { return BFloat16{float_to_bf16(float(v))}; }
}  // namespace

double Tensor::as_double(int64_t i) const {
  if (i < 0 || i >= numel()) fail(ErrorKind::Invalid, "element " + std::to_string(i) + " out of range for " + shape_str(shape_));
  if (dtype_is_low_precision(dtype_)) return low_precision_to_double(dtype_, static_cast<const uint8_t*>(data_)[i]);
  return dispatch_dtype(dtype_, [&](auto tag) -> double {
    using T = decltype(tag);
    return to_d(static_cast<const T*>(data_)[i]);
  });
}

int64_t Tensor::as_int(int64_t i) const {
  if (dtype_ == DType::Int64) {
    if (i < 0 || i >= numel()) fail(ErrorKind::Invalid, "element out of range");
    return static_cast<const int64_t*>(data_)[i];
  }
  // A float read as an integer (a size or index held in a float tensor): NaN and infinities have no
  // integer value (converting them is undefined behaviour; found by fuzz_onnx_import), and values
  // past int64 saturate so that the size checks downstream refuse them.
  const double v = as_double(i);
  if (std::isnan(v) || std::isinf(v))
    fail(ErrorKind::Invalid, "element " + std::to_string(i) + " is " + (std::isnan(v) ? "NaN" : v > 0 ? "inf" : "-inf") +
                                 " where an integer is expected");
  constexpr double kTwo63 = 9223372036854775808.0;  // int64's range is [-2^63, 2^63)
  if (v >= kTwo63) return std::numeric_limits<int64_t>::max();
  if (v <= -kTwo63) return std::numeric_limits<int64_t>::min();
  return int64_t(v);
}

std::vector<int64_t> Tensor::to_int_vector() const {
  std::vector<int64_t> r(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) r[size_t(i)] = as_int(i);
  return r;
}

std::vector<double> Tensor::to_double_vector() const {
  std::vector<double> r(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) r[size_t(i)] = as_double(i);
  return r;
}

std::vector<float> Tensor::to_float_vector() const {
  std::vector<float> r(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) r[size_t(i)] = float(as_double(i));
  return r;
}

namespace {

// Casts from or to a low-precision type. From one: its exact values (int64 for the integer
// types, double for the float ones) cast on. To an integer one: integers wrap around, floats are
// truncated towards zero first (NaN becomes 0). To a float one: rounded from the double value.
Tensor cast_low_precision(const Tensor& x, DType to, const LowPrecisionCast& lp) {
  const DType from = x.dtype();
  const int64_t n = x.numel();
  if (dtype_is_low_precision(from)) {
    const bool integral = low_precision_is_integer(from);
    Tensor vals = Tensor::uninitialized(integral ? DType::Int64 : DType::Float64, x.shape());
    const auto* codes = static_cast<const uint8_t*>(x.raw());
    for (int64_t i = 0; i < n; ++i) {
      const double v = low_precision_to_double(from, codes[i]);
      if (integral) vals.data<int64_t>()[i] = int64_t(v);
      else vals.data<double>()[i] = v;
    }
    return vals.dtype() == to ? vals : vals.cast(to, lp);
  }
  Tensor out = Tensor::uninitialized(to, x.shape());
  auto* codes = static_cast<uint8_t*>(out.raw());
  if (low_precision_is_integer(to) && (dtype_is_integer(from) || from == DType::Bool)) {
    const Tensor iv = x.cast(DType::Int64);  // two's complement keeps the low bits of uint64
    for (int64_t i = 0; i < n; ++i) codes[i] = wrap_to_low_precision_int(to, iv.data<int64_t>()[i]);
    return out;
  }
  const Tensor dv = x.cast(DType::Float64);
  const double* d = dv.data<double>();
  for (int64_t i = 0; i < n; ++i) {
    if (low_precision_is_integer(to)) {
      const double t = std::isnan(d[i]) ? 0.0 : std::trunc(std::clamp(d[i], -9.2e18, 9.2e18));
      codes[i] = wrap_to_low_precision_int(to, int64_t(t));
    } else {
      codes[i] = float_to_low_precision(to, d[i], lp);
    }
  }
  return out;
}

}  // namespace

Tensor Tensor::cast(DType to, const LowPrecisionCast& lp) const {
  if (to == dtype_) return clone();
  if (dtype_is_low_precision(to) || dtype_is_low_precision(dtype_)) return cast_low_precision(*this, to, lp);
  Tensor out = uninitialized(to, shape_);  // every element written below
  int64_t n = numel();
  dispatch_dtype(dtype_, [&](auto src_tag) {
    using S = decltype(src_tag);
    const S* s = static_cast<const S*>(data_);
    dispatch_dtype(to, [&](auto dst_tag) {
      using D = decltype(dst_tag);
      D* d = static_cast<D*>(out.raw());
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<S, D>) {
          d[i] = s[i];
        } else if constexpr (std::is_arithmetic_v<S> && std::is_arithmetic_v<D>) {
          // SZ is S, written dependent on D: clang checks an expression that depends on neither
          // lambda's parameter even in a discarded branch, where S(0) does not exist for Half.
          using SZ = std::conditional_t<std::is_same_v<D, D>, S, void>;
          if constexpr (std::is_same_v<D, bool>) d[i] = s[i] != SZ(0);
          else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
            // NaN and out-of-range values are undefined in C++; saturate them deterministically.
            double v = double(SZ(s[i]));
            d[i] = v != v ? D(0) : (v >= double(std::numeric_limits<D>::max()) ? std::numeric_limits<D>::max()
                                     : v <= double(std::numeric_limits<D>::lowest()) ? std::numeric_limits<D>::lowest() : D(v));
          } else d[i] = D(s[i]);
        } else {
          d[i] = from_d<D>(to_d(s[i]));
        }
      }
    });
  });
  return out;
}

bool Tensor::equals(const Tensor& o) const {
  if (none_ || o.none_) return none_ == o.none_;
  if (seq_ || o.seq_) {
    if (!seq_ || !o.seq_ || dtype_ != o.dtype_ || seq_->size() != o.seq_->size()) return false;
    for (size_t i = 0; i < seq_->size(); ++i)
      if (!(*seq_)[i].equals((*o.seq_)[i])) return false;
    return true;
  }
  return dtype_ == o.dtype_ && shape_ == o.shape_ && (nbytes() == 0 || std::memcmp(data_, o.data_, nbytes()) == 0);
}

}  // namespace nnfuse
