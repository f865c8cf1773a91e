// The prompt attention's float32 tile kernels for AVX2 + FMA (prompt_attention.cpp has the
// algorithm and the driver). Sixteen 8-lane registers shape the tiles: scores of 6 query rows
// against 16 keys of a K^T panel at a time (12 accumulators, 2 key vectors, the broadcast
// query element: 12 FMAs per 8 loads), P V in tiles of 2 rows by 32 output dimensions (8
// accumulators, 4 value vectors: 8 FMAs per 6 loads), the softmax's 2^x by the same degree-6
// polynomial as the AVX-512 kernel's float32 (vector_math.h).

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "prompt_attention.h"
#include "vector_math.h"

namespace snapstream::prompt {
namespace {

#define SNAPSTREAM_AVX2 __attribute__((target("avx2,fma,f16c")))

constexpr int64_t kKeys = 16;      // keys per scores tile (2 vectors)
constexpr int kValueRows = 2;      // rows per P V tile
constexpr int64_t kValueDims = 32;  // output dimensions per P V tile (4 vectors)

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

// 2^x for x <= 0 on 8 lanes (vector_math.h's exp2_nonpositive, with fused multiply-adds):
// 0 below -126, for -inf and NaN.
SNAPSTREAM_AVX2 inline __m256 exp2_nonpositive(__m256 x) {
  const __m256 floor = _mm256_set1_ps(-126.f);
  const __m256 live = _mm256_cmp_ps(x, floor, _CMP_GE_OQ);
  const __m256 clamped = _mm256_max_ps(x, floor);
  const __m256 n = _mm256_round_ps(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(clamped, n);
  __m256 p = _mm256_set1_ps(kExp2Float32[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Float32[i]));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), live);
}

// Scores of ROWS query rows (D each) against 16 keys of a K^T panel (D, 64) from key ``at``:
// s (ROWS, s_stride) at the same 16 columns, -inf outside row r's visible keys [begin[r],
// end[r]) (indices into the panel); mx[r] keeps the largest visible score.
template <int ROWS>
SNAPSTREAM_AVX2 inline void scores_tile(const float* q, int64_t dim, const float* panel,
                                        int64_t at, const int64_t* begin, const int64_t* end,
                                        float* s, int64_t s_stride, __m256* mx) {
  __m256 acc[ROWS][2];
  for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const float* keys = panel + at;
  int64_t d = 0;  // dim > 0; without a zero-trip path gcc keeps the sums in registers
  do {
    const __m256 k0 = _mm256_loadu_ps(keys + d * kPanel), k1 = _mm256_loadu_ps(keys + d * kPanel + 8);
    for (int r = 0; r < ROWS; ++r) {
      const __m256 qd = _mm256_broadcast_ss(q + r * dim + d);
      acc[r][0] = _mm256_fmadd_ps(qd, k0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(qd, k1, acc[r][1]);
    }
  } while (++d < dim);
  const __m256 masked = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int r = 0; r < ROWS; ++r) {
    for (int h = 0; h < 2; ++h) {
      const __m256i index = _mm256_add_epi32(lanes, _mm256_set1_epi32(static_cast<int>(at + 8 * h)));
      const int first = static_cast<int>(std::clamp<int64_t>(begin[r], -1, kPanel));
      const int stop = static_cast<int>(std::clamp<int64_t>(end[r], -1, kPanel));
      const __m256i visible =
          _mm256_and_si256(_mm256_cmpgt_epi32(index, _mm256_set1_epi32(first - 1)),
                           _mm256_cmpgt_epi32(_mm256_set1_epi32(stop), index));
      const __m256 x = _mm256_blendv_ps(masked, acc[r][h], _mm256_castsi256_ps(visible));
      _mm256_storeu_ps(s + r * s_stride + at + 8 * h, x);
      mx[r] = _mm256_max_ps(mx[r], x);
    }
  }
}

// One row's raw scores s[:n] (n a multiple of 64, -inf where masked, s_max the largest), times
// scale -> probabilities p[:n] against the running max m (updated, scaled), l (the running
// sum, updated); returns the factor the row's output must be multiplied by before this block's
// P V is added.
SNAPSTREAM_AVX2 inline float softmax_row(const float* s, float* p, int64_t n, float scale,
                                         float s_max, float& m, float& l) {
  const float m_new = std::max(m, s_max * scale);
  if (m_new == -std::numeric_limits<float>::infinity()) {  // no key seen yet: P = 0
    std::fill(p, p + n, 0.f);
    return 1.f;
  }
  const __m256 shift = _mm256_set1_ps(m_new), factor = _mm256_set1_ps(scale);
  __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // two chains of adds
  for (int64_t i = 0; i < n; i += 16) {
    for (int h = 0; h < 2; ++h) {
      const __m256 e =
          exp2_nonpositive(_mm256_fmsub_ps(_mm256_loadu_ps(s + i + 8 * h), factor, shift));
      _mm256_storeu_ps(p + i + 8 * h, e);
      sum[h] = _mm256_add_ps(sum[h], e);
    }
  }
  const float alpha = m == -std::numeric_limits<float>::infinity() ? 0.f : std::exp2(m - m_new);
  m = m_new;
  l = l * alpha + horizontal_sum(_mm256_add_ps(sum[0], sum[1]));
  return alpha;
}

// o (ROWS, o_stride) += p (ROWS, p_stride) [:, :n] @ v (n, D), 32 output dimensions at a time.
template <int ROWS>
SNAPSTREAM_AVX2 inline void values_tile(const float* p, int64_t p_stride, const float* v,
                                        int64_t n, int64_t dim, float* o, int64_t o_stride) {
  for (int64_t c = 0; c < dim; c += kValueDims) {
    __m256 acc[ROWS][4];
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_loadu_ps(o + r * o_stride + c + 8 * j);
    for (int64_t key = 0; key < n; ++key) {
      const float* values = v + key * dim + c;
      const __m256 v0 = _mm256_loadu_ps(values), v1 = _mm256_loadu_ps(values + 8);
      const __m256 v2 = _mm256_loadu_ps(values + 16), v3 = _mm256_loadu_ps(values + 24);
      for (int r = 0; r < ROWS; ++r) {
        const __m256 pk = _mm256_broadcast_ss(p + r * p_stride + key);
        acc[r][0] = _mm256_fmadd_ps(pk, v0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(pk, v1, acc[r][1]);
        acc[r][2] = _mm256_fmadd_ps(pk, v2, acc[r][2]);
        acc[r][3] = _mm256_fmadd_ps(pk, v3, acc[r][3]);
      }
    }
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < 4; ++j) _mm256_storeu_ps(o + r * o_stride + c + 8 * j, acc[r][j]);
  }
}

template <int ROWS>
SNAPSTREAM_AVX2 void tile_step(const float* q, const float* kt_panels, const float* v,
                               int64_t key0, int64_t n, int64_t dim, float scale,
                               const int64_t* first, const int64_t* last, float* s, float* p,
                               float* o, float* m, float* l) {
  const int64_t padded = (n + kPanel - 1) / kPanel * kPanel;
  int64_t begin[ROWS], end[ROWS];  // row r's visible keys, indices into the panel in hand
  __m256 mx[ROWS];
  for (int r = 0; r < ROWS; ++r) {
    begin[r] = first[r] - key0;
    end[r] = last[r] - key0 + 1;
    mx[r] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  }
  for (int64_t panel = 0; panel < padded; panel += kPanel) {
    for (int64_t at = 0; at < kPanel; at += kKeys)
      scores_tile<ROWS>(q, dim, kt_panels + (key0 + panel) * dim, at, begin, end, s + panel,
                        kKeyBlock, mx);
    for (int r = 0; r < ROWS; ++r) {
      begin[r] -= kPanel;
      end[r] -= kPanel;
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    const float alpha = softmax_row(s + r * kKeyBlock, p + r * kKeyBlock, padded, scale,
                                    horizontal_max(mx[r]), m[r], l[r]);
    if (alpha != 1.f) {
      const __m256 a = _mm256_set1_ps(alpha);
      for (int64_t d = 0; d < dim; d += 8)
        _mm256_storeu_ps(o + r * dim + d, _mm256_mul_ps(a, _mm256_loadu_ps(o + r * dim + d)));
    }
  }
  int r0 = 0;
  for (; r0 + kValueRows <= ROWS; r0 += kValueRows)
    values_tile<kValueRows>(p + r0 * kKeyBlock, kKeyBlock, v + key0 * dim, n, dim, o + r0 * dim,
                            dim);
  if (r0 < ROWS)
    values_tile<1>(p + r0 * kKeyBlock, kKeyBlock, v + key0 * dim, n, dim, o + r0 * dim, dim);
}

SNAPSTREAM_AVX2 void store_row(float* dst, const float* o, float inv, int64_t dim) {
  const __m256 f = _mm256_set1_ps(inv);
  for (int64_t d = 0; d < dim; d += 8)
    _mm256_storeu_ps(dst + d, _mm256_mul_ps(f, _mm256_loadu_ps(o + d)));
}

}  // namespace

const TileKernels<float>& avx2_float_kernels() {
  static const TileKernels<float> kernels = {
      {tile_step<1>, tile_step<2>, tile_step<3>, tile_step<4>, tile_step<5>, tile_step<6>},
      store_row};
  return kernels;
}

}  // namespace snapstream::prompt
