// The quantized matmul's shared pieces (quant_matmul.cpp): the packed weight's blocks, the rows
// of x as the block kernels read them, and the plan that pairs a kernel with what it reads.
// Each instruction set's kernels live in a file of their own (quant_avx512.cpp,
// quant_avx2.cpp) and offer their plans through *_plan(); quant_matmul.cpp picks the first
// that the CPU (under the cap of isa.h) runs, else its plain C++ kernels.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "isa.h"

namespace snapstream::quant {

constexpr int64_t kBlock = 16;     // outputs per block
constexpr int64_t kActGroup = 32;  // inputs per activation scale, at most
// The largest activation code of each width an int4 integer kernel takes x in (x_bits).
constexpr float kCodeLimit15 = 16383.f;
constexpr float kCodeLimit8 = 127.f;

enum class Format { kInt4, kInt8 };
// How a block holds its scales and offsets: float16 or float32 values, or int8 codes c with a
// float32 factor f per span of groups, the value c * f (a GGUF K-quant's d * sc and -dmin * m,
// exact in float32: a quarter of the float32 bytes).
enum class ScaleType { kHalf, kFloat, kCode8 };

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

// One block of the packed weight.
struct Block {
  Format format;
  ScaleType scale_type;
  const uint8_t* weight;  // int4 (K/2, 16) or int8 (K/4, 16, 4)
  const void* scales;     // (K/G, S, 16) float16, float32 or int8 codes
  const float* factors;   // kCode8: (K/(G span), S, 16) float32; else unused
  int64_t k, group, stride;  // stride: scale entries per group (S * 16)
  int64_t span;              // kCode8: groups per factor
  bool has_offset;

  // Entry ``at`` (the output j: j; its offset: 16 + j) of group g's scales.
  float scale_at(int64_t g, int64_t at) const {
    const int64_t index = g * stride + at;
    if (scale_type == ScaleType::kFloat) return static_cast<const float*>(scales)[index];
    if (scale_type == ScaleType::kHalf)
      return static_cast<float>(static_cast<const c10::Half*>(scales)[index]);
    return static_cast<float>(static_cast<const int8_t*>(scales)[index]) * *factors_of(g, at);
  }

  // kCode8: the factors of group g from entry ``at`` on.
  const float* factors_of(int64_t g, int64_t at) const {
    return factors + (g / span) * stride + at;
  }

  int int8_byte(int64_t j, int64_t i) const {  // 128 + q of output j at input i (int8)
    return weight[(i / 4) * 4 * kBlock + j * 4 + i % 4];
  }

  int int4_code(int64_t j, int64_t i) const {  // q of output j at input i (int4)
    const uint8_t byte = weight[(i / 2) * kBlock + j];
    return i % 2 ? byte >> 4 : byte & 15;
  }

  float int4_at(int64_t j, int64_t i) const {  // the float32 weight of output j at input i
    const int64_t g = i / group;
    const float offset = has_offset ? scale_at(g, kBlock + j) : 0.f;
    return static_cast<float>(int4_code(j, i)) * scale_at(g, j) + offset;
  }
};

// The rows of x as the kernels take them (pointers at row 0 of a tile).
struct Rows {
  const uint16_t* x;          // (M, K) bfloat16
  const float* sums;          // (M, K/G) each group's sum of x (int4, or weights with offsets)
  const int8_t* codes;        // codes kernels: (M, K) x's codes a (15-bit codes: their high bytes)
  const int8_t* low_codes;    // int4, 15-bit codes: (M, K) the codes' low 7 bits; else null
  const int16_t* wide_codes;  // 8-bit codes for the plain AVX-512 kernel: (M, K) a as int16
  const float* code_scales;   // codes kernels: (M, K/A) each sub-group's dx
  const int32_t* code_bias;   // 8-bit codes: (M, K/A) 128 * each sub-group's sum of a
  int64_t k, groups, subs;    // K, K/G, K/A

  Rows from(int64_t m) const {
    return {x + m * k, sums ? sums + m * groups : nullptr, codes ? codes + m * k : nullptr,
            low_codes ? low_codes + m * k : nullptr, wide_codes ? wide_codes + m * k : nullptr,
            code_scales ? code_scales + m * subs : nullptr,
            code_bias ? code_bias + m * subs : nullptr, k, groups, subs};
  }
};

// What Rows points at, computed once per call.
struct RowData {
  std::vector<float> sums, code_scales;
  std::vector<int8_t> codes, low_codes;
  std::vector<int16_t> wide_codes;
  std::vector<int32_t> code_bias;
};

// Where a block's (rows, 16) results go: the first ``cols`` columns (fewer in the last block
// when N is not a multiple of 16) of rows of ``stride`` floats.
struct BlockOut {
  float* ptr;
  int64_t stride, cols;

  BlockOut from(int64_t m) const { return {ptr + m * stride, stride, cols}; }
};

using BlockKernel = void (*)(const Block&, const Rows&, int64_t, const BlockOut&);

// What a block kernel reads of x besides x itself, per sub-group of A = gcd(G, 32) inputs:
// nothing more (bfloat16 kernels); 8-bit codes a in [-127, 127] (x ~ a * dx, dx = max |x| /
// 127) with 128 times their sums (int8 kernels); codes of the call's x_bits in the order the
// kernel's ``int4_codes`` writes them (int4 kernels in integers): 15-bit codes a in [-16383,
// 16383] (dx = max |x| / 16383) as two bytes, a = 128 h + l with h in [-128, 127] and l in
// [0, 128), or 8-bit codes a in [-127, 127] as one.
enum class Reads { kBFloat16, kInt8Codes, kInt4Codes };

// Writes the codes of ``count`` values of x, per sub-group of ``sub``, of ``bits`` (15: into
// data.codes (h) and data.low_codes (l); 8: into data.codes) and data.code_scales, in a
// kernel's order.
using Int4CodesFn = void (*)(const uint16_t* x, int64_t count, int64_t sub, int bits,
                             RowData& data);

// Writes the int8 kernels' codes of ``count`` values of x, per sub-group of ``sub``: data.codes
// (and data.wide_codes as int16, with ``wide``), data.code_scales and, for the kernels that read
// the weights' codes as biased bytes (VNNI, the plain loop), data.code_bias (128 times each
// sub-group's sum of codes), in input order; the vectors sized by the caller.
using Int8CodesFn = void (*)(const uint16_t* x, int64_t count, int64_t sub, bool wide,
                             RowData& data);

// A block kernel, what it reads of x, and its name (``snapstream info``).
struct KernelPlan {
  BlockKernel kernel;
  Reads reads;
  const char* name;
  Int4CodesFn int4_codes = nullptr;  // Reads::kInt4Codes
  bool wide_codes = false;           // Reads::kInt8Codes: also as int16
  Int8CodesFn int8_codes = nullptr;  // Reads::kInt8Codes: a vector path for these groups
};

// The instruction sets' plans for a format and group size on a CPU of ``isa`` (none: the set
// has no kernel for it there).
std::optional<KernelPlan> avx512_plan(Format format, int64_t group, const Isa& isa);
std::optional<KernelPlan> avx2_plan(Format format, int64_t group, const Isa& isa);

// The largest code of an int4 kernel's x codes of ``bits`` (15 or 8).
inline float code_limit(int bits) { return bits == 15 ? kCodeLimit15 : kCodeLimit8; }

// a = x * (limit / max |x|) rounded to nearest even per sub-group: the code of one value (the
// vector kernels compute the same float product and rounding).
inline float code_inverse(float amax, float limit) { return amax > 0.f ? limit / amax : 0.f; }

}  // namespace snapstream::quant
