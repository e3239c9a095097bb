#include "graph/ops_common.h"

#include <algorithm>

namespace nnfuse {

std::vector<Dim> broadcast_dims(const std::vector<std::vector<Dim>>& shapes, const InferContext& ctx) {
  size_t r = 0;
  for (auto& s : shapes) r = std::max(r, s.size());
  std::vector<Dim> out(r, Dim(1));
  for (size_t d = 0; d < r; ++d) {
    bool have = false;
    Dim res(1);
    for (auto& s : shapes) {
      if (s.size() + d < r) continue;  // implicit leading 1
      const Dim& x = s[d - (r - s.size())];
      if (x.known() && x.value == 1) continue;
      if (!have) { res = x; have = true; continue; }
      if (res.known() && x.known()) {
        if (res.value != x.value) ctx.error("shapes cannot broadcast: dimension " + std::to_string(d) + " is " + std::to_string(res.value) + " and " + std::to_string(x.value));
      } else if (!res.known() && x.known()) {
        res = x;  // a symbolic dim broadcast against n must be n (or 1; assume n)
      } else if (!res.known() && !x.known() && !(res.symbol == x.symbol && !res.symbol.empty())) {
        res = Dim();
      }
    }
    out[d] = res;
  }
  return out;
}

Shape broadcast_shapes(const std::vector<Shape>& shapes) {
  size_t r = 0;
  for (auto& s : shapes) r = std::max(r, s.size());
  Shape out(r, 1);
  for (auto& s : shapes)
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[r - s.size() + i];
      int64_t x = s[i];
      if (x == 1) continue;
      if (o == 1) o = x;
      else if (o != x) {
        std::string all;
        for (auto& t : shapes) all += (all.empty() ? "" : " and ") + shape_str(t);
        fail(ErrorKind::Shape, "shapes " + all + " cannot broadcast");
      }
    }
  return out;
}

int64_t normalize_axis(int64_t axis, int64_t rank, const Node& n) {
  int64_t a = axis < 0 ? axis + rank : axis;
  // A scalar has no axis: callers index the dims with the result (a Split of a rank-0 input read
  // past an empty vector: found by fuzz_onnx_import).
  if (a < 0 || a >= rank)
    fail(ErrorKind::Shape, "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank),
         {"", 0, 0, n.label(), n.op_type});
  return a;
}

std::vector<int64_t> broadcast_strides(const Shape& in, size_t out_rank) {
  std::vector<int64_t> st(out_rank, 0);
  auto s = shape_strides(in);
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] != 1) st[out_rank - in.size() + i] = s[i];
  return st;
}

}  // namespace nnfuse
