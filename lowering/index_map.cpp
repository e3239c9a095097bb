// Index maps: evaluation, simplification helpers, and access classification over a rows x width view.
#include <algorithm>
#include <numeric>
#include <optional>

#include "graph/error.h"
#include "lowering/kernel_ir.h"

namespace nnfuse {

bool IndexMap::is_identity() const {
  for (auto& s : steps) {
    if (s.kind == IndexStep::Reshape && s.from != s.to) return false;
    if (s.kind == IndexStep::Offset || s.kind == IndexStep::Gather) return false;
    if (s.kind == IndexStep::Select) {
      if (s.from.size() != s.to.size()) return false;
      for (size_t k = 0; k < s.src.size(); ++k)
        if (s.src[k] != int(k) && !(s.src[k] < 0 && s.to[k] == 1)) return false;
    }
  }
  return codomain() == domain;
}

std::vector<int> IndexMap::index_buffers() const {
  std::vector<int> r;
  for (auto& s : steps)
    if (s.kind == IndexStep::Gather) r.push_back(s.index_buffer);
  return r;
}

namespace {

// One step of a map: nxt (s.to.size() entries) from cur (s.from.size() entries). A Gather step
// reads its index through gather(step, linear position). IndexMap::apply and the stack-based
// evaluator below share it, so the step semantics live in one place.
template <class GatherFn>
void apply_step(const IndexStep& s, const int64_t* cur, int64_t* nxt, const GatherFn& gather) {
  const size_t n = s.to.size();
  if (s.kind == IndexStep::Gather) {
    const size_t axis = size_t(s.axis), q = size_t(s.q);
    int64_t lin = 0;
    for (size_t k = axis; k < axis + q; ++k) lin = lin * s.from[k] + cur[k];
    for (size_t k = 0; k < axis; ++k) nxt[k] = cur[k];
    nxt[axis] = gather(s, lin);
    for (size_t k = axis + 1; k < n; ++k) nxt[k] = cur[k + q - 1];
  } else if (s.kind == IndexStep::Offset) {
    for (size_t k = 0; k < n; ++k) nxt[k] = cur[k] * (s.stride.empty() ? 1 : s.stride[k]) + s.off[k];
  } else if (s.kind == IndexStep::Select) {
    for (size_t k = 0; k < n; ++k) nxt[k] = s.src[k] < 0 ? 0 : cur[size_t(s.src[k])];
  } else {  // Reshape
    int64_t lin = 0;
    for (size_t k = 0; k < s.from.size(); ++k) lin = lin * s.from[k] + cur[k];
    for (size_t k = n; k-- > 0;) {
      nxt[k] = s.to[k] ? lin % s.to[k] : 0;
      lin = s.to[k] ? lin / s.to[k] : 0;
    }
  }
}

template <class GatherFn>
std::vector<int64_t> apply_steps(const IndexMap& m, std::vector<int64_t> idx, const GatherFn& gather) {
  std::vector<int64_t> out;
  for (auto& s : m.steps) {
    out.assign(s.to.size(), 0);
    apply_step(s, idx.data(), out.data(), gather);
    idx.swap(out);
  }
  return idx;
}

[[noreturn]] void data_dependent(const IndexMap& m) {
  fail(ErrorKind::Invalid, "index map " + m.str() + " depends on data: it has no static offsets");
}

// Evaluates maps of rank up to kMaxRank at every step on the stack: the exhaustive access checks
// call it once per element of index spaces of up to 2^22, where a vector per step was a third of
// loading a 1500-token encoder's artifact.
struct StackEval {
  static constexpr size_t kMaxRank = 16;
  static bool fits(const IndexMap& m) {
    if (m.domain.size() > kMaxRank) return false;
    for (auto& s : m.steps)
      if (s.to.size() > kMaxRank || s.from.size() > kMaxRank) return false;
    return true;
  }
  // The linear offset in the codomain of the map at the domain index idx.
  static int64_t offset(const IndexMap& m, const int64_t* idx) {
    int64_t a[kMaxRank], b[kMaxRank];
    int64_t* cur = a;
    int64_t* nxt = b;
    std::copy(idx, idx + m.domain.size(), cur);
    const Shape* shape = &m.domain;
    for (auto& s : m.steps) {
      apply_step(s, cur, nxt, [&](const IndexStep&, int64_t) -> int64_t { data_dependent(m); });
      std::swap(cur, nxt);
      shape = &s.to;
    }
    int64_t off = 0;
    for (size_t k = 0; k < shape->size(); ++k) off = off * (*shape)[k] + cur[k];
    return off;
  }
};

}  // namespace

std::vector<int64_t> IndexMap::apply(std::vector<int64_t> idx) const {
  return apply_steps(*this, std::move(idx), [&](const IndexStep&, int64_t) -> int64_t { data_dependent(*this); });
}

int64_t IndexMap::offset(const std::vector<int64_t>& idx) const {
  if (idx.size() == domain.size() && StackEval::fits(*this)) return StackEval::offset(*this, idx.data());
  auto out = apply(idx);
  Shape cod = codomain();
  int64_t off = 0;
  for (size_t k = 0; k < cod.size(); ++k) off = off * cod[k] + out[k];
  return off;
}

std::string IndexMap::str() const {
  std::string s = shape_str(domain);
  for (auto& st : steps) {
    if (st.kind == IndexStep::Offset) {
      s += "->O(" + shape_str(st.off) + (st.stride.empty() ? "" : "*" + shape_str(st.stride)) + ")" + shape_str(st.to);
    } else if (st.kind == IndexStep::Gather) {
      s += "->G(" + std::to_string(st.axis) + "," + std::to_string(st.q) + ",b" + std::to_string(st.index_buffer) + ")" + shape_str(st.to);
    } else if (st.kind == IndexStep::Reshape) {
      s += "->R" + shape_str(st.to);
    } else {
      s += "->S(";
      for (size_t k = 0; k < st.src.size(); ++k) s += (k ? "," : "") + std::to_string(st.src[k]);
      s += ")" + shape_str(st.to);
    }
  }
  return s;
}

namespace {

// For a map of Select and Offset steps: offset = base + sum_k coef[k] * idx[k] over the domain.
bool linear_coefs(const IndexMap& m, std::vector<int64_t>& coef, int64_t& base) {
  size_t rank = m.domain.size();
  // Each codomain dim as scale * (a domain dim, or none) + constant.
  std::vector<int> pick(rank);
  std::iota(pick.begin(), pick.end(), 0);
  std::vector<int64_t> scale(rank, 1), cst(rank, 0);
  for (auto& s : m.steps) {
    if (s.kind == IndexStep::Offset) {
      for (size_t k = 0; k < s.to.size(); ++k) {
        int64_t st = s.stride.empty() ? 1 : s.stride[k];
        scale[k] *= st;
        cst[k] = cst[k] * st + s.off[k];
      }
      continue;
    }
    if (s.kind != IndexStep::Select) return false;
    std::vector<int> np(s.to.size(), -1);
    std::vector<int64_t> ns(s.to.size(), 1), nc(s.to.size(), 0);
    for (size_t k = 0; k < s.to.size(); ++k)
      if (s.src[k] >= 0) {
        np[k] = pick[size_t(s.src[k])];
        ns[k] = scale[size_t(s.src[k])];
        nc[k] = cst[size_t(s.src[k])];
      }
    pick = std::move(np);
    scale = std::move(ns);
    cst = std::move(nc);
  }
  Shape cod = m.codomain();
  std::vector<int64_t> strides = shape_strides(cod);
  coef.assign(rank, 0);
  base = 0;
  for (size_t k = 0; k < pick.size(); ++k) {
    base += cst[k] * strides[k];
    if (pick[k] >= 0 && m.domain[size_t(pick[k])] > 1) coef[size_t(pick[k])] += scale[k] * strides[k];
  }
  return true;
}

// Are coef[lo..hi) the strides of a contiguous walk over dims[lo..hi) with innermost stride s?
bool chain(const std::vector<int64_t>& coef, const Shape& dims, size_t lo, size_t hi, int64_t& s) {
  int64_t expect = -1;
  s = 0;
  bool first = true;
  for (size_t k = hi; k-- > lo;) {
    if (dims[k] == 1) continue;
    if (first) {
      s = coef[k];
      expect = coef[k] * dims[k];
      first = false;
    } else {
      if (coef[k] != expect) return false;
      expect = coef[k] * dims[k];
    }
  }
  return true;
}

}  // namespace

namespace {
// The offset of the map at the domain's linear position e, for maps without Gather steps.
struct LinearOffset {
  const IndexMap& m;
  bool small = StackEval::fits(m);
  std::vector<int64_t> idx = std::vector<int64_t>(m.domain.size(), 0);
  int64_t operator()(int64_t e) {
    int64_t a[StackEval::kMaxRank];
    int64_t* cur = small ? a : idx.data();
    for (size_t k = m.domain.size(); k-- > 0;) {
      cur[k] = e % m.domain[k];
      e /= m.domain[k];
    }
    return small ? StackEval::offset(m, cur) : m.offset(idx);
  }
};

// The rows of `width` columns that the exhaustive checks below walk, or nothing when they cannot
// (no whole rows, an index space past 2^22 elements, or a Gather step whose offsets depend on data).
std::optional<int64_t> checkable_rows(const IndexMap& m, int64_t width) {
  const int64_t numel = shape_numel(m.domain);
  if (width <= 0 || numel % width != 0 || numel > (int64_t(1) << 22)) return std::nullopt;
  for (auto& s : m.steps)
    if (s.kind == IndexStep::Gather) return std::nullopt;
  return numel / width;
}
}  // namespace

Access classify_access(const IndexMap& m, int64_t rows, int64_t width) {
  Access a;
  const Shape& d = m.domain;
  int64_t numel = shape_numel(d);
  if (numel == 0) {
    a.affine = true;
    return a;
  }
  // An index read from a buffer: no static pattern (the emitter computes it per element).
  for (auto& s : m.steps)
    if (s.kind == IndexStep::Gather) return a;
  std::vector<int64_t> coef;
  int64_t base = 0;
  if (linear_coefs(m, coef, base)) {
    // Split the domain dims into the row part and the width part.
    size_t split = d.size();
    int64_t w = 1;
    while (split > 0 && w < width) w *= d[--split];
    if (w == width) {
      int64_t rs = 0, cs = 0;
      if (chain(coef, d, 0, split, rs) && chain(coef, d, split, d.size(), cs)) {
        a.affine = true;
        a.base = base;
        a.row_stride = rs;
        a.col_stride = cs;
        return a;
      }
    }
  }
  // Reshape steps (or a width that splits a dim): check exhaustively on small index spaces.
  if (numel > (int64_t(1) << 22)) return a;
  LinearOffset off_at{m};
  int64_t o00 = off_at(0);
  int64_t rs = rows > 1 ? off_at(width) - o00 : 0;
  int64_t cs = width > 1 ? off_at(1) - o00 : 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c)
      if (off_at(r * width + c) != o00 + r * rs + c * cs) return a;
  a.affine = true;
  a.base = o00;
  a.row_stride = rs;
  a.col_stride = cs;
  return a;
}

bool columns_affine(const IndexMap& m, int64_t width, int64_t col_stride) {
  const std::optional<int64_t> rows = checkable_rows(m, width);
  if (!rows) return false;
  LinearOffset off_at{m};
  for (int64_t r = 0; r < *rows; ++r) {
    const int64_t o0 = off_at(r * width);
    for (int64_t c = 1; c < width; ++c)
      if (off_at(r * width + c) != o0 + c * col_stride) return false;
  }
  return true;
}

bool columns_chunked(const IndexMap& m, int64_t width, int64_t chunk, std::vector<int64_t>& tab) {
  const std::optional<int64_t> rows = checkable_rows(m, width);
  if (!rows || chunk <= 0) return false;
  LinearOffset off_at{m};
  tab.assign(size_t((width + chunk - 1) / chunk), 0);
  const int64_t base = off_at(0);
  for (int64_t c = 0; c < width; c += chunk) tab[size_t(c / chunk)] = off_at(c) - base;
  for (int64_t r = 0; r < *rows; ++r) {
    const int64_t o0 = off_at(r * width);
    for (int64_t c = 0; c < width; ++c)
      if (off_at(r * width + c) != o0 + tab[size_t(c / chunk)] + c % chunk) return false;
  }
  return true;
}

bool rows_affine(const IndexMap& m, int64_t width, int64_t& base, int64_t& row_stride) {
  const std::optional<int64_t> rows = checkable_rows(m, width);
  if (!rows) return false;
  LinearOffset off_at{m};
  base = off_at(0);
  row_stride = *rows > 1 ? off_at(width) - base : 0;
  for (int64_t r = 2; r < *rows; ++r)
    if (off_at(r * width) != base + r * row_stride) return false;
  return true;
}

ColumnSplit split_columns(const IndexMap& m, int64_t width, const std::function<const Tensor*(int)>& constant_index) {
  ColumnSplit cs;
  const Shape& d = m.domain;
  if (d.size() > 63 || width <= 0 || shape_numel(d) == 0) return cs;
  size_t split = d.size();
  int64_t w = 1;
  while (split > 0 && w < width) w *= d[--split];
  if (w != width) return cs;  // the width splits a dim
  // Which domain dims each index depends on (bit k: domain dim k; a size-1 dim is always 0).
  uint64_t colmask = 0;
  std::vector<uint64_t> dep(d.size(), 0);
  for (size_t k = 0; k < d.size(); ++k) {
    if (d[k] > 1) dep[k] = uint64_t(1) << k;
    if (k >= split) colmask |= dep[k];
  }
  auto mixed = [&](uint64_t x) { return (x & colmask) && (x & ~colmask); };
  for (auto& s : m.steps) {
    std::vector<uint64_t> nd(s.to.size(), 0);
    if (s.kind == IndexStep::Offset) {
      nd = dep;
    } else if (s.kind == IndexStep::Select) {
      for (size_t k = 0; k < s.to.size(); ++k) nd[k] = s.src[k] < 0 ? 0 : dep[size_t(s.src[k])];
    } else if (s.kind == IndexStep::Gather) {
      const size_t axis = size_t(s.axis), q = size_t(s.q);
      for (size_t k = 0; k < axis; ++k) nd[k] = dep[k];
      for (size_t k = axis; k < axis + q; ++k) nd[axis] |= dep[k];
      for (size_t k = axis + 1; k < s.to.size(); ++k) nd[k] = dep[k + q - 1];
      if ((nd[axis] & colmask) && !constant_index(s.index_buffer)) cs.col_dynamic = true;
    } else {
      // Reshape: a `to` dim depends on the `from` dims of its group (the dims between the
      // nearest linear positions where both shapes have a dim boundary).
      std::vector<int64_t> pf(s.from.size() + 1, 1), pt(s.to.size() + 1, 1);
      for (size_t i = 0; i < s.from.size(); ++i) pf[i + 1] = pf[i] * s.from[i];
      for (size_t j = 0; j < s.to.size(); ++j) pt[j + 1] = pt[j] * s.to[j];
      std::vector<int64_t> both;
      for (int64_t p : pt)
        if (std::find(pf.begin(), pf.end(), p) != pf.end()) both.push_back(p);
      for (size_t j = 0; j < s.to.size(); ++j) {
        if (s.to[j] == 1) continue;
        int64_t lo = 1, hi = pt.back();
        for (int64_t b : both) {
          if (b <= pt[j]) lo = std::max(lo, b);
          if (b >= pt[j + 1]) hi = std::min(hi, b);
        }
        for (size_t i = 0; i < s.from.size(); ++i)
          if (s.from[i] > 1 && pf[i] >= lo && pf[i + 1] <= hi) nd[j] |= dep[i];
      }
    }
    for (uint64_t x : nd)
      if (mixed(x)) return cs;
    dep = std::move(nd);
  }
  cs.separable = true;
  if (cs.col_dynamic) return cs;
  // The column part, evaluated at row 0. An index buffer read at run time depends only on row
  // dims here (else col_dynamic), so any fixed value stands for it and cancels in the difference.
  bool in_range = true;
  auto gather = [&](const IndexStep& s, int64_t lin) -> int64_t {
    const Tensor* t = constant_index(s.index_buffer);
    if (!t) return 0;
    const int64_t n = s.to[size_t(s.axis)];
    int64_t i = t->dtype() == DType::Int32 ? int64_t(t->data<int32_t>()[lin]) : t->data<int64_t>()[lin];
    if (i < 0) i += n;
    if (i < 0 || i >= n) in_range = false;
    return i;
  };
  std::vector<int64_t> idx(d.size(), 0);
  auto off_at = [&](int64_t c) {
    for (size_t k = d.size(); k-- > split;) {
      idx[k] = c % d[k];
      c /= d[k];
    }
    auto out = apply_steps(m, idx, gather);
    Shape cod = m.codomain();
    int64_t o = 0;
    for (size_t k = 0; k < cod.size(); ++k) o = o * cod[k] + out[k];
    return o;
  };
  const int64_t o00 = off_at(0);
  cs.col.resize(size_t(width));
  for (int64_t c = 0; c < width; ++c) cs.col[size_t(c)] = off_at(c) - o00;
  if (!in_range) {
    cs.col_dynamic = true;
    cs.col.clear();
    return cs;
  }
  cs.col_stride = width > 1 ? cs.col[1] : 0;
  cs.col_affine = true;
  for (int64_t c = 0; c < width && cs.col_affine; ++c) cs.col_affine = cs.col[size_t(c)] == c * cs.col_stride;
  return cs;
}

IndexStep select_step(const Shape& from, const Shape& to, std::vector<int> src) {
  IndexStep s;
  s.kind = IndexStep::Select;
  s.from = from;
  s.to = to;
  s.src = std::move(src);
  return s;
}

IndexStep reshape_step(const Shape& from, const Shape& to) {
  IndexStep s;
  s.kind = IndexStep::Reshape;
  s.from = from;
  s.to = to;
  return s;
}

IndexStep offset_step(const Shape& from, const Shape& to, std::vector<int64_t> off, std::vector<int64_t> stride) {
  IndexStep s;
  s.kind = IndexStep::Offset;
  s.from = from;
  s.to = to;
  s.off = std::move(off);
  s.stride = std::move(stride);
  return s;
}

IndexStep broadcast_step(const Shape& out, const Shape& in) {
  std::vector<int> src(in.size(), -1);
  size_t lead = out.size() - in.size();
  for (size_t k = 0; k < in.size(); ++k) src[k] = in[k] == 1 ? -1 : int(k + lead);
  return select_step(out, in, std::move(src));
}

}  // namespace nnfuse
