"""Build the compiled kernels (Cython extension modules of prbmrm.kernels); the rest is in pyproject.toml.

``pip install .`` (or ``pip install -e .``, which builds them in place) runs
this; in a checkout, ``python setup.py build_ext --inplace`` builds them beside
their sources.
"""

import sys

from Cython.Build import cythonize
from setuptools import Extension, setup

KERNELS = ("scalar", "sparse", "simplex", "activeset", "planes", "order", "fixed")

# Every operation of the kernels' own code rounds as written (no fused multiply-adds where the target has them):
# the same bits on every machine, as their docstrings promise (the LAPACK that activeset calls rounds as scipy's
# OpenBLAS does on the CPU at hand).
FLAGS = [] if sys.platform == "win32" else ["-ffp-contract=off"]

setup(ext_modules=cythonize(
    [Extension(f"prbmrm.kernels.{name}", [f"prbmrm/kernels/{name}.pyx"], extra_compile_args=FLAGS)
     for name in KERNELS],
    compiler_directives={"language_level": 3}))
