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
struct NmsBox {
  float y1, x1, y2, x2;
};

// IoU(a, b) > threshold, on normalised corners; degenerate boxes never suppress.
inline bool nms_suppresses(const NmsBox& a, const NmsBox& b, float iou_threshold) {
  const float ix1 = std::max(std::min(a.x1, a.x2), std::min(b.x1, b.x2));
  const float ix2 = std::min(std::max(a.x1, a.x2), std::max(b.x1, b.x2));
  const float iy1 = std::max(std::min(a.y1, a.y2), std::min(b.y1, b.y2));
  const float iy2 = std::min(std::max(a.y1, a.y2), std::max(b.y1, b.y2));
  const float inter = std::max(0.0f, ix2 - ix1) * std::max(0.0f, iy2 - iy1);
  if (inter <= 0) return false;
  const float area_a = std::abs((a.x2 - a.x1) * (a.y2 - a.y1)), area_b = std::abs((b.x2 - b.x1) * (b.y2 - b.y1));
  const float uni = area_a + area_b - inter;
  if (area_a <= 0 || area_b <= 0 || uni <= 0) return false;
  return inter / uni > iou_threshold;
}
}  // namespace detail

// Returns the number of rows written to a.selected (never more than a.capacity).
inline int64_t nms(const NmsArgs& a) {
  int64_t count = 0;
  if (a.max_per_class <= 0) return 0;
  std::vector<detail::NmsBox> bx(size_t(a.N));
  std::vector<int64_t> cand, kept;
  for (int64_t b = 0; b < a.B; ++b) {
    for (int64_t i = 0; i < a.N; ++i) {
      const float* p = a.boxes + (b * a.N + i) * 4;
      if (a.center_point_box) bx[size_t(i)] = {p[1] - p[3] / 2, p[0] - p[2] / 2, p[1] + p[3] / 2, p[0] + p[2] / 2};
      else bx[size_t(i)] = {p[0], p[1], p[2], p[3]};
    }
    for (int64_t cl = 0; cl < a.C; ++cl) {
      const float* s = a.scores + (b * a.C + cl) * a.N;
      cand.clear();
      for (int64_t i = 0; i < a.N; ++i)
        if (!a.has_score_threshold || s[i] > a.score_threshold) cand.push_back(i);
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t x, int64_t y) { return s[x] > s[y]; });
      kept.clear();
      for (int64_t i : cand) {
        if (int64_t(kept.size()) >= a.max_per_class || count >= a.capacity) break;
        bool drop = false;
        for (int64_t j : kept)
          if (detail::nms_suppresses(bx[size_t(i)], bx[size_t(j)], a.iou_threshold)) {
            drop = true;
            break;
          }
        if (drop) continue;
        kept.push_back(i);
        int64_t* row = a.selected + count * 3;
        row[0] = b, row[1] = cl, row[2] = i;
        ++count;
      }
    }
  }
  return count;
}

}  // namespace nnfuse::mk
