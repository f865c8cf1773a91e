"""The peer venvs' recipes: pinned requirements and build steps (each peer in a venv of its own).

Top-level packages are pinned exactly; what pip resolves under them is recorded per venv
(``Venv.info["versions"]``) and printed with every benchmark.
"""

from __future__ import annotations

from bench.peers.venvs import Step, VenvSpec
from snapstream.cpu import capped_flags

LLAMA_CPP_PYTHON = "0.3.36"
_LLAMA_SDIST = f"{{venv}}/src/llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
_LLAMA_SOURCE = f"{{venv}}/src/llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp"
LLAMA_BUILD_DIR = "llama.cpp"  # under the venv; its bin/ holds libllama.so and llama-server

# CPU build with OpenMP for this machine's vector extensions (AVX2, FMA, F16C; AVX-512 and its
# VBMI, VNNI and BF16 where /proc/cpuinfo lists them: a build with extensions the CPU lacks dies
# of SIGILL on its first token, and the flags are part of the venv's key, so a cache built on
# another CPU is not reused; under SNAPSTREAM_KERNELS=avx2 or avx512, the extensions of a CPU
# of that kind, so that llama.cpp is forced down as snapstream's kernels are). AMX is left out:
# a CPU may report amx_tile, but in these VMs its first tile load (ggml's AMX matmul, used for
# Q4_K/Q5_0/Q8_0 weights) dies of SIGILL, so -march=native (GGML_NATIVE) built a llama.cpp that
# crashed on its first token (llama.cpp as vendored in llama-cpp-python 0.3.36). The web UI is
# left out: it would be fetched at build time.
AVX512_OPTIONS = (("GGML_AVX512", "avx512f"), ("GGML_AVX512_VBMI", "avx512_vbmi"),
                  ("GGML_AVX512_VNNI", "avx512_vnni"), ("GGML_AVX512_BF16", "avx512_bf16"))


def llama_cmake_args(flags: frozenset[str]) -> tuple[str, ...]:
    """llama.cpp's CMake options for a CPU with ``flags`` (/proc/cpuinfo's)."""
    avx512 = tuple(f"-D{option}={'ON' if flag in flags else 'OFF'}"
                   for option, flag in AVX512_OPTIONS)
    return ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=OFF",
            "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_BMI2=ON", "-DGGML_FMA=ON",
            "-DGGML_F16C=ON", *avx512, *_LLAMA_COMMON_ARGS)


_LLAMA_COMMON_ARGS = (
    "-DGGML_OPENMP=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
)
LLAMA_CMAKE_ARGS = llama_cmake_args(capped_flags())

# llama-cpp-python's own server (``python -m llama_cpp.server``) runs one request at a time
# behind a lock and has no parallel slots, so continuous batching needs llama.cpp's C++
# ``llama-server``. Both come from one compile of the llama.cpp source vendored in the
# llama-cpp-python sdist: the bindings are installed without their own build
# (``-DLLAMA_BUILD=OFF``) and load that build's libllama.so through ``LLAMA_CPP_LIB_PATH``,
# so the Python runner and the server run the same binary.
LLAMACPP = VenvSpec(
    name="llamacpp",
    requirements=(f"llama-cpp-python[server]=={LLAMA_CPP_PYTHON}",),
    pip_env=(("CMAKE_ARGS", "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"), ("PIP_NO_CACHE_DIR", "1")),
    steps=(
        Step("download the llama-cpp-python sdist",
             ("{python}", "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              "--no-cache-dir", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", "{venv}/src")),
        Step("unpack it", ("tar", "xzf", _LLAMA_SDIST, "-C", "{venv}/src")),
        Step("cmake configure llama.cpp",
             ("cmake", "-S", _LLAMA_SOURCE, "-B", f"{{venv}}/{LLAMA_BUILD_DIR}",
              *LLAMA_CMAKE_ARGS)),
        Step("cmake build libllama + llama-server (the long part)",
             ("cmake", "--build", f"{{venv}}/{LLAMA_BUILD_DIR}", "--target", "llama-server",
              "-j", "{jobs}")),
    ),
)

# torch is pinned to the CPU wheel this machine has, which keeps pip from fetching CUDA wheels;
# torchvision is removed because pip pulls one built for another torch and the export then
# dies on ``torchvision::nms``. gguf and accelerate let transformers read the GGUF for the export.
OPENVINO = VenvSpec(
    name="openvino",
    requirements=("torch==2.13.0", "optimum-intel[openvino]==2.2.0",
                  "openvino-genai==2026.4.1.0", "gguf>=0.10,<1", "accelerate>=1.0,<2"),
    steps=(Step("remove torchvision", ("{python}", "-m", "pip", "uninstall", "-y",
                                       "torchvision")),),
)

# kvpress 0.5.5 pins transformers < 5.3; the same venv runs the transformers baseline.
KVPRESS = VenvSpec(
    name="kvpress",
    requirements=("torch==2.13.0", "kvpress==0.5.5", "gguf>=0.10,<1"),
)
