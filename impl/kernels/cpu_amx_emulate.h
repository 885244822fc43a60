// AMX tiles emulated in software: the tile instructions the extensions use, as functions over a per-thread copy
// of the eight tile registers, so the AMX paths (W8A8 / W4A8 on AMX-int8, attention on AMX-bf16) build and run
// their tests on a CPU without AMX (`make test-amx-emulated`; IMPL_CPU_AMX_EMULATE=1 adds -DIMPL_AMX_EMULATE to
// every build, impl/kernels/cpp_build.py). Slow (one scalar multiply-add per product) and for tests only.
//
// What it follows, from Intel's SDM (the instructions' pseudo-code): LDTILECFG sets each tile's rows and bytes per
// row and zeroes the tiles; TILELOADD fills a tile's configured rows x bytes from memory (stride apart) and zeroes
// the rest; TILESTORED writes them back; TILEZERO zeroes a tile. TDPBSSD / TDPBUSD / TDPBSUD / TDPBUUD: C[m].i32[n]
// += the four products of A[m].i8[4k..4k+3] and B[k].i8[4n..4n+3] (signed / unsigned bytes as named), over k <
// A's bytes per row / 4, wrapping as int32. TDPBF16PS: C[m].f32[n] += A[m].bf16[2k] * B[k].bf16[2n], then += the
// odd pair's product, each product exact in float32, each sum rounded to nearest even; bf16 denormal inputs read as
// zero and denormal sums flush to zero (DAZ / FTZ), as the instruction does whatever MXCSR says. A shape the
// hardware would fault on (A's bytes per row not 4 x B's rows, C's columns not B's, a tile used unconfigured) is a
// TORCH_CHECK here instead. A real AMX CPU's own rounding of a pair's two products is not guaranteed to be this
// one: the tests that run here assert what holds on both (results against the references within tolerance; a
// row's bits independent of the rows beside it; exact integer sums).
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <cstring>

#ifndef __AMX_TILE__
#define __AMX_TILE__ 1
#endif
#ifndef __AMX_INT8__
#define __AMX_INT8__ 1
#endif
#ifndef __AMX_BF16__
#define __AMX_BF16__ 1
#endif

namespace cpu_amx_emulate {

struct Tiles {
  bool configured = false;
  uint8_t rows[8] = {};
  uint16_t colsb[8] = {};
  alignas(64) uint8_t data[8][16][64] = {};
};

inline Tiles& tiles() {
  static thread_local Tiles t;
  return t;
}

inline void check_tile(const Tiles& t, int i) {
  TORCH_CHECK(t.configured, "emulated AMX: tile instruction before LDTILECFG");
  TORCH_CHECK(i >= 0 && i < 8 && t.rows[i] > 0 && t.colsb[i] > 0, "emulated AMX: tile ", i, " is not configured");
}

// LDTILECFG of palette 1 (64 bytes: palette, start row, 14 reserved, 16 x uint16 colsb, 16 x uint8 rows)
inline void loadconfig(const void* config) {
  const uint8_t* c = static_cast<const uint8_t*>(config);
  Tiles& t = tiles();
  TORCH_CHECK(c[0] == 1, "emulated AMX: palette ", int(c[0]), " (only palette 1 exists)");
  for (int i = 0; i < 8; ++i) {
    uint16_t colsb;
    std::memcpy(&colsb, c + 16 + 2 * i, 2);
    t.rows[i] = c[48 + i];
    t.colsb[i] = colsb;
    TORCH_CHECK(t.rows[i] <= 16 && colsb <= 64 && colsb % 4 == 0, "emulated AMX: tile ", i, " configured as ",
                int(t.rows[i]), " rows x ", colsb, " bytes (at most 16 x 64, bytes a multiple of 4)");
  }
  std::memset(t.data, 0, sizeof(t.data));
  t.configured = true;
}

inline void release() {
  Tiles& t = tiles();
  t = Tiles();
}

inline void zero(int i) {
  Tiles& t = tiles();
  check_tile(t, i);
  std::memset(t.data[i], 0, sizeof(t.data[i]));
}

inline void loadd(int i, const void* base, int64_t stride) {
  Tiles& t = tiles();
  check_tile(t, i);
  std::memset(t.data[i], 0, sizeof(t.data[i]));
  const uint8_t* p = static_cast<const uint8_t*>(base);
  for (int r = 0; r < t.rows[i]; ++r) std::memcpy(t.data[i][r], p + r * stride, t.colsb[i]);
}

inline void stored(int i, void* base, int64_t stride) {
  Tiles& t = tiles();
  check_tile(t, i);
  uint8_t* p = static_cast<uint8_t*>(base);
  for (int r = 0; r < t.rows[i]; ++r) std::memcpy(p + r * stride, t.data[i][r], t.colsb[i]);
}

// C's rows, B's rows (A's bytes per row / 4) and C's columns (B's bytes per row / 4), checked as the hardware's #UD
inline void check_dp(const Tiles& t, int c, int a, int b) {
  check_tile(t, c);
  check_tile(t, a);
  check_tile(t, b);
  TORCH_CHECK(t.rows[c] == t.rows[a] && t.colsb[a] == 4 * t.rows[b] && t.colsb[c] == t.colsb[b],
              "emulated AMX: tile shapes C ", int(t.rows[c]), "x", t.colsb[c], ", A ", int(t.rows[a]), "x", t.colsb[a],
              ", B ", int(t.rows[b]), "x", t.colsb[b], " do not multiply");
  TORCH_CHECK(c != a && c != b && a != b, "emulated AMX: a dot product's tiles must differ");
}

template <bool ASigned, bool BSigned>
inline void dp_int8(int c, int a, int b) {
  Tiles& t = tiles();
  check_dp(t, c, a, b);
  const int M = t.rows[c], N = t.colsb[c] / 4, K = t.colsb[a] / 4;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      int32_t acc;
      std::memcpy(&acc, &t.data[c][m][4 * n], 4);
      uint32_t sum = static_cast<uint32_t>(acc);  // wraps as the instruction does
      for (int k = 0; k < K; ++k)
        for (int i = 0; i < 4; ++i) {
          const int32_t x = ASigned ? int32_t(int8_t(t.data[a][m][4 * k + i])) : int32_t(t.data[a][m][4 * k + i]);
          const int32_t y = BSigned ? int32_t(int8_t(t.data[b][k][4 * n + i])) : int32_t(t.data[b][k][4 * n + i]);
          sum += static_cast<uint32_t>(x * y);
        }
      std::memcpy(&t.data[c][m][4 * n], &sum, 4);
    }
}

inline float bf16_daz(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  if ((h & 0x7F80) == 0) h &= 0x8000;  // denormal (or zero) in: a signed zero
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float ftz(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0) u &= 0x80000000u;
  std::memcpy(&f, &u, 4);
  return f;
}

inline void dp_bf16(int c, int a, int b) {
  Tiles& t = tiles();
  check_dp(t, c, a, b);
  const int M = t.rows[c], N = t.colsb[c] / 4, K = t.colsb[a] / 4;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float acc;
      std::memcpy(&acc, &t.data[c][m][4 * n], 4);
      for (int k = 0; k < K; ++k) {
        // volatile: each sum rounded to float32 on its own (no contraction into an FMA)
        volatile float p0 = bf16_daz(&t.data[a][m][4 * k]) * bf16_daz(&t.data[b][k][4 * n]);
        acc = ftz(acc + p0);
        volatile float p1 = bf16_daz(&t.data[a][m][4 * k + 2]) * bf16_daz(&t.data[b][k][4 * n + 2]);
        acc = ftz(acc + p1);
      }
      std::memcpy(&t.data[c][m][4 * n], &acc, 4);
    }
}

}  // namespace cpu_amx_emulate

// The intrinsics' names (macros in GCC's headers, which immintrin.h included before this header) now call the
// emulation.
#undef _tile_loadd
#undef _tile_stream_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbssd
#undef _tile_dpbsud
#undef _tile_dpbusd
#undef _tile_dpbuud
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) cpu_amx_emulate::loadconfig(config)
#define _tile_release() cpu_amx_emulate::release()
#define _tile_loadd(dst, base, stride) cpu_amx_emulate::loadd((dst), (base), static_cast<int64_t>(stride))
#define _tile_stream_loadd(dst, base, stride) cpu_amx_emulate::loadd((dst), (base), static_cast<int64_t>(stride))
#define _tile_stored(src, base, stride) cpu_amx_emulate::stored((src), (base), static_cast<int64_t>(stride))
#define _tile_zero(dst) cpu_amx_emulate::zero(dst)
#define _tile_dpbssd(c, a, b) cpu_amx_emulate::dp_int8<true, true>((c), (a), (b))
#define _tile_dpbsud(c, a, b) cpu_amx_emulate::dp_int8<true, false>((c), (a), (b))
#define _tile_dpbusd(c, a, b) cpu_amx_emulate::dp_int8<false, true>((c), (a), (b))
#define _tile_dpbuud(c, a, b) cpu_amx_emulate::dp_int8<false, false>((c), (a), (b))
#define _tile_dpbf16ps(c, a, b) cpu_amx_emulate::dp_bf16((c), (a), (b))
