// MatMul, Gemm, MatMulInteger, QLinearMatMul, Det, Einsum (the quantize ops: ops_nn_quantize.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "graph/ops_nn_internal.h"

namespace nnfuse::nn {
namespace {

// ---------------------------------------------------------------- MatMul
InferResult infer_matmul_like(const InferContext& c, DType out_dtype, size_t b_index = 1) {
  const TensorType& a = c.input(0);
  const TensorType& b = c.input(b_index);
  if (!a.has_shape || !b.has_shape) return infer_one(TensorType::unknown_shape(out_dtype));
  if (a.rank() == 0 || b.rank() == 0) c.error(c.node.op_type + ": operands must have rank >= 1");
  std::vector<Dim> ad = a.dims, bd = b.dims;
  bool a1 = ad.size() == 1, b1 = bd.size() == 1;
  if (a1) ad.insert(ad.begin(), Dim(1));
  if (b1) bd.push_back(Dim(1));
  const Dim& ka = ad[ad.size() - 1];
  const Dim& kb = bd[bd.size() - 2];
  if (ka.known() && kb.known() && ka.value != kb.value)
    c.error(c.node.op_type + ": A " + a.str() + " has " + std::to_string(ka.value) + " columns but B " + b.str() + " has " +
            std::to_string(kb.value) + " rows");
  std::vector<Dim> out = broadcast_dims({std::vector<Dim>(ad.begin(), ad.end() - 2), std::vector<Dim>(bd.begin(), bd.end() - 2)}, c);
  if (!a1) out.push_back(ad[ad.size() - 2]);
  if (!b1) out.push_back(bd.back());
  return infer_one(TensorType(out_dtype, out));
}

// numpy matmul of two tensors of element type T.
template <class T>
Tensor matmul_typed(const KernelContext& c, const Tensor& A, const Tensor& B) {
  Shape as = A.shape(), bs = B.shape();
  if (as.empty() || bs.empty()) c.error("MatMul operands must have rank >= 1");
  bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  int64_t M = as[as.size() - 2], K = as.back(), K2 = bs[bs.size() - 2], N = bs.back();
  if (K != K2)
    c.error("A " + shape_str(A.shape()) + " has " + std::to_string(K) + " columns but B " + shape_str(B.shape()) + " has " +
            std::to_string(K2) + " rows");
  Shape ba(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  Shape batch;
  try {
    batch = broadcast_shapes({ba, bb});
  } catch (const Error&) {
    c.error("batch dimensions of " + shape_str(A.shape()) + " and " + shape_str(B.shape()) + " cannot broadcast");
  }
  Shape out_shape = batch;
  if (!a1) out_shape.push_back(M);
  if (!b1) out_shape.push_back(N);
  Tensor out(DTypeOf<T>::value, out_shape);
  const T* a = A.data<T>();
  const T* b = B.data<T>();
  T* o = out.data<T>();
  if (shape_numel(bb) == 1) {
    // B is one matrix: all of A's batch folds into the rows of a single GEMM.
    gemm<T>(shape_numel(ba) * M, N, K, a, K, 1, b, N, 1, o, N, false);
    return out;
  }
  for_each_broadcast(batch, {ba, bb}, [&](int64_t i, const int64_t* off) {
    gemm<T>(M, N, K, a + off[0] * M * K, K, 1, b + off[1] * K * N, N, 1, o + i * M * N, N, false);
  });
  return out;
}

std::vector<Tensor> matmul_kernel(const KernelContext& c) {
  DType dt = c.input(0).dtype();
  if (c.input(1).dtype() != dt)
    c.error(std::string("MatMul operands have different dtypes ") + dtype_name(dt) + " and " + dtype_name(c.input(1).dtype()));
  switch (dt) {
    case DType::Int32: return {matmul_typed<int32_t>(c, c.input(0), c.input(1))};
    case DType::Int64: return {matmul_typed<int64_t>(c, c.input(0), c.input(1))};
    case DType::UInt32: return {matmul_typed<uint32_t>(c, c.input(0), c.input(1))};
    case DType::UInt64: return {matmul_typed<uint64_t>(c, c.input(0), c.input(1))};
    default: break;
  }
  return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) -> std::vector<Tensor> {
    using T = decltype(tag);
    return {matmul_typed<T>(c, *in[0], *in[1])};
  });
}

double matmul_flops(const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
  if (ins.size() < 1 || !ins[0].is_static() || outs.empty()) return 0;
  double K = double(ins[0].dims.back().value);
  return 2.0 * numel_or0(outs[0]) * K;
}

// ---------------------------------------------------------------- Gemm
InferResult infer_gemm(const InferContext& c) {
  const TensorType& a = c.input(0);
  const TensorType& b = c.input(1);
  if (!a.has_shape || !b.has_shape) return infer_one(TensorType::unknown_shape(a.dtype));
  if (a.rank() != 2 || b.rank() != 2) c.error("Gemm: A " + a.str() + " and B " + b.str() + " must be 2-D");
  bool ta = c.node.attrs.get_int("transA", 0) != 0, tb = c.node.attrs.get_int("transB", 0) != 0;
  Dim M = ta ? a.dims[1] : a.dims[0], Ka = ta ? a.dims[0] : a.dims[1];
  Dim Kb = tb ? b.dims[1] : b.dims[0], N = tb ? b.dims[0] : b.dims[1];
  if (Ka.known() && Kb.known() && Ka.value != Kb.value)
    c.error("Gemm: A " + a.str() + (ta ? " (transposed)" : "") + " has K=" + Ka.str() + " but B " + b.str() +
            (tb ? " (transposed)" : "") + " has K=" + Kb.str());
  if (c.has_input(2) && c.inputs[2].has_shape) {
    const auto& cd = c.inputs[2].dims;
    if (cd.size() > 2) c.error("Gemm: C " + c.inputs[2].str() + " has rank > 2");
    std::vector<Dim> target{M, N};
    for (size_t i = 0; i < cd.size(); ++i) {
      const Dim& x = cd[i];
      const Dim& t = target[2 - cd.size() + i];
      if (x.known() && t.known() && x.value != 1 && x.value != t.value)
        c.error("Gemm: C " + c.inputs[2].str() + " does not broadcast to [" + M.str() + "," + N.str() + "]");
    }
  }
  return infer_one(TensorType(a.dtype, {M, N}));
}

template <class T>
Tensor gemm_typed(const KernelContext& c, const Tensor& A, const Tensor& B, const Tensor* Cm) {
  bool ta = c.node.attrs.get_int("transA", 0) != 0, tb = c.node.attrs.get_int("transB", 0) != 0;
  double alpha = c.node.attrs.get_float("alpha", 1.0f), beta = c.node.attrs.get_float("beta", 1.0f);
  if (A.rank() != 2 || B.rank() != 2) c.error("A " + shape_str(A.shape()) + " and B " + shape_str(B.shape()) + " must be 2-D");
  int64_t M = ta ? A.dim(1) : A.dim(0), K = ta ? A.dim(0) : A.dim(1);
  int64_t Kb = tb ? B.dim(1) : B.dim(0), N = tb ? B.dim(0) : B.dim(1);
  if (K != Kb)
    c.error("A " + shape_str(A.shape()) + (ta ? " (transposed)" : "") + " has K=" + std::to_string(K) + " but B " +
            shape_str(B.shape()) + (tb ? " (transposed)" : "") + " has K=" + std::to_string(Kb));
  Tensor out(DTypeOf<T>::value, {M, N});
  T* o = out.data<T>();
  const T* a = A.data<T>();
  const T* b = B.data<T>();
  int64_t a_rs = ta ? 1 : K, a_cs = ta ? M : 1;
  int64_t b_rs = tb ? 1 : N, b_cs = tb ? K : 1;
  gemm<T>(M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, o, N, false);
  if (alpha != 1.0)
    for (int64_t i = 0; i < M * N; ++i) o[i] = T(double(o[i]) * alpha);
  if (Cm && beta != 0.0) {
    if (Cm->rank() > 2) c.error("C " + shape_str(Cm->shape()) + " has rank > 2");
    for (int64_t i = 0; i < Cm->rank(); ++i) {
      int64_t want = i + 2 - Cm->rank() == 0 ? M : N;
      if (Cm->dim(i) != 1 && Cm->dim(i) != want)
        c.error("C " + shape_str(Cm->shape()) + " does not broadcast to [" + std::to_string(M) + "," + std::to_string(N) + "]");
    }
    const T* cp = Cm->data<T>();
    for_each_broadcast({M, N}, {Cm->shape()}, [&](int64_t i, const int64_t* off) {
      if constexpr (std::is_floating_point_v<T>) o[i] += T(beta) * cp[off[0]];
      else o[i] = T(double(o[i]) + beta * double(cp[off[0]]));
    });
  }
  return out;
}

std::vector<Tensor> gemm_kernel(const KernelContext& c) {
  const Tensor* cm = c.has_input(2) ? c.inputs[2] : nullptr;
  DType dt = c.input(0).dtype();
  switch (dt) {
    case DType::Int32: return {gemm_typed<int32_t>(c, c.input(0), c.input(1), cm)};
    case DType::Int64: return {gemm_typed<int64_t>(c, c.input(0), c.input(1), cm)};
    case DType::UInt32: return {gemm_typed<uint32_t>(c, c.input(0), c.input(1), cm)};
    case DType::UInt64: return {gemm_typed<uint64_t>(c, c.input(0), c.input(1), cm)};
    default: break;
  }
  return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) -> std::vector<Tensor> {
    using T = decltype(tag);
    return {gemm_typed<T>(c, *in[0], *in[1], in.size() > 2 ? in[2] : nullptr)};
  });
}

double gemm_flops(const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
  if (ins.size() < 2 || !ins[0].is_static() || outs.empty()) return 0;
  bool ta = n.attrs.get_int("transA", 0) != 0;
  double K = double(ta ? ins[0].dims[0].value : ins[0].dims[1].value);
  return 2.0 * numel_or0(outs[0]) * K;
}

// ---------------------------------------------------------------- MatMulInteger
// Subtracts a zero point (scalar, or per row of A / per column of B along `axis`) into int32.
template <class Q>
Tensor widen_minus_zp(const KernelContext& c, const Tensor& x, const Tensor* zp, bool per_row) {
  Tensor out(DType::Int32, x.shape());
  const Q* p = x.data<Q>();
  int32_t* o = out.data<int32_t>();
  int64_t n = x.numel();
  if (!zp || zp->numel() == 1) {
    int32_t z = zp ? int32_t(zp->data<Q>()[0]) : 0;
    for (int64_t i = 0; i < n; ++i) o[i] = int32_t(p[i]) - z;
    return out;
  }
  const Q* zq = zp->data<Q>();
  if (x.rank() < 2) c.unsupported("per-axis zero point with a 1-D operand");
  int64_t rows = x.dim(-2), cols = x.dim(-1);
  if (zp->numel() != (per_row ? rows : cols))
    c.error("zero point of shape " + shape_str(zp->shape()) + " does not match operand " + shape_str(x.shape()));
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = (i / cols) % rows, col = i % cols;
    o[i] = int32_t(p[i]) - int32_t(zq[per_row ? r : col]);
  }
  return out;
}

Tensor widen_any(const KernelContext& c, const Tensor& x, const Tensor* zp, bool per_row) {
  if (zp && zp->dtype() != x.dtype())
    c.error(std::string("zero point dtype ") + dtype_name(zp->dtype()) + " differs from operand dtype " + dtype_name(x.dtype()));
  if (x.dtype() == DType::UInt8) return widen_minus_zp<uint8_t>(c, x, zp, per_row);
  if (x.dtype() == DType::Int8) return widen_minus_zp<int8_t>(c, x, zp, per_row);
  c.unsupported(std::string("MatMulInteger does not support dtype ") + dtype_name(x.dtype()));
}

std::vector<Tensor> matmul_integer_kernel(const KernelContext& c) {
  Tensor a = widen_any(c, c.input(0), c.has_input(2) ? c.inputs[2] : nullptr, true);
  Tensor b = widen_any(c, c.input(1), c.has_input(3) ? c.inputs[3] : nullptr, false);
  return {matmul_typed<int32_t>(c, a, b)};
}

// ---------------------------------------------------------------- QLinearMatMul
// y = saturate(round((a - a_zp)·(b - b_zp) * a_scale * b_scale / y_scale) + y_zp): the integer
// product is exact in int32; the rescale is done in double, rounding half to even.
std::vector<Tensor> qlinear_matmul_kernel(const KernelContext& c) {
  const Tensor& A = c.input(0);
  const Tensor& B = c.input(3);
  Tensor acc = matmul_typed<int32_t>(c, widen_any(c, A, &c.input(2), true), widen_any(c, B, &c.input(5), false));
  std::vector<float> as = c.input(1).to_float_vector(), bs = c.input(4).to_float_vector();
  double ys = c.input(6).as_double(0);
  const Tensor& yzp = c.input(7);
  int64_t M = A.rank() >= 2 ? A.dim(-2) : 1, N = B.rank() >= 2 ? B.dim(-1) : 1;
  if ((as.size() != 1 && int64_t(as.size()) != M) || (bs.size() != 1 && int64_t(bs.size()) != N))
    c.error("a_scale must have 1 or M=" + std::to_string(M) + " elements and b_scale 1 or N=" + std::to_string(N));
  if (yzp.numel() != 1 || c.input(6).numel() != 1) c.unsupported("QLinearMatMul with a per-axis output scale");
  double z = yzp.as_double(0);
  Tensor Y(yzp.dtype(), acc.shape());
  const int32_t* p = acc.data<int32_t>();
  int64_t n = acc.numel();
  auto emit = [&](auto tag) {
    using Q = decltype(tag);
    Q* y = Y.data<Q>();
    const double lo = double(std::numeric_limits<Q>::lowest()), hi = double(std::numeric_limits<Q>::max());
    for (int64_t i = 0; i < n; ++i) {
      int64_t col = B.rank() >= 2 ? i % N : 0, row = A.rank() >= 2 ? (i / (B.rank() >= 2 ? N : 1)) % M : 0;
      double scale = double(as[as.size() == 1 ? 0 : size_t(row)]) * double(bs[bs.size() == 1 ? 0 : size_t(col)]) / ys;
      double v = std::nearbyint(double(p[i]) * scale) + z;
      y[i] = Q(std::min(hi, std::max(lo, v)));
    }
  };
  if (yzp.dtype() == DType::UInt8) emit(uint8_t{});
  else if (yzp.dtype() == DType::Int8) emit(int8_t{});
  else c.unsupported(std::string("QLinearMatMul does not support output dtype ") + dtype_name(yzp.dtype()));
  return {Y};
}

// ---------------------------------------------------------------- Det
// Determinants of [*, M, M] by LU decomposition with partial pivoting, in double.
template <class T>
std::vector<Tensor> det_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  const Tensor& X = *in[0];
  if (X.rank() < 2 || X.dim(X.rank() - 1) != X.dim(X.rank() - 2)) c.error("input must be [*, M, M], got " + shape_str(X.shape()));
  const int64_t M = X.dim(X.rank() - 1), batch = M ? X.numel() / (M * M) : 0;
  Shape os(X.shape().begin(), X.shape().end() - 2);
  Tensor Y(DTypeOf<T>::value, os);
  std::vector<double> a(size_t(M * M));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < M * M; ++i) a[size_t(i)] = double(X.data<T>()[b * M * M + i]);
    double det = 1;
    for (int64_t k = 0; k < M && det != 0; ++k) {
      int64_t p = k;
      for (int64_t i = k + 1; i < M; ++i)
        if (std::fabs(a[size_t(i * M + k)]) > std::fabs(a[size_t(p * M + k)])) p = i;
      if (a[size_t(p * M + k)] == 0) {
        det = 0;
        break;
      }
      if (p != k) {
        for (int64_t j = 0; j < M; ++j) std::swap(a[size_t(k * M + j)], a[size_t(p * M + j)]);
        det = -det;
      }
      det *= a[size_t(k * M + k)];
      for (int64_t i = k + 1; i < M; ++i) {
        const double f = a[size_t(i * M + k)] / a[size_t(k * M + k)];
        for (int64_t j = k; j < M; ++j) a[size_t(i * M + j)] -= f * a[size_t(k * M + j)];
      }
    }
    Y.data<T>()[b] = T(det);
  }
  return {Y};
}

// ---------------------------------------------------------------- Einsum
// Labels: letters, plus one label per ellipsis dimension (codes 256 + k, k counted from the
// leftmost of the widest ellipsis, so narrower ellipses align to the right, as numpy does).
struct EinsumSpec {
  std::vector<std::vector<int>> operands;  // labels per operand dim
  std::vector<int> output;
};

EinsumSpec parse_einsum(const std::string& eq_in, const std::vector<int64_t>& ranks, const std::string& who) {
  std::string eq;
  for (char ch : eq_in)
    if (ch != ' ') eq += ch;
  auto bad = [&](const std::string& why) { fail(ErrorKind::Model, "Einsum equation '" + eq_in + "': " + why, {"", 0, 0, who, "Einsum"}); };
  std::string lhs = eq, rhs;
  bool explicit_out = false;
  size_t arrow = eq.find("->");
  if (arrow != std::string::npos) {
    lhs = eq.substr(0, arrow);
    rhs = eq.substr(arrow + 2);
    explicit_out = true;
  }
  std::vector<std::string> terms;
  size_t start = 0;
  for (size_t i = 0; i <= lhs.size(); ++i)
    if (i == lhs.size() || lhs[i] == ',') {
      terms.push_back(lhs.substr(start, i - start));
      start = i + 1;
    }
  if (terms.size() != ranks.size())
    bad("has " + std::to_string(terms.size()) + " operands but the node has " + std::to_string(ranks.size()) + " inputs");
  // Parse a term into letters and the ellipsis position.
  auto letters_of = [&](const std::string& t, int& ell_pos) {
    std::vector<int> ls;
    ell_pos = -1;
    for (size_t i = 0; i < t.size();) {
      if (t.compare(i, 3, "...") == 0) {
        if (ell_pos >= 0) bad("more than one ellipsis in a term");
        ell_pos = int(ls.size());
        i += 3;
      } else if (std::isalpha(static_cast<unsigned char>(t[i]))) {
        ls.push_back(int(static_cast<unsigned char>(t[i])));
        ++i;
      } else {
        bad(std::string("unexpected character '") + t[i] + "'");
      }
    }
    return ls;
  };
  EinsumSpec spec;
  int64_t max_ell = 0;
  std::vector<std::vector<int>> letters(terms.size());
  std::vector<int> ell(terms.size());
  for (size_t k = 0; k < terms.size(); ++k) {
    letters[k] = letters_of(terms[k], ell[k]);
    int64_t e = ranks[k] - int64_t(letters[k].size());
    if (e < 0 || (e > 0 && ell[k] < 0))
      bad("term '" + terms[k] + "' does not match operand " + std::to_string(k) + " of rank " + std::to_string(ranks[k]));
    max_ell = std::max(max_ell, e);
  }
  std::map<int, int> count;
  for (size_t k = 0; k < terms.size(); ++k) {
    int64_t e = ranks[k] - int64_t(letters[k].size());
    std::vector<int> labels;
    for (size_t i = 0; i < letters[k].size(); ++i) {
      if (int(i) == ell[k])
        for (int64_t j = 0; j < e; ++j) labels.push_back(256 + int(max_ell - e + j));
      labels.push_back(letters[k][i]);
    }
    if (ell[k] == int(letters[k].size()))
      for (int64_t j = 0; j < e; ++j) labels.push_back(256 + int(max_ell - e + j));
    for (int l : letters[k]) count[l]++;
    spec.operands.push_back(labels);
  }
  if (explicit_out) {
    int e_pos;
    std::vector<int> ls = letters_of(rhs, e_pos);
    for (size_t i = 0; i <= ls.size(); ++i) {
      if (int(i) == e_pos)
        for (int64_t j = 0; j < max_ell; ++j) spec.output.push_back(256 + int(j));
      if (i < ls.size()) {
        if (!count.count(ls[i])) bad(std::string("output label '") + char(ls[i]) + "' does not appear in the inputs");
        spec.output.push_back(ls[i]);
      }
    }
    if (e_pos < 0 && max_ell > 0) {
      // numpy requires '...' in the output when inputs have broadcast dims; ONNX Runtime sums them.
      bad("inputs use '...' but the output does not");
    }
  } else {
    for (int64_t j = 0; j < max_ell; ++j) spec.output.push_back(256 + int(j));
    for (auto& [l, n] : count)
      if (n == 1) spec.output.push_back(l);
  }
  return spec;
}

InferResult infer_einsum(const InferContext& c) {
  std::vector<int64_t> ranks;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (!c.input(i).has_shape) return infer_one(TensorType::unknown_shape(c.input(0).dtype));
    ranks.push_back(c.input(i).rank());
  }
  EinsumSpec sp = parse_einsum(c.node.attrs.get_string("equation", ""), ranks, c.node.label());
  std::map<int, Dim> size;
  for (size_t k = 0; k < sp.operands.size(); ++k)
    for (size_t i = 0; i < sp.operands[k].size(); ++i) {
      int l = sp.operands[k][i];
      const Dim& d = c.input(k).dims[i];
      auto it = size.find(l);
      if (it == size.end() || (it->second.known() && it->second.value == 1) || (!it->second.known() && d.known() && d.value != 1)) {
        if (it != size.end() && it->second.known() && d.known() && it->second.value != 1 && d.value != 1 && it->second.value != d.value)
          c.error("Einsum: label sizes differ");
        size[l] = d;
      } else if (it->second.known() && d.known() && d.value != 1 && it->second.value != d.value) {
        std::string name = l >= 256 ? std::string("...") : std::string(1, char(l));
        c.error("Einsum: label '" + name + "' has size " + it->second.str() + " in one operand and " + d.str() + " in another");
      }
    }
  std::vector<Dim> out;
  for (int l : sp.output) out.push_back(size[l]);
  return infer_one(TensorType(c.input(0).dtype, out));
}

template <class T>
Tensor permute_copy(const Tensor& x, const std::vector<int>& perm) {
  Shape out_shape;
  auto st = shape_strides(x.shape());
  std::vector<int64_t> src_strides;
  for (int p : perm) {
    out_shape.push_back(x.shape()[size_t(p)]);
    src_strides.push_back(st[size_t(p)]);
  }
  Tensor out(x.dtype(), out_shape);
  const T* s = x.data<T>();
  T* o = out.data<T>();
  int64_t n = out.numel();
  if (n == 0) return out;
  size_t r = out_shape.size();
  if (r == 0) {
    o[0] = s[0];
    return out;
  }
  std::vector<int64_t> idx(r, 0);
  int64_t off = 0, inner = out_shape[r - 1], ist = src_strides[r - 1];
  for (int64_t i = 0; i < n; i += inner) {
    for (int64_t j = 0; j < inner; ++j) o[i + j] = s[off + j * ist];
    for (size_t d = r - 1; d-- > 0;) {
      ++idx[d];
      off += src_strides[d];
      if (idx[d] < out_shape[d]) break;
      off -= src_strides[d] * idx[d];
      idx[d] = 0;
    }
  }
  return out;
}

template <class T>
Tensor einsum_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  std::vector<int64_t> ranks;
  for (auto* t : in) ranks.push_back(t->rank());
  EinsumSpec sp = parse_einsum(c.node.attrs.get_string("equation", ""), ranks, c.node.label());
  std::map<int, int64_t> size;
  for (size_t k = 0; k < sp.operands.size(); ++k)
    for (size_t i = 0; i < sp.operands[k].size(); ++i) {
      int l = sp.operands[k][i];
      int64_t d = in[k]->dim(int64_t(i));
      auto it = size.find(l);
      if (it == size.end() || it->second == 1) size[l] = d;
      else if (d != 1 && d != it->second) {
        std::string name = l >= 256 ? std::string("...") : std::string(1, char(l));
        c.error("label '" + name + "' has size " + std::to_string(it->second) + " in one operand and " + std::to_string(d) + " in another");
      }
    }
  Shape out_shape;
  for (int l : sp.output) out_shape.push_back(size[l]);

  // Fast path: two operands, no repeated label within an operand, no size-1 broadcasting, and every
  // label in an output or shared: a batched GEMM between two permuted copies.
  if (in.size() == 2) {
    auto& la = sp.operands[0];
    auto& lb = sp.operands[1];
    auto has = [](const std::vector<int>& v, int l) { return std::find(v.begin(), v.end(), l) != v.end(); };
    bool ok = true;
    for (int k = 0; k < 2 && ok; ++k) {
      auto& ls = sp.operands[size_t(k)];
      for (size_t i = 0; i < ls.size(); ++i) {
        if (std::count(ls.begin(), ls.end(), ls[i]) > 1) ok = false;
        if (in[size_t(k)]->dim(int64_t(i)) != size[ls[i]]) ok = false;
        bool other = has(sp.operands[size_t(1 - k)], ls[i]);
        if (!other && !has(sp.output, ls[i])) ok = false;  // summed over in one operand only
      }
    }
    if (ok) {
      std::vector<int> batch, ms, ns, ks;
      for (int l : sp.output) {
        bool ia = has(la, l), ib = has(lb, l);
        if (ia && ib) batch.push_back(l);
        else if (ia) ms.push_back(l);
        else ns.push_back(l);
      }
      for (int l : la)
        if (has(lb, l) && !has(sp.output, l)) ks.push_back(l);
      auto pos = [](const std::vector<int>& v, int l) { return int(std::find(v.begin(), v.end(), l) - v.begin()); };
      std::vector<int> pa, pb;
      for (int l : batch) pa.push_back(pos(la, l));
      for (int l : ms) pa.push_back(pos(la, l));
      for (int l : ks) pa.push_back(pos(la, l));
      for (int l : batch) pb.push_back(pos(lb, l));
      for (int l : ks) pb.push_back(pos(lb, l));
      for (int l : ns) pb.push_back(pos(lb, l));
      auto prod = [&](const std::vector<int>& v) {
        int64_t p = 1;
        for (int l : v) p *= size[l];
        return p;
      };
      int64_t Bt = prod(batch), M = prod(ms), N = prod(ns), K = prod(ks);
      auto is_identity = [](const std::vector<int>& p) {
        for (size_t i = 0; i < p.size(); ++i)
          if (p[i] != int(i)) return false;
        return true;
      };
      Tensor A = is_identity(pa) ? *in[0] : permute_copy<T>(*in[0], pa);
      Tensor B = is_identity(pb) ? *in[1] : permute_copy<T>(*in[1], pb);
      Shape rshape;
      std::vector<int> rlabels;
      for (auto* v : {&batch, &ms, &ns})
        for (int l : *v) {
          rshape.push_back(size[l]);
          rlabels.push_back(l);
        }
      Tensor R(DTypeOf<T>::value, rshape);
      const T* a = A.data<T>();
      const T* b = B.data<T>();
      T* r = R.data<T>();
      for (int64_t t = 0; t < Bt; ++t) gemm<T>(M, N, K, a + t * M * K, K, 1, b + t * K * N, N, 1, r + t * M * N, N, false);
      std::vector<int> po;
      for (int l : sp.output) po.push_back(pos(rlabels, l));
      return is_identity(po) ? R.reshaped(out_shape) : permute_copy<T>(R, po);
    }
  }

  // General path: one loop over the space of all labels. A label repeated in an operand takes the
  // sum of its strides (a diagonal); a broadcast size-1 dim has stride 0.
  std::vector<int> labels;
  for (auto& [l, s] : size) labels.push_back(l);
  size_t L = labels.size(), nops = in.size();
  Shape space;
  for (int l : labels) space.push_back(size[l]);
  std::vector<std::vector<int64_t>> st(nops + 1, std::vector<int64_t>(L, 0));
  for (size_t k = 0; k < nops; ++k) {
    auto s = shape_strides(in[k]->shape());
    for (size_t i = 0; i < sp.operands[k].size(); ++i) {
      size_t li = size_t(std::find(labels.begin(), labels.end(), sp.operands[k][i]) - labels.begin());
      if (in[k]->dim(int64_t(i)) != 1) st[k][li] += s[i];
    }
  }
  auto os = shape_strides(out_shape);
  for (size_t i = 0; i < sp.output.size(); ++i) {
    size_t li = size_t(std::find(labels.begin(), labels.end(), sp.output[i]) - labels.begin());
    st[nops][li] += os[i];
  }
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, T>;
  std::vector<Acc> acc(size_t(shape_numel(out_shape)), Acc(0));
  std::vector<const T*> ptr;
  for (auto* t : in) ptr.push_back(t->data<T>());
  int64_t total = shape_numel(space);
  std::vector<int64_t> idx(L, 0), off(nops + 1, 0);
  for (int64_t it = 0; it < total; ++it) {
    Acc p = Acc(1);
    for (size_t k = 0; k < nops; ++k) p *= Acc(ptr[k][off[k]]);
    acc[size_t(off[nops])] += p;
    for (size_t d = L; d-- > 0;) {
      ++idx[d];
      for (size_t k = 0; k <= nops; ++k) off[k] += st[k][d];
      if (idx[d] < space[d]) break;
      for (size_t k = 0; k <= nops; ++k) off[k] -= st[k][d] * idx[d];
      idx[d] = 0;
    }
  }
  Tensor out(DTypeOf<T>::value, out_shape);
  T* o = out.data<T>();
  for (size_t i = 0; i < acc.size(); ++i) o[i] = T(acc[i]);
  return out;
}

std::vector<Tensor> einsum_kernel(const KernelContext& c) {
  for (size_t i = 1; i < c.num_inputs(); ++i)
    if (c.input(i).dtype() != c.input(0).dtype()) c.error("Einsum operands have different dtypes");
  std::vector<const Tensor*> in;
  for (size_t i = 0; i < c.num_inputs(); ++i) in.push_back(&c.input(i));
  switch (c.input(0).dtype()) {
    case DType::Int32: return {einsum_typed<int32_t>(c, in)};
    case DType::Int64: return {einsum_typed<int64_t>(c, in)};
    case DType::UInt32: return {einsum_typed<uint32_t>(c, in)};
    case DType::UInt64: return {einsum_typed<uint64_t>(c, in)};
    default: break;
  }
  return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& p) -> std::vector<Tensor> {
    using T = decltype(tag);
    return {einsum_typed<T>(c, p)};
  });
}

double einsum_flops(const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
  // 2 per multiply-add over the whole label space (equals 2*M*N*K for matmul-like equations).
  std::vector<int64_t> ranks;
  for (auto& t : ins) {
    if (!t.is_static()) return 0;
    ranks.push_back(t.rank());
  }
  try {
    EinsumSpec sp = parse_einsum(n.attrs.get_string("equation", ""), ranks, n.label());
    std::map<int, int64_t> size;
    for (size_t k = 0; k < sp.operands.size(); ++k)
      for (size_t i = 0; i < sp.operands[k].size(); ++i) size[sp.operands[k][i]] = std::max(size[sp.operands[k][i]], ins[k].dims[i].value);
    double p = 1;
    for (auto& [l, s] : size) p *= double(s);
    return 2.0 * p * double(std::max<size_t>(1, ins.size() - 1));
  } catch (const Error&) {
    return 0;
  }
}


}  // namespace

void register_nn_matmul_ops(OpRegistry& r) {
  {
    OpSchema s = nn_schema("MatMul", 7, 2, 2, 1, 1, MappingType::ManyToMany);
    s.infer = [](const InferContext& c) {
      if (c.input(0).dtype != c.input(1).dtype)
        c.error(std::string("MatMul: operands have dtypes ") + dtype_name(c.input(0).dtype) + " and " + dtype_name(c.input(1).dtype));
      return infer_matmul_like(c, c.input(0).dtype);
    };
    s.kernel = matmul_kernel;
    s.flops = matmul_flops;
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("Gemm", 7, 2, 3, 1, 1, MappingType::ManyToMany);
    s.infer = infer_gemm;
    s.kernel = gemm_kernel;
    s.flops = gemm_flops;
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("MatMulInteger", 10, 2, 4, 1, 1, MappingType::ManyToMany);
    s.infer = [](const InferContext& c) { return infer_matmul_like(c, DType::Int32); };
    s.kernel = matmul_integer_kernel;
    s.flops = matmul_flops;
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("QLinearMatMul", 10, 8, 8, 1, 1, MappingType::ManyToMany);
    s.infer = [](const InferContext& c) { return infer_matmul_like(c, c.input(7).dtype, 3); };
    s.kernel = qlinear_matmul_kernel;
    s.flops = matmul_flops;
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("Det", 11, 1, 1);
    s.infer = [](const InferContext& c) {
      const TensorType& x = c.input(0);
      if (!x.has_shape) return infer_one(TensorType::unknown_shape(x.dtype));
      if (x.rank() < 2) c.error("input must be [*, M, M], got " + x.str());
      return infer_one(TensorType(x.dtype, std::vector<Dim>(x.dims.begin(), x.dims.end() - 2)));
    };
    s.kernel = [](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
        using T = decltype(tag);
        return det_typed<T>(c, in);
      });
    };
    s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) {
      const TensorType& x = ins[0];
      if (!x.has_shape || x.rank() < 2 || !x.dims.back().known()) return 0.0;
      return numel_or0(x) * double(x.dims.back().value) * 2.0 / 3.0;  // LU: 2/3 M^3 per matrix
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("Einsum", 12, 1, -1, 1, 1, MappingType::ManyToMany);
    s.infer = infer_einsum;
    s.kernel = einsum_kernel;
    s.flops = einsum_flops;
    r.add(std::move(s));
  }
}

}  // namespace nnfuse::nn
