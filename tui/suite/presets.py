"""Model presets as the suite and the TUI see them: the trainer's own table (trainer/presets.py,
which imports no torch, so reading it costs nothing at start-up)."""
from __future__ import annotations

from dataclasses import asdict

from trainer.presets import PRESETS


def load_presets() -> dict[str, dict]:
    """{preset name: ModelConfig fields} (block_size, n_layer, ...)."""
    return {name: asdict(cfg) for name, cfg in PRESETS.items()}


def preset_max_seq_len(name: str) -> int | None:
    """The preset's block size: the longest seq len its position table holds."""
    return PRESETS[name].block_size if name in PRESETS else None


__all__ = ["PRESETS", "load_presets", "preset_max_seq_len"]
