// Decode attention over a fixed-shape slot cache, on the CPU: one query token per row, GQA,
// float32 or bfloat16 K/V read as stored, float32 softmax and accumulation, one pass over each
// KV head's slots for all of its query heads.
//
// The work is split over (row, KV head, chunk of slots) so that a batch of one still spreads
// over every thread (flash-decoding); each chunk keeps its own max, sum and weighted values,
// merged per (row, KV head) at the end. Inner loops are plain C++ that the compiler vectorizes,
// built for AVX-512, AVX2 and the baseline with function multiversioning where GCC has it.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SNAPSTREAM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SNAPSTREAM_CLONES
#endif

namespace {

constexpr int64_t kChunk = 256;   // slots per work item
constexpr int64_t kMaxGroup = 16; // query heads per KV head
constexpr int64_t kMaxDim = 256;  // head dimension

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// One chunk of one KV head: scores of its G queries against slots [begin, end), then
// probabilities relative to the chunk's own max and their weighted sum of values.
// q (G, D) pre-scaled; k, v (S, D); empty (S); scores scratch (G, end - begin);
// -> chunk_max (G), chunk_sum (G), acc (G, D).
template <typename KV>
SNAPSTREAM_CLONES void attend_chunk(const float* q, const KV* k, const KV* v, const bool* empty,
                                    int64_t begin, int64_t end, int64_t group, int64_t dim,
                                    float* scores, float* chunk_max, float* chunk_sum,
                                    float* acc) {
  const int64_t n = end - begin;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t g = 0; g < group; ++g) chunk_max[g] = neg_inf;
  for (int64_t s = begin; s < end; ++s) {
    const KV* key = k + s * dim;
    for (int64_t g = 0; g < group; ++g) {
      const float* query = q + g * dim;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < dim; ++d) dot += query[d] * to_float(key[d]);
      const float score = empty[s] ? neg_inf : dot;
      scores[g * n + (s - begin)] = score;
      chunk_max[g] = std::max(chunk_max[g], score);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* row = scores + g * n;
    const float m = chunk_max[g];
    float sum = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      row[i] = m == neg_inf ? 0.f : std::exp(row[i] - m);
      sum += row[i];
    }
    chunk_sum[g] = sum;
    std::fill(acc + g * dim, acc + (g + 1) * dim, 0.f);
  }
  for (int64_t s = begin; s < end; ++s) {
    const KV* value = v + s * dim;
    for (int64_t g = 0; g < group; ++g) {
      const float p = scores[g * n + (s - begin)];
      if (p == 0.f) continue;
      float* out = acc + g * dim;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) out[d] += p * to_float(value[d]);
    }
  }
}

template <typename KV>
void slot_attention_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& empty, at::Tensor& out) {
  const int64_t batch = k.size(0), kv_heads = k.size(1), slots = k.size(2), dim = k.size(3);
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

  at::parallel_for(0, batch * kv_heads * chunks, 1, [&](int64_t first, int64_t last) {
    float query[kMaxGroup * kMaxDim];
    std::vector<float> scores(group * kChunk);
    for (int64_t item = first; item < last; ++item) {
      const int64_t chunk = item % chunks, head = (item / chunks) % kv_heads;
      const int64_t row = item / (chunks * kv_heads);
      const float* q_src = q_ptr + (row * kv_heads + head) * group * dim;
      for (int64_t i = 0; i < group * dim; ++i) query[i] = q_src[i] * scale;
      const int64_t offset = (row * kv_heads + head) * slots * dim;
      const int64_t begin = chunk * kChunk, end = std::min(slots, begin + kChunk);
      attend_chunk<KV>(query, k_ptr + offset, v_ptr + offset, empty_ptr + row * slots, begin,
                       end, group, dim, scores.data(), &part_max[item * group],
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

// q (B, Hq, D) float32; k, v (B, Hkv, S, D) float32 or bfloat16, contiguous; empty (B, S) bool
// -> (B, Hq, D) float32. A row whose slots are all empty gets zeros.
at::Tensor slot_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& empty) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "slot_attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && v.sizes() == k.sizes() && empty.dim() == 2,
              "slot_attention: want q (B, Hq, D), k and v (B, Hkv, S, D), empty (B, S)");
  TORCH_CHECK(q.scalar_type() == at::kFloat, "slot_attention: q must be float32");
  TORCH_CHECK(k.scalar_type() == v.scalar_type() &&
                  (k.scalar_type() == at::kFloat || k.scalar_type() == at::kBFloat16),
              "slot_attention: k and v must both be float32 or bfloat16");
  TORCH_CHECK(empty.scalar_type() == at::kBool, "slot_attention: empty must be bool");
  const int64_t batch = k.size(0), kv_heads = k.size(1), slots = k.size(2), dim = k.size(3);
  TORCH_CHECK(q.size(0) == batch && q.size(2) == dim && q.size(1) % kv_heads == 0,
              "slot_attention: q does not match k");
  TORCH_CHECK(q.size(1) / kv_heads <= kMaxGroup && dim <= kMaxDim,
              "slot_attention: at most ", kMaxGroup, " query heads per KV head and ", kMaxDim,
              " dimensions");
  TORCH_CHECK(empty.size(0) == batch && empty.size(1) == slots,
              "slot_attention: empty does not match k");
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const at::Tensor ec = empty.contiguous();
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (k.scalar_type() == at::kBFloat16) {
    slot_attention_impl<c10::BFloat16>(qc, kc, vc, ec, out);
  } else {
    slot_attention_impl<float>(qc, kc, vc, ec, out);
  }
  return out;
}

}  // namespace

// ``import snapstream._kernels`` loads this library, which registers the op below.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}

TORCH_LIBRARY(snapstream, m) {
  m.def("slot_attention(Tensor q, Tensor k, Tensor v, Tensor empty) -> Tensor");
}

TORCH_LIBRARY_IMPL(snapstream, CPU, m) { m.impl("slot_attention", &slot_attention); }
