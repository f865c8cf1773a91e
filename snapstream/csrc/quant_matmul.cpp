// Weight-only quantized matmul on the CPU for decode-sized batches: out (M, N) float32 =
// x (M, K) bfloat16 @ W^T, W stored as int4 groups (a scale and a zero per 32 inputs) or int8
// rows (a scale per output), in blocks of 16 outputs as snapstream/quant.py packs them.
//
// The weights are read and unpacked once per call for all rows of x, up to kRowTile rows at a
// time in registers (a matrix-vector kernel unpacks them again for every row), and multiplied
// with AVX512-BF16 pair dot products (vdpbf16ps, float32 accumulation). An int4 value q becomes
// the bfloat16 128 + q by bit operations alone (0x4300 | q), so a group's dot product is
// sum x (128 + q), and the group's scale and zero apply once per group and row:
//   sum x w = scale * sum x (128 + q) + (zero - 136 scale) * sum x,  w = (q - 8) scale + zero.
// int8 values are widened to bfloat16 exactly (|q| <= 127) and the row scale applies at the end.
// CPUs without AVX512-BF16 (or SNAPSTREAM_GENERIC_KERNELS=1) take plain C++ loops over the
// float32 weights; the two differ only by float32 rounding.
//
// Packed layout, block b holding outputs 16b + j, j in [0, 16), for input pair p (2p, 2p + 1):
//   int4: weight (N/16, K/2, 16) uint8, byte j = q(2p) | q(2p + 1) << 4; scale_zeros
//         (N/16, K/32, 2, 16) bfloat16, [b, g, 0, j] the scale and [b, g, 1, j] the zero.
//   int8: weight (N/16, K/2, 16, 2) int8, [b, p, j, t] = q(2p + t); scales (N/16 * 16,) bfloat16.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "generic_kernels.h"

namespace {

constexpr int64_t kBlock = 16;  // outputs per block
constexpr int64_t kGroup = 32;  // int4 inputs per scale/zero
constexpr int kRowTile = 8;     // rows of x per register tile

enum class Format { kInt4, kInt8 };

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

// One block of the packed weight.
struct Block {
  Format format;
  const uint8_t* weight;       // int4 (K/2, 16) or int8 (K/2, 16, 2)
  const uint16_t* scale_bits;  // int4 (K/32, 2, 16) bfloat16; int8 (16,) bfloat16
  int64_t k;

  float at(int64_t j, int64_t i) const {  // the float32 weight of output j at input i
    if (format == Format::kInt8) {
      const auto q = reinterpret_cast<const int8_t*>(weight)[(i / 2) * 2 * kBlock + j * 2 + i % 2];
      return static_cast<float>(q) * bf16_to_float(scale_bits[j]);
    }
    const uint8_t byte = weight[(i / 2) * kBlock + j];
    const int q = i % 2 ? byte >> 4 : byte & 15;
    const uint16_t* sz = scale_bits + (i / kGroup) * 2 * kBlock;
    return static_cast<float>(q - 8) * bf16_to_float(sz[j]) + bf16_to_float(sz[kBlock + j]);
  }
};

// Where a block's (rows, 16) results go: the first ``cols`` columns (fewer in the last block
// when N is not a multiple of 16) of rows of ``stride`` floats.
struct BlockOut {
  float* ptr;
  int64_t stride, cols;
};

// Generic path: the block as float32 (K, 16), then float32 dot products.
void block_generic(const Block& block, const uint16_t* x, int64_t rows, const BlockOut& out) {
  const int64_t k = block.k;
  std::vector<float> tile(k * kBlock);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < kBlock; ++j) tile[i * kBlock + j] = block.at(j, i);
  for (int64_t m = 0; m < rows; ++m) {
    float acc[kBlock] = {};
    for (int64_t i = 0; i < k; ++i) {
      const float xi = bf16_to_float(x[m * k + i]);
#pragma omp simd
      for (int64_t j = 0; j < kBlock; ++j) acc[j] += xi * tile[i * kBlock + j];
    }
    std::copy(acc, acc + out.cols, out.ptr + m * out.stride);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SNAPSTREAM_BF16_KERNEL 1
#define SNAPSTREAM_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

SNAPSTREAM_BF16 inline __m512 load_bf16x16(const uint16_t* src) {  // 16 bfloat16 -> float32
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// Pair p of an int4 block as bfloat16 pairs: lane j = (128 + q_j(2p), 128 + q_j(2p + 1)).
SNAPSTREAM_BF16 inline __m512bh int4_pairs(const uint8_t* weight, int64_t p) {
  const __m512i bytes =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(weight + p * 16)));
  const __m512i spread = _mm512_or_si512(bytes, _mm512_slli_epi32(bytes, 12));  // hi -> bit 16
  return (__m512bh)_mm512_ternarylogic_epi32(spread, _mm512_set1_epi32(0x000F000F),
                                             _mm512_set1_epi32(0x43004300), 0xEA);  // a & b | c
}

// Pair p of an int8 block as bfloat16 pairs: lane j = (q_j(2p), q_j(2p + 1)).
SNAPSTREAM_BF16 inline __m512bh int8_pairs(const uint8_t* weight, int64_t p) {
  const auto* src = reinterpret_cast<const __m128i*>(weight + p * 32);
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(src)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(src + 1)));
  return _mm512_cvtne2ps_pbh(hi, lo);
}

template <int ROWS>
SNAPSTREAM_BF16 inline void dot(__m512* acc, __m512bh w, const uint32_t* x_pairs, int64_t pairs,
                                int64_t p) {
  for (int m = 0; m < ROWS; ++m)
    acc[m] = _mm512_dpbf16_ps(acc[m], w,
                              (__m512bh)_mm512_set1_epi32(static_cast<int>(x_pairs[m * pairs + p])));
}

// Two independent accumulators per row (even and odd pairs), so that few rows do not wait on
// vdpbf16ps's latency. The same for every tile size: a row's sums are added in one order
// whatever else is in the batch, so a sequence's tokens do not depend on its batch-mates
// (a stream resumed on another decode worker stays token-identical).
constexpr int kChains = 2;

// ROWS rows of x (bfloat16 pairs as uint32, (ROWS, K/2); x_sums (ROWS, K/32) their group
// sums) times an int4 block.
template <int ROWS>
SNAPSTREAM_BF16 void rows_int4(const Block& block, const uint32_t* x_pairs, const float* x_sums,
                               const BlockOut& out) {
  constexpr int chains = kChains;
  const int64_t pairs = block.k / 2, groups = block.k / kGroup;
  __m512 acc[ROWS];
  for (int m = 0; m < ROWS; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 partial[chains][ROWS];
    for (int c = 0; c < chains; ++c)
      for (int m = 0; m < ROWS; ++m) partial[c][m] = _mm512_setzero_ps();
    for (int64_t p = g * kGroup / 2; p < (g + 1) * kGroup / 2; p += chains)
      for (int c = 0; c < chains; ++c)
        dot<ROWS>(partial[c], int4_pairs(block.weight, p + c), x_pairs, pairs, p + c);
    const __m512 scale = load_bf16x16(block.scale_bits + g * 2 * kBlock);
    const __m512 zero = load_bf16x16(block.scale_bits + g * 2 * kBlock + kBlock);
    const __m512 offset = _mm512_fnmadd_ps(_mm512_set1_ps(136.f), scale, zero);
    for (int m = 0; m < ROWS; ++m) {
      __m512 sum = partial[0][m];
      for (int c = 1; c < chains; ++c) sum = _mm512_add_ps(sum, partial[c][m]);
      acc[m] = _mm512_fmadd_ps(sum, scale, acc[m]);
      acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(x_sums[m * groups + g]), offset, acc[m]);
    }
  }
  const __mmask16 cols = static_cast<__mmask16>((1u << out.cols) - 1);
  for (int m = 0; m < ROWS; ++m) _mm512_mask_storeu_ps(out.ptr + m * out.stride, cols, acc[m]);
}

template <int ROWS>
SNAPSTREAM_BF16 void rows_int8(const Block& block, const uint32_t* x_pairs, const float*,
                               const BlockOut& out) {
  constexpr int chains = kChains;
  const int64_t pairs = block.k / 2;
  __m512 partial[chains][ROWS];
  for (int c = 0; c < chains; ++c)
    for (int m = 0; m < ROWS; ++m) partial[c][m] = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + chains <= pairs; p += chains)
    for (int c = 0; c < chains; ++c)
      dot<ROWS>(partial[c], int8_pairs(block.weight, p + c), x_pairs, pairs, p + c);
  for (; p < pairs; ++p) dot<ROWS>(partial[0], int8_pairs(block.weight, p), x_pairs, pairs, p);
  const __m512 scale = load_bf16x16(block.scale_bits);
  const __mmask16 cols = static_cast<__mmask16>((1u << out.cols) - 1);
  for (int m = 0; m < ROWS; ++m) {
    __m512 sum = partial[0][m];
    for (int c = 1; c < chains; ++c) sum = _mm512_add_ps(sum, partial[c][m]);
    _mm512_mask_storeu_ps(out.ptr + m * out.stride, cols, _mm512_mul_ps(sum, scale));
  }
}

using RowsKernel = void (*)(const Block&, const uint32_t*, const float*, const BlockOut&);

template <int... R>
constexpr std::array<std::array<RowsKernel, sizeof...(R) + 1>, 2> row_kernels(
    std::integer_sequence<int, R...>) {
  return {{{nullptr, &rows_int4<R + 1>...}, {nullptr, &rows_int8<R + 1>...}}};
}
constexpr auto kRowKernels = row_kernels(std::make_integer_sequence<int, kRowTile>{});

void block_bf16(const Block& block, const uint16_t* x, const float* x_sums, int64_t rows,
                const BlockOut& out) {
  const auto* x_pairs = reinterpret_cast<const uint32_t*>(x);
  const int64_t pairs = block.k / 2, groups = block.k / kGroup;
  const auto& kernels = kRowKernels[block.format == Format::kInt4 ? 0 : 1];
  for (int64_t m = 0; m < rows; m += kRowTile) {
    const int64_t count = std::min<int64_t>(kRowTile, rows - m);
    kernels[count](block, x_pairs + m * pairs, x_sums + m * groups,
                   BlockOut{out.ptr + m * out.stride, out.stride, out.cols});
  }
}
#endif

bool use_bf16_kernel() {
#if SNAPSTREAM_BF16_KERNEL
  static const bool supported = __builtin_cpu_supports("avx512bf16");
  return supported && !snapstream::generic_kernels_requested();
#else
  return false;
#endif
}

// x (M, K) bfloat16, the packed weight of n outputs (padded to whole blocks) -> (M, n) float32.
at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                        int64_t n, Format format) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu() && scales.device().is_cpu(),
              "quant_matmul: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16,
              "quant_matmul: want x (M, K) bfloat16");
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && scales.is_contiguous() &&
                  weight.is_contiguous(),
              "quant_matmul: want contiguous weights and bfloat16 scales");
  const int64_t rows = x.size(0), k = x.size(1), blocks = weight.size(0);
  TORCH_CHECK(n > 0 && (n + kBlock - 1) / kBlock == blocks,
              "quant_matmul: ", n, " outputs do not fill ", blocks, " blocks of 16");
  if (format == Format::kInt4) {
    TORCH_CHECK(weight.dim() == 3 && weight.scalar_type() == at::kByte &&
                    weight.size(1) * 2 == k && weight.size(2) == kBlock && k % kGroup == 0,
                "quant_matmul: int4 weight must be (N/16, K/2, 16) uint8 with K % 32 == 0");
    TORCH_CHECK(scales.dim() == 4 && scales.size(0) == blocks && scales.size(1) == k / kGroup &&
                    scales.size(2) == 2 && scales.size(3) == kBlock,
                "quant_matmul: int4 scale_zeros must be (N/16, K/32, 2, 16)");
  } else {
    TORCH_CHECK(weight.dim() == 4 && weight.scalar_type() == at::kChar &&
                    weight.size(1) * 2 == k && weight.size(2) == kBlock && weight.size(3) == 2,
                "quant_matmul: int8 weight must be (N/16, K/2, 16, 2) int8");
    TORCH_CHECK(scales.dim() == 1 && scales.size(0) == blocks * kBlock,
                "quant_matmul: int8 scales must be (N/16 * 16,)");
  }
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty({rows, n}, x.options().dtype(at::kFloat));
  const auto* x_ptr = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  const auto* w_ptr = static_cast<const uint8_t*>(weight.data_ptr());
  const auto* s_ptr = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::BFloat16>());
  float* out_ptr = out.data_ptr<float>();
  const int64_t block_bytes = k * kBlock / (format == Format::kInt4 ? 2 : 1);
  const int64_t block_scales = format == Format::kInt4 ? (k / kGroup) * 2 * kBlock : kBlock;
  const bool fast = use_bf16_kernel();
  // the int4 kernel's group sums of x: (M, K/32) float32
  std::vector<float> x_sums(format == Format::kInt4 ? rows * (k / kGroup) : 0);
  for (int64_t i = 0; i < static_cast<int64_t>(x_sums.size()); ++i) {
    float sum = 0.f;
    for (int64_t d = 0; d < kGroup; ++d) sum += bf16_to_float(x_ptr[i * kGroup + d]);
    x_sums[i] = sum;
  }

  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const Block block{format, w_ptr + b * block_bytes, s_ptr + b * block_scales, k};
      const BlockOut block_out{out_ptr + b * kBlock, n, std::min(kBlock, n - b * kBlock)};
#if SNAPSTREAM_BF16_KERNEL
      if (fast) {
        block_bf16(block, x_ptr, x_sums.data(), rows, block_out);
        continue;
      }
#endif
      block_generic(block, x_ptr, rows, block_out);
    }
  });
  return out;
}

at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& weight,
                       const at::Tensor& scale_zeros, int64_t n) {
  return quant_matmul(x, weight, scale_zeros, n, Format::kInt4);
}

at::Tensor int8_matmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                       int64_t n) {
  return quant_matmul(x, weight, scales, n, Format::kInt8);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapstream, m) {
  m.def("int4_matmul(Tensor x, Tensor weight, Tensor scale_zeros, int n) -> Tensor");
  m.def("int8_matmul(Tensor x, Tensor weight, Tensor scales, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(snapstream, CPU, m) {
  m.impl("int4_matmul", &int4_matmul);
  m.impl("int8_matmul", &int8_matmul);
}
