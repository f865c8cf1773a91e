// ``import snapstream._kernels`` loads this library; the other files register its torch ops
// (namespace ``snapstream``) as it loads.
#include <torch/extension.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}
