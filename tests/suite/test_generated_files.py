"""Every generated file is checked for staleness: each generator under scripts/gen_*.py has a
`--check` mode, and it must pass on this checkout (a generator added later is picked up by the
glob). The files: chart/files/contract.json, chart/values.schema.json and
chart/files/ds_configs/ (gen_chart_contract.py), chart/README.md's values table
(gen_values_table.py), docs/knobs.md (gen_knob_docs.py); the record's JSON Schema is checked by
tests/trainer/test_cli.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GENERATORS = ["gen_chart_contract.py", "gen_values_table.py", "gen_knob_docs.py"]
"""Generators of files derived from the code: each has --check, run below."""
NOT_FROM_CODE = {"gen_readme_sample.py": "README's sample answer comes from a measured result set "
                                         "(tests/suite/test_readme_sample.py)"}


def test_every_generator_is_checked_or_says_why_not():
    found = {p.name for p in (REPO / "scripts").glob("gen_*.py")}
    assert found <= set(GENERATORS) | set(NOT_FROM_CODE), "a new scripts/gen_*.py: add it to GENERATORS (with --check)"
    assert set(GENERATORS) <= found


@pytest.mark.parametrize("script", GENERATORS)
def test_generated_files_are_current(script):
    out = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--check"], capture_output=True,
                         text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr


def test_the_knob_docs_list_every_knob_section_by_section():
    from shardbench.trainer import knobs

    text = (REPO / "docs" / "knobs.md").read_text()
    heads = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert heads == list(knobs.by_section())
    for f in knobs.knob_fields():
        assert f"`--{f.name.replace('_', '-')}`" in text, f.name
