// The quantized matmul's AVX-512 kernels (quant_blocks.h has the layout, quant_matmul.cpp the
// arithmetic they share with the other paths).
//
// int4 (weight-only), three kinds:
// - AMX tiles (tdpbf16ps) where the CPU grants them: codes unpacked to bfloat16, float32 sums.
//   An int4 value q becomes the bfloat16 128 + q by bit operations alone (0x4300 | q); a
//   group's dot product sum x c (c = 128 + q) then takes the group's scale and offset once per
//   group and row:  sum x w = scale * sum x c + (offset - 128 scale) * sum x.
// - AVX512-VNNI (Ice Lake and later, Zen 4): x's codes times the int4 codes exactly in int32
//   (vpdpbusd, see int4_vnni_rows_block): with 15-bit codes per row as many multiplies as
//   vdpbf16ps would take, with 8-bit ones half, and a quarter of its unpacking, shared by the
//   rows. Measured on a Zen 4 against the bfloat16 pair products below (python -m
//   bench.blocks_bench decode, Qwen2.5-Coder-1.5B, 15-bit codes): 0.90x the decode step at
//   batch 1, 0.94x at 8.
// - AVX512-BF16 pair dot products (vdpbf16ps) on the bfloat16 codes, for groups of a size the
//   codes kernels do not take (not a multiple of 16 inputs).
// int8: x's 8-bit codes times the biased weight bytes u = q + 128, multiplied exactly in int32
// with AVX512-VNNI (vpdpbusd: 4 byte products per lane):
//   sum x w ~ dx * scale * (sum u a - 128 sum a) + offset * sum x.
// CPUs with AVX-512 but without these instructions (Skylake-SP, or SNAPSTREAM_KERNELS=avx512)
// take plain AVX-512 kernels: the int8 one the same integers by vpmaddwd; the int4 one the
// VNNI kernel's integers in 16-bit lanes (vpmaddubsw, see int4_codes_rows_block).

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <utility>

#include "quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace snapstream::quant {
namespace {

constexpr int kRowTile = 8;  // rows of x per register tile

#define SNAPSTREAM_AVX512 __attribute__((target("avx512f,avx512bw,f16c")))
#define SNAPSTREAM_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16,f16c")))
#define SNAPSTREAM_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,f16c")))

// A decode step streams the weights from memory, where the kernels wait on them: each run asks
// for the bytes 4 KiB ahead (the blocks lie one after another, so this reaches into the next
// block's). Measured over the model's layers: int4 0.9-1.0x torch's int4 kernel time with it,
// 1.0-1.1x without; int8 (Qwen2.5-Coder-1.5B's Q6_K layers and LM head, 8 rows) 0.75x.
constexpr int64_t kPrefetchAhead = 4096;

// 16 scales (or offsets) of a block's group g from entry ``at`` on (0: scales, 16: offsets), as
// float32.
SNAPSTREAM_AVX512 inline __m512 load_scales(const Block& block, int64_t g, int64_t at) {
  const int64_t index = g * block.stride + at;
  if (block.scale_type == ScaleType::kFloat)
    return _mm512_loadu_ps(static_cast<const float*>(block.scales) + index);
  if (block.scale_type == ScaleType::kHalf) {
    const auto* half = static_cast<const uint16_t*>(block.scales) + index;
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(half)));
  }
  const auto* codes = static_cast<const int8_t*>(block.scales) + index;
  const __m512 wide = _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))));
  return _mm512_mul_ps(wide, _mm512_loadu_ps(block.factors_of(g, at)));
}

// The block's first out.cols columns of ROWS rows.
template <int ROWS>
SNAPSTREAM_AVX512 inline void store_rows(const __m512 (&acc)[ROWS], const BlockOut& out) {
  const __mmask16 cols = static_cast<__mmask16>((1u << out.cols) - 1);
  for (int m = 0; m < ROWS; ++m) _mm512_mask_storeu_ps(out.ptr + m * out.stride, cols, acc[m]);
}

// Pair p of an int4 block as bfloat16 pairs: lane j = (128 + q_j(2p), 128 + q_j(2p + 1)).
SNAPSTREAM_BF16 inline __m512bh int4_pairs(const uint8_t* weight, int64_t p) {
  const __m512i bytes =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(weight + p * 16)));
  const __m512i spread = _mm512_or_si512(bytes, _mm512_slli_epi32(bytes, 12));  // hi -> bit 16
  return (__m512bh)_mm512_ternarylogic_epi32(spread, _mm512_set1_epi32(0x000F000F),
                                             _mm512_set1_epi32(0x43004300), 0xEA);  // a & b | c
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
// whatever else is in the batch.
constexpr int kChains = 2;

// ROWS rows of x times an int4 block.
template <int ROWS>
SNAPSTREAM_BF16 void int4_rows_block(const Block& block, const Rows& x, const BlockOut& out) {
  const auto* x_pairs = reinterpret_cast<const uint32_t*>(x.x);  // (ROWS, K/2)
  const int64_t pairs = block.k / 2, per_group = block.group / 2;
  __m512 acc[ROWS];
  for (int m = 0; m < ROWS; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < x.groups; ++g) {
    __m512 partial[kChains][ROWS];
    for (int c = 0; c < kChains; ++c)
      for (int m = 0; m < ROWS; ++m) partial[c][m] = _mm512_setzero_ps();
    const int64_t first = g * per_group, last = first + per_group;
    int64_t p = first;
    for (; p + kChains <= last; p += kChains)
      for (int c = 0; c < kChains; ++c)
        dot<ROWS>(partial[c], int4_pairs(block.weight, p + c), x_pairs, pairs, p + c);
    for (; p < last; ++p) dot<ROWS>(partial[0], int4_pairs(block.weight, p), x_pairs, pairs, p);
    const __m512 scale = load_scales(block, g, 0);
    __m512 offset = block.has_offset ? load_scales(block, g, kBlock) : _mm512_setzero_ps();
    offset = _mm512_fnmadd_ps(_mm512_set1_ps(128.f), scale, offset);  // offset - 128 scale
    for (int m = 0; m < ROWS; ++m) {
      __m512 sum = partial[0][m];
      for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, partial[c][m]);
      acc[m] = _mm512_fmadd_ps(sum, scale, acc[m]);
      acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(x.sums[m * x.groups + g]), offset, acc[m]);
    }
  }
  store_rows<ROWS>(acc, out);
}

// int4 on AMX (where the CPU and the kernel allow it): per 32 inputs the block's 16 pairs are
// unpacked as above into a 16 x 64-byte tile (B: pair p of output j, the layout vdpbf16ps
// reads), and one tdpbf16ps multiplies it with up to 16 rows of x (A: each row's 32 bfloat16
// inputs, read in place); two C tiles take 32 rows, so the weights are unpacked once per 32
// rows, not once per 8. A group's C tile then takes its scale and offset as in the AVX-512
// kernel. Each output is a dot product of its row alone: a row's result does not depend on its
// batch (the tiles' rows are independent).
constexpr int64_t kAmxRows = 16;   // rows of x per tile
constexpr int64_t kAmxInputs = 32; // bfloat16 inputs per tile row (64 bytes)

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: per group's parity, C for rows 0-15 and 16-31 of the pass (0 and 1, or 5 and 6) and B
// (4, or 7); A (2 and 3: the same rows of x). Alternating lets a group's products run while
// the previous group's C tiles are stored and scaled.
#define SNAPSTREAM_AMX __attribute__((target("avx512f,avx512bw,avx512bf16,f16c,amx-tile,amx-bf16")))

// The tile intrinsics take their tile numbers as literal text, so the even and odd groups'
// functions are written out by a macro.
#define SNAPSTREAM_INT4_AMX_GROUP(NAME, C_LO, C_HI, B)                                         \
  SNAPSTREAM_AMX inline void NAME(const Block& block, const Rows& x, int64_t g, bool two_tiles, \
                                  uint32_t(*pairs)[kBlock]) {                                    \
    const int64_t x_stride = block.k * 2; /* bytes between rows of x */                          \
    _tile_zero(C_LO);                                                                            \
    if (two_tiles) _tile_zero(C_HI);                                                             \
    for (int64_t k0 = g * block.group; k0 < (g + 1) * block.group; k0 += kAmxInputs) {          \
      for (int64_t i = 0; i < kAmxInputs / 2; ++i)                                               \
        _mm512_store_si512(pairs[i], (__m512i)int4_pairs(block.weight, k0 / 2 + i));             \
      _tile_loadd(B, pairs, 64);                                                                 \
      _tile_loadd(2, x.x + k0, x_stride);                                                        \
      _tile_dpbf16ps(C_LO, 2, B);                                                                \
      if (two_tiles) {                                                                           \
        _tile_loadd(3, x.x + kAmxRows * block.k + k0, x_stride);                                 \
        _tile_dpbf16ps(C_HI, 3, B);                                                              \
      }                                                                                          \
    }                                                                                            \
  }                                                                                              \
  SNAPSTREAM_AMX inline void NAME##_store(float(*dots)[kBlock], bool two_tiles) {                \
    _tile_stored(C_LO, dots[0], 64);                                                             \
    if (two_tiles) _tile_stored(C_HI, dots[kAmxRows], 64);                                       \
  }
SNAPSTREAM_INT4_AMX_GROUP(int4_amx_even, 0, 1, 4)
SNAPSTREAM_INT4_AMX_GROUP(int4_amx_odd, 5, 6, 7)
#undef SNAPSTREAM_INT4_AMX_GROUP

// acc (rows, 16) += group g's dots (rows, 16) times its scale, plus x's group sums times its
// offset - 128 scale.
SNAPSTREAM_AMX inline void int4_amx_scale(const Block& block, const Rows& x, int64_t g,
                                          int64_t rows, float (*dots)[kBlock],
                                          float (*acc)[kBlock]) {
  const __m512 scale = load_scales(block, g, 0);
  __m512 offset = block.has_offset ? load_scales(block, g, kBlock) : _mm512_setzero_ps();
  offset = _mm512_fnmadd_ps(_mm512_set1_ps(128.f), scale, offset);  // offset - 128 scale
  for (int64_t m = 0; m < rows; ++m) {
    __m512 sum = _mm512_fmadd_ps(_mm512_load_ps(dots[m]), scale, _mm512_load_ps(acc[m]));
    sum = _mm512_fmadd_ps(_mm512_set1_ps(x.sums[m * x.groups + g]), offset, sum);
    _mm512_store_ps(acc[m], sum);
  }
}

SNAPSTREAM_AMX void int4_amx_pass(const Block& block, const Rows& x, int64_t rows,
                                  const BlockOut& out) {
  TileConfig config;
  const bool two_tiles = rows > kAmxRows;
  for (int t = 0; t < 2; ++t) {  // C even (0, 1), C odd (5, 6), A (2, 3)
    const auto tile_rows = static_cast<uint8_t>(std::clamp(rows - t * kAmxRows, int64_t{0}, kAmxRows));
    for (int tile : {t, 5 + t, 2 + t}) {
      config.rows[tile] = tile_rows;
      config.bytes_per_row[tile] = tile_rows ? 64 : 0;
    }
  }
  for (int tile : {4, 7}) {  // B
    config.rows[tile] = kAmxInputs / 2;
    config.bytes_per_row[tile] = 64;
  }
  _tile_loadconfig(&config);
  alignas(64) uint32_t pairs[kAmxInputs / 2][kBlock];  // B: (16 pairs, 16 outputs)
  alignas(64) float dots[2 * kAmxRows][kBlock];        // C of one group
  alignas(64) float acc[2 * kAmxRows][kBlock] = {};
  for (int64_t g = 0; g < x.groups; ++g) {
    if (g % 2 == 0) {
      int4_amx_even(block, x, g, two_tiles, pairs);
      if (g > 0) {
        int4_amx_odd_store(dots, two_tiles);
        int4_amx_scale(block, x, g - 1, rows, dots, acc);
      }
    } else {
      int4_amx_odd(block, x, g, two_tiles, pairs);
      int4_amx_even_store(dots, two_tiles);
      int4_amx_scale(block, x, g - 1, rows, dots, acc);
    }
  }
  if (x.groups % 2 == 1) {
    int4_amx_even_store(dots, two_tiles);
  } else {
    int4_amx_odd_store(dots, two_tiles);
  }
  int4_amx_scale(block, x, x.groups - 1, rows, dots, acc);
  _tile_release();
  const __mmask16 cols = static_cast<__mmask16>((1u << out.cols) - 1);
  for (int64_t m = 0; m < rows; ++m)
    _mm512_mask_storeu_ps(out.ptr + m * out.stride, cols, _mm512_load_ps(acc[m]));
}

// The int8 kernels' float steps, shared by the VNNI and the plain AVX-512 kernel (the same
// operations after the same integers: bit for bit the same results).
// Row m's exact int32 sums of sub-group s, less 128 sum a (sum q a), into its accumulator: acc +
// sums * dx * the group's scale.
SNAPSTREAM_AVX512 inline __m512 int8_sub_group(__m512 acc, __m512i sums, __m512 scale,
                                               const Rows& x, int m, int64_t s) {
  const __m512 step = _mm512_mul_ps(scale, _mm512_set1_ps(x.code_scales[m * x.subs + s]));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), step, acc);
}

// Row m's -128 sum a of sub-group s, where its sums u a start (u = q + 128: they end at sum q a).
SNAPSTREAM_AVX512 inline __m512i int8_bias(const Rows& x, int m, int64_t s) {
  return _mm512_set1_epi32(-x.code_bias[m * x.subs + s]);
}

// Group g's offsets times each row's sum of x, where the weights have offsets (the codes
// kernels').
template <int ROWS>
SNAPSTREAM_AVX512 inline void group_offsets(__m512 (&acc)[ROWS], const Block& block,
                                            const Rows& x, int64_t g) {
  if (!block.has_offset) return;
  const __m512 offset = load_scales(block, g, kBlock);
  for (int m = 0; m < ROWS; ++m)
    acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(x.sums[m * x.groups + g]), offset, acc[m]);
}

// ROWS rows of x's 8-bit codes times an int8 block: per sub-group, int32 sums of 4-byte
// products (exact, so one chain per row is as deterministic as any), then the scales in float.
template <int ROWS>
SNAPSTREAM_VNNI void int8_rows_block(const Block& block, const Rows& x, const BlockOut& out) {
  const auto* x_quads = reinterpret_cast<const int32_t*>(x.codes);  // (ROWS, K/4) 4 codes each
  const int64_t quads = block.k / 4, sub_quads = block.k / x.subs / 4;
  const int64_t per_group = x.subs / x.groups;
  __m512 acc[ROWS];
  for (int m = 0; m < ROWS; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < x.groups; ++g) {
    const __m512 scale = load_scales(block, g, 0);
    for (int64_t s = g * per_group; s < (g + 1) * per_group; ++s) {
      __m512i dots[ROWS];
      for (int m = 0; m < ROWS; ++m) dots[m] = int8_bias(x, m, s);
      for (int64_t r = s * sub_quads; r < (s + 1) * sub_quads; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(block.weight + r * 4 * kBlock + kPrefetchAhead),
                     _MM_HINT_T0);
        const __m512i w = _mm512_loadu_si512(block.weight + r * 4 * kBlock);  // (16, 4) bytes
        for (int m = 0; m < ROWS; ++m)
          dots[m] = _mm512_dpbusd_epi32(dots[m], w, _mm512_set1_epi32(x_quads[m * quads + r]));
      }
      for (int m = 0; m < ROWS; ++m) acc[m] = int8_sub_group(acc[m], dots[m], scale, x, m, s);
    }
    group_offsets<ROWS>(acc, block, x, g);
  }
  store_rows<ROWS>(acc, out);
}

// 16 bfloat16 values as float32 (exact).
SNAPSTREAM_AVX512 inline __m512 load_bf16(const uint16_t* values) {
  const __m512i wide =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(values)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// max |x| over a sub-group of ``sub`` values (a multiple of 16).
SNAPSTREAM_AVX512 inline float sub_group_amax(const uint16_t* values, int64_t sub) {
  __m512 largest = _mm512_setzero_ps();
  for (int64_t d = 0; d < sub; d += 16)
    largest = _mm512_max_ps(largest, _mm512_abs_ps(load_bf16(values + d)));
  return _mm512_reduce_max_ps(largest);
}

// CPUs with AVX-512 but neither BF16 nor VNNI (Skylake-SP).
//
// The int4 codes kernels' codes of ``count`` values of x, per sub-group of ``sub`` (a multiple
// of 16), into data.codes, data.low_codes (15 bits) and data.code_scales: 16 values at a time as
// float32 (bfloat16 widened exactly), a = x * (limit / max |x|) rounded to nearest even (the
// MXCSR's default); 15 bits: h = a >> 7 and l = a & 127, 8 bits: a itself; stored per run of 8
// inputs as its even then its odd ones.
SNAPSTREAM_AVX512 void int4_codes_in_runs(const uint16_t* x, int64_t count, int64_t sub,
                                          int bits, RowData& data) {
  const __m512i run_order = _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  const __m512i low_bits = _mm512_set1_epi32(127);
  for (int64_t i = 0; i < count / sub; ++i) {
    const uint16_t* values = x + i * sub;
    const float amax = sub_group_amax(values, sub);
    const float limit = code_limit(bits);
    const __m512 inv = _mm512_set1_ps(code_inverse(amax, limit));
    for (int64_t d = 0; d < sub; d += 16) {
      const __m512 v = load_bf16(values + d);
      const __m512i a = _mm512_permutexvar_epi32(
          run_order, _mm512_cvtps_epi32(_mm512_mul_ps(v, inv)));  // |a| <= limit
      if (bits == 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(data.codes.data() + i * sub + d),
                         _mm512_cvtepi32_epi8(a));
        continue;
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(data.codes.data() + i * sub + d),
                       _mm512_cvtepi32_epi8(_mm512_srai_epi32(a, 7)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(data.low_codes.data() + i * sub + d),
                       _mm512_cvtepi32_epi8(_mm512_and_si512(a, low_bits)));
    }
    data.code_scales[i] = amax / limit;
  }
}

// The int8 kernels' codes (Int8CodesFn), per sub-group of ``sub`` (a multiple of 16), 16 values
// at a time: the plain loop's float product and rounding.
SNAPSTREAM_AVX512 void int8_codes_avx512(const uint16_t* x, int64_t count, int64_t sub, bool wide,
                                         RowData& data) {
  for (int64_t i = 0; i < count / sub; ++i) {
    const uint16_t* values = x + i * sub;
    const float amax = sub_group_amax(values, sub);
    const __m512 inv = _mm512_set1_ps(code_inverse(amax, kCodeLimit8));
    __m512i total = _mm512_setzero_si512();
    for (int64_t d = 0; d < sub; d += 16) {
      const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(load_bf16(values + d), inv));
      total = _mm512_add_epi32(total, a);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(data.codes.data() + i * sub + d),
                       _mm512_cvtepi32_epi8(a));
      if (wide)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(data.wide_codes.data() + i * sub + d),
                            _mm512_cvtepi32_epi16(a));
    }
    data.code_scales[i] = amax / kCodeLimit8;
    data.code_bias[i] = 128 * _mm512_reduce_add_epi32(total);
  }
}

// int4: each row of x is held as 15-bit integer codes per sub-group of A = gcd(G, 32) inputs
// (x ~ a * dx, dx = max |x| / 16383: finer than x's own bfloat16 rounding but for values under
// 1/64 of the sub-group's largest) split into two bytes, a = 128 h + l, and the int4 codes q
// (unsigned) are multiplied with each byte exactly:
//   sum x w ~ dx * scale * (128 sum q h + sum q l) + offset * sum x,
// or, with x_bits 8, as one byte a (dx = max |x| / 127): dx * scale * sum q a + offset * sum x,
// half the products (LOW false below: no low bytes).
// Widened to float32 instead, the codes cost five instructions per 32 weights, then an FMA per
// 16 weights and row (compute-bound, below the memory's bandwidth, there); here a run
// of 4 pairs (64 bytes, [pair][output]) is transposed to [output][pair] by a dword permute
// and a byte shuffle (five instructions per 128 weights with the nibble masks), after which
// the low nibbles hold each output's inputs 0, 2, 4, 6 of the run and the high ones 1, 3, 5,
// 7, multiplied with the row's bytes in that order (int4_codes_in_runs stores them so): an
// instruction per 64 weights and byte. The integer part is exact, so a row's result does not
// depend on its batch, and the two kernels below (and the AVX2 one) give the same bits.
struct Nibbles {
  __m512i even, odd;  // (16 outputs, 4) codes of the run's inputs 0, 2, 4, 6 and 1, 3, 5, 7
};

SNAPSTREAM_AVX512 inline Nibbles int4_run(const uint8_t* weight, int64_t r) {
  const __m512i to_outputs_dwords =
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i to_outputs_bytes = _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  const __m512i nibble = _mm512_set1_epi8(15);
  _mm_prefetch(reinterpret_cast<const char*>(weight + r * 4 * kBlock + kPrefetchAhead),
               _MM_HINT_T0);
  const __m512i w = _mm512_loadu_si512(weight + r * 4 * kBlock);  // (4 pairs, 16)
  const __m512i t = _mm512_shuffle_epi8(_mm512_permutexvar_epi32(to_outputs_dwords, w),
                                        to_outputs_bytes);  // (16 outputs, 4 pairs)
  return {_mm512_and_si512(t, nibble), _mm512_and_si512(_mm512_srli_epi16(t, 4), nibble)};
}

// Row m's exact sums (128 sum q h + sum q l, or sum q a) of sub-group s into its accumulator,
// times dx and the group's scale.
SNAPSTREAM_AVX512 inline __m512 int4_sub_group(__m512 acc, __m512i dots, __m512 scale,
                                               const Rows& x, int m, int64_t s) {
  const __m512 step = _mm512_mul_ps(scale, _mm512_set1_ps(x.code_scales[m * x.subs + s]));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), step, acc);
}

// Without VNNI: vpmaddubsw adds two byte products in 16-bit lanes. Bound: a lane gains at most
// 4 * 15 * 128 = 7,680 per run, so a sub-group (at most 4 runs) stays under 2^15 before
// vpmaddwd widens it to 32 bits.
template <int ROWS, bool LOW>
SNAPSTREAM_AVX512 void int4_codes_tile(const Block& block, const Rows& x, const BlockOut& out) {
  const auto* high = reinterpret_cast<const int32_t*>(x.codes);     // (ROWS, K/4)
  const auto* low = reinterpret_cast<const int32_t*>(x.low_codes);  // (ROWS, K/4)
  const int64_t words = block.k / 4, runs = block.k / x.subs / 8;  // runs per sub-group
  const int64_t per_group = x.subs / x.groups;
  __m512 acc[ROWS];
  for (int m = 0; m < ROWS; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < x.groups; ++g) {
    const __m512 scale = load_scales(block, g, 0);
    for (int64_t s = g * per_group; s < (g + 1) * per_group; ++s) {
      __m512i dots_high[ROWS], dots_low[ROWS];  // (16 outputs, 2) int16
      for (int m = 0; m < ROWS; ++m) dots_high[m] = dots_low[m] = _mm512_setzero_si512();
      for (int64_t r = s * runs; r < (s + 1) * runs; ++r) {
        const Nibbles q = int4_run(block.weight, r);
        for (int m = 0; m < ROWS; ++m) {
          const int64_t at = m * words + 2 * r;  // the row's even inputs, then its odd ones
          dots_high[m] = _mm512_add_epi16(
              dots_high[m],
              _mm512_add_epi16(_mm512_maddubs_epi16(q.even, _mm512_set1_epi32(high[at])),
                               _mm512_maddubs_epi16(q.odd, _mm512_set1_epi32(high[at + 1]))));
          if constexpr (LOW)
            dots_low[m] = _mm512_add_epi16(
                dots_low[m],
                _mm512_add_epi16(_mm512_maddubs_epi16(q.even, _mm512_set1_epi32(low[at])),
                                 _mm512_maddubs_epi16(q.odd, _mm512_set1_epi32(low[at + 1]))));
        }
      }
      for (int m = 0; m < ROWS; ++m) {
        const __m512i dots =
            LOW ? _mm512_add_epi32(_mm512_madd_epi16(dots_high[m], _mm512_set1_epi16(128)),
                                   _mm512_madd_epi16(dots_low[m], _mm512_set1_epi16(1)))
                : _mm512_madd_epi16(dots_high[m], _mm512_set1_epi16(1));  // (16 outputs) exact
        acc[m] = int4_sub_group(acc[m], dots, scale, x, m, s);
      }
    }
    group_offsets<ROWS>(acc, block, x, g);
  }
  store_rows<ROWS>(acc, out);
}

// With AVX512-VNNI: vpdpbusd adds four byte products straight into 32-bit lanes (one
// instruction per 64 weights, byte and row, as the bfloat16 kernel's vdpbf16ps per 32, but
// with the unpacking above shared by all rows: a quarter of the bfloat16 kernel's). The runs of
// a sub-group are unrolled (RUNS of them), which keeps the sums in registers.
template <int ROWS, int RUNS, bool LOW>
SNAPSTREAM_VNNI inline void int4_vnni_sub_group(__m512 (&acc)[ROWS], const Block& block,
                                                const Rows& x, __m512 scale, int64_t s) {
  const auto* high = reinterpret_cast<const int32_t*>(x.codes);     // (ROWS, K/4)
  const auto* low = reinterpret_cast<const int32_t*>(x.low_codes);  // (ROWS, K/4)
  const int64_t words = block.k / 4;
  __m512i dots_high[ROWS], dots_low[ROWS];  // (16 outputs) int32
  for (int m = 0; m < ROWS; ++m) dots_high[m] = dots_low[m] = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (int u = 0; u < RUNS; ++u) {
    const int64_t r = s * RUNS + u;
    const Nibbles q = int4_run(block.weight, r);
    for (int m = 0; m < ROWS; ++m) {
      const int64_t at = m * words + 2 * r;  // the row's even inputs, then its odd ones
      dots_high[m] = _mm512_dpbusd_epi32(dots_high[m], q.even, _mm512_set1_epi32(high[at]));
      if constexpr (LOW)
        dots_low[m] = _mm512_dpbusd_epi32(dots_low[m], q.even, _mm512_set1_epi32(low[at]));
      dots_high[m] = _mm512_dpbusd_epi32(dots_high[m], q.odd, _mm512_set1_epi32(high[at + 1]));
      if constexpr (LOW)
        dots_low[m] = _mm512_dpbusd_epi32(dots_low[m], q.odd, _mm512_set1_epi32(low[at + 1]));
    }
  }
  for (int m = 0; m < ROWS; ++m) {
    const __m512i dots =
        LOW ? _mm512_add_epi32(_mm512_slli_epi32(dots_high[m], 7), dots_low[m])  // exact
            : dots_high[m];
    acc[m] = int4_sub_group(acc[m], dots, scale, x, m, s);
  }
}

template <int ROWS, bool LOW>
SNAPSTREAM_VNNI void int4_vnni_tile(const Block& block, const Rows& x, const BlockOut& out) {
  const int64_t runs = block.k / x.subs / 8;  // per sub-group: 2 or 4 (16 or 32 inputs)
  const int64_t per_group = x.subs / x.groups;
  __m512 acc[ROWS];
  for (int m = 0; m < ROWS; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < x.groups; ++g) {
    const __m512 scale = load_scales(block, g, 0);
    for (int64_t s = g * per_group; s < (g + 1) * per_group; ++s) {
      if (runs == 4) {
        int4_vnni_sub_group<ROWS, 4, LOW>(acc, block, x, scale, s);
      } else {
        int4_vnni_sub_group<ROWS, 2, LOW>(acc, block, x, scale, s);
      }
    }
    group_offsets<ROWS>(acc, block, x, g);
  }
  store_rows<ROWS>(acc, out);
}

// The int4 codes kernels of ROWS rows, for x's 15-bit codes (low bytes) or its 8-bit ones.
template <int ROWS>
SNAPSTREAM_VNNI void int4_vnni_rows_block(const Block& block, const Rows& x,
                                          const BlockOut& out) {
  if (x.low_codes) return int4_vnni_tile<ROWS, true>(block, x, out);
  int4_vnni_tile<ROWS, false>(block, x, out);
}

template <int ROWS>
SNAPSTREAM_AVX512 void int4_codes_rows_block(const Block& block, const Rows& x,
                                             const BlockOut& out) {
  if (x.low_codes) return int4_codes_tile<ROWS, true>(block, x, out);
  int4_codes_tile<ROWS, false>(block, x, out);
}

// int8: the VNNI kernel's integers by vpmaddwd. A run of 4 inputs of the block's 16 outputs
// (64 bytes) widens to 16-bit lanes in two halves (outputs 0-7 and 8-15, 4 inputs each); each
// half times x's 4 codes gives 2 exact int32 sums per output, added over the sub-group; the
// pairs are then added per output. The same integers as vpdpbusd, the same float operations
// after: bit for bit the VNNI kernel's results.
template <int ROWS>
SNAPSTREAM_AVX512 void int8_wide_rows_block(const Block& block, const Rows& x,
                                            const BlockOut& out) {
  const auto* x_quads = reinterpret_cast<const int64_t*>(x.wide_codes);  // (ROWS, K/4)
  const int64_t quads = block.k / 4, sub_quads = block.k / x.subs / 4;
  const int64_t per_group = x.subs / x.groups;
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                          28, 30);
  const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
  __m512 acc[ROWS];
  for (int m = 0; m < ROWS; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < x.groups; ++g) {
    const __m512 scale = load_scales(block, g, 0);
    for (int64_t s = g * per_group; s < (g + 1) * per_group; ++s) {
      __m512i lo[ROWS], hi[ROWS];  // (8 outputs, 2 sums) each
      for (int m = 0; m < ROWS; ++m) lo[m] = hi[m] = _mm512_setzero_si512();
      for (int64_t r = s * sub_quads; r < (s + 1) * sub_quads; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(block.weight + r * 4 * kBlock + kPrefetchAhead),
                     _MM_HINT_T0);
        const __m512i w = _mm512_loadu_si512(block.weight + r * 4 * kBlock);  // (16, 4) bytes
        const __m512i w_lo = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(w));
        const __m512i w_hi = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(w, 1));
        for (int m = 0; m < ROWS; ++m) {
          const __m512i a = _mm512_set1_epi64(x_quads[m * quads + r]);
          lo[m] = _mm512_add_epi32(lo[m], _mm512_madd_epi16(w_lo, a));
          hi[m] = _mm512_add_epi32(hi[m], _mm512_madd_epi16(w_hi, a));
        }
      }
      for (int m = 0; m < ROWS; ++m) {
        const __m512i dots = _mm512_add_epi32(_mm512_permutex2var_epi32(lo[m], evens, hi[m]),
                                              _mm512_permutex2var_epi32(lo[m], odds, hi[m]));
        acc[m] = int8_sub_group(acc[m], _mm512_add_epi32(dots, int8_bias(x, m, s)), scale, x, m,
                                s);
      }
    }
    group_offsets<ROWS>(acc, block, x, g);
  }
  store_rows<ROWS>(acc, out);
}

using TileKernel = void (*)(const Block&, const Rows&, const BlockOut&);

template <int... R>
constexpr std::array<std::array<TileKernel, sizeof...(R) + 1>, 2> tile_kernels(
    std::integer_sequence<int, R...>) {
  return {{{nullptr, &int4_rows_block<R + 1>...}, {nullptr, &int8_rows_block<R + 1>...}}};
}
constexpr auto kTileKernels = tile_kernels(std::make_integer_sequence<int, kRowTile>{});
template <int... R>
constexpr std::array<std::array<TileKernel, sizeof...(R) + 1>, 2> vnni_tile_kernels(
    std::integer_sequence<int, R...>) {
  return {{{nullptr, &int4_vnni_rows_block<R + 1>...}, {nullptr, &int8_rows_block<R + 1>...}}};
}
constexpr auto kVnniTileKernels = vnni_tile_kernels(std::make_integer_sequence<int, kRowTile>{});
template <int... R>
constexpr std::array<std::array<TileKernel, sizeof...(R) + 1>, 2> plain_tile_kernels(
    std::integer_sequence<int, R...>) {
  return {{{nullptr, &int4_codes_rows_block<R + 1>...}, {nullptr, &int8_wide_rows_block<R + 1>...}}};
}
constexpr auto kPlainTileKernels = plain_tile_kernels(std::make_integer_sequence<int, kRowTile>{});

// Up to kRowTile rows at a time through the format's kernels of ``table`` (indexed by the rows
// each takes).
template <const auto& table, Format F>
void block_tiles(const Block& block, const Rows& x, int64_t rows, const BlockOut& out) {
  const auto& kernels = table[F == Format::kInt4 ? 0 : 1];
  for (int64_t m = 0; m < rows; m += kRowTile)
    kernels[std::min<int64_t>(kRowTile, rows - m)](block, x.from(m), out.from(m));
}
void int4_amx(const Block& block, const Rows& x, int64_t rows, const BlockOut& out) {
  if (block.group % kAmxInputs != 0)
    return block_tiles<kTileKernels, Format::kInt4>(block, x, rows, out);
  for (int64_t m = 0; m < rows; m += 2 * kAmxRows)
    int4_amx_pass(block, x.from(m), std::min(2 * kAmxRows, rows - m), out.from(m));
}

}  // namespace

// AMX or AVX512-BF16 (int4) / AVX512-VNNI (int8) where the CPU has them, else the plain
// AVX-512 kernels (F and BW; the int4 one wants groups of a multiple of 16 inputs).
std::optional<KernelPlan> avx512_plan(Format format, int64_t group, const Isa& isa) {
  if (format == Format::kInt4 && isa.amx)
    return KernelPlan{&int4_amx, Reads::kBFloat16, "amx-bf16"};
  if (format == Format::kInt4 && isa.avx512_vnni && group % 16 == 0)
    return KernelPlan{&block_tiles<kVnniTileKernels, Format::kInt4>, Reads::kInt4Codes,
                      "avx512-vnni-codes", &int4_codes_in_runs};
  if (format == Format::kInt4 && isa.avx512_bf16)
    return KernelPlan{&block_tiles<kTileKernels, Format::kInt4>, Reads::kBFloat16, "avx512-bf16"};
  const Int8CodesFn int8_codes = group % 16 == 0 ? &int8_codes_avx512 : nullptr;
  if (format == Format::kInt8 && isa.avx512_vnni)
    return KernelPlan{&block_tiles<kTileKernels, Format::kInt8>, Reads::kInt8Codes, "avx512-vnni",
                      nullptr, false, int8_codes};
  if (format == Format::kInt4 && isa.avx512 && group % 16 == 0)
    return KernelPlan{&block_tiles<kPlainTileKernels, Format::kInt4>, Reads::kInt4Codes,
                      "avx512-codes", &int4_codes_in_runs};
  if (format == Format::kInt8 && isa.avx512)
    return KernelPlan{&block_tiles<kPlainTileKernels, Format::kInt8>, Reads::kInt8Codes, "avx512",
                      nullptr, /*wide_codes=*/true, int8_codes};
  return std::nullopt;
}

}  // namespace snapstream::quant

#else  // another architecture: no plan of these kernels

namespace snapstream::quant {

std::optional<KernelPlan> avx512_plan(Format, int64_t, const Isa&) { return std::nullopt; }

}  // namespace snapstream::quant

#endif
