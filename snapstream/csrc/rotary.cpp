// Rotary position embedding of a layer's query or key heads in one pass, as rope.py's
// apply_rotary: x * cos + rotate_half(x) * sin with rotate_half(x) = (-x2, x1) for the halves
// x1, x2 of each head, then times ``factor`` where it is not 1 (a query scale other than
// head_dim ** -0.5). The arithmetic is float32, each product and the sum rounded as torch
// rounds them in float32 (x1 * cos - x2 * sin is x1 * cos + (-x2) * sin exactly, signed zeros
// included). No fused multiply-add: the extension is built with -ffp-contract=off (the plain
// path, for the baseline and AVX2, computes as written), and the AVX-512 one multiplies with an
// explicit rounding mode besides. So float32 heads come out bit for bit as the torch ops give
// them, and as
// decode_layer.cpp rotates them; a bfloat16 head is rounded once at the end (torch's bfloat16
// ops round each of their three steps). It reads the heads where the QKV projection left them,
// (B, T, H, D) with any row strides, and writes them contiguous in that order: torch's five
// passes (neg, cat, two products, the sum) and their temporaries in one.

#include <torch/extension.h>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <type_traits>

#include "vector_math.h"

namespace {

template <typename T>
SNAPSTREAM_INLINE void rotate_head_generic(const T* in, T* out, const float* cos, const float* sin, int64_t dim,
                         float factor) {
  const int64_t half = dim / 2;
  for (int64_t d = 0; d < half; ++d) {
    const float x1 = static_cast<float>(in[d]), x2 = static_cast<float>(in[d + half]);
    float first = x1 * cos[d] - x2 * sin[d];
    float second = x2 * cos[d + half] + x1 * sin[d + half];
    if (factor != 1.f) {
      first *= factor;
      second *= factor;
    }
    out[d] = static_cast<T>(first);
    out[d + half] = static_cast<T>(second);
  }
}

#if SNAPSTREAM_AVX512

// a * b rounded to float32, never fused with a later sum
AVX512_ROWS inline __m512 mul(__m512 a, __m512 b) {
  return _mm512_mul_round_ps(a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// float or uint16_t (bfloat16 bits)
template <typename Bits>
AVX512_ROWS void rotate_head_avx512(const Bits* in, Bits* out, const float* cos,
                                    const float* sin, int64_t dim, float factor) {
  const int64_t half = dim / 2;
  const __m512 scale = _mm512_set1_ps(factor);
  for (int64_t d = 0; d < half; d += 16) {
    const __mmask16 lanes = snapstream::first_lanes(half - d);
    const __m512 x1 = snapstream::load16(in + d, lanes);
    const __m512 x2 = snapstream::load16(in + d + half, lanes);
    __m512 first = _mm512_sub_ps(mul(x1, _mm512_maskz_loadu_ps(lanes, cos + d)),
                                 mul(x2, _mm512_maskz_loadu_ps(lanes, sin + d)));
    __m512 second = _mm512_add_ps(mul(x2, _mm512_maskz_loadu_ps(lanes, cos + d + half)),
                                  mul(x1, _mm512_maskz_loadu_ps(lanes, sin + d + half)));
    if (factor != 1.f) {
      first = _mm512_mul_ps(first, scale);
      second = _mm512_mul_ps(second, scale);
    }
    snapstream::store16(out + d, first, lanes);
    snapstream::store16(out + d + half, second, lanes);
  }
}

#endif

template <typename T>
void rotate_head(const T* in, T* out, const float* cos, const float* sin, int64_t dim,
                 float factor) {
#if SNAPSTREAM_AVX512
  if constexpr (std::is_same_v<T, float>) {
    if (snapstream::avx512_rows()) return rotate_head_avx512(in, out, cos, sin, dim, factor);
  } else if constexpr (std::is_same_v<T, at::BFloat16>) {
    if (snapstream::avx512_rows())
      return rotate_head_avx512(reinterpret_cast<const uint16_t*>(in),
                                reinterpret_cast<uint16_t*>(out), cos, sin, dim, factor);
  }
#endif
  snapstream::run_vectorized(
      [&]() SNAPSTREAM_BODY { rotate_head_generic(in, out, cos, sin, dim, factor); });
}

}  // namespace

namespace snapstream {

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                  double factor) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 4 && x.size(3) % 2 == 0 && x.stride(3) == 1,
              "rotary: want x (B, T, H, D) on the CPU, D even, each head's D values adjacent");
  const int64_t batch = x.size(0), tokens = x.size(1), heads = x.size(2), dim = x.size(3);
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.numel() == batch * tokens * dim &&
                  cos.size(-1) == dim,
              "rotary: want cos and sin of B x T x D values (e.g. (B, 1, T, D)) for x of ",
              x.sizes());
  // cos, sin -> (B*T, D) float32
  const at::Tensor c = cos.to(at::kFloat).contiguous(), s = sin.to(at::kFloat).contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());  // (B, T, H, D) contiguous
  const float f = static_cast<float>(factor);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary", [&] {
    const scalar_t* in = x.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const float *cos_ptr = c.data_ptr<float>(), *sin_ptr = s.data_ptr<float>();
    const int64_t sb = x.stride(0), st = x.stride(1), sh = x.stride(2);
    at::parallel_for(0, batch * tokens * heads, 64, [&](int64_t first, int64_t last) {
      for (int64_t unit = first; unit < last; ++unit) {
        const int64_t row = unit / heads, head = unit % heads;  // row = b * T + t
        const int64_t b = row / tokens, t = row % tokens;
        rotate_head(in + b * sb + t * st + head * sh, dst + unit * dim, cos_ptr + row * dim,
                    sin_ptr + row * dim, dim, f);
      }
    });
  });
  return out;
}

}  // namespace snapstream

TORCH_LIBRARY_FRAGMENT(snapstream, m) {
  m.def("rotary(Tensor x, Tensor cos, Tensor sin, float factor) -> Tensor");
}

TORCH_LIBRARY_IMPL(snapstream, CPU, m) { m.impl("rotary", &snapstream::rotary); }
