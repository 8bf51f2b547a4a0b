"""Benchmarks and parity checks of fastnli against reference implementations (uqlm)."""
