"""Float values set with `helm --set` (issue 27): helm passes `x=0.5` as the string "0.5" (it types
only integers), which the schema refused ("got string, want number") for every float value. Now
every number of values.schema.json also takes numeric text (generated, scripts/gen_chart_contract.py),
the templates write it verbatim, and its bounds are checked on the text (templates/_numbers.tpl),
one line each. Real helm 3 and 4."""
from __future__ import annotations

import json

import pytest

from chart_helpers import CHART, HELMS, launcher_argv, one, render, render_text, template_error

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
CONTRACT = json.loads((CHART / "files" / "contract.json").read_text())
RULE = ("metrics.enabled=true", "metrics.prometheusRule.enabled=true")


def number_nodes(node, path=""):
    for key, prop in (node.get("properties") or {}).items():
        where = f"{path}.{key}" if path else key
        kind = prop.get("type")
        if "number" in (kind if isinstance(kind, list) else [kind]):
            yield where, prop
        yield from number_nodes(prop, where)


def test_every_number_value_takes_numeric_text_and_its_bounds_are_in_the_contract():
    numbers = dict(number_nodes(SCHEMA))
    assert "metrics.prometheusRule.throughputRatio" in numbers and "shape.peakTflopsBf16" in numbers
    for path, prop in numbers.items():
        if "integer" in prop["type"]:
            continue  # a quantity (shmSize: "1Gi") has its own pattern
        assert "string" in prop["type"] and prop["pattern"].startswith("^[+-]?"), path
        assert CONTRACT["numbers"][path] == {k: prop[k] for k in ("minimum", "exclusiveMinimum", "maximum",
                                                                  "exclusiveMaximum") if k in prop}, path


@pytest.mark.parametrize("helm", list(HELMS))
def test_set_of_a_float_renders_it(helm):
    text = render_text(helm, sets=(*RULE, "metrics.prometheusRule.throughputRatio=0.5"))
    assert "< 0.5 * max by (release, run, strategy, shape) (shardbench_expected_tokens_per_second" in text
    argv = launcher_argv(one(render(helm, sets=("shape.peakTflopsBf16=989.5", "shape.usdPerGpuHour=2.5e0")),
                             "MPIJob"))
    command = " ".join(argv)
    assert "--peak-tflops 989.5" in command and "--usd-per-gpu-hour 2.5e0" in command


@pytest.mark.parametrize("helm", list(HELMS))
@pytest.mark.parametrize("value, line", [
    ("1.5", "metrics.prometheusRule.throughputRatio must be at most 1, got 1.5"),
    ("0.0", "metrics.prometheusRule.throughputRatio must be above 0, got 0.0"),
])
def test_set_of_a_float_out_of_bounds_fails_in_one_line(helm, value, line):
    err = template_error(helm, sets=(*RULE, f"metrics.prometheusRule.throughputRatio={value}"))
    assert line in err.splitlines()[0], err  # helm adds its own "Use --debug" hint below


@pytest.mark.parametrize("helm", list(HELMS))
def test_text_that_is_no_number_is_refused_by_the_schema(helm):
    err = template_error(helm, sets=(*RULE, "metrics.prometheusRule.throughputRatio=half"))
    assert "throughputRatio" in err and "does not match pattern" in err
