// The CPU's extensions and the cap on them (isa.h), and the ops that read and set the cap.

#include "isa.h"

#include <torch/extension.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

// Lowest first: a cap keeps the extensions of its level and those below.
constexpr std::array<const char*, 4> kCaps = {"generic", "avx2", "avx512", "native"};
constexpr int kNative = 3;

int cap_index(const std::string& name) {
  for (int i = 0; i < static_cast<int>(kCaps.size()); ++i)
    if (name == kCaps[i]) return i;
  return -1;
}

int cap_from_environment() {
  const char* name = std::getenv("SNAPSTREAM_KERNELS");
  if (name == nullptr || *name == '\0') return kNative;
  const int index = cap_index(name);
  TORCH_CHECK(index >= 0, "SNAPSTREAM_KERNELS must be native, avx512, avx2 or generic, got '",
              name, "'");
  return index;
}

std::atomic<int>& cap() {
  static std::atomic<int> value{cap_from_environment()};
  return value;
}

#if defined(__x86_64__) && defined(__GNUC__)
// Linux grants the AMX tile registers on request (arch_prctl); without it the first tile
// instruction faults.
bool amx_granted() {
  if (!__builtin_cpu_supports("amx-bf16") || !__builtin_cpu_supports("amx-tile")) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

snapstream::Isa this_cpu() {
  snapstream::Isa cpu;
  cpu.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
  cpu.avx_vnni = cpu.avx2 && __builtin_cpu_supports("avxvnni");
  cpu.avx512 = cpu.avx2 && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  cpu.avx512_vnni = cpu.avx512 && __builtin_cpu_supports("avx512vnni");
  cpu.avx512_bf16 = cpu.avx512 && __builtin_cpu_supports("avx512bf16");
  cpu.amx = cpu.avx512_bf16 && amx_granted();
  return cpu;
}
#else
snapstream::Isa this_cpu() { return {}; }
#endif

}  // namespace

namespace snapstream {

Isa isa() {
  static const Isa cpu = this_cpu();
  const int level = cap().load(std::memory_order_relaxed);
  Isa usable;
  if (level >= 1) {
    usable.avx2 = cpu.avx2;
    usable.avx_vnni = cpu.avx_vnni;
  }
  if (level >= 2) usable.avx512 = cpu.avx512;
  if (level >= kNative) usable = cpu;
  return usable;
}

std::string kernel_cap() { return kCaps[cap().load()]; }

void set_kernel_cap(const std::string& name) {
  const int index = cap_index(name);
  TORCH_CHECK(index >= 0, "set_kernel_cap: want native, avx512, avx2 or generic, got '", name,
              "'");
  cap().store(index);
}

}  // namespace snapstream

namespace {

std::string kernel_cap_op() { return snapstream::kernel_cap(); }

void set_kernel_cap_op(const std::string& name) { snapstream::set_kernel_cap(name); }

// The CPU's extensions under the cap, by name.
std::vector<std::string> isa_op() {
  const snapstream::Isa usable = snapstream::isa();
  std::vector<std::string> names;
  const std::pair<bool, const char*> all[] = {
      {usable.avx2, "avx2"}, {usable.avx_vnni, "avx_vnni"}, {usable.avx512, "avx512"},
      {usable.avx512_vnni, "avx512_vnni"}, {usable.avx512_bf16, "avx512_bf16"},
      {usable.amx, "amx"}};
  for (const auto& [on, name] : all)
    if (on) names.emplace_back(name);
  return names;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapstream, m) {
  m.def("kernel_cap() -> str", &kernel_cap_op);
  m.def("set_kernel_cap(str name) -> ()", &set_kernel_cap_op);
  m.def("isa() -> str[]", &isa_op);
}
