// bf16 weights prepacked for oneDNN's matmul, read in place by bf16 dot products for decode-size row counts.
//
// The packed plan reorders every large bf16 weight once into oneDNN's blocked layout (linear.py: pack): its
// matmul then runs prefill at the CPU's bf16 rate with no per-call reorder, but its kernel for 1 to 16 rows read
// the weights at 15-20 GB/s on a Zen 4 core pair (half the copy bandwidth). This kernel reads the same bytes as
// they lie, so one copy of each weight serves both: oneDNN above kBf16RowKernelMaxRows rows, this at or below.
//
// The layout, as oneDNN's bf16 reorder for PACK_BATCH_HINT rows lays out a weight [N, K] on AVX-512 BF16:
//   [N / NB][K / 2][NB][2]   (NB = 64: blocks of 64 outputs; in each, K's pairs in order, 64 outputs' pairs apiece)
// which is VDPBF16PS's operand as it stands: one 64-byte load holds 16 outputs' pair (k, k + 1), multiplied by
// x's pair broadcast to the 16 lanes. Nothing here assumes the layout: packed_dot_layout compares a packed weight
// with its plain source element by element for each candidate NB and records the shape's NB only when every
// element matches (0 otherwise: oneDNN keeps that shape at every row count), so another oneDNN version or CPU
// that lays weights out differently only loses the fast path.
//
// Each output is one float32 lane accumulated over K's pairs in order (kept in `out` between K chunks: a float32
// store and load, exact), whatever the row count: a row's results do not depend on the rows beside it.

#include "linear.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace cpu_fused {
namespace {

// The packed tensor's bytes (oneDNN's own buffer) and their count, through the ops torch registers for them.
const uint16_t* packed_data(const torch::Tensor& w) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::data_ptr", "").typed<int64_t(const at::Tensor&)>();
  return reinterpret_cast<const uint16_t*>(op.call(w));
}

int64_t packed_nbytes(const torch::Tensor& w) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_nbytes", "").typed<int64_t(const at::Tensor&)>();
  return op.call(w);
}

// (N, K) -> NB of the bf16 packed weights of that shape (0: not this layout). A layout is a function of the shape
// in one process (the same reorder, hint and CPU); a weight of a recorded shape that was not compared is read the
// same way.
std::mutex layouts_mutex;
std::map<std::pair<int64_t, int64_t>, int64_t> layouts;

bool is_packed_bf16(const torch::Tensor& w) {
  return w.is_mkldnn() && w.scalar_type() == torch::kBFloat16 && w.dim() == 2;
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define PACKED_DOT 1

// x rows per pass: MT x J accumulators, J weight vectors and x's broadcast pair in the 32 zmm registers
template <int J>
constexpr int kPassRows = J == 4 ? 6 : 8;
// K pairs per chunk when a block's weights are read by more than one pass (rows > kPassRows): 64 outputs x 512
// pairs = 128 KB of weights, read from memory by the first pass and from L2 by the next
constexpr int64_t kChunkPairs = 512;

// out[m, b NB + 16 j + l] (+)= sum over pairs p in [p0, p1) of w_b[p][16 j + l] . x[m][p], for MT rows of x (bf16,
// ldx apart) and B blocks of NB = 16 J outputs side by side (w: the first block's [K / 2][NB][2] values, the next
// `bstride` further on): B streams of weights in flight for few rows
template <int MT, int J, int B>
inline void pass(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t bstride, int64_t p0, int64_t p1,
                 float* out, int64_t ldo) {
  constexpr int NB = 16 * J;
  __m512 acc[MT][B][J];
  for (int m = 0; m < MT; ++m)
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < J; ++j)
        acc[m][b][j] = p0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(out + m * ldo + b * NB + 16 * j);
  const uint16_t* wp = w + p0 * NB * 2;
  for (int64_t p = p0; p < p1; ++p, wp += NB * 2) {
    __m512bh wv[B][J];
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < J; ++j) wv[b][j] = (__m512bh)_mm512_loadu_si512(wp + b * bstride + 32 * j);
    for (int m = 0; m < MT; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * ldx + 2 * p, sizeof(pair));
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int b = 0; b < B; ++b)
        for (int j = 0; j < J; ++j) acc[m][b][j] = _mm512_dpbf16_ps(acc[m][b][j], wv[b][j], xv);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < J; ++j) _mm512_storeu_ps(out + m * ldo + b * NB + 16 * j, acc[m][b][j]);
}

// out [M, N] = x [M, K] bf16 @ w^T, w packed [N / NB][K / 2][NB][2]; threads take whole blocks of NB outputs
template <int J>
void packed_rows(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, float* out) {
  constexpr int NB = 16 * J, MR = kPassRows<J>;
  const int64_t pairs = K / 2, blocks = N / NB, bstride = pairs * NB * 2;
  const int64_t chunk = M <= MR ? pairs : kChunkPairs;
  // one x row: four blocks a pass, two rows: two (more streams of weights in flight: at one row, 184 MB of E2B's
  // shapes on Zen 4, medians of 12 alternated calls: one block 13.4 ms, two 13.0, four 12.0 against the plain
  // weights' dot products' 11.3; software prefetches added nothing measurable)
  const int64_t B = M == 1 && blocks % 4 == 0 ? 4 : M <= 2 && blocks % 2 == 0 ? 2 : 1;
  at::parallel_for(0, blocks / B, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g) {
      const uint16_t* wb = w + g * B * bstride;
      float* ob = out + g * B * NB;
      if (B == 4) {
        pass<1, J, 4>(x, K, wb, bstride, 0, pairs, ob, N);
        continue;
      }
      if (B == 2) {
        if (M == 1) pass<1, J, 2>(x, K, wb, bstride, 0, pairs, ob, N);
        else pass<2, J, 2>(x, K, wb, bstride, 0, pairs, ob, N);
        continue;
      }
      for (int64_t p0 = 0; p0 < pairs; p0 += chunk) {
        const int64_t p1 = std::min(pairs, p0 + chunk);
        for (int64_t m0 = 0; m0 < M; m0 += MR)
          with_rows<MR>(std::min<int64_t>(MR, M - m0), [&](auto mt) {
            pass<decltype(mt)::value, J, 1>(x + m0 * K, K, wb, bstride, p0, p1, ob + m0 * N, N);
          });
      }
    }
  });
}
#endif

// True when `packed` holds `plain` [N, K] in the layout [N / NB][K / 2][NB][2], element for element.
bool matches(const uint16_t* plain, const uint16_t* packed, int64_t N, int64_t K, int64_t NB) {
  const int64_t pairs = K / 2;
  std::atomic<bool> same{true};
  at::parallel_for(0, N / NB, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi && same.load(std::memory_order_relaxed); ++b) {
      const uint16_t* pb = packed + b * pairs * NB * 2;
      for (int64_t p = 0; p < pairs; ++p)
        for (int64_t n = 0; n < NB; ++n) {
          const uint16_t* src = plain + (b * NB + n) * K + 2 * p;
          const uint16_t* dst = pb + (p * NB + n) * 2;
          if (src[0] != dst[0] || src[1] != dst[1]) {
            same.store(false, std::memory_order_relaxed);
            return;
          }
        }
    }
  });
  return same.load();
}

}  // namespace

int64_t packed_dot_layout(const torch::Tensor& plain, const torch::Tensor& packed) {
  TORCH_CHECK(plain.scalar_type() == torch::kBFloat16 && plain.dim() == 2 && plain.is_contiguous() && !plain.is_mkldnn(),
              "packed_dot_layout compares a packed weight with its plain source: a contiguous bfloat16 [N, K] tensor");
  TORCH_CHECK(is_packed_bf16(packed) && packed.sizes() == plain.sizes(),
              "packed_dot_layout takes the oneDNN-packed (mkldnn) bfloat16 copy of `plain`, the same sizes");
  const int64_t N = plain.size(0), K = plain.size(1);
  int64_t found = 0;
#if defined(PACKED_DOT)
  const auto* src = reinterpret_cast<const uint16_t*>(plain.data_ptr<at::BFloat16>());
  if (N > 0 && K > 0 && K % 2 == 0 && packed_nbytes(packed) == N * K * 2) {
    const uint16_t* dst = packed_data(packed);
    for (int64_t nb : {64, 32, 16})
      if (N % nb == 0 && matches(src, dst, N, K, nb)) {
        found = nb;
        break;
      }
  }
#endif
  std::lock_guard<std::mutex> lock(layouts_mutex);
  auto [it, fresh] = layouts.emplace(std::make_pair(N, K), found);
  if (!fresh && it->second != found) it->second = 0;  // two weights of one shape disagree: neither is read here
  return it->second;
}

int64_t packed_dot_block(const torch::Tensor& w) {
  if (!is_packed_bf16(w)) return 0;
  std::lock_guard<std::mutex> lock(layouts_mutex);
  auto it = layouts.find(std::make_pair(w.size(0), w.size(1)));
  return it == layouts.end() ? 0 : it->second;
}

torch::Tensor packed_dot_rows(const torch::Tensor& x, const torch::Tensor& w) {
  const int64_t nb = packed_dot_block(w);
  TORCH_CHECK(nb > 0, "packed_dot_rows reads a oneDNN-packed bfloat16 weight whose layout packed_dot_layout recorded");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.size(1), "x must be [M, K] for a weight [N, K]");
#if defined(PACKED_DOT)
  auto xb = x.to(torch::kBFloat16).contiguous();
  const int64_t M = xb.size(0), K = xb.size(1), N = w.size(0);
  auto out = torch::empty({M, N}, x.options().dtype(torch::kFloat32));
  if (M == 0) return out;
  const auto* xv = reinterpret_cast<const uint16_t*>(xb.data_ptr<at::BFloat16>());
  const uint16_t* wv = packed_data(w);
  float* o = out.data_ptr<float>();
  if (nb == 64) packed_rows<4>(xv, M, K, wv, N, o);
  else if (nb == 32) packed_rows<2>(xv, M, K, wv, N, o);
  else packed_rows<1>(xv, M, K, wv, N, o);
  return out;
#else
  TORCH_CHECK(false, "packed_dot_rows needs an AVX-512 BF16 build");
#endif
}

}  // namespace cpu_fused
