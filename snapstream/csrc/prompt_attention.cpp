// Causal attention over a prompt in bfloat16 on AMX tiles (flash-style: blocks of 32 queries x
// 64 keys, an online softmax in float32, no T x T matrix). GQA: the query heads of a KV head
// read its packed K and V. Registered as the torch op ``snapstream::prompt_attention``; CPUs
// without AMX, and runs with SNAPSTREAM_GENERIC_KERNELS=1 (``snapstream::amx_attention``), are
// left to torch's SDPA by snapstream/model.py.
//
// Per block: S = Q K^T on tiles (float32), then per row: scale into base 2, the running max,
// exp2 by a polynomial (AVX-512), the running sum, P rounded to bfloat16, and the output rows
// rescaled; then O += P V on tiles. K and V are packed once per call into the tiles' layouts
// (K as 32-bit pairs of dims transposed; V as pairs of keys interleaved), zero-padded to whole
// blocks; padded keys lie beyond every real query, so the causal mask hides them.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>

#include "generic_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define SNAPSTREAM_AMX_KERNELS 1
#endif

namespace {

constexpr int64_t kQ = 32;   // queries per block (two tile rows of 16)
constexpr int64_t kK = 64;   // keys per block (four tile columns of 16)
constexpr int64_t kMaxD = 256;

#if SNAPSTREAM_AMX_KERNELS
#define SNAPSTREAM_AMX \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

bool cpu_has_amx() {
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  const bool tiles = (d >> 24) & 1, bf16 = (d >> 22) & 1;
  if (!(tiles && bf16 && __builtin_cpu_supports("avx512bf16"))) return false;
  // Linux hands out the tile state on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

bool has_amx() {
  static const bool amx = cpu_has_amx();
  return amx;
}

// whether prompt_attention runs here: AMX granted, SNAPSTREAM_GENERIC_KERNELS unset
bool amx_attention() { return has_amx() && !snapstream::generic_kernels_requested(); }

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// every tile: 16 rows of 64 bytes (16 float32, or 32 bfloat16 = 16 pairs)
SNAPSTREAM_AMX void load_tile_config() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  _tile_loadconfig(&config);
}

// 2^x for x <= 0 (float32, ~2e-6 relative): 2^round(x) * a degree-5 polynomial on [-0.5, 0.5]
SNAPSTREAM_AMX inline __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-127.f));
  const __m512 whole = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, whole);
  __m512 p = _mm512_set1_ps(1.3333558e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, whole);
}

// K (T, D) of one KV head -> (T/16 key tiles, D/32 dim chunks, 16 dim pairs, 16 keys) pairs
void pack_keys(const uint32_t* k, int64_t num_keys, int64_t padded, int64_t pairs,
               uint32_t* out) {
  for (int64_t tile = 0; tile < padded / 16; ++tile)
    for (int64_t chunk = 0; chunk < pairs / 16; ++chunk)
      for (int64_t p = 0; p < 16; ++p)
        for (int64_t j = 0; j < 16; ++j) {
          const int64_t key = tile * 16 + j;
          *out++ = key < num_keys ? k[key * pairs + chunk * 16 + p] : 0;
        }
}

// V (T, D) of one KV head -> (T/32 key chunks, D/16 dim tiles, 16 key pairs, 16 dims, 2 keys)
void pack_values(const uint16_t* v, int64_t num_keys, int64_t padded, int64_t dim,
                 uint16_t* out) {
  for (int64_t chunk = 0; chunk < padded / 32; ++chunk)
    for (int64_t tile = 0; tile < dim / 16; ++tile)
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t j = 0; j < 16; ++j)
          for (int64_t s = 0; s < 2; ++s) {
            const int64_t key = chunk * 32 + 2 * r + s;
            *out++ = key < num_keys ? v[key * dim + tile * 16 + j] : 0;
          }
}

struct Head {
  const uint16_t* q;  // (padded, D) queries, zero rows past the prompt
  const uint32_t* keys;  // pack_keys
  const uint16_t* values;  // pack_values
  uint16_t* out;  // (T, D)
  int64_t num_tokens, dim;
  float log2_scale;  // softmax scale * log2(e)
};

struct Block {  // one block of queries: its running softmax and output rows
  alignas(64) float s[kQ * kK];
  alignas(64) uint16_t p[kQ * kK];
  alignas(64) float o[kQ * kMaxD];
  float max[kQ], sum[kQ];
};

// S (32 x 64) = Q K^T of queries q0.. and keys k0..
SNAPSTREAM_AMX void scores(const Head& h, int64_t q0, int64_t k0, Block& b) {
  const int64_t chunks = h.dim / 32;
  for (int64_t qt = 0; qt < 2; ++qt) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t c = 0; c < chunks; ++c) {
      _tile_loadd(4, h.q + (q0 + qt * 16) * h.dim + c * 32, h.dim * 2);
      const uint32_t* keys = h.keys + ((k0 / 16) * chunks + c) * 256;
      _tile_loadd(5, keys, 64); _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(5, keys + chunks * 256, 64); _tile_dpbf16ps(1, 4, 5);
      _tile_loadd(5, keys + 2 * chunks * 256, 64); _tile_dpbf16ps(2, 4, 5);
      _tile_loadd(5, keys + 3 * chunks * 256, 64); _tile_dpbf16ps(3, 4, 5);
    }
    float* s = b.s + qt * 16 * kK;
    _tile_stored(0, s, kK * 4); _tile_stored(1, s + 16, kK * 4);
    _tile_stored(2, s + 32, kK * 4); _tile_stored(3, s + 48, kK * 4);
  }
}

// the online softmax of the block's scores into P; the output rows rescaled
SNAPSTREAM_AMX void softmax(const Head& h, int64_t q0, int64_t k0, Block& b) {
  const __m512 scale = _mm512_set1_ps(h.log2_scale);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t r = 0; r < kQ; ++r) {
    const int64_t last = q0 + r - k0;  // the row's last key in this block (causal)
    __m512 x[4];
    __mmask16 keep[4];
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int t = 0; t < 4; ++t) {
      keep[t] = _mm512_cmple_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * t)),
                                        _mm512_set1_epi32(static_cast<int>(std::min<int64_t>(last, kK))));
      x[t] = _mm512_mul_ps(_mm512_loadu_ps(b.s + r * kK + 16 * t), scale);
      top = _mm512_mask_max_ps(top, keep[t], top, x[t]);
    }
    const float new_max = std::max(b.max[r], _mm512_reduce_max_ps(top));
    const float alpha = std::exp2(b.max[r] - new_max);
    const __m512 shift = _mm512_set1_ps(new_max);
    __m512 total = _mm512_setzero_ps();
    for (int t = 0; t < 4; ++t) {
      x[t] = _mm512_maskz_mov_ps(keep[t], exp2_ps(_mm512_sub_ps(x[t], shift)));
      total = _mm512_add_ps(total, x[t]);
    }
    b.sum[r] = b.sum[r] * alpha + _mm512_reduce_add_ps(total);
    b.max[r] = new_max;
    _mm512_storeu_si512(b.p + r * kK, (__m512i)_mm512_cvtne2ps_pbh(x[1], x[0]));
    _mm512_storeu_si512(b.p + r * kK + 32, (__m512i)_mm512_cvtne2ps_pbh(x[3], x[2]));
    if (alpha != 1.f) {
      const __m512 a = _mm512_set1_ps(alpha);
      for (int64_t d = 0; d < h.dim; d += 16)
        _mm512_storeu_ps(b.o + r * h.dim + d, _mm512_mul_ps(_mm512_loadu_ps(b.o + r * h.dim + d), a));
    }
  }
}

// O (32 x D) += P (32 x 64) V of keys k0..
SNAPSTREAM_AMX void accumulate(const Head& h, int64_t k0, Block& b) {
  const int64_t tiles = h.dim / 16;
  for (int64_t qt = 0; qt < 2; ++qt)
    for (int64_t dt = 0; dt < tiles; ++dt) {
      float* o = b.o + qt * 16 * h.dim + dt * 16;
      _tile_loadd(0, o, h.dim * 4);
      for (int64_t c = 0; c < kK / 32; ++c) {
        _tile_loadd(4, b.p + qt * 16 * kK + c * 32, kK * 2);
        _tile_loadd(5, h.values + ((k0 / 32 + c) * tiles + dt) * 512, 64);
        _tile_dpbf16ps(0, 4, 5);
      }
      _tile_stored(0, o, h.dim * 4);
    }
}

SNAPSTREAM_AMX void query_block(const Head& h, int64_t q0, Block& b) {
  std::fill(b.max, b.max + kQ, -INFINITY);
  std::fill(b.sum, b.sum + kQ, 0.f);
  std::fill(b.o, b.o + kQ * h.dim, 0.f);
  for (int64_t k0 = 0; k0 < q0 + kQ; k0 += kK) {  // keys up to the block's last query
    scores(h, q0, k0, b);
    softmax(h, q0, k0, b);
    accumulate(h, k0, b);
  }
  const int64_t rows = std::min(kQ, h.num_tokens - q0);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 inv = _mm512_set1_ps(1.f / b.sum[r]);
    for (int64_t d = 0; d < h.dim; d += 32) {
      const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(b.o + r * h.dim + d), inv);
      const __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(b.o + r * h.dim + d + 16), inv);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(h.out + (q0 + r) * h.dim + d),
                          (__m256i)_mm512_cvtneps_pbh(lo));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(h.out + (q0 + r) * h.dim + d + 16),
                          (__m256i)_mm512_cvtneps_pbh(hi));
    }
  }
}

struct Tasks {  // one call's (row of Hq, block of queries) pairs
  const uint16_t* q;
  const uint16_t *keys, *values;
  uint16_t* out;
  int64_t tokens, dim, padded, blocks, heads, kv_heads;
  float log2_scale;
};

// tasks in the order 0, n-1, 1, n-2, ... within a row: causal blocks grow with their index, so
// any run of consecutive tasks carries about the same work
SNAPSTREAM_AMX void run_tasks(const Tasks& t, int64_t first, int64_t last) {
  load_tile_config();
  const int64_t group = t.heads / t.kv_heads, size = t.padded * t.dim;
  std::unique_ptr<Block> block(new Block);
  for (int64_t task = first; task < last; ++task) {
    const int64_t row = task / t.blocks, turn = task % t.blocks;
    const int64_t index = turn % 2 == 0 ? turn / 2 : t.blocks - 1 - turn / 2;
    const int64_t kv_row = row / t.heads * t.kv_heads + row % t.heads / group;
    const Head h{t.q + row * size, reinterpret_cast<const uint32_t*>(t.keys + kv_row * size),
                 t.values + kv_row * size, t.out + row * t.tokens * t.dim, t.tokens, t.dim,
                 t.log2_scale};
    if (index * kQ < t.tokens) query_block(h, index * kQ, *block);
  }
  _tile_release();
}

// q (B, Hq, T, D), k/v (B, Hkv, T, D) bfloat16 -> (B, Hq, T, D) bfloat16
at::Tensor prompt_attention(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v) {
  TORCH_CHECK(has_amx(), "prompt_attention: this CPU has no AMX (check amx_attention first)");
  TORCH_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && k.dim() == 4 &&
                  q.size(0) == k.size(0) && q.size(2) == k.size(2) && q.size(3) == k.size(3),
              "prompt_attention: want q (B, Hq, T, D), k and v (B, Hkv, T, D)");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 &&
                  v.scalar_type() == at::kBFloat16, "prompt_attention: bfloat16 only");
  const int64_t batch = q.size(0), heads = q.size(1), kv_heads = k.size(1);
  const int64_t tokens = q.size(2), dim = q.size(3);
  TORCH_CHECK(heads % kv_heads == 0 && dim % 32 == 0 && dim <= kMaxD && tokens > 0,
              "prompt_attention: want Hq a multiple of Hkv and D a multiple of 32 up to 256");
  const int64_t padded = (tokens + kK - 1) / kK * kK, blocks = padded / kQ;
  const at::Tensor qc = at::constant_pad_nd(q.contiguous(), {0, 0, 0, padded - tokens});
  const at::Tensor kc = k.contiguous(), vc = v.contiguous();
  at::Tensor keys = at::empty({batch * kv_heads, padded * dim}, k.options());
  at::Tensor values = at::empty({batch * kv_heads, padded * dim}, v.options());
  at::Tensor out = at::empty(q.sizes(), q.options());
  const auto* k_ptr = reinterpret_cast<const uint16_t*>(kc.data_ptr<at::BFloat16>());
  const auto* v_ptr = reinterpret_cast<const uint16_t*>(vc.data_ptr<at::BFloat16>());
  auto* keys_ptr = reinterpret_cast<uint16_t*>(keys.data_ptr<at::BFloat16>());
  auto* values_ptr = reinterpret_cast<uint16_t*>(values.data_ptr<at::BFloat16>());
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      pack_keys(reinterpret_cast<const uint32_t*>(k_ptr + i * tokens * dim), tokens, padded,
                dim / 2, reinterpret_cast<uint32_t*>(keys_ptr + i * padded * dim));
      pack_values(v_ptr + i * tokens * dim, tokens, padded, dim, values_ptr + i * padded * dim);
    }
  });
  const auto* q_ptr = reinterpret_cast<const uint16_t*>(qc.data_ptr<at::BFloat16>());
  auto* out_ptr = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const float log2_scale = 1.4426950408889634f / std::sqrt(static_cast<float>(dim));
  const Tasks tasks{q_ptr, keys_ptr, values_ptr, out_ptr, tokens, dim, padded, blocks, heads,
                    kv_heads, log2_scale};
  at::parallel_for(0, batch * heads * blocks, 1, [&](int64_t first, int64_t last) {
    run_tasks(tasks, first, last);
  });
  return out;
}
#else
bool amx_attention() { return false; }

at::Tensor prompt_attention(const at::Tensor& q, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "prompt_attention: built without AMX kernels (check amx_attention first)");
  return q;
}
#endif

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapstream, m) {
  m.def("prompt_attention(Tensor q, Tensor k, Tensor v) -> Tensor");
  m.def("amx_attention() -> bool", &amx_attention);
}

TORCH_LIBRARY_IMPL(snapstream, CPU, m) {
  m.impl("prompt_attention", &prompt_attention);
}
