"""Builds fastnli's compiled pair scheduler (``fastnli.kernels._schedule``) with Cython.

Compiler directives are set here, in one place. ``FASTNLI_DEBUG_BUILD=1`` turns bounds checks and
wraparound back on for debugging.
"""

import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

debug = os.environ.get("FASTNLI_DEBUG_BUILD", "0") == "1"
directives = {
    "language_level": "3",
    "boundscheck": debug,
    "wraparound": debug,
    "initializedcheck": debug,
    "cdivision": True,
    "embedsignature": True,
}

extensions = [
    Extension(
        "fastnli.kernels._schedule",
        ["fastnli/kernels/_schedule.pyx"],
        include_dirs=[np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
    )
]

setup(ext_modules=cythonize(extensions, compiler_directives=directives))
