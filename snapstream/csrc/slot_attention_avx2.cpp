// Decode attention's chunk kernels for AVX2 + FMA (slot_attention.cpp has the work split and
// the merge of chunks), the AVX-512 kernels' algorithm on 8 lanes, for head dimensions that are
// multiples of 8:
// - scores: 8 slots at a time, one accumulator per slot over the head dimension, their
//   horizontal sums by a shuffle tree into one vector of 8 scores; a block of bfloat16, int8 or
//   fp8 keys is widened to float32 once for all of the KV head's query heads, an int8 key's
//   scale multiplies its score, an empty slot scores -inf;
// - softmax: the row's max, then e^(x - max) by slot_attention.h's exp_nonpositive on 8 lanes
//   (the same operations), their sum;
// - values: tiles of up to 2 query heads x 32 dimensions in registers, each value row widened
//   once per tile, an int8 row's scale joined to the probabilities, empty slots skipped.

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <utility>

#include "slot_attention.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace snapstream::slots {
namespace {

#define SNAPSTREAM_AVX2 __attribute__((target("avx2,fma,f16c")))

constexpr int kBlock = 8;                      // slots per scores block
constexpr int kTileHeads = 2, kTileVectors = 4;  // a values tile: query heads x 8-wide vectors

SNAPSTREAM_AVX2 inline __m256 load8(const float* src) { return _mm256_loadu_ps(src); }
SNAPSTREAM_AVX2 inline __m256 load8(const c10::BFloat16* src) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
SNAPSTREAM_AVX2 inline __m256 load8(const int8_t* src) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
}
// An e4m3 byte sign-extended to 16 bits and shifted left by 7 is the float16 of 2^-8 times its
// value once the copy of the sign at bit 14 is cleared (slot_attention.cpp's AVX-512 load16).
SNAPSTREAM_AVX2 inline __m256 load8(const c10::Float8_e4m3fn* src) {
  const __m128i raw = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
  const __m128i half = _mm_and_si128(_mm_slli_epi16(raw, 7), _mm_set1_epi16(-0x4001));
  return _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(256.f));
}

// 8 vectors -> one vector of their 8 horizontal sums, in order.
SNAPSTREAM_AVX2 inline __m256 sum8(const __m256* a) {
  const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  // lanes: (0 1 2 3 | 0 1 2 3) halves of slots 0-3, then of 4-7
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// Scores of G queries (G, D) against COUNT slots from s0 (scores + s0 - begin of each query's
// row of n), D a multiple of 8.
template <typename KV, int COUNT>
SNAPSTREAM_AVX2 void score_block(const float* q, const KV* k, const bool* empty, int64_t s0,
                                 int64_t begin, int64_t end, int64_t group, int64_t dim,
                                 float* keys, float* scores) {
  const int64_t stride = row_stride<KV>(dim), n = end - begin;
  alignas(32) float scale[kBlock] = {};
  alignas(32) int32_t is_empty[kBlock] = {};
  for (int j = 0; j < COUNT; ++j) {
    scale[j] = row_scale(k + (s0 + j) * stride, dim);
    is_empty[j] = empty[s0 + j] ? -1 : 0;
  }
  const float* wide = reinterpret_cast<const float*>(k + s0 * stride);  // float keys: as stored
  int64_t wide_stride = stride;
  if constexpr (!std::is_same_v<KV, float>) {
    for (int j = 0; j < COUNT; ++j)
      for (int64_t d = 0; d < dim; d += 8)
        _mm256_storeu_ps(keys + j * dim + d, load8(k + (s0 + j) * stride + d));
    wide = keys;
    wide_stride = dim;
  }
  const __m256 scales = _mm256_load_ps(scale);
  const __m256 empties =
      _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(is_empty)));
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t g = 0; g < group; ++g) {
    __m256 acc[kBlock];
    for (int j = 0; j < kBlock; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; d += 8) {
      const __m256 query = _mm256_loadu_ps(q + g * dim + d);
      for (int j = 0; j < COUNT; ++j)
        acc[j] = _mm256_fmadd_ps(query, _mm256_loadu_ps(wide + j * wide_stride + d), acc[j]);
    }
    alignas(32) float dots[kBlock];  // times their scales, -inf where empty
    _mm256_store_ps(dots, _mm256_blendv_ps(_mm256_mul_ps(sum8(acc), scales), neg_inf, empties));
    std::copy(dots, dots + COUNT, scores + g * n + (s0 - begin));
  }
}

template <typename KV, int... C>
constexpr auto score_blocks(std::integer_sequence<int, C...>) {
  return std::array{&score_block<KV, C + 1>...};
}

// exp_nonpositive on 8 lanes, the same operations in the same order (slot_attention.h).
SNAPSTREAM_AVX2 inline __m256 exp8_nonpositive(__m256 x) {
  const __m256 clamped = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_floor_ps(
      _mm256_add_ps(_mm256_mul_ps(clamped, _mm256_set1_ps(1.44269504f)), _mm256_set1_ps(0.5f)));
  const __m256 r =
      _mm256_sub_ps(_mm256_sub_ps(clamped, _mm256_mul_ps(n, _mm256_set1_ps(0.693145752f))),
                    _mm256_mul_ps(n, _mm256_set1_ps(1.42860677e-6f)));  // Cody-Waite ln2
  __m256 p = _mm256_set1_ps(1.f / 720);
  for (const float c : {1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f})
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_GE_OQ);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), live);
}

SNAPSTREAM_AVX2 inline float horizontal_max(__m256 x) {
  __m128 half = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  half = _mm_max_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_max_ss(half, _mm_shuffle_ps(half, half, 1)));
}

SNAPSTREAM_AVX2 inline float horizontal_sum(__m256 x) {
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(half, _mm_shuffle_ps(half, half, 1)));
}

// Each query's scores (G, n) in place -> probabilities against the row's max: chunk_max (G),
// chunk_sum (G); a row of empty slots only (max -inf) gets zeros.
SNAPSTREAM_AVX2 void softmax(float* scores, int64_t n, int64_t group, float* chunk_max,
                             float* chunk_sum) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t whole = n / 8 * 8;
  for (int64_t g = 0; g < group; ++g) {
    float* probs = scores + g * n;
    __m256 m = _mm256_set1_ps(neg_inf);
    for (int64_t i = 0; i < whole; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(probs + i));
    float row_max = horizontal_max(m);
    for (int64_t i = whole; i < n; ++i) row_max = std::max(row_max, probs[i]);
    float sum = 0.f;
    if (row_max != neg_inf) {
      const __m256 shift = _mm256_set1_ps(row_max);
      __m256 sums = _mm256_setzero_ps();
      for (int64_t i = 0; i < whole; i += 8) {
        const __m256 e = exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(probs + i), shift));
        _mm256_storeu_ps(probs + i, e);
        sums = _mm256_add_ps(sums, e);
      }
      sum = horizontal_sum(sums);
      for (int64_t i = whole; i < n; ++i) {
        probs[i] = exp_nonpositive(probs[i] - row_max);
        sum += probs[i];
      }
    } else {
      std::fill(probs, probs + n, 0.f);
    }
    chunk_max[g] = row_max;
    chunk_sum[g] = sum;
  }
}

// HEADS query heads' weighted sums of VECTORS x 8 value dimensions from d0, in registers.
template <typename KV, int HEADS, int VECTORS>
SNAPSTREAM_AVX2 void values_tile(const float* probs, const KV* v, const bool* empty,
                                 int64_t begin, int64_t end, int64_t g0, int64_t d0,
                                 int64_t dim, float* acc) {
  const int64_t n = end - begin, stride = row_stride<KV>(dim);
  __m256 sums[HEADS][VECTORS];
  for (int h = 0; h < HEADS; ++h)
    for (int u = 0; u < VECTORS; ++u) sums[h][u] = _mm256_setzero_ps();
  for (int64_t s = begin; s < end; ++s) {
    if (empty[s]) continue;  // NaN or stale values never leak in
    const KV* src = v + s * stride;
    const float scale = row_scale(src, dim);
    __m256 row[VECTORS];
    for (int u = 0; u < VECTORS; ++u) row[u] = load8(src + d0 + 8 * u);
    for (int h = 0; h < HEADS; ++h) {
      const __m256 p = _mm256_set1_ps(probs[(g0 + h) * n + (s - begin)] * scale);
      for (int u = 0; u < VECTORS; ++u) sums[h][u] = _mm256_fmadd_ps(p, row[u], sums[h][u]);
    }
  }
  for (int h = 0; h < HEADS; ++h)
    for (int u = 0; u < VECTORS; ++u)
      _mm256_storeu_ps(acc + (g0 + h) * dim + d0 + 8 * u, sums[h][u]);
}

template <typename KV, int HEADS, int... V>
constexpr auto values_row(std::integer_sequence<int, V...>) {
  return std::array{&values_tile<KV, HEADS, V + 1>...};
}

template <typename KV, int... H>
constexpr auto values_tiles(std::integer_sequence<int, H...>) {
  return std::array{values_row<KV, H + 1>(std::make_integer_sequence<int, kTileVectors>{})...};
}

}  // namespace

template <typename KV>
void attend_chunk_avx2(const float* q, const KV* k, const KV* v, const bool* empty,
                       int64_t begin, int64_t end, int64_t group, int64_t dim, float* scores,
                       float* chunk_max, float* chunk_sum, float* acc) {
  static constexpr auto kScores = score_blocks<KV>(std::make_integer_sequence<int, kBlock>{});
  static constexpr auto kValues =
      values_tiles<KV>(std::make_integer_sequence<int, kTileHeads>{});
  alignas(32) float keys[kBlock * kMaxDim];  // one block's keys in float32
  for (int64_t s0 = begin; s0 < end; s0 += kBlock)
    kScores[std::min<int64_t>(kBlock, end - s0) - 1](q, k, empty, s0, begin, end, group, dim,
                                                     keys, scores);
  softmax(scores, end - begin, group, chunk_max, chunk_sum);
  for (int64_t d0 = 0; d0 < dim; d0 += 8 * kTileVectors) {
    const int64_t vectors = std::min<int64_t>(kTileVectors, (dim - d0) / 8);
    for (int64_t g0 = 0; g0 < group; g0 += kTileHeads) {
      const int64_t heads = std::min<int64_t>(kTileHeads, group - g0);
      kValues[heads - 1][vectors - 1](scores, v, empty, begin, end, g0, d0, dim, acc);
    }
  }
}

template void attend_chunk_avx2<float>(const float*, const float*, const float*, const bool*,
                                       int64_t, int64_t, int64_t, int64_t, float*, float*,
                                       float*, float*);
template void attend_chunk_avx2<c10::BFloat16>(const float*, const c10::BFloat16*,
                                               const c10::BFloat16*, const bool*, int64_t,
                                               int64_t, int64_t, int64_t, float*, float*,
                                               float*, float*);
template void attend_chunk_avx2<int8_t>(const float*, const int8_t*, const int8_t*, const bool*,
                                        int64_t, int64_t, int64_t, int64_t, float*, float*,
                                        float*, float*);
template void attend_chunk_avx2<c10::Float8_e4m3fn>(const float*, const c10::Float8_e4m3fn*,
                                                    const c10::Float8_e4m3fn*, const bool*,
                                                    int64_t, int64_t, int64_t, int64_t, float*,
                                                    float*, float*, float*);

}  // namespace snapstream::slots

#endif  // x86-64
