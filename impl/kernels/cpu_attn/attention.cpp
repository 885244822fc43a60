// CPU extend and decode attention over the paged KV pool: the triton backend's kernels, compiled for CPU.
//
// They read exactly the metadata the Triton kernels read (impl/attention/triton_metadata.py):
// request b owns query rows qo_indptr[b]..qo_indptr[b+1] at absolute positions q_positions, and keys
// 0..kv_len_b-1 stored at slots kv_indices[kv_indptr[b]..kv_indptr[b+1]]. A query at position p sees
// key j iff j <= p and, with a window W > 0, j > p - W. Scores are sm_scale * q.k, optionally
// cap * tanh(s / cap); softmax and the output accumulate in float32 for every pool dtype.
//
// Work is cut into tiles over the keys, not per-key loops: a work item holds `lanes` query vectors
// (query rows x the G query heads of one KV head, so each K/V tile is read once for the group),
// gathers a tile of keys through kv_indices into a transposed float32 buffer K^T [D, keys] (and V
// into [keys, D], or points at the pool when the slots are consecutive float32 rows), and runs
// S = Q K^T and O += P V as register-blocked micro-kernels (8 query vectors x 2 SIMD vectors of keys
// or of head_dim per block, written with GCC vector types: AVX-512 where the CPU has it, else AVX2)
// with an online softmax in between. (They replaced BLAS sgemm calls: MKL keeps to AVX2 off Intel
// and costs more in call overhead than these thin products take.) Items run on ATen's thread pool,
// largest first, pulled from a shared counter (causal rows differ in cost by up to the context
// length, so a static split would idle a thread).
//
// Decode: one query per request, its visible keys cut into num_kv_splits[b] equal splits (the same
// rule as the Triton decode kernel); every (request, KV head, split) is an item, and a second pass
// merges the splits' partial outputs by their log-sum-exp.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace {

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

constexpr int64_t kLaneBlk = 8;         // query vectors per micro-kernel block (lanes are padded to it)
constexpr int64_t kKeyBlk = 2 * kVec;   // keys per block of S (key tiles are padded to it)

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

typedef int32_t vint __attribute__((vector_size(kVec * sizeof(int32_t))));

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

// Strided view of one KV head of the pool: row of slot s at base + s * row_stride.
template <typename T>
struct PoolHead {
  const T* base;
  int64_t row_stride;
  int64_t capacity;
};

// Keys [t0, t0 + n) of a request (slots `slots[t0..]`) as a float32 [n, D] matrix; returns the
// pointer and its row stride. float32 rows at consecutive slots are used in place (no copy).
template <typename T>
inline const float* key_tile(const PoolHead<T>& pool, const int64_t* slots, int64_t n, int64_t D, float* buf,
                             int64_t* ld) {
  for (int64_t j = 0; j < n; ++j) {
    TORCH_CHECK(slots[j] >= 0 && slots[j] < pool.capacity, "KV slot ", slots[j], " outside the pool (capacity ",
                pool.capacity, ")");
  }
  if constexpr (std::is_same_v<T, float>) {
    bool consecutive = true;
    for (int64_t j = 1; j < n && consecutive; ++j) consecutive = slots[j] == slots[0] + j;
    if (consecutive) {
      *ld = pool.row_stride;
      return pool.base + slots[0] * pool.row_stride;
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    const T* src = pool.base + slots[j] * pool.row_stride;
    float* dst = buf + j * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) dst[d] = to_f32(src[d]);
  }
  *ld = D;
  return buf;
}

// Row stride of a K^T tile of ns keys: one SIMD vector more than ns, so that the D rows do not all map
// to the same few cache sets (ns is a power of two for full tiles).
inline int64_t kt_stride(int64_t ns) { return ns + kVec; }

// Keys [t0, t0 + n) of a request as K^T [D, ns] float32, rows kt_stride(ns) apart (ns = n rounded up to
// kKeyBlk; columns n..ns-1 zero).
template <typename T>
inline void key_tile_t(const PoolHead<T>& pool, const int64_t* slots, int64_t n, int64_t D, int64_t ns, float* kt) {
  const int64_t ld = kt_stride(ns);
  thread_local std::vector<T> zero_row;
  if (static_cast<int64_t>(zero_row.size()) < D) zero_row.assign(D, T(0.f));
  // kVec keys at a time: for each d one whole SIMD vector (a cache line with AVX-512) of K^T is written,
  // gathered from kVec rows that stay in L1 (column-by-column scalar stores missed the cache per element).
  for (int64_t j0 = 0; j0 < ns; j0 += kVec) {
    const T* rows[kVec];
    for (int64_t j = 0; j < kVec; ++j) {
      if (j0 + j >= n) {
        rows[j] = zero_row.data();
        continue;
      }
      const int64_t slot = slots[j0 + j];
      TORCH_CHECK(slot >= 0 && slot < pool.capacity, "KV slot ", slot, " outside the pool (capacity ", pool.capacity,
                  ")");
      rows[j] = pool.base + slot * pool.row_stride;
    }
    for (int64_t d = 0; d < D; ++d) {
      vfloat x;
      for (int64_t j = 0; j < kVec; ++j) x[j] = to_f32(rows[j][d]);
      vstore(kt + d * ld + j0, x);
    }
  }
}

// s [lanes_pad, ns] = scale * Q K^T: q [lanes_pad, D], kt [D, ns] (rows kt_stride(ns) apart); blocks of
// kLaneBlk queries x kKeyBlk keys accumulate in registers over d.
inline void qk_blocks(const float* q, int64_t lanes_pad, int64_t D, const float* kt, int64_t ns, float scale,
                      float* s) {
  const int64_t ld = kt_stride(ns);
  for (int64_t i0 = 0; i0 < lanes_pad; i0 += kLaneBlk) {
    const float* qb = q + i0 * D;
    for (int64_t j0 = 0; j0 < ns; j0 += kKeyBlk) {
      vfloat a0[kLaneBlk] = {}, a1[kLaneBlk] = {};
      for (int64_t d = 0; d < D; ++d) {
        const vfloat k0 = vload(kt + d * ld + j0), k1 = vload(kt + d * ld + j0 + kVec);
        for (int64_t i = 0; i < kLaneBlk; ++i) {
          const float x = qb[i * D + d];
          a0[i] += x * k0;
          a1[i] += x * k1;
        }
      }
      for (int64_t i = 0; i < kLaneBlk; ++i) {
        vstore(s + (i0 + i) * ns + j0, a0[i] * scale);
        vstore(s + (i0 + i) * ns + j0 + kVec, a1[i] * scale);
      }
    }
  }
}

// acc [lanes_pad, D] += P V over the first n keys: p [lanes_pad, ns], v rows at v + j * ldv. Blocks of
// kLaneBlk queries x 2 (or 1) SIMD vectors of head_dim accumulate in registers over the keys.
inline void pv_blocks(const float* p, int64_t lanes_pad, int64_t ns, int64_t n, const float* v, int64_t ldv, int64_t D,
                      float* acc) {
  if (D % kVec != 0) {  // head_dim not a multiple of the SIMD width (tiny test models): plain loops
    for (int64_t j = 0; j < n; ++j) {
      const float* vr = v + j * ldv;
      for (int64_t i = 0; i < lanes_pad; ++i) {
        const float w = p[i * ns + j];
        float* o = acc + i * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) o[d] += w * vr[d];
      }
    }
    return;
  }
  for (int64_t i0 = 0; i0 < lanes_pad; i0 += kLaneBlk) {
    const float* pb = p + i0 * ns;
    float* ab = acc + i0 * D;
    int64_t d0 = 0;
    for (; d0 + 2 * kVec <= D; d0 += 2 * kVec) {
      vfloat a0[kLaneBlk], a1[kLaneBlk];
      for (int64_t i = 0; i < kLaneBlk; ++i) {
        a0[i] = vload(ab + i * D + d0);
        a1[i] = vload(ab + i * D + d0 + kVec);
      }
      for (int64_t j = 0; j < n; ++j) {
        const vfloat v0 = vload(v + j * ldv + d0), v1 = vload(v + j * ldv + d0 + kVec);
        for (int64_t i = 0; i < kLaneBlk; ++i) {
          const float w = pb[i * ns + j];
          a0[i] += w * v0;
          a1[i] += w * v1;
        }
      }
      for (int64_t i = 0; i < kLaneBlk; ++i) {
        vstore(ab + i * D + d0, a0[i]);
        vstore(ab + i * D + d0 + kVec, a1[i]);
      }
    }
    if (d0 < D) {  // one vector of head_dim left
      vfloat a0[kLaneBlk];
      for (int64_t i = 0; i < kLaneBlk; ++i) a0[i] = vload(ab + i * D + d0);
      for (int64_t j = 0; j < n; ++j) {
        const vfloat v0 = vload(v + j * ldv + d0);
        for (int64_t i = 0; i < kLaneBlk; ++i) a0[i] += pb[i * ns + j] * v0;
      }
      for (int64_t i = 0; i < kLaneBlk; ++i) vstore(ab + i * D + d0, a0[i]);
    }
  }
}

// Online-softmax state of `lanes` query vectors: running max m, denominator l, unnormalised acc.
struct Softmax {
  std::vector<float> m, l, acc;
  void reset(int64_t lanes, int64_t D) {
    m.assign(lanes, kNegInf);
    l.assign(lanes, 0.f);
    acc.assign(lanes * D, 0.f);
  }
};

struct TileArgs {
  int64_t D;
  float scale;
  float cap;  // 0: no logit cap
};

// One key tile [t0, t0 + n) for `lanes` queries q [lanes_pad, D] (rows past `lanes` zero); lane i sees
// keys [lo[i], hi[i]). kt: K^T [D, ns]; s: [lanes_pad, ns] scratch; st holds lanes_pad lanes.
inline void attend_tile(const TileArgs& a, const float* q, int64_t lanes, int64_t lanes_pad, const float* kt,
                        int64_t ns, const float* v, int64_t ldv, int64_t t0, int64_t n, const int64_t* lo,
                        const int64_t* hi, float* s, Softmax& st) {
  const int64_t D = a.D;
  qk_blocks(q, lanes_pad, D, kt, ns, a.scale, s);
  for (int64_t i = 0; i < lanes_pad; ++i) {
    float* row = s + i * ns;
    const int64_t b = i < lanes ? std::clamp<int64_t>(lo[i] - t0, 0, n) : 0;
    const int64_t e = i < lanes ? std::clamp<int64_t>(hi[i] - t0, 0, n) : 0;
    if (b >= e) {  // no visible key in this tile (or a padding lane)
      std::fill(row, row + ns, 0.f);
      continue;
    }
    // Whole SIMD vectors over the padded row; keys outside [b, e) are -inf for the max and 0 after exp.
    if (a.cap > 0.f) {  // cap * tanh(s / cap) = cap * (1 - 2 / (exp(2 s / cap) + 1))
      const float two_over_cap = 2.f / a.cap, cap = a.cap;
      for (int64_t j = 0; j < ns; j += kVec) {
        vstore(row + j, cap - 2.f * cap / (vexp(vload(row + j) * two_over_cap) + 1.f));
      }
    }
    std::fill(row, row + b, kNegInf);
    std::fill(row + e, row + ns, kNegInf);
    vfloat vmax = vfloat{} + kNegInf;
    for (int64_t j = 0; j < ns; j += kVec) {
      const vfloat x = vload(row + j);
      vmax = x > vmax ? x : vmax;
    }
    float mx = kNegInf;
    for (int64_t l = 0; l < kVec; ++l) mx = std::max(mx, vmax[l]);
    const float m_new = std::max(st.m[i], mx);
    for (int64_t j = 0; j < ns; j += kVec) vstore(row + j, vexp(vload(row + j) - m_new));
    std::fill(row, row + b, 0.f);
    std::fill(row + e, row + ns, 0.f);
    vfloat vsum = vfloat{};
    for (int64_t j = 0; j < ns; j += kVec) vsum += vload(row + j);
    float sum = 0.f;
    for (int64_t l = 0; l < kVec; ++l) sum += vsum[l];
    const float alpha = st.m[i] == kNegInf ? 0.f : std::exp(st.m[i] - m_new);
    st.l[i] = st.l[i] * alpha + sum;
    st.m[i] = m_new;
    if (alpha != 1.f) {
      float* acc = st.acc.data() + i * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
    }
  }
  pv_blocks(s, lanes_pad, ns, n, v, ldv, D, st.acc.data());
}

// Keys [key_lo, key_hi) of one request (pool slots `slots`) and KV head `h`, one tile of BN keys at a time,
// for `lanes` query vectors q [lanes_pad, D]; lane i sees keys [lo[i], hi[i]). Scratch: kt [D, BN] (K^T),
// vbuf [BN, D], s [lanes_pad, BN] (BN a multiple of kKeyBlk; kt holds D x kt_stride(BN)).
template <typename T>
void attend_keys(const TileArgs& a, const torch::Tensor& k_buf, const torch::Tensor& v_buf, int64_t h,
                 const int64_t* slots, int64_t key_lo, int64_t key_hi, int64_t BN, const float* q, int64_t lanes,
                 int64_t lanes_pad, const int64_t* lo, const int64_t* hi, float* kt, float* vbuf, float* s,
                 Softmax& st) {
  const int64_t cap_n = k_buf.size(0);
  const PoolHead<T> kh{k_buf.data_ptr<T>() + h * k_buf.stride(1), k_buf.stride(0), cap_n};
  const PoolHead<T> vh{v_buf.data_ptr<T>() + h * v_buf.stride(1), v_buf.stride(0), cap_n};
  for (int64_t t0 = key_lo; t0 < key_hi; t0 += BN) {
    const int64_t n = std::min(BN, key_hi - t0), ns = round_up(n, kKeyBlk);
    int64_t ldv;
    key_tile_t(kh, slots + t0, n, a.D, ns, kt);
    const float* vt = key_tile(vh, slots + t0, n, a.D, vbuf, &ldv);
    attend_tile(a, q, lanes, lanes_pad, kt, ns, vt, ldv, t0, n, lo, hi, s, st);
  }
}

// Keys per tile: about 128 KB of float32 K (and as much V) per tile.
inline int64_t tile_keys(int64_t D) { return round_up(std::clamp<int64_t>(32768 / D, 32, 512), kKeyBlk); }

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

std::vector<int64_t> as_i64(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 1 && !t.is_floating_point(), what, " must be a 1-D integer tensor");
  auto c = t.to(torch::kInt64).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

void check_args(const torch::Tensor& q, const torch::Tensor& o, const torch::Tensor& k_buf, const torch::Tensor& v_buf) {
  for (const auto* t : {&q, &o, &k_buf, &v_buf}) {
    TORCH_CHECK(t->device().is_cpu(), "CPU attention kernels take CPU tensors");
    TORCH_CHECK(t->dim() == 3 && t->stride(2) == 1, "q/o/K/V must be 3-D and contiguous in head_dim");
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "q, o and the K/V buffers must share one dtype");
  }
  TORCH_CHECK(o.sizes() == q.sizes(), "o must have q's shape");
  TORCH_CHECK(v_buf.sizes() == k_buf.sizes() && k_buf.size(2) == q.size(2), "K/V buffers must be [capacity, KVH, D]");
  TORCH_CHECK(k_buf.size(1) > 0 && q.size(1) % k_buf.size(1) == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(v_buf.strides() == k_buf.strides(), "K and V buffers must share strides");
}

// ---------------------------------------------------------------- extend

template <typename T>
void extend_impl(const torch::Tensor& q, torch::Tensor& o, const torch::Tensor& k_buf, const torch::Tensor& v_buf,
                 const std::vector<int64_t>& qo, const std::vector<int64_t>& qpos, const std::vector<int64_t>& kvp,
                 const std::vector<int64_t>& kvi, double sm_scale, int64_t window, double logit_cap) {
  const int64_t B = static_cast<int64_t>(qo.size()) - 1, H = q.size(1), D = q.size(2), Hkv = k_buf.size(1);
  const int64_t G = H / Hkv;
  const int64_t rows_per_item = std::max<int64_t>(1, 128 / G);  // about 128 query vectors share each K/V tile
  const int64_t BN = tile_keys(D);
  struct Item {
    int64_t b, h, r0, r1, lo, hi;  // request, KV head, its query rows [r0, r1), keys [lo, hi) they can see
  };
  std::vector<Item> items;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t kv_len = kvp[b + 1] - kvp[b];
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
  const TileArgs args{D, static_cast<float>(sm_scale), static_cast<float>(logit_cap)};
  run_items(static_cast<int64_t>(items.size()), [&](int64_t idx) {
    const Item& it = items[idx];
    const int64_t lanes = (it.r1 - it.r0) * G, lanes_pad = round_up(lanes, kLaneBlk);
    thread_local std::vector<float> qbuf, kbuf, vbuf, sbuf;
    thread_local std::vector<int64_t> lo, hi;
    thread_local Softmax st;
    qbuf.assign(lanes_pad * D, 0.f);
    kbuf.resize(kt_stride(BN) * D);
    vbuf.resize(BN * D);
    sbuf.resize(lanes_pad * BN);
    lo.resize(lanes);
    hi.resize(lanes);
    st.reset(lanes_pad, D);
    const int64_t kv_len = kvp[it.b + 1] - kvp[it.b];
    for (int64_t r = it.r0; r < it.r1; ++r) {
      const int64_t p = qpos[r];
      for (int64_t g = 0; g < G; ++g) {
        const int64_t lane = (r - it.r0) * G + g;
        const T* src = qd + r * sq0 + (it.h * G + g) * sq1;
        float* dst = qbuf.data() + lane * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = to_f32(src[d]);
        hi[lane] = std::min(p + 1, kv_len);
        lo[lane] = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
      }
    }
    attend_keys<T>(args, k_buf, v_buf, it.h, kvi.data() + kvp[it.b], it.lo, it.hi, BN, qbuf.data(), lanes, lanes_pad,
                   lo.data(), hi.data(), kbuf.data(), vbuf.data(), sbuf.data(), st);
    for (int64_t r = it.r0; r < it.r1; ++r) {
      for (int64_t g = 0; g < G; ++g) {
        const int64_t lane = (r - it.r0) * G + g;
        const float inv = st.l[lane] > 0.f ? 1.f / st.l[lane] : 0.f;  // a row that sees no key: zeros
        const float* acc = st.acc.data() + lane * D;
        T* dst = od + r * so0 + (it.h * G + g) * so1;
        for (int64_t d = 0; d < D; ++d) dst[d] = from_f32<T>(acc[d] * inv);
      }
    }
  });
}

// ---------------------------------------------------------------- decode

template <typename T>
void decode_impl(const torch::Tensor& q, torch::Tensor& o, const torch::Tensor& k_buf, const torch::Tensor& v_buf,
                 const std::vector<int64_t>& qpos, const std::vector<int64_t>& kvp, const std::vector<int64_t>& kvi,
                 const std::vector<int64_t>& splits, int64_t max_splits, double sm_scale, int64_t window,
                 double logit_cap) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_buf.size(1), G = H / Hkv;
  const int64_t BN = tile_keys(D);
  const bool direct = max_splits == 1;
  // Partial outputs (normalised) and log-sum-exps of every split: [B, H, S, D] and [B, H, S].
  std::vector<float> mid_o(direct ? 0 : B * H * max_splits * D), mid_lse(direct ? 0 : B * H * max_splits);
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
  const TileArgs args{D, static_cast<float>(sm_scale), static_cast<float>(logit_cap)};
  run_items(static_cast<int64_t>(items.size()), [&](int64_t idx) {
    const Item& it = items[idx];
    thread_local std::vector<float> qbuf, kbuf, vbuf, sbuf;
    thread_local std::vector<int64_t> lo, hi;
    thread_local Softmax st;
    const int64_t lanes_pad = round_up(G, kLaneBlk);
    qbuf.assign(lanes_pad * D, 0.f);
    kbuf.resize(kt_stride(BN) * D);
    vbuf.resize(BN * D);
    sbuf.resize(lanes_pad * BN);
    lo.assign(G, it.lo);
    hi.assign(G, it.hi);
    st.reset(lanes_pad, D);
    for (int64_t g = 0; g < G; ++g) {
      const T* src = qd + it.b * q.stride(0) + (it.h * G + g) * q.stride(1);
      for (int64_t d = 0; d < D; ++d) qbuf[g * D + d] = to_f32(src[d]);
    }
    attend_keys<T>(args, k_buf, v_buf, it.h, kvi.data() + kvp[it.b], it.lo, it.hi, BN, qbuf.data(), G, lanes_pad,
                   lo.data(), hi.data(), kbuf.data(), vbuf.data(), sbuf.data(), st);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t head = it.h * G + g;
      const bool nonempty = st.l[g] > 0.f;
      const float inv = nonempty ? 1.f / st.l[g] : 0.f;
      const float* acc = st.acc.data() + g * D;
      if (direct) {
        T* dst = od + it.b * o.stride(0) + head * o.stride(1);
        for (int64_t d = 0; d < D; ++d) dst[d] = from_f32<T>(acc[d] * inv);
      } else {
        float* dst = mid_o.data() + ((it.b * H + head) * max_splits + it.s) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = acc[d] * inv;
        mid_lse[(it.b * H + head) * max_splits + it.s] = nonempty ? st.m[g] + std::log(st.l[g]) : kNegInf;
      }
    }
  });
  if (direct) return;
  // Merge the splits of each (request, head) by their log-sum-exp (an empty split has weight 0).
  at::parallel_for(0, B * H, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(D);
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
      for (int64_t d = 0; d < D; ++d) dst[d] = from_f32<T>(acc[d] * inv);
    }
  });
}

}  // namespace

void extend_attention(torch::Tensor q, torch::Tensor o, torch::Tensor k_buf, torch::Tensor v_buf,
                      torch::Tensor qo_indptr, torch::Tensor q_positions, torch::Tensor kv_indptr,
                      torch::Tensor kv_indices, double sm_scale, int64_t window, double logit_cap) {
  check_args(q, o, k_buf, v_buf);
  const auto qo = as_i64(qo_indptr, "qo_indptr"), qpos = as_i64(q_positions, "q_positions");
  const auto kvp = as_i64(kv_indptr, "kv_indptr"), kvi = as_i64(kv_indices, "kv_indices");
  TORCH_CHECK(qo.size() == kvp.size() && !qo.empty(), "qo_indptr and kv_indptr must both have batch + 1 entries");
  TORCH_CHECK(qo.front() == 0 && qo.back() <= q.size(0) && static_cast<int64_t>(qpos.size()) == q.size(0),
              "qo_indptr / q_positions do not match q's rows");
  TORCH_CHECK(kvp.front() >= 0 && kvp.back() <= static_cast<int64_t>(kvi.size()), "kv_indptr runs past kv_indices");
  for (size_t b = 0; b + 1 < qo.size(); ++b) {
    TORCH_CHECK(qo[b + 1] >= qo[b] && kvp[b + 1] >= kvp[b], "indptr arrays must be non-decreasing");
  }
  switch (q.scalar_type()) {
    case torch::kFloat32:
      extend_impl<float>(q, o, k_buf, v_buf, qo, qpos, kvp, kvi, sm_scale, window, logit_cap);
      break;
    case torch::kBFloat16:
      extend_impl<at::BFloat16>(q, o, k_buf, v_buf, qo, qpos, kvp, kvi, sm_scale, window, logit_cap);
      break;
    case torch::kFloat16:
      extend_impl<at::Half>(q, o, k_buf, v_buf, qo, qpos, kvp, kvi, sm_scale, window, logit_cap);
      break;
    default:
      TORCH_CHECK(false, "CPU attention kernels take float32, bfloat16 or float16, got ", q.scalar_type());
  }
}

void decode_attention(torch::Tensor q, torch::Tensor o, torch::Tensor k_buf, torch::Tensor v_buf,
                      torch::Tensor q_positions, torch::Tensor kv_indptr, torch::Tensor kv_indices,
                      torch::Tensor num_kv_splits, int64_t max_kv_splits, double sm_scale, int64_t window,
                      double logit_cap) {
  check_args(q, o, k_buf, v_buf);
  const auto qpos = as_i64(q_positions, "q_positions"), kvp = as_i64(kv_indptr, "kv_indptr");
  const auto kvi = as_i64(kv_indices, "kv_indices"), splits = as_i64(num_kv_splits, "num_kv_splits");
  const int64_t B = q.size(0);
  TORCH_CHECK(static_cast<int64_t>(qpos.size()) == B && static_cast<int64_t>(kvp.size()) == B + 1 &&
                  static_cast<int64_t>(splits.size()) == B,
              "decode: q_positions / num_kv_splits need one entry per request, kv_indptr batch + 1");
  TORCH_CHECK(max_kv_splits >= 1, "max_kv_splits must be >= 1");
  TORCH_CHECK(kvp.front() >= 0 && kvp.back() <= static_cast<int64_t>(kvi.size()), "kv_indptr runs past kv_indices");
  switch (q.scalar_type()) {
    case torch::kFloat32:
      decode_impl<float>(q, o, k_buf, v_buf, qpos, kvp, kvi, splits, max_kv_splits, sm_scale, window, logit_cap);
      break;
    case torch::kBFloat16:
      decode_impl<at::BFloat16>(q, o, k_buf, v_buf, qpos, kvp, kvi, splits, max_kv_splits, sm_scale, window,
                                logit_cap);
      break;
    case torch::kFloat16:
      decode_impl<at::Half>(q, o, k_buf, v_buf, qpos, kvp, kvi, splits, max_kv_splits, sm_scale, window, logit_cap);
      break;
    default:
      TORCH_CHECK(false, "CPU attention kernels take float32, bfloat16 or float16, got ", q.scalar_type());
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("extend_attention", &extend_attention, "extend attention over the paged KV pool (CPU, fp32 accumulation)");
  m.def("decode_attention", &decode_attention, "split-KV decode attention over the paged KV pool (CPU)");
}
