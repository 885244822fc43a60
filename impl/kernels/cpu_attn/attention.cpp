// CPU extend and decode attention over the paged KV pool: the triton backend's kernels, compiled for CPU.
//
// They read exactly the metadata the Triton kernels read (impl/attention/triton_metadata.py):
// request b owns query rows qo_indptr[b]..qo_indptr[b+1] at absolute positions q_positions, and keys
// 0..kv_len_b-1 stored at slots kv_indices[kv_indptr[b]..kv_indptr[b+1]]. A query at position p sees
// key j iff j <= p and, with a window W > 0, j > p - W. Scores are sm_scale * q.k, optionally
// cap * tanh(s / cap); softmax and the output accumulate in float32 for every pool dtype.
//
// Pools: q's dtype (float32 / bfloat16 / float16; float32 queries also read bfloat16 / float16 pools), or
// fp8 (float8_e4m3fn / float8_e5m2) with a per-layer
// K and V scale: stored = value / scale, so keys and values are dequantised in the kernel as they are
// read into the float32 tiles (see row_to_f32), the K scale folded into the score scale and the V scale
// into the output. rows_attention can also read the slots through a slot map (the hybrid pool's
// full -> sliding-window slots, impl/cache/swa_pool.py).
//
// Work is cut into tiles over the keys, not per-key loops: a work item holds `lanes` query vectors
// (query rows x the G query heads of one KV head, so each K/V tile is read once for the group),
// gathers a tile of keys through kv_indices into contiguous float32 [keys, D] buffers (or points at
// the pool when the slots are consecutive float32 rows), and runs S^T = K Q^T (keys x SIMD vectors of
// query lanes, K entries broadcast) and O += P V (query lanes x SIMD vectors of head_dim) as
// register-blocked micro-kernels written with GCC vector types (AVX-512 where the CPU has it, else
// AVX2), with an online softmax down the keys on whole vectors of lanes in between. (They replaced BLAS sgemm calls: MKL keeps to AVX2 off Intel
// and costs more in call overhead than these thin products take.) Items run on ATen's thread pool,
// largest first, pulled from a shared counter (causal rows differ in cost by up to the context
// length, so a static split would idle a thread).
//
// With AMX-bf16 (bf16 queries over a bf16 or fp8 pool) the extend and decode items run on tiles instead: see
// "AMX-bf16 tiles" below.
//
// Decode: one query per request, its visible keys cut into num_kv_splits[b] equal splits (the same
// rule as the Triton decode kernel); every (request, KV head, split) is an item, and a second pass
// merges the splits' partial outputs by their log-sum-exp.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <immintrin.h>

#include "../cpu_aligned.h"
#include "../cpu_amx.h"
#include "../cpu_isa.h"
#include "../cpu_vmath.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <unordered_map>
#include <vector>

namespace {

using cpu_mem::avector;  // scratch read 64 bytes at a time: 64-byte aligned (cpu_aligned.h)

// SIMD vectors as GCC vector types: 16 floats (one zmm) with AVX-512, else 8 (one ymm).
#if defined(__AVX512F__)
constexpr int64_t kVec = 16;
#else
constexpr int64_t kVec = 8;
#endif
typedef float vfloat __attribute__((vector_size(kVec * sizeof(float))));
typedef float vfloat_u __attribute__((vector_size(kVec * sizeof(float)), aligned(alignof(float))));
inline vfloat vload(const float* p) { return *reinterpret_cast<const vfloat_u*>(p); }
inline void vstore(float* p, vfloat v) { *reinterpret_cast<vfloat_u*>(p) = v; }

constexpr int64_t kLaneBlk = 8;  // query lanes per block of the P V micro-kernel (kVec is a multiple)
// Register blocking of the micro-kernels, sized to the vector registers: AVX-512 has 32, AVX2 16. Q K^T keeps
// kQkAcc accumulators (keys x lane vectors) and P V kLaneBlk x kPvVecs (lanes x head_dim vectors). At AVX-512's
// sizes an AVX2 build spilled 2 of Q K^T's 16 accumulators and 3 of P V's (and P V's two V vectors), each spilled one
// a store / reload chain through memory per step of the inner loop.
#if defined(__AVX512F__)
constexpr int kQkAcc = 16;
constexpr int kPvVecs = 2;
#else
constexpr int kQkAcc = 12;
constexpr int kPvVecs = 1;
#endif

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

typedef int32_t vint __attribute__((vector_size(kVec * sizeof(int32_t))));
typedef int32_t vint_u __attribute__((vector_size(kVec * sizeof(int32_t)), aligned(alignof(int32_t))));
inline vint vload_i(const int32_t* p) { return *reinterpret_cast<const vint_u*>(p); }

// exp of a SIMD vector for the softmax (arguments <= 0 after the max is subtracted) and the logit cap:
// Cephes' expf polynomial after a round-to-nearest range reduction (the 1.5 * 2^23 shift); relative
// error about 2e-7; arguments clamped to [-87, 88].
inline vfloat vexp(vfloat x) {
  const vfloat lo = vfloat{} - 87.0f, hi = vfloat{} + 88.0f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const float shift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits
  const vfloat t = x * 1.44269504088896341f + shift;
  const vfloat n = t - shift;
  const vfloat r = x - n * 0.693359375f + n * 2.12194440e-4f;
  vfloat p = vfloat{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const vint k = reinterpret_cast<vint>(t) - reinterpret_cast<vint>(vfloat{} + shift);  // n as an integer
  return p * reinterpret_cast<vfloat>((k + 127) << 23);
}

template <typename T>
inline float to_f32(T x) {
  return static_cast<float>(x);
}

template <typename T>
inline T from_f32(float x) {
  return static_cast<T>(x);
}

typedef uint32_t vuint __attribute__((vector_size(kVec * sizeof(uint32_t))));
typedef uint16_t vu16 __attribute__((vector_size(kVec * sizeof(uint16_t))));

// dst[d] = T(acc[d] * inv) for d < D, an output row from its softmax state. bf16 a vector at a time with ATen's
// rounding (to nearest even; NaN -> 0x7FC0), so the bits are from_f32's; other types element by element.
template <typename T>
inline void out_row(T* dst, const float* acc, float inv, int64_t D) {
  int64_t d = 0;
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    for (; d + kVec <= D; d += kVec) {
      const vuint u = reinterpret_cast<vuint>(vload(acc + d) * inv);
      const vu16 b = __builtin_convertvector(cpu_vmath::bf16_round_bits(u), vu16);
      std::memcpy(dst + d, &b, sizeof(b));
    }
  }
  for (; d < D; ++d) dst[d] = from_f32<T>(acc[d] * inv);
}

// One K/V row of the pool as float32. float32 / bfloat16 / float16 pools convert element by element
// (the compiler vectorises the loop). fp8 pools go through the F16C half-to-float instruction: an e5m2
// byte is the top byte of an IEEE half, and an e4m3 byte's exponent and mantissa shifted into a half's
// give its value times 2^-8, subnormals included, so one multiply by 256 restores it exactly. (The
// e4m3fn NaN code would read as 480: the pool never stores it, writes saturate at +-448.) The per-layer
// scales are not applied per element: the K scale multiplies the scores, the V scale the output.
template <typename S>
inline void row_to_f32(const S* src, float* dst, int64_t D) {
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(src[d]);
}

template <bool kE4M3>
inline void fp8_row_to_f32(const uint8_t* b, float* dst, int64_t D) {
  int64_t d = 0;
#if defined(__AVX512F__)
  for (; d + 16 <= D; d += 16) {
    const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + d)));
    if constexpr (kE4M3) {
      const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7F)), 7),
                                        _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8));
      _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.f)));
    } else {
      _mm512_storeu_ps(dst + d, _mm512_cvtph_ps(_mm256_slli_epi16(x, 8)));
    }
  }
#elif defined(__AVX2__) && defined(__F16C__)
  for (; d + 8 <= D; d += 8) {
    const __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + d)));
    if constexpr (kE4M3) {
      const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x7F)), 7),
                                     _mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x80)), 8));
      _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.f)));
    } else {
      _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_slli_epi16(x, 8)));
    }
  }
#endif
  for (; d < D; ++d) {  // the tail (or every element without F16C): c10's exact conversion
    dst[d] = kE4M3 ? static_cast<float>(c10::Float8_e4m3fn(b[d], c10::Float8_e4m3fn::from_bits()))
                   : static_cast<float>(c10::Float8_e5m2(b[d], c10::Float8_e5m2::from_bits()));
  }
}

template <>
inline void row_to_f32<c10::Float8_e4m3fn>(const c10::Float8_e4m3fn* src, float* dst, int64_t D) {
  fp8_row_to_f32<true>(reinterpret_cast<const uint8_t*>(src), dst, D);
}

template <>
inline void row_to_f32<c10::Float8_e5m2>(const c10::Float8_e5m2* src, float* dst, int64_t D) {
  fp8_row_to_f32<false>(reinterpret_cast<const uint8_t*>(src), dst, D);
}

// Strided view of one KV head of the pool: row of slot s at base + s * row_stride.
template <typename S>
struct PoolHead {
  const S* base;
  int64_t row_stride;
  int64_t capacity;
};

// Keys [t0, t0 + n) of a request (slots `slots[t0..]`) as float32 rows: rows[j] -> key j's D values. A float32
// pool's rows are read in place in whatever order their slots come (the hybrid pool's sliding-window slots run
// downwards, cache/allocator.py, and a decode step's new tokens interleave with the other requests'): a tile of
// slots not in ascending order used to be copied into a buffer first, which made a 32-request decode launch over
// downward slots 1.3x slower at e2b_bench's full-attention shapes; other dtypes are converted into buf [n, D].
template <typename S>
inline void key_rows(const PoolHead<S>& pool, const int64_t* slots, int64_t n, int64_t D, float* buf, const float** rows) {
  for (int64_t j = 0; j < n; ++j) {
    TORCH_CHECK(slots[j] >= 0 && slots[j] < pool.capacity, "KV slot ", slots[j], " outside the pool (capacity ",
                pool.capacity, ")");
  }
  if constexpr (std::is_same_v<S, float>) {
    for (int64_t j = 0; j < n; ++j) rows[j] = pool.base + slots[j] * pool.row_stride;
  } else {
    for (int64_t j = 0; j < n; ++j) {
      row_to_f32<S>(pool.base + slots[j] * pool.row_stride, buf + j * D, D);
      rows[j] = buf + j * D;
    }
  }
}

#if defined(__AVX512F__)
// Half a zmm (8 float lanes, one ymm): the last lane vector when it holds at most 8 query lanes. A decode item of a
// GQA group of 8 heads (E2B's) is 8 lanes padded to 16; Zen 4 runs a zmm FMA as two ymm halves, so half-width
// vectors halve its Q K^T there. A lane's FMAs (over d, in order) are the same at either width: same bits.
typedef float hfloat __attribute__((vector_size(8 * sizeof(float))));
#endif

// S^T [n, LP] = scale * K Q^T for the lane vectors [c0, c0 + LV * W) of Q^T (V: vectors of W floats, vfloat or,
// with AVX-512, hfloat): key j's D floats at k[j], qt = Q^T [D, LP]. Blocks of KB keys x LV SIMD vectors of query
// lanes (kQkAcc accumulators) accumulate in registers over d (K entries broadcast, so K is read in place: no
// transposed copy).
template <int LV, typename V = vfloat>
inline void qk_lanes(const float* const* k, int64_t n, int64_t D, const float* qt, int64_t LP, int64_t c0, float scale,
                     float* st) {
  constexpr int KB = kQkAcc / LV > 0 ? kQkAcc / LV : 1;
  constexpr int64_t W = sizeof(V) / sizeof(float);
  for (int64_t j0 = 0; j0 < n; j0 += KB) {
    const int64_t kb = std::min<int64_t>(KB, n - j0);
    const float* kr[KB];
    for (int b = 0; b < KB; ++b) kr[b] = k[j0 + std::min<int64_t>(b, kb - 1)];  // tail: last row again
    V acc[KB][LV] = {};
    for (int64_t d = 0; d < D; ++d) {
      V qv[LV];
      for (int c = 0; c < LV; ++c) std::memcpy(&qv[c], qt + d * LP + c0 + c * W, sizeof(V));
      for (int b = 0; b < KB; ++b) {
        const float x = kr[b][d];
        for (int c = 0; c < LV; ++c) acc[b][c] += x * qv[c];
      }
    }
    for (int64_t b = 0; b < kb; ++b) {
      for (int c = 0; c < LV; ++c) {
        const V y = acc[b][c] * scale;
        std::memcpy(st + (j0 + b) * LP + c0 + c * W, &y, sizeof(V));
      }
    }
  }
}

// S^T [n, LP] for `lanes` query lanes (LP = lanes rounded up to kVec); the padding lanes of S^T are left as they
// are (attend_tile masks every padding lane to -inf before reading it).
inline void qk_all_lanes(const float* const* k, int64_t n, int64_t D, const float* qt, int64_t LP, int64_t lanes,
                         float scale, float* st) {
  int64_t nv = LP / kVec;
#if defined(__AVX512F__)
  if (nv > 0 && lanes - (nv - 1) * kVec <= kVec / 2) qk_lanes<1, hfloat>(k, n, D, qt, LP, --nv * kVec, scale, st);
#else
  (void)lanes;
#endif
  int64_t c = 0;
  for (; c + 8 <= nv; c += 8) qk_lanes<8>(k, n, D, qt, LP, c * kVec, scale, st);
  for (; c + 4 <= nv; c += 4) qk_lanes<4>(k, n, D, qt, LP, c * kVec, scale, st);
  for (; c + 2 <= nv; c += 2) qk_lanes<2>(k, n, D, qt, LP, c * kVec, scale, st);
  for (; c < nv; ++c) qk_lanes<1>(k, n, D, qt, LP, c * kVec, scale, st);
}

// ab [kLaneBlk, D] += P V for head_dim vectors [d0, d0 + NV * kVec) of kLaneBlk lanes (pb: their column of P^T,
// LP apart), accumulated in registers over the keys.
template <int NV>
inline void pv_lanes(const float* pb, int64_t LP, int64_t n, const float* const* v, int64_t d0, int64_t D, float* ab) {
  vfloat a[kLaneBlk][NV];
  for (int64_t i = 0; i < kLaneBlk; ++i)
    for (int c = 0; c < NV; ++c) a[i][c] = vload(ab + i * D + d0 + c * kVec);
  for (int64_t j = 0; j < n; ++j) {
    vfloat vv[NV];
    for (int c = 0; c < NV; ++c) vv[c] = vload(v[j] + d0 + c * kVec);
    for (int64_t i = 0; i < kLaneBlk; ++i) {
      const float w = pb[j * LP + i];
      for (int c = 0; c < NV; ++c) a[i][c] += w * vv[c];
    }
  }
  for (int64_t i = 0; i < kLaneBlk; ++i)
    for (int c = 0; c < NV; ++c) vstore(ab + i * D + d0 + c * kVec, a[i][c]);
}

// acc [LP, D] += P V over n keys for the first `lanes` lanes: pt = P^T [n, LP], key j's values at v[j]. Blocks of kLaneBlk lanes x kPvVecs
// (or, for the last one, 1) SIMD vectors of head_dim accumulate in registers over the keys (pv_lanes).
inline void pv_blocks(const float* pt, int64_t LP, int64_t lanes, int64_t n, const float* const* v, int64_t D,
                      float* acc) {
  if (D % kVec != 0) {  // head_dim not a multiple of the SIMD width (tiny test models): plain loops
    for (int64_t j = 0; j < n; ++j) {
      const float* vr = v[j];
      for (int64_t i = 0; i < lanes; ++i) {
        const float w = pt[j * LP + i];
        float* o = acc + i * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) o[d] += w * vr[d];
      }
    }
    return;
  }
  for (int64_t i0 = 0; i0 < lanes; i0 += kLaneBlk) {  // (blocks of padding lanes only: skipped)
    const float* pb = pt + i0;
    float* ab = acc + i0 * D;
    int64_t d0 = 0;
    for (; d0 + kPvVecs * kVec <= D; d0 += kPvVecs * kVec) pv_lanes<kPvVecs>(pb, LP, n, v, d0, D, ab);
    for (; d0 < D; d0 += kVec) pv_lanes<1>(pb, LP, n, v, d0, D, ab);  // one vector of head_dim left
  }
}

// Online-softmax state of LP query lanes: running max m, denominator l, unnormalised acc [LP, D].
struct Softmax {
  avector<float> m, l, acc;
  void reset(int64_t lanes, int64_t D) {
    m.assign(lanes, kNegInf);
    l.assign(lanes, 0.f);
    acc.assign(lanes * D, 0.f);
  }
};

struct TileArgs {
  int64_t D;
  float scale;  // sm_scale times the pool's K scale (scores of dequantised keys)
  float cap;  // 0: no logit cap
  float v_scale;  // the pool's V scale: multiplies the normalised output
  const int64_t* slot_map;  // full -> sliding-window slot map applied to every slot read (nullptr: none)
  int64_t map_len;
  int64_t pack_epoch = 0;  // > 0: the forward's epoch, under which the bf16-pair packings are kept (pair_pack_requests)
  int64_t kv_generation = 0;  // > 0 (decode): the pool's generation, under which packings outlive the launch
};

// One key tile [t0, t0 + n) for `lanes` query lanes, LP = lanes rounded up to kVec (padding lanes see no
// key); lane i sees keys [lo[i], hi[i]). qt: Q^T [D, LP]; key j's rows at k[j] / v[j]; st_buf: S^T [n, LP]
// scratch. Softmax runs down the keys with whole vectors of lanes; masked keys are -inf, then exactly 0.
inline void attend_tile(const TileArgs& a, const float* qt, int64_t lanes, int64_t LP, const float* const* k,
                        const float* const* v, int64_t t0, int64_t n, const int64_t* lo, const int64_t* hi,
                        float* st_buf, Softmax& st) {
  const int64_t D = a.D, nv = LP / kVec;
  qk_all_lanes(k, n, D, qt, LP, lanes, a.scale, st_buf);
  thread_local std::vector<int32_t> blo, bhi;  // each lane's visible keys within this tile: [blo, bhi)
  blo.assign(LP, 0);
  bhi.assign(LP, 0);
  for (int64_t i = 0; i < lanes; ++i) {
    blo[i] = static_cast<int32_t>(std::clamp<int64_t>(lo[i] - t0, 0, n));
    bhi[i] = static_cast<int32_t>(std::clamp<int64_t>(hi[i] - t0, 0, n));
  }
  const vfloat ninf = vfloat{} + kNegInf;
  for (int64_t c = 0; c < nv; ++c) {
    const int64_t l0 = c * kVec;
    const vint vlo = vload_i(blo.data() + l0), vhi = vload_i(bhi.data() + l0);
    vfloat vmax = ninf;
    for (int64_t j = 0; j < n; ++j) {
      float* p = st_buf + j * LP + l0;
      vfloat x = vload(p);
      if (a.cap > 0.f) x = a.cap - 2.f * a.cap / (vexp(x * (2.f / a.cap)) + 1.f);  // cap * tanh(s / cap)
      const vint jv = vint{} + static_cast<int32_t>(j);
      x = (jv >= vlo) & (jv < vhi) ? x : ninf;
      vstore(p, x);
      vmax = x > vmax ? x : vmax;
    }
    const vfloat m_old = vload(st.m.data() + l0);
    const vfloat m_new = vmax > m_old ? vmax : m_old;
    vfloat vsum = vfloat{};
    for (int64_t j = 0; j < n; ++j) {
      float* p = st_buf + j * LP + l0;
      const vfloat x = vload(p);
      const vfloat e = x == ninf ? vfloat{} : vexp(x - m_new);
      vstore(p, e);
      vsum += e;
    }
    const vfloat alpha = m_old == ninf ? vfloat{} : vexp(m_old - m_new);
    vstore(st.l.data() + l0, vload(st.l.data() + l0) * alpha + vsum);
    vstore(st.m.data() + l0, m_new);
    for (int64_t i = 0; i < std::min(kVec, lanes - l0); ++i) {  // (padding lanes' rows are never read)
      if (alpha[i] == 1.f) continue;
      float* acc = st.acc.data() + (l0 + i) * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] *= alpha[i];
    }
  }
  pv_blocks(st_buf, LP, lanes, n, v, D, st.acc.data());
}

// Keys [key_lo, key_hi) of one request (pool slots `slots`) and KV head `h`, one tile of BN keys at a time,
// for `lanes` query lanes (qt = Q^T [D, LP]); lane i sees keys [lo[i], hi[i]). Scratch: kbuf / vbuf [BN, D],
// s [BN, LP]. With a slot map (the hybrid pool's sliding layers) each tile's slots are translated first.
template <typename S>
void attend_keys(const TileArgs& a, const torch::Tensor& k_buf, const torch::Tensor& v_buf, int64_t h,
                 const int64_t* slots, int64_t key_lo, int64_t key_hi, int64_t BN, const float* qt, int64_t lanes,
                 int64_t LP, const int64_t* lo, const int64_t* hi, float* kbuf, float* vbuf, float* s, Softmax& st) {
  const int64_t cap_n = k_buf.size(0);
  const PoolHead<S> kh{k_buf.data_ptr<S>() + h * k_buf.stride(1), k_buf.stride(0), cap_n};
  const PoolHead<S> vh{v_buf.data_ptr<S>() + h * v_buf.stride(1), v_buf.stride(0), cap_n};
  thread_local std::vector<int64_t> mapped;
  thread_local std::vector<const float*> kr, vr;  // the tile's key / value rows
  for (int64_t t0 = key_lo; t0 < key_hi; t0 += BN) {
    const int64_t n = std::min(BN, key_hi - t0);
    const int64_t* ts = slots + t0;
    if (a.slot_map != nullptr) {
      mapped.resize(n);
      for (int64_t j = 0; j < n; ++j) {
        TORCH_CHECK(ts[j] >= 0 && ts[j] < a.map_len, "KV slot ", ts[j], " outside the slot map (", a.map_len, ")");
        mapped[j] = a.slot_map[ts[j]];
      }
      ts = mapped.data();
    }
    kr.resize(n);
    vr.resize(n);
    key_rows(kh, ts, n, a.D, kbuf, kr.data());
    key_rows(vh, ts, n, a.D, vbuf, vr.data());
    attend_tile(a, qt, lanes, LP, kr.data(), vr.data(), t0, n, lo, hi, s, st);
  }
}

inline bool is_fp8(at::ScalarType t) { return t == torch::kFloat8_e4m3fn || t == torch::kFloat8_e5m2; }

// Runs items 0..n-1 (already ordered largest first) on ATen's pool, pulled from a shared counter.
template <typename F>
void run_items(int64_t n, const F& body) {
  if (n == 0) return;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), n);
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) body(i);
  });
}

// ---------------------------------------------------------------- AMX-bf16 tiles (extend and decode)
//
// Where the CPU has AMX-bf16 and the queries and the pool are bfloat16 (or fp8, whose values bf16 holds
// exactly), the extend and decode work items run Q K^T and P V as TDPBF16PS tile products (16 x 16 float32 outputs from
// 16 x 32 bf16 A and 32 x 16 bf16 B per instruction, products exact, float32 accumulation). The softmax state
// stays float32; P is rounded to bf16 for the P V product and the denominator sums the rounded P, so the
// output is the convex combination the tiles computed.
//
// Each (request, KV head)'s visible keys are packed once per launch into the B tiles' layout (K^T in pairs of
// dims, V in pairs of keys: 1 KB per tile), not once per work item, and every item reads its tiles in place.
// Key tiles lie on a fixed grid (multiples of kPairKeys from key 0, the first one started at the item's first
// 32-key block): a lane's result depends only on its own query and visible keys, never on which rows share
// its item, so a row computed alone (fast prefill's selected rows) gets the bits it gets among all rows.
// IMPL_CPU_AMX=0 turns the tiles off.
//
// Where the CPU has AVX512-BF16 but no AMX (AMD Zen 4, Cooper Lake), the same items run the same products with
// VDPBF16PS (16 float32 lanes, each += the products of one bf16 pair: 32 multiply-adds per instruction, twice a
// float32 FMA's), on the same packed layout, key grid and softmax: a row of a packed K tile is one vector of 16 keys'
// pairs of dims, a row of a V tile one of 16 dims' pairs of keys, and the queries' (P's) pairs are broadcast. Each
// lane still depends only on its own query and keys (the fast-prefill parity below holds on either). Without tiles
// or AVX512-BF16 (or IMPL_CPU_ATTN_BF16=0) the float32 SIMD kernels above run every item.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#define ATTN_BF16_PAIRS 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define ATTN_AMX_BF16 1
#endif

// Keys per tile of the online softmax (a multiple of 32). 256 spreads each tile's P V accumulator loads / stores and
// its softmax bookkeeping over twice the keys of 128 (E2B's shapes, bench.bench_cpu_attn: 10-15% faster); 512 ran
// slower (S and P outgrow L1).
constexpr int64_t kPairKeys = 256;

// The element types the tiles take: bf16 queries over a bf16 or fp8 pool.
template <typename T, typename S>
constexpr bool kPairTypes = std::is_same_v<T, at::BFloat16> && (std::is_same_v<S, at::BFloat16> ||
                                                              std::is_same_v<S, c10::Float8_e4m3fn> ||
                                                              std::is_same_v<S, c10::Float8_e5m2>);

// One pool row as bf16 bits: a bf16 pool's row in place; an fp8 row through float32 (exact: bf16 holds every
// e4m3 / e5m2 value, so its top 16 bits are the value).
template <typename S>
inline const uint16_t* bf16_row(const S* src, int64_t D, float* f32, uint16_t* tmp) {
  if constexpr (std::is_same_v<S, at::BFloat16>) {
    return reinterpret_cast<const uint16_t*>(src);
  } else {
    row_to_f32<S>(src, f32, D);
    for (int64_t d = 0; d < D; ++d) {
      uint32_t bits;
      std::memcpy(&bits, f32 + d, 4);
      tmp[d] = static_cast<uint16_t>(bits >> 16);
    }
    return tmp;
  }
}

// Keys [k0, k0 + n) of one (request, KV head), packed: kp holds ceil(n / 16) blocks of D / 32 B tiles of K^T
// (tile (kb, c): row r = dims 32c + 2r, 32c + 2r + 1, column = key 16 kb + col, as bf16 pairs); vp holds
// ceil(n / 32) blocks of D / 16 B tiles of V (tile (kb, db): row r = keys 32 kb + 2r, +1, column = dim 16 db + d).
// Keys past n are zero.
struct PairPacked {
  int64_t k0 = 0;
  cpu_mem::avector_noinit<uint32_t> kp;  // pair_pack_keys writes every element, padding keys included
  cpu_mem::avector_noinit<uint16_t> vp;
};

void pair_pack_alloc(int64_t k0, int64_t n, int64_t D, PairPacked& out) {
  out.k0 = k0;
  out.kp.resize(round_up(n, 32) * D / 2);  // growing a kept packing keeps what it holds (std::vector::resize)
  out.vp.resize(round_up(n, 32) * D);
}
using PackedRequests = std::vector<std::shared_ptr<PairPacked>>;  // entry b * Hkv + h (nullptr: no keys)

// 16 rows of 16 dwords transposed in registers: out row i (16 dwords, 64-byte aligned) = dword i of every row.
// Four unpack / shuffle stages: after the second, r[4i + c]'s 128-bit lane L holds dword 4L + c of rows
// 4i .. 4i + 3; the two 128-bit shuffles gather each dword's four lanes.
inline void transpose16_epi32(__m512i r[16], uint32_t* out) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    _mm512_store_si512(out + 16 * j, _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88));
    _mm512_store_si512(out + 16 * (8 + j), _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd));
  }
}

// Packs keys [k0 + j_lo, k0 + j_hi) (request slots `slots`, through the launch's slot map) into `out`, 16 keys at
// a time: K^T's tiles as 16 x 16 dword transposes, V's as two rows' words interleaved (VPERMT2W); keys past
// j_hi up to the next 32-key block are written as zeros (j_lo is a multiple of 32, j_hi a multiple of 32 or
// the request's last key). A data move: the tiles hold the bits a key-by-key copy gives.
template <typename S>
void pair_pack_keys(const PoolHead<S>& kh, const PoolHead<S>& vh, const int64_t* slots, const TileArgs& a,
                   int64_t j_lo, int64_t j_hi, PairPacked& out) {
  const int64_t D = a.D, DC = D / 32, DB = D / 16;
  thread_local avector<float> f32;
  thread_local avector<uint16_t> stage, zeros;  // fp8 pools: a block's rows as bf16; the rows past j_hi
  f32.resize(D);
  stage.resize(32 * D);
  zeros.assign(D, 0);
  // word i of a V tile row: key 2r + (i % 2)'s dim i / 2 (lo: dims 0..15 of a 32-dim block, hi: 16..31)
  alignas(64) uint16_t ilo[32], ihi[32];
  for (int i = 0; i < 32; ++i) {
    ilo[i] = static_cast<uint16_t>((i % 2) * 32 + i / 2);
    ihi[i] = static_cast<uint16_t>((i % 2) * 32 + 16 + i / 2);
  }
  const __m512i vlo = _mm512_load_si512(ilo), vhi = _mm512_load_si512(ihi);
  const int64_t j_end = round_up(j_hi, 32);
  for (int64_t jb = j_lo; jb < j_end; jb += 16) {
    const uint16_t* kr[16];
    const uint16_t* vr[16];
    for (int i = 0; i < 16; ++i) {
      const int64_t j = jb + i;
      if (j >= j_hi) {
        kr[i] = vr[i] = zeros.data();
        continue;
      }
      int64_t slot = slots[out.k0 + j];
      if (a.slot_map != nullptr) {
        TORCH_CHECK(slot >= 0 && slot < a.map_len, "KV slot ", slot, " outside the slot map (", a.map_len, ")");
        slot = a.slot_map[slot];
      }
      TORCH_CHECK(slot >= 0 && slot < kh.capacity, "KV slot ", slot, " outside the pool (capacity ", kh.capacity, ")");
      kr[i] = bf16_row<S>(kh.base + slot * kh.row_stride, D, f32.data(), stage.data() + i * D);
      vr[i] = bf16_row<S>(vh.base + slot * vh.row_stride, D, f32.data(), stage.data() + (16 + i) * D);
    }
    uint32_t* kt = out.kp.data() + (jb / 16) * DC * 256;
    for (int64_t c = 0; c < DC; ++c) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(kr[i] + 32 * c);
      transpose16_epi32(r, kt + c * 256);
    }
    uint16_t* vt = out.vp.data() + (jb / 32) * DB * 512 + ((jb % 32) / 2) * 32;
    for (int rr = 0; rr < 8; ++rr) {
      for (int64_t e = 0; e < D / 32; ++e) {
        const __m512i x = _mm512_loadu_si512(vr[2 * rr] + 32 * e), y = _mm512_loadu_si512(vr[2 * rr + 1] + 32 * e);
        _mm512_store_si512(vt + (2 * e) * 512 + rr * 32, _mm512_permutex2var_epi16(x, vlo, y));
        _mm512_store_si512(vt + (2 * e + 1) * 512 + rr * 32, _mm512_permutex2var_epi16(x, vhi, y));
      }
    }
  }
}

// Packings kept for the launches after the one that made them, within one forward (TileArgs::pack_epoch > 0):
// Gemma-4's KV-shared layers (20 of E2B's 35) attend over their producer layer's K/V, which nothing writes after
// the producer's own attention in that forward, so each would pack the same keys again. The caller gives every
// forward an epoch never used before in the process, and only for the launches over producers' buffers; a launch
// reuses a packing of its epoch over the same buffers whose requests' slots match its own and cover its keys.
// A covering packing gives the bits of an exact one: attend_pairs starts an item's tiles at max(k0, its first
// 32-key block), which a smaller k0 does not move, and keys past an item's range are masked as before.
struct PackCacheEntry {
  int64_t epoch;
  const void* k;
  const void* v;
  int64_t D, Hkv;
  std::vector<int64_t> k0, end;  // per request: the packed keys [k0, end) (empty: end <= k0)
  std::vector<std::vector<int64_t>> slots;  // per request: the slots of keys [k0, end)
  std::shared_ptr<const PackedRequests> packed;
};
constexpr size_t kPackCacheEntries = 4;                // the producers of one forward (E2B: 2)
constexpr int64_t kPackCacheBytes = int64_t{1} << 28;  // a larger packing is not kept (256 MB)
std::mutex pack_cache_mu;
std::vector<PackCacheEntry> pack_cache;

// Packings kept across launches, for decode (TileArgs::kv_generation > 0): step after step a request attends over
// the keys it attended over before plus one, so its packing is grown by the new key's 32-key block instead of being
// made again (at 4 x 8192 keys of head dim 512, packing was 3/4 of a launch). A data move again: the bits of a fresh
// packing. Sound because the engine hands out KV slots only from its free list and writes K/V only into slots
// handed out for the rows it computes: a slot's rows change only after the slot was freed and handed out again,
// and every free of slots read without a slot map (impl/cache/allocator.py; no packing read through a slot map is
// kept) moves the process's generation, which drops every kept packing. A kept
// packing is reused for a request whose slots for the packed keys are the same, from the same first key block.
// Bounded: a launch over a buffer drops that buffer's kept packings it did not use (their requests left the
// batch), and none is kept past kKeptBytesDefault in all (IMPL_CPU_ATTN_KEEP_MB).
struct KeptPacking {
  const void* k;
  const void* v;
  int64_t D, h, end;  // keys [pk->k0, end) of one request's KV head h are packed
  std::vector<int64_t> slots;  // their slots
  std::shared_ptr<PairPacked> pk;
  bool used;
};
constexpr int64_t kKeptBytesDefault = int64_t{512} << 20;
std::mutex kept_mu;
int64_t kept_generation = 0;
int64_t kept_bytes = 0;
std::unordered_map<const void*, std::vector<KeptPacking>> kept;  // by K buffer

int64_t kept_budget() {
  static const int64_t budget = [] {
    const char* env = std::getenv("IMPL_CPU_ATTN_KEEP_MB");
    return env != nullptr && *env != '\0' ? std::max<int64_t>(0, std::atoll(env)) << 20 : kKeptBytesDefault;
  }();
  return budget;
}
inline int64_t packed_bytes(const PairPacked& pk) {
  return static_cast<int64_t>(pk.kp.size() * sizeof(uint32_t) + pk.vp.size() * sizeof(uint16_t));
}

// The kept packings' integrity: each holds one slot per packed key and room for them, and kept_bytes is their sum.
// Returns {entries, bytes}; raises on a mismatch.
std::vector<int64_t> kept_packings_check() {
  std::lock_guard<std::mutex> lock(kept_mu);
  int64_t entries = 0, bytes = 0;
  for (const auto& [buf, list] : kept)
    for (const KeptPacking& e : list) {
      const int64_t n = e.end - e.pk->k0;
      TORCH_CHECK(e.k == buf && n >= 0 && static_cast<int64_t>(e.slots.size()) == n &&
                      static_cast<int64_t>(e.pk->kp.size()) >= round_up(n, 32) * e.D / 2 &&
                      static_cast<int64_t>(e.pk->vp.size()) >= round_up(n, 32) * e.D,
                  "kept bf16-pair packing of buffer ", buf, ": ", e.slots.size(), " slots for keys [", e.pk->k0, ", ",
                  e.end, ") (", e.pk->kp.size(), " / ", e.pk->vp.size(), " words)");
      ++entries;
      bytes += packed_bytes(*e.pk);
    }
  TORCH_CHECK(bytes == kept_bytes, "kept bf16-pair packings hold ", bytes, " bytes, the count says ", kept_bytes);
  return {entries, bytes};
}

// Everything kept goes (an engine shutting down: its pool's buffers go with it).
void drop_kept_packings() {
  std::lock_guard<std::mutex> lock(kept_mu);
  kept.clear();
  kept_bytes = 0;
}

// Every (request b, KV head h)'s keys that any of `items` sees (fields b, lo, hi: keys [lo, hi) of request b),
// from the first one's 32-key block, packed (request b's pool slots slots[b]) in chunks on ATen's pool; entry
// b * Hkv + h. A request no item sees keys of gets nothing packed. With a.pack_epoch, a kept packing that covers
// these keys is returned instead, and a new one is kept (above).
template <typename S, typename Item>
std::shared_ptr<const PackedRequests> pair_pack_requests(const torch::Tensor& k_buf, const torch::Tensor& v_buf,
                                                                const std::vector<const int64_t*>& slots,
                                                                const std::vector<Item>& items, const TileArgs& a) {
  const int64_t B = static_cast<int64_t>(slots.size()), Hkv = k_buf.size(1), cap_n = k_buf.size(0);
  std::vector<int64_t> klo(B, std::numeric_limits<int64_t>::max()), khi(B, 0);
  for (const Item& it : items) {
    if (it.hi <= it.lo) continue;
    klo[it.b] = std::min(klo[it.b], it.lo);
    khi[it.b] = std::max(khi[it.b], it.hi);
  }
  for (int64_t b = 0; b < B; ++b)
    if (khi[b] > klo[b]) klo[b] = klo[b] / 32 * 32;
  const void* kp = k_buf.data_ptr();
  const void* vp = v_buf.data_ptr();
  const bool keep = a.pack_epoch > 0 && a.slot_map == nullptr;
  auto drop_other_epochs = [&] {  // an older forward's packings: their keys may since have been overwritten
    pack_cache.erase(std::remove_if(pack_cache.begin(), pack_cache.end(),
                                    [&](const PackCacheEntry& x) { return x.epoch != a.pack_epoch; }),
                     pack_cache.end());
  };
  if (keep) {
    std::lock_guard<std::mutex> lock(pack_cache_mu);
    drop_other_epochs();
    for (const PackCacheEntry& e : pack_cache) {
      if (e.k != kp || e.v != vp || e.D != a.D || e.Hkv != Hkv ||  // (every kept entry is of this epoch)
          static_cast<int64_t>(e.k0.size()) != B)
        continue;
      bool covers = true;
      for (int64_t b = 0; b < B && covers; ++b) {
        if (khi[b] <= klo[b]) continue;
        covers = e.k0[b] <= klo[b] && e.end[b] >= khi[b] &&
                 std::memcmp(e.slots[b].data() + (klo[b] - e.k0[b]), slots[b] + klo[b],
                             (khi[b] - klo[b]) * sizeof(int64_t)) == 0;
      }
      if (covers) return e.packed;
    }
  }
  auto packed = std::make_shared<PackedRequests>(B * Hkv);
  struct Chunk {
    int64_t bh, j0, j1;
  };
  std::vector<Chunk> chunks;
  constexpr int64_t kPackChunk = 256;  // keys per packing task (a multiple of 32)
  int64_t bytes = 0;
  // Decode: take each request's kept packing where one holds its first keys (packing only the keys after them,
  // from their last 32-key block), keep the new ones while the budget allows, and drop this buffer's unused ones.
  const bool across = a.kv_generation > 0 && a.slot_map == nullptr;
  std::unique_lock<std::mutex> kept_lock(kept_mu, std::defer_lock);
  std::vector<KeptPacking>* mine = nullptr;
  if (across) {
    kept_lock.lock();
    if (kept_generation != a.kv_generation) {  // a slot was freed since: any kept key may have been rewritten
      kept.clear();
      kept_bytes = 0;
      kept_generation = a.kv_generation;
    }
    mine = &kept[kp];
    for (KeptPacking& e : *mine) e.used = false;
  }
  for (int64_t b = 0; b < B; ++b) {
    if (khi[b] <= klo[b]) continue;
    const int64_t k0 = klo[b], n = khi[b] - k0;
    bytes += Hkv * round_up(n, 32) * a.D * 4;
    for (int64_t h = 0; h < Hkv; ++h) {
      int64_t from = 0;  // keys [k0 + from, k0 + n) are packed below
      KeptPacking* hit = nullptr;
      if (across) {
        for (KeptPacking& e : *mine)
          if (!e.used && e.v == vp && e.D == a.D && e.h == h && e.pk->k0 == k0 && e.end <= khi[b] &&
              std::memcmp(e.slots.data(), slots[b] + k0, (e.end - k0) * sizeof(int64_t)) == 0) {
            hit = &e;
            break;
          }
        if (hit == nullptr && kept_bytes + round_up(n, 32) * a.D * 4 <= kept_budget()) {
          mine->push_back({kp, vp, a.D, h, k0, {}, std::make_shared<PairPacked>(), false});
          hit = &mine->back();
          pair_pack_alloc(k0, 0, a.D, *hit->pk);
        }
        if (hit != nullptr) {
          // nothing new: nothing to pack; else the last block again (its keys past the old end were zeros)
          from = hit->end == khi[b] ? n : (hit->end - k0) / 32 * 32;
          kept_bytes -= packed_bytes(*hit->pk);
          pair_pack_alloc(k0, n, a.D, *hit->pk);
          kept_bytes += packed_bytes(*hit->pk);
          hit->slots.insert(hit->slots.end(), slots[b] + hit->end, slots[b] + khi[b]);
          hit->end = khi[b];
          hit->used = true;
          (*packed)[b * Hkv + h] = hit->pk;
        }
      }
      if (hit == nullptr) {
        (*packed)[b * Hkv + h] = std::make_shared<PairPacked>();
        pair_pack_alloc(k0, n, a.D, *(*packed)[b * Hkv + h]);
      }
      for (int64_t j0 = from; j0 < n; j0 += kPackChunk) chunks.push_back({b * Hkv + h, j0, std::min(j0 + kPackChunk, n)});
    }
  }
  if (across) {
    for (const KeptPacking& e : *mine)
      if (!e.used) kept_bytes -= packed_bytes(*e.pk);
    mine->erase(std::remove_if(mine->begin(), mine->end(), [](const KeptPacking& e) { return !e.used; }), mine->end());
    kept_lock.unlock();  // the packings below are this launch's: no other launch runs meanwhile (one forward at a time)
  }
  try {
    run_items(static_cast<int64_t>(chunks.size()), [&](int64_t idx) {
      const Chunk& c = chunks[idx];
      const int64_t b = c.bh / Hkv, h = c.bh % Hkv;
      const PoolHead<S> kh{k_buf.data_ptr<S>() + h * k_buf.stride(1), k_buf.stride(0), cap_n};
      const PoolHead<S> vh{v_buf.data_ptr<S>() + h * v_buf.stride(1), v_buf.stride(0), cap_n};
      pair_pack_keys<S>(kh, vh, slots[b], a, c.j0, c.j1, *(*packed)[c.bh]);
    });
  } catch (...) {  // a refused slot: the kept packings of this buffer already claim keys that were not packed
    if (across) {
      std::lock_guard<std::mutex> lock(kept_mu);
      if (auto it = kept.find(kp); it != kept.end()) {
        for (const KeptPacking& e : it->second) kept_bytes -= packed_bytes(*e.pk);
        kept.erase(it);
      }
    }
    throw;
  }
  if (keep && bytes <= kPackCacheBytes) {
    PackCacheEntry e{a.pack_epoch, kp, vp, a.D, Hkv, klo, khi, std::vector<std::vector<int64_t>>(B), packed};
    for (int64_t b = 0; b < B; ++b)
      if (khi[b] > klo[b]) e.slots[b].assign(slots[b] + klo[b], slots[b] + khi[b]);
    std::lock_guard<std::mutex> lock(pack_cache_mu);
    drop_other_epochs();
    if (pack_cache.size() >= kPackCacheEntries) pack_cache.erase(pack_cache.begin());
    pack_cache.push_back(std::move(e));
  }
  return packed;
}

inline float hmax(vfloat v) {
  float m = v[0];
  for (int i = 1; i < kVec; ++i) m = std::max(m, v[i]);
  return m;
}

inline float hsum(vfloat v) {
  float s = 0.f;
  for (int i = 0; i < kVec; ++i) s += v[i];
  return s;
}

#if defined(ATTN_AMX_BF16)
// The accumulator tiles of a block of RT 16-row tiles x 32 columns: tiles 0 and 1 (rows 0-15, columns 0-15 and
// 16-31), with RT = 2 tiles 2 and 3 (rows 16-31), from / to c (rows ld floats apart).
template <int RT>
inline void amx_load_acc(const float* c, int64_t ld) {
  _tile_loadd(0, c, ld * 4);
  _tile_loadd(1, c + 16, ld * 4);
  if constexpr (RT == 2) {
    _tile_loadd(2, c + 16 * ld, ld * 4);
    _tile_loadd(3, c + 16 * ld + 16, ld * 4);
  }
}
template <int RT>
inline void amx_store_acc(float* c, int64_t ld) {
  _tile_stored(0, c, ld * 4);
  _tile_stored(1, c + 16, ld * 4);
  if constexpr (RT == 2) {
    _tile_stored(2, c + 16 * ld, ld * 4);
    _tile_stored(3, c + 16 * ld + 16, ld * 4);
  }
}
// One step of those accumulators: += A tiles 4 (rows 0-15) and 5 (RT = 2: rows 16-31) x B tiles 6 and 7.
template <int RT>
inline void amx_dp_step() {
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  if constexpr (RT == 2) {
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

// One block of S = Q K^T on tiles: RT 16-row tiles of queries (q: RT * 16 rows of D bf16) against 32 packed keys
// (kb: two key tiles per 32 dims, DC = D / 32 pairs of them), into sb (rows kPairKeys floats apart). RT = 1 serves
// decode's 8 heads with half the products; a lane's products are the same either way.
template <int RT>
inline void amx_qk_block(const uint16_t* q, int64_t D, const uint32_t* kb, float* sb) {
  const int64_t DC = D / 32;
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (RT == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t c = 0; c < DC; ++c) {
    _tile_loadd(4, q + 32 * c, D * 2);
    if constexpr (RT == 2) _tile_loadd(5, q + 16 * D + 32 * c, D * 2);
    _tile_loadd(6, kb + c * 256, 64);
    _tile_loadd(7, kb + DC * 256 + c * 256, 64);
    amx_dp_step<RT>();
  }
  amx_store_acc<RT>(sb, kPairKeys);
}

// One block of acc += P V on tiles: RT 16-row tiles of P (p: rows kPairKeys bf16 apart, np keys) against the packed
// V tiles of 32 dims (vb: the first 32-key block's, DB * 512 words per 32 keys), into acc (ab: rows D floats apart).
template <int RT>
inline void amx_pv_block(const uint16_t* p, int64_t np, const uint16_t* vb, int64_t DB, float* ab, int64_t D) {
  amx_load_acc<RT>(ab, D);
  for (int64_t kc = 0; kc < np; kc += 32) {
    const uint16_t* v = vb + (kc / 32) * DB * 512;
    _tile_loadd(4, p + kc, kPairKeys * 2);
    if constexpr (RT == 2) _tile_loadd(5, p + 16 * kPairKeys + kc, kPairKeys * 2);
    _tile_loadd(6, v, 64);
    _tile_loadd(7, v + 512, 64);
    amx_dp_step<RT>();
  }
  amx_store_acc<RT>(ab, D);
}
#endif  // ATTN_AMX_BF16

// The same blocks with VDPBF16PS (AVX512-BF16, no tiles): acc lane += the products of one bf16 pair, the pair of the
// B operand (a packed tile's row: 16 keys' pairs of dims for Q K^T, 16 dims' pairs of keys for P V) against one
// query's (P row's) pair broadcast to every lane. Eight query rows at a time: 8 x 2 accumulators of 16 floats, the
// block's 32 columns. Only the first `rows` rows (rounded up to 8) are computed: the others are padding lanes
// (decode's 8 heads in a 16-row block), which the softmax and the output never read.
inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh>(x); }

inline void dot_qk_block(const uint16_t* q, int64_t D, const uint32_t* kb, int64_t rows, float* sb) {
  const int64_t DC = D / 32, half = D / 2;
  const uint32_t* kb1 = kb + DC * 256;  // keys 16-31 of the block
  for (int64_t i0 = 0; i0 < rows; i0 += 8) {
    const uint32_t* qr = reinterpret_cast<const uint32_t*>(q + i0 * D);  // query i0 + i's pair e at qr[i * half + e]
    __m512 acc[8][2];
    for (auto& x : acc) x[0] = x[1] = _mm512_setzero_ps();
    for (int64_t c = 0; c < DC; ++c) {
      for (int64_t r = 0; r < 16; ++r) {
        const __m512bh k0 = as_bh(_mm512_load_si512(kb + c * 256 + r * 16));
        const __m512bh k1 = as_bh(_mm512_load_si512(kb1 + c * 256 + r * 16));
        const int64_t e = c * 16 + r;  // dims 2e, 2e + 1
        for (int i = 0; i < 8; ++i) {
          const __m512bh qp = as_bh(_mm512_set1_epi32(static_cast<int>(qr[i * half + e])));
          acc[i][0] = _mm512_dpbf16_ps(acc[i][0], qp, k0);
          acc[i][1] = _mm512_dpbf16_ps(acc[i][1], qp, k1);
        }
      }
    }
    for (int i = 0; i < 8; ++i) {
      _mm512_storeu_ps(sb + (i0 + i) * kPairKeys, acc[i][0]);
      _mm512_storeu_ps(sb + (i0 + i) * kPairKeys + 16, acc[i][1]);
    }
  }
}

inline void dot_pv_block(const uint16_t* p, int64_t np, const uint16_t* vb, int64_t DB, int64_t rows, float* ab,
                         int64_t D) {
  for (int64_t i0 = 0; i0 < rows; i0 += 8) {
    const uint32_t* pr = reinterpret_cast<const uint32_t*>(p + i0 * kPairKeys);  // row i's key pair e: pr[i * 128 + e]
    __m512 acc[8][2];
    for (int i = 0; i < 8; ++i) {
      acc[i][0] = _mm512_loadu_ps(ab + (i0 + i) * D);
      acc[i][1] = _mm512_loadu_ps(ab + (i0 + i) * D + 16);
    }
    for (int64_t kc = 0; kc < np; kc += 32) {
      const uint16_t* v = vb + (kc / 32) * DB * 512;
      for (int64_t r = 0; r < 16; ++r) {
        const __m512bh v0 = as_bh(_mm512_load_si512(v + r * 32));
        const __m512bh v1 = as_bh(_mm512_load_si512(v + 512 + r * 32));
        const int64_t e = kc / 2 + r;  // keys 2e, 2e + 1
        for (int i = 0; i < 8; ++i) {
          const __m512bh pp = as_bh(_mm512_set1_epi32(static_cast<int>(pr[i * (kPairKeys / 2) + e])));
          acc[i][0] = _mm512_dpbf16_ps(acc[i][0], pp, v0);
          acc[i][1] = _mm512_dpbf16_ps(acc[i][1], pp, v1);
        }
      }
    }
    for (int i = 0; i < 8; ++i) {
      _mm512_storeu_ps(ab + (i0 + i) * D, acc[i][0]);
      _mm512_storeu_ps(ab + (i0 + i) * D + 16, acc[i][1]);
    }
  }
}

// The two ways to run a block: RT 16-row tiles of lanes (rows of them not padding) x 32 keys (Q K^T) or 32 dims (P V).
struct Bf16Dots {
  static void begin() {}
  static void end() {}
  template <int RT>
  static void qk(const uint16_t* q, int64_t D, const uint32_t* kb, int64_t rows, float* sb) {
    dot_qk_block(q, D, kb, std::min<int64_t>(rows, RT * 16), sb);
  }
  template <int RT>
  static void pv(const uint16_t* p, int64_t np, const uint16_t* vb, int64_t DB, int64_t rows, float* ab, int64_t D) {
    dot_pv_block(p, np, vb, DB, std::min<int64_t>(rows, RT * 16), ab, D);
  }
};
#if defined(ATTN_AMX_BF16)
struct AmxTiles {
  static void begin() { cpu_amx::config_16x64(); }
  static void end() { _tile_release(); }
  template <int RT>
  static void qk(const uint16_t* q, int64_t D, const uint32_t* kb, int64_t, float* sb) {
    amx_qk_block<RT>(q, D, kb, sb);
  }
  template <int RT>
  static void pv(const uint16_t* p, int64_t np, const uint16_t* vb, int64_t DB, int64_t, float* ab, int64_t D) {
    amx_pv_block<RT>(p, np, vb, DB, ab, D);
  }
};
#endif

// Work item on bf16 pairs (Ops: AmxTiles or Bf16Dots): `lanes` query lanes (q: bf16 [LP, D], LP a multiple of 16,
// rows past `lanes` zero), lane i sees keys [lo[i], hi[i]) of the packed keys; keys [key_lo, key_hi) cover every
// lane's. st: softmax state of LP lanes (acc [LP, D]).
template <typename Ops>
void attend_pairs(const TileArgs& a, const PairPacked& pk, const uint16_t* q, int64_t lanes, int64_t LP,
                  const int64_t* lo, const int64_t* hi, int64_t key_lo, int64_t key_hi, Softmax& st) {
  const int64_t D = a.D, DC = D / 32, DB = D / 16;
  thread_local avector<float> s;
  thread_local avector<uint16_t> p;
  s.resize(LP * kPairKeys);
  p.assign(LP * kPairKeys, 0);
  const vfloat ninf = vfloat{} + kNegInf;
  // key offsets 0 .. kVec - 1 within a vector, built once (built lane by lane inside the masking loop, GCC
  // emitted 16 scalar inserts per vector: a sixth of a 1024-token extend on E2B's shapes)
  vint iota;
  for (int k = 0; k < kVec; ++k) iota[k] = k;
  Ops::begin();
  for (int64_t t0 = std::max<int64_t>(pk.k0, key_lo / 32 * 32); t0 < key_hi;) {
    const int64_t t1 = std::min(key_hi, (t0 / kPairKeys + 1) * kPairKeys), n = t1 - t0, np = round_up(n, 32);
    const int64_t rel = t0 - pk.k0;  // a multiple of 32
    // S [LP, np] = Q K^T
    for (int64_t i0 = 0; i0 < LP; i0 += 32) {
      for (int64_t j0 = 0; j0 < np; j0 += 32) {
        const uint32_t* kb = pk.kp.data() + ((rel + j0) / 16) * DC * 256;
        float* sb = s.data() + i0 * kPairKeys + j0;
        if (LP - i0 == 16)  // one 16-row tile of lanes (decode's G <= 16 heads): half the products
          Ops::template qk<1>(q + i0 * D, D, kb, lanes - i0, sb);
        else
          Ops::template qk<2>(q + i0 * D, D, kb, lanes - i0, sb);
      }
    }
    // Online softmax along each lane's row; P rounded to bf16 (round to nearest even). Without a logit cap (and
    // with a positive scale, which every pool gives) the max is taken over the raw scores (scale * max(s) is the
    // max of the scaled ones: rounding is monotonic) and the scores are scaled as they are read for exp; a lane
    // that sees every key of the tile (no padding) skips the masking pass. Masked keys are -inf in S either way,
    // so a lane gets the same bits whichever of its tiles needed the mask.
    const bool raw_max = a.cap == 0.f && a.scale > 0.f;
    for (int64_t i = 0; i < lanes; ++i) {
      float* sr = s.data() + i * kPairKeys;
      uint16_t* pr = p.data() + i * kPairKeys;
      const int32_t blo = static_cast<int32_t>(std::clamp<int64_t>(lo[i] - t0, 0, n));
      const int32_t bhi = static_cast<int32_t>(std::clamp<int64_t>(hi[i] - t0, 0, n));
      vfloat vmax = ninf;
      if (raw_max && blo == 0 && bhi == np) {
        for (int64_t j = 0; j < np; j += kVec) {
          const vfloat x = vload(sr + j);
          vmax = x > vmax ? x : vmax;
        }
      } else {
        for (int64_t j = 0; j < np; j += kVec) {
          vfloat x = vload(sr + j);
          if (!raw_max) x *= a.scale;
          if (a.cap > 0.f) x = a.cap - 2.f * a.cap / (vexp(x * (2.f / a.cap)) + 1.f);  // cap * tanh(s / cap)
          const vint jv = iota + static_cast<int32_t>(j);
          x = (jv >= blo) & (jv < bhi) ? x : ninf;
          vstore(sr + j, x);
          vmax = x > vmax ? x : vmax;
        }
      }
      const float m_old = st.m[i], m_new = std::max(m_old, raw_max ? hmax(vmax) * a.scale : hmax(vmax));
      if (m_new == kNegInf) {  // no visible key yet: P is zero, the state unchanged
        std::fill(pr, pr + np, 0);
        continue;
      }
      // P = 2^(x log2(e) - m log2(e)) with x = in_scale * s: one FMA to the exponent u, u = n + f (n the nearest
      // integer), 2^f by its degree-5 Taylor polynomial on |f| <= 1/2 (relative error < 3e-6, far below P's bf16
      // rounding) and 2^n by VSCALEFPS (which takes u below the float range to 0). Masked keys (-inf) give 0.
      const float in_scale = raw_max ? a.scale : 1.f;  // scores not yet scaled are scaled here
      const __m512 to_u = _mm512_set1_ps(in_scale * 1.44269504088896341f);
      const __m512 u0 = _mm512_set1_ps(-m_new * 1.44269504088896341f);
      const __m512 neg_inf = _mm512_set1_ps(kNegInf);
      vfloat vsum = vfloat{};
      for (int64_t j = 0; j < np; j += kVec) {
        const __m512 x = _mm512_load_ps(sr + j);
        const __mmask16 seen = _mm512_cmp_ps_mask(x, neg_inf, _CMP_NEQ_UQ);  // a NaN score stays NaN, as before
        const __m512 u = _mm512_fmadd_ps(x, to_u, u0);
        const __m512 nu = _mm512_roundscale_ps(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 f = _mm512_sub_ps(u, nu);
        const __m512 q = cpu_vmath::exp2_taylor<5>(f);
        const __m512 e = _mm512_maskz_scalef_ps(seen, q, nu);
        const __m256i b = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + j), b);
        vsum += reinterpret_cast<vfloat>(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
      }
      const float alpha = m_old == kNegInf ? 0.f : vexp(vfloat{} + (m_old - m_new))[0];
      st.l[i] = st.l[i] * alpha + hsum(vsum);
      st.m[i] = m_new;
      if (alpha != 1.f) {
        float* acc = st.acc.data() + i * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
      }
    }
    // acc [LP, D] += P V
    for (int64_t i0 = 0; i0 < LP; i0 += 32) {
      for (int64_t d0 = 0; d0 < D; d0 += 32) {
        const uint16_t* vb = pk.vp.data() + (rel / 32) * DB * 512 + (d0 / 16) * 512;
        float* ab = st.acc.data() + i0 * D + d0;
        if (LP - i0 == 16)
          Ops::template pv<1>(p.data() + i0 * kPairKeys, np, vb, DB, lanes - i0, ab, D);
        else
          Ops::template pv<2>(p.data() + i0 * kPairKeys, np, vb, DB, lanes - i0, ab, D);
      }
    }
    t0 = t1;
  }
  Ops::end();
}

enum class PairIsa { kNone, kAmx, kDots };

void pair_attend(PairIsa isa, const TileArgs& a, const PairPacked& pk, const uint16_t* q, int64_t lanes, int64_t LP,
                 const int64_t* lo, const int64_t* hi, int64_t key_lo, int64_t key_hi, Softmax& st) {
#if defined(ATTN_AMX_BF16)
  if (isa == PairIsa::kAmx) return attend_pairs<AmxTiles>(a, pk, q, lanes, LP, lo, hi, key_lo, key_hi, st);
#endif
  (void)isa;
  attend_pairs<Bf16Dots>(a, pk, q, lanes, LP, lo, hi, key_lo, key_hi, st);
}
#else
// Without tiles decode packs nothing, so it keeps nothing.
std::vector<int64_t> kept_packings_check() { return {0, 0}; }
void drop_kept_packings() {}
#endif

// Whether the extend and decode kernels run a launch on bf16 pairs, and on what: bf16 queries; a bf16 or fp8 pool;
// head_dim a multiple of 32; IMPL_CPU_ATTN_BF16 not false; then AMX-bf16 tiles where the CPU and the build have them
// and IMPL_CPU_AMX is not false, else VDPBF16PS where the build has AVX512-BF16 (-march=native on such a CPU).
#if defined(ATTN_BF16_PAIRS)
PairIsa pair_isa(at::ScalarType q, at::ScalarType kv, int64_t D) {
  static const bool allowed = !cpu_amx::env_false("IMPL_CPU_ATTN_BF16");
  if (!allowed || q != torch::kBFloat16 || !(kv == torch::kBFloat16 || is_fp8(kv)) || D % 32 != 0) return PairIsa::kNone;
#if defined(ATTN_AMX_BF16)
  if (cpu_amx::tiles_allowed()) return PairIsa::kAmx;
#endif
  return PairIsa::kDots;
}
#endif

// The SIMD width the kernels were compiled for (-march: native, or IMPL_CPU_MARCH).
std::string simd_isa() { return cpu_isa::simd_width("generic"); }

std::string extend_isa(at::ScalarType q, at::ScalarType kv, int64_t D) {
#if defined(ATTN_BF16_PAIRS)
  switch (pair_isa(q, kv, D)) {
    case PairIsa::kAmx:
      return "amx_bf16";
    case PairIsa::kDots:
      return "avx512_bf16";
    case PairIsa::kNone:
      break;
  }
#else
  (void)q, (void)kv, (void)D;
#endif
  return simd_isa();
}

// Keys per tile: about 128 KB of float32 K (and as much V) per tile.
inline int64_t tile_keys(int64_t D) { return std::clamp<int64_t>(32768 / D, 32, 512); }

// Read where it lies: int32 index tensors (indptrs, kv_indices) are widened element by element, not through
// a converted copy per layer (an aten::_to_copy each).
std::vector<int64_t> as_i64(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 1 && !t.is_floating_point(), what, " must be a 1-D integer tensor");
  std::vector<int64_t> out(t.numel());
  const int64_t stride = t.stride(0);
  if (t.scalar_type() == torch::kInt32) {
    const int32_t* p = t.data_ptr<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = p[i * stride];
  } else if (t.scalar_type() == torch::kInt64) {
    const int64_t* p = t.data_ptr<int64_t>();
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = p[i * stride];
  } else {
    auto c = t.to(torch::kInt64).contiguous();
    std::copy(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel(), out.begin());
  }
  return out;
}

// A 1-D integer tensor's values as int64, for the long ones (kv_indices: every key of the batch, ~20K entries a
// 32-request decode launch, 35 launches a step): the tensor's own memory when it is contiguous int64 (what the
// metadata builds), else as_i64's copy.
struct I64Values {
  std::vector<int64_t> own;
  const int64_t* p = nullptr;
  int64_t n = 0;
  I64Values(const torch::Tensor& t, const char* what) {
    if (t.dim() == 1 && t.scalar_type() == torch::kInt64 && (t.stride(0) == 1 || t.numel() <= 1)) {
      p = t.data_ptr<int64_t>();
      n = t.numel();
    } else {
      own = as_i64(t, what);
      p = own.data();
      n = static_cast<int64_t>(own.size());
    }
  }
  I64Values(const I64Values&) = delete;
  I64Values& operator=(const I64Values&) = delete;
  const int64_t* data() const { return p; }
  int64_t size() const { return n; }
};

void check_args(const torch::Tensor& q, const torch::Tensor& o, const torch::Tensor& k_buf, const torch::Tensor& v_buf) {
  for (const auto* t : {&q, &o, &k_buf, &v_buf}) {
    TORCH_CHECK(t->device().is_cpu(), "CPU attention kernels take CPU tensors");
    TORCH_CHECK(t->dim() == 3 && t->stride(2) == 1, "q/o/K/V must be 3-D and contiguous in head_dim");
  }
  TORCH_CHECK(o.scalar_type() == q.scalar_type(), "q and o must share one dtype");
  TORCH_CHECK(v_buf.scalar_type() == k_buf.scalar_type(), "the K and V buffers must share one dtype");
  TORCH_CHECK(k_buf.scalar_type() == q.scalar_type() || is_fp8(k_buf.scalar_type()) ||
                  (q.scalar_type() == torch::kFloat32 &&
                   (k_buf.scalar_type() == torch::kBFloat16 || k_buf.scalar_type() == torch::kFloat16)),
              "the K/V buffers must have q's dtype, be fp8 (float8_e4m3fn / float8_e5m2), or be bfloat16 / float16 "
              "under float32 queries");
  TORCH_CHECK(o.sizes() == q.sizes(), "o must have q's shape");
  TORCH_CHECK(v_buf.sizes() == k_buf.sizes() && k_buf.size(2) == q.size(2), "K/V buffers must be [capacity, KVH, D]");
  TORCH_CHECK(k_buf.size(1) > 0 && q.size(1) % k_buf.size(1) == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(v_buf.strides() == k_buf.strides(), "K and V buffers must share strides");
}

// Calls f(T{}, S{}) with T the q / o element type and S the K/V storage type (q's, or an fp8 type).
template <typename F>
void dispatch_types(const torch::Tensor& q, const torch::Tensor& k_buf, const F& f) {
  auto with_kv = [&](auto t) {
    using T = decltype(t);
    switch (k_buf.scalar_type()) {
      case torch::kFloat8_e4m3fn:
        f(T{}, c10::Float8_e4m3fn{});
        break;
      case torch::kFloat8_e5m2:
        f(T{}, c10::Float8_e5m2{});
        break;
      default:
        if constexpr (std::is_same_v<T, float>) {  // float32 queries also read bfloat16 / float16 pools
          if (k_buf.scalar_type() == torch::kBFloat16) return f(T{}, at::BFloat16{});
          if (k_buf.scalar_type() == torch::kFloat16) return f(T{}, at::Half{});
        }
        f(T{}, T{});  // check_args: the pool has q's dtype
    }
  };
  switch (q.scalar_type()) {
    case torch::kFloat32:
      with_kv(float{});
      break;
    case torch::kBFloat16:
      with_kv(at::BFloat16{});
      break;
    case torch::kFloat16:
      with_kv(at::Half{});
      break;
    default:
      TORCH_CHECK(false, "CPU attention kernels take float32, bfloat16 or float16 queries, got ", q.scalar_type());
  }
}

// ---------------------------------------------------------------- extend

// Request b: query rows qo[b]..qo[b+1] at positions qpos, keys 0..kv_lens[b]-1 at pool slots slots[b][0..].
template <typename T, typename S>
void extend_impl(const torch::Tensor& q, torch::Tensor& o, const torch::Tensor& k_buf, const torch::Tensor& v_buf,
                 const std::vector<int64_t>& qo, const std::vector<int64_t>& qpos,
                 const std::vector<const int64_t*>& slots, const std::vector<int64_t>& kv_lens, const TileArgs& args,
                 int64_t window) {
  const int64_t B = static_cast<int64_t>(qo.size()) - 1, H = q.size(1), D = q.size(2), Hkv = k_buf.size(1);
  const int64_t G = H / Hkv;
  const int64_t rows_per_item = std::max<int64_t>(1, 128 / G);  // about 128 query vectors share each K/V tile
  const int64_t BN = tile_keys(D);
  struct Item {
    int64_t b, h, r0, r1, lo, hi;  // request, KV head, its query rows [r0, r1), keys [lo, hi) they can see
  };
  std::vector<Item> items;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t kv_len = kv_lens[b];
    for (int64_t r0 = qo[b]; r0 < qo[b + 1]; r0 += rows_per_item) {
      const int64_t r1 = std::min(r0 + rows_per_item, qo[b + 1]);
      int64_t pmin = std::numeric_limits<int64_t>::max(), pmax = -1;
      for (int64_t r = r0; r < r1; ++r) {
        pmin = std::min(pmin, qpos[r]);
        pmax = std::max(pmax, qpos[r]);
      }
      const int64_t hi = std::min(pmax + 1, kv_len), lo = window > 0 ? std::max<int64_t>(0, pmin - window + 1) : 0;
      for (int64_t h = 0; h < Hkv; ++h) items.push_back({b, h, r0, r1, lo, std::max(lo, hi)});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) {
    return (x.hi - x.lo) * (x.r1 - x.r0) > (y.hi - y.lo) * (y.r1 - y.r0);
  });
  const T* qd = q.data_ptr<T>();
  T* od = o.data_ptr<T>();
  const int64_t sq0 = q.stride(0), sq1 = q.stride(1), so0 = o.stride(0), so1 = o.stride(1);
  // A lane's output from its softmax state: acc / l times the V scale (a row that sees no key: zeros).
  auto write_out = [&](const Item& it, const Softmax& st) {
    for (int64_t r = it.r0; r < it.r1; ++r) {
      for (int64_t g = 0; g < G; ++g) {
        const int64_t lane = (r - it.r0) * G + g;
        const float inv = st.l[lane] > 0.f ? args.v_scale / st.l[lane] : 0.f;
        const float* acc = st.acc.data() + lane * D;
        T* dst = od + r * so0 + (it.h * G + g) * so1;
        out_row(dst, acc, inv, D);
      }
    }
  };
  auto lane_range = [&](int64_t r, int64_t kv_len, int64_t* lo, int64_t* hi) {
    *hi = std::min(qpos[r] + 1, kv_len);
    *lo = window > 0 ? std::max<int64_t>(0, qpos[r] - window + 1) : 0;
  };
#if defined(ATTN_BF16_PAIRS)
  if constexpr (kPairTypes<T, S>) {
    if (const PairIsa isa = pair_isa(q.scalar_type(), k_buf.scalar_type(), D); isa != PairIsa::kNone) {
      const auto packed = pair_pack_requests<S>(k_buf, v_buf, slots, items, args);  // each request's keys, once
      run_items(static_cast<int64_t>(items.size()), [&](int64_t idx) {
        const Item& it = items[idx];
        const int64_t lanes = (it.r1 - it.r0) * G, LP = round_up(lanes, 32);
        thread_local avector<uint16_t> qb;
        thread_local std::vector<int64_t> lo, hi;
        thread_local Softmax st;
        qb.assign(LP * D, 0);  // Q [LP, D] bf16, padding lanes zero
        lo.resize(lanes);
        hi.resize(lanes);
        st.reset(LP, D);
        for (int64_t r = it.r0; r < it.r1; ++r) {
          for (int64_t g = 0; g < G; ++g) {
            const int64_t lane = (r - it.r0) * G + g;
            std::memcpy(qb.data() + lane * D, qd + r * sq0 + (it.h * G + g) * sq1, D * sizeof(T));
            lane_range(r, kv_lens[it.b], &lo[lane], &hi[lane]);
          }
        }
        if (it.hi > it.lo) pair_attend(isa, args, *(*packed)[it.b * Hkv + it.h], qb.data(), lanes, LP, lo.data(), hi.data(), it.lo, it.hi, st);
        write_out(it, st);
      });
      return;
    }
  }
#endif
  run_items(static_cast<int64_t>(items.size()), [&](int64_t idx) {
    const Item& it = items[idx];
    const int64_t lanes = (it.r1 - it.r0) * G, LP = round_up(lanes, kVec);
    thread_local avector<float> qt, kbuf, vbuf, sbuf;
    thread_local std::vector<int64_t> lo, hi;
    thread_local Softmax st;
    qt.assign(D * LP, 0.f);  // Q^T [D, LP]
    kbuf.resize(BN * D);
    vbuf.resize(BN * D);
    sbuf.resize(BN * LP);
    lo.resize(lanes);
    hi.resize(lanes);
    st.reset(LP, D);
    const int64_t kv_len = kv_lens[it.b];
    for (int64_t r = it.r0; r < it.r1; ++r) {
      for (int64_t g = 0; g < G; ++g) {
        const int64_t lane = (r - it.r0) * G + g;
        const T* src = qd + r * sq0 + (it.h * G + g) * sq1;
        for (int64_t d = 0; d < D; ++d) qt[d * LP + lane] = to_f32(src[d]);
        lane_range(r, kv_len, &lo[lane], &hi[lane]);
      }
    }
    attend_keys<S>(args, k_buf, v_buf, it.h, slots[it.b], it.lo, it.hi, BN, qt.data(), lanes, LP, lo.data(), hi.data(),
                   kbuf.data(), vbuf.data(), sbuf.data(), st);
    write_out(it, st);
  });
}

// ---------------------------------------------------------------- decode

template <typename T, typename S>
void decode_impl(const torch::Tensor& q, torch::Tensor& o, const torch::Tensor& k_buf, const torch::Tensor& v_buf,
                 const std::vector<int64_t>& qpos, const std::vector<int64_t>& kvp, const int64_t* kvi,
                 const std::vector<int64_t>& splits, int64_t max_splits, const TileArgs& args, int64_t window) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_buf.size(1), G = H / Hkv;
  const int64_t BN = tile_keys(D);
  const bool direct = max_splits == 1;
  // Partial outputs (normalised) and log-sum-exps of every split: [B, H, S, D] and [B, H, S].
  avector<float> mid_o(direct ? 0 : B * H * max_splits * D), mid_lse(direct ? 0 : B * H * max_splits);
  struct Item {
    int64_t b, h, s, lo, hi;
  };
  std::vector<Item> items;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(splits[b] >= 1 && splits[b] <= max_splits, "num_kv_splits[", b, "] = ", splits[b],
                " outside 1..max_kv_splits (", max_splits, ")");
    const int64_t kv_len = kvp[b + 1] - kvp[b], p = qpos[b];
    const int64_t hi = std::min(p + 1, kv_len), lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
    const int64_t len = std::max<int64_t>(0, hi - lo), split_len = (len + splits[b] - 1) / splits[b];
    for (int64_t s = 0; s < splits[b]; ++s) {
      const int64_t s_lo = lo + s * split_len, s_hi = std::min(s_lo + split_len, hi);
      for (int64_t h = 0; h < Hkv; ++h) items.push_back({b, h, s, s_lo, std::max(s_lo, s_hi)});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.hi - x.lo > y.hi - y.lo; });
  const T* qd = q.data_ptr<T>();
  T* od = o.data_ptr<T>();
  // An item's G heads from its softmax state: the output (one split) or the split's partial output and LSE.
  auto finish = [&](const Item& it, const Softmax& st) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t head = it.h * G + g;
      const bool nonempty = st.l[g] > 0.f;
      const float inv = nonempty ? args.v_scale / st.l[g] : 0.f;
      const float* acc = st.acc.data() + g * D;
      if (direct) {
        T* dst = od + it.b * o.stride(0) + head * o.stride(1);
        out_row(dst, acc, inv, D);
      } else {
        float* dst = mid_o.data() + ((it.b * H + head) * max_splits + it.s) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = acc[d] * inv;
        mid_lse[(it.b * H + head) * max_splits + it.s] = nonempty ? st.m[g] + std::log(st.l[g]) : kNegInf;
      }
    }
  };
  bool tiles = false;
#if defined(ATTN_BF16_PAIRS)
  // Where the extend kernel runs on bf16 pairs, decode does too, with the same arithmetic on the same key grid: one
  // query over one split gets the extend kernel's bits for that row (fast prefill's back half sends its selected
  // rows here when each request has one, and its parity with the full prefill rests on it).
  if constexpr (kPairTypes<T, S>) {
    const PairIsa isa = pair_isa(q.scalar_type(), k_buf.scalar_type(), D);
    tiles = isa != PairIsa::kNone;
    if (tiles) {
      std::vector<const int64_t*> slots(B);
      for (int64_t b = 0; b < B; ++b) slots[b] = kvi + kvp[b];
      const auto packed = pair_pack_requests<S>(k_buf, v_buf, slots, items, args);
      run_items(static_cast<int64_t>(items.size()), [&](int64_t idx) {
        const Item& it = items[idx];
        const int64_t LP = round_up(G, 16);  // a 16-row tile holds E2B's 8 heads (a lane's bits never depend on LP)
        thread_local avector<uint16_t> qb;
        thread_local std::vector<int64_t> lo, hi;
        thread_local Softmax st;
        qb.assign(LP * D, 0);
        lo.assign(G, it.lo);
        hi.assign(G, it.hi);
        st.reset(LP, D);
        for (int64_t g = 0; g < G; ++g)
          std::memcpy(qb.data() + g * D, qd + it.b * q.stride(0) + (it.h * G + g) * q.stride(1), D * sizeof(T));
        if (it.hi > it.lo) pair_attend(isa, args, *(*packed)[it.b * Hkv + it.h], qb.data(), G, LP, lo.data(), hi.data(), it.lo, it.hi, st);
        finish(it, st);
      });
    }
  }
#endif
  if (!tiles) {
    run_items(static_cast<int64_t>(items.size()), [&](int64_t idx) {
      const Item& it = items[idx];
      thread_local avector<float> qt, kbuf, vbuf, sbuf;
      thread_local std::vector<int64_t> lo, hi;
      thread_local Softmax st;
      const int64_t LP = round_up(G, kVec);
      qt.assign(D * LP, 0.f);  // Q^T [D, LP]
      kbuf.resize(BN * D);
      vbuf.resize(BN * D);
      sbuf.resize(BN * LP);
      lo.assign(G, it.lo);
      hi.assign(G, it.hi);
      st.reset(LP, D);
      for (int64_t g = 0; g < G; ++g) {
        const T* src = qd + it.b * q.stride(0) + (it.h * G + g) * q.stride(1);
        for (int64_t d = 0; d < D; ++d) qt[d * LP + g] = to_f32(src[d]);
      }
      attend_keys<S>(args, k_buf, v_buf, it.h, kvi + kvp[it.b], it.lo, it.hi, BN, qt.data(), G, LP, lo.data(),
                     hi.data(), kbuf.data(), vbuf.data(), sbuf.data(), st);
      finish(it, st);
    });
  }
  if (direct) return;
  // Merge the splits of each (request, head) by their log-sum-exp (an empty split has weight 0).
  at::parallel_for(0, B * H, 16, [&](int64_t begin, int64_t end) {
    avector<float> acc(D);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* lse = mid_lse.data() + bh * max_splits;
      float m = kNegInf;
      for (int64_t s = 0; s < splits[b]; ++s) m = std::max(m, lse[s]);
      std::fill(acc.begin(), acc.end(), 0.f);
      float denom = 0.f;
      if (m != kNegInf) {
        for (int64_t s = 0; s < splits[b]; ++s) {
          if (lse[s] == kNegInf) continue;
          const float w = std::exp(lse[s] - m);
          const float* part = mid_o.data() + (bh * max_splits + s) * D;
          denom += w;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) acc[d] += w * part[d];
        }
      }
      const float inv = denom > 0.f ? 1.f / denom : 0.f;
      T* dst = od + b * o.stride(0) + h * o.stride(1);
      out_row(dst, acc.data(), inv, D);
    }
  });
}

}  // namespace

// The launch's scalars as the tile loop reads them; slot_map (an int64 tensor, empty for none) maps the
// slots the metadata names to the buffers' rows (the hybrid pool's full -> sliding-window slots).
TileArgs tile_args(const torch::Tensor& q, double sm_scale, double logit_cap, double k_scale, double v_scale,
                   const torch::Tensor& slot_map) {
  TORCH_CHECK(k_scale > 0 && v_scale > 0, "KV scales must be positive, got ", k_scale, " / ", v_scale);
  const bool mapped = slot_map.defined() && slot_map.numel() > 0;
  if (mapped) {
    TORCH_CHECK(slot_map.scalar_type() == torch::kInt64 && slot_map.dim() == 1 && slot_map.is_contiguous() &&
                    slot_map.device().is_cpu(),
                "slot_map must be a contiguous 1-D int64 CPU tensor");
  }
  return TileArgs{q.size(2), static_cast<float>(sm_scale * k_scale), static_cast<float>(logit_cap),
                  static_cast<float>(v_scale), mapped ? slot_map.data_ptr<int64_t>() : nullptr,
                  mapped ? slot_map.numel() : 0};
}

void extend_dispatch(const torch::Tensor& q, torch::Tensor& o, const torch::Tensor& k_buf, const torch::Tensor& v_buf,
                     const std::vector<int64_t>& qo, const std::vector<int64_t>& qpos,
                     const std::vector<const int64_t*>& slots, const std::vector<int64_t>& kv_lens, const TileArgs& args,
                     int64_t window) {
  dispatch_types(q, k_buf, [&](auto t, auto s) {
    extend_impl<decltype(t), decltype(s)>(q, o, k_buf, v_buf, qo, qpos, slots, kv_lens, args, window);
  });
}

void extend_attention(torch::Tensor q, torch::Tensor o, torch::Tensor k_buf, torch::Tensor v_buf,
                      torch::Tensor qo_indptr, torch::Tensor q_positions, torch::Tensor kv_indptr,
                      torch::Tensor kv_indices, double sm_scale, int64_t window, double logit_cap, double k_scale,
                      double v_scale, int64_t pack_epoch) {
  check_args(q, o, k_buf, v_buf);
  const auto qo = as_i64(qo_indptr, "qo_indptr"), qpos = as_i64(q_positions, "q_positions");
  const auto kvp = as_i64(kv_indptr, "kv_indptr");
  const I64Values kvi(kv_indices, "kv_indices");
  TORCH_CHECK(qo.size() == kvp.size() && !qo.empty(), "qo_indptr and kv_indptr must both have batch + 1 entries");
  TORCH_CHECK(qo.front() == 0 && qo.back() <= q.size(0) && static_cast<int64_t>(qpos.size()) == q.size(0),
              "qo_indptr / q_positions do not match q's rows");
  TORCH_CHECK(kvp.front() >= 0 && kvp.back() <= kvi.size(), "kv_indptr runs past kv_indices");
  std::vector<const int64_t*> slots;
  std::vector<int64_t> kv_lens;
  for (size_t b = 0; b + 1 < qo.size(); ++b) {
    TORCH_CHECK(qo[b + 1] >= qo[b] && kvp[b + 1] >= kvp[b], "indptr arrays must be non-decreasing");
    slots.push_back(kvi.data() + kvp[b]);
    kv_lens.push_back(kvp[b + 1] - kvp[b]);
  }
  TileArgs args = tile_args(q, sm_scale, logit_cap, k_scale, v_scale, torch::Tensor());
  args.pack_epoch = pack_epoch;
  extend_dispatch(q, o, k_buf, v_buf, qo, qpos, slots, kv_lens, args, window);
}

// Attention of query rows over the paged KV pool through req_to_token (torch_native's metadata): row i
// is at position q_pos[i] of request row row_req[i] and sees positions max(0, p - window + 1) .. p
// (window <= 0: 0 .. p) at slots req_to_token[row_req[i], .], mapped through slot_map when it is not
// empty. Runs of consecutive rows of one request share work items as extend rows do. q [n, H, D];
// returns [n, H, D] in q's dtype.
torch::Tensor rows_attention(torch::Tensor q, torch::Tensor k_buf, torch::Tensor v_buf, torch::Tensor req_to_token,
                             torch::Tensor row_req, torch::Tensor q_pos, int64_t window, double sm_scale,
                             double logit_cap, double k_scale, double v_scale, torch::Tensor slot_map) {
  q = q.contiguous();
  auto o = torch::empty_like(q);
  check_args(q, o, k_buf, v_buf);
  TORCH_CHECK(req_to_token.scalar_type() == torch::kInt64 && req_to_token.dim() == 2 && req_to_token.stride(1) == 1,
              "req_to_token must be int64 [R, M] with contiguous rows");
  const auto rr = as_i64(row_req, "row_req"), qpos = as_i64(q_pos, "q_pos");
  const int64_t n = q.size(0), R = req_to_token.size(0), M = req_to_token.size(1);
  TORCH_CHECK(static_cast<int64_t>(rr.size()) == n && static_cast<int64_t>(qpos.size()) == n,
              "row_req / q_pos must have one entry per query row");
  const int64_t* r2t = req_to_token.data_ptr<int64_t>();
  std::vector<int64_t> qo{0};
  std::vector<const int64_t*> slots;
  std::vector<int64_t> kv_lens;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(rr[i] >= 0 && rr[i] < R, "row_req ", rr[i], " outside req_to_token's ", R, " rows");
    TORCH_CHECK(qpos[i] >= 0 && qpos[i] < M, "query position ", qpos[i], " outside req_to_token's ", M, " columns");
    if (i == 0 || rr[i] != rr[i - 1]) {  // a new run of rows of one request
      if (i > 0) qo.push_back(i);
      slots.push_back(r2t + rr[i] * req_to_token.stride(0));
      kv_lens.push_back(0);
    }
    kv_lens.back() = std::max(kv_lens.back(), qpos[i] + 1);
  }
  qo.push_back(n);
  const TileArgs args = tile_args(q, sm_scale, logit_cap, k_scale, v_scale, slot_map);
  if (n > 0) extend_dispatch(q, o, k_buf, v_buf, qo, qpos, slots, kv_lens, args, window);
  return o;
}

void decode_attention(torch::Tensor q, torch::Tensor o, torch::Tensor k_buf, torch::Tensor v_buf,
                      torch::Tensor q_positions, torch::Tensor kv_indptr, torch::Tensor kv_indices,
                      torch::Tensor num_kv_splits, int64_t max_kv_splits, double sm_scale, int64_t window,
                      double logit_cap, double k_scale, double v_scale, int64_t pack_epoch, int64_t kv_generation) {
  check_args(q, o, k_buf, v_buf);
  TORCH_CHECK(kv_generation >= 0, "kv_generation must be >= 0 (0: nothing kept across launches)");
  const auto qpos = as_i64(q_positions, "q_positions"), kvp = as_i64(kv_indptr, "kv_indptr");
  const I64Values kvi(kv_indices, "kv_indices");
  const auto splits = as_i64(num_kv_splits, "num_kv_splits");
  const int64_t B = q.size(0);
  TORCH_CHECK(static_cast<int64_t>(qpos.size()) == B && static_cast<int64_t>(kvp.size()) == B + 1 &&
                  static_cast<int64_t>(splits.size()) == B,
              "decode: q_positions / num_kv_splits need one entry per request, kv_indptr batch + 1");
  TORCH_CHECK(max_kv_splits >= 1, "max_kv_splits must be >= 1");
  TORCH_CHECK(kvp.front() >= 0 && kvp.back() <= kvi.size(), "kv_indptr runs past kv_indices");
  TileArgs args = tile_args(q, sm_scale, logit_cap, k_scale, v_scale, torch::Tensor());
  args.pack_epoch = pack_epoch;
  args.kv_generation = kv_generation;
  dispatch_types(q, k_buf, [&](auto t, auto s) {
    decode_impl<decltype(t), decltype(s)>(q, o, k_buf, v_buf, qpos, kvp, kvi.data(), splits, max_kv_splits, args, window);
  });
}

// The kernels touch no Python object: they run with the GIL released, so a server's other Python threads
// (HTTP handlers, the detokenizer) run meanwhile instead of taking the GIL from the scheduler thread
// between its kernel calls.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using release = py::call_guard<py::gil_scoped_release>;
  m.def("extend_attention", &extend_attention, "extend attention over the paged KV pool (CPU, fp32 accumulation)",
        release());
  m.def("decode_attention", &decode_attention, "split-KV decode attention over the paged KV pool (CPU)", release());
  m.def("kept_packings_check", &kept_packings_check, "{entries, bytes} of the bf16-pair packings decode keeps across "
        "steps, after checking they are consistent");
  m.def("drop_kept_packings", &drop_kept_packings, "drop every bf16-pair packing decode keeps across steps");
  m.def("rows_attention", &rows_attention, "query rows over the paged KV pool through req_to_token (CPU)", release());
  m.def("extend_isa", &extend_isa, "the instructions the extend and decode kernels run a launch of these dtypes "
        "and head_dim on (amx_bf16 tiles, avx512_bf16 pair products, or the build's float32 SIMD)");
  m.def("simd_isa", &simd_isa, "the SIMD width the kernels were compiled for (-march: native, or IMPL_CPU_MARCH)");
}
