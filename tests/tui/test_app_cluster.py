"""benchtui on the cluster backend, against the kmock Kubernetes emulator (not a real API server):
the app checks the cluster, installs one Helm release per run, and shows the launcher pod's log
and the collected tokens/s. The test plays the MPI Operator (see kube_emulator.py)."""
from __future__ import annotations

import asyncio

import pytest
from textual.widgets import DataTable

from shardbench.tui.app.app import BenchApp
from shardbench.suite.backends import ClusterOptions
from shardbench.suite.matrix.expand import MatrixSpec, expand
from shardbench.suite.analyze.rows import without_repeat

from .conftest import settle
from .kube_emulator import Emulator, add_pod, install_shims, serve_log, set_conditions, wait_for_mpijob, write_kubeconfig
from .test_app_pilot import wait_until
from .test_kube_backend import helm, launcher_log  # noqa: F401 - helm is a fixture (3 and 4)


@pytest.mark.slow  # over 4 s on an idle machine (the fast subset's rule)
async def test_matrix_runs_on_the_emulated_cluster(tmp_path, monkeypatch, fixture_values, helm):
    monkeypatch.setenv("SHARDBENCH_HELM", str(helm))
    async with Emulator() as emu, emu.Server(emu) as server:
        install_shims(emu)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(server.url))
        matrix = MatrixSpec(strategies=["ddp"], world_sizes=[2], seq_lens=[64], steps=5, warmup_steps=2,
                            backend="kubernetes", shape="cpu", launcher="mpirun", precision="fp32",
                            device="cpu", timeout_s=60, results=str(tmp_path / "results"))
        app = BenchApp(matrix=matrix,
                       cluster=ClusterOptions(kubeconfig=str(kubeconfig)))
        (s,), errors = expand(matrix)
        assert errors == []

        async def operator():
            name = (await wait_for_mpijob(emu))["metadata"]["name"]
            pod = add_pod(emu, name, "launcher", "Running")
            serve_log(emu, pod, launcher_log(s, 777.5))
            await set_conditions(emu, name, "Created", "Running")
            await asyncio.sleep(1.0)
            await set_conditions(emu, name, "Created", "Running", "Succeeded")

        async with app.run_test(size=(150, 45)) as pilot:
            await wait_until(pilot, lambda: app.backend_status.get("kubernetes") == (True, ""), 30,
                             "the cluster check")
            op = asyncio.create_task(operator())
            await pilot.press("ctrl+r")
            await wait_until(pilot, lambda: app.matrix_worker is not None and app.matrix_worker.is_finished,
                             90, "the cluster matrix")
            await op
            row = app.board.rows[s.run_id]
            assert row.state == "ok", row.detail
            assert any("launcher done" in line for line in row.log)
            await wait_until(pilot, lambda: app.results_screen.view.rows, 30, "the results")
            await settle(pilot)
            await pilot.press("f5")
            await pilot.pause()
            cell = app.results_screen.query_one("#results-table", DataTable).get_cell(
                without_repeat(s.run_id), "tokens_per_s")
            assert cell.value == 777.5
