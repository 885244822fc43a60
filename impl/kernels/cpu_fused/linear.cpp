// The linear layers of the fused CPU kernels (see linear.h; impl/kernels/cpu_fused/linear.py plans them).
//
// bfloat16 weights never reach a bf16 matmul of ATen on a CPU without native bf16 arithmetic (0.3 GFLOP/s
// on an AVX2-only Zen 3). They are read as bf16 and multiplied in float32:
//  * up to kBf16RowKernelMaxRows rows (decode), by the row kernel below: each weight row is streamed
//    from memory once per call and widened to float32 in registers (a bf16 value is the top half of a
//    float32), so a call costs the bytes of the weight, half of a float32 weight's;
//  * more rows (prefill), by a GEMM: oneDNN's bf16 matmul on a CPU with native bf16 (`onednn`), else
//    blocks of weight rows widened to float32 (a block of ~2 MB, converted once per call) for ATen's mm.
// The row kernel accumulates every output element in the same order whatever the row count, so its
// results for a row do not depend on the other rows of the call (weights under the planner's oneDNN
// size take it for every row count: the tiny test checkpoints are row-invariant in bf16; small float32
// weights take the same kernel reading float32, so they are in float32 too). From a few rows a small weight
// takes column_kernel instead: the same sums, bit for bit, with the outputs in the vector lanes.

#include "linear.h"
#include "quant_linear.h"
#include "simd.h"
#include "../cpu_aligned.h"
#include "../cpu_isa.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace cpu_fused {
namespace {

using namespace simd;
using cpu_mem::avector;

// A weight element in float32: bf16 (uint16_t bits, widened exactly) or float32.
inline vfloat wload(const uint16_t* p) { return vload_bf16(p); }
inline vfloat wload(const float* p) { return vload(p); }
inline float wvalue(uint16_t b) { return bf16_to_f32(b); }
inline float wvalue(float v) { return v; }

// out[m, n] for R weight rows (w, K apart) and MT rows of x (ldx apart): one accumulator vector per
// (row, x row) over K in steps of kVec, then its lanes summed, then the K tail. The order of every
// sum is fixed by K alone.
// pf > 0: also ask for the weight elements pf ahead of the ones read into L2, a line at a time as the loop
// reaches it (decode: the rows kPrefetchRows ahead, linear.h).
template <int R, int MT, typename W>
inline void row_tile(const float* x, int64_t ldx, const W* w, int64_t K, float* out, int64_t ldo, int64_t pf = 0) {
  constexpr int64_t kLine = 64 / sizeof(W);  // weight elements per cache line
  vfloat acc[R][MT];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) acc[r][m] = vfloat{};
  int64_t k = 0;
  for (; k + kVec <= K; k += kVec) {
    if (pf && k % kLine == 0)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(w + r * K + k + pf), _MM_HINT_T1);
    vfloat wv[R];
    for (int r = 0; r < R; ++r) wv[r] = wload(w + r * K + k);
    for (int m = 0; m < MT; ++m) {
      const vfloat xv = vload(x + m * ldx + k);
      for (int r = 0; r < R; ++r) acc[r][m] = vfma(wv[r], xv, acc[r][m]);
    }
  }
  for (int m = 0; m < MT; ++m) {
    for (int r = 0; r < R; ++r) {
      float s = hsum(acc[r][m]);
      for (int64_t kk = k; kk < K; ++kk) s += wvalue(w[r * K + kk]) * x[m * ldx + kk];
      out[m * ldo + r] = s;
    }
  }
}

// Weight rows [n0, n0 + R) against every row of x, in tiles of up to kMaxTile x rows.
#if defined(__AVX512F__)
constexpr int kRows = 4, kMaxTile = 4;  // 16 accumulators + 4 weight vectors of the 32 zmm registers
#else
constexpr int kRows = 4, kMaxTile = 2;  // 8 accumulators + 4 weight vectors of the 16 ymm registers
#endif

// pf: as row_tile's, for the first tile of x rows only (the later ones find the weights in cache).
template <int R, typename W>
inline void row_block(const float* x, int64_t M, int64_t K, const W* w, float* out, int64_t N, int64_t pf = 0) {
  int64_t m = 0;
  for (; m + kMaxTile <= M; m += kMaxTile, pf = 0) row_tile<R, kMaxTile>(x + m * K, K, w, K, out + m * N, N, pf);
  switch (M - m) {  // the x-row tail as a compile-time tile (same per-element order)
    case 3: row_tile<R, 3>(x + m * K, K, w, K, out + m * N, N, pf); break;
    case 2: row_tile<R, 2>(x + m * K, K, w, K, out + m * N, N, pf); break;
    case 1: row_tile<R, 1>(x + m * K, K, w, K, out + m * N, N, pf); break;
    default: break;
  }
}

// x rows from which a small weight takes column_kernel (fewer: transposing the weight costs more than it saves)
constexpr int64_t kColumnMinRows = 4;
// x rows per thread's share in column_kernel
constexpr int64_t kColumnRowGrain = 32;

// out [M, N] = x [M, K] (float32, contiguous) @ w [N, K]^T (bf16 bits or float32, contiguous).
template <typename W>
void row_kernel(const float* x, int64_t M, int64_t K, const W* w, int64_t N, float* out) {
  const int64_t blocks = N / kRows;
  // A grain of whole weight rows: each thread streams one contiguous part of the weight.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, K * kRows));
  auto body = [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const bool ahead = M <= kMaxTile && (b + 1) * kRows + kPrefetchRows <= N;
      row_block<kRows>(x, M, K, w + b * kRows * K, out + b * kRows, N, ahead ? kPrefetchRows * K : 0);
    }
  };
  if (at::get_num_threads() == 1 || blocks <= grain) {
    body(0, blocks);
  } else {
    at::parallel_for(0, blocks, grain, body);
  }
  for (int64_t n = blocks * kRows; n < N; ++n) row_block<1>(x, M, K, w + n * K, out + n, N);
}

// out [M, N] = x [M, K] @ w [N, K]^T for a small weight (it stays in L1 / L2) and several rows, kVec outputs of
// one x row at a time, each the row kernel's sum bit for bit: lane l of row_tile's accumulator is the FMA chain
// over k = l, l + kVec, ... below K's last whole vector (from +0), here one vector of kVec outputs per lane l;
// hsum adds the lanes in order into +0, as here the kVec vectors; then the K tail's products one at a time. No
// reduction across lanes is left (the row kernel spent most of a small-K call there: a 16-wide per-layer-input
// projection ran at 6 GFLOP/s), and a thread's rows write whole output rows.
template <typename W>
void column_kernel(const float* x, int64_t M, int64_t K, const W* w, int64_t N, float* out) {
  const int64_t kv = K / kVec * kVec, nv = N / kVec * kVec;
  // [nv / kVec, K, kVec]: the weight transposed (float32, exact), a block of kVec outputs' columns contiguous
  avector<float> wt(static_cast<size_t>(K * nv));
  for (int64_t n = 0; n < nv; ++n)
    for (int64_t k = 0; k < K; ++k) wt[(n / kVec * K + k) * kVec + n % kVec] = wvalue(w[n * K + k]);
  // rows [lo, hi) of x, a block of outputs at a time (its columns stay in L1 while the rows pass)
  auto rows = [&](int64_t lo, int64_t hi) {
    for (int64_t n0 = 0; n0 < nv; n0 += kVec) {
      const float* wb = wt.data() + n0 * K;
      for (int64_t m = lo; m < hi; ++m) {
        const float* xr = x + m * K;
        vfloat lane[kVec];
        for (int l = 0; l < kVec; ++l) lane[l] = vfloat{};
        for (int64_t k0 = 0; k0 < kv; k0 += kVec)
          for (int l = 0; l < kVec; ++l) lane[l] = vfma(vbroadcast(xr[k0 + l]), vload(wb + (k0 + l) * kVec), lane[l]);
        vfloat s = vfloat{};
        for (int l = 0; l < kVec; ++l) s = s + lane[l];
        for (int64_t k = kv; k < K; ++k) s = s + vload(wb + k * kVec) * vbroadcast(xr[k]);
        vstore(out + m * N + n0, s);
      }
    }
    for (int64_t n = nv; n < N; ++n) row_block<1>(x + lo * K, hi - lo, K, w + n * K, out + lo * N + n, N);
  };
  if (at::get_num_threads() == 1 || M <= kColumnRowGrain) rows(0, M);
  else at::parallel_for(0, M, kColumnRowGrain, rows);
}

// Rows [n0, n0 + nb) of a bf16 weight [N, K] widened into dst [nb, K] float32.
void widen_rows(const uint16_t* w, int64_t K, int64_t n0, int64_t nb, float* dst) {
  const int64_t total = nb * K;
  const uint16_t* src = w + n0 * K;
  auto body = [&](int64_t lo, int64_t hi) {
    int64_t i = lo;
    for (; i + kVec <= hi; i += kVec) *reinterpret_cast<vfloat_u*>(dst + i) = vload_bf16(src + i);
    for (; i < hi; ++i) dst[i] = bf16_to_f32(src[i]);
  };
  if (at::get_num_threads() == 1 || total < (int64_t{1} << 18)) {
    body(0, total);
  } else {
    at::parallel_for(0, total, int64_t{1} << 16, body);
  }
}

// Bytes of float32 weight rows converted at a time for ATen's mm (cache-sized; a 1536-wide weight: 340 rows).
constexpr int64_t kWidenBlockBytes = int64_t{2} << 20;

// out [M, N] = x @ w^T through ATen's mm on blocks of w widened to float32 (each block once per call).
torch::Tensor widened_mm(const torch::Tensor& x, const torch::Tensor& w) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto out = torch::empty({M, N}, x.options().dtype(torch::kFloat32));
  int64_t nb = std::max<int64_t>(16, kWidenBlockBytes / (K * 4)) / 16 * 16;
  nb = std::min(nb, N);
  auto buf = torch::empty({nb, K}, out.options());
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t rows = std::min(nb, N - n0);
    auto blk = buf.narrow(0, 0, rows);
    widen_rows(wp, K, n0, rows, blk.data_ptr<float>());
    auto dst = out.narrow(1, n0, rows);  // a column block: leading dimension N (BLAS writes it in place)
    torch::mm_out(dst, x, blk.t());
  }
  return out;
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define BF16_DOT_ROWS 1
// ---- bf16 weights, decode-size row counts, in bf16 dot products (AVX-512 BF16) ----
// The row kernel above widens every weight element to float32 and spends an FMA per 16 of them and x row: from 4
// rows it is bound by that arithmetic, not by the bytes (Zen 4, 12 E2B-shaped weights, 208 MB: 6.9 ms at 4 rows
// against 5.7 at 1, 16.3 at 8). oneDNN's prepacked bf16 matmul, the packed plan's kernel at every row count, takes
// ~10 ms for 1 to 8 rows there (about 20 GB/s at 1 row: its small-row kernel is not bound by the bytes either). Here
// (a bf16 model on a CPU with native bf16, the `onednn` argument: x rounded to bf16 as oneDNN's matmul rounds it)
// VDPBF16PS multiplies 32 weights by 32 of x's bf16 values as they lie in their rows into 16 float32 lanes: one
// instruction per 64 bytes of weights and x row. Each (weight row, x row) pair has one accumulator over K in
// order, its lanes summed last, whatever the pass's shape: a row's result does not depend on the rows beside it.
// Weight rows per pass: 8 for one x row, 4 for two, 2 up to kDotPassRows (8 to 16 independent sums in flight).
constexpr int kDotPassRows = 8;

template <int P, int MT>
inline void dot_tile(const uint16_t* x, int64_t K, const uint16_t* w, float* out, int64_t N, int64_t pf) {
  __m512 acc[P][MT];
  for (auto& a : acc)
    for (auto& v : a) v = _mm512_setzero_ps();
  const int64_t kv = K / 32 * 32;
  for (int64_t k = 0; k < kv; k += 32) {
    if (pf)
      for (int r = 0; r < P; ++r) _mm_prefetch(reinterpret_cast<const char*>(w + r * K + k + pf), _MM_HINT_T1);
    __m512bh wv[P];
    for (int r = 0; r < P; ++r) wv[r] = (__m512bh)_mm512_loadu_si512(w + r * K + k);
    for (int m = 0; m < MT; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * K + k);
      for (int r = 0; r < P; ++r) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], wv[r], xv);
    }
  }
  if (kv < K) {  // the last K % 32 inputs, the rest of the lanes zeros
    const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (K - kv)) - 1);
    __m512bh wv[P];
    for (int r = 0; r < P; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + r * K + kv);
    for (int m = 0; m < MT; ++m) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * K + kv);
      for (int r = 0; r < P; ++r) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], wv[r], xv);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < P; ++r) out[m * N + r] = _mm512_reduce_add_ps(acc[r][m]);
}

// out [MT, N] (ldo N) = x [MT, K] bf16 @ w [N, K]^T bf16
template <int MT>
void dot_rows(const uint16_t* x, int64_t K, const uint16_t* w, int64_t N, float* out) {
  constexpr int P = MT == 1 ? 8 : (MT == 2 ? 4 : 2);
  const int64_t blocks = N / P;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, K * P));
  auto body = [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const bool ahead = (b + 1) * P + kPrefetchRows <= N;  // the rows kPrefetchRows ahead, a line per step
      dot_tile<P, MT>(x, K, w + b * P * K, out + b * P, N, ahead ? kPrefetchRows * K : 0);
    }
  };
  if (at::get_num_threads() == 1 || blocks <= grain) body(0, blocks);
  else at::parallel_for(0, blocks, grain, body);
  for (int64_t n = blocks * P; n < N; ++n) dot_tile<1, MT>(x, K, w + n * K, out + n, N, 0);
}

#endif

}  // namespace

torch::Tensor bf16_dot_rows(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.dim() == 2 && w.is_contiguous() && w.device().is_cpu(),
              "the bf16 dot-product row kernel takes a contiguous bfloat16 [N, K] CPU weight");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.size(1), "x must be [M, K] for a weight [N, K]");
#if defined(BF16_DOT_ROWS)
  auto xb = x.to(torch::kBFloat16).contiguous();
  const int64_t M = xb.size(0), K = xb.size(1), N = w.size(0);
  auto out = torch::empty({M, N}, x.options().dtype(torch::kFloat32));
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();
  const auto* xv = reinterpret_cast<const uint16_t*>(xb.data_ptr<at::BFloat16>());
  const auto* wv = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  for (int64_t m0 = 0; m0 < M; m0 += kDotPassRows)
    with_rows<kDotPassRows>(std::min<int64_t>(kDotPassRows, M - m0), [&](auto mt) {
      dot_rows<decltype(mt)::value>(xv + m0 * K, K, wv, N, out.data_ptr<float>() + m0 * N);
    });
  return out;
#else
  TORCH_CHECK(false, "the bf16 dot-product row kernel needs an AVX-512 BF16 build (bf16_dot_rows_here())");
#endif
}

bool bf16_dot_rows_here() {
#if defined(BF16_DOT_ROWS)
  return true;
#else
  return false;
#endif
}

torch::Tensor onednn_linear(const torch::Tensor& x, const torch::Tensor& w, c10::string_view attr,
                            c10::string_view algo) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                         c10::string_view, c10::List<std::optional<at::Scalar>>,
                                         std::optional<c10::string_view>)>();
  return op.call(x, w, std::nullopt, attr, c10::List<std::optional<at::Scalar>>(), algo);
}

// Weights under this many elements (the planner's MIN_WEIGHT_ELEMS) take the row kernel at every row count.
constexpr int64_t kSmallWeightElems = int64_t{1} << 16;

bool runs_onednn(const torch::Tensor& w, int64_t rows, bool onednn) {
  // a packed bf16 weight: oneDNN, but for the bf16 dot products on its layout at decode-size row counts (`onednn`)
  if (w.is_mkldnn()) return !(onednn && rows <= kBf16RowKernelMaxRows && packed_dot_block(w) > 0);
  if (is_quantized(w)) return false;
  if (!onednn) return false;
  if (w.scalar_type() != torch::kBFloat16) return w.numel() >= kSmallWeightElems;  // small float32: the row kernel
  return rows > kBf16RowKernelMaxRows && w.numel() >= kSmallWeightElems;
}

// A weight under oneDNN's size floor meets x rows: column_kernel from kColumnMinRows rows, else the row kernel.
static bool takes_columns(int64_t M, int64_t N, int64_t K) { return M >= kColumnMinRows && N * K < kSmallWeightElems; }

torch::Tensor bf16_rows(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.dim() == 2 && w.is_contiguous() && w.device().is_cpu(),
              "the bf16 row kernel takes a contiguous bfloat16 [N, K] CPU weight");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.size(1), "x must be [M, K] for a weight [N, K]");
  auto xf = x.to(torch::kFloat32).contiguous();
  const int64_t M = xf.size(0), K = xf.size(1), N = w.size(0);
  auto out = torch::empty({M, N}, xf.options());
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  if (takes_columns(M, N, K)) column_kernel(xf.data_ptr<float>(), M, K, wp, N, out.data_ptr<float>());
  else row_kernel(xf.data_ptr<float>(), M, K, wp, N, out.data_ptr<float>());
  return out;
}

// A small float32 weight (under kSmallWeightElems: the tiny checkpoints' 8-wide per-layer projections) by the
// row kernel at every row count: ATen's mm picks its kernel by the row count, so a row's last bits depended
// on the rows beside it (fast prefill runs the cross-decoder on fewer rows), and a quantizer downstream (W8A8
// activations, fp8 KV) can turn one such bit into a different code.
static torch::Tensor f32_rows(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == torch::kFloat32 && w.dim() == 2 && w.device().is_cpu(),
              "the float32 row kernel takes a float32 [N, K] CPU weight");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.size(1), "x must be [M, K] for a weight [N, K]");
  auto xf = x.to(torch::kFloat32).contiguous();
  auto wc = w.contiguous();
  const int64_t M = xf.size(0), K = xf.size(1), N = wc.size(0);
  auto out = torch::empty({M, N}, xf.options());
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();
  if (takes_columns(M, N, K)) column_kernel(xf.data_ptr<float>(), M, K, wc.data_ptr<float>(), N, out.data_ptr<float>());
  else row_kernel(xf.data_ptr<float>(), M, K, wc.data_ptr<float>(), N, out.data_ptr<float>());
  return out;
}

namespace {
// oneDNN's product in the weight's dtype (x cast to it), for callers that checked runs_onednn
torch::Tensor onednn_product(const torch::Tensor& x, const torch::Tensor& w) {
  return onednn_linear(x.to(w.scalar_type()).contiguous(), w, "none", "");
}
}  // namespace

torch::Tensor linear_native(const torch::Tensor& x, const torch::Tensor& w, bool onednn) {
  TORCH_CHECK(x.dim() == 2, "linear takes x [M, K]");
  if (runs_onednn(w, x.size(0), onednn)) return onednn_product(x, w);
  return linear(x, w, onednn);
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, bool onednn) {
  TORCH_CHECK(x.dim() == 2, "linear takes x [M, K]");
  const int64_t rows = x.size(0);
  if (is_quantized(w)) return quant_linear(x, w, onednn);  // onednn: bf16 dot products allowed (quant_linear.h)
  if (runs_onednn(w, rows, onednn)) {
    auto y = onednn_product(x, w);
    return y.scalar_type() == torch::kFloat32 ? y : y.to(torch::kFloat32);
  }
  if (w.is_mkldnn()) return packed_dot_rows(x, w);  // runs_onednn said no: its layout at decode-size row counts
  if (w.scalar_type() == torch::kBFloat16) {
#if defined(BF16_DOT_ROWS)
    if (onednn && rows <= kBf16RowKernelMaxRows && w.numel() >= kSmallWeightElems && w.is_contiguous())
      return bf16_dot_rows(x, w);
#endif
    if (rows <= kBf16RowKernelMaxRows || w.numel() < kSmallWeightElems) return bf16_rows(x, w);
    TORCH_CHECK(w.is_contiguous(), "a bfloat16 weight must be contiguous");
    return widened_mm(x.to(torch::kFloat32).contiguous(), w);
  }
  TORCH_CHECK(w.scalar_type() == torch::kFloat32, "linear weights must be float32 or bfloat16, got ", w.scalar_type());
  if (w.numel() < kSmallWeightElems) return f32_rows(x, w);
  return torch::mm(x.to(torch::kFloat32), w.t());
}

std::string simd_isa() { return cpu_isa::simd_width("scalar"); }

}  // namespace cpu_fused
