// The range search of asymmetric int4 quantization at load time (impl/quant/pack.py; its torch reference is
// impl/quant/reference.py's int4_range_choices).
//
// A group of g weights quantized over its min / max range spends its 16 levels on the extremes; a narrower range
// rounds the bulk of the group more finely and clips the few outliers. For each group this tries the range
// [lo * a, hi * b] for a, b in kInt4RangeScales (36 pairs, lo = min(w, 0), hi = max(w, 0)) and picks the pair
// whose dequantized group is nearest in squared error, the first such pair in (a, b) order on a tie. A candidate
// is quantized with the arithmetic pack.py then applies to the chosen one: s = (hi' - lo') / 15 (1 where 0),
// z = clamp(round(-lo' / s), 0, 15), q = clamp(round(w / s) + z, 0, 15), rounding half to even; its error is
// sum (s (q - z) - w)^2 in float32, summed here in another order than torch's (a near-tie may be broken the other
// way: the test allows it). Vectorised over the group (16 or 8 lanes), 36 candidates per group in registers:
// E2B's int4 weights take a few seconds on two cores, where torch's tensor-wide passes took ~20 minutes.

#include "quant_linear.h"
#include "simd.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace cpu_fused {
namespace {

using namespace simd;

constexpr float kInt4RangeScales[] = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f, 0.75f};
constexpr int kScales = 6;

// round half to even of |v| < 2^22 (the default rounding mode's nearbyint; -ffp-contract=off keeps it two adds)
inline vfloat vround(vfloat v) {
  const vfloat magic = vsplat(12582912.f);
  return (v + magic) - magic;
}

// The candidate index (a_index * kScales + b_index) of one group of g weights (g a multiple of kVec).
uint8_t search_group(const float* w, int64_t g) {
  float lo = 0.f, hi = 0.f;
  for (int64_t k = 0; k < g; ++k) {
    lo = std::min(lo, w[k]);
    hi = std::max(hi, w[k]);
  }
  float best = INFINITY;
  uint8_t choice = 0;
  for (int ia = 0; ia < kScales; ++ia) {
    for (int ib = 0; ib < kScales; ++ib) {
      const float l = lo * kInt4RangeScales[ia], h = hi * kInt4RangeScales[ib];
      const float s = (h - l) / 15.f, safe = s > 0.f ? s : 1.f;
      const float z = std::min(15.f, std::max(0.f, std::nearbyint(-l / safe)));
      const vfloat vs = vsplat(s), vsafe = vsplat(safe), vz = vsplat(z), zero = vsplat(0.f), top = vsplat(15.f);
      vfloat acc = vsplat(0.f);
      for (int64_t k = 0; k < g; k += kVec) {
        const vfloat x = vload(w + k);
        vfloat q = vround(x / vsafe) + vz;
        q = q < zero ? zero : q;
        q = q > top ? top : q;
        const vfloat d = vs * (q - vz) - x;
        acc = acc + d * d;
      }
      const float err = hsum(acc);
      if (err < best) {
        best = err;
        choice = static_cast<uint8_t>(ia * kScales + ib);
      }
    }
  }
  return choice;
}

}  // namespace

torch::Tensor int4_range_choices(const torch::Tensor& w, int64_t g) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32 && w.is_contiguous() && w.device().is_cpu(),
              "int4_range_choices takes a contiguous float32 [n, K] CPU weight");
  TORCH_CHECK(g > 0 && g % kVec == 0 && w.size(1) % g == 0, "int4_range_choices: the group size ", g,
              " must divide K = ", w.size(1), " and be a multiple of ", kVec);
  const int64_t n = w.size(0), G = w.size(1) / g;
  auto out = torch::empty({n, G}, w.options().dtype(torch::kUInt8));
  const float* wp = w.data_ptr<float>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, n * G, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) op[i] = search_group(wp + i * g, g);
  });
  return out;
}

}  // namespace cpu_fused
