// The slot cache's rows as the decode attention reads them (slot_attention.cpp, and the AVX2
// kernels of slot_attention_avx2.cpp): element types, an int8 row's scale, e^x.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace snapstream::slots {

constexpr int64_t kMaxGroup = 16; // query heads per KV head
constexpr int64_t kMaxDim = 256;  // head dimension

inline float to_float(float x) { return x; }
inline float to_float(int8_t x) { return static_cast<float>(x); }
inline float to_float(c10::Float8_e4m3fn x) { return static_cast<float>(x); }
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

constexpr int64_t kScaleBytes = 4;  // an int8 row's float32 scale, after its codes

template <typename KV>
constexpr bool is_quantized() { return std::is_same_v<KV, int8_t>; }

// Elements between one slot's row and the next: D, or D + 4 for int8.
template <typename KV>
inline int64_t row_stride(int64_t dim) { return is_quantized<KV>() ? dim + kScaleBytes : dim; }

// The float32 scale of a row of D codes (1 for a float row).
template <typename KV>
inline float row_scale(const KV* row, int64_t dim) {
  if constexpr (is_quantized<KV>()) {
    float scale;
    std::memcpy(&scale, row + dim, sizeof(scale));
    return scale;
  } else {
    return 1.f;
  }
}

// e^x for x <= 0 (a probability against its row's max), vectorizable: x = n ln2 + r with
// |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (relative error < 2e-7), 2^n written into
// the exponent bits. Below -87 (and for -inf) it gives 0.
inline float exp_nonpositive(float x) {
  const float clamped = std::max(x, -87.f);
  const float n = std::floor(clamped * 1.44269504f + 0.5f);
  const float r = (clamped - n * 0.693145752f) - n * 1.42860677e-6f;  // Cody-Waite ln2
  float p = 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < -87.f ? 0.f : p * scale;
}

// The AVX2 chunk of slot_attention.cpp's work split (slot_attention_avx2.cpp), for D a
// multiple of 8: q (G, D) pre-scaled; k, v (S, row_stride(D)); empty (S); scores scratch
// (G, end - begin) -> chunk_max (G), chunk_sum (G), acc (G, D).
template <typename KV>
void attend_chunk_avx2(const float* q, const KV* k, const KV* v, const bool* empty,
                       int64_t begin, int64_t end, int64_t group, int64_t dim, float* scores,
                       float* chunk_max, float* chunk_sum, float* acc);

}  // namespace snapstream::slots
