"""The version of fastnli: the single source, read by ``pyproject.toml`` (setuptools dynamic version)."""

__version__ = "0.1.0"
