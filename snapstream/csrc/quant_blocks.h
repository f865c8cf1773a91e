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
constexpr float kCode15 = 16383.f; // the largest 15-bit activation code

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
  const int8_t* low_codes;    // 15-bit codes: (M, K) the codes' low 7 bits
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
// 127) with 128 times their sums (int8 kernels); 15-bit codes a in [-16383, 16383] (dx = max
// |x| / 16383) as two bytes, a = 128 h + l with h in [-128, 127] and l in [0, 128) (int4
// kernels in integers), stored in the order the kernel's ``codes15`` writes them.
enum class Reads { kBFloat16, kCodes8, kCodes15 };

// Writes the 15-bit codes of ``count`` values of x, per sub-group of ``sub``, into
// data.codes (h), data.low_codes (l) and data.code_scales, in a kernel's order.
using Codes15Fn = void (*)(const uint16_t* x, int64_t count, int64_t sub, RowData& data);

// A block kernel, what it reads of x, and its name (``snapstream info``).
struct KernelPlan {
  BlockKernel kernel;
  Reads reads;
  const char* name;
  Codes15Fn codes15 = nullptr;  // Reads::kCodes15
  bool wide_codes = false;      // Reads::kCodes8: also as int16
};

// The instruction sets' plans for a format and group size on a CPU of ``isa`` (none: the set
// has no kernel for it there).
std::optional<KernelPlan> avx512_plan(Format format, int64_t group, const Isa& isa);
std::optional<KernelPlan> avx2_plan(Format format, int64_t group, const Isa& isa);

// a = x * (16383 / max |x|) rounded to nearest even per sub-group: the 15-bit code of one value
// (the vector kernels compute the same float product and rounding).
inline float code15_inverse(float amax) { return amax > 0.f ? kCode15 / amax : 0.f; }

}  // namespace snapstream::quant
