// The gated MLP's activation in one pass: act(gate) * up from the gate/up projection's output
// [gate | up], float32 arithmetic, one rounding to the input's dtype (torch's act(gate) * up is
// two passes over strided halves and a temporary, and rounds twice). Both activations are x * sigmoid(z(x)): SiLU with
// z = x, GELU's tanh form with z = 2 sqrt(2/pi) (x + 0.044715 x^3), as 0.5 (1 + tanh(y)) =
// sigmoid(2y), the sigmoid from 2^(-|z| log2(e)) (no libm call): float32 and bfloat16 by
// AVX-512 where the CPU has it, plain C++ elsewhere (vectorized for AVX2 where the cap allows
// it); other dtypes through ATen (act(gate) * up).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "ops.h"
#include "vector_math.h"

namespace {

using snapstream::avx512_rows;

constexpr float kTwoSqrtTwoOverPi = 1.5957691216057308f;

inline float widen(float value) { return value; }
inline float widen(at::BFloat16 value) { return static_cast<float>(value); }

struct Silu {
  static float z(float x) { return x; }
#if SNAPSTREAM_AVX512
  AVX512_ROWS static __m512 z(__m512 x) { return x; }
#endif
};

struct GeluTanh {
  static float z(float x) { return kTwoSqrtTwoOverPi * (x + 0.044715f * x * x * x); }
#if SNAPSTREAM_AVX512
  AVX512_ROWS static __m512 z(__m512 x) {
    const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    return _mm512_mul_ps(_mm512_set1_ps(kTwoSqrtTwoOverPi),
                         _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), cube, x));
  }
#endif
};

// x * sigmoid(z): e = 2^(-|z| log2 e) in (0, 1], sigmoid = 1 / (1 + e) for z >= 0, e / (1 + e)
// below (no overflow at either end)
inline float times_sigmoid(float x, float z) {
  const float e = snapstream::exp2_nonpositive(std::fabs(z) * -snapstream::kLog2e);
  const float inv = 1.f / (1.f + e);
  return x * (z < 0.f ? inv * e : inv);
}

// rows of [gate | up] (2 * inner each) -> rows of act(gate) * up (inner each), plain C++
template <typename Act, typename T>
SNAPSTREAM_INLINE void gate_rows_generic(const T* in, T* out, int64_t first, int64_t last,
                                         int64_t inner) {
  for (int64_t row = first; row < last; ++row) {
    const T *gate = in + row * 2 * inner, *up = gate + inner;
#pragma omp simd
    for (int64_t i = 0; i < inner; ++i) {
      const float x = widen(gate[i]);
      out[row * inner + i] = static_cast<T>(times_sigmoid(x, Act::z(x)) * widen(up[i]));
    }
  }
}

#if SNAPSTREAM_AVX512

// x * sigmoid(z) on 16 lanes: e = 2^(-|z| log2 e) in (0, 1], sigmoid = 1 / (1 + e) for z >= 0,
// e / (1 + e) below (no overflow at either end)
AVX512_ROWS inline __m512 times_sigmoid(__m512 x, __m512 z) {
  const __m512 magnitude = _mm512_abs_ps(z);
  const __m512 e = snapstream::exp2_nonpositive(
      _mm512_mul_ps(magnitude, _mm512_set1_ps(-snapstream::kLog2e)), snapstream::kExp2Float32);
  const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_add_ps(_mm512_set1_ps(1.f), e));
  const __mmask16 negative = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mul_ps(x, _mm512_mask_mul_ps(inv, negative, inv, e));
}

template <typename Act, typename T>
AVX512_ROWS void gate_rows_avx512(const T* in, T* out, int64_t first, int64_t last,
                                  int64_t inner) {
  using Bits = std::conditional_t<std::is_same_v<T, float>, float, uint16_t>;
  for (int64_t row = first; row < last; ++row) {
    const Bits* gate = reinterpret_cast<const Bits*>(in + row * 2 * inner);
    const Bits* up = gate + inner;
    Bits* dst = reinterpret_cast<Bits*>(out + row * inner);
    for (int64_t i = 0; i < inner; i += 16) {
      const __mmask16 lanes = snapstream::first_lanes(inner - i);
      const __m512 x = snapstream::load16(gate + i, lanes);
      const __m512 act = times_sigmoid(x, Act::z(x));
      snapstream::store16(dst + i, _mm512_mul_ps(act, snapstream::load16(up + i, lanes)), lanes);
    }
  }
}

#endif

template <typename Act, typename T>
void gate_all(const at::Tensor& x, at::Tensor& out, int64_t rows, int64_t inner) {
  const T* in = x.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1));
  at::parallel_for(0, rows, grain, [&](int64_t first, int64_t last) {
#if SNAPSTREAM_AVX512
    if (avx512_rows()) return gate_rows_avx512<Act>(in, dst, first, last, inner);
#endif
    snapstream::run_vectorized(
        [&]() SNAPSTREAM_BODY { gate_rows_generic<Act>(in, dst, first, last, inner); });
  });
}

using GateFn = void (*)(const at::Tensor&, at::Tensor&, int64_t, int64_t);

struct Activation {
  GateFn float32, bfloat16;
};

template <typename Act>
Activation activation_of() {
  return {gate_all<Act, float>, gate_all<Act, at::BFloat16>};
}

const std::unordered_map<std::string, Activation>& activations() {
  static const std::unordered_map<std::string, Activation> table = {
      {"silu", activation_of<Silu>()}, {"gelu_tanh", activation_of<GeluTanh>()}};
  return table;
}

}  // namespace

namespace snapstream {

void check_activation(const std::string& activation, const char* op) {
  TORCH_CHECK(activations().count(activation), op,
              ": activation must be silu or gelu_tanh, got ", activation);
}

at::Tensor gated_activation(const at::Tensor& x, const std::string& activation) {
  check_activation(activation, "gated_activation");
  const Activation& act = activations().at(activation);
  TORCH_CHECK(x.device().is_cpu() && x.dim() >= 1 && x.size(-1) % 2 == 0,
              "gated_activation: want a CPU tensor (..., 2I) holding [gate | up]");
  const int64_t inner = x.size(-1) / 2;
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) {  // ATen's, 2 passes
    const at::Tensor gate = x.narrow(-1, 0, inner), up = x.narrow(-1, inner, inner);
    return (activation == "silu" ? at::silu(gate) : at::gelu(gate, "tanh")) * up;
  }
  const at::Tensor xc = x.contiguous();
  const int64_t rows = inner ? x.numel() / (2 * inner) : 0;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = inner;
  at::Tensor out = at::empty(shape, x.options());
  if (rows == 0) return out;
  (x.scalar_type() == at::kFloat ? act.float32 : act.bfloat16)(xc, out, rows, inner);
  return out;
}

}  // namespace snapstream

TORCH_LIBRARY_FRAGMENT(snapstream, m) {
  m.def("gated_activation(Tensor x, str activation) -> Tensor");
}

TORCH_LIBRARY_IMPL(snapstream, CPU, m) {
  m.impl("gated_activation", &snapstream::gated_activation);
}
