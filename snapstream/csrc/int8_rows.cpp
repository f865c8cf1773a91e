// K or V rows (..., D) -> int8 rows (..., D + 4) (int8_rows.h): the prompt's kept rows are
// quantized here, one pass per row, instead of ~8 torch ops over the whole tensor.

#include <torch/extension.h>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <vector>

#include "int8_rows.h"

namespace snapstream {

at::Tensor int8_rows(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() >= 1 && x.size(-1) > 0 &&
                  at::isFloatingType(x.scalar_type()),
              "int8_rows: want a floating-point CPU tensor (..., D), D > 0");
  const at::Tensor xc = x.contiguous();
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  const int64_t width = dim + static_cast<int64_t>(sizeof(float));  // codes, then the scale
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = width;
  at::Tensor out = at::empty(shape, x.options().dtype(at::kChar));
  int8_t* dst = out.data_ptr<int8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "int8_rows", [&] {
    const scalar_t* src = xc.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 64, [&](int64_t first, int64_t last) {
      for (int64_t row = first; row < last; ++row)
        quantize_row(src + row * dim, dim, dst + row * width);
    });
  });
  return out;
}

}  // namespace snapstream

TORCH_LIBRARY_FRAGMENT(snapstream, m) { m.def("int8_rows(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(snapstream, CPU, m) { m.impl("int8_rows", &snapstream::int8_rows); }
