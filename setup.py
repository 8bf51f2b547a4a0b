"""Builds fastnli's compiled parts: the pair scheduler (``fastnli.kernels._schedule``) with Cython, and the ONNX
Runtime custom operator library (``fastnli.kernels._ortops``, C++ against ONNX Runtime's C API header in
``csrc/ortops/include``).

Compiler directives are set here, in one place. ``FASTNLI_DEBUG_BUILD=1`` turns bounds checks and
wraparound back on for debugging. The operator library is optional: where it does not build (no C++17 compiler),
the install goes on without it and sessions run the plain graph (``fastnli.engine.fused_attention``).
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

ortops = Extension(
    "fastnli.kernels._ortops",  # loaded by path with SessionOptions.register_custom_ops_library, never imported
    ["csrc/ortops/disentangled_attention.cpp"],
    include_dirs=["csrc/ortops/include"],
    depends=["csrc/ortops/attention_kernel.inc", *(f"csrc/ortops/include/{name}" for name in
             ("onnxruntime_c_api.h", "onnxruntime_ep_c_api.h", "onnxruntime_error_code.h", "README.md"))],
    language="c++",
    extra_compile_args=["-O3", "-g0", "-std=c++17", "-fvisibility=hidden"],  # no debug info: the .so is 75 KB
    extra_link_args=["-pthread"],
    optional=True,
)

setup(ext_modules=[*cythonize(extensions, compiler_directives=directives), ortops])
