"""Model preset names and block sizes, read from trainer/model.py without importing torch.

trainer/model.py `PRESETS` is the one table of presets, but importing it imports torch (1-2 s),
too slow for the TUI's start-up and matrix validation. So this module reads the table from the
source with `ast`: each entry is `"name": ModelConfig(key=literal, ...)`. If the source ever stops
being literal enough to read that way, it falls back to importing the real table.
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

MODEL_SOURCE = Path(__file__).resolve().parents[2] / "trainer" / "model.py"


def _from_source(path: Path) -> dict[str, dict]:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == "PRESETS" and isinstance(node.value, ast.Dict):
            table = {}
            for key, call in zip(node.value.keys, node.value.values):
                if not isinstance(call, ast.Call):
                    raise ValueError("PRESETS entry is not a ModelConfig(...) call")
                table[ast.literal_eval(key)] = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
            return table
    raise ValueError("no PRESETS dict literal in trainer/model.py")


def _from_import() -> dict[str, dict]:
    from dataclasses import asdict

    from trainer.model import PRESETS as real  # imports torch: the slow, always-right path

    return {name: asdict(cfg) for name, cfg in real.items()}


@lru_cache(maxsize=1)
def load_presets() -> dict[str, dict]:
    """{preset name: ModelConfig fields given in the table} (block_size, n_layer, ...)."""
    try:
        return _from_source(MODEL_SOURCE)
    except (OSError, SyntaxError, ValueError):
        return _from_import()


class _Presets:
    """Mapping-like view so `name in PRESETS` and iteration read the table lazily."""

    def __contains__(self, name: object) -> bool:
        return name in load_presets()

    def __iter__(self):
        return iter(load_presets())

    def __getitem__(self, name: str) -> dict:
        return load_presets()[name]


PRESETS = _Presets()


def preset_max_seq_len(name: str) -> int | None:
    """The preset's block size: the longest seq len its position table holds."""
    return load_presets()[name].get("block_size")
