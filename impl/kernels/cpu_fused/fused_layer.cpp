// Fused CPU pieces of one Gemma-4 decoder layer (see impl/kernels/cpu_fused/__init__.py).
//
// On a CPU every ATen op costs a few microseconds of dispatch, allocation and TensorIterator
// setup; a decode step runs ~45 of them per layer on [batch, 64] tensors. These functions run the
// matmuls through `cpu_fused::linear` (linear.cpp: ATen's mm, oneDNN, or the bf16 weights' kernels, as
// impl/kernels/cpu_fused/linear.py plans; the MLP's GELU and gating multiply are one pass, activation.h)
// and do the row-local work (RMSNorm, residual adds, head norms, RoPE, gating) in plain float32 loops,
// one pass per stage, on ATen's OpenMP pool (the build needs -fopenmp: at::parallel_for is an inline
// pragma).
//
// Activations (h, attention output, RoPE tables, per-layer inputs) arrive in float32 or bfloat16; the
// row-local work runs in float32 and the results leave in h's dtype (a bf16 model rounds where the
// eager bf16 model does: q / k / v and the layer output; inside the layer everything stays float32).
//
// Numerics follow the eager path op by op: RMSNorm is (x * rsqrt(mean(x^2) + eps)) * w with the
// sum of squares in float32 (summation order may differ from ATen's: ulp-level differences),
// RoPE is x * cos + rot(x) * sin with both products rounded before the add (built with
// -ffp-contract=off so no FMA fuses them), residual adds and scales as in the eager code.

#include <torch/extension.h>

#include "../cpu_aligned.h"
#include "activation.h"
#include "linear.h"
#include "quant_linear.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using cpu_mem::avector;  // per-row scratch read a vector at a time: 64-byte aligned (cpu_aligned.h)

// Elements of one MLP row block's gate/up output (64K floats = 256 KB: fits a core's L2).
// With MLP weights far larger than that, blocks have at least kMlpMinRowsLargeWeights rows.
constexpr int64_t kMlpBlockElems = int64_t{1} << 16;
constexpr int64_t kMlpMinRowsLargeWeights = 256;
constexpr int64_t kMlpMinOneDnnBlockElems = int64_t{1} << 19;
constexpr int64_t kMlpMinRowsWidened = 512;
// A W8A8 MLP (gate / up and down all W8A8), or one whose gate / up runs the activation in its AMX tiles' epilogue
// (W8A8, W4A8), repacks its weights into AMX tiles per call: blocks of up to 1024 rows (E2B's 1024-token prefill in
// one), the [rows, 2I] or [rows, I] float32 output in a buffer kept between calls (48 MB at E2B's I = 6144: a
// fresh one took a page fault per 4 KB, every layer).
constexpr int64_t kMlpMinRowsW8A8 = 1024;
// A prepacked (oneDNN) MLP takes its down projection over up to this many rows per call, from the gate / up blocks'
// activation rows gathered into one [rows, I] buffer kept between calls: with K = I (6144 or 12288 at E2B), oneDNN's
// AMX kernel streams the down weight from memory per call, at ~1.4 TFLOP/s in 256-row calls and ~1.9 in 1024-row
// ones (E2B's shapes, weights cycled from memory, AMX Xeon: bench/investigations/gemm_shapes.py); gate / up (K =
// hidden) keep their 256-row blocks, their fastest.
constexpr int64_t kMlpDownRows = 1024;

inline float inv_rms(const float* x, int64_t d, float eps) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < d; ++j) s += x[j] * x[j];
  return 1.0f / std::sqrt(s / static_cast<float>(d) + eps);
}

void check_f32(const torch::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(dim < 0 || t.dim() == dim, name, " must have ", dim, " dims");
}

// Row loops run on ATen's intra-op thread pool when torch has several threads (inline with one, or with
// `grain` rows or fewer).
constexpr int64_t kRowGrain = 64;
constexpr int64_t kActGrainElems = 8192;  // elements per thread's share of the MLP activation (gelu_mul_rows)
template <class F>
void for_rows(int64_t n, const F& f, int64_t grain = kRowGrain) {
  if (n <= grain || at::get_num_threads() == 1) {
    f(int64_t{0}, n);
    return;
  }
  at::parallel_for(0, n, grain, f);
}

// Activation rows in float32 or bfloat16. The row-local work always runs on float32 rows: a bf16 row is
// widened into a per-thread scratch row first (exact) and a bf16 result row is rounded from a float32
// scratch row to nearest even, as ATen's float -> bf16 conversion does. So each loop below is the same
// float32 code for every dtype (same summation order, same bits), and the matmuls' bf16 inputs and
// outputs need no whole-tensor conversion passes (a 1024-row prefill layer had ~20 of them).
inline float widen_bf16(uint16_t b) { return __builtin_bit_cast(float, static_cast<uint32_t>(b) << 16); }
// float32 -> bf16 bits, rounded to nearest even (NaN stays NaN)
inline uint16_t narrow_bf16(float v) {
  const uint32_t u = __builtin_bit_cast(uint32_t, v);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
}

struct RowsIn {
  const void* p;
  int64_t ld;  // elements between rows
  bool bf16;
  explicit RowsIn(const torch::Tensor& t)
      : p(t.data_ptr()), ld(t.dim() > 1 ? t.stride(0) : 0), bf16(t.scalar_type() == torch::kBFloat16) {}
  // Row i as float32 (d values): the row itself, or widened into buf.
  const float* row(int64_t i, float* buf, int64_t d) const {
    if (!bf16) return static_cast<const float*>(p) + i * ld;
    const uint16_t* src = static_cast<const uint16_t*>(p) + i * ld;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) buf[j] = widen_bf16(src[j]);
    return buf;
  }
};

struct RowsOut {
  void* p;
  int64_t ld;
  bool bf16;
  explicit RowsOut(torch::Tensor& t)
      : p(t.data_ptr()), ld(t.dim() > 1 ? t.stride(0) : 0), bf16(t.scalar_type() == torch::kBFloat16) {}
  // Where row i's float32 values are written: the row itself, or buf (then `commit`).
  float* row(int64_t i, float* buf) const { return bf16 ? buf : static_cast<float*>(p) + i * ld; }
  void commit(int64_t i, const float* buf, int64_t d) const {
    if (!bf16) return;
    uint16_t* dst = static_cast<uint16_t*>(p) + i * ld;
    int64_t j = 0;  // (act::vstore_bf16: narrow_bf16's bits a vector at a time, one instruction with AVX512-BF16)
    for (; j + cpu_fused::simd::kVec <= d; j += cpu_fused::simd::kVec)
      cpu_fused::act::vstore_bf16(dst + j, cpu_fused::simd::vload(buf + j));
    for (; j < d; ++j) dst[j] = narrow_bf16(buf[j]);
  }
};

// A float32 or bfloat16 activation with unit column stride (row strides are kept).
torch::Tensor act_rows(const torch::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16, name,
              " must be float32 or bfloat16");
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dims");
  return t.stride(-1) == 1 && (dim < 2 || t.stride(0) >= t.size(1)) ? t : t.contiguous();
}

// Activations may arrive as strided views or in bfloat16: a contiguous float32 copy (a no-op when
// already contiguous float32).
torch::Tensor f32_rows(const torch::Tensor& t, const char* name, int64_t dim) {
  return act_rows(t, name, dim).to(torch::kFloat32).contiguous();
}

// x [n, d] -> out [n, d] = rms_norm(x) * w.
void norm_rows(const RowsIn& x, const float* w, const RowsOut& out, int64_t n, int64_t d, float eps) {
  for_rows(n, [&](int64_t lo, int64_t hi) {
    avector<float> bx(d), bo(d);
    for (int64_t i = lo; i < hi; ++i) {
      const float* xr = x.row(i, bx.data(), d);
      float* o = out.row(i, bo.data());
      const float r = inv_rms(xr, d, eps);
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) o[j] = (xr[j] * r) * w[j];
      out.commit(i, o, d);
    }
  });
}

// out [n, d] = (resid + rms_norm(x) * w) * scale; out may be resid. (A scale of 1 is exact.)
void add_norm_rows(const RowsIn& resid, const RowsIn& x, const float* w, const RowsOut& out, int64_t n, int64_t d,
                   float eps, float scale) {
  for_rows(n, [&](int64_t lo, int64_t hi) {
    avector<float> bx(d), br(d), bo(d);
    for (int64_t i = lo; i < hi; ++i) {
      const float* xr = x.row(i, bx.data(), d);
      const float* rr = resid.row(i, br.data(), d);
      float* o = out.row(i, bo.data());
      const float r = inv_rms(xr, d, eps);
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) o[j] = (rr[j] + (xr[j] * r) * w[j]) * scale;
      out.commit(i, o, d);
    }
  });
}

// out [rows, d] = gelu_tanh(g) * u (activation.h), rows with unit column stride (row strides kept; out may be g).
// g, u and out share one dtype: float32 or bf16.
void gelu_mul_rows(const torch::Tensor& g, const torch::Tensor& u, torch::Tensor& out) {
  const int64_t rows = g.size(0), d = g.size(1);
  TORCH_CHECK(g.dim() == 2 && u.sizes() == g.sizes() && out.sizes() == g.sizes(), "gelu_mul_rows: g, u and out must be [rows, d]");
  TORCH_CHECK(u.scalar_type() == g.scalar_type() && out.scalar_type() == g.scalar_type(), "gelu_mul_rows: one dtype");
  const bool bf16 = g.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(bf16 || g.scalar_type() == torch::kFloat32, "gelu_mul_rows takes float32 or bfloat16");
  TORCH_CHECK(g.stride(1) == 1 && u.stride(1) == 1 && out.stride(1) == 1, "gelu_mul_rows takes rows with unit column stride");
  const int64_t es = g.element_size();
  const char* gp = static_cast<const char*>(g.data_ptr());
  const char* up = static_cast<const char*>(u.data_ptr());
  char* op = static_cast<char*>(out.data_ptr());
  const int64_t lg = g.stride(0) * es, lu = u.stride(0) * es, lo_ = out.stride(0) * es;  // row strides in bytes
  // Split by elements, not kRowGrain rows: a decode step's 32 rows of a 2048-wide MLP are 64K tanh evaluations
  // (on one thread: tens of microseconds a layer); each row's values do not depend on which thread computes it.
  const int64_t grain = std::max<int64_t>(1, kActGrainElems / std::max<int64_t>(d, 1));
  for_rows(rows, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (bf16) {
        cpu_fused::act::gelu_mul(reinterpret_cast<const uint16_t*>(gp + i * lg), reinterpret_cast<const uint16_t*>(up + i * lu),
                                 reinterpret_cast<uint16_t*>(op + i * lo_), d);
      } else {
        cpu_fused::act::gelu_mul(reinterpret_cast<const float*>(gp + i * lg), reinterpret_cast<const float*>(up + i * lu),
                                 reinterpret_cast<float*>(op + i * lo_), d);
      }
    }
  }, grain);
}

// codes [rows, d] int8, scales [rows] = W8A8's row quantization (quantize_row) of gelu_tanh(g) * u, float32 rows
// with unit column stride: the activation row in per-thread scratch, never written out.
void gelu_mul_quantize_rows(const torch::Tensor& g, const torch::Tensor& u, torch::Tensor& codes, torch::Tensor& scales) {
  const int64_t rows = g.size(0), d = g.size(1);
  TORCH_CHECK(g.scalar_type() == torch::kFloat32 && u.scalar_type() == torch::kFloat32 && u.sizes() == g.sizes() &&
                  g.stride(1) == 1 && u.stride(1) == 1, "gelu_mul_quantize_rows takes float32 rows [rows, d]");
  TORCH_CHECK(codes.is_contiguous() && codes.sizes() == g.sizes() && scales.is_contiguous() && scales.numel() == rows,
              "gelu_mul_quantize_rows: codes [rows, d], scales [rows]");
  const float* gp = g.data_ptr<float>();
  const float* up = u.data_ptr<float>();
  int8_t* cp = codes.data_ptr<int8_t>();
  float* sp = scales.data_ptr<float>();
  const int64_t lg = g.stride(0), lu = u.stride(0);
  for_rows(rows, [&](int64_t lo, int64_t hi) {
    avector<float> y(d);
    for (int64_t i = lo; i < hi; ++i) {
      cpu_fused::act::gelu_mul(gp + i * lg, up + i * lu, y.data(), d);
      cpu_fused::quantize_row(y.data(), d, cp + i * d, sp + i);
    }
  });
}

using cpu_fused::linear;
using cpu_fused::linear_native;
using cpu_fused::onednn_linear;

}  // namespace

// Input RMSNorm, fused projection, per-head RMSNorm, RoPE.
//   h [n, hidden]; w_in [hidden]; proj_w [(Hq + 2 Hkv) * D, hidden] (q heads, then k, then v);
//   head_w [Hq + 2 Hkv, D] per-head norm scales (v rows all ones); cos / sin_signed [n, D] (sin's
//   first half negated, as rope.prepare_rope makes them). q and k heads get RoPE, v heads do not.
// Returns [q [n, Hq * D], k [n, Hkv * D], v [n, Hkv * D]] (k and v empty when Hkv == 0).
std::vector<torch::Tensor> attn_pre(torch::Tensor h, torch::Tensor w_in, torch::Tensor proj_w, torch::Tensor head_w,
                                    torch::Tensor cos, torch::Tensor sin_signed, int64_t q_heads, double eps,
                                    bool onednn) {
  const auto dtype = h.scalar_type();  // q, k, v leave in h's dtype (the KV pool's)
  h = act_rows(h, "h", 2);
  check_f32(w_in, "w_in", 1);
  check_f32(head_w, "head_w", 2);
  cos = f32_rows(cos, "cos", cos.dim());
  sin_signed = f32_rows(sin_signed, "sin_signed", sin_signed.dim());
  const int64_t n = h.size(0), hidden = h.size(1), heads = head_w.size(0), d = head_w.size(1);
  const int64_t kv_heads = (heads - q_heads) / 2;
  TORCH_CHECK(q_heads > 0 && q_heads + 2 * kv_heads == heads, "head_w must have Hq + 2 Hkv rows");
  TORCH_CHECK(cpu_fused::takes_inputs(proj_w, hidden) && cpu_fused::out_features(proj_w, hidden) == heads * d,
              "proj_w must be [heads * D, hidden]");
  TORCH_CHECK(cos.numel() == n * d && sin_signed.numel() == n * d, "cos / sin must hold [n, D]");
  TORCH_CHECK(d % 2 == 0, "head_dim must be even");
  const float e = static_cast<float>(eps);
  // the normed rows in the dtype the projection multiplies them in (bf16 for oneDNN's bf16 matmul)
  const bool bf16_mm = proj_w.scalar_type() == torch::kBFloat16 && cpu_fused::runs_onednn(proj_w, n, onednn);
  auto x = torch::empty({n, hidden}, h.options().dtype(bf16_mm ? torch::kBFloat16 : torch::kFloat32));
  norm_rows(RowsIn(h), w_in.data_ptr<float>(), RowsOut(x), n, hidden, e);
  auto y = linear_native(x, proj_w, onednn);  // [n, heads * D], float32 or bf16
  const auto out_opts = h.options().dtype(dtype);
  auto q = torch::empty({n, q_heads * d}, out_opts);
  auto k = torch::empty({n, kv_heads * d}, out_opts);
  auto v = torch::empty({n, kv_heads * d}, out_opts);
  const RowsOut dst_rows[3] = {RowsOut(q), RowsOut(k), RowsOut(v)};
  const int64_t first[3] = {0, q_heads, q_heads + kv_heads};
  const int64_t count[3] = {q_heads, kv_heads, kv_heads};
  const RowsIn y_rows(y);
  const float* hw = head_w.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin_signed.data_ptr<float>();
  const int64_t half = d / 2;
  for_rows(n, [&](int64_t lo, int64_t hi) {
    avector<float> t(d), by(heads * d), bo(q_heads * d);  // scratch: one head, one row of y, one output row
    for (int64_t i = lo; i < hi; ++i) {
      const float* c = cp + i * d;
      const float* s = sp + i * d;
      const float* yr = y_rows.row(i, by.data(), heads * d);
      for (int part = 0; part < 3; ++part) {
        if (!count[part]) continue;
        float* dst_row = dst_rows[part].row(i, bo.data());
        for (int64_t k_ = 0; k_ < count[part]; ++k_) {
          const int64_t hh = first[part] + k_;
          const float* src = yr + hh * d;
          float* dst = dst_row + k_ * d;
          const float* w = hw + hh * d;
          const float r = inv_rms(src, d, e);
          if (part == 2) {  // v: normed, no RoPE
#pragma omp simd
            for (int64_t j = 0; j < d; ++j) dst[j] = (src[j] * r) * w[j];
            continue;
          }
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) t[j] = (src[j] * r) * w[j];
#pragma omp simd
          for (int64_t j = 0; j < half; ++j) {
            const float a = t[j] * c[j];
            const float b = t[j + half] * s[j];
            dst[j] = a + b;
          }
#pragma omp simd
          for (int64_t j = half; j < d; ++j) {
            const float a = t[j] * c[j];
            const float b = t[j - half] * s[j];
            dst[j] = a + b;
          }
        }
        dst_rows[part].commit(i, dst_row, count[part] * d);
      }
    }
  });
  return {q, k, v};
}

// Everything after the attention kernel:
//   a = attn_out @ o_w^T;  h1 = h + norm(a) * w_post_attn
//   m = down(gelu_tanh(gate(x)) * up(x)) with x = norm(h1) * w_pre_ff;  h2 = h1 + norm(m) * w_post_ff
//   [PLE] g = gelu_tanh(h2 @ gate_w^T) * ple;  h3 = h2 + norm(g @ proj_w^T) * w_ple_norm
//   return h3 * scalar
// Shapes: h [n, hidden]; attn_out [n, H * D]; o_w [hidden, H * D]; gate_up: [gate_up_w [2I, hidden]]
// (gate rows first; one matmul) or [gate_w [I, hidden], up_w [I, hidden]] (oneDNN); GELU and the gating
// multiply run as one pass over the products (activation.h); down_w [hidden, I]; ple [n, P]; ple_gate_w [P, hidden];
// ple_proj_w [hidden, P]. Any weight may be float32, bfloat16 or oneDNN-prepacked (see linear.h);
// `onednn` sends plain weights through oneDNN too (bf16 ones above the row kernel's row count).
// Returns [n, hidden] in h's dtype.
torch::Tensor decoder_post(torch::Tensor h, torch::Tensor attn_out, torch::Tensor o_w, torch::Tensor w_post_attn,
                           torch::Tensor w_pre_ff, std::vector<torch::Tensor> gate_up, torch::Tensor down_w,
                           torch::Tensor w_post_ff, c10::optional<torch::Tensor> ple, c10::optional<torch::Tensor> ple_gate_w,
                           c10::optional<torch::Tensor> ple_proj_w, c10::optional<torch::Tensor> w_ple_norm,
                           double scalar, double eps, bool onednn) {
  const auto dtype = h.scalar_type();
  h = act_rows(h, "h", 2);
  TORCH_CHECK(attn_out.size(0) == h.size(0), "attn_out must have one row per row of h");
  for (auto* t : {&w_post_attn, &w_pre_ff, &w_post_ff}) check_f32(*t, "norm weight", 1);
  const bool split = gate_up.size() == 2;
  const int64_t n = h.size(0), hid = h.size(1);
  const int64_t gu_rows = cpu_fused::out_features(gate_up[0], hid), inter = split ? gu_rows : gu_rows / 2;
  TORCH_CHECK(cpu_fused::takes_inputs(down_w, inter) && cpu_fused::out_features(down_w, inter) == hid,
              "down_w must be [hidden, I]");
  TORCH_CHECK(gate_up.size() == 1 || split, "gate_up must be [gate_up_w] or [gate_w, up_w]");
  TORCH_CHECK(split ? cpu_fused::out_features(gate_up[1], hid) == inter : gu_rows == 2 * inter,
              "gate_up must be [2 * I, hidden] or two [I, hidden] weights");
  TORCH_CHECK(split || !gate_up[0].is_mkldnn(), "a prepacked gate/up weight must come split in two");
  const float e = static_cast<float>(eps);
  auto a = linear_native(attn_out, o_w, onednn);  // [n, hidden], float32 or bf16
  auto out = torch::empty(h.sizes(), h.options().dtype(torch::kFloat32));  // the residual stream in float32
  add_norm_rows(RowsIn(h), RowsIn(a), w_post_attn.data_ptr<float>(), RowsOut(out), n, hid, e, 1.f);
  // The MLP in blocks of rows, so each block's [rows, 2I] gate/up output is still in cache when
  // GELU, the gating multiply and the down projection read it (a 2048-row prefill chunk with a
  // double-wide MLP would otherwise stream 4 MB through memory three times).
  // (scaled by the thread count: each thread's share of a block's matmul keeps its cache size)
  int64_t block = std::max<int64_t>(1, kMlpBlockElems * at::get_num_threads() / (2 * inter));
  // Every block streams the MLP weights once more: when they outgrow the cache (real model sizes,
  // e.g. E2B's 1536 x 12288), blocks of a few rows would read them from memory per handful of rows.
  // oneDNN's kernels block the rows themselves and keep a fixed cost per call: blocks of 256 rows.
  if (split || 3 * inter * hid > kMlpBlockElems * 16) block = std::max<int64_t>(block, kMlpMinRowsLargeWeights);
  // oneDNN's fixed cost per call (three calls a block) weighs on narrow MLPs: a block's gate output holds at
  // least kMlpMinOneDnnBlockElems (hidden 256, I 1024: 512 rows; E2B's I 6144: 256).
  if (split) block = std::max<int64_t>(block, kMlpMinOneDnnBlockElems / inter);
  // bf16 weights for ATen's mm are widened to float32 once per call, quantized ones dequantized or converted per
  // call (whatever `onednn` says for them): fewer, larger blocks.
  if ((cpu_fused::is_quantized(down_w) || (!onednn && down_w.scalar_type() == torch::kBFloat16)) && !down_w.is_mkldnn())
    block = std::max(block, kMlpMinRowsWidened);
  // bf16 weights in place for oneDNN's bf16 matmul (AVX-512 BF16's plan) are reordered inside every call: a 1024-row
  // prefill in 256-row blocks reordered each MLP weight four times (pp1024 8-9% under the prepacked weights'), in
  // kMlpDownRows-row blocks once.
  if (onednn && !cpu_fused::is_quantized(down_w) && !down_w.is_mkldnn() && down_w.scalar_type() == torch::kBFloat16)
    block = std::max(block, kMlpDownRows);
  const bool w8a8_down = cpu_fused::is_w8a8(down_w, inter);  // its rows quantized inside the activation pass
  const bool w8a8_mlp = !split && w8a8_down && cpu_fused::is_w8a8(gate_up[0], hid);
  // the activation in the gate / up matmul's epilogue (W8A8 or W4A8 on AMX-int8 tiles) from a full block's rows
  const bool fused_act = !split && cpu_fused::quant_gelu_mul_fused(std::min(n, kMlpMinRowsW8A8), gate_up[0], hid);
  if (w8a8_mlp || fused_act) block = std::max(block, kMlpMinRowsW8A8);
  // When every block runs oneDNN's bf16 matmuls (runs_onednn grows with the rows: the smallest block
  // decides), the MLP's input and output rows stay bf16 (the dtype those matmuls take and give).
  const int64_t min_rows = n % block ? n % block : std::min(n, block);
  const auto mlp_dtype = gate_up[0].scalar_type();
  const bool mlp_bf16 = split && mlp_dtype == torch::kBFloat16 && cpu_fused::runs_onednn(gate_up[0], min_rows, onednn);
  const bool down_bf16 =
      mlp_bf16 && down_w.scalar_type() == torch::kBFloat16 && cpu_fused::runs_onednn(down_w, min_rows, onednn);
  auto x = torch::empty(h.sizes(), h.options().dtype(mlp_bf16 ? torch::kBFloat16 : torch::kFloat32));
  norm_rows(RowsIn(out), w_pre_ff.data_ptr<float>(), RowsOut(x), n, hid, e);
  auto m = torch::empty(h.sizes(), h.options().dtype(down_bf16 ? torch::kBFloat16 : torch::kFloat32));  // [n, hidden]
  // (decode-size rows of a packed bf16 MLP take the bf16 dot products on its layout: the loop below, through linear)
  const bool packed_mlp = split && gate_up[0].is_mkldnn() && gate_up[1].is_mkldnn() && down_w.is_mkldnn() &&
                          cpu_fused::runs_onednn(gate_up[0], n, onednn);
  if (packed_mlp) {
    // gate / up per block of rows, their activation into the calling thread's [rows, I] buffer (a fresh one took a
    // page fault per 4 KB, every layer), the down projection per kMlpDownRows rows
    const int64_t down_rows = std::max(block, kMlpDownRows / block * block);
    const int64_t act_elems = std::min(n, down_rows) * inter;
    thread_local torch::Tensor act_keep;
    if (!act_keep.defined() || act_keep.numel() < act_elems || act_keep.scalar_type() != mlp_dtype)
      act_keep = torch::empty({act_elems}, x.options().dtype(mlp_dtype));
    for (int64_t d0 = 0; d0 < n; d0 += down_rows) {
      const int64_t dn = std::min(down_rows, n - d0);
      auto act = act_keep.narrow(0, 0, dn * inter).view({dn, inter});
      for (int64_t lo = d0; lo < d0 + dn; lo += block) {
        const int64_t rows = std::min(block, d0 + dn - lo);
        auto xin = x.narrow(0, lo, rows).to(mlp_dtype).contiguous();
        auto y = act.narrow(0, lo - d0, rows);
        gelu_mul_rows(onednn_linear(xin, gate_up[0], "none", ""), onednn_linear(xin, gate_up[1], "none", ""), y);
      }
      auto d = linear_native(act, down_w, onednn);
      if (dn == n) m = d;  // one call: no copy
      else m.narrow(0, d0, dn).copy_(d);
    }
  }
  for (int64_t lo = 0; lo < n && !packed_mlp; lo += block) {
    const int64_t rows = std::min(block, n - lo);
    auto xb = x.narrow(0, lo, rows);
    auto m_rows = m.narrow(0, lo, rows);
    if (split && cpu_fused::runs_onednn(gate_up[0], rows, onednn)) {
      // the plain products (in the weights' dtype), then gelu_tanh(gate) * up in one pass into gate's rows
      auto xin = xb.to(mlp_dtype).contiguous();
      auto y = onednn_linear(xin, gate_up[0], "none", "");  // [rows, I], then the MLP's activation in place
      gelu_mul_rows(y, onednn_linear(xin, gate_up[1], "none", ""), y);
      auto d = linear_native(y, down_w, onednn);  // bf16 exactly when down_bf16 (or widened by the copy)
      if (n == rows) m = d;  // one block: no copy
      else m_rows.copy_(d);
      continue;
    }
    if (fused_act && cpu_fused::quant_gelu_mul_fused(rows, gate_up[0], hid)) {
      // AMX-int8: the activation in the gate / up matmul's epilogue, into a [rows, I] float32 buffer kept between
      // calls; then the down projection on it (a W8A8 one on its rows quantized here): the same bits as the
      // two-pass path below
      thread_local torch::Tensor act_keep;
      if (!act_keep.defined() || act_keep.numel() < rows * inter) act_keep = torch::empty({rows * inter}, h.options().dtype(torch::kFloat32));
      auto y = act_keep.narrow(0, 0, rows * inter).view({rows, inter});
      cpu_fused::quant_gelu_mul_into(xb, gate_up[0], y);
      if (w8a8_down) {
        auto qs = cpu_fused::quantize_rows(y);
        cpu_fused::w8a8_linear_codes_into(qs[0], qs[1], down_w, m_rows);  // m: float32 rows (down_bf16 is false)
      } else {
        m_rows.copy_(linear(y, down_w, onednn));
      }
      continue;
    }
    torch::Tensor gate, up;  // [rows, I] float32 views
    if (w8a8_mlp) {
      thread_local torch::Tensor gu_keep;  // the calling thread's [rows, 2I] float32 buffer (largest block so far)
      if (!gu_keep.defined() || gu_keep.numel() < rows * 2 * inter) gu_keep = torch::empty({rows * 2 * inter}, h.options().dtype(torch::kFloat32));
      auto gu = gu_keep.narrow(0, 0, rows * 2 * inter).view({rows, 2 * inter});
      cpu_fused::w8a8_linear_into(xb, gate_up[0], gu);
      gate = gu.narrow(1, 0, inter);
      up = gu.narrow(1, inter, inter);
    } else if (split) {
      gate = linear(xb, gate_up[0], onednn);
      up = linear(xb, gate_up[1], onednn);
    } else {
      auto gu = linear(xb, gate_up[0], onednn);  // [rows, 2I]
      gate = gu.narrow(1, 0, inter);
      up = gu.narrow(1, inter, inter);
    }
    if (w8a8_down) {
      // W8A8 down projection: the activation and its row quantization in one pass per row (the [rows, I] float32
      // activation never leaves the cache); the same bits as gelu_mul_rows, then quant_linear's quantize_rows
      auto codes = torch::empty({rows, inter}, gate.options().dtype(torch::kInt8));
      auto scales = torch::empty({rows}, gate.options());
      gelu_mul_quantize_rows(gate, up, codes, scales);
      cpu_fused::w8a8_linear_codes_into(codes, scales, down_w, m_rows);
      continue;
    }
    auto y = split ? gate : torch::empty({rows, inter}, gate.options());  // [rows, I] contiguous (split: gate's own)
    gelu_mul_rows(gate, up, y);
    if (down_w.scalar_type() == torch::kFloat32 && !down_w.is_mkldnn() && !onednn) {
      torch::mm_out(m_rows, y, down_w.t());
    } else {
      m_rows.copy_(linear(y, down_w, onednn));
    }
  }
  const bool has_ple = ple.has_value() && ple->defined();
  const float sc = static_cast<float>(scalar);
  auto res = torch::empty(h.sizes(), h.options().dtype(dtype));  // the layer's output rows
  add_norm_rows(RowsIn(out), RowsIn(m), w_post_ff.data_ptr<float>(), has_ple ? RowsOut(out) : RowsOut(res), n, hid, e,
                has_ple ? 1.f : sc);
  if (!has_ple) return res;
  TORCH_CHECK(ple->dim() == 2 && ple->size(0) == n, "ple must be [n, P]");
  TORCH_CHECK(ple->scalar_type() == torch::kFloat32 || ple->scalar_type() == torch::kBFloat16, "ple must be float32 or bfloat16");
  const torch::Tensor ple_rows = act_rows(*ple, "ple", 2);  // a [T, L, P] table's layer slice keeps its row stride
  check_f32(*w_ple_norm, "w_ple_norm", 1);
  const int64_t p = ple_rows.size(1);
  auto g = torch::gelu(linear(out, *ple_gate_w, onednn), "tanh").contiguous();  // [n, P] float32
  TORCH_CHECK(g.size(1) == p, "ple must be [n, P] with P the per-layer input gate's ", g.size(1), " outputs, got P = ", p);
  {
    float* gp = g.data_ptr<float>();
    const RowsIn pl(ple_rows);
    for_rows(n, [&](int64_t lo, int64_t hi) {
      avector<float> bp(p);
      for (int64_t i = lo; i < hi; ++i) {
        float* gr = gp + i * p;
        const float* pr = pl.row(i, bp.data(), p);
#pragma omp simd
        for (int64_t j = 0; j < p; ++j) gr[j] = gr[j] * pr[j];
      }
    });
  }
  auto q = linear_native(g, *ple_proj_w, onednn);  // [n, hidden], float32 or bf16
  add_norm_rows(RowsIn(out), RowsIn(q), w_ple_norm->data_ptr<float>(), RowsOut(res), n, hid, e, sc);
  return res;
}

// One (token, layer) row of the per-layer inputs (see ple_inputs); BF16: each step rounded to bf16.
template <bool BF16>
inline float to_model_dtype(float v) {
  if constexpr (BF16) return widen_bf16(narrow_bf16(v));
  return v;
}

template <bool BF16>
void ple_row(const float* x, const float* t, const float* w, float* a, float* o, int64_t P, float ps, float ts,
             float os, float eps) {
#pragma omp simd
  for (int64_t j = 0; j < P; ++j) a[j] = to_model_dtype<BF16>(to_model_dtype<BF16>(x[j]) * ps);
  const float r = inv_rms(a, P, eps);
#pragma omp simd
  for (int64_t j = 0; j < P; ++j) {
    const float normed = to_model_dtype<BF16>((a[j] * r) * w[j]);
    const float sum = to_model_dtype<BF16>(normed + to_model_dtype<BF16>(t[j] * ts));
    o[j] = to_model_dtype<BF16>(sum * os);
  }
}

// The per-layer inputs of impl/model/ple.py in one pass:
//   out [T, L * P] = (rms_norm(r(proj * proj_scale)) * w + r(tok * tok_scale)) * out_scale
// with every step rounded to the model dtype (`bf16`, else float32) where the eager model rounds it (r(): its
// bf16 ops compute in float32 and round): proj [T, L * P] the projection's matmul output (float32, rounded
// first, as the eager projection returns it in the model dtype; or already bf16, oneDNN's bf16 output), tok
// [T, L * P] (the table's gathered rows, float32 or bf16), w [P] float32. The RMSNorm sums its squares in
// float32 in this file's order (ATen's F.rms_norm may differ in the last bit). Replaces ~10 whole-tensor passes
// of ATen ops over [T, L * P].
torch::Tensor ple_inputs(torch::Tensor proj, torch::Tensor tok, torch::Tensor w, int64_t P, double proj_scale,
                         double tok_scale, double out_scale, double eps, bool bf16) {
  proj = act_rows(proj, "proj", 2);
  tok = act_rows(tok, "tok", 2);
  check_f32(w, "w", 1);
  TORCH_CHECK(P > 0 && w.size(0) == P && proj.size(1) % P == 0, "proj must be [T, L * P] with w [P]");
  TORCH_CHECK(tok.sizes() == proj.sizes(), "tok must be [T, L * P] like proj");
  const int64_t T = proj.size(0), LP = proj.size(1);
  auto out = torch::empty({T, LP}, proj.options().dtype(bf16 ? torch::kBFloat16 : torch::kFloat32));
  const RowsIn pr(proj), tr(tok);
  const RowsOut orow(out);
  const float ps = static_cast<float>(proj_scale), ts = static_cast<float>(tok_scale);
  const float os = static_cast<float>(out_scale);
  const float e = static_cast<float>(eps);
  const float* wp = w.data_ptr<float>();
  for_rows(T, [&](int64_t lo, int64_t hi) {
    avector<float> bx(LP), bt(LP), bo(LP), a(P);
    for (int64_t i = lo; i < hi; ++i) {
      const float* x = pr.row(i, bx.data(), LP);
      const float* t = tr.row(i, bt.data(), LP);
      float* o = orow.row(i, bo.data());
      for (int64_t l = 0; l < LP; l += P) {
        if (bf16) ple_row<true>(x + l, t + l, wp, a.data(), o + l, P, ps, ts, os, e);
        else ple_row<false>(x + l, t + l, wp, a.data(), o + l, P, ps, ts, os, e);
      }
      orow.commit(i, o, LP);  // (bf16: the values are already bf16's; rounding them again is exact)
    }
  });
  return out;
}

// The kernels touch no Python object: they run with the GIL released, so a server's other Python threads
// (HTTP handlers, the detokenizer) run meanwhile instead of taking the GIL from the scheduler thread
// between its kernel calls.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using release = py::call_guard<py::gil_scoped_release>;
  m.def("linear", &cpu_fused::linear, "x @ w^T in float32 for any weight kind (see linear.h)", release(),
        py::arg("x"), py::arg("w"), py::arg("onednn") = false);
  m.def("bf16_dot_rows", &cpu_fused::bf16_dot_rows, "the bf16 weights' decode-size kernel in bf16 dot products",
        release(), py::arg("x"), py::arg("w"));
  m.def("bf16_dot_rows_here", &cpu_fused::bf16_dot_rows_here, "True when bf16_dot_rows is compiled in (AVX-512 BF16)");
  m.def("packed_dot_layout", &cpu_fused::packed_dot_layout,
        "compare a oneDNN-packed bf16 weight with its source; record and return its block width for packed_dot_rows",
        release(), py::arg("plain"), py::arg("packed"));
  m.def("packed_dot_block", &cpu_fused::packed_dot_block, "the block width packed_dot_rows reads w in (0: none)",
        py::arg("w"));
  m.def("packed_dot_rows", &cpu_fused::packed_dot_rows, "a packed bf16 weight's decode-size kernel in bf16 dot products",
        release(), py::arg("x"), py::arg("w"));
  m.def("bf16_rows", &cpu_fused::bf16_rows, "the bf16 weights' row kernel (float32 arithmetic)", release(),
        py::arg("x"), py::arg("w"));
  m.def("quant_linear", &cpu_fused::quant_linear, "x @ dequant(w)^T in float32 (quant_linear.h)", release(),
        py::arg("x"), py::arg("w"), py::arg("bf16_dot") = false);
  m.def("quantize_rows", &cpu_fused::quantize_rows, "W8A8's per-row activation quantization", release(), py::arg("x"));
  m.def("quantize_groups", &cpu_fused::quantize_groups, "W4A8's per-row, per-group activation quantization", release(),
        py::arg("x"), py::arg("g"));
  m.def("quant_dequant", &cpu_fused::quant_dequant, "a quantized weight as float32 [N, K]", release(), py::arg("w"),
        py::arg("k"));
  m.def("w4a8_tile_order_here", &cpu_fused::w4a8_tile_order_here, "True when W4A8 weights are put in tile order here");
  m.def("quant_bf16_dot_min_rows", &cpu_fused::quant_bf16_dot_min_rows,
        "From how many rows quant_linear's bf16_dot takes the bf16 dot products (0 where it never does)");
  m.def("quant_w16_prefill_isa", &cpu_fused::quant_w16_prefill_isa,
        "What W8A16 / W4A16 prefill runs on in a bf16 model: amx_bf16, avx512_bf16, or empty (float32 for ATen's mm)");
  m.def("quant_w8a8_prefill_isa", &cpu_fused::quant_w8a8_prefill_isa, "What W8A8 and tiled W4A8 prefill run on: amx_int8, avx512_vnni or simd");
  m.def("int4_range_choices", &cpu_fused::int4_range_choices, "asymmetric int4's range search per group (quant_pack.cpp)",
        release(), py::arg("w"), py::arg("g"));
  m.def("linear_native", &cpu_fused::linear_native,
        "x @ w^T left in the weight's dtype where oneDNN runs it (bf16 weights: bf16), else float32", release(),
        py::arg("x"), py::arg("w"), py::arg("onednn"));
  m.def("ple_inputs", &ple_inputs, "the per-layer inputs [T, L * P] in one pass (impl/model/ple.py)", release(),
        py::arg("proj"), py::arg("tok"), py::arg("w"), py::arg("ple_dim"), py::arg("proj_scale"), py::arg("tok_scale"),
        py::arg("out_scale"), py::arg("eps"), py::arg("bf16"));
  m.def("gelu_mul", [](torch::Tensor g, const torch::Tensor& u) {
          auto y = torch::empty_like(g, torch::MemoryFormat::Contiguous);
          gelu_mul_rows(g.contiguous(), u.contiguous(), y);
          return y;
        }, "gelu_tanh(g) * u, the MLP's activation pass (activation.h; [rows, d] float32 or bfloat16)", release(),
        py::arg("g"), py::arg("u"));
  m.def("gelu_mul_quantize", [](const torch::Tensor& g, const torch::Tensor& u) {
          auto gc = g.contiguous();
          auto codes = torch::empty(gc.sizes(), gc.options().dtype(torch::kInt8));
          auto scales = torch::empty({gc.size(0)}, gc.options());
          gelu_mul_quantize_rows(gc, u.contiguous(), codes, scales);
          return std::vector<torch::Tensor>{codes, scales};
        }, "W8A8's row quantization of gelu_tanh(g) * u in one pass (float32 [rows, d] -> codes, scales)", release(),
        py::arg("g"), py::arg("u"));
  m.def("quant_gelu_mul", [](const torch::Tensor& x, const torch::Tensor& w) {
          const int64_t I = cpu_fused::quant_view(w, x.size(1)).N / 2;
          auto out = torch::empty({x.size(0), I}, x.options().dtype(torch::kFloat32));
          cpu_fused::quant_gelu_mul_into(x, w, out);
          return out;
        }, "gelu_tanh(x @ gate^T) * (x @ up^T) for a W8A8 or W4A8 gate / up weight [2I, K] (fused on AMX-int8 tiles)",
        release(), py::arg("x"), py::arg("w"));
  m.def("quant_tile_order_", &cpu_fused::quant_tile_order_,
        "a W8A8 or W4A8 weight put in AMX-int8 tile order in place where the CPU has the tiles (else the weight untouched)", release(),
        py::arg("w"), py::arg("k"));
  m.def("quant_gelu_mul_fused", &cpu_fused::quant_gelu_mul_fused, "True when quant_gelu_mul runs fused on AMX tiles",
        py::arg("m"), py::arg("w"), py::arg("k"));
  m.def("w8a8_linear_codes", &cpu_fused::w8a8_linear_codes, "quant_linear for W8A8 on rows already quantized",
        release(), py::arg("codes"), py::arg("scales"), py::arg("w"));
  m.def("simd_isa", &cpu_fused::simd_isa, "the SIMD width the kernels were compiled for");
  m.def("bf16_row_kernel_max_rows", [] { return cpu_fused::kBf16RowKernelMaxRows; });
  m.def("attn_pre", &attn_pre, "input norm + projection + head norms + RoPE (CPU)", release(), py::arg("h"),
        py::arg("w_in"), py::arg("proj_w"), py::arg("head_w"), py::arg("cos"), py::arg("sin_signed"), py::arg("q_heads"),
        py::arg("eps"), py::arg("onednn") = false);
  m.def("decoder_post", &decoder_post, "o_proj + norms + residuals + MLP + PLE + layer scalar (CPU)",
        release(), py::arg("h"), py::arg("attn_out"), py::arg("o_w"), py::arg("w_post_attn"), py::arg("w_pre_ff"), py::arg("gate_up"),
        py::arg("down_w"), py::arg("w_post_ff"), py::arg("ple"), py::arg("ple_gate_w"), py::arg("ple_proj_w"),
        py::arg("w_ple_norm"), py::arg("scalar"), py::arg("eps"), py::arg("onednn") = false);
}
