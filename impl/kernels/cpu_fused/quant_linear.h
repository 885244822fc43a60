// Quantized linear weights of the fused CPU kernels: y [M, N] = x [M, K] @ dequant(w) [N, K]^T in float32
// (see quant_linear.cpp; impl/quant/ builds the weights and holds the torch reference of every kind).
//
// A quantized weight is ONE contiguous CPU tensor [N, G, B]: each of the N output rows holds its G groups of
// g = K / G inputs, each group one block of B bytes, its codes first and its scales after them, so a row's
// bytes are read in one pass:
//   * int8 tensor, B = g + 4 (G = 1): W8A8. g int8 codes q, then float32 s: w = q * s (per channel,
//     symmetric). Activations are quantized per row at run time (`quantize_rows`) and multiplied in exact
//     integer arithmetic, so a row's result never depends on the other rows of the call.
//   * uint8 tensor, B = g + 4: W8A16. g int8 codes (stored as bytes), then float32 s: w = q * s.
//   * uint8 tensor, B = g / 2 + 8: W4A16. Byte j < g / 2 holds code j in its low nibble and code j + g / 2
//     in its high nibble (unsigned 0..15), then float32 s and float32 z: w = (q - z) * s.
//   * int8 tensor, B = g / 2 + 8: W4A8. W4A16's bytes, with activations quantized per row and per group of g
//     inputs at run time (`quantize_groups`): each group's dot product of codes is an exact integer,
//     ((float(sum q xq) - z * float(sum xq)) * (s * s_x)) summed over the groups in order (as llama.cpp's
//     Q4_0 x Q8_0), so a row's result never depends on the other rows of the call.
// The two uint8 kinds are told apart by K (x's width): B == g + 4 or B == g / 2 + 8 (never both for g > 8).
//
//
// W8A8 in tile order (`quant_tile_order_`, where the CPU has AMX-int8 tiles, N % 32 == 0 and K % 64 == 0): int8
// [N / 32, 1, 32 K + 128], the same bytes as [N, 1, K + 4] rearranged per block of 32 output rows: the codes in
// AMX-int8's B-tile order, byte (2 kb + h) * 1024 + 64 r + 4 c + i holding q[32 j + 16 h + c][64 kb + 4 r + i] (each
// 1 KB a tile of 16 rows x 64 codes, each 64 bytes what one VNNI instruction multiplies), then the 32 rows' float32
// scales. The same codes and scales, the same products bit for bit; prefill's tiles read it in place instead of
// repacking every weight per call, and decode reads 64 contiguous bytes per instruction.
//
// W4A8 in tile order (`quant_tile_order_`, where the CPU has AMX-int8 tiles, in builds with AVX-512 VNNI and no AMX,
// and in AVX2's without AVX-512 (w4a8_tile_order_here), N % 32 == 0, g % 64 == 0 and every
// zero point an integer 0..15): int8 [N / 32, G, 16 g + 256], the same bytes as [N, G, g / 2 + 8] rearranged per
// block of 32 output rows and group: the block's group gi holds, per tile half h (16 rows), g / 8 lines of 64 bytes
// at h * 8 g, line l's byte 4 c + i holding q[32 j + 16 h + c][g gi + 8 l + i] in its low nibble and
// q[..][g gi + 8 l + 4 + i] in its high nibble (two rows of a B tile: unpacked by and / shift, no transpose; each
// nibble half what one VNNI instruction multiplies by 4 broadcast codes of x), then the 32 rows' float32 scales and
// their 32 float32 zero points. The same codes, scales and zero points: every kernel gives the row layout's bits.
#pragma once

#include <torch/extension.h>

#include <string>

namespace cpu_fused {

enum class QuantKind { kW8A8, kW8A16, kW4A16, kW4A8 };

struct QuantView {
  QuantKind kind;
  int64_t N, G, g, K, B;  // tiled W8A8: B is a 32-row block's bytes, 32 K + 128; tiled W4A8: a block's group's, 16 g + 256
  const uint8_t* data;
  bool tiled = false;  // W8A8 or W4A8 in tile order (above)
};


// True when `w` is a quantized weight ([N, G, B] int8 or uint8).
bool is_quantized(const torch::Tensor& w);

// The layout of quantized weight `w` for inputs of width K (checked: raises naming what does not fit).
QuantView quant_view(const torch::Tensor& w, int64_t K);

// N, the output width of `w` (plain [N, K], prepacked, or quantized: a tiled W8A8 weight holds N / 32 blocks) for
// inputs of width K.
int64_t out_features(const torch::Tensor& w, int64_t K);

// True when `w` (plain [N, K], prepacked, or quantized) takes inputs of width K.
bool takes_inputs(const torch::Tensor& w, int64_t K);

// y = x @ dequant(w)^T, float32 [M, N]. x: [M, K] float32 or bfloat16 (any strides).
// W8A8: every row count through the integer kernel. W8A16 / W4A16: the row kernel up to
// kQuantRowKernelMaxRows rows (or for weights under kSmallWeightElems elements, at every row count), above
// it blocks of rows dequantized to float32 for ATen's mm; with bf16_dot (the model's linear plan rounds its GEMMs'
// inputs to bf16) where the CPU has AMX-bf16 or AVX-512 BF16, from quant_bf16_dot_min_rows() rows x rounded to bf16
// times the codes in bf16 dot products (quant_w16_prefill_isa), and under it row by row in bf16 dot products too
// (W4A16 at every row count, W8A16 from 4 rows): a row's result independent of the other rows.
torch::Tensor quant_linear(const torch::Tensor& x, const torch::Tensor& w, bool bf16_dot = false);

// What runs W8A16 / W4A16 with bf16_dot: "amx_bf16" (tiles allowed), "avx512_bf16" or "" (float32 for ATen's mm
// above kQuantRowKernelMaxRows).
std::string quant_w16_prefill_isa();
// From how many rows bf16_dot takes the bf16 dot products (0 where it never does); the row kernel below.
int64_t quant_bf16_dot_min_rows();

// Row counts up to this run the weight-only kinds' row kernel (bound by the bytes of the weight read).
constexpr int64_t kQuantRowKernelMaxRows = 16;

// W8A8's activation quantization: x [M, K] -> (int8 codes [M, K], float32 scales [M]); per row
// s = max|x| / 127, q = round_half_even(x / s) (all zeros when the row is).
std::vector<torch::Tensor> quantize_rows(const torch::Tensor& x);

// One row of quantize_rows: x [K] float32 -> codes [K], *scale (the same bits as quantize_rows gives the row).
void quantize_row(const float* x, int64_t K, int8_t* codes, float* scale);

// quant_linear for a W8A8 weight on activations already quantized per row (codes [M, K] int8, scales [M] float32,
// contiguous: quantize_rows' outputs, or rows quantize_row wrote): the same bits as quant_linear on x.
torch::Tensor w8a8_linear_codes(const torch::Tensor& codes, const torch::Tensor& scales, const torch::Tensor& w);
// The same into out [M, N] (contiguous float32): a row block of the caller's output, with no copy.
void w8a8_linear_codes_into(const torch::Tensor& codes, const torch::Tensor& scales, const torch::Tensor& w,
                            torch::Tensor& out);

// quant_linear for a W8A8 weight into `out` (float32 [M, N], contiguous: a buffer the caller keeps between calls).
void w8a8_linear_into(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& out);

// out [M, I] float32 = gelu_tanh(x @ gate^T) * (x @ up^T) for a W8A8 or W4A8 gate / up weight w [2I, K] (gate
// rows first): the same bits as quant_linear, then act::gelu_mul on each row's two halves. On AMX-int8 tiles
// (quant_gelu_mul_fused) the activation runs in the matmul's epilogue and the [M, 2I] products are never written.
void quant_gelu_mul_into(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& out);

// True when quant_gelu_mul_into runs fused on AMX-int8 tiles for M rows of weight `w` with inputs of width K.
bool quant_gelu_mul_fused(int64_t M, const torch::Tensor& w, int64_t K);

// A W8A8 or W4A8 weight in tile order (above), in place: returns the view of its storage ([N / 32, 1, 32 K + 128],
// [N / 32, G, 16 g + 256]) whose bytes it rearranges (w's row layout must not be read afterwards), where the CPU has
// AMX-int8 tiles (and IMPL_CPU_AMX allows them; W4A8 also with AVX-512 VNNI and in the AVX2 build:
// w4a8_tile_order_here), N % 32 == 0,
// K % 64 == 0 (W4A8: g % 64 == 0, integer zero points 0..15) and w's data is 64-byte aligned; else (and for every other kind) returns w untouched.
torch::Tensor quant_tile_order_(const torch::Tensor& w, int64_t K);

// True when quant_tile_order_ puts W4A8 weights in tile order here: where the CPU has AMX-int8 tiles (and
// IMPL_CPU_AMX allows them), in a build with AVX-512 VNNI and no AMX (its prefill kernel reads the tiled lines in
// place), and in the AVX2 build (no AVX-512), whose kernel for a tiled weight needs no horizontal sums at any row count.
bool w4a8_tile_order_here();

// True when `w` is a W8A8 weight for inputs of width K.
bool is_w8a8(const torch::Tensor& w, int64_t K);

// W4A8's activation quantization: x [M, K] -> (int8 codes [M, K], float32 scales [M, G], int32 code sums
// [M, G]) for groups of g inputs: per row and group s = max|x| / 127, q = round_half_even(x / s).
std::vector<torch::Tensor> quantize_groups(const torch::Tensor& x, int64_t g);

// dequant(w) as float32 [N, K] (tests and the reference).
torch::Tensor quant_dequant(const torch::Tensor& w, int64_t K);

// What W8A8's (and a tiled W4A8 weight's) prefill runs on: "amx_int8" (AMX-int8 tiles from 32 rows; IMPL_CPU_AMX=0
// turns them off), "avx512_vnni" (a build with AVX-512 VNNI and no AMX: blocked VPDPBUSD kernels, W8A8 from 5 rows,
// tiled W4A8 from 9) or "simd" (the row kernel, as at every row count).
std::string quant_w8a8_prefill_isa();

// Asymmetric int4's range search at load time (quant_pack.cpp): for w float32 [n, K] in groups of g, the index
// a * 6 + b of the range [min * kInt4RangeScales[a], max * kInt4RangeScales[b]] each group quantizes over, uint8
// [n, K / g] (impl/quant/reference.py's int4_range_choices is its definition).
torch::Tensor int4_range_choices(const torch::Tensor& w, int64_t g);

}  // namespace cpu_fused
