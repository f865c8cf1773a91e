// The path each kernel takes on this CPU under the cap (isa.h), by name: what ``snapstream
// info``, the services' /metrics and the benchmark reports print.

#include <torch/extension.h>

#include <string>
#include <vector>

#include "isa.h"
#include "ops.h"

namespace {

// "kernel=path" for every kernel; int4/int8 for groups of 32 inputs (every served model's).
std::vector<std::string> kernel_paths() {
  const snapstream::Isa usable = snapstream::isa();
  const std::string rows = usable.avx512 ? "avx512" : usable.avx2 ? "avx2" : "generic";
  return {"int4_matmul=" + snapstream::quant_matmul_path("int4", 32),
          "int8_matmul=" + snapstream::quant_matmul_path("int8", 32),
          "slot_attention=" + rows,
          "prompt_attention_float32=" + snapstream::prompt_attention_path(at::kFloat),
          "prompt_attention_bfloat16=" + snapstream::prompt_attention_path(at::kBFloat16),
          "row_kernels=" + rows};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapstream, m) { m.def("kernel_paths() -> str[]", &kernel_paths); }
