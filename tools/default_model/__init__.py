"""The embedded default model's tools: ``train`` (fine-tune), ``ship`` (export, measure and place it in the package)
and ``measure`` (re-measure the shipped graph on another CPU), with its quality records (``quality.json``).

Run them from the repository root: ``python tools/default_model/train.py ...``, ``python -m tools.default_model.ship
...``, ``python -m tools.default_model.measure ...``.
"""
