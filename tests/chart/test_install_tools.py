"""scripts/install-tools.sh (run by `make tools`) is idempotent: run again with everything in
place, it re-downloads nothing, leaves the pinned binaries as they are and says what it has.

It runs on a copy of the checkout's .tools in a temp dir, never on .tools itself (a test that
broke the installer must not break every other test's tools), reached through a symlink: the
MLflow venv's #! lines hold the physical path, and the installer once compared them with the
logical one and deleted and rebuilt the venv. The copy hardlinks the big files (the installer
replaces files, it never writes into one it keeps) and rewrites the venvs' #! lines for the new
place, as a venv built there would have them."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from chart_helpers import CHECKOV, HELMS, REPO, TOOLS, tool


def _relocate_scripts(venv: Path, old: str, new: str) -> None:
    """The venv's console scripts with #! lines naming `new` instead of `old` (fresh files, so the
    hardlinked originals stay untouched)."""
    for script in (venv / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if data.startswith(b"#!" + old.encode()):
            fresh = script.with_name(script.name + ".tmp")
            fresh.write_bytes(data.replace(old.encode(), new.encode(), 1))
            fresh.chmod(script.stat().st_mode)
            os.replace(fresh, script)


@pytest.fixture
def linked_tools(tmp_path) -> Path:
    """A copy of .tools at tmp/real, reached as tmp/link (a symlink)."""
    for path in [*HELMS.values(), CHECKOV, TOOLS / "mlflow-venv" / "bin" / "mlflow"]:
        tool(path)
    real = tmp_path / "real"
    subprocess.run(["cp", "-al", str(TOOLS), str(real)], check=True, timeout=300)
    for venv in ("mlflow-venv", "checkov-venv"):
        _relocate_scripts(real / venv, str((TOOLS / venv).resolve()), str(real.resolve() / venv))
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    return link


def test_install_tools_is_idempotent_on_a_symlinked_copy(linked_tools):
    real = linked_tools.resolve()
    helms = {name: real / path.relative_to(TOOLS) for name, path in HELMS.items()}
    mlflow = real / "mlflow-venv" / "bin" / "mlflow"
    before = {p: p.stat().st_ino for p in [*helms.values(), mlflow]}
    checkout = {p: p.stat().st_mtime_ns for p in [*HELMS.values(), TOOLS / "mlflow-venv" / "bin" / "mlflow"]}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "install-tools.sh")], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "TOOLS": str(linked_tools)})
    assert proc.returncode == 0, proc.stderr
    assert "helm v3.19.0" in proc.stdout and "v4.1.4" in proc.stdout and "checkov 3.3.30" in proc.stdout
    assert "sshd: OpenSSH_" in proc.stdout  # the emulated MPIJob test's sshd
    # The monitoring tests' servers: Debian's prometheus (with promtool) and the mlflow server's venv.
    assert "prometheus 2.42.0+ds-5+deb12u1" in proc.stdout and "mlflow 3.17.2" in proc.stdout
    assert os.access(real / "prometheus" / "promtool", os.X_OK) and os.access(mlflow, os.X_OK)
    # nothing replaced: the helm binaries and the MLflow venv (not rebuilt through the symlink)
    assert {p: p.stat().st_ino for p in before} == before
    assert mlflow.read_text().splitlines()[0] == f"#!{real}/mlflow-venv/bin/python"
    # checkov's helm runner finds helm 3 through bin/helm.
    assert (linked_tools / "bin" / "helm").resolve() == helms["helm3"]
    # and the checkout's own .tools was not touched
    assert {p: p.stat().st_mtime_ns for p in checkout} == checkout
