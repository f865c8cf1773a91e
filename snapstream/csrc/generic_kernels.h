// SNAPSTREAM_GENERIC_KERNELS=1 sends every kernel down its plain C++ path, whatever the CPU
// has, so that a machine with AVX-512 also runs (and tests) the code other CPUs take;
// SNAPSTREAM_GENERIC_KERNELS=avx512 keeps the quantized matmuls to plain AVX-512 (F and BW),
// the path of CPUs without AVX512-BF16, VNNI or AMX. Read at each call: a test can switch it.
#pragma once

#include <cstdlib>
#include <cstring>

namespace snapstream {

inline bool generic_kernels_requested() {
  const char* generic = std::getenv("SNAPSTREAM_GENERIC_KERNELS");
  return generic && std::strcmp(generic, "1") == 0;
}

inline bool plain_avx512_requested() {
  const char* generic = std::getenv("SNAPSTREAM_GENERIC_KERNELS");
  return generic && std::strcmp(generic, "avx512") == 0;
}

}  // namespace snapstream
