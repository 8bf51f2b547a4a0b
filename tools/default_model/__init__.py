"""The embedded default model's tools: ``train`` (fine-tune), ``ship`` (export, measure and place it in the package),
``measure`` (re-measure the shipped graph on another CPU), ``window_choice`` and
``contradiction_choice`` (how it reads long documents) and
``recover`` (a fine-tunable checkpoint from the shipped INT8 graph), with its quality records (``quality.json``).

Run them from the repository root: ``python tools/default_model/train.py ...``, ``python -m tools.default_model.ship
...``, ``python -m tools.default_model.measure ...``.
"""
