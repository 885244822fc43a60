// Quantized linear weights (layout: quant_linear.h; torch reference: impl/quant/reference.py).
//
// W8A8 runs every row count through one integer kernel: the activations are quantized per row, each
// output is an exact int32 dot product of codes, then float(acc) * s_w * s_x. Exact integers make the
// result of a row independent of the kernel's blocking and of the other rows, so YOCO fast prefill (the
// back half on a few rows) and the full prefill give the same bits.
//
// The integer dot uses AVX2's byte multiply-add (the CPU kinds this project meets all have AVX2): vpmaddubsw
// multiplies unsigned by signed bytes into saturating 16-bit pair sums, so the signs move to x
// (|w| * (x * sign(w)) = w * x) and a pair sums to at most 2 * 128 * 127 = 32512: it never saturates. (oneDNN's
// int8 matmul on a CPU without VNNI feeds unsigned activations straight in and does saturate, measured: its
// results were off by up to 2e5 on full-range codes, so it is not used here.)
//
// W8A16 / W4A16 are bound by the bytes of weight read per decode step: the row kernel reads each weight
// row once per call and widens its codes to float32 in registers (one group's partial sums scaled at the
// group's end). On AVX2 the widening is what limits it (2 cores cannot widen int4 codes as fast as memory
// delivers them with a plain widening chain), so the AVX2 kernels spend as few instructions per code as
// they can: W8A16 reads 4 weight rows per pass (one x load feeds 4 FMAs); W4A16 splits 64 nibbles with
// two byte ops, spreads them to int32 lanes with one vpshufb per 8 codes (x is permuted once per call into
// that order), and folds the zero point into a per-group sum of x (sum (q - z) x = sum q x - z sum x, the
// sums of x computed once per call), so the inner loop is spread, convert, FMA. Above
// kQuantRowKernelMaxRows rows, blocks of rows are dequantized to float32 (~2 MB, once per call, vectorised)
// for ATen's mm, as the bf16 weights' widened GEMM does (linear.cpp); a bf16 model's (bf16_dot) on AMX-bf16 or
// AVX-512 BF16 takes the codes as bf16 operands from kWoBf16MinRows rows instead (wo_amx_kernel, wo_bf16_kernel).

#include "linear.h"
#include "quant_linear.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../cpu_aligned.h"
#include "../cpu_amx.h"
#include "activation.h"
#include "simd.h"

namespace cpu_fused {
namespace {

using namespace simd;
using cpu_mem::avector;  // tile and vector buffers: 64-byte aligned (cpu_aligned.h)

// Weights under this many elements take the row kernel at every row count (linear.cpp: kSmallWeightElems).
constexpr int64_t kQuantSmallWeightElems = int64_t{1} << 16;
// Every group size is a multiple of this (the kernels have no tail loop; 32: one AVX2 byte vector).
constexpr int64_t kGroupMultiple = 32;

inline float load_f32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}
// 4 activation codes as one int32 (to broadcast against a line of 4-byte weight groups)
inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Where a tiled W4A8 weight keeps the 16-row tile half from weight row `row` (a multiple of 16) in group gi: its
// g / 8 lines of codes, and its 16 scales (its 16 zero points 128 bytes further on).
inline const uint8_t* w4_tiled_codes(const QuantView& q, int64_t row, int64_t gi) {
  return q.data + ((row / 32) * q.G + gi) * q.B + ((row / 16) % 2) * 8 * q.g;
}
inline const uint8_t* w4_tiled_meta(const QuantView& q, int64_t row, int64_t gi) {  // the half's 16 scales; +128: zeros
  return q.data + ((row / 32) * q.G + gi) * q.B + 16 * q.g + ((row / 16) % 2) * 64;
}

// body(lo, hi) over blocks [0, blocks): on this thread when there is one thread or at most `grain` blocks,
// else split across threads `grain` blocks at a time (every row-block kernel below dispatches this way).
template <typename F>
inline void for_blocks(int64_t blocks, int64_t grain, const F& body) {
  if (at::get_num_threads() == 1 || blocks <= grain) {
    body(0, blocks);
  } else {
    at::parallel_for(0, blocks, grain, body);
  }
}

// The lines of bytes [0, B) of R rows (rowB apart, from p) pf bytes ahead: B = 1 asks for one line per row.
template <int R>
inline void prefetch_groups(const uint8_t* p, int64_t rowB, int64_t B, int64_t pf) {
  for (int r = 0; r < R; ++r) {
    const char* a = reinterpret_cast<const char*>(p + r * rowB + pf);
    _mm_prefetch(a, _MM_HINT_T1);  // the first and the last line (a group of 128 int4 codes: 72 bytes)
    for (int64_t o = 64; o < B - 64; o += 64) _mm_prefetch(a + o, _MM_HINT_T1);
    if (B > 1) _mm_prefetch(a + B - 1, _MM_HINT_T1);
  }
}

// A thread's blocks [lo, hi) as two streams: the blocks lo + i and lo + half + i together (pair, with js[2]), then
// the odd one left alone (one, with js[1]).
template <typename Pair, typename One>
inline void in_two_streams(int64_t lo, int64_t hi, const Pair& pair, const One& one) {
  const int64_t half = (hi - lo) / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t js[2] = {lo + i, lo + half + i};
    pair(js);
  }
  if ((hi - lo) % 2) {
    const int64_t js[1] = {hi - 1};
    one(js);
  }
}

// ---- weight-only kinds: the row kernel ------------------------------------------------------------------

// out[m, n] for R weight rows (rowB bytes apart) and MT rows of x (ldx apart). Per group, one accumulator
// vector per (row, x row); at the group's end it is scaled into the running vector, whose lanes are summed
// last. The order of every sum is fixed by the layout alone.
template <QuantKind Kd, int R, int MT>
inline void wo_tile(const float* x, int64_t ldx, const uint8_t* w, int64_t rowB, const QuantView& q, float* out,
                    int64_t ldo, int64_t pf = 0) {
  vfloat tot[R][MT];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) tot[r][m] = vfloat{};
  const int64_t g = q.g;
  for (int64_t gi = 0; gi < q.G; ++gi) {
    const uint8_t* blk = w + gi * q.B;
    const float* xg = x + gi * g;
    vfloat acc[R][MT];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < MT; ++m) acc[r][m] = vfloat{};
    if constexpr (Kd == QuantKind::kW4A16) {
      if (pf) prefetch_groups<R>(blk, rowB, q.B, pf);
      const int64_t half = g / 2;
      vfloat z[R];
      for (int r = 0; r < R; ++r) z[r] = vsplat(load_f32(blk + r * rowB + half + 4));
      for (int64_t j = 0; j < half; j += kVec) {
        vfloat lo[R], hi[R];
        for (int r = 0; r < R; ++r) {
          const vi32 b = vload_u8(blk + r * rowB + j);
          lo[r] = __builtin_convertvector(b & 15, vfloat) - z[r];
          hi[r] = __builtin_convertvector(b >> 4, vfloat) - z[r];
        }
        for (int m = 0; m < MT; ++m) {
          const vfloat xl = vload(xg + m * ldx + j), xh = vload(xg + m * ldx + half + j);
          for (int r = 0; r < R; ++r) acc[r][m] = vfma(hi[r], xh, vfma(lo[r], xl, acc[r][m]));
        }
      }
      for (int r = 0; r < R; ++r) {
        const vfloat s = vsplat(load_f32(blk + r * rowB + half));
        for (int m = 0; m < MT; ++m) tot[r][m] = vfma(s, acc[r][m], tot[r][m]);
      }
    } else {
      if (pf) prefetch_groups<R>(blk + g, rowB, q.B - g, pf);  // the scale's line
      for (int64_t k = 0; k < g; k += kVec) {
        if (pf && k % 64 == 0) prefetch_groups<R>(blk + k, rowB, 1, pf);
        vfloat wv[R];
        for (int r = 0; r < R; ++r) wv[r] = vload_i8(blk + r * rowB + k);
        for (int m = 0; m < MT; ++m) {
          const vfloat xv = vload(xg + m * ldx + k);
          for (int r = 0; r < R; ++r) acc[r][m] = vfma(wv[r], xv, acc[r][m]);
        }
      }
      for (int r = 0; r < R; ++r) {
        const vfloat s = vsplat(load_f32(blk + r * rowB + g));
        for (int m = 0; m < MT; ++m) tot[r][m] = vfma(s, acc[r][m], tot[r][m]);
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) out[m * ldo + r] = hsum(tot[r][m]);
}

#if defined(__AVX2__)
inline int32_t hsum_i32(__m256i v) {  // exact: integers
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#define QUANT_AVX2_ROWS 1

inline float hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

// W4A16 on AVX2, R weight rows x MT rows of x. x arrives permuted (w4_permute_x) and with its per-group sums
// xs [MT, G] (ldxs apart). Each output keeps two accumulators (codes alternate between them), the same for
// every MT, so a row's result never depends on how many rows share its tile.
template <int R, int MT>
inline void w4_tile_avx2(const float* xp, int64_t ldx, const float* xs, int64_t ldxs, const uint8_t* w, int64_t rowB,
                         const QuantView& q, float* out, int64_t ldo, int64_t pf = 0) {
  const int64_t g = q.g, half = g / 2;
  const __m256i m4 = _mm256_set1_epi8(15);
  // spread[k]: bytes 4k..4k+3 of each 128-bit lane into the low bytes of its 4 int32 lanes
  __m256i spread[4];
  for (int k = 0; k < 4; ++k)
    spread[k] = _mm256_setr_epi8(4 * k, -1, -1, -1, 4 * k + 1, -1, -1, -1, 4 * k + 2, -1, -1, -1, 4 * k + 3, -1, -1, -1,
                                 4 * k, -1, -1, -1, 4 * k + 1, -1, -1, -1, 4 * k + 2, -1, -1, -1, 4 * k + 3, -1, -1, -1);
  __m256 tot[R][MT];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) tot[r][m] = _mm256_setzero_ps();
  for (int64_t gi = 0; gi < q.G; ++gi) {
    const uint8_t* blk = w + gi * q.B;
    const float* xg = xp + gi * g;
    if (pf) prefetch_groups<R>(blk, rowB, q.B, pf);
    __m256 acc[R][MT][2];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < MT; ++m) acc[r][m][0] = acc[r][m][1] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= half; j += 32) {  // 64 codes: bytes j..j+31, low nibbles then high nibbles
      const float* xj = xg + 2 * j;
      for (int r = 0; r < R; ++r) {
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + r * rowB + j));
        const __m256i nib[2] = {_mm256_and_si256(b, m4), _mm256_and_si256(_mm256_srli_epi16(b, 4), m4)};
        for (int k = 0; k < 8; ++k) {
          const __m256 wv = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(nib[k / 4], spread[k % 4]));
          for (int m = 0; m < MT; ++m) acc[r][m][k % 2] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xj + m * ldx + 8 * k), acc[r][m][k % 2]);
        }
      }
    }
    if (j < half) {  // 32 codes (groups of 32, 96, ...): bytes j..j+15 in both lanes, spread in natural order
      const float* xj = xg + 2 * j;
      const __m256i tail[2] = {
          _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1),
          _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1, 12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15, -1, -1, -1)};
      for (int r = 0; r < R; ++r) {
        const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + r * rowB + j)));
        const __m256i nib[2] = {_mm256_and_si256(b, m4), _mm256_and_si256(_mm256_srli_epi16(b, 4), m4)};
        for (int k = 0; k < 4; ++k) {
          const __m256 wv = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(nib[k / 2], tail[k % 2]));
          for (int m = 0; m < MT; ++m) acc[r][m][k % 2] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xj + m * ldx + 8 * k), acc[r][m][k % 2]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 s = _mm256_set1_ps(load_f32(blk + r * rowB + half));
      const __m256 z = _mm256_set1_ps(load_f32(blk + r * rowB + half + 4));
      for (int m = 0; m < MT; ++m) {
        // sum (q - z) x: every lane takes an eighth of z * sum x (exact: a power of two)
        const __m256 a = _mm256_fnmadd_ps(z, _mm256_set1_ps(xs[m * ldxs + gi] * 0.125f), _mm256_add_ps(acc[r][m][0], acc[r][m][1]));
        tot[r][m] = _mm256_fmadd_ps(s, a, tot[r][m]);
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) out[m * ldo + r] = hsum8(tot[r][m]);
}

// x [M, K] -> xp [M, K] in w4_tile_avx2's order (per group, per 64 codes at byte j: the x of the low
// nibbles in vpshufb-spread order, then those of the high nibbles; a 32-code tail keeps natural order) and
// xs [M, G]: each group's sum of x (in input order, so it depends on x's row alone).
void w4_permute_x(const float* x, int64_t M, const QuantView& q, float* xp, float* xs) {
  const int64_t g = q.g, half = g / 2;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t gi = 0; gi < q.G; ++gi) {
      const float* src = x + m * q.K + gi * g;
      float* dst = xp + m * q.K + gi * g;
      float sum = 0.f;
      for (int64_t k = 0; k < g; ++k) sum += src[k];
      xs[m * q.G + gi] = sum;
      int64_t j = 0;
      for (; j + 32 <= half; j += 32)
        for (int h = 0; h < 2; ++h)
          for (int k = 0; k < 4; ++k)
            for (int i = 0; i < 8; ++i) dst[2 * j + 32 * h + 8 * k + i] = src[h * half + j + (i / 4) * 16 + 4 * k + i % 4];
      for (; j < half; j += 16)
        for (int h = 0; h < 2; ++h)
          for (int i = 0; i < 16; ++i) dst[2 * j + 16 * h + i] = src[h * half + j + i];
    }
  }
}
#endif

// Weight rows per pass: W8A16 4 (8 accumulators + 4 weight vectors of AVX2's 16 ymm at 2 x rows); W4A16 2
// (its AVX2 tile keeps two accumulators per output).
template <QuantKind Kd>
constexpr int kWoRows = Kd == QuantKind::kW8A16 ? 4 : 2;
constexpr int kWoTile = 2;

// x: [M, K] float32 (W4A16 on AVX2: permuted, with xs its group sums [M, G]).
template <QuantKind Kd, int R>
inline void wo_rows(const float* x, const float* xs, int64_t M, const uint8_t* w, const QuantView& q, float* out, int64_t N,
                    int64_t pf = 0) {
  const int64_t rowB = q.G * q.B, K = q.K;
  int64_t m = 0;
#if defined(QUANT_AVX2_ROWS)
  if constexpr (Kd == QuantKind::kW4A16) {  // tiles of 2 x rows take one weight row at a time (16 ymm)
    for (; m + kWoTile <= M; m += kWoTile)
      for (int r = 0; r < R; ++r)
        w4_tile_avx2<1, kWoTile>(x + m * K, K, xs + m * q.G, q.G, w + r * rowB, rowB, q, out + m * N + r, N, pf);
    for (; m < M; ++m) w4_tile_avx2<R, 1>(x + m * K, K, xs + m * q.G, q.G, w, rowB, q, out + m * N, N, pf);
    return;
  }
#endif
  for (; m + kWoTile <= M; m += kWoTile) wo_tile<Kd, R, kWoTile>(x + m * K, K, w, rowB, q, out + m * N, N, pf);
  for (; m < M; ++m) wo_tile<Kd, R, 1>(x + m * K, K, w, rowB, q, out + m * N, N, pf);
}

template <QuantKind Kd>
void wo_row_kernel(const float* x, const float* xs, int64_t M, const QuantView& q, float* out) {
  constexpr int R = kWoRows<Kd>;
  const int64_t N = q.N, rowB = q.G * q.B;
  const int64_t blocks = N / R;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, rowB * R));
  auto body = [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {  // decode's row counts ask for the rows kPrefetchRows ahead
      const bool ahead = M <= kWoTile && (b + 1) * R + kPrefetchRows <= N;
      wo_rows<Kd, R>(x, xs, M, q.data + b * R * rowB, q, out + b * R, N, ahead ? kPrefetchRows * rowB : 0);
    }
  };
  for_blocks(blocks, grain, body);
  for (int64_t n = blocks * R; n < N; ++n) wo_rows<Kd, 1>(x, xs, M, q.data + n * rowB, q, out + n, N);
}

// Rows [n0, n0 + nb) of dequant(w) into dst [nb, K] float32.
void dequant_rows(const QuantView& q, int64_t n0, int64_t nb, float* dst) {
  const int64_t rowB = q.G * q.B;
  auto body = [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) {
      const uint8_t* row = q.data + (n0 + n) * rowB;
      float* d = dst + n * q.K;
      for (int64_t gi = 0; gi < q.G; ++gi) {
        const uint8_t* blk = row + gi * q.B;
        float* dg = d + gi * q.g;
        // the reference's arithmetic lane by lane ((q - z) * s, q * s: no FMA), so the same bits
        if (q.kind == QuantKind::kW4A16 || q.kind == QuantKind::kW4A8) {
          const int64_t half = q.g / 2;
          const float s = load_f32(blk + half), z = load_f32(blk + half + 4);
          const vfloat vs = vsplat(s), vz = vsplat(z);
          int64_t j = 0;
          for (; j + kVec <= half; j += kVec) {
            const vi32 b = vload_u8(blk + j);
            vstore(dg + j, (__builtin_convertvector(b & 15, vfloat) - vz) * vs);
            vstore(dg + half + j, (__builtin_convertvector(b >> 4, vfloat) - vz) * vs);
          }
          for (; j < half; ++j) {
            dg[j] = (static_cast<float>(blk[j] & 15) - z) * s;
            dg[half + j] = (static_cast<float>(blk[j] >> 4) - z) * s;
          }
        } else {
          const float s = load_f32(blk + q.g);
          const vfloat vs = vsplat(s);
          for (int64_t k = 0; k < q.g; k += kVec) vstore(dg + k, vload_i8(blk + k) * vs);  // g: a multiple of 32
        }
      }
    }
  };
  if (at::get_num_threads() == 1 || nb < 64) {
    body(0, nb);
  } else {
    at::parallel_for(0, nb, 16, body);
  }
}

constexpr int64_t kDequantBlockBytes = int64_t{2} << 20;

torch::Tensor dequant_mm(const torch::Tensor& x, const QuantView& q) {
  const int64_t M = x.size(0), K = q.K, N = q.N;
  auto out = torch::empty({M, N}, x.options().dtype(torch::kFloat32));
  int64_t nb = std::max<int64_t>(16, kDequantBlockBytes / (K * 4)) / 16 * 16;
  nb = std::min(nb, N);
  auto buf = torch::empty({nb, K}, out.options());
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t rows = std::min(nb, N - n0);
    auto blk = buf.narrow(0, 0, rows);
    dequant_rows(q, n0, rows, blk.data_ptr<float>());
    auto dst = out.narrow(1, n0, rows);
    torch::mm_out(dst, x, blk.t());
  }
  return out;
}

// ---- W8A8: exact integer dot products -----------------------------------------------------------------

// acc[m][r] = sum_k xq[m, k] * wq[r, k] for R weight rows and MT x rows (K a multiple of 32).
template <int R, int MT>
// pf: the rows' lines pf bytes ahead are asked for along the pass (0: none).
inline void i8_tile(const int8_t* xq, int64_t ldx, const uint8_t* w, int64_t rowB, int64_t K, int32_t (*acc)[R],
                    int64_t pf = 0) {
#if defined(__AVX2__)
  __m256i a[R][MT];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) a[r][m] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  if (pf) prefetch_groups<R>(w + K, rowB, rowB - K, pf);  // the scale's line
  for (int64_t k = 0; k < K; k += 32) {
    if (pf && k % 64 == 0) prefetch_groups<R>(w + k, rowB, 1, pf);
    __m256i wv[R], wa[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * rowB + k));
      wa[r] = _mm256_sign_epi8(wv[r], wv[r]);  // |w| (as unsigned bytes: -128 reads 128)
    }
    for (int m = 0; m < MT; ++m) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m * ldx + k));
      for (int r = 0; r < R; ++r) {
        const __m256i p = _mm256_maddubs_epi16(wa[r], _mm256_sign_epi8(xv, wv[r]));  // pairs of w * x
        a[r][m] = _mm256_add_epi32(a[r][m], _mm256_madd_epi16(p, ones));
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = hsum_i32(a[r][m]);
#else
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) {
      int32_t s = 0;
      const int8_t* wr = reinterpret_cast<const int8_t*>(w + r * rowB);
      for (int64_t k = 0; k < K; ++k) s += static_cast<int32_t>(wr[k]) * xq[m * ldx + k];
      acc[m][r] = s;
    }
#endif
}

constexpr int kI8Rows = 2, kI8Tile = 4;  // 8 accumulators + 4 weight vectors of AVX2's 16
constexpr int64_t kI8BlockRows = 64;     // weight rows kept in L2 while every x row passes over them

// out [M, N] = (float(xq @ wq^T) * s_w[n]) * s_x[m].
void w8a8_kernel(const int8_t* xq, const float* xs, int64_t M, const QuantView& q, float* out) {
  const int64_t N = q.N, K = q.K, rowB = q.B;
  auto epilogue = [&](const int32_t* acc, int64_t m, int64_t n, int64_t rows) {
    for (int64_t r = 0; r < rows; ++r) {
      const float sw = load_f32(q.data + (n + r) * rowB + K);
      out[m * N + n + r] = (static_cast<float>(acc[r]) * sw) * xs[m];
    }
  };
  auto rows_block = [&](int64_t n0, int64_t n1) {
    for (int64_t m = 0; m < M; m += kI8Tile) {
      const int64_t mt = std::min<int64_t>(kI8Tile, M - m);
      int64_t n = n0;
      for (; n + kI8Rows <= n1; n += kI8Rows) {
        const int64_t pf = M <= kI8Tile && n + kI8Rows + kPrefetchRows <= N ? kPrefetchRows * rowB : 0;
        int32_t acc[kI8Tile][kI8Rows];
        const uint8_t* w = q.data + n * rowB;
        switch (mt) {
          case 4: i8_tile<kI8Rows, 4>(xq + m * K, K, w, rowB, K, acc, pf); break;
          case 3: i8_tile<kI8Rows, 3>(xq + m * K, K, w, rowB, K, acc, pf); break;
          case 2: i8_tile<kI8Rows, 2>(xq + m * K, K, w, rowB, K, acc, pf); break;
          default: i8_tile<kI8Rows, 1>(xq + m * K, K, w, rowB, K, acc, pf); break;
        }
        for (int64_t i = 0; i < mt; ++i) epilogue(acc[i], m + i, n, kI8Rows);
      }
      for (; n < n1; ++n) {
        for (int64_t i = 0; i < mt; ++i) {
          int32_t acc[1][1];
          i8_tile<1, 1>(xq + (m + i) * K, K, q.data + n * rowB, rowB, K, acc);
          epilogue(acc[0], m + i, n, 1);
        }
      }
    }
  };
  const int64_t blocks = (N + kI8BlockRows - 1) / kI8BlockRows;
  auto body = [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) rows_block(b * kI8BlockRows, std::min(N, (b + 1) * kI8BlockRows));
  };
  for_blocks(blocks, 1, body);
}

// ---- weights in tile order --------------------------------------------------------------------------------

// The kernels on weights in tile order (quant_linear.h) ask for every line this many bytes ahead into L2.
constexpr int64_t kTiledPrefetch = 16384;

// The tiles' layout of weight rows (AVX-512F): the AMX-int8 kernels' B tiles and quant_tile_order_, and the
// VNNI prefill kernel's lines (below), which are the same bytes.
#if defined(__AVX512F__)
// dst[r][c] = src[c][r] for 4-byte words, r, c < 16: 16 rows of 64 bytes `ld` bytes apart -> 16 rows of 64
// bytes (dst 64-byte aligned). Unpacks of words and pairs within 128-bit lanes, then a 4 x 4 transpose of the lanes.
inline void transpose_words_16x16(const int8_t* src, int64_t ld, int8_t* dst) {
  __m512i v[16], t[16];
  for (int c = 0; c < 16; ++c) v[c] = _mm512_loadu_si512(src + c * ld);
  for (int p = 0; p < 8; ++p) {  // lane L of t[2p]: words 4L, 4L+1 of rows 2p, 2p+1 interleaved; t[2p+1]: 4L+2, 4L+3
    t[2 * p] = _mm512_unpacklo_epi32(v[2 * p], v[2 * p + 1]);
    t[2 * p + 1] = _mm512_unpackhi_epi32(v[2 * p], v[2 * p + 1]);
  }
  for (int q4 = 0; q4 < 4; ++q4) {  // v[4 j + q4], lane L: word 4L + j of rows 4 q4 .. 4 q4 + 3
    const __m512i* tq = t + 4 * q4;
    v[0 + q4] = _mm512_unpacklo_epi64(tq[0], tq[2]);
    v[4 + q4] = _mm512_unpackhi_epi64(tq[0], tq[2]);
    v[8 + q4] = _mm512_unpacklo_epi64(tq[1], tq[3]);
    v[12 + q4] = _mm512_unpackhi_epi64(tq[1], tq[3]);
  }
  for (int j = 0; j < 4; ++j) {  // word 4L + j of all 16 rows: lane L of v[4j + 0..3]
    const __m512i* s = v + 4 * j;
    const __m512i x0 = _mm512_shuffle_i32x4(s[0], s[1], 0x44), x1 = _mm512_shuffle_i32x4(s[0], s[1], 0xEE);
    const __m512i x2 = _mm512_shuffle_i32x4(s[2], s[3], 0x44), x3 = _mm512_shuffle_i32x4(s[2], s[3], 0xEE);
    _mm512_store_si512(dst + (0 + j) * 64, _mm512_shuffle_i32x4(x0, x2, 0x88));
    _mm512_store_si512(dst + (4 + j) * 64, _mm512_shuffle_i32x4(x0, x2, 0xDD));
    _mm512_store_si512(dst + (8 + j) * 64, _mm512_shuffle_i32x4(x1, x3, 0x88));
    _mm512_store_si512(dst + (12 + j) * 64, _mm512_shuffle_i32x4(x1, x3, 0xDD));
  }
}

// 16 rows of K codes `ld` bytes apart -> their K / 64 B tiles (1 KB each) 2048 bytes apart from `dst`: the tile
// order's half of a 32-row block (quant_linear.h), for the per-call packing and for quant_tile_order_.
inline void pack_tile_half(const uint8_t* rows, int64_t ld, int64_t K, int8_t* dst) {
  for (int64_t kb = 0; kb < K / 64; ++kb)
    transpose_words_16x16(reinterpret_cast<const int8_t*>(rows) + kb * 64, ld, dst + kb * 2048);
}
#endif

// ---- W8A8 on AMX-int8 tiles (prefill) ---------------------------------------------------------------------
//
// The same exact int32 dot products as w8a8_kernel, from TDPBSSD (signed x signed bytes, int32 accumulation:
// 16 x 16 outputs from 16 x 64 x-codes and 64 x 16 weight codes per instruction), then the same epilogue in
// the same order, so a row gets the same bits whichever kernel ran it (fast prefill parity holds across the
// switch). Used from kAmxMinRows rows, when N is a multiple of 32 and K of 64 (every E2B shape); every block of
// 32 weight rows is repacked per call into the tiles' pair-of-4 layout (16 x 16 transposes of 4-byte words), and
// each thread passes its blocks over x's rows a superblock at a time (see w8a8_amx). IMPL_CPU_AMX=0 turns it off
// (the tests compare both kernels).
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__)
#define QUANT_AMX_INT8 1

constexpr int64_t kAmxMinRows = 32;

// Bytes of x's tile-order codes a thread keeps in its L2 while its weight blocks pass over them (a superblock of
// rows: 512 at K = 1536, 128 at E2B's K = 6144 down projection, whose 6 MB of codes for 1024 rows do not fit).
constexpr int64_t kAmxXBlockBytes = int64_t{768} << 10;
// Weight blocks (32 rows each) packed at a time: the kept scratch holds at most 4096 x K bytes (E2B's 6144-wide
// down projection: 25 MB), not the whole of a wide weight (a quantized 262144-row LM head: 400 MB at K = 1536).
constexpr int64_t kAmxPackBlocks = 128;

// Where tile half h (16 weight rows from `row`, a multiple of 16) of a weight's codes and scales lie: its B tile of
// k-block kb at `tiles` + 2048 kb (1 KB, 64-byte rows), the scale of its row j at `scales` + `scale_step` j. A tiled
// W8A8 weight holds them in place; a row-layout one's codes are packed into `packed` (the half's 16 rows of 32 x K
// scratch bytes), its scales read where they are.
struct TileHalf {
  const int8_t* tiles;
  const uint8_t* scales;
  int64_t scale_step;
};
inline TileHalf tile_half(const QuantView& q, int64_t row, int8_t* packed) {
  if (q.tiled) {
    const uint8_t* blk = q.data + (row / 32) * q.B;
    const int64_t h = (row / 16) % 2;
    return {reinterpret_cast<const int8_t*>(blk) + h * 1024, blk + 32 * q.K + 64 * h, 4};
  }
  pack_tile_half(q.data + row * q.B, q.B, q.K, packed);
  return {packed, q.data + row * q.B + q.K, q.B};
}

// x's row codes xq [M, K] in A-tile order, once per call: xt[mb][kb][32 rows][64 codes] (rows past M zero), so every
// A tile load reads 1 KB in a row. The buffer is the calling thread's, kept between calls (the workers reach it
// through the returned pointer); the AMX kernels below never run inside one another.
inline const int8_t* x_in_tile_order(const int8_t* xq, int64_t M, int64_t K) {
  const int64_t KB = K / 64, MB = (M + 31) / 32;
  thread_local avector<int8_t> xt_buf;
  if (xt_buf.size() < static_cast<size_t>(MB * 32 * K)) xt_buf.resize(static_cast<size_t>(MB * 32 * K));
  int8_t* const xt = xt_buf.data();
  for_blocks(MB, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo * 32; m < hi * 32; ++m)
      for (int64_t kb = 0; kb < KB; ++kb) {
        int8_t* dst = xt + ((m / 32) * KB + kb) * 2048 + (m % 32) * 64;
        if (m < M) std::memcpy(dst, xq + m * K + kb * 64, 64);
        else std::memset(dst, 0, 64);
      }
  });
  return xt;
}

// The layout of a tile kernel's 32-row weight block b (w8a8_amx, w4a8_amx). gate_cols == 0: weight rows 32 b ..,
// output columns 32 b ..; gate_cols == I (a gate / up weight [2I, K]): tile half 0 the 16 gate rows 16 b .., half 1
// their 16 up rows I further on, and the block's 16 activation outputs at column 16 b.
inline int64_t tile_block_row0(int64_t b, int h, int64_t gate_cols) {  // the first weight row of tile half h
  return gate_cols ? 16 * b + h * gate_cols : 32 * b + 16 * h;
}
inline int64_t tile_block_col0(int64_t b, int64_t gate_cols) { return b * (gate_cols ? 16 : 32); }

// From this many bytes of float32 output (more than the L2 caches hold) the tile kernels store it non-temporally:
// an ordinary store first reads each line from memory, and a block's 32 rows of 128 bytes lie an output row
// apart (the reads were a fifth of a 1024 x 1536 -> 12288 W8A8 matmul's time; the next op's read from memory
// instead of cache costs less). Smaller outputs stay in the cache for the op that reads them next.
constexpr int64_t kAmxStreamOutBytes = int64_t{8} << 20;
inline bool stream_out(const float* out, int64_t M, int64_t ldo) {
  return reinterpret_cast<uintptr_t>(out) % 64 == 0 && ldo % 16 == 0 && M * ldo * 4 >= kAmxStreamOutBytes;
}

// One row of a tile block's float32 products v (32 values, 64-byte aligned) to its output o: the 32 values, or
// (gate) gelu_tanh of the 16 gate values times their 16 up values (act::gelu_mul on 16 lanes: the bits of the
// pass over a whole row). nt: non-temporal stores (o 64-byte aligned; the caller fences before the output is read).
inline void store_block_row(float* v, float* o, bool gate, bool nt) {
  if (gate) {
    act::gelu_mul(v, v + 16, nt ? v : o, 16);
    if (nt) _mm512_stream_ps(o, _mm512_load_ps(v));
  } else if (nt) {
    _mm512_stream_ps(o, _mm512_load_ps(v));
    _mm512_stream_ps(o + 16, _mm512_load_ps(v + 16));
  } else {
    std::memcpy(o, v, 32 * sizeof(float));
  }
}

// out = x @ dequant(w)^T from x's row codes xq [M, K] and scales xs [M]. gate_cols == 0: out [M, N]. gate_cols == I
// (a gate / up weight, N = 2I: gate rows first): out [M, I] = gelu_tanh(gate) * up, each tile block pairing 16 gate
// rows with the 16 up rows I further on, so the activation runs on the float32 products while they are in
// registers (act::gelu_mul on 16 lanes: the same bits as the activation pass over a whole row of them).
void w8a8_amx(const int8_t* xq, const float* xs, int64_t M, const QuantView& q, float* out, int64_t gate_cols = 0) {
  const int64_t N = q.N, K = q.K, KB = K / 64;
  const int64_t blocks = N / 32, MB = (M + 31) / 32, ldo = gate_cols ? gate_cols : N;
  // Scratch of the calling thread, kept between calls (the workers reach it through the pointers below).
  // A row-layout weight's 32-row blocks are packed once per call (tile_half), kAmxPackBlocks at a time; a tiled
  // weight's tiles are read in place.
  const int64_t chunk = q.tiled ? blocks : std::min(blocks, kAmxPackBlocks);
  thread_local avector<int8_t> packed_buf;
  if (!q.tiled && packed_buf.size() < static_cast<size_t>(chunk * 32 * K)) packed_buf.resize(static_cast<size_t>(chunk * 32 * K));
  const int8_t* const xt = x_in_tile_order(xq, M, K);
  int8_t* const packed = packed_buf.data();
  // Per chunk of weight blocks, each thread packs its blocks (row layout), then passes them over x's rows a
  // superblock at a time (x's superblock stays in its L2; the blocks stream once per superblock). A thread reads
  // only the blocks it packed: no barrier between the two. Every output element is one exact int32 sum: the order
  // changes nothing. `b0`: the chunk's first block (the body's block indices are relative to it).
  const int64_t sb = std::max<int64_t>(1, kAmxXBlockBytes / (32 * K));
  const bool nt = stream_out(out, M, ldo);
  int64_t b0 = 0;
  auto body = [&](int64_t lo, int64_t hi) {
    std::vector<TileHalf> halves(2 * (hi - lo));
    for (int64_t b = lo; b < hi; ++b)
      for (int h = 0; h < 2; ++h) halves[2 * (b - lo) + h] = tile_half(q, tile_block_row0(b0 + b, h, gate_cols), packed + b * 32 * K + h * 1024);
    cpu_amx::config_16x64();
    alignas(64) int32_t c[32][32];
    alignas(64) float sw[32];
    alignas(64) float y[32];
    for (int64_t mb0 = 0; mb0 < MB; mb0 += sb) {
      const int64_t mb1 = std::min(MB, mb0 + sb);
      for (int64_t b = lo; b < hi; ++b) {
        const TileHalf* hv = &halves[2 * (b - lo)];
        const int8_t *p0 = hv[0].tiles, *p1 = hv[1].tiles;
        for (int h = 0; h < 2; ++h)
          for (int j = 0; j < 16; ++j) sw[16 * h + j] = load_f32(hv[h].scales + hv[h].scale_step * j);
        for (int64_t mb = mb0; mb < mb1; ++mb) {
          const int64_t m0 = mb * 32, mt = std::min<int64_t>(32, M - m0);
          const int8_t* a = xt + mb * KB * 2048;
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          for (int64_t kb = 0; kb < KB; ++kb) {
            _tile_loadd(4, a + kb * 2048, 64);
            _tile_loadd(6, p0 + kb * 2048, 64);
            _tile_dpbssd(0, 4, 6);
            _tile_loadd(7, p1 + kb * 2048, 64);
            _tile_dpbssd(1, 4, 7);
            _tile_loadd(5, a + kb * 2048 + 1024, 64);
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
          }
          _tile_stored(0, &c[0][0], 128);
          _tile_stored(1, &c[0][16], 128);
          _tile_stored(2, &c[16][0], 128);
          _tile_stored(3, &c[16][16], 128);
          for (int64_t i = 0; i < mt; ++i) {  // w8a8_kernel's epilogue, term for term: (float(acc) * s_w) * s_x
            const __m512 sx = _mm512_set1_ps(xs[m0 + i]);
            for (int h = 0; h < 2; ++h) {
              const __m512 a32 = _mm512_cvtepi32_ps(_mm512_load_si512(&c[i][16 * h]));
              _mm512_store_ps(y + 16 * h, _mm512_mul_ps(_mm512_mul_ps(a32, _mm512_load_ps(sw + 16 * h)), sx));
            }
            store_block_row(y, out + (m0 + i) * ldo + tile_block_col0(b0 + b, gate_cols), gate_cols != 0, nt);
          }
        }
      }
    }
    _tile_release();
    if (nt) _mm_sfence();  // this thread's streamed outputs visible before the barrier that ends for_blocks
  };
  for (; b0 < blocks; b0 += chunk) for_blocks(std::min(chunk, blocks - b0), 1, body);
}

#if defined(__AVX512VNNI__)
#define QUANT_W8A8_TILED 1
// W8A8 on a tiled weight at one row (batch-1 decode; from kAmxRowsMin rows w8a8_amx_rows below is faster): per
// 32-row block, each 64-byte line (16 rows x 4 codes) times 4 of a row's codes broadcast, by VPDPBUSD (unsigned x
// signed bytes into int32 lanes) on |q_w| and q_x with q_w's sign (|q_x| <= 127: never overflows), the exact
// integer dot products; then w8a8_kernel's epilogue term for term: a row gets the same bits as from every other
// W8A8 kernel. Each thread reads its blocks as two streams (the two halves of its range, a block of each at a
// time) and asks for every line kTiledPrefetch bytes ahead into L2: one stream with the hardware prefetcher alone
// read a 403 MB LM head at 21 GB/s on the AMX Xeon, the row kernel 24, this 27-28.

// out[32 j + c] of x's one row (codes xq, scale sx) for the P blocks js
template <int P>
inline void tiled_blocks(const int8_t* xq, float sx, const QuantView& q, const int64_t* js, float* out) {
  const int64_t K = q.K, KB = K / 64;
  const uint8_t* b[P];
  for (int p = 0; p < P; ++p) b[p] = q.data + js[p] * q.B;
  __m512i acc[P][2];
  for (auto& a : acc) a[0] = a[1] = _mm512_setzero_si512();
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t kb = 0; kb < KB; ++kb)
    for (int r = 0; r < 16; ++r) {
      const __m512i xb = _mm512_set1_epi32(load_i32(xq + 64 * kb + 4 * r));
      for (int p = 0; p < P; ++p)
        for (int h = 0; h < 2; ++h) {
          const uint8_t* line = b[p] + kb * 2048 + h * 1024 + 64 * r;
          _mm_prefetch(reinterpret_cast<const char*>(line + kTiledPrefetch), _MM_HINT_T1);
          const __m512i w = _mm512_loadu_si512(line);
          // |q_w| (-128 reads 128 unsigned) times q_x with q_w's sign
          acc[p][h] = _mm512_dpbusd_epi32(acc[p][h], _mm512_abs_epi8(w),
                                          _mm512_mask_sub_epi8(xb, _mm512_movepi8_mask(w), zero, xb));
        }
    }
  const __m512 vs = _mm512_set1_ps(sx);
  for (int p = 0; p < P; ++p) {
    const uint8_t* tail = b[p] + 32 * K;  // the block's 32 scales
    float* o = out + 32 * js[p];
    for (int h = 0; h < 2; ++h)
      _mm512_storeu_ps(o + 16 * h, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[p][h]), _mm512_loadu_ps(tail + 64 * h)), vs));
  }
}

// out [1, N] of x's one row.
void w8a8_tiled_row(const int8_t* xq, float sx, const QuantView& q, float* out) {
  for_blocks(q.N / 32, 1, [&](int64_t lo, int64_t hi) {
    in_two_streams(lo, hi, [&](const int64_t* js) { tiled_blocks<2>(xq, sx, q, js, out); },
                   [&](const int64_t* js) { tiled_blocks<1>(xq, sx, q, js, out); });
  });
}

// W8A8 on a tiled weight from kAmxRowsMin to kAmxMinRows - 1 rows (decode of several requests; the cross-decoder's
// rows with fast prefill) on AMX-int8 tiles: per 32-row block, per 64 codes of K, one TDPBSSD per tile half (16
// weight rows) and x row group, x's A tiles read from its row layout (stride K), the weight's B tiles in place.
// Up to 16 rows each thread reads its blocks as two streams (the halves of its range, as w8a8_tiled_row: 24.8 vs
// 23 GB/s at one row with one stream); each line is asked for kTiledPrefetch bytes ahead. The VNNI kernel (which
// ran every row count below kAmxMinRows before, now w8a8_tiled_row) needs a sign fix-up and a multiply per 64 codes
// and x row, so from 4 rows on it ran out of vector slots before the memory ran out of bandwidth: 12 copies of an E2B layer's linears (AMX Xeon, 2 threads),
// this kernel's time / its at 2 / 4 / 8 / 16 / 31 rows 1.00 / 0.95 / 0.74 / 0.50 / 0.37; at one row it is 1.04x,
// so one row stays there. Exact int32 sums, then w8a8_kernel's epilogue term for term: a row gets the same bits
// as from every other W8A8 kernel.
constexpr int64_t kAmxRowsMin = 2;

// One block's (or, P = 2, two blocks' from two streams) products for x rows 0-15 (and 16-31 when `two_groups`,
// P = 1 only) into c[p][row][32 columns], then the epilogue into out.
template <int P>
inline void amx_rows_blocks(const int8_t* xq, const float* xs, int64_t M, bool two_groups, const QuantView& q,
                            const int64_t* js, int32_t (*c)[32][32], float* out) {
  const int64_t K = q.K, KB = K / 64;
  const uint8_t* blk[P];
  for (int p = 0; p < P; ++p) blk[p] = q.data + js[p] * q.B;
  _tile_zero(0);
  _tile_zero(1);
  if (P == 2 || two_groups) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t kb = 0; kb < KB; ++kb) {
    for (int p = 0; p < P; ++p)
      for (int l = 0; l < 2048; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(blk[p] + kb * 2048 + l + kTiledPrefetch), _MM_HINT_T1);
    _tile_loadd(4, xq + kb * 64, K);
    const uint8_t* w0 = blk[0] + kb * 2048;
    _tile_loadd(6, w0, 64);
    _tile_loadd(7, w0 + 1024, 64);
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    if constexpr (P == 2) {
      const uint8_t* w1 = blk[1] + kb * 2048;
      _tile_loadd(6, w1, 64);
      _tile_loadd(7, w1 + 1024, 64);
      _tile_dpbssd(2, 4, 6);
      _tile_dpbssd(3, 4, 7);
    } else if (two_groups) {
      _tile_loadd(5, xq + 16 * K + kb * 64, K);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    }
  }
  _tile_stored(0, &c[0][0][0], 128);
  _tile_stored(1, &c[0][0][16], 128);
  if constexpr (P == 2) {
    _tile_stored(2, &c[1][0][0], 128);
    _tile_stored(3, &c[1][0][16], 128);
  } else if (two_groups) {
    _tile_stored(2, &c[0][16][0], 128);
    _tile_stored(3, &c[0][16][16], 128);
  }
  for (int p = 0; p < P; ++p) {
    const uint8_t* tail = blk[p] + 32 * K;  // the block's 32 scales
    for (int64_t i = 0; i < M; ++i) {  // tiled_blocks' epilogue, term for term: (float(acc) * s_w) * s_x
      const __m512 sx = _mm512_set1_ps(xs[i]);
      float* o = out + i * q.N + 32 * js[p];
      for (int h = 0; h < 2; ++h)
        _mm512_storeu_ps(o + 16 * h, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(&c[p][i][16 * h])),
                                                                 _mm512_loadu_ps(tail + 64 * h)), sx));
    }
  }
}

void w8a8_amx_rows(const int8_t* xq, const float* xs, int64_t M, const QuantView& q, float* out) {
  const uint8_t r0 = static_cast<uint8_t>(std::min<int64_t>(M, 16)), r1 = static_cast<uint8_t>(M - r0);
  auto body = [&](int64_t lo, int64_t hi) {
    // up to 16 rows: tiles 0, 1 and 2, 3 hold two blocks read as two streams (the halves of the thread's range);
    // 17-31 rows: tiles 2, 3 hold rows 16-31 of one block
    const uint8_t rows[8] = {r0, r0, r1 ? r1 : r0, r1 ? r1 : r0, r0, r1, 16, 16};
    cpu_amx::config_rows_x64(rows);
    alignas(64) int32_t c[2][32][32];
    if (r1) {
      for (int64_t j = lo; j < hi; ++j) amx_rows_blocks<1>(xq, xs, M, true, q, &j, c, out);
    } else {
      in_two_streams(lo, hi, [&](const int64_t* js) { amx_rows_blocks<2>(xq, xs, M, false, q, js, c, out); },
                     [&](const int64_t* js) { amx_rows_blocks<1>(xq, xs, M, false, q, js, c, out); });
    }
    _tile_release();
  };
  for_blocks(q.N / 32, 1, body);
}
#endif

inline bool use_amx_w8a8(int64_t M, const QuantView& q) {
  return M >= kAmxMinRows && q.N % 32 == 0 && q.K % 64 == 0 && cpu_amx::tiles_allowed();
}

#endif

// ---- W8A8 prefill with AVX-512 VNNI, no AMX (AMD Zen 4, Ice Lake / Cascade Lake servers) -------------------
//
// The row kernel sums each output's products horizontally (one int32 dot product per output, as decode needs); for
// prefill's many rows that leaves VPDPBUSD at a fraction of its rate. Here each thread packs a block of 32 weight rows
// per call into lines of 16 rows x 4 codes (the AMX tiles' layout: a line's 32-bit lane c holds codes 4r..4r+3 of row
// c), and every 4 of an x row's codes, broadcast, multiply a line into 16 int32 lanes: VPDPBUSD takes unsigned x
// bytes, so x's codes go in as q_x + 128 and each output subtracts 128 times its row's code sum, exactly (|sums| <
// 2^31 up to K = 65536, the kernel's bound). Then w8a8_kernel's epilogue term for term: a row gets the same bits from
// either kernel (fast prefill's selected rows and the deterministic mode rest on it). From kVnniMinRows rows, N % 32
// == 0 and K % 64 == 0 (every E2B shape); quant_w8a8_prefill_isa() says "avx512_vnni" where it runs.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(QUANT_AMX_INT8)
#define QUANT_W8A8_VNNI 1
// From 5 rows (Zen 4, four E2B KV-shared layers' linears, 0.26 GB from memory): 5 / 6 / 8 / 15 rows 17.8 / 18.6 /
// 20.1 / 24.1 ms against the row kernel's 25.3 / 27.8 / 30.9 / 44.5; at 4 rows the row kernel's 4-row tiles 11.0 ms
// against 18.3.
constexpr int64_t kVnniMinRows = 5;
// x rows per pass (2 accumulators of 16 lanes each). Zen 4, 1024 rows at E2B's MLP shapes, one build per choice:
// 12 rows 322-360 GOP/s, 10 289-300, 8 766-828, 7 787-827, 6 628-821 (bf16's oneDNN GEMM beside them 414-450 GFLOP/s).
constexpr int kVnniRows = 8;

// Rows [n0, n0 + 32) of the row-layout weight into pk (pack_tile_half: K / 64 steps of 2 x 1 KB lines) and their
// code sums into sums[32] (a lane of a line holds 4 codes of one row).
inline void vnni_pack_block(const QuantView& q, int64_t n0, uint8_t* pk, int32_t* sums) {
  const int64_t K = q.K;
  const __m512i ones = _mm512_set1_epi8(1);
  for (int h = 0; h < 2; ++h) {
    pack_tile_half(q.data + (n0 + 16 * h) * q.B, q.B, K, reinterpret_cast<int8_t*>(pk) + h * 1024);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t kb = 0; kb < K / 64; ++kb)
      for (int r = 0; r < 16; ++r) sum = _mm512_dpbusd_epi32(sum, ones, _mm512_load_si512(pk + kb * 2048 + h * 1024 + 64 * r));
    _mm512_storeu_si512(sums + 16 * h, sum);
  }
}

// x rows [m, m + MR) times one packed block, then the epilogue into out. xg: x's codes + 128 as bytes in groups of
// kVnniRows rows, each 4 codes of the group's rows side by side ([K / 4][kVnniRows] words from the group's start), so
// the broadcasts of one step read one line through one pointer.
template <int MR>
inline void vnni_rows(const int32_t* xg, const float* xs, int64_t m, const QuantView& q, int64_t n0, const uint8_t* pk,
                      const int32_t* sums, float* out) {
  const int64_t K = q.K;
  __m512i acc[MR][2];
  for (auto& a : acc) a[0] = a[1] = _mm512_setzero_si512();
  for (int64_t kb = 0; kb < K / 64; ++kb)
    for (int r = 0; r < 16; ++r) {
      const __m512i w0 = _mm512_load_si512(pk + kb * 2048 + 64 * r);
      const __m512i w1 = _mm512_load_si512(pk + kb * 2048 + 1024 + 64 * r);
      const int32_t* xw = xg + (kb * 16 + r) * kVnniRows;
      for (int i = 0; i < MR; ++i) {
        const __m512i xb = _mm512_set1_epi32(xw[i]);
        acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], xb, w0);
        acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], xb, w1);
      }
    }
  alignas(64) float sw[32];
  for (int c = 0; c < 32; ++c) sw[c] = load_f32(q.data + (n0 + c) * q.B + K);
  for (int h = 0; h < 2; ++h) {
    const __m512i fix = _mm512_slli_epi32(_mm512_loadu_si512(sums + 16 * h), 7);  // 128 x the rows' code sums
    const __m512 vsw = _mm512_load_ps(sw + 16 * h);
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][h], fix));
      _mm512_storeu_ps(out + (m + i) * q.N + n0 + 16 * h, _mm512_mul_ps(_mm512_mul_ps(a, vsw), _mm512_set1_ps(xs[m + i])));
    }
  }
}

// x's codes [M, K] in groups of kVnniRows rows, 4 codes of each of a group's rows side by side ([K / 4][kVnniRows]
// words from the group's start, so one step's broadcasts read one line), each word XOR flip; the last group's
// missing rows are zeros, never stored.
inline avector<int32_t> vnni_group_x(const int8_t* xq, int64_t M, int64_t K, int32_t flip, int rows = kVnniRows) {
  const int64_t E = K / 4, groups = (M + rows - 1) / rows;
  avector<int32_t> xg(static_cast<size_t>(groups * E * rows));
  at::parallel_for(0, groups, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t gi = lo; gi < hi; ++gi)
      for (int i = 0; i < rows; ++i) {
        const int64_t m = gi * rows + i;
        int32_t* dst = xg.data() + gi * E * rows + i;
        if (m >= M) {
          for (int64_t e = 0; e < E; ++e) dst[e * rows] = 0;
          continue;
        }
        for (int64_t e = 0; e < E; ++e) dst[e * rows] = load_i32(xq + m * K + 4 * e) ^ flip;
      }
  });
  return xg;
}

// K <= 65536: the offset sums stay below 2^31 (255 x 127 x K), so every int32 is exact.
inline bool use_vnni_w8a8(int64_t M, const QuantView& q) {
  return M >= kVnniMinRows && q.N % 32 == 0 && q.K % 64 == 0 && q.K <= 65536 && !q.tiled;
}

void w8a8_vnni(const int8_t* xq, const float* xs, int64_t M, const QuantView& q, float* out) {
  const int64_t E = q.K / 4, groups = (M + kVnniRows - 1) / kVnniRows;
  const avector<int32_t> xg = vnni_group_x(xq, M, q.K, static_cast<int32_t>(0x80808080u));  // x's codes + 128
  for_blocks(q.N / 32, 1, [&](int64_t lo, int64_t hi) {
    avector<uint8_t> pk(static_cast<size_t>(32 * q.K));
    alignas(64) int32_t sums[32];
    for (int64_t j = lo; j < hi; ++j) {
      vnni_pack_block(q, 32 * j, pk.data(), sums);
      for (int64_t gi = 0; gi < groups; ++gi) {
        const int64_t m = gi * kVnniRows;
        with_rows<kVnniRows>(std::min<int64_t>(kVnniRows, M - m), [&](auto mr) {
          vnni_rows<decltype(mr)::value>(xg.data() + gi * E * kVnniRows, xs, m, q, 32 * j, pk.data(), sums, out);
        });
      }
    }
  });
}
#endif

// ---- W4A8: int4 codes x int8 activations, exact integer dot products per group -------------------------

// One group's term of a W4A8 output: tot + (s * s_x) * (isum - z * sum xq) with one rounding of the product-add.
// isum (the group's dot product of codes, |isum| <= 15 * 127 * 256) and z * sum xq (z an integer 0..15) are
// integers below 2^24, so the difference is exact; every W4A8 kernel adds these terms in group order (w4a8_amx:
// the same operations, 16 outputs at a time), so a row's bits never depend on the kernel that ran it.
inline float w4a8_step(float tot, int32_t isum, float s, float z, float sx, int32_t xsum) {
  return std::fma(s * sx, static_cast<float>(isum) - z * static_cast<float>(xsum), tot);
}

// out[m, r] for R weight rows and MT rows of x. xq: int8 codes [MT, K] (ldx apart), xs / xsum: each row's
// group scales and code sums [MT, G] (ldg apart). Per group the dot product of codes is an exact integer:
// vpmaddubsw multiplies the unsigned codes (0..15) by the signed x codes (|x| <= 127) into 16-bit pair sums
// of at most 3810, and a group of 256 adds 8 of them per lane (30480 < 32767: no saturation) before one
// vpmaddwd widens them to int32 (with VNNI, groups of 128 and 256 take VPDPBUSD to the same int32 lanes).
// The group's lanes are summed (an exact integer) and its term added by w4a8_step, group by group: every step is
// fixed by the layout alone (never by R, MT or the other rows, nor by the kernel: w4a8_amx adds the same terms),
// so any row count gives a row the same bits.
// kG: the group size when it is known at compile time (0: q.g). Decode's groups of 128 take kG = 128: the k loop
// is unrolled whole (two 32-byte steps), 1.10x the one-row rate from L2 on a Zen 1 core; the same operations.
template <int R, int MT, int64_t kG = 0>
inline void w4a8_tile(const int8_t* xq, int64_t ldx, const float* xs, const int32_t* xsum, int64_t ldg,
                      const uint8_t* w, int64_t rowB, const QuantView& q, float* out, int64_t ldo, int64_t pf = 0) {
  const int64_t g = kG ? kG : q.g, half = g / 2;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256i m4 = _mm256_set1_epi8(15);
  const __m128i m4h = _mm_set1_epi8(15);
  float tot[R][MT] = {};
  __m128 tot4 = _mm_setzero_ps();  // R * MT == 4: the four outputs' running sums (lane r * MT + m)
  for (int64_t gi = 0; gi < q.G; ++gi) {
    const uint8_t* blk = w + gi * q.B;
    const int8_t* xg = xq + gi * g;
    if (pf) prefetch_groups<R>(blk, rowB, q.B, pf);
    __m256i acc[R][MT];
#if defined(__AVX512VNNI__)
    // Groups of 128 and 256 on 64 bytes per step: VPDPBUSD sums each lane's 4 byte products straight into int32,
    // lane l + 8 the second 32-byte step's lane l: added, the same int32 lanes as the pair sums below (lane l:
    // bytes 4l..4l+3 of every 32-byte step), so the same bits in fewer instructions.
    if (half % 64 == 0) {
      const __m512i m4z = _mm512_set1_epi8(15);
      __m512i a5[R][MT];
      for (int r = 0; r < R; ++r)
        for (int m = 0; m < MT; ++m) a5[r][m] = _mm512_setzero_si512();
      for (int64_t j = 0; j < half; j += 64) {
        __m512i xl[MT], xh[MT];
        for (int m = 0; m < MT; ++m) {
          xl[m] = _mm512_loadu_si512(xg + m * ldx + j);
          xh[m] = _mm512_loadu_si512(xg + m * ldx + half + j);
        }
        for (int r = 0; r < R; ++r) {
          const __m512i b = _mm512_loadu_si512(blk + r * rowB + j);
          const __m512i lo = _mm512_and_si512(b, m4z), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4z);
          for (int m = 0; m < MT; ++m) a5[r][m] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a5[r][m], lo, xl[m]), hi, xh[m]);
        }
      }
      for (int r = 0; r < R; ++r)
        for (int m = 0; m < MT; ++m)
          acc[r][m] = _mm256_add_epi32(_mm512_castsi512_si256(a5[r][m]), _mm512_extracti64x4_epi64(a5[r][m], 1));
    } else
#endif
    {  // 16-bit pair sums (vpmaddubsw), widened into the same int32 lanes (vpmaddwd)
      const __m256i ones = _mm256_set1_epi16(1);
      if (half >= 32) {
        for (int r = 0; r < R; ++r)
          for (int m = 0; m < MT; ++m) acc[r][m] = _mm256_setzero_si256();
        for (int64_t j = 0; j < half; j += 32) {  // codes j..j+31 (low nibbles) and half+j.. (high nibbles)
          __m256i xl[MT], xh[MT];
          for (int m = 0; m < MT; ++m) {
            xl[m] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + m * ldx + j));
            xh[m] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + m * ldx + half + j));
          }
          for (int r = 0; r < R; ++r) {
            const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + r * rowB + j));
            const __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            for (int m = 0; m < MT; ++m)
              acc[r][m] = _mm256_add_epi16(acc[r][m], _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl[m]), _mm256_maddubs_epi16(hi, xh[m])));
          }
        }
      } else {  // groups of 32: 16 bytes, low nibbles codes 0..15 and high nibbles 16..31: x in natural order
        __m256i xv[MT];
        for (int m = 0; m < MT; ++m) xv[m] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + m * ldx));
        for (int r = 0; r < R; ++r) {
          const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + r * rowB));
          const __m256i wv = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4h), _mm_and_si128(b, m4h));
          for (int m = 0; m < MT; ++m) acc[r][m] = _mm256_maddubs_epi16(wv, xv[m]);
        }
      }
      for (int r = 0; r < R; ++r)
        for (int m = 0; m < MT; ++m) acc[r][m] = _mm256_madd_epi16(acc[r][m], ones);
    }
    if constexpr (R * MT == 4) {  // w4a8_step on four lanes at once (the same operations per lane)
      __m128i h[4];
      float sv[4], zv[4], xv[4], cv[4];
      for (int r = 0; r < R; ++r)
        for (int m = 0; m < MT; ++m) {
          const int l = r * MT + m;
          h[l] = _mm_add_epi32(_mm256_castsi256_si128(acc[r][m]), _mm256_extracti128_si256(acc[r][m], 1));
          sv[l] = load_f32(blk + r * rowB + half);
          zv[l] = load_f32(blk + r * rowB + half + 4);
          xv[l] = xs[m * ldg + gi];
          cv[l] = static_cast<float>(xsum[m * ldg + gi]);
        }
      const __m128i isum = _mm_hadd_epi32(_mm_hadd_epi32(h[0], h[1]), _mm_hadd_epi32(h[2], h[3]));  // exact
      const __m128 d = _mm_sub_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(_mm_loadu_ps(zv), _mm_loadu_ps(cv)));
      tot4 = _mm_fmadd_ps(_mm_mul_ps(_mm_loadu_ps(sv), _mm_loadu_ps(xv)), d, tot4);
    } else {
      for (int r = 0; r < R; ++r) {  // acc: int32 lanes
        const float s = load_f32(blk + r * rowB + half), z = load_f32(blk + r * rowB + half + 4);
        for (int m = 0; m < MT; ++m)
          tot[r][m] = w4a8_step(tot[r][m], hsum_i32(acc[r][m]), s, z, xs[m * ldg + gi], xsum[m * ldg + gi]);
      }
    }
  }
  if constexpr (R * MT == 4) _mm_storeu_ps(&tot[0][0], tot4);
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) out[m * ldo + r] = tot[r][m];
#else
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) {
      float tot = 0.f;
      for (int64_t gi = 0; gi < q.G; ++gi) {
        const uint8_t* blk = w + r * rowB + gi * q.B;
        const int8_t* xg = xq + m * ldx + gi * g;
        int32_t isum = 0;
        for (int64_t j = 0; j < half; ++j) isum += (blk[j] & 15) * xg[j] + (blk[j] >> 4) * xg[half + j];
        tot = w4a8_step(tot, isum, load_f32(blk + half), load_f32(blk + half + 4), xs[m * ldg + gi], xsum[m * ldg + gi]);
      }
      out[m * ldo + r] = tot;
    }
#endif
}

constexpr int64_t kW4A8BlockRows = 64;  // weight rows kept in L2 while every x row passes over them

void w4a8_kernel(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t M, const QuantView& q, float* out) {
  const int64_t N = q.N, K = q.K, G = q.G, rowB = q.G * q.B;
  auto rows_block = [&](int64_t n0, int64_t n1) {
    if (M == 1) {  // decode: 4 weight rows per pass, one x row; the rows kPrefetchRows ahead asked for group by group
      const int64_t pf = kPrefetchRows * rowB;
      int64_t n = n0;
      if (q.g == 128)
        for (; n + 4 <= n1; n += 4)
          w4a8_tile<4, 1, 128>(xq, K, xs, xsum, G, q.data + n * rowB, rowB, q, out + n, N, n + 4 + kPrefetchRows <= N ? pf : 0);
      for (; n + 4 <= n1; n += 4)
        w4a8_tile<4, 1>(xq, K, xs, xsum, G, q.data + n * rowB, rowB, q, out + n, N, n + 4 + kPrefetchRows <= N ? pf : 0);
      for (; n < n1; ++n) w4a8_tile<1, 1>(xq, K, xs, xsum, G, q.data + n * rowB, rowB, q, out + n, N);
      return;
    }
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) {
      int64_t n = n0;
      for (; n + 2 <= n1; n += 2)
        w4a8_tile<2, 2>(xq + m * K, K, xs + m * G, xsum + m * G, G, q.data + n * rowB, rowB, q, out + m * N + n, N);
      for (; n < n1; ++n)
        w4a8_tile<1, 2>(xq + m * K, K, xs + m * G, xsum + m * G, G, q.data + n * rowB, rowB, q, out + m * N + n, N);
    }
    for (; m < M; ++m) {
      int64_t n = n0;
      for (; n + 4 <= n1; n += 4)
        w4a8_tile<4, 1>(xq + m * K, K, xs + m * G, xsum + m * G, G, q.data + n * rowB, rowB, q, out + m * N + n, N);
      for (; n < n1; ++n)
        w4a8_tile<1, 1>(xq + m * K, K, xs + m * G, xsum + m * G, G, q.data + n * rowB, rowB, q, out + m * N + n, N);
    }
  };
  const int64_t blocks = (N + kW4A8BlockRows - 1) / kW4A8BlockRows;
  auto body = [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) rows_block(b * kW4A8BlockRows, std::min(N, (b + 1) * kW4A8BlockRows));
  };
  for_blocks(blocks, 1, body);
}

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define QUANT_W4A8_TILED 1
#define QUANT_W4A8_TILED_AVX2 1
// W4A8 on a tiled weight (quant_linear.h) with AVX2, at every row count (a build without AVX-512 has no other kernel
// for it). A 64-byte line of a tile half is two ymm of 8 weight rows x 4 bytes: a byte's low nibbles times 4 of an
// x row's codes broadcast and its high nibbles times the next 4, by vpmaddubsw (unsigned codes 0..15 x signed x
// codes: pair sums of at most 2 * 15 * 127, never saturating), the two added (<= 7620) and widened by vpmaddwd into
// int32 lanes, one lane per weight row: each output's exact group sum lands in its own lane, with no horizontal sums
// (the row layout's kernel sums 8 lanes per weight row, x row and group). Then w4a8_step's term on 8 outputs at a
// time, the same values and operations as the row kernel (its bits).

// Block j's 32 outputs for MT (1..8) rows of x, group by group and half by half: each half's g / 8 lines (1 KB for
// groups of 128) read in address order, its scales and zero points right after them. pf: each line asked for
// kTiledPrefetch bytes ahead (decode, where the weight streams from memory). At one row from memory this order ran
// 0.74-0.90x the row layout's kernel's time on the AVX2 Zen 3 (decode_kernels), where passes over a block's four
// columns at once (its two halves' lines in turn) ran 1.03-1.08x; at 2-8 rows and at 1024 it ran 0.78-0.84x their time.
template <int MT>
inline void w4_tiled_halves_avx2(const int8_t* xq, const float* xs, const int32_t* xsum, const QuantView& q, int64_t j,
                                 float* out, int64_t ldo, bool pf) {
  const int64_t K = q.K, G = q.G, g = q.g;
  const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  __m256 tot[2][2][MT];  // [half][column][x row]
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < 2; ++c)
      for (int m = 0; m < MT; ++m) tot[h][c][m] = _mm256_setzero_ps();
  for (int64_t gi = 0; gi < G; ++gi) {
    const int8_t* xg = xq + gi * g;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* codes = w4_tiled_codes(q, 32 * j + 16 * h, gi);
      __m256i acc[2][MT];
      for (int c = 0; c < 2; ++c)
        for (int m = 0; m < MT; ++m) acc[c][m] = _mm256_setzero_si256();
      for (int64_t l = 0; l < g / 8; ++l) {  // line l: codes 8 l .. 8 l + 3 (low nibbles), 8 l + 4 .. 8 l + 7 (high)
        __m256i xl[MT], xh[MT];
        for (int m = 0; m < MT; ++m) {
          xl[m] = _mm256_set1_epi32(load_i32(xg + m * K + 8 * l));
          xh[m] = _mm256_set1_epi32(load_i32(xg + m * K + 8 * l + 4));
        }
        const uint8_t* line = codes + 64 * l;
        if (pf) _mm_prefetch(reinterpret_cast<const char*>(line + kTiledPrefetch), _MM_HINT_T1);
        for (int c = 0; c < 2; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32 * c));
          const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
          for (int m = 0; m < MT; ++m)
            acc[c][m] = _mm256_add_epi32(acc[c][m], _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xl[m]),
                                                                                       _mm256_maddubs_epi16(hi, xh[m])), ones));
        }
      }
      const uint8_t* meta = w4_tiled_meta(q, 32 * j + 16 * h, gi);
      for (int c = 0; c < 2; ++c) {
        const __m256 sv = _mm256_loadu_ps(reinterpret_cast<const float*>(meta + 32 * c));
        const __m256 zv = _mm256_loadu_ps(reinterpret_cast<const float*>(meta + 128 + 32 * c));
        for (int m = 0; m < MT; ++m) {  // w4a8_step on 8 outputs (the first group's onto +0)
          const __m256 d = _mm256_sub_ps(_mm256_cvtepi32_ps(acc[c][m]),
                                         _mm256_mul_ps(zv, _mm256_set1_ps(static_cast<float>(xsum[m * G + gi]))));
          tot[h][c][m] = _mm256_fmadd_ps(_mm256_mul_ps(sv, _mm256_set1_ps(xs[m * G + gi])), d, tot[h][c][m]);
        }
      }
    }
  }
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < 2; ++c)
      for (int m = 0; m < MT; ++m) _mm256_storeu_ps(out + m * ldo + 32 * j + 16 * h + 8 * c, tot[h][c][m]);
}

// out [M, N] for M rows of a tiled W4A8 weight: block by block (each thread's blocks in address order), x's rows
// passing over a block 8 at a time while its codes stay in L1 / L2, so the weight is read from memory once.
void w4a8_tiled_rows(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t M, const QuantView& q, float* out) {
  const int64_t K = q.K, G = q.G, N = q.N;
  const bool pf = M <= 8;  // decode: one pass per block, from memory
  for_blocks(N / 32, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j)
      for (int64_t m = 0; m < M; m += 8) {
        const int8_t* x = xq + m * K;
        const float* s = xs + m * G;
        const int32_t* c = xsum + m * G;
        float* o = out + m * N;
        switch (std::min<int64_t>(8, M - m)) {
          case 1: w4_tiled_halves_avx2<1>(x, s, c, q, j, o, N, pf); break;
          case 2: w4_tiled_halves_avx2<2>(x, s, c, q, j, o, N, pf); break;
          case 3: w4_tiled_halves_avx2<3>(x, s, c, q, j, o, N, pf); break;
          case 4: w4_tiled_halves_avx2<4>(x, s, c, q, j, o, N, pf); break;
          case 5: w4_tiled_halves_avx2<5>(x, s, c, q, j, o, N, pf); break;
          case 6: w4_tiled_halves_avx2<6>(x, s, c, q, j, o, N, pf); break;
          case 7: w4_tiled_halves_avx2<7>(x, s, c, q, j, o, N, pf); break;
          default: w4_tiled_halves_avx2<8>(x, s, c, q, j, o, N, pf); break;
        }
      }
  });
}
#endif

#if defined(QUANT_AMX_INT8)
// W4A8 from kW4A8AmxMinRows rows on AMX-int8 tiles (groups of 128 or 256, N a multiple of 32). Each 32-row weight
// block is unpacked per call into B tiles of one signed byte per code, its group's zero point taken off
// (q - z in -15..15; a 64-code k-block is all low or all high nibbles of 64 bytes when half a group is a
// multiple of 64), and x is laid out in tile order once per call, as w8a8_amx does. Per group, TDPBSSD gives
// every output's exact integer isum - z * sum xq (|.| <= 15 * 127 * 256 < 2^24, so its float is the row kernel's
// float(isum) - z * float(sum xq), both exact): w4a8_step's term is then one product and one fused add on 16
// outputs at a time, the same operations on the same values as the row kernel (its bits). The C tiles of
// consecutive groups go to alternating buffers, so one group's stores need not wait for the previous group's
// epilogue loads.
// One row stays on the row kernel (it streams the weight at the memory's rate); from two rows the row kernel's
// per-group epilogue for every (weight row, x row) pair outweighs the tiles' unpacking per 32 weight rows.
constexpr int64_t kW4A8AmxMinRows = 2;
// A tiled W4A8 weight (quant_linear.h) takes the tiles from this many rows; below, w4a8_tiled_rows' VNNI kernel (its
// nibbles need no unpacking into tiles there): one E2B layer's linears at 5 / 8 rows in 0.65 / 0.78x the tiles'
// time; at 16 rows two passes of 8 would read the weight twice.
constexpr int64_t kW4A8TiledAmxMinRows = 9;

inline bool use_amx_w4a8(int64_t M, const QuantView& q) {
  return M >= (q.tiled ? kW4A8TiledAmxMinRows : kW4A8AmxMinRows) && q.N % 32 == 0 && (q.tiled || q.g % 128 == 0) &&
         cpu_amx::tiles_allowed();
}

void w4a8_amx(const int8_t* xq, const float* xs, int64_t M, const QuantView& q, float* out, int64_t gate_cols = 0) {
  const int64_t N = q.N, K = q.K, KB = K / 64, G = q.G, half = q.g / 2, KBG = q.g / 64, rowB = G * q.B;
  const int64_t ldo = gate_cols ? gate_cols : N;
  const int64_t blocks = N / 32, MB = (M + 31) / 32;
  // One row block (decode of 2-32 requests): each block is unpacked right before its tiles run, into one block's
  // scratch that stays in L2, and the weight streams from memory once. More: each thread unpacks its blocks of a
  // chunk first, then passes them over x's row superblocks (the unpacking paid once per block per call).
  const bool stream = MB == 1;
  const int64_t chunk = stream ? blocks : std::min(blocks, kAmxPackBlocks);
  thread_local avector<int8_t> packed_buf;  // the calling thread's, for the chunk's blocks (not when streaming)
  if (!stream && packed_buf.size() < static_cast<size_t>(chunk * 32 * K)) packed_buf.resize(static_cast<size_t>(chunk * 32 * K));
  const int8_t* const xt = x_in_tile_order(xq, M, K);
  int8_t* const packed = packed_buf.data();
  const int64_t sb = std::max<int64_t>(1, kAmxXBlockBytes / (32 * K));
  const bool nt = stream_out(out, M, ldo);
  int64_t b0 = 0;
  auto body = [&](int64_t lo, int64_t hi) {
    // this thread's blocks: codes less their zero points as B tiles (block b's k-block kb, half h at
    // b 32 K + 2048 kb + 1024 h of packed_buf; streaming: one block at a time in this thread's own_buf), and each
    // block's scales per group (sz[b][gi][32 rows])
    thread_local avector<int8_t> own_buf;  // streaming: the block this thread unpacked last
    thread_local avector<float> sz_buf;
    thread_local avector<int8_t> z_buf;  // one block's zero points (zb[gi][32 rows])
    if (stream && own_buf.size() < static_cast<size_t>(32 * K)) own_buf.resize(static_cast<size_t>(32 * K));
    int8_t* const base = stream ? own_buf.data() : packed;
    sz_buf.resize(static_cast<size_t>((stream ? 1 : hi - lo) * G * 32));
    z_buf.resize(static_cast<size_t>(G * 32));
    int8_t* const zb = z_buf.data();
    const __m512i m4 = _mm512_set1_epi8(15);
    alignas(64) int8_t codes[16][64];
    auto rows_of = [&](int64_t b, const uint8_t** wr) {  // block b's 32 weight rows
      for (int h = 0; h < 2; ++h)
        for (int r = 0; r < 16; ++r) wr[16 * h + r] = q.data + (tile_block_row0(b0 + b, h, gate_cols) + r) * rowB;
    };
    // Block b into dst / sz; with `ahead`, block b + 1's code bytes are asked into L2 as b's are read (streaming:
    // the next block's rows come from memory while this one's tiles run), a line or two per 64 codes read
    const __m512i rstep = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32(static_cast<int32_t>(rowB)));
    // a tiled weight: each line of codes is two B tile rows (low and high nibbles), the zero points integers
    // (checked when it was tiled); the scales read in place. `ahead`: block b + 1's lines asked into L2 as b's are read.
    auto unpack_tiled = [&](int64_t b, int8_t* dst, float* sz, bool ahead) {
      for (int h = 0; h < 2; ++h) {
        const int64_t row = tile_block_row0(b0 + b, h, gate_cols);
        const int64_t next = ahead ? tile_block_row0(b0 + b + 1, h, gate_cols) : 0;
        for (int64_t gi = 0; gi < G; ++gi) {
          const uint8_t* src = w4_tiled_codes(q, row, gi);
          const uint8_t* meta = w4_tiled_meta(q, row, gi);
          const uint8_t* nsrc = ahead ? w4_tiled_codes(q, next, gi) : nullptr;
          if (ahead) {
            _mm_prefetch(reinterpret_cast<const char*>(w4_tiled_meta(q, next, gi)), _MM_HINT_T1);
            _mm_prefetch(reinterpret_cast<const char*>(w4_tiled_meta(q, next, gi) + 128), _MM_HINT_T1);
          }
          _mm512_store_ps(sz + gi * 32 + 16 * h, _mm512_loadu_ps(reinterpret_cast<const float*>(meta)));
          // z in each of a 4-byte lane's bytes (z <= 15)
          const __m512i zq = _mm512_mullo_epi32(_mm512_cvttps_epi32(_mm512_loadu_ps(reinterpret_cast<const float*>(meta + 128))),
                                                _mm512_set1_epi32(0x01010101));
          for (int64_t l = 0; l < 8 * KBG; ++l) {  // line l: tile rows 2 (l % 8), + 1 of the group's k-block l / 8
            if (ahead) _mm_prefetch(reinterpret_cast<const char*>(nsrc + 64 * l), _MM_HINT_T1);
            const __m512i v = _mm512_loadu_si512(src + 64 * l);
            int8_t* t = dst + (gi * KBG + l / 8) * 2048 + h * 1024 + (l % 8) * 128;
            _mm512_store_si512(t, _mm512_sub_epi8(_mm512_and_si512(v, m4), zq));
            _mm512_store_si512(t + 64, _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), zq));
          }
        }
      }
    };
    auto unpack = [&](int64_t b, int8_t* dst, float* sz, bool ahead) {
      if (q.tiled) {
        unpack_tiled(b, dst, sz, ahead);
        return;
      }
      const uint8_t* wr[32];
      const uint8_t* nx[32];
      rows_of(b, wr);
      if (ahead) rows_of(b + 1, nx);
      // each group's scales and zero points, 16 rows (rowB apart) at a time; the zero points must be integers 0..15
      __mmask16 integral = 0xFFFF;
      for (int64_t gi = 0; gi < G; ++gi)
        for (int h = 0; h < 2; ++h) {
          const uint8_t* meta = wr[16 * h] + gi * q.B + half;
          const __m512 sv = _mm512_i32gather_ps(rstep, meta, 1), zv = _mm512_i32gather_ps(rstep, meta + 4, 1);
          integral &= _mm512_cmp_ps_mask(zv, _mm512_roundscale_ps(zv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), _CMP_EQ_OQ) &
                      _mm512_cmp_ps_mask(zv, _mm512_setzero_ps(), _CMP_GE_OQ) & _mm512_cmp_ps_mask(zv, _mm512_set1_ps(15.f), _CMP_LE_OQ);
          _mm512_store_ps(sz + gi * 32 + 16 * h, sv);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(zb + gi * 32 + 16 * h), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(zv)));
        }
      TORCH_CHECK(integral == 0xFFFF, "a W4A8 weight's zero points are integers 0..15: pack it with impl.quant.pack");
      for (int h = 0; h < 2; ++h)
        for (int64_t gi = 0, kb = 0; gi < G; ++gi)
          for (int64_t j = 0; j < 2 * half; j += 64, ++kb) {  // k-block kb: codes j.. of group gi
            const int64_t off = gi * q.B + (j < half ? j : j - half);
            for (int r = 0; r < 16; ++r) {
              if (ahead && j < half) {
                _mm_prefetch(reinterpret_cast<const char*>(nx[16 * h + r] + off), _MM_HINT_T1);
                _mm_prefetch(reinterpret_cast<const char*>(nx[16 * h + r] + off + 63), _MM_HINT_T1);
              }
              const __m512i v = _mm512_loadu_si512(wr[16 * h + r] + off);
              const __m512i c = j < half ? _mm512_and_si512(v, m4) : _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
              _mm512_store_si512(codes[r], _mm512_sub_epi8(c, _mm512_set1_epi8(zb[gi * 32 + 16 * h + r])));
            }
            transpose_words_16x16(&codes[0][0], 64, dst + kb * 2048 + h * 1024);
          }
    };
    alignas(64) int32_t c[2][32][32];
    alignas(64) float tot[32][32];
    // block b's outputs for x's row block mb from its unpacked tiles p and scales sz (x's rows 16-31 only where
    // the block has them: decode of up to 16 requests runs two of the four products)
    auto tiles = [&](int64_t b, int64_t mb, const int8_t* p, const float* sz) {
      const int64_t m0 = mb * 32, mt = std::min<int64_t>(32, M - m0);
      const int8_t* a = xt + mb * KB * 2048;
      const bool low = mt <= 16;
      for (int64_t gi = 0; gi < G; ++gi) {
        _tile_zero(0);
        _tile_zero(1);
        if (!low) {
          _tile_zero(2);
          _tile_zero(3);
        }
        for (int64_t kb = gi * KBG; kb < (gi + 1) * KBG; ++kb) {
          _tile_loadd(4, a + kb * 2048, 64);
          _tile_loadd(6, p + kb * 2048, 64);
          _tile_dpbssd(0, 4, 6);
          _tile_loadd(7, p + kb * 2048 + 1024, 64);
          _tile_dpbssd(1, 4, 7);
          if (low) continue;
          _tile_loadd(5, a + kb * 2048 + 1024, 64);
          _tile_dpbssd(2, 5, 6);
          _tile_dpbssd(3, 5, 7);
        }
        int32_t(*cg)[32] = c[gi & 1];
        _tile_stored(0, &cg[0][0], 128);
        _tile_stored(1, &cg[0][16], 128);
        if (!low) {
          _tile_stored(2, &cg[16][0], 128);
          _tile_stored(3, &cg[16][16], 128);
        }
        const __m512 s0 = _mm512_load_ps(sz + gi * 32), s1 = _mm512_load_ps(sz + gi * 32 + 16);
        for (int64_t i = 0; i < mt; ++i) {  // w4a8_step on 16 outputs at a time (the first group's onto +0: no memset)
          const __m512 sx = _mm512_set1_ps(xs[(m0 + i) * G + gi]);
          const __m512 d0 = _mm512_cvtepi32_ps(_mm512_load_si512(&cg[i][0]));
          const __m512 d1 = _mm512_cvtepi32_ps(_mm512_load_si512(&cg[i][16]));
          const __m512 t0 = gi ? _mm512_load_ps(&tot[i][0]) : _mm512_setzero_ps();
          const __m512 t1 = gi ? _mm512_load_ps(&tot[i][16]) : _mm512_setzero_ps();
          _mm512_store_ps(&tot[i][0], _mm512_fmadd_ps(_mm512_mul_ps(s0, sx), d0, t0));
          _mm512_store_ps(&tot[i][16], _mm512_fmadd_ps(_mm512_mul_ps(s1, sx), d1, t1));
        }
      }
      for (int64_t i = 0; i < mt; ++i)
        store_block_row(tot[i], out + (m0 + i) * ldo + tile_block_col0(b0 + b, gate_cols), gate_cols != 0, nt);
    };
    if (stream) {
      cpu_amx::config_16x64();
      for (int64_t b = lo; b < hi; ++b) {
        unpack(b, base, sz_buf.data(), b + 1 < hi);
        tiles(b, 0, base, sz_buf.data());
      }
    } else {
      for (int64_t b = lo; b < hi; ++b) unpack(b, base + b * 32 * K, sz_buf.data() + (b - lo) * G * 32, false);
      cpu_amx::config_16x64();
      for (int64_t mb0 = 0; mb0 < MB; mb0 += sb)
        for (int64_t b = lo; b < hi; ++b)
          for (int64_t mb = mb0; mb < std::min(MB, mb0 + sb); ++mb)
            tiles(b, mb, base + b * 32 * K, sz_buf.data() + (b - lo) * G * 32);
    }
    _tile_release();
    if (nt) _mm_sfence();  // this thread's streamed outputs visible before the barrier that ends for_blocks
  };
  for (; b0 < blocks; b0 += chunk) for_blocks(std::min(chunk, blocks - b0), 1, body);
}

#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define QUANT_W4A8_TILED 1
// W4A8 on a tiled weight at a few rows (decode of a few requests; the cross-decoder's rows with fast prefill: below
// kW4A8TiledAmxMinRows rows with AMX, below kVnniW4MinRows without): per 32-row block and group, each 64-byte line is
// two rows of a B tile, 16 weight rows x 4 codes in each nibble, so its low and high nibbles (one and, one shift)
// times 4 of an x row's codes broadcast, by VPDPBUSD (unsigned codes 0..15 x signed x codes into int32 lanes), give
// 16 outputs' exact group sums in lanes: no horizontal sums and no tiles to fill. Then w4a8_step's term on 16 outputs
// at a time, with the zero point's z * sum xq taken off the exact integer sum (the row kernel's float(isum) - z *
// float(sum xq): the same values, so the same bits). Every line of codes, and each group's scales and zero points,
// asked for kW4TiledPrefetch bytes ahead into L2; with AMX, up to 4 rows each thread reads its blocks as two streams
// (the halves of its range, as w8a8_tiled_row; w4a8_tiled_rows_mt).
#if defined(QUANT_AMX_INT8)
constexpr bool kW4TiledTwoStreams = true;  // the AMX Xeon's measured choice (w8a8_tiled_row)
constexpr int64_t kW4TiledPrefetch = kTiledPrefetch;
#else
// Zen 4 (AVX-512 VNNI, no AMX), one row from memory, six E2B KV-shared layers' linears (0.21 GB), alternated with
// the row layout's kernel in one process: one stream 8 KB ahead 0.72-0.76x its time, two streams 16 KB ahead 0.97-0.99x.
constexpr bool kW4TiledTwoStreams = false;
constexpr int64_t kW4TiledPrefetch = 8192;
#endif

// w4a8_step on 16 outputs of a tiled weight's half (sv / zv: its scales and zero points in group gi) for one x row:
// tot (16 running sums, the first group's onto +0) += (s * s_x) * (isum - z * xsum). Every VNNI kernel on a tiled
// W4A8 weight ends a group here: the row kernel's operations on the same values, so its bits.
inline void w4_tiled_step16(float* tot, __m512i isum, __m512 sv, __m512 zv, float sx, int32_t xsum, bool first) {
  const __m512 d = _mm512_sub_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(zv, _mm512_set1_ps(static_cast<float>(xsum))));
  const __m512 t = first ? _mm512_setzero_ps() : _mm512_load_ps(tot);
  _mm512_store_ps(tot, _mm512_fmadd_ps(_mm512_mul_ps(sv, _mm512_set1_ps(sx)), d, t));
}

// Block (first row `row`) group gi's 32 scales and zero points, the 4 lines after its codes, kW4TiledPrefetch bytes ahead
inline void prefetch_w4_meta(const QuantView& q, int64_t row, int64_t gi) {
  for (int o = 0; o < 256; o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(w4_tiled_meta(q, row, gi) + o + kW4TiledPrefetch), _MM_HINT_T1);
}

template <int P, int MT>
inline void w4_tiled_blocks(const int8_t* xq, const float* xs, const int32_t* xsum, const QuantView& q, const int64_t* js,
                            float* out, int64_t ldo) {
  const int64_t K = q.K, G = q.G, g = q.g;
  const __m512i m4 = _mm512_set1_epi8(15);
  alignas(64) float tot[P][2][MT][16];
  for (int64_t gi = 0; gi < G; ++gi) {
    const uint8_t* codes[P][2];  // each block's two tile halves in this group
    for (int p = 0; p < P; ++p)
      for (int h = 0; h < 2; ++h) codes[p][h] = w4_tiled_codes(q, 32 * js[p] + 16 * h, gi);
    __m512i acc[P][2][MT];
    for (int p = 0; p < P; ++p)
      for (int h = 0; h < 2; ++h)
        for (int m = 0; m < MT; ++m) acc[p][h][m] = _mm512_setzero_si512();
    const int8_t* xg = xq + gi * g;
    for (int p = 0; p < P; ++p) prefetch_w4_meta(q, 32 * js[p], gi);
    for (int64_t l = 0; l < g / 8; ++l) {  // line l: codes 8 l .. 8 l + 3 (low nibbles), 8 l + 4 .. 8 l + 7 (high)
      __m512i xl[MT], xh[MT];
      for (int m = 0; m < MT; ++m) {
        xl[m] = _mm512_set1_epi32(load_i32(xg + m * K + 8 * l));
        xh[m] = _mm512_set1_epi32(load_i32(xg + m * K + 8 * l + 4));
      }
      for (int p = 0; p < P; ++p)
        for (int h = 0; h < 2; ++h) {
          const uint8_t* line = codes[p][h] + 64 * l;
          _mm_prefetch(reinterpret_cast<const char*>(line + kW4TiledPrefetch), _MM_HINT_T1);
          const __m512i v = _mm512_loadu_si512(line);
          const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
          for (int m = 0; m < MT; ++m) acc[p][h][m] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[p][h][m], lo, xl[m]), hi, xh[m]);
        }
    }
    for (int p = 0; p < P; ++p) {
      for (int h = 0; h < 2; ++h) {
        const uint8_t* meta = w4_tiled_meta(q, 32 * js[p] + 16 * h, gi);
        const __m512 sv = _mm512_loadu_ps(reinterpret_cast<const float*>(meta));
        const __m512 zv = _mm512_loadu_ps(reinterpret_cast<const float*>(meta + 128));
        for (int m = 0; m < MT; ++m)
          w4_tiled_step16(tot[p][h][m], acc[p][h][m], sv, zv, xs[m * G + gi], xsum[m * G + gi], gi == 0);
      }
    }
  }
  for (int p = 0; p < P; ++p)
    for (int h = 0; h < 2; ++h)
      for (int m = 0; m < MT; ++m) _mm512_storeu_ps(out + m * ldo + 32 * js[p] + 16 * h, _mm512_load_ps(tot[p][h][m]));
}

// With AMX up to 4 rows a thread reads two blocks at a time (two streams); 5-8 rows' accumulators fill the registers
// with one block, so those read one.
template <int MT>
void w4a8_tiled_rows_mt(const int8_t* xq, const float* xs, const int32_t* xsum, const QuantView& q, float* out) {
  for_blocks(q.N / 32, 1, [&](int64_t lo, int64_t hi) {
    if constexpr (MT > 4 || !kW4TiledTwoStreams) {
      for (int64_t j = lo; j < hi; ++j) w4_tiled_blocks<1, MT>(xq, xs, xsum, q, &j, out, q.N);
    } else {
      in_two_streams(lo, hi, [&](const int64_t* js) { w4_tiled_blocks<2, MT>(xq, xs, xsum, q, js, out, q.N); },
                     [&](const int64_t* js) { w4_tiled_blocks<1, MT>(xq, xs, xsum, q, js, out, q.N); });
    }
  });
}

// out [M, N] for M rows (any count: eight at a time) of a tiled W4A8 weight.
void w4a8_tiled_rows(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t M, const QuantView& q, float* out) {
  const int64_t K = q.K, G = q.G;
  for (int64_t m = 0; m < M; m += 8) {
    const int8_t* x = xq + m * K;
    const float* s = xs + m * G;
    const int32_t* c = xsum + m * G;
    float* o = out + m * q.N;
    switch (std::min<int64_t>(8, M - m)) {
      case 1: w4a8_tiled_rows_mt<1>(x, s, c, q, o); break;
      case 2: w4a8_tiled_rows_mt<2>(x, s, c, q, o); break;
      case 3: w4a8_tiled_rows_mt<3>(x, s, c, q, o); break;
      case 4: w4a8_tiled_rows_mt<4>(x, s, c, q, o); break;
      case 5: w4a8_tiled_rows_mt<5>(x, s, c, q, o); break;
      case 6: w4a8_tiled_rows_mt<6>(x, s, c, q, o); break;
      case 7: w4a8_tiled_rows_mt<7>(x, s, c, q, o); break;
      default: w4a8_tiled_rows_mt<8>(x, s, c, q, o); break;
    }
  }
}
#endif

#if defined(QUANT_W8A8_VNNI)
#define QUANT_W4A8_VNNI 1
// W4A8 prefill on a tiled weight with AVX-512 VNNI, no AMX (Zen 4, Ice Lake / Cascade Lake servers).
// w4a8_tiled_rows passes 8 x rows over the whole weight at a time (at 1024 rows it reads the weight 128 times); here
// each thread keeps one 32-row block in L1 / L2 while all of x passes over it, kVnniW4Rows rows at a time from a
// grouped copy of x as w8a8_vnni's (its signed codes as they are): the weight is read once per call, and one and /
// shift per line of codes feeds 2 x kVnniW4Rows VPDPBUSD (the nibbles unsigned 0..15, x's codes signed, 4 of them
// broadcast per step). Per group each output's exact integer sum, then w4_tiled_blocks' epilogue on the same values
// in the same order (w4a8_step's term on 16 outputs at a time): a row gets the row kernel's bits at any row count.
// x rows per pass; Zen 4, 1024 rows at E2B's MLP shapes, one build per choice: 12 rows 410-515 GOP/s, 10 447-569,
// 8 540-672, 7 650-681, 6 669-723.
constexpr int kVnniW4Rows = 6;
// From 9 rows (Zen 4, one row's pass of six E2B KV-shared layers' linears, 0.21 GB, from memory): 9 rows 12.1-12.6 ms
// against 14.3-14.9 for w4a8_tiled_rows' passes of 8 + 1; at 12 and 16 rows the two within 5%.
constexpr int64_t kVnniW4MinRows = 9;

// Block j's 32 outputs for x rows [m, m + MR) (xg: their group of the grouped copy; xs / xsum: [M, G])
// (pf: x's first rows, the pass that reads the block from memory: every line asked for kW4TiledPrefetch bytes ahead,
// the next block's as this one's are read)
template <int MR>
inline void vnni_w4_rows(const int32_t* xg, const float* xs, const int32_t* xsum, int64_t m, const QuantView& q,
                         int64_t j, float* out, bool pf) {
  const int64_t G = q.G, g = q.g;
  const __m512i m4 = _mm512_set1_epi8(15);
  alignas(64) float tot[MR][32];
  for (int64_t gi = 0; gi < G; ++gi) {
    const uint8_t* c0 = w4_tiled_codes(q, 32 * j, gi);
    const uint8_t* c1 = w4_tiled_codes(q, 32 * j + 16, gi);
    const int32_t* xw = xg + gi * (g / 4) * kVnniW4Rows;  // line l's low nibbles: step 2 l of the group, high: 2 l + 1
    __m512i acc[MR][2];
    for (auto& a : acc) a[0] = a[1] = _mm512_setzero_si512();
    if (pf) prefetch_w4_meta(q, 32 * j, gi);
    for (int64_t l = 0; l < g / 8; ++l) {
      if (pf) {
        _mm_prefetch(reinterpret_cast<const char*>(c0 + 64 * l + kW4TiledPrefetch), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(c1 + 64 * l + kW4TiledPrefetch), _MM_HINT_T1);
      }
      const __m512i v0 = _mm512_loadu_si512(c0 + 64 * l), v1 = _mm512_loadu_si512(c1 + 64 * l);
      const __m512i lo0 = _mm512_and_si512(v0, m4), lo1 = _mm512_and_si512(v1, m4);
      const __m512i hi0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4), hi1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
      const int32_t* xl = xw + 2 * l * kVnniW4Rows;
      for (int i = 0; i < MR; ++i) {
        const __m512i xb = _mm512_set1_epi32(xl[i]);
        acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], lo0, xb);
        acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], lo1, xb);
      }
      for (int i = 0; i < MR; ++i) {
        const __m512i xb = _mm512_set1_epi32(xl[kVnniW4Rows + i]);
        acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], hi0, xb);
        acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], hi1, xb);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const uint8_t* meta = w4_tiled_meta(q, 32 * j + 16 * h, gi);
      const __m512 sv = _mm512_loadu_ps(reinterpret_cast<const float*>(meta));
      const __m512 zv = _mm512_loadu_ps(reinterpret_cast<const float*>(meta + 128));
      for (int i = 0; i < MR; ++i)
        w4_tiled_step16(&tot[i][16 * h], acc[i][h], sv, zv, xs[(m + i) * G + gi], xsum[(m + i) * G + gi], gi == 0);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int h = 0; h < 2; ++h) _mm512_storeu_ps(out + (m + i) * q.N + 32 * j + 16 * h, _mm512_load_ps(&tot[i][16 * h]));
}

void w4a8_vnni(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t M, const QuantView& q, float* out) {
  const int64_t E = q.K / 4, groups = (M + kVnniW4Rows - 1) / kVnniW4Rows;
  const avector<int32_t> xg = vnni_group_x(xq, M, q.K, 0, kVnniW4Rows);
  for_blocks(q.N / 32, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j)
      for (int64_t gi = 0; gi < groups; ++gi) {
        const int64_t m = gi * kVnniW4Rows;
        with_rows<kVnniW4Rows>(std::min<int64_t>(kVnniW4Rows, M - m), [&](auto mr) {
          vnni_w4_rows<decltype(mr)::value>(xg.data() + gi * E * kVnniW4Rows, xs, xsum, m, q, j, out, gi == 0);
        });
      }
  });
}
#endif

// ---- weight-only kinds' prefill on AVX-512 BF16 dot products -------------------------------------------------
// W8A16 / W4A16 from kWoBf16MinRows rows in a bf16 model (quant_linear's bf16_dot: the caller's linear plan
// rounds its GEMMs' inputs to bf16, as oneDNN's bf16 matmul does for bf16 weights), where the CPU has AVX-512 BF16
// and no AMX (Zen 4, Cooper Lake). The float32 path dequantizes blocks for ATen's mm, whose MKL keeps to its AVX2
// code off Intel CPUs: 0.38x bf16's prefill GEMM on Zen 4. Here the codes themselves are bf16 operands (every int8
// or int4 code is exact in bf16) and VDPBF16PS multiplies pairs of them by pairs of x's bf16 values into float32
// sums: each thread converts one 32-row block's codes, kc inputs at a time, into a panel of 16 x 16 word tiles (a
// line: one pair of inputs of 16 rows, rows 16-31 1 KB on; L1-resident), then passes every x row over it,
// kWoBf16Rows rows at a time, each pair of x values broadcast. Per chunk of kc inputs (inside one group) the
// scale and zero point: total += s * (sum q x - z * sum x) (W8A16: s * sum q x), in float32, x's sums over the chunk
// computed once per call from the same bf16 values; a panel holds up to kWoBf16SpanInputs inputs (several small
// groups), the totals in registers across them. A row's operations do not depend on the rows beside it. Where the
// CPU has AMX-bf16 the same panels are B tiles (wo_amx_kernel below); with IMPL_CPU_AMX=0 this kernel runs there.
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define QUANT_WO_BF16 1
// x rows per pass: 2 x 6 float32 sums, 2 x 6 totals, 2 panel lines and a broadcast in 27 of the 32 zmm. Zen 4,
// E2B's MLP pair, 512 rows, one build per choice (the totals then in out's rows): 6 rows 316-339 GOP/s (W8A16) /
// 275-324 (W4A16 groups of 128); 8 rows 266-323 / 119-130, 10 317-322 / 134-135, 12 142-146 / 127-130.
constexpr int kWoBf16Rows = 6;
// From 8 rows (Zen 4, one E2B MLP of a KV-shared layer, 2 x 12288 x 1536 and 1536 x 12288, alternated runs): W8A16
// 6.7-7.3 ms against the row kernel's 11.4-11.6, W4A16 (groups of 128) 8.2-9.2 against 9.5-10.3; at 6 rows W4A16
// 7.3-7.8 against 7.5-7.7, at 2 rows the row kernel 2.4-2.9 against 5.3-7.9 (converting the codes is per call).
constexpr int64_t kWoBf16MinRows = 8;

// Inputs one panel holds (16 KB of bf16 pairs for 32 rows): one chunk, or several chunks of smaller groups whose
// totals stay in registers between them (groups of 32 at E2B's MLP shapes, 512 rows: 208-214 ms against 319-363 with
// one group per panel, the totals read and written back per group; groups of 128 and W8A16 within the noise).
constexpr int64_t kWoBf16SpanInputs = 256;

// The chunk of inputs one scale covers: the group (g <= 256) or the largest multiple of 32 up to 256 dividing it.
inline int64_t wo_bf16_chunk(int64_t g) {
  if (g <= 256) return g;
  int64_t kc = 256;
  while (g % kc) kc -= kGroupMultiple;
  return kc;
}

// Weight rows [n0, n0 + 32)'s codes of inputs [k0, k0 + kc) (inside group gi) as bf16 word tiles: panel + c * 2048
// + h * 1024 + 64 p holds pair (k0 + 32 c + 2 p, + 1) of rows n0 + 16 h .. + 15 (each 4-byte lane one row); their
// 32 scales into s, zero points into z (W4A16).
template <QuantKind Kd>
inline void wo_bf16_panel(const QuantView& q, int64_t n0, int64_t k0, int64_t kc, int8_t* panel, float* s, float* z) {
  const int64_t gi = k0 / q.g, kk0 = k0 - gi * q.g, half = q.g / 2;
  alignas(64) uint16_t rows[16][32];
  for (int h = 0; h < 2; ++h) {
    for (int64_t c = 0; c < kc / 32; ++c) {
      for (int r = 0; r < 16; ++r) {
        const uint8_t* blk = q.data + (n0 + 16 * h + r) * q.G * q.B + gi * q.B;
        __m512 v[2];
        for (int t = 0; t < 2; ++t) {
          const int64_t kk = kk0 + 32 * c + 16 * t;  // 16 codes, inside the low or the high nibbles (half % 16 == 0)
          __m512i codes;
          if constexpr (Kd == QuantKind::kW4A16) {
            const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kk % half)));
            codes = kk < half ? _mm512_and_si512(b, _mm512_set1_epi32(15)) : _mm512_srli_epi32(b, 4);
          } else {
            codes = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kk)));
          }
          v[t] = _mm512_cvtepi32_ps(codes);
        }
        _mm512_store_si512(rows[r], (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]));  // exact: |code| <= 128
      }
      transpose_words_16x16(reinterpret_cast<const int8_t*>(rows), 64, panel + c * 2048 + h * 1024);
    }
    for (int r = 0; r < 16; ++r) {
      const uint8_t* blk = q.data + (n0 + 16 * h + r) * q.G * q.B + gi * q.B;
      if constexpr (Kd == QuantKind::kW4A16) {
        s[16 * h + r] = load_f32(blk + half);
        z[16 * h + r] = load_f32(blk + half + 4);
      } else {
        s[16 * h + r] = load_f32(blk + q.g);
      }
    }
  }
}

// x rows [m, m + MR) (xg: their group of x's pairs, [K / 2][kWoBf16Rows] from the group's start) times a panel of S
// chunks from chunk c0 into out's 32 columns from n0 (first: the totals start at zero, else at out's values). Each
// chunk's sums then its scale and zero point (s, z: [S][32]) into the totals. xs: [M, C] sums of x over each chunk
// (W4A16). Where the totals live between chunks (the same operations either way): RegTotals, in registers, which
// pays where a chunk is short (groups of 32: 263-287 against 252-266 GOP/s, E2B's MLP pair, 512 rows, Zen 4), else
// in out's rows: 2 x MR more live vectors made GCC 12 keep the panel lines on the stack inside the loop (W8A16, one
// chunk per panel, ran 160-183 GOP/s that way against 268-319 at E2B's MLP shapes; W4A16 in groups of 64 or 128
// 2-10% faster too).
template <QuantKind Kd, int MR, bool RegTotals>
inline void wo_bf16_rows(const uint32_t* xg, const float* xs, int64_t m, int64_t C, int64_t c0, int64_t S, int64_t kc,
                         const int8_t* panel, const float* s, const float* z, float* out, int64_t N, int64_t n0,
                         bool first) {
  __m512 tot[RegTotals ? MR : 1][2];
  if constexpr (RegTotals)
    for (int i = 0; i < MR; ++i)
      for (int h = 0; h < 2; ++h)
        tot[i][h] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(out + (m + i) * N + n0 + 16 * h);
  const uint32_t* xp = xg + c0 * (kc / 2) * kWoBf16Rows;
  for (int64_t cs = 0; cs < S; ++cs) {
    __m512 acc[MR][2];
    for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
    for (int64_t t = 0; t < kc / 32; ++t, panel += 2048) {
      for (int p = 0; p < 16; ++p, xp += kWoBf16Rows) {
        const __m512bh w0 = (__m512bh)_mm512_load_si512(panel + 64 * p);
        const __m512bh w1 = (__m512bh)_mm512_load_si512(panel + 1024 + 64 * p);
        for (int i = 0; i < MR; ++i) {
          const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[i]));
          acc[i][0] = _mm512_dpbf16_ps(acc[i][0], w0, xb);
          acc[i][1] = _mm512_dpbf16_ps(acc[i][1], w1, xb);
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m512 sv = _mm512_loadu_ps(s + 32 * cs + 16 * h);
      for (int i = 0; i < MR; ++i) {
        __m512 t = acc[i][h];
        if constexpr (Kd == QuantKind::kW4A16)
          t = _mm512_fnmadd_ps(_mm512_loadu_ps(z + 32 * cs + 16 * h), _mm512_set1_ps(xs[(m + i) * C + c0 + cs]), t);
        if constexpr (RegTotals) {
          tot[i][h] = _mm512_fmadd_ps(sv, t, tot[i][h]);
        } else {
          float* o = out + (m + i) * N + n0 + 16 * h;
          _mm512_storeu_ps(o, _mm512_fmadd_ps(sv, t, first && cs == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(o)));
        }
      }
    }
  }
  if constexpr (RegTotals)
    for (int i = 0; i < MR; ++i)
      for (int h = 0; h < 2; ++h) _mm512_storeu_ps(out + (m + i) * N + n0 + 16 * h, tot[i][h]);
}

// Chunks per panel from which wo_bf16_rows keeps the totals in registers (groups of 32: 8 chunks of a 256-input span)
constexpr int64_t kWoRegTotalsMinChunks = 8;

// x (bf16 [M, K]) as pairs in groups of kWoBf16Rows rows: [groups][K / 2][kWoBf16Rows] 32-bit words (the last group's
// missing rows zeros), so a step's broadcasts read one line.
template <QuantKind Kd>
void wo_bf16_kernel(const uint16_t* x, const float* xs, int64_t M, const QuantView& q, float* out) {
  const int64_t K = q.K, kc = wo_bf16_chunk(q.g), C = K / kc, groups = (M + kWoBf16Rows - 1) / kWoBf16Rows;
  const int64_t E = K / 2;
  avector<uint32_t> xg(static_cast<size_t>(groups * E * kWoBf16Rows));
  at::parallel_for(0, groups, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t gi = lo; gi < hi; ++gi)
      for (int i = 0; i < kWoBf16Rows && gi * kWoBf16Rows + i < M; ++i) {
        const auto* row = reinterpret_cast<const uint32_t*>(x + (gi * kWoBf16Rows + i) * K);
        uint32_t* d = xg.data() + gi * E * kWoBf16Rows + i;
        for (int64_t e = 0; e < E; ++e) d[e * kWoBf16Rows] = row[e];
      }
  });
  int64_t S = std::max<int64_t>(1, kWoBf16SpanInputs / kc);  // chunks per panel (small groups: several)
  while (C % S) --S;
  for_blocks(q.N / 32, 1, [&](int64_t lo, int64_t hi) {
    avector<int8_t> panel(static_cast<size_t>(S * kc * 64));
    avector<float> s(static_cast<size_t>(S * 32)), z(static_cast<size_t>(S * 32));
    for (int64_t j = lo; j < hi; ++j)
      for (int64_t c0 = 0; c0 < C; c0 += S) {
        for (int64_t cs = 0; cs < S; ++cs)
          wo_bf16_panel<Kd>(q, 32 * j, (c0 + cs) * kc, kc, panel.data() + cs * kc * 64, s.data() + 32 * cs,
                            z.data() + 32 * cs);
        for (int64_t gi = 0; gi < groups; ++gi)
          with_rows<kWoBf16Rows>(std::min<int64_t>(kWoBf16Rows, M - gi * kWoBf16Rows), [&](auto mr) {
            auto pass = [&](auto reg) {
              wo_bf16_rows<Kd, decltype(mr)::value, decltype(reg)::value>(
                  xg.data() + gi * E * kWoBf16Rows, xs, gi * kWoBf16Rows, C, c0, S, kc, panel.data(), s.data(),
                  z.data(), out, q.N, 32 * j, c0 == 0);
            };
            if (S >= kWoRegTotalsMinChunks) pass(std::true_type{});
            else pass(std::false_type{});
          });
      }
  });
}

// ---- W4A16 / W8A16 under kWoBf16MinRows rows (decode) in bf16 dot products ----
// The float32 row kernel (wo_tile) spends 7 instructions per 32 codes and weight row converting W4A16's codes to
// float32 and taking off the zero point before its FMAs (W4A16 decode ran at 32-38% of its bandwidth bound on Zen 4:
// tg128 11.7-14.2 tok/s at full size, llama.cpp's Q4_0 17.6), and passes 2 x rows at a time, converting again per
// pass. Here (bf16_dot only: a bf16 model, whose linear plan rounds its GEMMs' inputs to bf16) each code becomes a
// bf16 operand once for every x row of the call (every int8 / int4 code is exact in bf16) and VDPBF16PS multiplies
// it by x's bf16 values as they lie in the row. W4A16: 32 bytes of a group spread to 32 words (VPMOVZXBW), their low
// and high nibbles (the group's codes j.. and half + j.., two runs of x) become bf16 by one VPERMW each from a
// 16-entry table: 2.5 instructions per 32 codes. W8A16: 32 codes sign-extended to int32, converted to float32 and
// rounded to bf16 pairs (exact): 5 per 32 codes, as many as the row kernel's conversion, so it takes kW8DotMinRows
// rows and more. Per group the sums are scaled into 16-lane totals, W4A16's zero point term taken off
// once per output as sum_g s z (sum of the group's bf16 x); one horizontal sum per output. A row's operations do not
// depend on the rows beside it.
#if defined(QUANT_WO_BF16)
// Weight rows per pass: 2 up to kWoDotPairRows x rows (2 sums per weight row and x row), else 1.
constexpr int kWoDotPairRows = 3;
// W8A16 from this many rows: Zen 4, the linears of one KV-shared layer's MLP and a q/k/v-sized one (12288 x 1536,
// 1536 x 12288, 2048 x 1536), two builds alternated in one process, the row kernel's time / this one's at 1 / 2 / 3 /
// 4 / 7 rows: 0.93 / 0.99-1.13 / 0.98 / 1.12-1.22 / 1.30 (W4A16, groups of 128: 1.57-1.61 / 1.78-1.82 / - / 1.83-1.92 /
// 1.92-1.94).
constexpr int64_t kW8DotMinRows = 4;

// sums [M, K / seg]: each row's bf16 values (x [M, K]) summed over inputs [c seg, (c + 1) seg) in float32, 16 lanes
// then the lanes' sum (a row's sums depend on its own values alone). seg: a multiple of 16.
inline void bf16_segment_sums(const uint16_t* x, int64_t M, int64_t K, int64_t seg, float* sums) {
  const int64_t C = K / seg;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) {
      __m512 a = _mm512_setzero_ps();
      for (int64_t k = c * seg; k < (c + 1) * seg; k += 16) {
        const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + m * K + k)));
        a = _mm512_add_ps(a, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
      }
      sums[m * C + c] = _mm512_reduce_add_ps(a);
    }
}

inline __m512i bf16_nibble_table() {  // word k: bf16 of k (0-15)
  alignas(64) uint16_t t[32] = {};
  for (int k = 0; k < 16; ++k) {
    const float f = static_cast<float>(k);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    t[k] = static_cast<uint16_t>(u >> 16);  // exact: k has at most 4 significant bits
  }
  return _mm512_load_si512(t);
}

// out[m * ldo + r] for x rows m < MT (bf16, ldx apart; W4A16: xs [MT][G] each group's sum of them) and weight rows
// r < P (rowB apart from w)
template <QuantKind Kd, int P, int MT>
inline void wo_dot_tile(const uint16_t* x, int64_t ldx, const float* xs, const uint8_t* w, int64_t rowB,
                        const QuantView& q, float* out, int64_t ldo, int64_t pf) {
  const int64_t g = q.g, half = g / 2;
  const __m512i table = bf16_nibble_table(), low4 = _mm512_set1_epi16(15);
  __m512 tot[P][MT];
  float zx[P][MT] = {};
  for (auto& t : tot)
    for (auto& v : t) v = _mm512_setzero_ps();
  for (int64_t gi = 0; gi < q.G; ++gi) {
    const uint8_t* blk = w + gi * q.B;
    const uint16_t* xg = x + gi * g;
    __m512 acc[P][MT][2];
    for (auto& a : acc)
      for (auto& v : a) v[0] = v[1] = _mm512_setzero_ps();
    if constexpr (Kd == QuantKind::kW8A16) {
      if (pf) prefetch_groups<P>(blk + g, rowB, q.B - g, pf);  // the scale's line
      for (int64_t k = 0; k < g; k += 32) {
        if (pf && k % 64 == 0) prefetch_groups<P>(blk + k, rowB, 1, pf);
        __m512bh wv[P];
        for (int r = 0; r < P; ++r) {
          const uint8_t* c = blk + r * rowB + k;
          const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c))));
          const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16))));
          wv[r] = _mm512_cvtne2ps_pbh(b, a);  // exact: |code| <= 128
        }
        for (int m = 0; m < MT; ++m) {
          const __m512bh xv = (__m512bh)_mm512_loadu_si512(xg + m * ldx + k);
          for (int r = 0; r < P; ++r) acc[r][m][(k / 32) & 1] = _mm512_dpbf16_ps(acc[r][m][(k / 32) & 1], wv[r], xv);
        }
      }
    } else if (half >= 32) {
      if (pf) prefetch_groups<P>(blk, rowB, q.B, pf);
      for (int64_t j = 0; j < half; j += 32) {
        __m512bh lo[P], hi[P];
        for (int r = 0; r < P; ++r) {
          const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + r * rowB + j)));
          lo[r] = (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(b, low4), table);
          hi[r] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(b, 4), table);
        }
        for (int m = 0; m < MT; ++m) {
          const __m512bh xl = (__m512bh)_mm512_loadu_si512(xg + m * ldx + j);
          const __m512bh xh = (__m512bh)_mm512_loadu_si512(xg + m * ldx + half + j);
          for (int r = 0; r < P; ++r) {
            acc[r][m][0] = _mm512_dpbf16_ps(acc[r][m][0], lo[r], xl);
            acc[r][m][1] = _mm512_dpbf16_ps(acc[r][m][1], hi[r], xh);
          }
        }
      }
    } else {  // W4A16 in groups of 32: 16 bytes, the low nibbles codes 0-15 and the high ones 16-31, in x's order
      if (pf) prefetch_groups<P>(blk, rowB, q.B, pf);
      for (int r = 0; r < P; ++r) {
        const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + r * rowB)));
        const __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, _mm256_set1_epi16(15))),
                                             _mm256_srli_epi16(b, 4), 1);
        const __m512bh wv = (__m512bh)_mm512_permutexvar_epi16(c, table);
        for (int m = 0; m < MT; ++m)
          acc[r][m][0] = _mm512_dpbf16_ps(acc[r][m][0], wv, (__m512bh)_mm512_loadu_si512(xg + m * ldx));
      }
    }
    for (int r = 0; r < P; ++r) {
      const uint8_t* tail = blk + r * rowB + (Kd == QuantKind::kW4A16 ? half : g);  // the scale (W4A16: then z)
      const float sc = load_f32(tail);
      const __m512 sv = _mm512_set1_ps(sc);
      for (int m = 0; m < MT; ++m) {
        tot[r][m] = _mm512_fmadd_ps(sv, _mm512_add_ps(acc[r][m][0], acc[r][m][1]), tot[r][m]);
        if constexpr (Kd == QuantKind::kW4A16) zx[r][m] += sc * load_f32(tail + 4) * xs[m * q.G + gi];
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < P; ++r) out[m * ldo + r] = _mm512_reduce_add_ps(tot[r][m]) - zx[r][m];
}

// x [MT, K] bf16 @ dequant(w)^T
template <QuantKind Kd, int MT>
void wo_dot_rows(const uint16_t* x, const float* xs, const QuantView& q, float* out) {
  constexpr int P = MT <= kWoDotPairRows ? 2 : 1;
  const int64_t N = q.N, K = q.K, rowB = q.G * q.B, blocks = N / P;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, rowB * P));
  for_blocks(blocks, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {  // decode's row counts ask for the rows kPrefetchRows ahead (as wo_row_kernel)
      const bool ahead = MT <= kWoTile && (b + 1) * P + kPrefetchRows <= N;
      wo_dot_tile<Kd, P, MT>(x, K, xs, q.data + b * P * rowB, rowB, q, out + b * P, N, ahead ? kPrefetchRows * rowB : 0);
    }
  });
  for (int64_t n = blocks * P; n < N; ++n) wo_dot_tile<Kd, 1, MT>(x, K, xs, q.data + n * rowB, rowB, q, out + n, N, 0);
}

// x [M, K] (any float dtype, M < kWoBf16MinRows) @ dequant(w)^T through wo_dot_rows: x rounded to bf16, its group
// sums for W4A16.
torch::Tensor wo_dot_rows_mm(const torch::Tensor& x, const QuantView& q) {
  const int64_t M = x.size(0), K = q.K;
  const torch::Tensor xb = x.to(torch::kBFloat16).contiguous();
  auto out = torch::empty({M, q.N}, x.options().dtype(torch::kFloat32));
  const auto* xv = reinterpret_cast<const uint16_t*>(xb.data_ptr());
  if (q.kind == QuantKind::kW8A16) {
    with_rows<kWoBf16MinRows - 1>(M, [&](auto mt) {
      wo_dot_rows<QuantKind::kW8A16, decltype(mt)::value>(xv, nullptr, q, out.data_ptr<float>());
    });
    return out;
  }
  auto xs = torch::empty({M, q.G}, out.options());
  float* xsp = xs.data_ptr<float>();
  bf16_segment_sums(xv, M, K, q.g, xsp);
  with_rows<kWoBf16MinRows - 1>(M, [&](auto mt) {
    wo_dot_rows<QuantKind::kW4A16, decltype(mt)::value>(xv, xsp, q, out.data_ptr<float>());
  });
  return out;
}
#endif

// ---- the same on AMX-bf16 tiles (Sapphire Rapids and later) ----
// wo_bf16_panel's word tiles are TDPBF16PS's B tiles as they stand (a line: one pair of inputs of 16 weight rows),
// x's bf16 rows its A tiles read in place (16 rows x 32 inputs, stride K), so one 32 x 32 block of outputs is four
// C tiles: per 32 inputs two A tiles (x rows 0-15, 16-31) times two B tiles (weight rows 0-15, 16-31). Per chunk of
// kc inputs the tiles hold the chunk's sums; stored, wo_bf16_rows' epilogue term for term adds them into the totals
// (s * (sum q x - z * sum x)), kept in a 32 x 32 buffer across a span. Blocking: x's rows in superblocks of
// kWoAmxXBytes of one span (read from L2 by every weight block of the thread), spans of kWoAmxSpanInputs inputs
// (out's totals read and written once per span), each weight panel converted once per span and superblock. A row's
// operations do not depend on the rows beside it (tiles multiply row by row; the last 32 rows' group is padded
// with zeros), nor on M. Without an AMX machine the kernel was checked under emulated tiles
// (impl/kernels/cpu_amx_emulate.h, make test-amx-emulated); its blocking constants are not measured yet.
#if defined(QUANT_WO_BF16) && defined(QUANT_AMX_INT8) && defined(__AMX_BF16__)
#define QUANT_WO_AMX 1
constexpr int64_t kWoAmxSpanInputs = 2048;
constexpr int64_t kWoAmxXBytes = 1 << 20;

template <QuantKind Kd>
void wo_amx_kernel(const uint16_t* x, const float* xs, int64_t M, const QuantView& q, float* out) {
  const int64_t K = q.K, kc = wo_bf16_chunk(q.g), C = K / kc, MB = (M + 31) / 32, tail = M % 32;
  int64_t SC = std::max<int64_t>(1, kWoAmxSpanInputs / kc);  // chunks per span
  while (C % SC) --SC;
  const int64_t R = std::max<int64_t>(1, kWoAmxXBytes / (32 * SC * kc * 2));  // 32-row groups per superblock
  avector<uint16_t> last;  // x's last group when M % 32: its rows, then zeros
  if (tail) {
    last.assign(static_cast<size_t>(32 * K), 0);
    std::memcpy(last.data(), x + (MB - 1) * 32 * K, static_cast<size_t>(tail * K) * 2);
  }
  for_blocks(q.N / 32, 1, [&](int64_t lo, int64_t hi) {
    avector<int8_t> panel(static_cast<size_t>(SC * kc * 64));
    avector<float> s(static_cast<size_t>(SC * 32)), z(static_cast<size_t>(SC * 32));
    alignas(64) float c[32][32];
    alignas(64) float tot[32][32];
    cpu_amx::config_16x64();
    for (int64_t c0 = 0; c0 < C; c0 += SC)
      for (int64_t mb0 = 0; mb0 < MB; mb0 += R)
        for (int64_t j = lo; j < hi; ++j) {
          for (int64_t cs = 0; cs < SC; ++cs)
            wo_bf16_panel<Kd>(q, 32 * j, (c0 + cs) * kc, kc, panel.data() + cs * kc * 64, s.data() + 32 * cs,
                              z.data() + 32 * cs);
          for (int64_t mb = mb0; mb < std::min(MB, mb0 + R); ++mb) {
            const int64_t m0 = mb * 32, mt = std::min<int64_t>(32, M - m0);
            const uint16_t* a = tail && mb == MB - 1 ? last.data() : x + m0 * K;
            float* o = out + m0 * q.N + 32 * j;
            for (int64_t i = 0; i < mt; ++i)
              for (int h = 0; h < 2; ++h)
                _mm512_store_ps(&tot[i][16 * h], c0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(o + i * q.N + 16 * h));
            const int8_t* pl = panel.data();
            for (int64_t cs = 0; cs < SC; ++cs) {
              _tile_zero(0);
              _tile_zero(1);
              _tile_zero(2);
              _tile_zero(3);
              for (int64_t t = 0; t < kc / 32; ++t, pl += 2048) {
                const uint16_t* ak = a + (c0 + cs) * kc + 32 * t;
                _tile_loadd(4, ak, K * 2);
                _tile_loadd(6, pl, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(7, pl + 1024, 64);
                _tile_dpbf16ps(1, 4, 7);
                _tile_loadd(5, ak + 16 * K, K * 2);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
              }
              _tile_stored(0, &c[0][0], 128);
              _tile_stored(1, &c[0][16], 128);
              _tile_stored(2, &c[16][0], 128);
              _tile_stored(3, &c[16][16], 128);
              for (int h = 0; h < 2; ++h) {  // wo_bf16_rows' epilogue, term for term
                const __m512 sv = _mm512_loadu_ps(s.data() + 32 * cs + 16 * h);
                const __m512 zv = _mm512_loadu_ps(z.data() + 32 * cs + 16 * h);
                for (int64_t i = 0; i < mt; ++i) {
                  __m512 v = _mm512_load_ps(&c[i][16 * h]);
                  if constexpr (Kd == QuantKind::kW4A16)
                    v = _mm512_fnmadd_ps(zv, _mm512_set1_ps(xs[(m0 + i) * C + c0 + cs]), v);
                  _mm512_store_ps(&tot[i][16 * h], _mm512_fmadd_ps(sv, v, _mm512_load_ps(&tot[i][16 * h])));
                }
              }
            }
            for (int64_t i = 0; i < mt; ++i)
              for (int h = 0; h < 2; ++h) _mm512_storeu_ps(o + i * q.N + 16 * h, _mm512_load_ps(&tot[i][16 * h]));
          }
        }
    _tile_release();
  });
}
#endif

// x [M, K] (any float dtype) @ dequant(w)^T through wo_bf16_kernel (wo_amx_kernel where the tiles are allowed): x
// rounded to bf16, its chunk sums for W4A16.
torch::Tensor wo_bf16_mm(const torch::Tensor& x, const QuantView& q) {
  const int64_t M = x.size(0), K = q.K, kc = wo_bf16_chunk(q.g), C = K / kc;
  const torch::Tensor xb = x.to(torch::kBFloat16).contiguous();
  auto out = torch::empty({M, q.N}, x.options().dtype(torch::kFloat32));
  const auto* xv = reinterpret_cast<const uint16_t*>(xb.data_ptr());
  if (q.kind == QuantKind::kW4A16) {
    auto xs = torch::empty({M, C}, out.options());
    float* xsp = xs.data_ptr<float>();
    at::parallel_for(0, M, 16, [&](int64_t lo, int64_t hi) { bf16_segment_sums(xv + lo * K, hi - lo, K, kc, xsp + lo * C); });
#if defined(QUANT_WO_AMX)
    if (cpu_amx::tiles_allowed()) {
      wo_amx_kernel<QuantKind::kW4A16>(xv, xsp, M, q, out.data_ptr<float>());
      return out;
    }
#endif
    wo_bf16_kernel<QuantKind::kW4A16>(xv, xsp, M, q, out.data_ptr<float>());
  } else {
#if defined(QUANT_WO_AMX)
    if (cpu_amx::tiles_allowed()) {
      wo_amx_kernel<QuantKind::kW8A16>(xv, nullptr, M, q, out.data_ptr<float>());
      return out;
    }
#endif
    wo_bf16_kernel<QuantKind::kW8A16>(xv, nullptr, M, q, out.data_ptr<float>());
  }
  return out;
}
#endif

}  // namespace

bool is_quantized(const torch::Tensor& w) {
  return !w.is_mkldnn() && w.dim() == 3 && (w.scalar_type() == torch::kInt8 || w.scalar_type() == torch::kUInt8);
}

// A W8A8 weight in tile order for inputs of width K: int8 [N / 32, 1, 32 K + 128] (quant_linear.h).
inline bool tiled_w8a8_shape(const torch::Tensor& w, int64_t K) {
  return w.scalar_type() == torch::kInt8 && w.size(1) == 1 && K % 64 == 0 && w.size(2) == 32 * K + 128;
}
// A W4A8 weight in tile order for inputs of width K: int8 [N / 32, G, 16 g + 256] (quant_linear.h).
inline bool tiled_w4a8_shape(const torch::Tensor& w, int64_t K) {
  const int64_t G = w.size(1);
  return w.scalar_type() == torch::kInt8 && G > 0 && K % G == 0 && (K / G) % 64 == 0 && w.size(2) == 16 * (K / G) + 256;
}

QuantView quant_view(const torch::Tensor& w, int64_t K) {
  TORCH_CHECK(is_quantized(w), "a quantized weight is an int8 or uint8 [N, G, B] tensor");
  TORCH_CHECK(w.device().is_cpu() && w.is_contiguous(), "a quantized weight must be a contiguous CPU tensor");
  const int64_t N = w.size(0), G = w.size(1), B = w.size(2);
  TORCH_CHECK(G > 0 && K % G == 0, "a quantized weight of ", G, " groups cannot take inputs of width ", K);
  const int64_t g = K / G;
  TORCH_CHECK(g % kGroupMultiple == 0, "quantization groups must be a multiple of ", kGroupMultiple, " inputs, got ", g);
  if (tiled_w8a8_shape(w, K))
    return QuantView{QuantKind::kW8A8, 32 * N, 1, K, K, B, reinterpret_cast<const uint8_t*>(w.data_ptr()), true};
  if (tiled_w4a8_shape(w, K))
    return QuantView{QuantKind::kW4A8, 32 * N, G, g, K, B, reinterpret_cast<const uint8_t*>(w.data_ptr()), true};
  QuantKind kind;
  if (w.scalar_type() == torch::kInt8 && B == g / 2 + 8) {
    kind = QuantKind::kW4A8;
  } else if (w.scalar_type() == torch::kInt8) {
    TORCH_CHECK(G == 1 && B == g + 4, "an int8 quantized weight is W8A8 [N, 1, K + 4] or W4A8 [N, G, g / 2 + 8] for "
                "inputs of width ", K, "; got [", N, ", ", G, ", ", B, "]");
    kind = QuantKind::kW8A8;
  } else if (B == g + 4) {
    kind = QuantKind::kW8A16;
  } else {
    TORCH_CHECK(B == g / 2 + 8, "a uint8 quantized weight [N, G, B] takes B = g + 4 (int8 codes) or g / 2 + 8 "
                "(int4 codes) for groups of g inputs; got B = ", B, " for g = ", g);
    kind = QuantKind::kW4A16;
  }
  return QuantView{kind, N, G, g, K, B, reinterpret_cast<const uint8_t*>(w.data_ptr())};
}

int64_t out_features(const torch::Tensor& w, int64_t K) {
  return is_quantized(w) && takes_inputs(w, K) ? quant_view(w, K).N : w.size(0);
}

bool takes_inputs(const torch::Tensor& w, int64_t K) {
  if (!is_quantized(w)) return w.dim() == 2 && w.size(1) == K;
  const int64_t G = w.size(1), B = w.size(2);
  if (G <= 0 || K % G != 0) return false;
  const int64_t g = K / G;
  return B == g + 4 || B == g / 2 + 8 || tiled_w8a8_shape(w, K) || tiled_w4a8_shape(w, K);
}

// One row's codes: s = max|x| / 127 (NaNs skipped, as std::max skips them), q = clamp(nearbyint(x / s), -127, 127)
// (a NaN gives -127), vectorised with the same per-element arithmetic as the scalar tail, so every element gets
// the bits reference.quantize_rows gives it. (The scalar loop called nearbyintf per element: 2 ms of a 1024 x 1536
// W8A8 matmul's 11.) Clamping before rounding is the same as after: the bounds are integers.
void quantize_row(const float* xr, int64_t K, int8_t* qr, float* s_out) {
  vfloat vmax = vsplat(0.f);
  int64_t k = 0;
  for (; k + kVec <= K; k += kVec) {
    vfloat v = vload(xr + k);
    v = v < 0.f ? -v : v;
    vmax = vmax < v ? v : vmax;
  }
  float amax = 0.f;
  for (int64_t i = 0; i < kVec; ++i) amax = std::max(amax, vmax[i]);
  for (; k < K; ++k) amax = std::max(amax, std::fabs(xr[k]));
  const float sc = amax / 127.f;
  *s_out = sc;
  if (amax == 0.f) {
    std::memset(qr, 0, K);
    return;
  }
  const vfloat vsc = vsplat(sc), lo = vsplat(-127.f), hi = vsplat(127.f), magic = vsplat(12582912.f);
  // x / sc as x * (1 / sc) with Markstein's correction: q = x y, r = x - q sc (exact, by FMA), q + r y rounds to the
  // correctly rounded quotient when y = RN(1 / sc) and r does not underflow, so the codes are the division's (a
  // division per vector made the pass divide-bound: 7% of a W8A8 prefill on AMX). Outside [2^-87, 2^100] (r could
  // underflow, or y overflow) the division stays; a brute-force check of 5e8 quotients near every code's rounding
  // boundary, scales over 2^-120 .. 2^120, found no code differing (tests/quant: quantize_rows_exact_quotients).
#if defined(__AVX512F__) || defined(__FMA__)
  const bool by_reciprocal = sc >= 0x1p-87f && sc <= 0x1p100f;
#else
  const bool by_reciprocal = false;  // simd::vfma is two roundings without FMA: the correction would not be exact
#endif
  const vfloat vy = vsplat(1.f / sc);
  for (k = 0; k + kVec <= K; k += kVec) {
    const vfloat x = vload(xr + k);
    vfloat v;
    if (by_reciprocal) {
      const vfloat q = x * vy;
      v = simd::vfma(simd::vfma(-q, vsc, x), vy, q);
    } else {
      v = x / vsc;
    }
    v = lo < v ? v : lo;  // (NaN -> -127)
    v = v < hi ? v : hi;
    v = (v + magic) - magic;  // round half to even (|v| <= 127: exact)
    vstore_i8(qr + k, __builtin_convertvector(v, vi32));
  }
  for (; k < K; ++k) {
    const float v = std::nearbyint(xr[k] / sc);  // round half to even (the default rounding mode)
    qr[k] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, v)));
  }
}

std::vector<torch::Tensor> quantize_rows(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "quantize_rows takes x [M, K]");
  // bf16 rows are widened a row at a time into scratch (no float32 copy of the whole x)
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  auto xf = bf16 ? x.contiguous() : x.to(torch::kFloat32).contiguous();
  const int64_t M = xf.size(0), K = xf.size(1);
  auto q = torch::empty({M, K}, xf.options().dtype(torch::kInt8));
  auto s = torch::empty({M}, xf.options().dtype(torch::kFloat32));
  const void* xp = xf.data_ptr();
  int8_t* qp = q.data_ptr<int8_t>();
  float* sp = s.data_ptr<float>();
  auto body = [&](int64_t lo, int64_t hi) {
    avector<float> row(bf16 ? K : 0);
    for (int64_t m = lo; m < hi; ++m) {
      const float* xr;
      if (bf16) {
        const uint16_t* src = static_cast<const uint16_t*>(xp) + m * K;
        for (int64_t k = 0; k < K; ++k) row[k] = bf16_to_f32(src[k]);
        xr = row.data();
      } else {
        xr = static_cast<const float*>(xp) + m * K;
      }
      quantize_row(xr, K, qp + m * K, sp + m);
    }
  };
  if (at::get_num_threads() == 1 || M < 16) {
    body(0, M);
  } else {
    at::parallel_for(0, M, 8, body);
  }
  return {q, s};
}

std::vector<torch::Tensor> quantize_groups(const torch::Tensor& x, int64_t g) {
  TORCH_CHECK(x.dim() == 2, "quantize_groups takes x [M, K]");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(g > 0 && K % g == 0, "quantize_groups: width ", K, " is not a multiple of the group size ", g);
  auto xf = x.to(torch::kFloat32).contiguous();
  const int64_t G = K / g;
  auto q = torch::empty({M, K}, xf.options().dtype(torch::kInt8));
  auto s = torch::empty({M, G}, xf.options());
  auto sums = torch::empty({M, G}, xf.options().dtype(torch::kInt32));
  const float* xp = xf.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float* sp = s.data_ptr<float>();
  int32_t* up = sums.data_ptr<int32_t>();
  auto body = [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {  // i: one (row, group)
      int8_t* qr = qp + i * g;
      quantize_row(xp + i * g, g, qr, sp + i);
      int32_t sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t k = 0; k < g; ++k) sum += qr[k];
      up[i] = sum;
    }
  };
  if (at::get_num_threads() == 1 || M * G < 256) {
    body(0, M * G);
  } else {
    at::parallel_for(0, M * G, 64, body);
  }
  return {q, s, sums};
}

bool is_w8a8(const torch::Tensor& w, int64_t K) {
  return is_quantized(w) && takes_inputs(w, K) && quant_view(w, K).kind == QuantKind::kW8A8;
}

namespace {
// W8A8's product from quantized rows (codes [M, K], scales [M]) into out [M, N] float32.
void w8a8_product(const int8_t* codes, const float* scales, int64_t M, const QuantView& q, float* out) {
#if defined(QUANT_AMX_INT8)
  if (use_amx_w8a8(M, q)) {
    w8a8_amx(codes, scales, M, q, out);
    return;
  }
#endif
#if defined(QUANT_W8A8_VNNI)
  if (use_vnni_w8a8(M, q)) {
    w8a8_vnni(codes, scales, M, q, out);
    return;
  }
#endif
  if (q.tiled) {
#if defined(QUANT_W8A8_TILED)
    if (M >= kAmxRowsMin) {  // below kAmxMinRows (use_amx_w8a8 took the rest): a tiled weight's tiles are allowed
      w8a8_amx_rows(codes, scales, M, q, out);
      return;
    }
    w8a8_tiled_row(codes, scales[0], q, out);  // M == 1
    return;
#else
    TORCH_CHECK(false, "a W8A8 weight in tile order needs the AVX-512 VNNI build of the kernels");
#endif
  }
  w8a8_kernel(codes, scales, M, q, out);
}

// The W8A8 weight w for inputs of width K, checked with `out` (contiguous float32 [M, N]) for the *_into entry
// points (`who` names the caller in the messages).
QuantView w8a8_view_into(const torch::Tensor& w, int64_t K, int64_t M, const torch::Tensor& out, const char* who) {
  const QuantView q = quant_view(w, K);
  TORCH_CHECK(q.kind == QuantKind::kW8A8, who, " takes a W8A8 weight");
  TORCH_CHECK(out.scalar_type() == torch::kFloat32 && out.is_contiguous() && out.dim() == 2 && out.size(0) == M &&
                  out.size(1) == q.N, who, ": out must be contiguous float32 [M, N]");
  return q;
}
}  // namespace

void w8a8_linear_codes_into(const torch::Tensor& codes, const torch::Tensor& scales, const torch::Tensor& w,
                            torch::Tensor& out) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == torch::kInt8 && codes.is_contiguous(),
              "w8a8_linear_codes takes contiguous int8 codes [M, K]");
  TORCH_CHECK(scales.dim() == 1 && scales.size(0) == codes.size(0) && scales.scalar_type() == torch::kFloat32 &&
                  scales.is_contiguous(), "w8a8_linear_codes takes one float32 scale per row");
  const int64_t M = codes.size(0);
  const QuantView q = w8a8_view_into(w, codes.size(1), M, out, "w8a8_linear_codes");
  if (M == 0 || q.N == 0) return;
  w8a8_product(codes.data_ptr<int8_t>(), scales.data_ptr<float>(), M, q, out.data_ptr<float>());
}

torch::Tensor w8a8_linear_codes(const torch::Tensor& codes, const torch::Tensor& scales, const torch::Tensor& w) {
  auto out = torch::empty({codes.size(0), out_features(w, codes.size(1))}, scales.options());
  w8a8_linear_codes_into(codes, scales, w, out);
  return out;
}

void w8a8_linear_into(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& out) {
  TORCH_CHECK(x.dim() == 2, "w8a8_linear_into takes x [M, K]");
  const int64_t M = x.size(0);
  const QuantView q = w8a8_view_into(w, x.size(1), M, out, "w8a8_linear_into");
  if (M == 0 || q.N == 0) return;
  auto qs = quantize_rows(x);
  w8a8_product(qs[0].data_ptr<int8_t>(), qs[1].data_ptr<float>(), M, q, out.data_ptr<float>());
}

bool quant_gelu_mul_fused(int64_t M, const torch::Tensor& w, int64_t K) {
#if defined(QUANT_AMX_INT8)
  if (!is_quantized(w) || !takes_inputs(w, K)) return false;
  const QuantView q = quant_view(w, K);
  if (q.kind == QuantKind::kW8A8) return use_amx_w8a8(M, q);
  return q.kind == QuantKind::kW4A8 && use_amx_w4a8(M, q);
#else
  (void)M, (void)w, (void)K;
  return false;
#endif
}

void quant_gelu_mul_into(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& out) {
  TORCH_CHECK(x.dim() == 2, "quant_gelu_mul_into takes x [M, K]");
  const QuantView q = quant_view(w, x.size(1));
  const int64_t M = x.size(0), I = q.N / 2;
  TORCH_CHECK((q.kind == QuantKind::kW8A8 || q.kind == QuantKind::kW4A8) && q.N % 2 == 0,
              "quant_gelu_mul_into takes a W8A8 or W4A8 gate / up weight [2I, K]");
  TORCH_CHECK(out.scalar_type() == torch::kFloat32 && out.is_contiguous() && out.dim() == 2 && out.size(0) == M &&
                  out.size(1) == I, "quant_gelu_mul_into: out must be contiguous float32 [M, I]");
  if (M == 0 || I == 0) return;
#if defined(QUANT_AMX_INT8)
  if (quant_gelu_mul_fused(M, w, x.size(1))) {
    if (q.kind == QuantKind::kW8A8) {
      auto qs = quantize_rows(x);
      w8a8_amx(qs[0].data_ptr<int8_t>(), qs[1].data_ptr<float>(), M, q, out.data_ptr<float>(), I);
    } else {
      auto qs = quantize_groups(x, q.g);
      w4a8_amx(qs[0].data_ptr<int8_t>(), qs[1].data_ptr<float>(), M, q, out.data_ptr<float>(), I);
    }
    return;
  }
#endif
  const torch::Tensor gu = quant_linear(x, w);  // the two steps: the products, then the activation per row
  const float* g = gu.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) act::gelu_mul(g + m * q.N, g + m * q.N + I, o + m * I, I);
}

torch::Tensor quant_linear(const torch::Tensor& x, const torch::Tensor& w, bool bf16_dot) {
  TORCH_CHECK(x.dim() == 2, "quant_linear takes x [M, K]");
  const QuantView q = quant_view(w, x.size(1));
  const int64_t M = x.size(0);
  auto out = torch::empty({M, q.N}, x.options().dtype(torch::kFloat32));
  if (M == 0 || q.N == 0) return out;
  if (q.kind == QuantKind::kW8A8) {
    w8a8_linear_into(x, w, out);
    return out;
  }
  if (q.kind == QuantKind::kW4A8) {  // exact integer dot products per group at every row count (w4a8_step)
    auto qs = quantize_groups(x, q.g);
#if defined(QUANT_AMX_INT8)
    if (use_amx_w4a8(M, q)) {
      w4a8_amx(qs[0].data_ptr<int8_t>(), qs[1].data_ptr<float>(), M, q, out.data_ptr<float>());
      return out;
    }
#endif
    if (q.tiled) {  // below use_amx_w4a8's rows (AMX), from kVnniW4MinRows rows on VNNI without AMX, else 8 rows a pass
#if defined(QUANT_W4A8_VNNI)
      if (M >= kVnniW4MinRows) {
        w4a8_vnni(qs[0].data_ptr<int8_t>(), qs[1].data_ptr<float>(), qs[2].data_ptr<int32_t>(), M, q, out.data_ptr<float>());
        return out;
      }
#endif
#if defined(QUANT_W4A8_TILED)
      w4a8_tiled_rows(qs[0].data_ptr<int8_t>(), qs[1].data_ptr<float>(), qs[2].data_ptr<int32_t>(), M, q, out.data_ptr<float>());
      return out;
#else
      TORCH_CHECK(false, "a W4A8 weight in tile order needs the AVX2 or the AVX-512 VNNI build of the kernels");
#endif
    }
    w4a8_kernel(qs[0].data_ptr<int8_t>(), qs[1].data_ptr<float>(), qs[2].data_ptr<int32_t>(), M, q, out.data_ptr<float>());
    return out;
  }
  const bool small = q.N * q.K < kQuantSmallWeightElems;  // the row kernel at every row count
#if defined(QUANT_WO_BF16)
  if (bf16_dot && !small && M >= kWoBf16MinRows && q.N % 32 == 0) return wo_bf16_mm(x, q);
#if !defined(QUANT_WO_DOT_OFF)  // -DQUANT_WO_DOT_OFF: the row kernel instead (side-by-side builds)
  // (W4A16's groups: 32, or a multiple of 64 (half a multiple of 32): every size the formats allow)
  if (bf16_dot && !small && M < kWoBf16MinRows &&
      (q.kind == QuantKind::kW4A16 ? q.g == 32 || q.g % 64 == 0 : M >= kW8DotMinRows))
    return wo_dot_rows_mm(x, q);
#endif
#endif
  auto xf = x.to(torch::kFloat32).contiguous();
  if (!small && M > kQuantRowKernelMaxRows) return dequant_mm(xf, q);
  if (q.kind == QuantKind::kW4A16) {
#if defined(QUANT_AVX2_ROWS)
    auto xp = torch::empty_like(xf);
    auto xs = torch::empty({M, q.G}, xf.options());
    w4_permute_x(xf.data_ptr<float>(), M, q, xp.data_ptr<float>(), xs.data_ptr<float>());
    wo_row_kernel<QuantKind::kW4A16>(xp.data_ptr<float>(), xs.data_ptr<float>(), M, q, out.data_ptr<float>());
#else
    wo_row_kernel<QuantKind::kW4A16>(xf.data_ptr<float>(), nullptr, M, q, out.data_ptr<float>());
#endif
  } else {
    wo_row_kernel<QuantKind::kW8A16>(xf.data_ptr<float>(), nullptr, M, q, out.data_ptr<float>());
  }
  return out;
}

std::string quant_w16_prefill_isa() {
#if defined(QUANT_WO_AMX)
  if (cpu_amx::tiles_allowed()) return "amx_bf16";
#endif
#if defined(QUANT_WO_BF16)
  return "avx512_bf16";
#else
  return "";
#endif
}

int64_t quant_bf16_dot_min_rows() {
#if defined(QUANT_WO_BF16)
  return kWoBf16MinRows;
#else
  return 0;
#endif
}

std::string quant_w8a8_prefill_isa() {
#if defined(QUANT_AMX_INT8)
  if (cpu_amx::tiles_allowed()) return "amx_int8";
#endif
#if defined(QUANT_W8A8_VNNI)
  return "avx512_vnni";
#endif
  return "simd";
}

bool w4a8_tile_order_here() {
#if defined(QUANT_W4A8_TILED_AVX2) || defined(QUANT_W4A8_VNNI)
  return true;
#elif defined(QUANT_W4A8_TILED)
  return cpu_amx::tiles_allowed();  // AMX builds: with IMPL_CPU_AMX=0 the row layout's kernels
#else
  return false;
#endif
}

torch::Tensor quant_dequant(const torch::Tensor& w, int64_t K) {
  const QuantView q = quant_view(w, K);
  auto out = torch::empty({q.N, K}, torch::TensorOptions().dtype(torch::kFloat32));
  float* o = out.data_ptr<float>();
  if (!q.tiled) {
    dequant_rows(q, 0, q.N, o);
    return out;
  }
  if (q.kind == QuantKind::kW4A8) {  // code of (row n, input k) at its line and nibble; (q - z) * s as dequant_rows
    for (int64_t n = 0; n < q.N; ++n) {
      const int64_t c = n % 16;
      for (int64_t gi = 0; gi < q.G; ++gi) {
        const uint8_t* codes = w4_tiled_codes(q, n - c, gi);
        const uint8_t* meta = w4_tiled_meta(q, n - c, gi);
        const float s = load_f32(meta + 4 * c), z = load_f32(meta + 128 + 4 * c);
        for (int64_t k = 0; k < q.g; ++k) {
          const uint8_t byte = codes[64 * (k / 8) + 4 * c + k % 4];
          o[n * K + gi * q.g + k] = (static_cast<float>(k % 8 < 4 ? byte & 15 : byte >> 4) - z) * s;
        }
      }
    }
    return out;
  }
  for (int64_t n = 0; n < q.N; ++n) {  // code of (row n, input k) at its tile position; w = q * s as the rows' kernels
    const uint8_t* blk = q.data + (n / 32) * q.B;
    const int64_t t = n % 32, h = t / 16, c = t % 16;
    const float s = load_f32(blk + 32 * K + 4 * t);
    for (int64_t k = 0; k < K; ++k) {
      const int8_t code = static_cast<int8_t>(blk[(2 * (k / 64) + h) * 1024 + 64 * ((k % 64) / 4) + 4 * c + k % 4]);
      o[n * K + k] = static_cast<float>(code) * s;
    }
  }
  return out;
}

torch::Tensor quant_tile_order_(const torch::Tensor& w, int64_t K) {
#if defined(QUANT_W4A8_TILED)
  if (!is_quantized(w) || !takes_inputs(w, K)) return w;
  const QuantView q = quant_view(w, K);
  if (q.tiled || q.N % 32 != 0 || K % 64 != 0 || !w4a8_tile_order_here() || reinterpret_cast<uintptr_t>(q.data) % 64 != 0)
    return w;
  uint8_t* const base = reinterpret_cast<uint8_t*>(w.data_ptr());
  if (q.kind == QuantKind::kW8A8) {
#if !defined(QUANT_W8A8_TILED)
    return w;  // W8A8's tile order is AMX's (its row kernel reads rows at the memory's rate)
#else
    if (!cpu_amx::tiles_allowed()) return w;
    // block j's 32 rows occupy bytes [j B, (j + 1) B) in both layouts (B = 32 (K + 4) = 32 K + 128): each block is
    // copied out and written back in tile order
    const int64_t B = 32 * K + 128;
    for_blocks(q.N / 32, 1, [&](int64_t lo, int64_t hi) {
      avector<uint8_t> rows(static_cast<size_t>(B));
      for (int64_t j = lo; j < hi; ++j) {
        uint8_t* blk = base + j * B;
        std::memcpy(rows.data(), blk, static_cast<size_t>(B));
        for (int h = 0; h < 2; ++h) pack_tile_half(rows.data() + 16 * h * (K + 4), K + 4, K, reinterpret_cast<int8_t*>(blk) + h * 1024);
        for (int64_t r = 0; r < 32; ++r) std::memcpy(blk + 32 * K + 4 * r, rows.data() + r * (K + 4) + K, 4);
      }
    });
    return w.view({q.N / 32, 1, B});
#endif
  }
  if (q.kind != QuantKind::kW4A8 || q.g % 64 != 0) return w;
  // the tiles take q - z as signed bytes: every zero point an integer 0..15 (impl.quant.pack writes no other), or the
  // weight keeps its row layout (whose kernels take any)
  const int64_t G = q.G, g = q.g, half = g / 2, rowB = G * q.B, Bt = 16 * g + 256;
  for (int64_t n = 0; n < q.N; ++n)
    for (int64_t gi = 0; gi < G; ++gi) {
      const float z = load_f32(base + n * rowB + gi * q.B + half + 4);
      if (!(z >= 0.f && z <= 15.f && z == std::nearbyint(z))) return w;
    }
  // block j's 32 rows occupy bytes [j 32 rowB, (j + 1) 32 rowB) in both layouts (32 rowB = G Bt): each block is
  // copied out and written back group by group
  for_blocks(q.N / 32, 1, [&](int64_t lo, int64_t hi) {
    avector<uint8_t> rows(static_cast<size_t>(32 * rowB));
    auto code = [&](int64_t r, int64_t gi, int64_t k) -> uint8_t {  // row r's code k of group gi (row layout)
      const uint8_t b = rows[r * rowB + gi * q.B + (k < half ? k : k - half)];
      return k < half ? b & 15 : b >> 4;
    };
    for (int64_t j = lo; j < hi; ++j) {
      uint8_t* blk = base + j * 32 * rowB;
      std::memcpy(rows.data(), blk, static_cast<size_t>(32 * rowB));
      for (int64_t gi = 0; gi < G; ++gi) {
        uint8_t* dst = blk + gi * Bt;
        for (int64_t r = 0; r < 32; ++r) {
          const int64_t h = r / 16, c = r % 16;
          for (int64_t l = 0; l < g / 8; ++l)
            for (int64_t i = 0; i < 4; ++i)
              dst[h * 8 * g + 64 * l + 4 * c + i] = static_cast<uint8_t>(code(r, gi, 8 * l + i) | code(r, gi, 8 * l + 4 + i) << 4);
          std::memcpy(dst + 16 * g + 4 * r, rows.data() + r * rowB + gi * q.B + half, 4);
          std::memcpy(dst + 16 * g + 128 + 4 * r, rows.data() + r * rowB + gi * q.B + half + 4, 4);
        }
      }
    }
  });
  return w.view({q.N / 32, G, Bt});
#else
  (void)K;
  return w;
#endif
}

}  // namespace cpu_fused
