// The linear layers of the fused CPU kernels: y [M, N] = x [M, K] @ w [N, K]^T (see linear.cpp and
// impl/kernels/cpu_fused/linear.py, which plans the weight kinds per model).
#pragma once

#include <torch/extension.h>

namespace cpu_fused {

// f(std::integral_constant<int, mt>()) for 1 <= mt <= MR: a pass's row count as a template argument (the row
// kernels here and in quant_linear.cpp)
template <int MR, typename F>
inline void with_rows(int64_t mt, const F& f) {
  if constexpr (MR > 0) {
    if (mt == MR) return f(std::integral_constant<int, MR>());
    with_rows<MR - 1>(mt, f);
  }
}

// Row counts up to this run the bf16 weights' row kernel (bound by the bytes of weights read); larger ones
// a GEMM (oneDNN, or blocks of weights converted to float32 for ATen's mm).
constexpr int64_t kBf16RowKernelMaxRows = 16;

// Decode's row kernels (bf16 in linear.cpp, quantized in quant_linear.cpp) read a few weight rows at a time: a
// stride within a few KB that the hardware prefetcher follows poorly (measured on one Zen 3 core, 24576 x 1536:
// W4A8 4.8 GB/s without, 8.1 with; W8A8 5.2 -> 11.0). They ask for the rows kPrefetchRows ahead into L2, a line
// or two at a time as they go: one burst of all of a pass's lines before it stalled on the prefetches themselves
// (fill buffers full) on the AMX Xeon; spread, at E2B's shapes there: W4A8 16 -> 20 GB/s, W4A16 14 -> 16, W8A8
// (rows) 20 -> 22; the bf16 LM head 17 -> 22-24 GB/s.
constexpr int64_t kPrefetchRows = 16;

// y = x @ w^T in float32 for any weight kind:
//  * float32 [N, K]: ATen's mm, or oneDNN when `onednn`; under kSmallWeightElems elements the row kernel at every
//    row count (row-invariant, as the bf16 weights' below; from 4 rows its column form, the same sums);
//  * oneDNN-prepacked (mkldnn, float32 or bfloat16): oneDNN, x cast to the weight's dtype; a bf16 one up to
//    kBf16RowKernelMaxRows rows with `onednn`, packed_dot_rows where its shape's layout was recorded (below);
//  * quantized [N, G, B] (int8 / uint8; quant_linear.h): quant_linear;
//  * bfloat16 [N, K]: up to kBf16RowKernelMaxRows rows, with `onednn` (a CPU with native bf16) bf16_dot_rows where
//    compiled in, else the row kernel (float32 arithmetic), which small weights take at every row count
//    (row-invariant results for any M); above, oneDNN's bf16 matmul when `onednn`, else the weight in float32
//    blocks through ATen's mm.
// x: [M, K] float32 or bfloat16 (any strides). Returns [M, N] float32, contiguous.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, bool onednn);

// `linear` before its widening: where oneDNN runs it, the product in the weight's dtype (oneDNN's bf16 matmul
// gives bf16: readers that widen rows themselves skip a whole-tensor float32 copy); else linear's float32.
torch::Tensor linear_native(const torch::Tensor& x, const torch::Tensor& w, bool onednn);

// True when `linear(x, w, onednn)` with `rows` rows runs oneDNN.
bool runs_onednn(const torch::Tensor& w, int64_t rows, bool onednn);

// oneDNN's linear with an optional post-op (attr "gelu" + algo "tanh"); output in x's dtype.
torch::Tensor onednn_linear(const torch::Tensor& x, const torch::Tensor& w, c10::string_view attr,
                            c10::string_view algo);

// The bf16 row kernel alone (tests and benchmarks): x [M, K] float32, w [N, K] bfloat16 -> [M, N] float32.
torch::Tensor bf16_rows(const torch::Tensor& x, const torch::Tensor& w);

// The bf16 weights' decode-size kernel in bf16 dot products (AVX-512 BF16 builds; `linear` takes it with `onednn`
// up to kBf16RowKernelMaxRows rows): x [M, K] (any float dtype, rounded to bf16), w [N, K] bfloat16 -> [M, N]
// float32, each row's sums independent of the rows beside it. bf16_dot_rows_here(): compiled in.
torch::Tensor bf16_dot_rows(const torch::Tensor& x, const torch::Tensor& w);
bool bf16_dot_rows_here();

// bf16 weights prepacked for oneDNN (mkldnn tensors) read in place by bf16 dot products up to kBf16RowKernelMaxRows
// rows (packed_dot.cpp; AVX-512 BF16 builds). packed_dot_layout(plain, packed): compares the packed copy with its
// source for each layout the kernel reads and records the shape's block width (returned; 0: none matched, or a build
// without the kernel); packed_dot_block(w): the recorded width for w's shape (0: oneDNN at every row count);
// packed_dot_rows: x [M, K] (any float dtype, rounded to bf16) @ w^T -> [M, N] float32, row-invariant.
int64_t packed_dot_layout(const torch::Tensor& plain, const torch::Tensor& packed);
int64_t packed_dot_block(const torch::Tensor& w);
torch::Tensor packed_dot_rows(const torch::Tensor& x, const torch::Tensor& w);

// The SIMD width the row kernel was compiled for ("avx512", "avx2" or "scalar").
std::string simd_isa();

}  // namespace cpu_fused
