// A standalone AMX-bf16 GEMM probe (not part of the engine): how fast a plain 2 x 2-tile kernel multiplies
// E2B's prefill shapes on this CPU, beside oneDNN's rate for the same shape (bench/investigations/onednn_rate.py).
// Kept for issue 33's remaining lever (the bf16 GEMM rate of the prefill): the next kernel starts from here.
//
//   g++ -O3 -march=sapphirerapids -fopenmp bench/investigations/amx_bf16_gemm.cpp -o /tmp/amx_gemm
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close /tmp/amx_gemm M K N MS [--peak]
//
// out [M, N] (bf16) = x [M, K] (bf16) @ W [N, K]^T. W is packed once into the tiles' pair layout, per 32-column
// panel and 32-deep k-step: P[p][ks][h][r][c * 2 + i] = W[32p + 16h + c][32ks + 2r + i]. x is copied per call
// into tile order (each 16 x 32 A tile 1 KB contiguous). Each thread takes a range of panels; the rows go in
// superblocks of MS rows (MS x K x 2 bytes held in L2 across the panels: MS = 256 at K = 1536), each 32-row
// block accumulating 2 x 2 C tiles over all of K, stored to an L1 buffer and converted to bf16 per panel.
//
// What it showed on a 2-core Sapphire Rapids-class VM (2026-12-04): --peak (2 x 2 tiles, loads from L1)
// 3.8 TFLOP/s per core (another VM that evening: bf16 3.1 TFLOP/s, int8 6.2 TOP/s); A from L2 and B from L1 3.2; both from L2 2.5; A beyond L2 1.1. The GEMM at M 1024,
// K 1536, N 12288: 2.6-2.75 TFLOP/s on two cores against oneDNN's 2.8-3.1 in the same hour (0.88-1.02x of it
// alternating later). Every buffer the tiles load must be 64-byte aligned: with malloc's 16-byte alignment the
// same kernel ran at 0.9.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using bf16 = uint16_t;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void config_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<bf16>(u >> 16);
}

float to_f32(bf16 b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T>
T* aligned(size_t n) {
  return static_cast<T*>(std::aligned_alloc(4096, (n * sizeof(T) + 4095) / 4096 * 4096));
}

void pack_weight(const bf16* W, int N, int K, bf16* P) {
  const int KS = K / 32;
  for (int p = 0; p < N / 32; ++p)
    for (int ks = 0; ks < KS; ++ks)
      for (int h = 0; h < 2; ++h) {
        bf16* d = P + ((static_cast<size_t>(p) * KS + ks) * 2 + h) * 512;
        for (int r = 0; r < 16; ++r)
          for (int c = 0; c < 16; ++c)
            for (int i = 0; i < 2; ++i) d[r * 32 + c * 2 + i] = W[static_cast<size_t>(32 * p + 16 * h + c) * K + 32 * ks + 2 * r + i];
      }
}

void gemm(const bf16* x, int M, int K, const bf16* P, int N, bf16* out, bf16* xt, int MS) {
  const int NP = N / 32, KS = K / 32;
#pragma omp parallel for
  for (int mb = 0; mb < M / 32; ++mb)  // x in tile order: xt[mb][ks][32 rows][32]
    for (int ks = 0; ks < KS; ++ks)
      for (int r = 0; r < 32; ++r)
        std::memcpy(xt + ((static_cast<size_t>(mb) * KS + ks) * 32 + r) * 32, x + static_cast<size_t>(mb * 32 + r) * K + ks * 32, 64);
#pragma omp parallel
  {
    config_tiles();
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int p0 = static_cast<long>(NP) * t / nt, p1 = static_cast<long>(NP) * (t + 1) / nt;
    alignas(64) static thread_local float cbuf[1024 * 32];
    for (int ms = 0; ms < M; ms += MS) {
      const int me = std::min(M, ms + MS);
      for (int p = p0; p < p1; ++p) {
        const bf16* bp = P + static_cast<size_t>(p) * KS * 1024;
        for (int mb = ms; mb < me; mb += 32) {
          float* c = cbuf + (mb - ms) * 32;
          const bf16* a = xt + static_cast<size_t>(mb) * K;
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          for (int ks = 0; ks < KS; ++ks) {
            _tile_loadd(4, a + ks * 1024, 64);
            _tile_loadd(5, a + ks * 1024 + 512, 64);
            _tile_loadd(6, bp + ks * 1024, 64);
            _tile_loadd(7, bp + ks * 1024 + 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
          _tile_stored(0, c, 128);
          _tile_stored(1, c + 16, 128);
          _tile_stored(2, c + 512, 128);
          _tile_stored(3, c + 528, 128);
        }
        for (int m = ms; m < me; ++m) {
          const float* c = cbuf + (m - ms) * 32;
          _mm512_storeu_si512(out + static_cast<size_t>(m) * N + p * 32,
                              (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(c + 16), _mm512_load_ps(c)));
        }
      }
    }
    _tile_release();
  }
}

// 2 x 2 tiles, A and B from L1: the TMUL's own rate on one core, bf16 (TDPBF16PS: 16 x 16 x 32 multiply-adds per
// instruction) or int8 (TDPBSSD: 16 x 16 x 64).
template <bool Int8>
void peak() {
  config_tiles();
  alignas(64) static uint8_t a[2048], b[2048];
  const long iters = 2000000;
  const auto t0 = std::chrono::steady_clock::now();
  _tile_zero(0);  // tile numbers are immediates
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long i = 0; i < iters; ++i) {
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a + 1024, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + 1024, 64);
    if constexpr (Int8) {
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    } else {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("peak %s (one core, tiles from L1): %.2f %s\n", Int8 ? "int8" : "bf16",
              iters * 4 * 16.0 * 16 * (Int8 ? 64 : 32) * 2 / dt / 1e12, Int8 ? "TOP/s" : "TFLOP/s");
  _tile_release();
}

}  // namespace

int main(int argc, char** argv) {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) {
    std::puts("no AMX tiles on this CPU / kernel");
    return 1;
  }
  if (argc > 1 && std::strcmp(argv[1], "--peak") == 0) {
    peak<false>();
    peak<true>();
    return 0;
  }
  if (argc < 5) {
    std::puts("usage: amx_gemm M K N MS | --peak  (M, MS multiples of 32, at most 1024; K, N multiples of 32)");
    return 2;
  }
  const int M = std::atoi(argv[1]), K = std::atoi(argv[2]), N = std::atoi(argv[3]), MS = std::atoi(argv[4]);
  if (M % 32 || K % 32 || N % 32 || MS % 32 || MS > 1024 || MS <= 0) {
    std::puts("M, K, N, MS must be multiples of 32 and MS at most 1024");
    return 2;
  }
  std::vector<bf16> x(static_cast<size_t>(M) * K), W(static_cast<size_t>(N) * K);
  std::srand(1);
  for (auto& v : x) v = to_bf16((std::rand() % 2001 - 1000) / 1000.f);
  for (auto& v : W) v = to_bf16((std::rand() % 2001 - 1000) / 1000.f);
  bf16* P = aligned<bf16>(W.size());
  bf16* out = aligned<bf16>(static_cast<size_t>(M) * N);
  bf16* xt = aligned<bf16>(x.size());
  pack_weight(W.data(), N, K, P);
  gemm(x.data(), M, K, P, N, out, xt, MS);
  double worst = 0;  // against a float64 dot product of the same bf16 inputs, relative to the output's size
  for (int t = 0; t < 64; ++t) {
    const int m = std::rand() % M, n = std::rand() % N;
    double s = 0;
    for (int k = 0; k < K; ++k) s += static_cast<double>(to_f32(x[static_cast<size_t>(m) * K + k])) * to_f32(W[static_cast<size_t>(n) * K + k]);
    worst = std::max(worst, std::fabs(s - to_f32(out[static_cast<size_t>(m) * N + n])) / (std::fabs(s) + 1));
  }
  double best = 1e9;
  for (int it = 0; it < 10; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm(x.data(), M, K, P, N, out, xt, MS);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("M %d K %d N %d MS %d: %.2f ms, %.2f TFLOP/s (largest relative error %.2g)\n", M, K, N, MS, best * 1e3,
              2.0 * M * K * N / best / 1e12, worst);
  return worst < 1e-2 ? 0 : 1;
}
