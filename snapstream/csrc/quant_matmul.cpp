// Weight-only quantized matmul on the CPU for decode-sized batches: out (M, N) float32 =
// x (M, K) bfloat16 @ W^T, W stored as int4 or int8 codes q in groups of G inputs, each group
// of each output with a scale and (optionally) an offset: w = q * scale + offset. int4 codes
// are in [0, 16), int8 codes signed. Scales and offsets are float16 or float32, so that the
// blocks of a GGUF file (Q4_0/Q4_1/Q4_K, Q5_*/Q6_K/Q8_0) are held exactly (snapstream/quant.py,
// snapstream/checkpoints/gguf_blocks.py); G is K / (the scales' second dimension).
//
// The weights are read and unpacked once per call for all rows of x, up to kRowTile rows at a
// time in registers (a matrix-vector kernel unpacks them again for every row), and multiplied
// with AVX512-BF16 pair dot products (vdpbf16ps, float32 accumulation). An int4 value q becomes
// the bfloat16 128 + q by bit operations alone (0x4300 | q); int8 values are widened to
// bfloat16 exactly (|q| <= 128). A group's dot product sum x c (c the code as multiplied) then
// takes the group's scale and offset once per group and row:
//   sum x w = scale * sum x c + (offset - bias scale) * sum x,  bias = 128 (int4) or 0 (int8).
// CPUs without AVX512-BF16 (or SNAPSTREAM_GENERIC_KERNELS=1) take plain C++ loops over the
// float32 weights; the two differ only by float32 rounding.
//
// Packed layout, block b holding outputs 16b + j, j in [0, 16), for input pair p (2p, 2p + 1):
//   int4: weight (N/16, K/2, 16) uint8, byte j = q(2p) | q(2p + 1) << 4;
//   int8: weight (N/16, K/2, 16, 2) int8, [b, p, j, t] = q(2p + t);
//   both: scales (N/16, K/G, S, 16) float16 or float32, [b, g, 0, j] the scale and, when S is
//         2, [b, g, 1, j] the offset of output 16b + j in group g (S = 1: offsets are 0).

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
constexpr int kRowTile = 8;     // rows of x per register tile

enum class Format { kInt4, kInt8 };
enum class ScaleType { kHalf, kFloat };

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

// One block of the packed weight.
struct Block {
  Format format;
  ScaleType scale_type;
  const uint8_t* weight;  // int4 (K/2, 16) or int8 (K/2, 16, 2)
  const void* scales;     // (K/G, S, 16) float16 or float32
  int64_t k, group, stride;  // stride: scale entries per group (S * 16)
  bool has_offset;

  float scale_at(int64_t index) const {
    if (scale_type == ScaleType::kFloat) return static_cast<const float*>(scales)[index];
    return static_cast<float>(static_cast<const c10::Half*>(scales)[index]);
  }

  float at(int64_t j, int64_t i) const {  // the float32 weight of output j at input i
    int q;
    if (format == Format::kInt8) {
      q = reinterpret_cast<const int8_t*>(weight)[(i / 2) * 2 * kBlock + j * 2 + i % 2];
    } else {
      const uint8_t byte = weight[(i / 2) * kBlock + j];
      q = i % 2 ? byte >> 4 : byte & 15;
    }
    const int64_t g = (i / group) * stride;
    const float offset = has_offset ? scale_at(g + kBlock + j) : 0.f;
    return static_cast<float>(q) * scale_at(g + j) + offset;
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
#define SNAPSTREAM_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16,f16c")))

// 16 scales (or offsets) of a block from entry ``index`` on, as float32.
SNAPSTREAM_BF16 inline __m512 load_scales(const Block& block, int64_t index) {
  if (block.scale_type == ScaleType::kFloat)
    return _mm512_loadu_ps(static_cast<const float*>(block.scales) + index);
  const auto* half = static_cast<const uint16_t*>(block.scales) + index;
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(half)));
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

template <Format F>
SNAPSTREAM_BF16 inline __m512bh pairs_at(const uint8_t* weight, int64_t p) {
  if constexpr (F == Format::kInt4) return int4_pairs(weight, p);
  return int8_pairs(weight, p);
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

// ROWS rows of x (bfloat16 pairs as uint32, (ROWS, K/2); x_sums (ROWS, K/G) their group sums)
// times a block.
template <Format F, int ROWS>
SNAPSTREAM_BF16 void rows_block(const Block& block, const uint32_t* x_pairs, const float* x_sums,
                                const BlockOut& out) {
  constexpr float bias = F == Format::kInt4 ? 128.f : 0.f;
  const int64_t pairs = block.k / 2, groups = block.k / block.group, per_group = block.group / 2;
  const bool has_sum_term = F == Format::kInt4 || block.has_offset;
  __m512 acc[ROWS];
  for (int m = 0; m < ROWS; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 partial[kChains][ROWS];
    for (int c = 0; c < kChains; ++c)
      for (int m = 0; m < ROWS; ++m) partial[c][m] = _mm512_setzero_ps();
    const int64_t first = g * per_group, last = first + per_group;
    int64_t p = first;
    for (; p + kChains <= last; p += kChains)
      for (int c = 0; c < kChains; ++c)
        dot<ROWS>(partial[c], pairs_at<F>(block.weight, p + c), x_pairs, pairs, p + c);
    for (; p < last; ++p) dot<ROWS>(partial[0], pairs_at<F>(block.weight, p), x_pairs, pairs, p);
    const __m512 scale = load_scales(block, g * block.stride);
    __m512 offset = block.has_offset ? load_scales(block, g * block.stride + kBlock)
                                     : _mm512_setzero_ps();
    offset = _mm512_fnmadd_ps(_mm512_set1_ps(bias), scale, offset);  // offset - bias scale
    for (int m = 0; m < ROWS; ++m) {
      __m512 sum = partial[0][m];
      for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, partial[c][m]);
      acc[m] = _mm512_fmadd_ps(sum, scale, acc[m]);
      if (has_sum_term)
        acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(x_sums[m * groups + g]), offset, acc[m]);
    }
  }
  const __mmask16 cols = static_cast<__mmask16>((1u << out.cols) - 1);
  for (int m = 0; m < ROWS; ++m) _mm512_mask_storeu_ps(out.ptr + m * out.stride, cols, acc[m]);
}

using RowsKernel = void (*)(const Block&, const uint32_t*, const float*, const BlockOut&);

template <int... R>
constexpr std::array<std::array<RowsKernel, sizeof...(R) + 1>, 2> row_kernels(
    std::integer_sequence<int, R...>) {
  return {{{nullptr, &rows_block<Format::kInt4, R + 1>...},
           {nullptr, &rows_block<Format::kInt8, R + 1>...}}};
}
constexpr auto kRowKernels = row_kernels(std::make_integer_sequence<int, kRowTile>{});

void block_bf16(const Block& block, const uint16_t* x, const float* x_sums, int64_t rows,
                const BlockOut& out) {
  const auto* x_pairs = reinterpret_cast<const uint32_t*>(x);
  const int64_t pairs = block.k / 2, groups = block.k / block.group;
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

void check_shapes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                  int64_t n, Format format) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu() && scales.device().is_cpu(),
              "quant_matmul: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16,
              "quant_matmul: want x (M, K) bfloat16");
  TORCH_CHECK((scales.scalar_type() == at::kHalf || scales.scalar_type() == at::kFloat) &&
                  scales.is_contiguous() && weight.is_contiguous(),
              "quant_matmul: want contiguous weights and float16 or float32 scales");
  const int64_t k = x.size(1), blocks = weight.size(0);
  TORCH_CHECK(n > 0 && (n + kBlock - 1) / kBlock == blocks,
              "quant_matmul: ", n, " outputs do not fill ", blocks, " blocks of 16");
  if (format == Format::kInt4) {
    TORCH_CHECK(weight.dim() == 3 && weight.scalar_type() == at::kByte &&
                    weight.size(1) * 2 == k && weight.size(2) == kBlock,
                "quant_matmul: int4 weight must be (N/16, K/2, 16) uint8");
  } else {
    TORCH_CHECK(weight.dim() == 4 && weight.scalar_type() == at::kChar &&
                    weight.size(1) * 2 == k && weight.size(2) == kBlock && weight.size(3) == 2,
                "quant_matmul: int8 weight must be (N/16, K/2, 16, 2) int8");
  }
  TORCH_CHECK(scales.dim() == 4 && scales.size(0) == blocks && scales.size(1) > 0 &&
                  k % scales.size(1) == 0 && (k / scales.size(1)) % 2 == 0 &&
                  (scales.size(2) == 1 || scales.size(2) == 2) && scales.size(3) == kBlock,
              "quant_matmul: scales must be (N/16, K/G, 1 or 2, 16) with G even");
}

// x (M, K) bfloat16, the packed weight of n outputs (padded to whole blocks) -> (M, n) float32.
at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                        int64_t n, Format format) {
  check_shapes(x, weight, scales, n, format);
  const int64_t rows = x.size(0), k = x.size(1), blocks = weight.size(0);
  const int64_t groups = scales.size(1), group = k / groups, stride = scales.size(2) * kBlock;
  const bool has_offset = scales.size(2) == 2;
  const ScaleType scale_type =
      scales.scalar_type() == at::kFloat ? ScaleType::kFloat : ScaleType::kHalf;
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty({rows, n}, x.options().dtype(at::kFloat));
  const auto* x_ptr = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  const auto* w_ptr = static_cast<const uint8_t*>(weight.data_ptr());
  const auto* s_ptr = static_cast<const uint8_t*>(scales.data_ptr());
  float* out_ptr = out.data_ptr<float>();
  const int64_t block_bytes = k * kBlock / (format == Format::kInt4 ? 2 : 1);
  const int64_t block_scale_bytes = groups * stride * scales.element_size();
  const bool fast = use_bf16_kernel();
  // the group sums of x: (M, K/G) float32
  std::vector<float> x_sums(rows * groups);
  for (int64_t i = 0; i < rows * groups; ++i) {
    float sum = 0.f;
    for (int64_t d = 0; d < group; ++d) sum += bf16_to_float(x_ptr[i * group + d]);
    x_sums[i] = sum;
  }

  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const Block block{format, scale_type, w_ptr + b * block_bytes,
                        s_ptr + b * block_scale_bytes, k, group, stride, has_offset};
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

at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                       int64_t n) {
  return quant_matmul(x, weight, scales, n, Format::kInt4);
}

at::Tensor int8_matmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                       int64_t n) {
  return quant_matmul(x, weight, scales, n, Format::kInt8);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapstream, m) {
  m.def("int4_matmul(Tensor x, Tensor weight, Tensor scales, int n) -> Tensor");
  m.def("int8_matmul(Tensor x, Tensor weight, Tensor scales, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(snapstream, CPU, m) {
  m.impl("int4_matmul", &int4_matmul);
  m.impl("int8_matmul", &int8_matmul);
}
