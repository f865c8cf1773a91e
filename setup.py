"""The compiled part of snapstream: CPU kernels registered as torch ops (snapstream/csrc/).

Everything else about the package is in pyproject.toml. The build needs torch's headers: pip
builds it in the virtualenv that already holds torch (``--no-build-isolation``, as
scripts/setup.sh and deploy/Dockerfile do).
"""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[CppExtension(
        "snapstream._kernels",
        ["snapstream/csrc/module.cpp", "snapstream/csrc/slot_attention.cpp",
         "snapstream/csrc/rms_norm.cpp", "snapstream/csrc/quant_matmul.cpp",
         "snapstream/csrc/decode_layer.cpp", "snapstream/csrc/prompt_attention.cpp",
         "snapstream/csrc/gated_activation.cpp", "snapstream/csrc/int8_rows.cpp",
         "snapstream/csrc/rotary.cpp"],
        extra_compile_args=["-O3", "-fopenmp"], extra_link_args=["-fopenmp"])],
    cmdclass={"build_ext": BuildExtension},
)
