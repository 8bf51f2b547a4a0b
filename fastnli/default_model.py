"""The embedded default model: a small NLI cross-encoder shipped inside the package (INT8 ONNX + tokenizer)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL_DIR = Path(__file__).parent / "models" / "default"


def default_model_dir() -> Path:
    """Directory of the embedded default model's export artifact.

    Raises:
        FileNotFoundError: when this build of fastnli ships no default model; pass a model instead, e.g.
            ``NLIEngine.from_pretrained("microsoft/deberta-large-mnli")``.
    """
    if (DEFAULT_MODEL_DIR / "manifest.json").is_file():
        return DEFAULT_MODEL_DIR
    raise FileNotFoundError(
        "this fastnli build ships no embedded default model; pass a model, e.g. "
        "NLIEngine.from_pretrained('microsoft/deberta-large-mnli') or an artifact directory made by `fastnli export`"
    )
