// The SIMD width a C++ extension of impl/kernels was compiled for (-march: native, or IMPL_CPU_MARCH), shared by
// cpu_fused and cpu_attn (each extension's `simd_isa`).
#pragma once

#include <string>

namespace cpu_isa {

// "avx512", "avx2", or `neither` for a build with neither (each extension keeps its own word for that build).
inline std::string simd_width(const char* neither) {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__)
  return "avx2";
#else
  return neither;
#endif
}

}  // namespace cpu_isa
