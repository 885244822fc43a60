// SIMD vectors of the fused CPU kernels as GCC vector types (linear.cpp, quant_linear.cpp): 16 floats (one
// zmm) with AVX-512, 8 (one ymm) with AVX2, else 4.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace cpu_fused::simd {

#if defined(__AVX512F__)
constexpr int64_t kVec = 16;
#elif defined(__AVX2__)
constexpr int64_t kVec = 8;
#else
constexpr int64_t kVec = 4;
#endif
typedef float vfloat __attribute__((vector_size(kVec * sizeof(float))));
typedef float vfloat_u __attribute__((vector_size(kVec * sizeof(float)), aligned(alignof(float))));
typedef uint16_t vbf16_u __attribute__((vector_size(kVec * sizeof(uint16_t)), aligned(alignof(uint16_t))));
typedef uint32_t vu32 __attribute__((vector_size(kVec * sizeof(uint32_t))));
typedef int32_t vi32 __attribute__((vector_size(kVec * sizeof(int32_t))));
typedef int8_t vi8_u __attribute__((vector_size(kVec), aligned(1)));
typedef uint8_t vu8_u __attribute__((vector_size(kVec), aligned(1)));

inline vfloat vload(const float* p) { return *reinterpret_cast<const vfloat_u*>(p); }
inline void vstore(float* p, vfloat v) { *reinterpret_cast<vfloat_u*>(p) = v; }
inline vfloat vsplat(float f) { return vfloat{} + f; }
// f in every lane (-0 stays -0, unlike vsplat's 0 + f)
inline vfloat vbroadcast(float f) {
#if defined(__AVX512F__)
  return _mm512_set1_ps(f);
#elif defined(__AVX2__)
  return _mm256_set1_ps(f);
#else
  return vfloat{f, f, f, f};
#endif
}
// a * b + c in one rounding where the CPU has FMA (the build keeps -ffp-contract=off for the layer
// kernels' RoPE, so the contraction is spelled out here).
inline vfloat vfma(vfloat a, vfloat b, vfloat c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__AVX2__) && defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}
// kVec bf16 values widened to float32: each one's 16 bits become the top half of a float32 (exact).
// (The widening is spelled out where the ISA has it: GCC's generic conversion of 16-bit lanes shuffles through
// several permutes per vector.)
inline vfloat vload_bf16(const uint16_t* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<vfloat>(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
#elif defined(__AVX2__)
  return reinterpret_cast<vfloat>(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
#else
  const vu32 wide = __builtin_convertvector(*reinterpret_cast<const vbf16_u*>(p), vu32) << 16;
  return reinterpret_cast<vfloat>(wide);
#endif
}
// The low 16 bits of each 32-bit lane (lanes holding values < 2^16) stored as kVec uint16.
inline void vstore_u16(uint16_t* p, vu32 v) {
#if defined(__AVX512F__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(reinterpret_cast<__m512i>(v)));
#elif defined(__AVX2__)
  const __m256i w = reinterpret_cast<__m256i>(v);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
#else
  typedef uint16_t vu16 __attribute__((vector_size(kVec * sizeof(uint16_t))));
  *reinterpret_cast<vbf16_u*>(p) = __builtin_convertvector(v, vu16);
#endif
}
// kVec signed bytes as float32 (exact). (The byte-vector conversions are spelled out: GCC widens a vector of
// bytes through scalar code.)
inline vfloat vload_i8(const uint8_t* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<vfloat>(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))));
#elif defined(__AVX2__)
  return reinterpret_cast<vfloat>(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
#else
  return __builtin_convertvector(__builtin_convertvector(*reinterpret_cast<const vi8_u*>(p), vi32), vfloat);
#endif
}
// kVec unsigned bytes as int32 lanes.
inline vi32 vload_u8(const uint8_t* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<vi32>(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  return reinterpret_cast<vi32>(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  return __builtin_convertvector(*reinterpret_cast<const vu8_u*>(p), vi32);
#endif
}
// kVec int32 lanes (each within int8's range) stored as kVec signed bytes.
inline void vstore_i8(int8_t* p, vi32 v) {
#if defined(__AVX512F__)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(reinterpret_cast<__m512i>(v)));
#else
  typedef int8_t vi8 __attribute__((vector_size(kVec)));
  *reinterpret_cast<vi8_u*>(p) = __builtin_convertvector(v, vi8);
#endif
}
inline float bf16_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float hsum(vfloat v) {
  float s = 0.f;
  for (int64_t i = 0; i < kVec; ++i) s += v[i];
  return s;
}

}  // namespace cpu_fused::simd
