// Helpers shared by the element-wise kernels and the prompt attention: 2^x and log2(e) in plain
// C++ (one value, vectorized by the compiler in run_vectorized's loops), and AVX-512's 16 lanes
// of float32 or bfloat16 (raw bits) in and out. Callers check the CPU at run time
// (``avx512_rows()``) and keep a plain C++ path for the rest.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "isa.h"

namespace snapstream {

constexpr float kLog2e = 1.44269504088896341f;

// For float32 results: 2^f's degree-6 Taylor polynomial in f ln2, relative error < 2e-7.
constexpr float kExp2Float32[] = {
    1.5403530e-4f,  // ln2^6 / 720
    1.3333558e-3f,  // ln2^5 / 120
    9.6181291e-3f,  // ln2^4 / 24
    5.5504109e-2f,  // ln2^3 / 6
    2.4022651e-1f,  // ln2^2 / 2
    6.9314718e-1f,  // ln2
    1.f};

// 2^x for x <= 0 as the AVX-512 version below computes it (x = n + f, |f| <= 1/2, 2^f by
// kExp2Float32's polynomial, 2^n written into the exponent bits), each step rounded: 0 below
// -126 (no denormals), for -inf and for NaN.
SNAPSTREAM_INLINE float exp2_nonpositive(float x) {
  const float clamped = std::max(x, -126.f);
  const float n = std::nearbyint(clamped), f = clamped - n;
  float p = kExp2Float32[0];
  for (int i = 1; i < 7; ++i) p = p * f + kExp2Float32[i];
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x >= -126.f ? p * scale : 0.f;
}

// This CPU runs the AVX-512 row kernels (F, BW and VL) under the cap (isa.h); false off x86-64.
inline bool avx512_rows() { return isa().avx512; }

}  // namespace snapstream

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SNAPSTREAM_AVX512 1
#define AVX512_ROWS __attribute__((target("avx512f,avx512bw,avx512vl")))
#define AVX512F_ONLY __attribute__((target("avx512f")))  // inlines into either kind of caller

namespace snapstream {

// 2^x for x <= 0 on 16 lanes: x = n + f, |f| <= 1/2, 2^f by a polynomial in f (coefficients
// highest degree first), times 2^n by vscalefps; 0 below -126 (no denormals) and for -inf.
template <int N>
AVX512F_ONLY inline __m512 exp2_nonpositive(__m512 x, const float (&coefficients)[N]) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.f), _CMP_GE_OQ);
  const __m512 clamped = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
  const __m512 n = _mm512_roundscale_ps(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(clamped, n);
  __m512 p = _mm512_set1_ps(coefficients[0]);
  for (int i = 1; i < N; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(coefficients[i]));
  return _mm512_maskz_scalef_ps(live, p, n);
}

// For results rounded to bfloat16 (2^-9 relative): a degree-3 polynomial fitted to 2^f on
// [-1/2, 1/2] for the least largest relative error, < 7.7e-5.
constexpr float kExp2Bfloat16[] = {5.52226231e-2f, 2.42615268e-1f, 6.93251610e-1f,
                                   9.99927580e-1f};

// The lanes of ``mask`` from p (float32, or bfloat16 bits widened), 0 elsewhere.
AVX512_ROWS inline __m512 load16(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}
AVX512_ROWS inline __m512 load16(const uint16_t* p, __mmask16 mask) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// The lanes of ``mask`` to p: float32, or rounded to bfloat16 (to nearest, ties to even, NaN
// kept a NaN: c10::BFloat16's rounding) with AVX-512F integer steps, no AVX512-BF16 needed.
AVX512_ROWS inline void store16(float* p, __m512 v, __mmask16 mask) {
  _mm512_mask_storeu_ps(p, mask, v);
}
AVX512_ROWS inline void store16(uint16_t* p, __m512 v, __mmask16 mask) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  rounded = _mm512_srli_epi32(rounded, 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0));
  _mm512_mask_cvtepi32_storeu_epi16(p, mask, rounded);
}

// The first ``n`` of 16 lanes (n >= 16: all).
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

}  // namespace snapstream

#endif
