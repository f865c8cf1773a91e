// SNAPSTREAM_GENERIC_KERNELS=1 sends every kernel down its plain C++ path, whatever the CPU
// has, so that a machine with AVX-512 also runs (and tests) the code other CPUs take. Read at
// each call: a test can switch it.
#pragma once

#include <cstdlib>
#include <cstring>

namespace snapstream {

inline bool generic_kernels_requested() {
  const char* generic = std::getenv("SNAPSTREAM_GENERIC_KERNELS");
  return generic && std::strcmp(generic, "1") == 0;
}

}  // namespace snapstream
