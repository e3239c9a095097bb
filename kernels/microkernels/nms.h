#pragma once
// NonMaxSuppression (ONNX semantics, as the reference kernel and ONNX Runtime compute it).
//
// The number of selected boxes depends on the data. The kernel writes at most `capacity` rows of
// [batch, class, box] (int64) and returns the actual row count; the caller sizes the output for
// the static bound B * C * min(max_output_boxes_per_class, N) and records the count, so the
// planned (static) memory layout holds for this output too.
//
// Per (batch, class): candidates are the boxes whose score exceeds score_threshold (all boxes
// without one), taken in decreasing score (ties keep box order: a stable sort), each kept unless
// its IoU with an already kept box of that class exceeds iou_threshold, up to
// max_output_boxes_per_class boxes. Boxes are corners [y1, x1, y2, x2] in any order, or
// [cy, cx, h, w] with center_point_box.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace nnfuse::mk {

struct NmsArgs {
  int64_t B = 0, N = 0, C = 0;  // boxes [B, N, 4], scores [B, C, N]
  const float* boxes = nullptr;
  const float* scores = nullptr;
  int64_t max_per_class = 0;
  float iou_threshold = 0.f;
  bool has_score_threshold = false;
  float score_threshold = 0.f;
  bool center_point_box = false;
  int64_t* selected = nullptr;  // [capacity, 3]
  int64_t capacity = 0;
};

namespace detail {
// Boxes with their corners ordered (y0 <= y1, x0 <= x1 unless NaN) and their areas, in columns:
// the values IoU needs, computed once per box rather than in every comparison, as the reference
// kernel (graph/ops_tensor_index.cpp, suppressed_by) computes them, so the decisions are its own.
struct NmsBoxes {
  std::vector<float> y0, x0, y1, x1, area;
  void resize(size_t n) {
    for (auto* v : {&y0, &x0, &y1, &x1, &area}) v->resize(n);
  }
  void set(size_t i, float ya, float xa, float yb, float xb) {
    y0[i] = std::min(ya, yb), y1[i] = std::max(ya, yb), x0[i] = std::min(xa, xb), x1[i] = std::max(xa, xb);
    area[i] = std::abs((xb - xa) * (yb - ya));
  }
  void push(const NmsBoxes& from, size_t i) {
    y0.push_back(from.y0[i]), x0.push_back(from.x0[i]), y1.push_back(from.y1[i]), x1.push_back(from.x1[i]);
    area.push_back(from.area[i]);
  }
  void clear() {
    for (auto* v : {&y0, &x0, &y1, &x1, &area}) v->clear();
  }
};

// Whether box i of `c` has IoU above the threshold with any box of `kept`; degenerate boxes never
// suppress. Branch-free over the kept boxes (up to max_per_class of them), so the loop vectorises:
// SSD's 90 classes x up to 100 kept boxes spent most of NMS's 3.5 ms in the per-pair branches.
inline bool nms_suppressed(const NmsBoxes& c, size_t i, const NmsBoxes& kept, float iou_threshold) {
  const float cy0 = c.y0[i], cx0 = c.x0[i], cy1 = c.y1[i], cx1 = c.x1[i], ca = c.area[i];
  const float *ky0 = kept.y0.data(), *kx0 = kept.x0.data(), *ky1 = kept.y1.data(), *kx1 = kept.x1.data(), *ka = kept.area.data();
  const size_t n = kept.area.size();
  int any = 0;
  for (size_t j = 0; j < n; ++j) {
    const float ix1 = std::max(cx0, kx0[j]), ix2 = std::min(cx1, kx1[j]);
    const float iy1 = std::max(cy0, ky0[j]), iy2 = std::min(cy1, ky1[j]);
    const float inter = std::max(0.0f, ix2 - ix1) * std::max(0.0f, iy2 - iy1);
    const float uni = ca + ka[j] - inter;
    // & rather than &&: no branch per term (the division runs for every pair, its inf or NaN
    // for an empty union then masked by the other terms).
    any |= int(inter > 0) & int(ca > 0) & int(ka[j] > 0) & int(uni > 0) & int(inter / uni > iou_threshold);
  }
  return any != 0;
}
}  // namespace detail

// Returns the number of rows written to a.selected (never more than a.capacity).
inline int64_t nms(const NmsArgs& a) {
  int64_t count = 0;
  if (a.max_per_class <= 0) return 0;
  detail::NmsBoxes bx, kept;
  bx.resize(size_t(a.N));
  std::vector<int64_t> cand;
  for (int64_t b = 0; b < a.B; ++b) {
    for (int64_t i = 0; i < a.N; ++i) {
      const float* p = a.boxes + (b * a.N + i) * 4;
      if (a.center_point_box) bx.set(size_t(i), p[1] - p[3] / 2, p[0] - p[2] / 2, p[1] + p[3] / 2, p[0] + p[2] / 2);
      else bx.set(size_t(i), p[0], p[1], p[2], p[3]);
    }
    for (int64_t cl = 0; cl < a.C; ++cl) {
      const float* s = a.scores + (b * a.C + cl) * a.N;
      cand.clear();
      for (int64_t i = 0; i < a.N; ++i)
        if (!a.has_score_threshold || s[i] > a.score_threshold) cand.push_back(i);
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t x, int64_t y) { return s[x] > s[y]; });
      kept.clear();
      for (int64_t i : cand) {
        if (int64_t(kept.area.size()) >= a.max_per_class || count >= a.capacity) break;
        if (detail::nms_suppressed(bx, size_t(i), kept, a.iou_threshold)) continue;
        kept.push(bx, size_t(i));
        int64_t* row = a.selected + count * 3;
        row[0] = b, row[1] = cl, row[2] = i;
        ++count;
      }
    }
  }
  return count;
}

}  // namespace nnfuse::mk
