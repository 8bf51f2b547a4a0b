"""fastnli's benchmarks: they live beside the package, not in its wheel.

``python -m bench`` runs the side-by-side table (uqlm, PyTorch, fastnli fp32/INT8) with PNG plots; the other
benchmarks run as ``python -m bench.<name>`` (``scheduler_report``, ``calm_pairs``, ``serve_load``, ``ray_scale``) and
``pytest bench/`` (pytest-benchmark timings). Needs a source checkout and ``pip install -e '.[export,bench]'``.
"""
