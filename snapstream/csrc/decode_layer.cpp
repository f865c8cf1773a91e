// One decoder layer of a decode step in a single op, Llama family (Qwen2: with q/k/v biases) or
// Gemma 3: RMSNorm, the fused QKV projection (its bias added; Gemma: RMSNorm of each query and
// key head), RoPE, slot attention over
// the row's cache, the output projection (Gemma: normed) and residual, RMSNorm, the gate/up
// projection, activation(gate) * up, the down projection (Gemma: normed) and residual.
//
// It calls the same kernels as the module path (snapstream/model.py with snapstream/quant.py's
// quantized linears and snapstream/attention.py) in the same order with the same roundings
// (activations float32, each projection's input rounded to bfloat16 to nearest even, RoPE as
// x * cos + rotate_half(x) * sin with each product rounded, ATen's activation), so its output
// equals that path's bit for bit; what it saves is the ~20 small torch ops per layer and the
// Python between them (at batch 1 on two cores, more than half of a step).
//
// The extension is built with -ffp-contract=off, so the compiler does not contract the RoPE's
// products and sums into fused multiply-adds the module path does not make.

#include <torch/extension.h>

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "ops.h"

namespace {

// float32 (..., K) -> bfloat16, rounded to nearest even as Tensor.to(torch.bfloat16) does.
at::Tensor to_bf16(const at::Tensor& x) {
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kBFloat16));
  const float* src = x.data_ptr<float>();
  auto* dst = out.data_ptr<at::BFloat16>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) dst[i] = at::BFloat16(src[i]);
  return out;
}

// Packed int4 codes are (N/16, K/2, 16) bytes, int8 ones (N/16, K/4, 16, 4).
bool is_int4(const at::Tensor& weight) { return weight.dim() == 3; }

int64_t inputs_of(const at::Tensor& weight) {
  return weight.size(1) * (is_int4(weight) ? 2 : 4);
}

// A quantized linear's packed buffers as params holds them: weight, scales and factors (empty
// unless the scales are int8 codes).
struct Linear {
  const at::Tensor &weight, &scales, &factors;
};

Linear linear_at(at::TensorList params, size_t first) {
  return {params[first], params[first + 1], params[first + 2]};
}

// rows (M, K) bfloat16 -> (M, n) float32 through a quantized linear (int4: x's codes of x_bits).
at::Tensor project(const at::Tensor& rows, const Linear& linear, int64_t n, int64_t x_bits) {
  const std::optional<at::Tensor> factors =
      linear.factors.numel() ? std::optional<at::Tensor>(linear.factors) : std::nullopt;
  return is_int4(linear.weight)
             ? snapstream::int4_matmul(rows, linear.weight, linear.scales, n, factors, x_bits)
             : snapstream::int8_matmul(rows, linear.weight, linear.scales, n, factors);
}

// Heads of D values in place: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1) for
// the halves x1, x2 (rope.py's apply_rotary), then times `factor` when it is not 1.
void rotate(float* x, int64_t heads, int64_t dim, const float* cos, const float* sin,
            float factor) {
  const int64_t half = dim / 2;
  float rotated[512];
  for (int64_t h = 0; h < heads; ++h) {
    float* head = x + h * dim;
    for (int64_t d = 0; d < half; ++d) {
      rotated[d] = -head[d + half];
      rotated[d + half] = head[d];
    }
    for (int64_t d = 0; d < dim; ++d) {
      const float straight = head[d] * cos[d], turned = rotated[d] * sin[d];
      head[d] = straight + turned;
    }
    if (factor != 1.f)
      for (int64_t d = 0; d < dim; ++d) head[d] *= factor;
  }
}

// out += residual, both (B, H) float32 (the module path's residual + out: the same sums).
void add_into(at::Tensor& out, const at::Tensor& residual) {
  float* dst = out.data_ptr<float>();
  const float* src = residual.data_ptr<float>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) dst[i] += src[i];
}

void check_linear(const Linear& linear, int64_t inputs, const char* name) {
  const at::Tensor& weight = linear.weight;
  TORCH_CHECK((weight.dim() == 3 || weight.dim() == 4) && weight.scalar_type() == at::kByte &&
                  linear.scales.dim() == 4,
              "decode_layer: ", name, " must be a packed int4 or int8 weight and its scales");
  TORCH_CHECK(inputs_of(weight) == inputs, "decode_layer: ", name, " takes ",
              inputs_of(weight), " inputs, the layer gives it ", inputs);
}

}  // namespace

namespace snapstream {

// x (B, H) float32 -> (B, H) float32 after the layer. params, Llama family (14): input norm
// (H,), the QKV projection's weight, scales and factors, the output projection's, the
// post-attention norm (H,: before the MLP), the gate/up projection's (gate rows first), the
// down projection's (the packed buffers of snapstream/quant.py; factors empty where the scales
// are not int8 codes); Gemma 3 (18): the same, the post-attention norm on the attention's
// output, then the query and key norms (D,) and the pre- and post-feedforward norms (H,).
// cos, sin (B, D) float32 (any shape of B x D values); k, v, slots, empty as slot_attention
// takes them (k and v updated in place); queries times q_factor after RoPE; activation "silu"
// or "gelu_tanh" (gated_activation's, as the modules); qkv_bias ((Hq + 2 Hkv) D,) float32 or
// none, added to the QKV projection (the module path's ``out + bias``); x_bits: the width of x's
// codes in the int4 linears (int4_matmul's).
at::Tensor decode_layer(const at::Tensor& x, at::TensorList params, const at::Tensor& cos,
                        const at::Tensor& sin, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& slots, const at::Tensor& empty, int64_t num_heads,
                        double eps, double q_factor, c10::string_view activation,
                        const std::optional<at::Tensor>& qkv_bias, int64_t x_bits) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kFloat &&
                  x.is_contiguous(),
              "decode_layer: want x (B, H) float32, contiguous, on the CPU");
  TORCH_CHECK(params.size() == 14 || params.size() == 18,
              "decode_layer: want 14 params (Llama: 2 norms, 4 linears' weight, scales and "
              "factors) or 18 (Gemma 3: and 4 more norms), got ", params.size());
  check_activation(std::string(activation), "decode_layer");  // before the cache is written
  TORCH_CHECK(x_bits == 15 || x_bits == 8, "decode_layer: x_bits is 15 or 8, got ", x_bits);
  const bool gemma = params.size() == 18;
  const at::Tensor &input_norm = params[0], &post_norm = params[7];
  const Linear qkv_l = linear_at(params, 1), o_l = linear_at(params, 4);
  const Linear gate_up_l = linear_at(params, 8), down_l = linear_at(params, 11);
  const int64_t batch = x.size(0), hidden = x.size(1), kv_heads = k.size(1);
  const int64_t dim = cos.size(-1), heads = num_heads + 2 * kv_heads;
  TORCH_CHECK(dim % 2 == 0 && dim <= 512 && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat && cos.numel() == batch * dim &&
                  sin.numel() == batch * dim && cos.is_contiguous() && sin.is_contiguous(),
              "decode_layer: want cos and sin of B x D float32 values, D even");
  const int64_t inner = inputs_of(down_l.weight);
  check_linear(qkv_l, hidden, "the QKV projection");
  check_linear(o_l, num_heads * dim, "the output projection");
  check_linear(gate_up_l, hidden, "the gate/up projection");
  check_linear(down_l, inner, "the down projection");
  TORCH_CHECK(!qkv_bias.has_value() ||
                  (qkv_bias->dim() == 1 && qkv_bias->size(0) == heads * dim &&
                   qkv_bias->scalar_type() == at::kFloat && qkv_bias->is_contiguous()),
              "decode_layer: want qkv_bias ((Hq + 2 Hkv) D,) float32, contiguous");

  // attention: qkv (B, (Hq + 2 Hkv) D) -> q (B, Hq, D), k_new and v_new (B, Hkv, D)
  at::Tensor qkv = project(to_bf16(rms_norm(x, input_norm, eps)), qkv_l, heads * dim, x_bits);
  if (qkv_bias.has_value()) qkv.add_(*qkv_bias);  // (B, (Hq + 2 Hkv) D) + ((Hq + 2 Hkv) D,)
  at::Tensor q = at::empty({batch, num_heads, dim}, x.options());
  at::Tensor k_new = at::empty({batch, kv_heads, dim}, x.options());
  at::Tensor v_new = at::empty({batch, kv_heads, dim}, x.options());
  const int64_t q_width = num_heads * dim, kv_width = kv_heads * dim;
  for (int64_t b = 0; b < batch; ++b) {
    const float* row = qkv.data_ptr<float>() + b * heads * dim;
    std::copy(row, row + q_width, q.data_ptr<float>() + b * q_width);
    std::copy(row + q_width, row + q_width + kv_width, k_new.data_ptr<float>() + b * kv_width);
    std::copy(row + q_width + kv_width, row + heads * dim, v_new.data_ptr<float>() + b * kv_width);
  }
  if (gemma) {  // RMSNorm over each head's query and key, before RoPE
    q = rms_norm(q, params[14], eps);
    k_new = rms_norm(k_new, params[15], eps);
  }
  const float *cos_ptr = cos.data_ptr<float>(), *sin_ptr = sin.data_ptr<float>();
  for (int64_t b = 0; b < batch; ++b) {
    rotate(q.data_ptr<float>() + b * q_width, num_heads, dim, cos_ptr + b * dim,
           sin_ptr + b * dim, static_cast<float>(q_factor));
    rotate(k_new.data_ptr<float>() + b * kv_width, kv_heads, dim, cos_ptr + b * dim,
           sin_ptr + b * dim, 1.f);
  }
  const at::Tensor attn = slot_attention(q, k, v, k_new, v_new, slots, empty);  // (B, Hq, D)
  at::Tensor h = project(to_bf16(attn.view({batch, q_width})), o_l, hidden, x_bits);  // (B, H)
  if (gemma) h = rms_norm(h, post_norm, eps);
  add_into(h, x);

  // MLP: gate/up (B, 2I), activation(gate) * up rounded to bfloat16 for the down projection
  const at::Tensor gate_up = project(to_bf16(rms_norm(h, gemma ? params[16] : post_norm, eps)),
                                     gate_up_l, 2 * inner, x_bits);
  const at::Tensor act = to_bf16(gated_activation(gate_up, std::string(activation)));
  at::Tensor out = project(act, down_l, hidden, x_bits);
  if (gemma) out = rms_norm(out, params[17], eps);
  add_into(out, h);
  return out;
}

}  // namespace snapstream

TORCH_LIBRARY_FRAGMENT(snapstream, m) {
  m.def("decode_layer(Tensor x, Tensor[] params, Tensor cos, Tensor sin, Tensor(a!) k, "
        "Tensor(b!) v, Tensor slots, Tensor empty, int num_heads, float eps, float q_factor, "
        "str activation, Tensor? qkv_bias=None, int x_bits=15) -> Tensor");
}

TORCH_LIBRARY_IMPL(snapstream, CPU, m) { m.impl("decode_layer", &snapstream::decode_layer); }
