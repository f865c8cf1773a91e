"""The compiled part of snapstream: CPU kernels registered as torch ops (snapstream/csrc/).

-ffp-contract=off: floating-point operations are computed as written (a kernel writes its fused
multiply-adds explicitly), so a plain loop gives the same bits on every instruction set it is
compiled for and the kernels that match torch's separate multiplies and adds bit for bit stay so.

Everything else about the package is in pyproject.toml. The build needs torch's headers: pip
builds it in the virtualenv that already holds torch (``--no-build-isolation``, as
scripts/setup.sh and deploy/Dockerfile do).
"""

from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[CppExtension(
        "snapstream._kernels",
        sorted(str(p) for p in Path("snapstream/csrc").glob("*.cpp")),
        extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=off"], extra_link_args=["-fopenmp"])],
    cmdclass={"build_ext": BuildExtension},
)
