"""chart/files/contract.json and the trainer-owned enums/defaults of chart/values.schema.json are
generated from the trainer's tables (scripts/gen_chart_contract.py): the checked-in files must be
what the script writes now, and the templates must read the facts from there."""
from __future__ import annotations

import importlib.util
import json

from chart_helpers import CHART, REPO, one, render

spec = importlib.util.spec_from_file_location("gen_chart_contract", REPO / "scripts" / "gen_chart_contract.py")
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)


def test_checked_in_files_are_what_the_script_writes():
    for path, text in gen.rendered().items():
        assert path.read_text() == text, f"{path} is stale: run python scripts/gen_chart_contract.py"


def test_check_mode_names_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "contract.json"
    stale.write_text(json.dumps({"strategies": {"ddp": {}}}))
    monkeypatch.setattr(gen, "CONTRACT", stale)
    monkeypatch.setattr(gen, "REPO", tmp_path.parent)
    assert gen.main(["--check"]) == 1
    assert "contract.json is out of date" in capsys.readouterr().err


def test_contract_holds_the_trainer_tables():
    from shardbench.trainer.contract import PRECISIONS, STRATEGIES
    from shardbench.trainer.presets import PRESETS

    c = json.loads((CHART / "files" / "contract.json").read_text())
    assert list(c["strategies"]) == list(STRATEGIES)
    assert {s for s, f in c["strategies"].items() if f["deepspeed"]} == {s for s, i in STRATEGIES.items()
                                                                         if i.engine == "deepspeed"}
    assert {k: v["blockSize"] for k, v in c["presets"].items()} == {k: p.block_size for k, p in PRESETS.items()}
    assert c["precisions"] == list(PRECISIONS)
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["run"]["properties"]["model"]["enum"] == list(PRESETS)


def test_templates_take_strategy_facts_from_the_contract():
    for tpl in (CHART / "templates").rglob("*"):
        if tpl.is_file():
            assert 'hasPrefix "zero"' not in tpl.read_text(), tpl
    # A DeepSpeed override is mounted for a ZeRO run only.
    sets = ("deepspeed.config.zero_optimization.overlap_comm=false",)
    for strategy, mounted in (("zero2", True), ("ddp", False)):
        job = one(render("helm3", (), (*sets, f"run.strategy={strategy}")), "MPIJob")
        args = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
        assert ("--deepspeed-config" in args) == mounted


def test_ds_configs_are_generated_and_a_stale_or_orphan_copy_is_named(tmp_path, monkeypatch, capsys):
    """chart/files/ds_configs/ was a hand copy of trainer/ds_configs/; the script now writes it."""
    from shardbench.trainer.contract import STRATEGIES

    want = {p.name for p in gen.ds_configs()}
    assert want == {f"{s}.json" for s, i in STRATEGIES.items() if i.engine == "deepspeed"}
    monkeypatch.setattr(gen, "DS_CONFIGS", tmp_path)
    monkeypatch.setattr(gen, "REPO", tmp_path.parent)
    for path, text in gen.ds_configs().items():
        path.write_text(text)
    (tmp_path / "zero9.json").write_text("{}")  # a strategy the table no longer has
    first = sorted(want)[0]
    (tmp_path / first).write_text('{"stale": true}')
    monkeypatch.setattr(gen, "rendered", lambda: gen.ds_configs())
    assert gen.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert f"{first} is out of date" in err and "zero9.json is out of date" in err
    assert gen.main([]) == 0 and not (tmp_path / "zero9.json").exists()
    assert gen.main(["--check"]) == 0
