// The instruction sets the CPU kernels may use: what this CPU has (read once, at load), capped
// by SNAPSTREAM_KERNELS (read once at load; a test changes it through the op
// ``snapstream::set_kernel_cap``). Every kernel asks here and nowhere else, so one setting sends
// every kernel down the path of another kind of CPU:
//   native   everything this CPU has (the default);
//   avx512   AVX-512 F, BW and VL, without VNNI, BF16 or AMX (a Skylake-SP's kernels);
//   avx2     AVX2, FMA and F16C (and AVX-VNNI where the CPU has it), no AVX-512 (Zen 2/3);
//   generic  plain C++ (what an aarch64 build or an older x86-64 runs).
// A cap above what the CPU has changes nothing.
#pragma once

#include <string>

// One source, several instruction sets: plain C++ loops in a lambda marked SNAPSTREAM_BODY,
// run by ``run_vectorized``, are compiled (and vectorized) twice: for AVX2 + FMA, taken where the
// cap allows it, and for the baseline (an aarch64 build compiles only the latter). A function
// the lambda calls is compiled into both only if it is inlined: mark large ones
// SNAPSTREAM_INLINE.
#if defined(__x86_64__) && defined(__GNUC__)
#define SNAPSTREAM_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define SNAPSTREAM_TARGET_AVX2
#endif
#define SNAPSTREAM_BODY __attribute__((always_inline))
#define SNAPSTREAM_INLINE inline __attribute__((always_inline))

namespace snapstream {

// The extensions a kernel path needs, each one on or off.
struct Isa {
  bool avx2 = false;         // AVX2 + FMA + F16C (x86-64-v3)
  bool avx_vnni = false;     // VEX-encoded vpdpbusd on 256-bit registers
  bool avx512 = false;       // AVX-512 F + BW + VL
  bool avx512_vnni = false;  // vpdpbusd on 512-bit registers
  bool avx512_bf16 = false;  // vdpbf16ps
  bool amx = false;          // AMX tiles with bfloat16 products, granted by the kernel
};

// The CPU's extensions (read once), under the cap.
Isa isa();

// The cap's name: native, avx512, avx2 or generic.
std::string kernel_cap();

// Sets the cap (one of the names above); raises on another name.
void set_kernel_cap(const std::string& name);

template <typename F>
SNAPSTREAM_TARGET_AVX2 void run_avx2(const F& body) {
  body();
}

template <typename F>
void run_baseline(const F& body) {
  body();
}

// Runs ``body`` (a lambda marked SNAPSTREAM_BODY) as compiled for AVX2 where the cap allows it.
template <typename F>
void run_vectorized(const F& body) {
  if (isa().avx2) return run_avx2(body);
  run_baseline(body);
}

}  // namespace snapstream
