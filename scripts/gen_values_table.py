#!/usr/bin/env python3
"""Generate the values table of chart/README.md from chart/values.yaml.

Every key documented with a helm-docs style comment (`# -- text`, continued on the following `#`
lines) becomes one row: key, type (from values.schema.json), default (from values.yaml), text.
The table sits between the BEGIN/END markers in the README.

  python scripts/gen_values_table.py           # rewrite chart/README.md
  python scripts/gen_values_table.py --check   # exit 1 if the README is stale or a key lacks `# --`

tests/chart/test_chart_docs.py runs the check, so the README cannot drift from values.yaml.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[1] / "chart"
BEGIN = "<!-- BEGIN values table (scripts/gen_values_table.py) -->"
END = "<!-- END values table -->"
PIPE = "\\|"  # a | inside a table cell
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")


def documented_keys(text: str) -> dict[str, str]:
    """{dotted key path: description} for every key preceded by a `# --` comment."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    pending: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        if not stripped:
            pending = None
            continue
        m = KEY.match(line)
        if not m:
            continue  # a block list item or a continuation line
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [m["key"]])
        if pending is not None:
            docs[path] = " ".join(p for p in pending if p)
            pending = None
        stack.append((indent, m["key"]))
    return docs


def leaf_paths(node, prefix: str = "") -> list[str]:
    """Dotted paths of the values that are not non-empty mappings (what a user sets)."""
    if isinstance(node, dict) and node:
        out = []
        for key, value in node.items():
            out += leaf_paths(value, f"{prefix}.{key}" if prefix else key)
        return out
    return [prefix]


def undocumented(values: dict, docs: dict[str, str]) -> list[str]:
    """Leaf keys that neither they nor any enclosing key documents."""
    def covered(path: str) -> bool:
        parts = path.split(".")
        return any(".".join(parts[:i]) in docs for i in range(1, len(parts) + 1))
    return [p for p in leaf_paths(values) if not covered(p)]


def schema_type(schema: dict, path: str) -> str | None:
    node = schema
    for part in path.split("."):
        node = (node.get("properties") or {}).get(part)
        if node is None:
            return None
    if "enum" in node:
        return "string"
    kind = node.get("type")
    if isinstance(kind, list):
        if "number" in kind and "integer" not in kind and "pattern" in node:
            # a number that also takes numeric text for `helm --set` (scripts/gen_chart_contract.py)
            kind = [k for k in kind if k != "string"]
        return " or ".join(kind)
    return kind


def python_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string" if value is not None else "null"


def lookup(values: dict, path: str):
    node = values
    for part in path.split("."):
        node = node[part]
    return node


def table(chart: Path = CHART) -> str:
    text = (chart / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((chart / "values.schema.json").read_text())
    docs = documented_keys(text)
    missing = undocumented(values, docs)
    if missing:
        raise SystemExit(f"values.yaml keys without a `# --` comment: {', '.join(missing)}")
    rows = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for path, desc in docs.items():
        value = lookup(values, path)
        kind = schema_type(schema, path) or python_type(value)
        default = json.dumps(value).replace("|", PIPE)
        rows.append(f"| `{path}` | {kind} | `{default}` | {desc.replace('|', PIPE)} |")
    return "\n".join(rows) + "\n"


def render_readme(readme: str, generated: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"chart/README.md lacks the markers {BEGIN!r} ... {END!r}")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{generated}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if chart/README.md is stale")
    args = parser.parse_args(argv)
    readme_path = CHART / "README.md"
    readme = readme_path.read_text()
    updated = render_readme(readme, table(CHART))
    if args.check:
        if updated != readme:
            print("chart/README.md values table is stale: run python scripts/gen_values_table.py",
                  file=sys.stderr)
            return 1
        return 0
    readme_path.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
