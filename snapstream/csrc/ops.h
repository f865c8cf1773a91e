// The CPU kernels' entry points (each file registers its own torch op), callable from C++ so
// that decode_layer.cpp runs a whole decoder layer without going through the dispatcher.
#pragma once

#include <torch/extension.h>

#include <optional>

namespace snapstream {

// x (..., H), weight (H,) of x's dtype -> x / rms(x) * weight (rms_norm.cpp).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// x (..., 2I) = [gate | up] -> act(gate) * up (..., I) in x's dtype;
// activation "silu" or "gelu_tanh" (gated_activation.cpp).
at::Tensor gated_activation(const at::Tensor& x, const std::string& activation);

// Raises naming ``op`` unless gated_activation takes ``activation`` (gated_activation.cpp).
void check_activation(const std::string& activation, const char* op);

// x (M, K) bfloat16 -> (M, n) float32 through packed int4 / int8 codes, their scales and, with
// int8 scale codes, the codes' factors; int4 in integers with x's codes of x_bits (15 or 8)
// (quant_matmul.cpp).
at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                       int64_t n, const std::optional<at::Tensor>& factors, int64_t x_bits);
at::Tensor int8_matmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                       int64_t n, const std::optional<at::Tensor>& factors);

// q (B, Hq, D) float32 over a slot cache updated in place -> (B, Hq, D) float32
// (slot_attention.cpp).
at::Tensor slot_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& k_new, const at::Tensor& v_new,
                          const at::Tensor& slots, const at::Tensor& empty);

// The kernel a format ("int4" or "int8") with groups of ``group`` inputs takes on this CPU
// (quant_matmul.cpp).
std::string quant_matmul_path(const std::string& format, int64_t group);

// What runs a prompt's attention in ``dtype`` on this CPU: a kernel of prompt_attention.cpp or
// torch's SDPA.
std::string prompt_attention_path(at::ScalarType dtype);

}  // namespace snapstream
