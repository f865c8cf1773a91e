// Decode attention over a fixed-shape slot cache, on the CPU: one query token per row, GQA,
// float32, bfloat16, int8 or fp8 e4m3 K/V read as stored, float32 softmax and accumulation, one
// pass over each KV head's slots for all of its query heads.
//
// An int8 cache (snapstream/kvquant.py) holds per slot and head a row of D int8 codes followed
// by that row's float32 scale (absmax / 127) in 4 bytes: a row of D + 4. Codes are widened in
// registers; a key's scale multiplies its score, a value's scale its probability. The step's
// new key and value are quantized here exactly as kvquant.py does it. An fp8 e4m3 cache holds
// per row the D values of its Hadamard transform and no scale: the step's query, key and value
// are rotated here (kvquant.py's butterflies, the same bits), the rows go through torch's own
// conversion, and the output is rotated back.
//
// The work is split over (row, KV head, chunk of slots) so that a batch of one still spreads
// over every thread (flash-decoding); each chunk keeps its own max, sum and weighted values,
// merged per (row, KV head) at the end. Inner loops are plain C++ that the compiler vectorizes,
// compiled for AVX2 + FMA and for the baseline (isa.h); where the CPU has AVX-512 (under the
// cap), head dimensions that are multiples of 16 take explicit AVX-512 loops instead, and where
// it has AVX2, multiples of 8 take explicit AVX2 ones (slot_attention_avx2.cpp).

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "isa.h"
#include "int8_rows.h"
#include "ops.h"
#include "slot_attention.h"

namespace {

constexpr int64_t kChunk = 256;  // slots per work item

// the cache's rows (slot_attention.h)
using snapstream::slots::exp_nonpositive;
using snapstream::slots::is_quantized;
using snapstream::slots::kMaxDim;
using snapstream::slots::kMaxGroup;
using snapstream::slots::kScaleBytes;
using snapstream::slots::row_scale;
using snapstream::slots::row_stride;
using snapstream::slots::to_float;

// One chunk of one KV head: scores of its G queries against slots [begin, end), then
// probabilities relative to the chunk's own max and their weighted sum of values.
// q (G, D) pre-scaled; k, v (S, row_stride(D)); empty (S); scores scratch (G, end - begin);
// -> chunk_max (G), chunk_sum (G), acc (G, D).
constexpr int64_t kUnroll = 4;  // slots at a time: independent dot products, fewer stores

#if SNAPSTREAM_AVX512

// 16 vectors -> one vector of their 16 horizontal sums, in order (a shuffle tree: ~3 operations
// per sum instead of a reduction each).
__attribute__((target("avx512f"))) inline __m512 sum16(const __m512* a) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i)
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int j = 0; j < 4; ++j) {
    const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(b[2 * j]),
                                          _mm512_castps_pd(b[2 * j + 1]));
    const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(b[2 * j]),
                                          _mm512_castps_pd(b[2 * j + 1]));
    c[j] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
  }
  const __m512 e01 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                                   _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
  const __m512 e23 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88),
                                   _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(e01, e23, 0x88),
                       _mm512_shuffle_f32x4(e01, e23, 0xDD));
}

__attribute__((target("avx512f"))) inline __m512 load16(const float* src) {
  return _mm512_loadu_ps(src);
}
__attribute__((target("avx512f"))) inline __m512 load16(const c10::BFloat16* src) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
__attribute__((target("avx512f"))) inline __m512 load16(const int8_t* src) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
}
// An e4m3 byte's sign at bit 15 and its exponent and mantissa at bits 7-13 make a float16 of
// 2^-8 times its value (subnormals included: both formats' subnormals scale alike), which the
// float16 conversion widens exactly: the byte sign-extended to 16 bits and shifted left by 7
// puts them there, with a copy of the sign at bit 14 that the mask clears.
__attribute__((target("avx512f"))) inline __m512 load16(const c10::Float8_e4m3fn* src) {
  const __m256i raw =
      _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  const __m256i half = _mm256_and_si256(_mm256_slli_epi16(raw, 7), _mm256_set1_epi16(-0x4001));
  return _mm512_mul_ps(_mm512_cvtph_ps(half), _mm512_set1_ps(256.f));
}

// Cache lines from src on to src + bytes into L1, ahead of their use.
inline void prefetch_bytes(const void* src, int64_t bytes) {
  const char* p = static_cast<const char*>(src);
  for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(p + at, _MM_HINT_T0);
}

// Scores of G queries (G, D) against COUNT slots from s0 of k (S, row_stride(D)), D a multiple of
// 16, into scores + s0 - begin of each query's row of n: one accumulator per slot, kept in
// registers because COUNT is a constant (a runtime count spills them to the stack); an int8
// key's dot product with its codes times its scale, -inf where a slot is empty. A bfloat16 or
// int8 block is widened to float32 once into keys (COUNT, D) for all G query heads; the next
// blocks' keys and this block's values are fetched meanwhile (the values pass reads them next).
template <typename KV, int COUNT>
__attribute__((target("avx512f"))) inline void score_block(const float* q, const KV* k,
                                                           const KV* v, const bool* empty,
                                                           int64_t s0, int64_t begin,
                                                           int64_t end, int64_t group,
                                                           int64_t dim, float* keys,
                                                           float* scores) {
  const int64_t stride = row_stride<KV>(dim), n = end - begin;
  const int64_t ahead = std::min<int64_t>(32, end - s0 - COUNT);  // slots past this block
  if (ahead > 0) prefetch_bytes(k + (s0 + COUNT) * stride, ahead * stride * sizeof(KV));
  prefetch_bytes(v + s0 * stride, COUNT * stride * sizeof(KV));
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 scales = _mm512_set1_ps(1.f);
  if constexpr (is_quantized<KV>()) {
    float lane[16] = {};
    for (int j = 0; j < COUNT; ++j) lane[j] = row_scale(k + (s0 + j) * stride, dim);
    scales = _mm512_loadu_ps(lane);
  }
  __mmask16 is_empty = 0;
  for (int j = 0; j < COUNT; ++j) is_empty |= static_cast<__mmask16>(empty[s0 + j]) << j;
  const float* wide = reinterpret_cast<const float*>(k + s0 * stride);  // float keys: as stored
  int64_t wide_stride = stride;
  if constexpr (!std::is_same_v<KV, float>) {
    for (int j = 0; j < COUNT; ++j)
      for (int64_t d = 0; d < dim; d += 16)
        _mm512_storeu_ps(keys + j * dim + d, load16(k + (s0 + j) * stride + d));
    wide = keys;
    wide_stride = dim;
  }
  for (int64_t g = 0; g < group; ++g) {
    __m512 acc[16];
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dim; d += 16) {
      const __m512 query = _mm512_loadu_ps(q + g * dim + d);
      for (int j = 0; j < COUNT; ++j)
        acc[j] = _mm512_fmadd_ps(query, _mm512_loadu_ps(wide + j * wide_stride + d), acc[j]);
    }
    __m512 dots = sum16(acc);
    if constexpr (is_quantized<KV>()) dots = _mm512_mul_ps(dots, scales);
    const __m512 sums = _mm512_mask_blend_ps(is_empty, dots, neg_inf);
    _mm512_mask_storeu_ps(scores + g * n + (s0 - begin),
                          static_cast<__mmask16>((1u << COUNT) - 1), sums);
  }
}

template <typename KV, int... C>
constexpr std::array<void (*)(const float*, const KV*, const KV*, const bool*, int64_t, int64_t,
                              int64_t, int64_t, int64_t, float*, float*),
                     sizeof...(C)>
score_blocks(std::integer_sequence<int, C...>) {
  return {&score_block<KV, C + 1>...};
}

// Scores of G queries (G, D) against slots [begin, end): scores (G, end - begin), 16 slots at a
// time (the last block's count picks its instance).
template <typename KV>
__attribute__((target("avx512f"))) void scores_avx512(const float* q, const KV* k, const KV* v,
                                                      const bool* empty, int64_t begin,
                                                      int64_t end, int64_t group, int64_t dim,
                                                      float* scores) {
  static constexpr auto kBlocks = score_blocks<KV>(std::make_integer_sequence<int, 16>{});
  alignas(64) float keys[16 * kMaxDim];  // one block's keys in float32
  for (int64_t s0 = begin; s0 < end; s0 += 16)
    kBlocks[std::min<int64_t>(16, end - s0) - 1](q, k, v, empty, s0, begin, end, group, dim, keys,
                                                 scores);
}

// exp_nonpositive on 16 lanes, the same operations in the same order but for its multiply-adds,
// fused here.
__attribute__((target("avx512f"))) inline __m512 exp16_nonpositive(__m512 x) {
  const __m512 clamped = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(
      _mm512_fmadd_ps(clamped, _mm512_set1_ps(1.44269504f), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), clamped));
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_LT_OQ);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~underflow), p, _mm512_castsi512_ps(bits));
}

// Each query's scores (G, n) in place -> probabilities against the row's max: chunk_max (G),
// chunk_sum (G); a row of empty slots only (max -inf) gets zeros.
__attribute__((target("avx512f"))) void softmax_avx512(float* scores, int64_t n, int64_t group,
                                                       float* chunk_max, float* chunk_sum) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t g = 0; g < group; ++g) {
    float* probs = scores + g * n;
    __m512 m = neg_inf;
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 lanes = static_cast<__mmask16>((1u << std::min<int64_t>(16, n - i)) - 1);
      m = _mm512_max_ps(m, _mm512_mask_loadu_ps(neg_inf, lanes, probs + i));
    }
    const float row_max = _mm512_reduce_max_ps(m);
    __m512 sum = _mm512_setzero_ps();
    if (row_max != -std::numeric_limits<float>::infinity()) {
      const __m512 shift = _mm512_set1_ps(row_max);
      for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 lanes = static_cast<__mmask16>((1u << std::min<int64_t>(16, n - i)) - 1);
        const __m512 e = exp16_nonpositive(
            _mm512_sub_ps(_mm512_mask_loadu_ps(neg_inf, lanes, probs + i), shift));
        _mm512_mask_storeu_ps(probs + i, lanes, e);
        sum = _mm512_add_ps(sum, e);  // lanes past n hold e^-inf = 0
      }
    } else {
      std::fill(probs, probs + n, 0.f);
    }
    chunk_max[g] = row_max;
    chunk_sum[g] = _mm512_reduce_add_ps(sum);
  }
}

// HEADS query heads' weighted sums of VECTORS x 16 value dimensions from d0, held in registers
// (both counts are constants: runtime bounds spill the sums to the stack); each value row is
// widened once for all of the heads, an int8 row's scale joins the probabilities.
template <typename KV, int HEADS, int VECTORS>
__attribute__((target("avx512f"))) void values_tile(const float* probs, const KV* v,
                                                   const bool* empty, int64_t begin,
                                                   int64_t end, int64_t g0, int64_t d0,
                                                   int64_t dim, float* acc) {
  const int64_t n = end - begin, stride = row_stride<KV>(dim);
  __m512 sums[HEADS][VECTORS];
  for (int h = 0; h < HEADS; ++h)
    for (int u = 0; u < VECTORS; ++u) sums[h][u] = _mm512_setzero_ps();
  for (int64_t s = begin; s < end; ++s) {
    if (empty[s]) continue;  // NaN or stale values never leak in
    const KV* src = v + s * stride;
    const float scale = row_scale(src, dim);
    __m512 row[VECTORS];
    for (int u = 0; u < VECTORS; ++u) row[u] = load16(src + d0 + 16 * u);
    for (int h = 0; h < HEADS; ++h) {
      const __m512 p = _mm512_set1_ps(probs[(g0 + h) * n + (s - begin)] * scale);
      for (int u = 0; u < VECTORS; ++u) sums[h][u] = _mm512_fmadd_ps(p, row[u], sums[h][u]);
    }
  }
  for (int h = 0; h < HEADS; ++h)
    for (int u = 0; u < VECTORS; ++u)
      _mm512_storeu_ps(acc + (g0 + h) * dim + d0 + 16 * u, sums[h][u]);
}

constexpr int kTileHeads = 4, kTileVectors = 4;  // query heads and 16-wide vectors per tile

template <typename KV>
using ValuesTile = void (*)(const float*, const KV*, const bool*, int64_t, int64_t, int64_t,
                            int64_t, int64_t, float*);

template <typename KV, int HEADS, int... V>
constexpr std::array<ValuesTile<KV>, kTileVectors> values_row(std::integer_sequence<int, V...>) {
  return {&values_tile<KV, HEADS, V + 1>...};
}

template <typename KV, int... H>
constexpr std::array<std::array<ValuesTile<KV>, kTileVectors>, kTileHeads> values_tiles(
    std::integer_sequence<int, H...>) {
  return {values_row<KV, H + 1>(std::make_integer_sequence<int, kTileVectors>{})...};
}

// acc (G, D) = probs (G, end - begin) @ v[begin:end] (S, row_stride(D)), D a multiple of 16,
// skipping empty slots, in register tiles of up to 4 query heads x 64 dimensions.
template <typename KV>
__attribute__((target("avx512f"))) void values_avx512(const float* probs, const KV* v,
                                                      const bool* empty, int64_t begin,
                                                      int64_t end, int64_t group, int64_t dim,
                                                      float* acc) {
  static constexpr auto kTiles = values_tiles<KV>(std::make_integer_sequence<int, kTileHeads>{});
  for (int64_t d0 = 0; d0 < dim; d0 += 16 * kTileVectors) {
    const int64_t vectors = std::min<int64_t>(kTileVectors, (dim - d0) / 16);
    for (int64_t g0 = 0; g0 < group; g0 += kTileHeads) {
      const int64_t heads = std::min<int64_t>(kTileHeads, group - g0);
      kTiles[heads - 1][vectors - 1](probs, v, empty, begin, end, g0, d0, dim, acc);
    }
  }
}
#endif

// One slot's row -> its D float values (an int8 row's codes times its scale).
template <typename KV>
inline void widen(const KV* src, int64_t dim, float* dst) {
  const float scale = row_scale(src, dim);
#pragma omp simd
  for (int64_t d = 0; d < dim; ++d) dst[d] = to_float(src[d]) * scale;
}

// The chunk in plain C++ loops, inlined into each instruction set's copy below.
template <typename KV>
SNAPSTREAM_INLINE void attend_chunk_plain(const float* q, const KV* k, const KV* v,
                                          const bool* empty, int64_t begin, int64_t end,
                                          int64_t group, int64_t dim, float* scores,
                                          float* chunk_max, float* chunk_sum, float* acc) {
  const int64_t n = end - begin, stride = row_stride<KV>(dim);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float rows[kUnroll][kMaxDim];  // keys or values, widened once for every query head
  {
    for (int64_t s = begin; s < end; s += kUnroll) {
      const int64_t count = std::min(kUnroll, end - s);
      for (int64_t u = 0; u < kUnroll; ++u) {
        if (u < count) {
          widen(k + (s + u) * stride, dim, rows[u]);
        } else {
          std::fill(rows[u], rows[u] + dim, 0.f);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const float* query = q + g * dim;
        float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
#pragma omp simd reduction(+ : d0, d1, d2, d3)
        for (int64_t d = 0; d < dim; ++d) {
          d0 += query[d] * rows[0][d];
          d1 += query[d] * rows[1][d];
          d2 += query[d] * rows[2][d];
          d3 += query[d] * rows[3][d];
        }
        // only the count slots that exist: past them lie the next query head's scores
        const float dots[kUnroll] = {d0, d1, d2, d3};
        float* out = scores + g * n + (s - begin);
        for (int64_t u = 0; u < count; ++u) out[u] = empty[s + u] ? neg_inf : dots[u];
      }
    }
  }
  {
    for (int64_t g = 0; g < group; ++g) {
      float* probs = scores + g * n;
      float m = neg_inf;
#pragma omp simd reduction(max : m)
      for (int64_t i = 0; i < n; ++i) m = std::max(m, probs[i]);
      float sum = 0.f;
      if (m != neg_inf) {
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < n; ++i) {
          probs[i] = exp_nonpositive(probs[i] - m);
          sum += probs[i];
        }
      } else {
        std::fill(probs, probs + n, 0.f);
      }
      chunk_max[g] = m;
      chunk_sum[g] = sum;
    }
  }
  std::fill(acc, acc + group * dim, 0.f);
  for (int64_t s = begin; s < end; s += kUnroll) {
    const int64_t count = std::min(kUnroll, end - s);
    for (int64_t u = 0; u < kUnroll; ++u) {
      if (u < count && !empty[s + u]) {
        widen(v + (s + u) * stride, dim, rows[u]);
      } else {
        std::fill(rows[u], rows[u] + dim, 0.f);  // NaN or stale values never leak in
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      const float* p = scores + g * n + (s - begin);
      const float p0 = p[0], p1 = count > 1 ? p[1] : 0.f, p2 = count > 2 ? p[2] : 0.f,
                  p3 = count > 3 ? p[3] : 0.f;
      float* out = acc + g * dim;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d)
        out[d] += p0 * rows[0][d] + p1 * rows[1][d] + p2 * rows[2][d] + p3 * rows[3][d];
    }
  }
}

// The kernel paths of one chunk: explicit AVX-512 loops (head dimensions that are multiples of
// 16), explicit AVX2 ones (multiples of 8, slot_attention_avx2.cpp), or the plain loops.
enum class ChunkPath { kAvx512, kAvx2, kPlain };

template <typename KV>
void attend_chunk(ChunkPath path, const float* q, const KV* k, const KV* v, const bool* empty,
                  int64_t begin, int64_t end, int64_t group, int64_t dim, float* scores,
                  float* chunk_max, float* chunk_sum, float* acc) {
#if SNAPSTREAM_AVX512
  if (path == ChunkPath::kAvx512) {
    scores_avx512(q, k, v, empty, begin, end, group, dim, scores);
    softmax_avx512(scores, end - begin, group, chunk_max, chunk_sum);
    values_avx512(scores, v, empty, begin, end, group, dim, acc);
    return;
  }
  if (path == ChunkPath::kAvx2)  // x86-64 builds only, as the AVX-512 loops
    return snapstream::slots::attend_chunk_avx2<KV>(q, k, v, empty, begin, end, group, dim,
                                                    scores, chunk_max, chunk_sum, acc);
#endif
  snapstream::run_vectorized([&]() SNAPSTREAM_BODY {
    attend_chunk_plain<KV>(q, k, v, empty, begin, end, group, dim, scores, chunk_max, chunk_sum,
                           acc);
  });
}

// The chunk path for head dimension ``dim`` on this CPU under the cap (isa.h).
ChunkPath chunk_path(int64_t dim) {
  const snapstream::Isa usable = snapstream::isa();
  if (usable.avx512 && dim % 16 == 0) return ChunkPath::kAvx512;
  return usable.avx2 && dim % 8 == 0 ? ChunkPath::kAvx2 : ChunkPath::kPlain;
}

template <typename KV>
void slot_attention_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& empty, at::Tensor& out) {
  const int64_t batch = k.size(0), kv_heads = k.size(1), slots = k.size(2), dim = q.size(2);
  const int64_t stride = row_stride<KV>(dim);
  const int64_t group = q.size(1) / kv_heads;
  const int64_t chunks = (slots + kChunk - 1) / kChunk;
  const float scale = 1.f / std::sqrt(static_cast<float>(dim));
  // per (row, KV head, chunk): max and sum per query head, then (G, D) weighted values
  std::vector<float> part_max(batch * kv_heads * chunks * group);
  std::vector<float> part_sum(part_max.size());
  std::vector<float> part_acc(part_max.size() * dim);
  const float* q_ptr = q.data_ptr<float>();
  const KV* k_ptr = k.data_ptr<KV>();
  const KV* v_ptr = v.data_ptr<KV>();
  const bool* empty_ptr = empty.data_ptr<bool>();
  const ChunkPath path = chunk_path(dim);

  at::parallel_for(0, batch * kv_heads * chunks, 1, [&](int64_t first, int64_t last) {
    float query[kMaxGroup * kMaxDim];
    std::vector<float> scores(group * kChunk);  // (G, chunk's slots)
    for (int64_t item = first; item < last; ++item) {
      const int64_t chunk = item % chunks, head = (item / chunks) % kv_heads;
      const int64_t row = item / (chunks * kv_heads);
      const float* q_src = q_ptr + (row * kv_heads + head) * group * dim;
      for (int64_t i = 0; i < group * dim; ++i) query[i] = q_src[i] * scale;
      const int64_t offset = (row * kv_heads + head) * slots * stride;
      const int64_t begin = chunk * kChunk, end = std::min(slots, begin + kChunk);
      attend_chunk<KV>(path, query, k_ptr + offset, v_ptr + offset, empty_ptr + row * slots,
                       begin, end, group, dim, scores.data(), &part_max[item * group],
                       &part_sum[item * group], &part_acc[item * group * dim]);
    }
  });

  float* out_ptr = out.data_ptr<float>();
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t first, int64_t last) {
    for (int64_t pair = first; pair < last; ++pair) {
      for (int64_t g = 0; g < group; ++g) {
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < chunks; ++c)
          m = std::max(m, part_max[(pair * chunks + c) * group + g]);
        float* dst = out_ptr + (pair * group + g) * dim;
        std::fill(dst, dst + dim, 0.f);
        float total = 0.f;
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t at = (pair * chunks + c) * group + g;
          if (part_sum[at] == 0.f) continue;
          const float weight = std::exp(part_max[at] - m);
          total += weight * part_sum[at];
          const float* src = &part_acc[at * dim];
          for (int64_t d = 0; d < dim; ++d) dst[d] += weight * src[d];
        }
        const float inv = total > 0.f ? 1.f / total : 0.f;
        for (int64_t d = 0; d < dim; ++d) dst[d] *= inv;
      }
    }
  });
}

template <typename KV, typename In>
void write_slots(const at::Tensor& cache, const at::Tensor& fresh, const at::Tensor& slots) {
  const int64_t batch = cache.size(0), kv_heads = cache.size(1), width = cache.size(2);
  const int64_t dim = fresh.size(2), stride = row_stride<KV>(dim);
  KV* dst = cache.data_ptr<KV>();
  const In* src = fresh.data_ptr<In>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t row = 0; row < batch; ++row) {
    TORCH_CHECK(slot[row] >= 0 && slot[row] < width, "slot_attention: slot ", slot[row],
                " of row ", row, " is outside [0, ", width, ")");
    for (int64_t head = 0; head < kv_heads; ++head) {
      KV* out = dst + ((row * kv_heads + head) * width + slot[row]) * stride;
      const In* in = src + (row * kv_heads + head) * dim;
      if constexpr (is_quantized<KV>()) {
        snapstream::quantize_row(in, dim, out);
      } else {
        for (int64_t d = 0; d < dim; ++d) out[d] = static_cast<KV>(static_cast<float>(in[d]));
      }
    }
  }
}

void write_both(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_new,
                const at::Tensor& v_new, const at::Tensor& slots) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, k_new.scalar_type(), "write_slots", [&] {
    using In = scalar_t;
    if (k.scalar_type() == at::kBFloat16) {
      write_slots<c10::BFloat16, In>(k, k_new, slots);
      write_slots<c10::BFloat16, In>(v, v_new, slots);
    } else if (k.scalar_type() == at::kFloat8_e4m3fn) {
      write_slots<c10::Float8_e4m3fn, In>(k, k_new, slots);
      write_slots<c10::Float8_e4m3fn, In>(v, v_new, slots);
    } else if (k.scalar_type() == at::kChar) {
      write_slots<int8_t, In>(k, k_new, slots);
      write_slots<int8_t, In>(v, v_new, slots);
    } else {
      write_slots<float, In>(k, k_new, slots);
      write_slots<float, In>(v, v_new, slots);
    }
  });
}

// Each row of x (..., D) float32, contiguous, replaced in place by its normalized Hadamard
// transform: kvquant.py's `hadamard`, its butterflies in the same order and then 1/sqrt(D), so
// the float32 bits are the same.
void hadamard_in_place(at::Tensor& x) {
  const int64_t dim = x.size(-1), rows = dim == 0 ? 0 : x.numel() / dim;
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
  float* data = x.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = data + r * dim;
    for (int64_t half = 1; half < dim; half *= 2) {
      for (int64_t block = 0; block < dim; block += 2 * half) {
        for (int64_t j = block; j < block + half; ++j) {
          const float a = row[j], b = row[j + half];
          row[j] = a + b;
          row[j + half] = a - b;
        }
      }
    }
    for (int64_t d = 0; d < dim; ++d) row[d] *= norm;
  }
}

// x (..., D) of any float dtype -> a new float32 tensor of its rows' Hadamard transforms.
at::Tensor hadamard_rows(const at::Tensor& x) {
  at::Tensor out = x.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
  hadamard_in_place(out);
  return out;
}

}  // namespace

namespace snapstream {

// Writes each row's new key and value into its slot of the cache, then attends.
// q (B, Hq, D) float32; k, v (B, Hkv, S, D) float32, bfloat16 or float8_e4m3fn, or
// (B, Hkv, S, D + 4) int8 rows (codes + scale), contiguous, updated in place;
// k_new, v_new (B, Hkv, D) of any float dtype; slots (B,) int64; empty (B, S) bool
// -> (B, Hq, D) float32. A row whose slots are all empty gets zeros.
at::Tensor slot_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& k_new, const at::Tensor& v_new,
                          const at::Tensor& slots, const at::Tensor& empty) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "slot_attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && v.sizes() == k.sizes() && empty.dim() == 2,
              "slot_attention: want q (B, Hq, D), k and v (B, Hkv, S, D), empty (B, S)");
  TORCH_CHECK(q.scalar_type() == at::kFloat, "slot_attention: q must be float32");
  const at::ScalarType kv_type = k.scalar_type();
  TORCH_CHECK(kv_type == v.scalar_type() &&
                  (kv_type == at::kFloat || kv_type == at::kBFloat16 || kv_type == at::kChar ||
                   kv_type == at::kFloat8_e4m3fn),
              "slot_attention: k and v must both be float32, bfloat16, int8 or float8_e4m3fn");
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous(),
              "slot_attention: the cache must be contiguous (it is written in place)");
  TORCH_CHECK(empty.scalar_type() == at::kBool, "slot_attention: empty must be bool");
  const int64_t batch = k.size(0), kv_heads = k.size(1), slots_n = k.size(2);
  const int64_t dim = kv_type == at::kChar ? k.size(3) - kScaleBytes : k.size(3);
  TORCH_CHECK(q.size(0) == batch && q.size(2) == dim && q.size(1) % kv_heads == 0,
              "slot_attention: q does not match k (an int8 cache's rows are D + 4 wide)");
  TORCH_CHECK(q.size(1) / kv_heads <= kMaxGroup && dim <= kMaxDim,
              "slot_attention: at most ", kMaxGroup, " query heads per KV head and ", kMaxDim,
              " dimensions");
  TORCH_CHECK(empty.size(0) == batch && empty.size(1) == slots_n,
              "slot_attention: empty does not match k");
  TORCH_CHECK(k_new.sizes() == v_new.sizes() && k_new.dim() == 3 && k_new.size(0) == batch &&
                  k_new.size(1) == kv_heads && k_new.size(2) == dim &&
                  k_new.scalar_type() == v_new.scalar_type(),
              "slot_attention: want k_new and v_new (B, Hkv, D) of one dtype");
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == batch && slots.scalar_type() == at::kLong,
              "slot_attention: want slots (B,) int64");
  // An fp8 row holds its values' Hadamard transform (kvquant.py): the step's key and value are
  // rotated before they are rounded, the query so that its dot products are unchanged, and the
  // output (a combination of rotated values) back.
  const bool rotated = kv_type == at::kFloat8_e4m3fn;
  TORCH_CHECK(!rotated || (dim & (dim - 1)) == 0,
              "slot_attention: an fp8 cache needs a power-of-two head dimension, got ", dim);
  if (rotated) {
    write_both(k, v, hadamard_rows(k_new), hadamard_rows(v_new), slots.contiguous());
  } else {
    write_both(k, v, k_new.contiguous(), v_new.contiguous(), slots.contiguous());
  }
  const at::Tensor qc = rotated ? hadamard_rows(q) : q.contiguous(), ec = empty.contiguous();
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (kv_type == at::kBFloat16) {
    slot_attention_impl<c10::BFloat16>(qc, k, v, ec, out);
  } else if (kv_type == at::kChar) {
    slot_attention_impl<int8_t>(qc, k, v, ec, out);
  } else if (kv_type == at::kFloat8_e4m3fn) {
    slot_attention_impl<c10::Float8_e4m3fn>(qc, k, v, ec, out);
    hadamard_in_place(out);
  } else {
    slot_attention_impl<float>(qc, k, v, ec, out);
  }
  return out;
}

}  // namespace snapstream

TORCH_LIBRARY_FRAGMENT(snapstream, m) {
  m.def("slot_attention(Tensor q, Tensor(a!) k, Tensor(b!) v, Tensor k_new, Tensor v_new, "
        "Tensor slots, Tensor empty) -> Tensor");
}

TORCH_LIBRARY_IMPL(snapstream, CPU, m) { m.impl("slot_attention", &snapstream::slot_attention); }
