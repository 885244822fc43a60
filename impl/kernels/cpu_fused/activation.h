// The MLP's activation for the fused CPU kernels (fused_layer.cpp): GELU-tanh and the gating multiply as one
// vector pass over the gate and up projections' outputs, y = gelu_tanh(gate) * up.
//
// One implementation for every weight kind: the float32 / quantized MLP ran ATen's gelu (Sleef's tanh) and a
// multiply loop, two passes over [rows, I] float32 (7% of a W8A8 E2B prefill on AMX); with oneDNN, GELU and the
// multiply were the gate / up matmuls' post-ops, which cost about what this pass over the plain products does
// (decoder_post at E2B's shapes, 1024 rows on AMX, alternating builds: 37.8-41.5 vs 37.0-41.9 ms). For a W8A8 down
// projection the pass also quantizes each activation row while it is in cache (fused_layer.cpp).
//
// Numerics: gelu_tanh(x) = 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), computed as
// x / (1 + exp(-2u)) (the same function: 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u))). exp is 2^t by a degree-6
// polynomial and VSCALEFPS with AVX-512 (vexp2), Cephes' single precision one (Cody-Waite reduction, a degree-6
// polynomial) on AVX2 and below: ~1 ulp either way, so the result is within a few float32 ulps of ATen's gelu
// (Sleef's tanh) and the same for every row count (an ISA's own bits: the AVX2 build's may differ by an ulp).
// Where exp(-2u) passes ~2^127 (x < -8.4) it is taken as infinity: the result is -0 (ATen: -0 or a
// denormal-sized value). With bf16 rows each step rounds to bf16 where the eager bf16 model rounds:
// gelu's output, then the product (ATen's bf16 ops compute in float32 and round); with AVX512-BF16 each rounding
// is one VCVTNEPS2BF16 (bf16_pack). Old / new on the AMX Xeon, 60 calls on [256, 6144] rows from cache (E2B's
// 1024-row prefill, 2 threads): bf16 38.2 -> 26.3 ms, float32 26.9 -> 20.8 ms.
#pragma once

#include "../cpu_vmath.h"
#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace cpu_fused::act {

using simd::kVec;
using simd::vfloat;
using simd::vi32;
using simd::vu32;

// exp(a) for a in [-87, 89] (clamped there; exp(89) > FLT_MAX gives +inf: 2^128's bit pattern).
inline vfloat vexp(vfloat a) {
  a = a < -87.f ? simd::vsplat(-87.f) : a;
  a = a > 89.f ? simd::vsplat(89.f) : a;
  // n = round(a / ln 2) by the 1.5 * 2^23 trick (round to nearest even, exact for |a / ln 2| < 2^22)
  const vfloat magic = simd::vsplat(12582912.f);
  const vfloat n = simd::vfma(a, simd::vsplat(1.44269504088896341f), magic) - magic;
  // r = a - n ln 2 in two steps (Cody-Waite: 0.693359375 is exact in 9 bits)
  vfloat r = simd::vfma(n, simd::vsplat(-0.693359375f), a);
  r = simd::vfma(n, simd::vsplat(2.12194440e-4f), r);
  vfloat p = simd::vsplat(1.9875691500e-4f);
  p = simd::vfma(p, r, simd::vsplat(1.3981999507e-3f));
  p = simd::vfma(p, r, simd::vsplat(8.3334519073e-3f));
  p = simd::vfma(p, r, simd::vsplat(4.1665795894e-2f));
  p = simd::vfma(p, r, simd::vsplat(1.6666665459e-1f));
  p = simd::vfma(p, r, simd::vsplat(5.0000001201e-1f));
  p = simd::vfma(p, r * r, r) + 1.f;
  // 2^n as float32 bits: n in [-126, 128]; n = 128 gives the exponent field 255 with a zero mantissa (+inf)
  const vu32 bits = reinterpret_cast<vu32>(__builtin_convertvector(n, vi32) + 127) << 23;
  return p * reinterpret_cast<vfloat>(bits);
}

// 1 / d for d >= 1 (or +inf): the ISA's reciprocal estimate and one Newton step, r (2 - d r), within ~2 ulps of
// the quotient (a division's throughput, one per 5-10 cycles per vector, made the pass divide-bound).
inline vfloat vrcp(vfloat d) {
#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__AVX512F__)
  const vfloat r = reinterpret_cast<vfloat>(_mm512_rcp14_ps(reinterpret_cast<__m512>(d)));
#else
  const vfloat r = reinterpret_cast<vfloat>(_mm256_rcp_ps(reinterpret_cast<__m256>(d)));
#endif
  // (at d = +inf the estimate is 0 and the step would give 0 * (2 - inf * 0) = NaN: the estimate is kept there)
  const vfloat refined = r * simd::vfma(-d, r, simd::vsplat(2.f));
  return r == 0.f ? r : refined;
#else
  return 1.f / d;
#endif
}

// 2^t for any t (AVX-512): t = n + f with n the nearest integer, 2^f by its degree-6 Taylor polynomial on
// |f| <= 1/2 (relative error < 1.7e-7 in exact arithmetic: about an ulp, as Cephes' exp above) and 2^n by
// VSCALEFPS, which takes t past the float range to +inf or 0 without the clamps vexp needs; NaN stays NaN.
// Half of vexp's instructions (the activation pass is bound by its arithmetic).
#if defined(__AVX512F__)
inline vfloat vexp2(vfloat t) {
  const __m512 u = reinterpret_cast<__m512>(t);
  const __m512 n = _mm512_roundscale_ps(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(u, n);
  const __m512 p = cpu_vmath::exp2_taylor<6>(f);
  return reinterpret_cast<vfloat>(_mm512_scalef_ps(p, n));
}
#endif

// gelu_tanh(x) = x / (1 + exp(-2 sqrt(2/pi) (x + 0.044715 x^3))). NaN stays NaN.
inline vfloat vgelu_tanh(vfloat x) {
  const vfloat inner = simd::vfma(x * x, simd::vsplat(0.044715f) * x, x);  // x + 0.044715 x^3
#if defined(__AVX512F__)
  const vfloat e = vexp2(inner * simd::vsplat(-1.5957691216057308f * 1.44269504088896341f));  // exp(-2u) as 2^t
#else
  const vfloat e = vexp(inner * simd::vsplat(-1.5957691216057308f));  // exp(-2u)
#endif
  return x * vrcp(e + 1.f);
}

// float32 -> bf16 bits (in the low half of each lane), rounded to nearest even, every NaN 0x7FC0: c10::BFloat16's
// rounding (the attention kernels' bf16 output rows use the same, cpu_vmath.h).
inline vu32 bf16_bits(vfloat v) { return cpu_vmath::bf16_round_bits(reinterpret_cast<vu32>(v)); }
#if defined(__AVX512F__) && defined(__AVX512BF16__)
// kVec bf16 values in one 256-bit vector, bf16_bits' bits. VCVTNEPS2BF16 rounds to nearest even in one
// instruction, but keeps a NaN's sign and payload and takes denormal inputs as zero: a vector holding either
// (VFPCLASSPS: QNaN 0x01, denormal 0x20, SNaN 0x80; rare) takes the integer rounding above.
inline __m256i bf16_pack(vfloat v) {
  const __m512 f = reinterpret_cast<__m512>(v);
  if (__builtin_expect(_mm512_fpclass_ps_mask(f, 0xA1) != 0, 0))
    return _mm512_cvtepi32_epi16(reinterpret_cast<__m512i>(bf16_bits(v)));
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(f));
}
inline void vstore_bf16(uint16_t* p, vfloat v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf16_pack(v)); }
inline vfloat round_bf16(vfloat v) {
  return reinterpret_cast<vfloat>(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_pack(v)), 16));
}
#else
inline void vstore_bf16(uint16_t* p, vfloat v) { simd::vstore_u16(p, bf16_bits(v)); }
inline vfloat round_bf16(vfloat v) { return reinterpret_cast<vfloat>(bf16_bits(v) << 16); }
#endif

// Rows of float32 or bf16 (uint16_t bits), widened to and narrowed from float32 vectors.
inline vfloat vload_f32(const float* p) { return simd::vload(p); }
inline vfloat vload_f32(const uint16_t* p) { return simd::vload_bf16(p); }
inline void vstore_f32(float* p, vfloat v) { simd::vstore(p, v); }
inline void vstore_f32(uint16_t* p, vfloat v) { vstore_bf16(p, v); }

// out[j] = gelu_tanh(g[j]) * u[j] for j < n, T float or uint16_t (bf16 bits: gelu's output rounded to bf16 before
// the multiply and the product rounded, r(r(gelu_tanh(g)) * u)); out may be g or u. A tail shorter than the vector
// runs the same vector code on a padded copy (the same bits as in a full one).
template <class T>
inline void gelu_mul(const T* g, const T* u, T* out, int64_t n) {
  auto one = [](const T* gv, const T* uv, T* ov) {
    vfloat y = vgelu_tanh(vload_f32(gv));
    if constexpr (std::is_same_v<T, uint16_t>) y = round_bf16(y);
    vstore_f32(ov, y * vload_f32(uv));
  };
  int64_t j = 0;
  for (; j + kVec <= n; j += kVec) one(g + j, u + j, out + j);
  if (j == n) return;
  alignas(64) T gb[kVec] = {}, ub[kVec] = {}, ob[kVec];
  std::copy(g + j, g + n, gb);
  std::copy(u + j, u + n, ub);
  one(gb, ub, ob);
  std::copy(ob, ob + (n - j), out + j);
}

}  // namespace cpu_fused::act
