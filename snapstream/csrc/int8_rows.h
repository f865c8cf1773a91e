// One int8 K/V row (snapstream/kvquant.py's Int8KV): D codes, then the row's float32 scale in
// 4 bytes; scale = absmax / 127, code = x / scale rounded half to even, clamped to +-127, all
// codes 0 for an all-zero row. Shared by the prompt's rows (int8_rows.cpp) and the decode
// step's (slot_attention.cpp), so a row written by either is the same bytes. float32 and
// bfloat16 rows by AVX-512 where the CPU has it (max, true division and rounding are exact
// operations, so every path gives the same bits), plain C++ for the rest (vectorized for AVX2
// where the cap allows it).
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "vector_math.h"

namespace snapstream {

template <typename In>
SNAPSTREAM_INLINE void quantize_row_generic(const In* in, int64_t dim, int8_t* out) {
  float absmax = 0.f;
  for (int64_t d = 0; d < dim; ++d) absmax = std::max(absmax, std::fabs(static_cast<float>(in[d])));
  const float scale = absmax / 127.f;
  for (int64_t d = 0; d < dim; ++d) {
    const float code = scale > 0.f ? std::nearbyint(static_cast<float>(in[d]) / scale) : 0.f;
    out[d] = static_cast<int8_t>(std::clamp(code, -127.f, 127.f));
  }
  std::memcpy(out + dim, &scale, sizeof(scale));
}

#if SNAPSTREAM_AVX512

// float or uint16_t (bfloat16 bits)
template <typename Bits>
AVX512_ROWS void quantize_row_avx512(const Bits* in, int64_t dim, int8_t* out) {
  __m512 absmax = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; d += 16)
    absmax = _mm512_max_ps(absmax, _mm512_abs_ps(load16(in + d, first_lanes(dim - d))));
  const float scale = _mm512_reduce_max_ps(absmax) / 127.f;
  const __m512 divisor = _mm512_set1_ps(scale), bound = _mm512_set1_ps(127.f);
  for (int64_t d = 0; d < dim; d += 16) {
    const __mmask16 lanes = first_lanes(dim - d);
    __m512 code = _mm512_setzero_ps();
    if (scale > 0.f) {
      code = _mm512_roundscale_ps(_mm512_div_ps(load16(in + d, lanes), divisor),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      code = _mm512_min_ps(_mm512_max_ps(code, _mm512_sub_ps(_mm512_setzero_ps(), bound)), bound);
    }
    _mm512_mask_cvtsepi32_storeu_epi8(out + d, lanes, _mm512_cvtps_epi32(code));
  }
  std::memcpy(out + dim, &scale, sizeof(scale));
}

#endif

// in (D,) -> out (D + 4,) int8: codes, then the scale's bytes.
template <typename In>
void quantize_row(const In* in, int64_t dim, int8_t* out) {
#if SNAPSTREAM_AVX512
  if constexpr (std::is_same_v<In, float>) {
    if (avx512_rows()) return quantize_row_avx512(in, dim, out);
  } else if constexpr (std::is_same_v<In, c10::BFloat16>) {
    if (avx512_rows())
      return quantize_row_avx512(reinterpret_cast<const uint16_t*>(in), dim, out);
  }
#endif
  run_vectorized([&]() SNAPSTREAM_BODY { quantize_row_generic(in, dim, out); });
}

}  // namespace snapstream
