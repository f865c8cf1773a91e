// RMSNorm on the CPU in one pass per row (torch 2.13's CPU rms_norm is a composite of ~7 ops,
// ~15 us on a 576-wide row): float32 arithmetic, input and output in the input's dtype.
// float32 and bfloat16 rows by AVX-512 where the CPU has it (a plain C++ loop over bfloat16
// does not vectorize: c10::BFloat16's conversions branch), the plain loop for the rest,
// vectorized for AVX2 where the cap allows it (isa.h).

#include <torch/extension.h>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <type_traits>

#include "ops.h"
#include "vector_math.h"

namespace {

template <typename T>
SNAPSTREAM_INLINE void rms_norm_rows(const T* x, const T* weight, T* out, int64_t first, int64_t last,
                   int64_t width, float eps) {
  for (int64_t row = first; row < last; ++row) {
    const T* in = x + row * width;
    float squares = 0.f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < width; ++i) {
      const float value = static_cast<float>(in[i]);
      squares += value * value;
    }
    const float scale = 1.f / std::sqrt(squares / width + eps);
    T* dst = out + row * width;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i)
      dst[i] = static_cast<T>(static_cast<float>(in[i]) * scale * static_cast<float>(weight[i]));
  }
}

#if SNAPSTREAM_AVX512

// float or uint16_t (bfloat16 bits)
template <typename Bits>
AVX512_ROWS void rms_norm_rows_avx512(const Bits* x, const Bits* weight, Bits* out,
                                      int64_t first, int64_t last, int64_t width, float eps) {
  for (int64_t row = first; row < last; ++row) {
    const Bits* in = x + row * width;
    __m512 squares = _mm512_setzero_ps();
    for (int64_t i = 0; i < width; i += 16) {
      const __m512 value = snapstream::load16(in + i, snapstream::first_lanes(width - i));
      squares = _mm512_fmadd_ps(value, value, squares);
    }
    const __m512 scale =
        _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(squares) / width + eps));
    Bits* dst = out + row * width;
    for (int64_t i = 0; i < width; i += 16) {
      const __mmask16 lanes = snapstream::first_lanes(width - i);
      const __m512 value = _mm512_mul_ps(snapstream::load16(in + i, lanes), scale);
      snapstream::store16(dst + i, _mm512_mul_ps(value, snapstream::load16(weight + i, lanes)),
                          lanes);
    }
  }
}

// The AVX-512 rows for float32 and bfloat16; false for other dtypes.
template <typename T>
bool rms_norm_avx512(const T* x, const T* weight, T* out, int64_t first, int64_t last,
                     int64_t width, float eps) {
  if constexpr (std::is_same_v<T, float>) {
    rms_norm_rows_avx512(x, weight, out, first, last, width, eps);
    return true;
  } else if constexpr (std::is_same_v<T, at::BFloat16>) {
    using Bits = const uint16_t*;
    rms_norm_rows_avx512(reinterpret_cast<Bits>(x), reinterpret_cast<Bits>(weight),
                         reinterpret_cast<uint16_t*>(out), first, last, width, eps);
    return true;
  }
  return false;
}

#endif

}  // namespace

namespace snapstream {

// x (..., H), weight (H,) of x's dtype -> x / rms(x) * weight, (..., H)
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "rms_norm: CPU tensors only");
  TORCH_CHECK(weight.dim() == 1 && x.size(-1) == weight.size(0) &&
                  weight.scalar_type() == x.scalar_type(),
              "rms_norm: want x (..., H) and weight (H,) of one dtype");
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t width = x.size(-1), rows = width ? x.numel() / width : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const scalar_t *in = xc.data_ptr<scalar_t>(), *w = wc.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 16, [&](int64_t first, int64_t last) {
#if SNAPSTREAM_AVX512
      if (avx512_rows() &&
          rms_norm_avx512(in, w, dst, first, last, width, static_cast<float>(eps)))
        return;
#endif
      snapstream::run_vectorized([&]() SNAPSTREAM_BODY {
        rms_norm_rows(in, w, dst, first, last, width, static_cast<float>(eps));
      });
    });
  });
  return out;
}

}  // namespace snapstream

TORCH_LIBRARY_FRAGMENT(snapstream, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(snapstream, CPU, m) { m.impl("rms_norm", &snapstream::rms_norm); }
