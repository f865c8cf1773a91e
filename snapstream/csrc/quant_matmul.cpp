// Quantized matmul on the CPU for decode-sized batches: out (M, N) float32 = x (M, K) bfloat16
// @ W^T, W stored as int4 or int8 codes q in groups of G inputs, each group of each output with
// a scale and (optionally) an offset: w = q * scale + offset. int4 codes are in [0, 16), int8
// codes signed. Scales and offsets are float16 or float32 values, or int8 codes times a float32
// factor per span of groups, so that the blocks of a GGUF file (Q4_0/Q4_1/Q4_K, Q5_*/Q6_K/Q8_0)
// are held exactly and the K-quants' in a quarter of float32's bytes (snapstream/quant.py,
// snapstream/checkpoints/gguf_blocks.py); G is K / (the scales' second dimension).
//
// The weights are read once per call for all rows of x, a few rows at a time in registers (a
// matrix-vector kernel would read them again for every row). Three kinds of arithmetic:
// - int4 in bfloat16 (AMX; AVX512-BF16 for groups the integer kernels do not take): x as it
//   is, the codes unpacked to bfloat16 (128 + q, exact), float32 sums (quant_avx512.cpp);
// - int4 in integers (AVX512-VNNI, plain AVX-512, AVX2): x rounded to codes of the call's
//   x_bits per sub-group of A = gcd(G, 32) inputs, times the codes exactly (vpdpbusd in 32-bit
//   lanes, or vpmaddubsw in 16-bit ones). 15 bits (x ~ a * dx, dx = max |x| / 16383: finer
//   than x's own bfloat16 rounding but for values under 1/64 of the sub-group's largest),
//   split into two bytes a = 128 h + l:
//     sum x w ~ dx * scale * (128 sum q h + sum q l) + offset * sum x;
//   or 8 bits (dx = max |x| / 127, as the int8 kernels), one byte and half the products:
//     sum x w ~ dx * scale * sum q a + offset * sum x
//   (a model whose outputs hold at 8 bits chooses them: snapstream/checkpoints/registry.py);
//   all three compute the same integers and the same float operations after them;
// - int8 in integers (every path): x rounded to 8-bit codes per sub-group (dx = max |x| / 127,
//   as llama.cpp's Q8_0 activations), multiplied exactly in int32:
//     sum x w ~ dx * scale * sum q a + offset * sum x,
//   the same floats on every path (quant_avx512.cpp, quant_avx2.cpp and the plain loop here).
// The integer parts are exact whatever the order, so a row's result never depends on its
// batch-mates (a stream resumed on another decode worker stays token-identical).
// The plain C++ int4 loop multiplies x by the float32 weights (the bfloat16 kernels' products,
// up to float32 rounding).
//
// Packed layout, block b holding outputs 16b + j, j in [0, 16):
//   int4: weight (N/16, K/2, 16) uint8, byte j of pair p = q(2p) | q(2p + 1) << 4;
//   int8: weight (N/16, K/4, 16, 4) uint8, [b, r, j, t] = 128 + q(4r + t);
//   both: scales (N/16, K/G, S, 16) float16, float32 or int8, [b, g, 0, j] the scale and, when
//         S is 2, [b, g, 1, j] the offset of output 16b + j in group g (S = 1: offsets are 0);
//         int8 scales are codes c, the value c * factors[b, g / span, s, j] with factors
//         (N/16, K/(G span), S, 16) float32.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "ops.h"
#include "quant_blocks.h"

namespace snapstream::quant {
namespace {

// Generic int4: the block as float32 (K, 16), then float32 dot products.
void int4_generic(const Block& block, const Rows& x, int64_t rows, const BlockOut& out) {
  const int64_t k = block.k;
  std::vector<float> tile(k * kBlock);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < kBlock; ++j) tile[i * kBlock + j] = block.int4_at(j, i);
  for (int64_t m = 0; m < rows; ++m) {
    float acc[kBlock] = {};
    for (int64_t i = 0; i < k; ++i) {
      const float xi = bf16_to_float(x.x[m * k + i]);
#pragma omp simd
      for (int64_t j = 0; j < kBlock; ++j) acc[j] += xi * tile[i * kBlock + j];
    }
    std::copy(acc, acc + out.cols, out.ptr + m * out.stride);
  }
}

// Generic int8: the integers and float operations of the vector kernels, one output at a time.
void int8_generic(const Block& block, const Rows& x, int64_t rows, const BlockOut& out) {
  const int64_t sub = block.k / x.subs, per_group = block.group / sub;
  for (int64_t m = 0; m < rows; ++m) {
    const Rows row = x.from(m);
    for (int64_t j = 0; j < out.cols; ++j) {
      float acc = 0.f;
      for (int64_t g = 0; g < x.groups; ++g) {
        const float scale = block.scale_at(g, j);
        for (int64_t s = g * per_group; s < (g + 1) * per_group; ++s) {
          int32_t dot = 0;
          for (int64_t i = s * sub; i < (s + 1) * sub; ++i)
            dot += block.int8_byte(j, i) * row.codes[i];
          acc = std::fma(static_cast<float>(dot - row.code_bias[s]), scale * row.code_scales[s],
                         acc);
        }
        if (block.has_offset)
          acc = std::fma(row.sums[g], block.scale_at(g, kBlock + j), acc);
      }
      out.ptr[m * out.stride + j] = acc;
    }
  }
}

// The sum of a group of bfloat16 values in float32, as 16 running sums (every 16th value) added
// in order at the end: independent chains the compiler vectorizes, the same bits on every CPU.
float group_sum(const uint16_t* values, int64_t count) {
  constexpr int64_t kLanes = 16;
  float lanes[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= count; d += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += bf16_to_float(values[d + l]);
  for (; d < count; ++d) lanes[d % kLanes] += bf16_to_float(values[d]);
  float sum = 0.f;
  for (int64_t l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

// The int8 kernels' codes (Int8CodesFn) in a plain loop: a = x * (127 / max |x|) rounded to
// nearest even per sub-group.
void int8_codes_plain(const uint16_t* x, int64_t count, int64_t sub, bool wide, RowData& data) {
  for (int64_t i = 0; i < count / sub; ++i) {
    const uint16_t* values = x + i * sub;
    float amax = 0.f;
    for (int64_t d = 0; d < sub; ++d) amax = std::max(amax, std::fabs(bf16_to_float(values[d])));
    const float inv = code_inverse(amax, kCodeLimit8);
    int32_t total = 0;
    for (int64_t d = 0; d < sub; ++d) {
      const int a = std::clamp(static_cast<int>(std::nearbyint(bf16_to_float(values[d]) * inv)),
                               -127, 127);
      data.codes[i * sub + d] = static_cast<int8_t>(a);
      if (wide) data.wide_codes[i * sub + d] = static_cast<int16_t>(a);
      total += a;
    }
    data.code_scales[i] = amax / kCodeLimit8;
    data.code_bias[i] = 128 * total;
  }
}

// x's group sums (when a kernel reads them) and its codes (when it reads codes; int4 ones of
// x_bits).
Rows prepare_rows(const uint16_t* x, int64_t rows, int64_t k, int64_t group,
                  const KernelPlan& plan, bool need_sums, int x_bits, RowData& data) {
  const int64_t sub = plan.reads == Reads::kBFloat16 ? 0 : std::gcd(group, kActGroup);
  const int64_t groups = k / group, subs = sub ? k / sub : 0;
  data.sums.resize(need_sums ? rows * groups : 0);
  for (int64_t i = 0; i < static_cast<int64_t>(data.sums.size()); ++i)
    data.sums[i] = group_sum(x + i * group, group);
  const bool int8 = plan.reads == Reads::kInt8Codes, int4 = plan.reads == Reads::kInt4Codes;
  const bool low = int4 && x_bits == 15;
  if (int8) {
    data.codes.resize(rows * k);
    data.code_scales.resize(rows * subs);
    data.code_bias.resize(rows * subs);
    data.wide_codes.resize(plan.wide_codes ? rows * k : 0);
    (plan.int8_codes ? plan.int8_codes : &int8_codes_plain)(x, rows * k, sub, plan.wide_codes,
                                                            data);
  }
  if (int4) {
    data.codes.resize(rows * k);
    data.low_codes.resize(low ? rows * k : 0);
    data.code_scales.resize(rows * subs);
    plan.int4_codes(x, rows * k, sub, x_bits, data);
  }
  return {x, need_sums ? data.sums.data() : nullptr, sub ? data.codes.data() : nullptr,
          low ? data.low_codes.data() : nullptr,
          int8 && plan.wide_codes ? data.wide_codes.data() : nullptr,
          sub ? data.code_scales.data() : nullptr, int8 ? data.code_bias.data() : nullptr, k,
          groups, subs};
}

}  // namespace

// The block kernel for a format on this CPU under the cap (isa.h): the AVX-512 kernels where
// the CPU has them, else the AVX2 ones, else the plain loops above.
KernelPlan kernel_plan(Format format, int64_t group) {
  const Isa usable = isa();
  for (const auto plan_of : {&avx512_plan, &avx2_plan})
    if (std::optional<KernelPlan> plan = plan_of(format, group, usable)) return *plan;
  if (format == Format::kInt4) return {&int4_generic, Reads::kBFloat16, "generic"};
  return {&int8_generic, Reads::kInt8Codes, "generic"};
}

namespace {

void check_shapes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                  const std::optional<at::Tensor>& factors, int64_t n, Format format) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu() && scales.device().is_cpu(),
              "quant_matmul: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16,
              "quant_matmul: want x (M, K) bfloat16");
  const at::ScalarType scale_type = scales.scalar_type();
  TORCH_CHECK((scale_type == at::kHalf || scale_type == at::kFloat || scale_type == at::kChar) &&
                  scales.is_contiguous() && weight.is_contiguous(),
              "quant_matmul: want contiguous weights and float16, float32 or int8 scales");
  const int64_t k = x.size(1), blocks = weight.size(0);
  TORCH_CHECK(n > 0 && (n + kBlock - 1) / kBlock == blocks,
              "quant_matmul: ", n, " outputs do not fill ", blocks, " blocks of 16");
  if (format == Format::kInt4) {
    TORCH_CHECK(weight.dim() == 3 && weight.scalar_type() == at::kByte &&
                    weight.size(1) * 2 == k && weight.size(2) == kBlock,
                "quant_matmul: int4 weight must be (N/16, K/2, 16) uint8");
  } else {
    TORCH_CHECK(weight.dim() == 4 && weight.scalar_type() == at::kByte &&
                    weight.size(1) * 4 == k && weight.size(2) == kBlock && weight.size(3) == 4,
                "quant_matmul: int8 weight must be (N/16, K/4, 16, 4) uint8");
  }
  const int64_t multiple = format == Format::kInt4 ? 2 : 4;
  TORCH_CHECK(scales.dim() == 4 && scales.size(0) == blocks && scales.size(1) > 0 &&
                  k % scales.size(1) == 0 && (k / scales.size(1)) % multiple == 0 &&
                  (scales.size(2) == 1 || scales.size(2) == 2) && scales.size(3) == kBlock,
              "quant_matmul: scales must be (N/16, K/G, 1 or 2, 16) with G a multiple of ",
              multiple);
  TORCH_CHECK(factors.has_value() == (scale_type == at::kChar),
              "quant_matmul: int8 scale codes come with their factors, float scales without");
  if (factors.has_value()) {
    const at::Tensor& f = *factors;
    TORCH_CHECK(f.device().is_cpu() && f.scalar_type() == at::kFloat && f.is_contiguous() &&
                    f.dim() == 4 && f.size(0) == blocks && f.size(1) > 0 &&
                    scales.size(1) % f.size(1) == 0 && f.size(2) == scales.size(2) &&
                    f.size(3) == kBlock,
                "quant_matmul: factors must be (N/16, K/(G span), S, 16) float32 beside "
                "scales (N/16, K/G, S, 16)");
  }
}

ScaleType scale_type_of(const at::Tensor& scales) {
  if (scales.scalar_type() == at::kFloat) return ScaleType::kFloat;
  return scales.scalar_type() == at::kHalf ? ScaleType::kHalf : ScaleType::kCode8;
}

// x (M, K) bfloat16, the packed weight of n outputs (padded to whole blocks) -> (M, n) float32;
// x_bits: the width of x's codes where an int4 kernel reads codes (15 or 8; int8 kernels read
// 8-bit codes).
at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                        const std::optional<at::Tensor>& factors, int64_t n, Format format,
                        int64_t x_bits) {
  check_shapes(x, weight, scales, factors, n, format);
  const int64_t rows = x.size(0), k = x.size(1), blocks = weight.size(0);
  const int64_t groups = scales.size(1), group = k / groups, stride = scales.size(2) * kBlock;
  const int64_t span = factors.has_value() ? groups / factors->size(1) : 1;
  const bool has_offset = scales.size(2) == 2;
  const ScaleType scale_type = scale_type_of(scales);
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty({rows, n}, x.options().dtype(at::kFloat));
  const auto* w_ptr = static_cast<const uint8_t*>(weight.data_ptr());
  const auto* s_ptr = static_cast<const uint8_t*>(scales.data_ptr());
  const float* f_ptr = factors.has_value() ? factors->data_ptr<float>() : nullptr;
  float* out_ptr = out.data_ptr<float>();
  const int64_t block_bytes = k * kBlock / (format == Format::kInt4 ? 2 : 1);
  const int64_t block_scale_bytes = groups * stride * scales.element_size();
  const int64_t block_factors = factors.has_value() ? factors->size(1) * stride : 0;
  const KernelPlan plan = kernel_plan(format, group);
  RowData data;
  const Rows x_rows =
      prepare_rows(reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()), rows, k,
                   group, plan, format == Format::kInt4 || has_offset, static_cast<int>(x_bits),
                   data);

  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const Block block{format, scale_type, w_ptr + b * block_bytes, s_ptr + b * block_scale_bytes,
                        f_ptr ? f_ptr + b * block_factors : nullptr, k, group, stride, span,
                        has_offset};
      plan.kernel(block, x_rows, rows,
                  BlockOut{out_ptr + b * kBlock, n, std::min(kBlock, n - b * kBlock)});
    }
  });
  return out;
}

}  // namespace
}  // namespace snapstream::quant

namespace snapstream {

at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                       int64_t n, const std::optional<at::Tensor>& factors, int64_t x_bits) {
  TORCH_CHECK(x_bits == 15 || x_bits == 8, "int4_matmul: x_bits is 15 or 8, got ", x_bits);
  return quant::quant_matmul(x, weight, scales, factors, n, quant::Format::kInt4, x_bits);
}

at::Tensor int8_matmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                       int64_t n, const std::optional<at::Tensor>& factors) {
  return quant::quant_matmul(x, weight, scales, factors, n, quant::Format::kInt8, 8);
}

bool int4_matmul_reads_codes(int64_t group) {
  return quant::kernel_plan(quant::Format::kInt4, group).reads == quant::Reads::kInt4Codes;
}

// The kernel a format ("int4" or "int8") and group size take on this CPU, under the cap.
std::string quant_matmul_path(const std::string& format, int64_t group) {
  TORCH_CHECK(format == "int4" || format == "int8", "quant_matmul_path: want int4 or int8, got ",
              format);
  return quant::kernel_plan(format == "int4" ? quant::Format::kInt4 : quant::Format::kInt8,
                            group).name;
}

}  // namespace snapstream

TORCH_LIBRARY_FRAGMENT(snapstream, m) {
  m.def("int4_matmul(Tensor x, Tensor weight, Tensor scales, int n, Tensor? factors=None, "
        "int x_bits=15) -> Tensor");
  m.def("int8_matmul(Tensor x, Tensor weight, Tensor scales, int n, Tensor? factors=None) -> "
        "Tensor");
  m.def("int4_matmul_reads_codes(int group) -> bool", &snapstream::int4_matmul_reads_codes);
  m.def("quant_matmul_path(str format, int group) -> str", &snapstream::quant_matmul_path);
}

TORCH_LIBRARY_IMPL(snapstream, CPU, m) {
  m.impl("int4_matmul", &snapstream::int4_matmul);
  m.impl("int8_matmul", &snapstream::int8_matmul);
}