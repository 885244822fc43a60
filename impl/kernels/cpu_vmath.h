// Vector math shared by the C++ extensions (impl/kernels/cpu_fused, impl/kernels/cpu_attn), each on its own GCC
// vector types: c10's bf16 rounding and the 2^f polynomial of the VSCALEFPS exponentials.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace cpu_vmath {

// float32 bits (any GCC vector of uint32 lanes) -> bf16 bits in the low half of each lane, rounded to nearest
// even, every NaN 0x7FC0: c10::BFloat16's rounding.
template <class VU>
inline VU bf16_round_bits(VU u) {
  const VU rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? VU{} + 0x7FC0u : rounded;
}

#if defined(__AVX512F__)
// 2^f for |f| <= 1/2 by its Taylor polynomial of degree 5 (relative error < 3e-6: the attention's P, rounded to
// bf16) or 6 (< 1.7e-7, about an ulp: the MLP's GELU), by Horner's rule from the top coefficient. The caller
// scales it by 2^n with VSCALEFPS.
template <int Degree>
inline __m512 exp2_taylor(__m512 f) {
  static_assert(Degree == 5 || Degree == 6, "exp2_taylor: degree 5 or 6");
  constexpr float c[7] = {1.f,           6.9314718056e-1f, 2.4022650696e-1f, 5.5504108665e-2f,
                          9.6181291076e-3f, 1.3333558146e-3f, 1.5403530393e-4f};  // (ln 2)^k / k!
  __m512 p = _mm512_set1_ps(c[Degree]);
  for (int k = Degree - 1; k >= 0; --k) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[k]));
  return p;
}
#endif

}  // namespace cpu_vmath
