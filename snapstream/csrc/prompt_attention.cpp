// Causal attention over a prompt on the CPU, flash-style: no T x T score matrix, GQA without
// repeating K/V (a KV head's query heads are rows of one pass), online softmax in base 2;
// optionally within a sliding window of positions (Gemma 3's local layers), the tokens'
// positions given when they are not 0..T-1. Two element types, one algorithm:
// - float32 (the prompt's dtype where there is no bfloat16 hardware) on CPUs with AVX-512F:
//   scores and P V by FMAs (with AVX2 alone torch's SDPA is faster than 8-lane tiles of ours
//   were: docs/architecture.md, "Kernels by machine");
// - bfloat16 on CPUs with AVX512-BF16 but no AMX: scores and P V by vdpbf16ps (pairs of
//   dimensions, pairs of keys; float32 sums), the probabilities rounded to bfloat16 for P V as
//   torch's flash SDPA does, their 2^x by a degree-3 polynomial (relative error < 7.7e-5, well
//   under that rounding's 2^-9; float32's is degree 6). On AMX CPUs torch's SDPA runs
//   bfloat16 on AMX tiles and is kept (an AMX kernel of ours lost to it at 4k and 8k:
//   docs/benchmarks.md, "Prefill").
// ``prompt_attention_covers`` says which inputs it takes, and the caller
// (snapstream/attention.py, ``causal_attention``) runs torch's SDPA for the rest (other head
// sizes and CPUs, and the generic cap of isa.h).
//
// Work item = (sequence, KV head, block of kPositions query positions): its rows
// (position-major, the G query heads of a position side by side) stream their key range in
// blocks of kKeyBlock keys; within a block each tile of kRows rows computes its scores against
// 64-key panels of K^T (24 accumulators in registers; the panel's masked keys set to -inf and
// the rows' max kept as the scores leave the registers), updates its rows' max and sum, and adds
// P V into its rows' output (the same 6 x 64 register tile). A block's K and V (128 KiB at
// D = 64 in float32) stay in L2 while every tile of the item reads them. Items run from the
// last positions back, dynamically scheduled: without a window that is longest first (the
// causal triangle makes late positions costlier); with one, items cost about the same.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "isa.h"
#include "prompt_attention.h"
#include "vector_math.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SNAPSTREAM_PROMPT_AVX512 1
// The float32 instantiations use AVX-512F instructions only (no bfloat16 intrinsic is reached
// from them), so they run on AVX-512F CPUs without AVX512-BF16.
#define KERNEL __attribute__((target("avx512f,avx512bf16")))
#endif

namespace {

using snapstream::prompt::kKeyBlock;
using snapstream::prompt::kPanel;  // keys per AVX-512 register tile (4 vectors) and K^T panel
using snapstream::prompt::kPositions;
using snapstream::prompt::kRows;
using snapstream::prompt::TileKernels;

#if SNAPSTREAM_PROMPT_AVX512

using bf16 = uint16_t;  // a bfloat16's bits

// Two bfloat16s (elements i and i + 1 of p) in every 32-bit lane.
KERNEL inline __m512bh broadcast_pair(const bf16* p) {
  int32_t pair;
  std::memcpy(&pair, p, sizeof pair);
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
}

KERNEL inline __m512bh load_bf16(const bf16* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

// What a tile multiplies, per element type: vectors of 16 float32 lanes, or of 16 pairs of
// bfloat16s; one element (float32) or pair (bfloat16) of a query or probability row broadcast;
// the multiply-add into float32 sums (FMA, or vdpbf16ps over each lane's pair). kStep elements
// per multiply along the summed axis. The probabilities' 2^x is as precise as they are kept.
template <typename E>
struct Lanes;

template <>
struct Lanes<float> {
  using Vec = __m512;
  static constexpr int64_t kStep = 1;
  KERNEL static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  KERNEL static Vec broadcast(const float* p) { return _mm512_set1_ps(*p); }
  KERNEL static __m512 madd(__m512 acc, Vec a, Vec b) { return _mm512_fmadd_ps(a, b, acc); }
  KERNEL static __m512 exp2(__m512 x) {
    return snapstream::exp2_nonpositive(x, snapstream::kExp2Float32);
  }
};

template <>
struct Lanes<bf16> {
  using Vec = __m512bh;
  static constexpr int64_t kStep = 2;
  KERNEL static Vec load(const bf16* p) { return load_bf16(p); }
  KERNEL static Vec broadcast(const bf16* p) { return broadcast_pair(p); }
  KERNEL static __m512 madd(__m512 acc, Vec a, Vec b) { return _mm512_dpbf16_ps(acc, a, b); }
  KERNEL static __m512 exp2(__m512 x) {
    return snapstream::exp2_nonpositive(x, snapstream::kExp2Bfloat16);
  }
};

// The bits of lanes [0, n) of 64 (n clamped to 0..64).
inline uint64_t low_lanes(int64_t n) {
  return n >= 64 ? ~uint64_t{0} : n <= 0 ? uint64_t{0} : (uint64_t{1} << n) - 1;
}

// Scores of ROWS query rows (D each) against one 64-key panel of K^T: s (ROWS, s_stride), 64
// per row, -inf outside row r's visible keys [begin[r], end[r]) (indices into the panel);
// mx[r] keeps the largest visible score in 16 lanes. float32: panel (D, 64); bfloat16: panel
// (D/2, 64, 2), a key's dimension pair adjacent.
template <int ROWS, typename E>
KERNEL inline void scores_tile(const E* q, int64_t dim, const E* panel, const int64_t* begin,
                               const int64_t* end, float* s, int64_t s_stride, __m512* mx) {
  using L = Lanes<E>;
  constexpr int64_t kVec = 16 * L::kStep;  // elements per panel vector
  __m512 acc[ROWS][4];
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  int64_t d = 0;  // dim > 0; without a zero-trip path gcc keeps the sums in registers
  do {
    const E* keys = panel + d * kPanel;  // dimension d (or pair d / 2) of 64 keys
    const typename L::Vec k0 = L::load(keys), k1 = L::load(keys + kVec);
    const typename L::Vec k2 = L::load(keys + 2 * kVec), k3 = L::load(keys + 3 * kVec);
    for (int r = 0; r < ROWS; ++r) {
      const typename L::Vec qd = L::broadcast(q + r * dim + d);
      acc[r][0] = L::madd(acc[r][0], qd, k0);
      acc[r][1] = L::madd(acc[r][1], qd, k1);
      acc[r][2] = L::madd(acc[r][2], qd, k2);
      acc[r][3] = L::madd(acc[r][3], qd, k3);
    }
    d += L::kStep;
  } while (d < dim);
  const __m512 masked = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int r = 0; r < ROWS; ++r) {
    const uint64_t visible = low_lanes(end[r]) & ~low_lanes(begin[r]);
    for (int j = 0; j < 4; ++j) {
      const __m512 x = _mm512_mask_blend_ps(static_cast<__mmask16>(visible >> (16 * j)), masked,
                                            acc[r][j]);
      _mm512_storeu_ps(s + r * s_stride + j * 16, x);
      mx[r] = _mm512_max_ps(mx[r], x);
    }
  }
}

// o (ROWS, o_stride) += p (ROWS, p_stride) [:, :n] @ v (n, D), 64 output dimensions at a time.
// float32: v (n, D); bfloat16: v (n/2, D, 2), a dimension's key pair adjacent, n rounded up to
// even (p is 0 and v finite past n).
template <int ROWS, typename E>
KERNEL inline void values_tile(const E* p, int64_t p_stride, const E* v, int64_t n,
                               int64_t dim, float* o, int64_t o_stride) {
  using L = Lanes<E>;
  constexpr int64_t kVec = 16 * L::kStep;  // elements per value vector
  for (int64_t c = 0; c < dim; c += 64) {
    __m512 acc[ROWS][4];
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_loadu_ps(o + r * o_stride + c + j * 16);
    for (int64_t key = 0; key < n; key += L::kStep) {
      const E* values = v + key * dim + c * L::kStep;  // key (or pair key / 2), c..c+63
      const typename L::Vec v0 = L::load(values), v1 = L::load(values + kVec);
      const typename L::Vec v2 = L::load(values + 2 * kVec), v3 = L::load(values + 3 * kVec);
      for (int r = 0; r < ROWS; ++r) {
        const typename L::Vec pk = L::broadcast(p + r * p_stride + key);
        acc[r][0] = L::madd(acc[r][0], pk, v0);
        acc[r][1] = L::madd(acc[r][1], pk, v1);
        acc[r][2] = L::madd(acc[r][2], pk, v2);
        acc[r][3] = L::madd(acc[r][3], pk, v3);
      }
    }
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < 4; ++j) _mm512_storeu_ps(o + r * o_stride + c + j * 16, acc[r][j]);
  }
}

// 16 float32 lanes into the element type (probabilities for P V, output rows).
KERNEL inline void store16(float* p, __m512 e) { _mm512_storeu_ps(p, e); }
KERNEL inline void store16(bf16* p, __m512 e) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
}

// One row's raw scores s[:n] (n a multiple of 32, -inf where masked, s_max the largest),
// times scale (log2(e) / sqrt(D)) -> probabilities p[:n] against the running max m (updated,
// scaled), l (the running sum, updated); returns the factor the row's output must be
// multiplied by before this block's P V is added.
template <typename E>
KERNEL inline float softmax_row(const float* s, E* p, int64_t n, float scale, float s_max,
                                float& m, float& l) {
  const float m_new = std::max(m, s_max * scale);
  if (m_new == -std::numeric_limits<float>::infinity()) {  // no key seen yet: P = 0
    std::fill(p, p + n, E{0});
    return 1.f;
  }
  const __m512 shift = _mm512_set1_ps(m_new), factor = _mm512_set1_ps(scale);
  __m512 sum[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};  // two chains of adds
  for (int64_t i = 0; i < n; i += 32) {
    for (int h = 0; h < 2; ++h) {
      const __m512 x = _mm512_fmsub_ps(_mm512_loadu_ps(s + i + 16 * h), factor, shift);
      const __m512 e = Lanes<E>::exp2(x);
      store16(p + i + 16 * h, e);
      sum[h] = _mm512_add_ps(sum[h], e);
    }
  }
  const float alpha = m == -std::numeric_limits<float>::infinity() ? 0.f : std::exp2(m - m_new);
  m = m_new;
  l = l * alpha + _mm512_reduce_add_ps(_mm512_add_ps(sum[0], sum[1]));
  return alpha;
}

// ROWS query rows against keys [key0, key0 + n): row r sees keys first[r]..last[r] (indices).
// s (ROWS, kKeyBlock) scores and p (ROWS, kKeyBlock) probabilities are scratch.
template <typename E, int ROWS>
KERNEL void tile_step(const E* q, const E* kt_panels, const E* v, int64_t key0, int64_t n,
                      int64_t dim, float scale, const int64_t* first, const int64_t* last,
                      float* s, E* p, float* o, float* m, float* l) {
  const int64_t padded = (n + kPanel - 1) / kPanel * kPanel;
  int64_t begin[ROWS], end[ROWS];  // row r's visible keys, indices into the panel in hand
  __m512 mx[ROWS];
  for (int r = 0; r < ROWS; ++r) {
    begin[r] = first[r] - key0;
    end[r] = last[r] - key0 + 1;
    mx[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  }
  for (int64_t panel = 0; panel < padded; panel += kPanel) {
    scores_tile<ROWS>(q, dim, kt_panels + (key0 + panel) * dim, begin, end, s + panel, kKeyBlock,
                      mx);
    for (int r = 0; r < ROWS; ++r) {
      begin[r] -= kPanel;
      end[r] -= kPanel;
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    const float alpha = softmax_row(s + r * kKeyBlock, p + r * kKeyBlock, padded, scale,
                                    _mm512_reduce_max_ps(mx[r]), m[r], l[r]);
    if (alpha != 1.f) {
      const __m512 a = _mm512_set1_ps(alpha);
      for (int64_t d = 0; d < dim; d += 16)
        _mm512_storeu_ps(o + r * dim + d, _mm512_mul_ps(a, _mm512_loadu_ps(o + r * dim + d)));
    }
  }
  values_tile<ROWS>(p, kKeyBlock, v + key0 * dim, n, dim, o, dim);
}

// dst[:D] = o[:D] * inv in the output's element type (D a multiple of 16).
KERNEL inline void store_row(float* dst, const float* o, float inv, int64_t dim) {
  const __m512 f = _mm512_set1_ps(inv);
  for (int64_t d = 0; d < dim; d += 16)
    _mm512_storeu_ps(dst + d, _mm512_mul_ps(f, _mm512_loadu_ps(o + d)));
}
KERNEL inline void store_row(bf16* dst, const float* o, float inv, int64_t dim) {
  const __m512 f = _mm512_set1_ps(inv);
  for (int64_t d = 0; d < dim; d += 16)
    store16(dst + d, _mm512_mul_ps(f, _mm512_loadu_ps(o + d)));
}

template <typename E>
const TileKernels<E>& avx512_kernels() {
  static const TileKernels<E> kernels = {
      {tile_step<E, 1>, tile_step<E, 2>, tile_step<E, 3>, tile_step<E, 4>, tile_step<E, 5>,
       tile_step<E, 6>},
      store_row};
  return kernels;
}

// Per query index, the first key index it sees: 0 without a window, else the first key whose
// position lies within it (positions ascending; nullptr: 0..T-1).
std::vector<int64_t> first_keys(int64_t tokens, int64_t window, const int64_t* positions) {
  std::vector<int64_t> first(tokens, 0);
  if (window == 0) return first;
  const auto at = [&](int64_t i) { return positions ? positions[i] : i; };
  int64_t key = 0;
  for (int64_t query = 0; query < tokens; ++query) {
    while (at(key) <= at(query) - window) ++key;
    first[query] = key;
  }
  return first;
}

// k, v (B, Hkv, T, D) of element type E, any strides but D's 1, -> K^T and V in the element
// type's layouts, zero past T, in one pass each: float32 kt (B*Hkv, panels, D, 64) and v
// (B*Hkv, panels*64, D); bfloat16 pairs: kt (B*Hkv, panels, D/2, 64, 2) and v (B*Hkv,
// panels*32, D, 2). Either way panel i starts at element i*64*D of its head and key j's values
// at element j*D (j even for bfloat16).
template <typename E>
std::pair<at::Tensor, at::Tensor> pack_keys_values(const at::Tensor& k, const at::Tensor& v,
                                                   int64_t panels) {
  const int64_t kv_heads = k.size(1), tokens = k.size(2), dim = k.size(3);
  const int64_t heads = k.size(0) * kv_heads, head_size = panels * kPanel * dim;
  at::Tensor kt = at::empty({heads, head_size}, k.options());
  at::Tensor vt = at::empty({heads, head_size}, v.options());
  // a panel interleaves units of kPer elements: one float32, or a bfloat16 pair
  constexpr int64_t kPer = std::is_same_v<E, float> ? 1 : 2;
  const int64_t units = dim / kPer;
  at::parallel_for(0, heads * panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t head = item / panels, panel = item % panels;
      const int64_t b = head / kv_heads, h = head % kv_heads;
      const E* k_head = static_cast<const E*>(k.data_ptr()) + b * k.stride(0) + h * k.stride(1);
      const E* v_head = static_cast<const E*>(v.data_ptr()) + b * v.stride(0) + h * v.stride(1);
      const int64_t offset = head * head_size + panel * kPanel * dim;
      E* kt_panel = static_cast<E*>(kt.data_ptr()) + offset;  // (D / kPer, 64, kPer)
      E* v_panel = static_cast<E*>(vt.data_ptr()) + offset;   // (64 / kPer, D, kPer)
      const int64_t keys = std::clamp<int64_t>(tokens - panel * kPanel, 0, kPanel);
      for (int64_t j = 0; j < keys; ++j) {
        const E* k_row = k_head + (panel * kPanel + j) * k.stride(2);
        const E* v_row = v_head + (panel * kPanel + j) * v.stride(2);
        E* v_dst = v_panel + (j / kPer) * kPer * dim + j % kPer;
        for (int64_t u = 0; u < units; ++u)
          std::memcpy(kt_panel + (u * kPanel + j) * kPer, k_row + u * kPer, kPer * sizeof(E));
        for (int64_t d = 0; d < dim; ++d) v_dst[d * kPer] = v_row[d];
      }
      for (int64_t j = keys; j < kPanel; ++j) {  // past T: zero
        E* v_dst = v_panel + (j / kPer) * kPer * dim + j % kPer;
        for (int64_t u = 0; u < units; ++u)
          std::memset(kt_panel + (u * kPanel + j) * kPer, 0, kPer * sizeof(E));
        for (int64_t d = 0; d < dim; ++d) v_dst[d * kPer] = E{0};
      }
    }
  });
  return {kt, vt};
}

// q (B, Hq, T, D), k, v (B, Hkv, T, D) of element type E, D a multiple of 64 -> out (B, Hq, T,
// D) through an instruction set's tile kernels; window 0: none.
template <typename E>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
            const int64_t* positions, const TileKernels<E>& kernels, at::Tensor& out) {
  const int64_t batch = q.size(0), q_heads = q.size(1), tokens = q.size(2), dim = q.size(3);
  const int64_t kv_heads = k.size(1), group = q_heads / kv_heads, heads = batch * kv_heads;
  const int64_t panels = (tokens + kPanel - 1) / kPanel;
  const float scale = snapstream::kLog2e / std::sqrt(static_cast<float>(dim));
  // qs (B*Hkv, T*G, D): a KV head's query rows, position-major
  const at::Tensor qs =
      q.reshape({heads, group, tokens, dim}).transpose(1, 2).contiguous();
  const auto [kt, vt] = pack_keys_values<E>(k.stride(3) == 1 ? k : k.contiguous(),
                                            v.stride(3) == 1 ? v : v.contiguous(), panels);
  const E* qs_ptr = static_cast<const E*>(qs.data_ptr());
  const E* kt_ptr = static_cast<const E*>(kt.data_ptr());
  const E* v_ptr = static_cast<const E*>(vt.data_ptr());
  E* out_ptr = static_cast<E*>(out.data_ptr());

  const std::vector<int64_t> first_key = first_keys(tokens, window, positions);
  const int64_t blocks = (tokens + kPositions - 1) / kPositions, max_rows = kPositions * group;
  const int64_t head_stride = panels * kPanel * dim;
#pragma omp parallel num_threads(at::get_num_threads())
  {
    std::vector<float> s(kRows * kKeyBlock), o(max_rows * dim), m(max_rows), l(max_rows);
    std::vector<E> p(kRows * kKeyBlock);
    std::vector<int64_t> row_first(max_rows), row_last(max_rows);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < heads * blocks; ++item) {
      const int64_t head = item % heads, block = blocks - 1 - item / heads;  // longest first
      const int64_t p0 = block * kPositions, p1 = std::min(tokens, p0 + kPositions);
      const int64_t n_rows = (p1 - p0) * group;
      const E* q_rows = qs_ptr + (head * tokens * group + p0 * group) * dim;
      const E* kt_head = kt_ptr + head * head_stride;
      const E* v_head = v_ptr + head * head_stride;
      std::fill(o.begin(), o.begin() + n_rows * dim, 0.f);
      std::fill(m.begin(), m.begin() + n_rows, -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.begin() + n_rows, 0.f);
      for (int64_t r = 0; r < n_rows; ++r) {
        row_last[r] = p0 + r / group;  // causal: keys up to its own index
        row_first[r] = first_key[row_last[r]];
      }
      // 64-key panels start at multiples of 64; first keys ascend with the rows
      for (int64_t key0 = row_first[0] / kPanel * kPanel; key0 < p1; key0 += kKeyBlock) {
        for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
          const int rows_here = static_cast<int>(std::min<int64_t>(kRows, n_rows - r0));
          const int64_t last = row_last[r0 + rows_here - 1];
          if (last < key0 || row_first[r0] >= key0 + kKeyBlock) continue;  // nothing visible
          const int64_t n = std::min(kKeyBlock, last + 1 - key0);
          kernels.steps[rows_here - 1](q_rows + r0 * dim, kt_head, v_head, key0, n, dim, scale,
                                       &row_first[r0], &row_last[r0], s.data(), p.data(),
                                       &o[r0 * dim], &m[r0], &l[r0]);
        }
      }
      for (int64_t r = 0; r < n_rows; ++r)  // row (position, g) -> out[b, h*G + g, position]
        kernels.store_row(
            out_ptr + ((head * group + r % group) * tokens + p0 + r / group) * dim, &o[r * dim],
            1.f / l[r], dim);
    }
  }
}

#endif  // SNAPSTREAM_PROMPT_AVX512

}  // namespace

namespace snapstream {

// Whether prompt_attention computes for q (B, Hq, T, D): on the CPU, D a multiple of 64, and
// float32 on a CPU with AVX-512, or bfloat16 on one with AVX512-BF16 and no AMX (under the cap,
// isa.h).
bool prompt_attention_covers(const at::Tensor& q) {
#if SNAPSTREAM_PROMPT_AVX512
  const Isa usable = isa();
  const bool dtype = (q.scalar_type() == at::kFloat && usable.avx512) ||
                     (q.scalar_type() == at::kBFloat16 && usable.avx512_bf16 && !usable.amx);
  return dtype && q.device().is_cpu() && q.dim() == 4 && q.size(3) % 64 == 0 && q.size(3) > 0;
#else
  return false;
#endif
}

std::string prompt_attention_path(at::ScalarType dtype) {
  if (!prompt_attention_covers(at::empty({1, 1, 1, 64}, at::dtype(dtype)))) return "torch-sdpa";
  return dtype == at::kBFloat16 ? "avx512-bf16" : "avx512";
}

// q (B, Hq, T, D), k, v (B, Hkv, T, D) float32 or bfloat16, Hq a multiple of Hkv -> (B, Hq,
// T, D) in their dtype: softmax(q k^T / sqrt(D)) v over each query's keys: those up to its own
// (by index), and with a window only those whose position p_k > p_q - window; positions (T,)
// int64 ascending, or none (0..T-1).
at::Tensor prompt_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t window, const std::optional<at::Tensor>& positions) {
  TORCH_CHECK(prompt_attention_covers(q),
              "prompt_attention: wants float32 q on an AVX-512 CPU, or bfloat16 on one "
              "with AVX512-BF16 and no AMX, with D a multiple of 64 (prompt_attention_covers); "
              "use torch's SDPA otherwise");
  TORCH_CHECK(k.dim() == 4 && v.sizes() == k.sizes(),
              "prompt_attention: want q (B, Hq, T, D), k and v (B, Hkv, T, D)");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
                  k.device().is_cpu() && v.device().is_cpu(),
              "prompt_attention: q, k and v must have one dtype, on the CPU");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2) && k.size(3) == q.size(3) &&
                  k.size(1) > 0 && q.size(1) % k.size(1) == 0,
              "prompt_attention: q (B, Hq, T, D) does not match k (B, Hkv, T, D)");
  TORCH_CHECK(window >= 0, "prompt_attention: window must be >= 0 (0: none), got ", window);
  at::Tensor pos;
  if (positions.has_value()) {
    pos = positions->contiguous();
    TORCH_CHECK(pos.dim() == 1 && pos.size(0) == q.size(2) && pos.scalar_type() == at::kLong,
                "prompt_attention: want positions (T,) int64");
  }
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (q.numel() == 0) return out;
#if SNAPSTREAM_PROMPT_AVX512
  const int64_t* pos_ptr = pos.defined() ? pos.data_ptr<int64_t>() : nullptr;
  if (q.scalar_type() == at::kBFloat16)
    attend<bf16>(q, k, v, window, pos_ptr, avx512_kernels<bf16>(), out);
  else
    attend<float>(q, k, v, window, pos_ptr, avx512_kernels<float>(), out);
#endif
  return out;
}

}  // namespace snapstream

TORCH_LIBRARY_FRAGMENT(snapstream, m) {
  m.def("prompt_attention_covers(Tensor q) -> bool");
  m.def("prompt_attention(Tensor q, Tensor k, Tensor v, int window=0, Tensor? positions=None) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(snapstream, CPU, m) {
  m.impl("prompt_attention_covers", &snapstream::prompt_attention_covers);
  m.impl("prompt_attention", &snapstream::prompt_attention);
}
