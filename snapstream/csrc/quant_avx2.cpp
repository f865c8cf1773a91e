// The quantized matmul's AVX2 kernels (x86-64-v3: AVX2, FMA, F16C; AMD Zen 2/3, Intel client
// CPUs from Haswell on), in the integers of quant_matmul.cpp's overview: the same integers and
// float operations as the plain AVX-512 kernels (quant_avx512.cpp), on 8 float lanes.
//
// A block's 16 outputs take two halves of 8 lanes (outputs 0-7 and 8-15); x is read as codes,
// a few rows at a time, each code broadcast to the lanes.
//
// int4: the packed pairs (quant_blocks.h) are read two at a time, 32 bytes: pair p in the low
// 128 bits and pair p + 1 in the high ones, byte j = q_j(2p) | q_j(2p + 1) << 4. Masking the
// nibbles and interleaving them (vpunpcklbw / vpunpckhbw) gives, per 16-bit lane, one output's
// two codes of one pair: (q_j(2p), q_j(2p + 1)) in the low half, (q_j(2p + 2), q_j(2p + 3)) in
// the high half, for outputs 0-7 (unpacklo) and 8-15 (unpackhi). vpmaddubsw multiplies each
// with the row's code bytes of the same inputs (h, and l, in input order, spread to match; with
// 8-bit codes a alone) and adds the two products: at most 2 * 15 * 128 = 3,840 per lane and
// pair, and a sub-group of at most 32 inputs adds 8 of them to a lane: under 2^15, exact in 16
// bits. The halves of each 16-bit accumulator (even and odd pairs) are widened and added in 32
// bits.
// int8: the biased bytes u = q + 128 give q = u ^ 0x80; vpmaddubsw(|q|, a signed as q) adds
// two products of at most 128 * 127 (exact, no saturation), vpmaddwd two more: per output the
// sum of 4 products q a, summed over the sub-group in 32 bits (vpdpbusd's u a less the
// sub-group's 128 sum a: the same integers).

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>

#include "quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace snapstream::quant {
namespace {

#define SNAPSTREAM_AVX2 __attribute__((target("avx2,fma,f16c")))

constexpr int kRowTile = 4;  // rows of x per register tile
constexpr int kHalf = 8;     // outputs per 8-lane half of a block

// A decode step streams the weights from memory: ask for the bytes this far ahead.
constexpr int64_t kPrefetchAhead = 4096;

// 8 scales (or offsets) of a block's group g from entry ``at`` on (0 or 8: scales, 16 or 24:
// offsets), as float32.
SNAPSTREAM_AVX2 inline __m256 load_scales(const Block& block, int64_t g, int64_t at) {
  const int64_t index = g * block.stride + at;
  if (block.scale_type == ScaleType::kFloat)
    return _mm256_loadu_ps(static_cast<const float*>(block.scales) + index);
  if (block.scale_type == ScaleType::kHalf) {
    const auto* half = static_cast<const uint16_t*>(block.scales) + index;
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(half)));
  }
  const auto* codes = static_cast<const int8_t*>(block.scales) + index;
  const __m256 wide = _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))));
  return _mm256_mul_ps(wide, _mm256_loadu_ps(block.factors_of(g, at)));
}

SNAPSTREAM_AVX2 inline __m256i broadcast32(const int8_t* bytes) {
  int32_t word;
  std::memcpy(&word, bytes, sizeof(word));
  return _mm256_set1_epi32(word);
}

// The lanes of both halves, (ROWS, 2) of 8, to the block's first out.cols outputs.
template <int ROWS>
SNAPSTREAM_AVX2 inline void store_rows(const __m256 (&acc)[ROWS][2], const BlockOut& out) {
  for (int m = 0; m < ROWS; ++m) {
    float* row = out.ptr + m * out.stride;
    if (out.cols == kBlock) {
      _mm256_storeu_ps(row, acc[m][0]);
      _mm256_storeu_ps(row + kHalf, acc[m][1]);
    } else {
      alignas(32) float lanes[kBlock];
      _mm256_store_ps(lanes, acc[m][0]);
      _mm256_store_ps(lanes + kHalf, acc[m][1]);
      std::copy(lanes, lanes + out.cols, row);
    }
  }
}

// Group g's offsets times each row's sum of x, where the weights have offsets.
template <int ROWS>
SNAPSTREAM_AVX2 inline void group_offsets(__m256 (&acc)[ROWS][2], const Block& block,
                                          const Rows& x, int64_t g) {
  if (!block.has_offset) return;
  for (int c = 0; c < 2; ++c) {
    const __m256 offset = load_scales(block, g, kBlock + c * kHalf);
    for (int m = 0; m < ROWS; ++m)
      acc[m][c] = _mm256_fmadd_ps(_mm256_set1_ps(x.sums[m * x.groups + g]), offset, acc[m][c]);
  }
}

// 8 bfloat16 values as float32 (exact).
SNAPSTREAM_AVX2 inline __m256 load_bf16(const uint16_t* values) {
  const __m256i wide =
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// 8 int32 codes (each fitting a byte) to 8 bytes at ``out``.
SNAPSTREAM_AVX2 inline void store_bytes(int8_t* out, __m256i codes) {
  const __m128i words =
      _mm_packs_epi32(_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packs_epi16(words, words));
}

// max |x| over a sub-group of ``sub`` values (a multiple of 8).
SNAPSTREAM_AVX2 inline float sub_group_amax(const uint16_t* values, int64_t sub) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 largest = _mm256_setzero_ps();
  for (int64_t d = 0; d < sub; d += 8)
    largest = _mm256_max_ps(largest, _mm256_andnot_ps(sign, load_bf16(values + d)));
  __m128 fold = _mm_max_ps(_mm256_castps256_ps128(largest), _mm256_extractf128_ps(largest, 1));
  fold = _mm_max_ps(fold, _mm_movehl_ps(fold, fold));
  return _mm_cvtss_f32(_mm_max_ss(fold, _mm_shuffle_ps(fold, fold, 1)));
}

// x's codes of ``bits`` in input order: per sub-group of ``sub`` (a multiple of 8) inputs, a =
// x * (limit / max |x|) rounded to nearest even (the MXCSR's default); 15 bits: h = a >> 7, l =
// a & 127; 8 bits: a.
SNAPSTREAM_AVX2 void int4_codes_in_order(const uint16_t* x, int64_t count, int64_t sub, int bits,
                                         RowData& data) {
  const __m256i low_bits = _mm256_set1_epi32(127);
  for (int64_t i = 0; i < count / sub; ++i) {
    const uint16_t* values = x + i * sub;
    const float amax = sub_group_amax(values, sub);
    const float limit = code_limit(bits);
    const __m256 inv = _mm256_set1_ps(code_inverse(amax, limit));
    for (int64_t d = 0; d < sub; d += 8) {
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(load_bf16(values + d), inv));
      if (bits == 8) {
        store_bytes(data.codes.data() + i * sub + d, a);
        continue;
      }
      store_bytes(data.codes.data() + i * sub + d, _mm256_srai_epi32(a, 7));
      store_bytes(data.low_codes.data() + i * sub + d, _mm256_and_si256(a, low_bits));
    }
    data.code_scales[i] = amax / limit;
  }
}

// The int8 kernels' codes (Int8CodesFn): the int4 kernels' 8-bit codes, in the same input
// order; neither int16 codes nor code_bias, which the AVX2 kernel does not read (it multiplies
// the weights' codes as signed bytes).
SNAPSTREAM_AVX2 void int8_codes_avx2(const uint16_t* x, int64_t count, int64_t sub,
                                     bool /*wide*/, RowData& data) {
  int4_codes_in_order(x, count, sub, 8, data);
}

// The 32 products of pairs p and p + 1 (16 outputs each) with a row's codes ``bytes`` (4, the
// inputs 2p to 2p + 3), into its 16-bit sums of outputs 0-7 (sums[0]) and 8-15 (sums[1]).
SNAPSTREAM_AVX2 inline void int4_pairs(const __m256i (&w)[2], const int8_t* bytes,
                                       __m256i (&sums)[2]) {
  // per 128 bits, the code pair of its weight pair in every 16-bit lane
  const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2,
                                          3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  const __m256i codes = _mm256_shuffle_epi8(broadcast32(bytes), spread);
  for (int c = 0; c < 2; ++c)
    sums[c] = _mm256_add_epi16(sums[c], _mm256_maddubs_epi16(w[c], codes));
}

// 16-bit sums of even and odd pairs (low, high 128 bits) -> their 8 int32 totals.
SNAPSTREAM_AVX2 inline __m256i widen_pairs(__m256i sums) {
  return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(sums)),
                          _mm256_cvtepi16_epi32(_mm256_extracti128_si256(sums, 1)));
}

// ROWS rows of x's codes (15-bit with LOW, else 8-bit) times an int4 block.
template <int ROWS, bool LOW>
SNAPSTREAM_AVX2 void int4_tile(const Block& block, const Rows& x, const BlockOut& out) {
  const int64_t sub = block.k / x.subs, per_group = x.subs / x.groups;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256 acc[ROWS][2];
  for (int m = 0; m < ROWS; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < x.groups; ++g) {
    const __m256 scale[2] = {load_scales(block, g, 0), load_scales(block, g, kHalf)};
    for (int64_t s = g * per_group; s < (g + 1) * per_group; ++s) {
      __m256i high[ROWS][2], low[ROWS][2];
      for (int m = 0; m < ROWS; ++m)
        high[m][0] = high[m][1] = low[m][0] = low[m][1] = _mm256_setzero_si256();
      for (int64_t i = s * sub; i < (s + 1) * sub; i += 4) {
        const uint8_t* pairs = block.weight + i / 2 * kBlock;
        _mm_prefetch(reinterpret_cast<const char*>(pairs + kPrefetchAhead), _MM_HINT_T0);
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs));
        const __m256i even = _mm256_and_si256(bytes, nibble);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
        const __m256i w[2] = {_mm256_unpacklo_epi8(even, odd), _mm256_unpackhi_epi8(even, odd)};
        for (int m = 0; m < ROWS; ++m) {
          int4_pairs(w, x.codes + m * x.k + i, high[m]);
          if constexpr (LOW) int4_pairs(w, x.low_codes + m * x.k + i, low[m]);
        }
      }
      for (int m = 0; m < ROWS; ++m) {
        const __m256 dx = _mm256_set1_ps(x.code_scales[m * x.subs + s]);
        for (int c = 0; c < 2; ++c) {
          const __m256i dots =
              LOW ? _mm256_add_epi32(_mm256_slli_epi32(widen_pairs(high[m][c]), 7),
                                     widen_pairs(low[m][c]))
                  : widen_pairs(high[m][c]);
          acc[m][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_mul_ps(scale[c], dx),
                                      acc[m][c]);
        }
      }
    }
    group_offsets<ROWS>(acc, block, x, g);
  }
  store_rows<ROWS>(acc, out);
}

template <int ROWS>
SNAPSTREAM_AVX2 void int4_rows_block(const Block& block, const Rows& x, const BlockOut& out) {
  if (x.low_codes) return int4_tile<ROWS, true>(block, x, out);
  int4_tile<ROWS, false>(block, x, out);
}

// Row m's exact int32 sums q a of sub-group s (8 outputs) into its accumulator: acc + dots *
// dx * the group's scale (the plain AVX-512 kernel's float operations).
SNAPSTREAM_AVX2 inline __m256 int8_sub_group(__m256 acc, __m256i dots, __m256 scale,
                                             const Rows& x, int m, int64_t s) {
  const __m256 step = _mm256_mul_ps(scale, _mm256_set1_ps(x.code_scales[m * x.subs + s]));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), step, acc);
}

// ROWS rows of x's 8-bit codes times an int8 block.
template <int ROWS>
SNAPSTREAM_AVX2 void int8_rows_block(const Block& block, const Rows& x, const BlockOut& out) {
  const int64_t quads = block.k / 4, sub_quads = block.k / x.subs / 4;
  const int64_t per_group = x.subs / x.groups;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  const auto* x_quads = reinterpret_cast<const int32_t*>(x.codes);  // (ROWS, K/4)
  __m256 acc[ROWS][2];
  for (int m = 0; m < ROWS; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < x.groups; ++g) {
    for (int c = 0; c < 2; ++c) {  // outputs 0-7, then 8-15: bytes 0-31, 32-63 of each quad
      const __m256 scale = load_scales(block, g, c * kHalf);
      for (int64_t s = g * per_group; s < (g + 1) * per_group; ++s) {
        __m256i dots[ROWS];
        for (int m = 0; m < ROWS; ++m) dots[m] = _mm256_setzero_si256();
        for (int64_t r = s * sub_quads; r < (s + 1) * sub_quads; ++r) {
          const uint8_t* quad = block.weight + r * 4 * kBlock + c * 32;
          _mm_prefetch(reinterpret_cast<const char*>(quad + kPrefetchAhead), _MM_HINT_T0);
          const __m256i q = _mm256_xor_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad)), flip);
          const __m256i magnitude = _mm256_abs_epi8(q);
          for (int m = 0; m < ROWS; ++m) {
            const __m256i a = _mm256_sign_epi8(_mm256_set1_epi32(x_quads[m * quads + r]), q);
            dots[m] = _mm256_add_epi32(
                dots[m], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, a), ones));
          }
        }
        for (int m = 0; m < ROWS; ++m)
          acc[m][c] = int8_sub_group(acc[m][c], dots[m], scale, x, m, s);
      }
    }
    group_offsets<ROWS>(acc, block, x, g);
  }
  store_rows<ROWS>(acc, out);
}

using TileKernel = void (*)(const Block&, const Rows&, const BlockOut&);

// The tile kernels by format (int4, int8) and by the rows each takes (index 0 unused).
template <int... R>
constexpr std::array<std::array<TileKernel, sizeof...(R) + 1>, 2> tile_kernels(
    std::integer_sequence<int, R...>) {
  return {{{nullptr, &int4_rows_block<R + 1>...}, {nullptr, &int8_rows_block<R + 1>...}}};
}
constexpr auto kTiles = tile_kernels(std::make_integer_sequence<int, kRowTile>{});

// Up to kRowTile rows at a time through the format's tile kernels.
template <Format F>
void block_tiles(const Block& block, const Rows& x, int64_t rows, const BlockOut& out) {
  const auto& tiles = kTiles[F == Format::kInt4 ? 0 : 1];
  for (int64_t m = 0; m < rows; m += kRowTile)
    tiles[std::min<int64_t>(kRowTile, rows - m)](block, x.from(m), out.from(m));
}

}  // namespace

// int4 where its groups hold whole runs of 8 inputs; int8 always.
std::optional<KernelPlan> avx2_plan(Format format, int64_t group, const Isa& isa) {
  if (!isa.avx2) return std::nullopt;
  if (format == Format::kInt4)
    return group % 8 == 0 ? std::optional<KernelPlan>(KernelPlan{
                                &block_tiles<Format::kInt4>, Reads::kInt4Codes, "avx2-codes",
                                &int4_codes_in_order})
                          : std::nullopt;
  return KernelPlan{&block_tiles<Format::kInt8>, Reads::kInt8Codes, "avx2", nullptr, false,
                    group % 8 == 0 ? &int8_codes_avx2 : nullptr};
}

}  // namespace snapstream::quant

#else  // another architecture: no plan of these kernels

namespace snapstream::quant {

std::optional<KernelPlan> avx2_plan(Format, int64_t, const Isa&) { return std::nullopt; }

}  // namespace snapstream::quant

#endif
