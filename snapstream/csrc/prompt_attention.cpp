// Causal attention over a prompt on the CPU in float32, flash-style: no T x T score matrix,
// GQA without repeating K/V (a KV head's query heads are rows of one pass), online softmax in
// base 2; optionally within a sliding window of positions (Gemma 3's local layers), the
// tokens' positions given when they are not 0..T-1. It covers float32 with head dimensions
// that are multiples of 64 on CPUs with AVX-512F (the prompt's dtype where there is no bfloat16
// hardware); ``prompt_attention_covers`` says so, and the caller (snapstream/model.py) runs
// torch's SDPA for the rest (bfloat16 prompts, other head sizes and CPUs,
// SNAPSTREAM_GENERIC_KERNELS=1).
//
// Work item = (sequence, KV head, block of kPositions query positions): its rows
// (position-major, the G query heads of a position side by side) stream their key range in
// blocks of kKeyBlock keys; within a block each tile of kRows rows computes its scores against
// 64-key panels of K^T (24 accumulators in registers), updates its rows' max and sum, and adds
// P V into its rows' output (the same 6 x 64 register tile). A block's K and V (128 KiB at
// D = 64) stay in L2 while every tile of the item reads them. Items run from the last positions
// back, dynamically scheduled: without a window that is longest first (the causal triangle
// makes late positions costlier); with one, items cost about the same.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "generic_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SNAPSTREAM_PROMPT_AVX512 1
#define AVX512 __attribute__((target("avx512f")))
#endif

namespace {

constexpr int kRows = 6;              // query rows per register tile
constexpr int64_t kPanel = 64;        // keys per register tile (4 vectors)
constexpr int64_t kKeyBlock = 256;    // keys per softmax step
constexpr int64_t kPositions = 32;    // query positions per work item
constexpr float kLog2e = 1.44269504088896341f;

#if SNAPSTREAM_PROMPT_AVX512

// 2^x for x <= 0 on 16 lanes: x = n + f, |f| <= 1/2, 2^f by its degree-6 Taylor polynomial in
// f ln2 (relative error < 2e-7), times 2^n by vscalefps; 0 below -126 (no denormals reach the
// P V products) and for -inf.
AVX512 inline __m512 exp2_nonpositive(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.f), _CMP_GE_OQ);
  const __m512 clamped = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
  const __m512 n = _mm512_roundscale_ps(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(clamped, n);
  __m512 p = _mm512_set1_ps(1.5403530e-4f);  // ln2^6 / 720
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-3f));  // ln2^5 / 120
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));  // ln2^4 / 24
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));  // ln2^3 / 6
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));  // ln2^2 / 2
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));  // ln2
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(live, p, n);
}

// Scores of ROWS query rows (D each, pre-scaled) against one 64-key panel of K^T (D, 64):
// s (ROWS, s_stride), 64 per row.
template <int ROWS>
AVX512 inline void scores_tile(const float* q, int64_t dim, const float* panel, float* s,
                               int64_t s_stride) {
  __m512 acc[ROWS][4];
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    const float* keys = panel + d * kPanel;
    const __m512 k0 = _mm512_loadu_ps(keys), k1 = _mm512_loadu_ps(keys + 16);
    const __m512 k2 = _mm512_loadu_ps(keys + 32), k3 = _mm512_loadu_ps(keys + 48);
    for (int r = 0; r < ROWS; ++r) {
      const __m512 qd = _mm512_set1_ps(q[r * dim + d]);
      acc[r][0] = _mm512_fmadd_ps(qd, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(qd, k1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(qd, k2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(qd, k3, acc[r][3]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(s + r * s_stride + j * 16, acc[r][j]);
}

// o (ROWS, o_stride) += p (ROWS, p_stride) [:, :n] @ v (n, D), 64 output dimensions at a time.
template <int ROWS>
AVX512 inline void values_tile(const float* p, int64_t p_stride, const float* v, int64_t n,
                               int64_t dim, float* o, int64_t o_stride) {
  for (int64_t c = 0; c < dim; c += 64) {
    __m512 acc[ROWS][4];
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_loadu_ps(o + r * o_stride + c + j * 16);
    for (int64_t key = 0; key < n; ++key) {
      const float* values = v + key * dim + c;
      const __m512 v0 = _mm512_loadu_ps(values), v1 = _mm512_loadu_ps(values + 16);
      const __m512 v2 = _mm512_loadu_ps(values + 32), v3 = _mm512_loadu_ps(values + 48);
      for (int r = 0; r < ROWS; ++r) {
        const __m512 pk = _mm512_set1_ps(p[r * p_stride + key]);
        acc[r][0] = _mm512_fmadd_ps(pk, v0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(pk, v1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(pk, v2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(pk, v3, acc[r][3]);
      }
    }
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < 4; ++j) _mm512_storeu_ps(o + r * o_stride + c + j * 16, acc[r][j]);
  }
}

// One row's scores s[:n] (n a multiple of 16, -inf where masked) -> probabilities against the
// running max m (updated), l (the running sum, updated); returns the factor the row's output
// must be multiplied by before this block's P V is added.
AVX512 inline float softmax_row(float* s, int64_t n, float& m, float& l) {
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + i));
  const float m_new = std::max(m, _mm512_reduce_max_ps(mx));
  if (m_new == -std::numeric_limits<float>::infinity()) {  // no key seen yet: P = 0
    std::fill(s, s + n, 0.f);
    return 1.f;
  }
  const __m512 shift = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 e = exp2_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + i), shift));
    _mm512_storeu_ps(s + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  const float alpha = m == -std::numeric_limits<float>::infinity() ? 0.f : std::exp2(m - m_new);
  m = m_new;
  l = l * alpha + _mm512_reduce_add_ps(sum);
  return alpha;
}

// ROWS query rows against keys [key0, key0 + n): row r sees keys first[r]..last[r] (indices).
template <int ROWS>
AVX512 void tile_step(const float* q, const float* kt_panels, const float* v, int64_t key0,
                      int64_t n, int64_t dim, const int64_t* first, const int64_t* last,
                      float* s, float* o, float* m, float* l) {
  const int64_t padded = (n + kPanel - 1) / kPanel * kPanel;
  for (int64_t panel = 0; panel < padded; panel += kPanel)
    scores_tile<ROWS>(q, dim, kt_panels + (key0 + panel) * dim, s + panel, kKeyBlock);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < ROWS; ++r) {
    float* row = s + r * kKeyBlock;
    const int64_t begin = std::clamp<int64_t>(first[r] - key0, 0, padded);
    const int64_t end = std::clamp<int64_t>(last[r] - key0 + 1, begin, padded);
    std::fill(row, row + begin, kNegInf);
    std::fill(row + end, row + padded, kNegInf);
    const float alpha = softmax_row(row, padded, m[r], l[r]);
    if (alpha != 1.f) {
      const __m512 a = _mm512_set1_ps(alpha);
      for (int64_t d = 0; d < dim; d += 16)
        _mm512_storeu_ps(o + r * dim + d, _mm512_mul_ps(a, _mm512_loadu_ps(o + r * dim + d)));
    }
  }
  values_tile<ROWS>(s, kKeyBlock, v + key0 * dim, n, dim, o, dim);
}

using TileStep = void (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                          const int64_t*, const int64_t*, float*, float*, float*, float*);
constexpr TileStep kTileSteps[kRows] = {tile_step<1>, tile_step<2>, tile_step<3>,
                                        tile_step<4>, tile_step<5>, tile_step<6>};

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

// q (B, Hq, T, D), k, v (B, Hkv, T, D) float32, D a multiple of 64 -> (B, Hq, T, D); window 0:
// none.
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
            const int64_t* positions, at::Tensor& out) {
  const int64_t batch = q.size(0), q_heads = q.size(1), tokens = q.size(2), dim = q.size(3);
  const int64_t kv_heads = k.size(1), group = q_heads / kv_heads;
  const int64_t panels = (tokens + kPanel - 1) / kPanel;
  const float q_scale = kLog2e / std::sqrt(static_cast<float>(dim));
  // qs (B*Hkv, T*G, D): a KV head's query rows, position-major, scaled for exp2;
  // kt (B*Hkv, panels, D, 64): K^T in 64-key panels, zero past T; vc (B*Hkv, T, D)
  const at::Tensor qs = (q.reshape({batch * kv_heads, group, tokens, dim}).transpose(1, 2) *
                         q_scale).contiguous();
  at::Tensor padded = at::zeros({batch * kv_heads, panels * kPanel, dim}, q.options());
  padded.narrow(1, 0, tokens).copy_(k.reshape({batch * kv_heads, tokens, dim}));
  const at::Tensor kt =
      padded.view({batch * kv_heads, panels, kPanel, dim}).transpose(2, 3).contiguous();
  const at::Tensor vc = v.reshape({batch * kv_heads, tokens, dim}).contiguous();
  const float* qs_ptr = qs.data_ptr<float>();
  const float* kt_ptr = kt.data_ptr<float>();
  const float* v_ptr = vc.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();

  const std::vector<int64_t> first_key = first_keys(tokens, window, positions);
  const int64_t heads = batch * kv_heads, blocks = (tokens + kPositions - 1) / kPositions;
  const int64_t max_rows = kPositions * group;
#pragma omp parallel num_threads(at::get_num_threads())
  {
    std::vector<float> s(kRows * kKeyBlock), o(max_rows * dim), m(max_rows), l(max_rows);
    std::vector<int64_t> row_first(max_rows), row_last(max_rows);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < heads * blocks; ++item) {
      const int64_t head = item % heads, block = blocks - 1 - item / heads;  // longest first
      const int64_t p0 = block * kPositions, p1 = std::min(tokens, p0 + kPositions);
      const int64_t n_rows = (p1 - p0) * group;
      const float* q_rows = qs_ptr + (head * tokens * group + p0 * group) * dim;
      const float* kt_head = kt_ptr + head * panels * kPanel * dim;
      const float* v_head = v_ptr + head * tokens * dim;
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
          kTileSteps[rows_here - 1](q_rows + r0 * dim, kt_head, v_head, key0, n, dim,
                                    &row_first[r0], &row_last[r0], s.data(), &o[r0 * dim],
                                    &m[r0], &l[r0]);
        }
      }
      for (int64_t r = 0; r < n_rows; ++r) {  // row (position, g) -> out[b, h*G + g, position]
        float* dst = out_ptr + ((head * group + r % group) * tokens + p0 + r / group) * dim;
        const float inv = 1.f / l[r];
        for (int64_t d = 0; d < dim; ++d) dst[d] = o[r * dim + d] * inv;
      }
    }
  }
}

#endif  // SNAPSTREAM_PROMPT_AVX512

}  // namespace

namespace snapstream {

// Whether prompt_attention computes for q (B, Hq, T, D): float32 on the CPU, D a multiple of 64,
// a CPU with AVX-512F, SNAPSTREAM_GENERIC_KERNELS not 1.
bool prompt_attention_covers(const at::Tensor& q) {
#if SNAPSTREAM_PROMPT_AVX512
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 && !generic_kernels_requested() && q.device().is_cpu() &&
         q.scalar_type() == at::kFloat && q.dim() == 4 && q.size(3) % 64 == 0 && q.size(3) > 0;
#else
  return false;
#endif
}

// q (B, Hq, T, D), k, v (B, Hkv, T, D) float32, Hq a multiple of Hkv -> (B, Hq, T, D):
// softmax(q k^T / sqrt(D)) v over each query's keys: those up to its own (by index), and with a
// window only those whose position p_k > p_q - window; positions (T,) int64 ascending, or none
// (0..T-1).
at::Tensor prompt_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t window, const std::optional<at::Tensor>& positions) {
  TORCH_CHECK(prompt_attention_covers(q),
              "prompt_attention: wants float32 q on an AVX-512 CPU with D a multiple of 64 "
              "(prompt_attention_covers); use torch's SDPA otherwise");
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
  attend(q, k, v, window, pos.defined() ? pos.data_ptr<int64_t>() : nullptr, out);
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
