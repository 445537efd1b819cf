"""scripts/install-tools.sh (run by `make tools`) is idempotent: run again with everything in
place, it re-downloads nothing, leaves the pinned binaries as they are and says what it has."""
from __future__ import annotations

import os
import subprocess

from chart_helpers import CHECKOV, HELMS, REPO, TOOLS, tool


def test_install_tools_is_idempotent():
    before = {name: (tool(path), path.stat().st_mtime_ns) for name, path in HELMS.items()}
    tool(CHECKOV)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "install-tools.sh")], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "helm v3.19.0" in proc.stdout and "v4.1.4" in proc.stdout and "checkov 3.3.30" in proc.stdout
    assert "sshd: OpenSSH_" in proc.stdout  # the emulated MPIJob test's sshd
    # The monitoring tests' servers: Debian's prometheus (with promtool) and the mlflow server's venv.
    assert "prometheus 2.42.0+ds-5+deb12u1" in proc.stdout and "mlflow 3.17.2" in proc.stdout
    assert os.access(TOOLS / "prometheus" / "promtool", os.X_OK) and os.access(TOOLS / "mlflow-venv" / "bin" / "mlflow", os.X_OK)
    assert {name: path.stat().st_mtime_ns for name, path in HELMS.items()} == \
        {name: mtime for name, (_, mtime) in before.items()}
    # checkov's helm runner finds helm 3 through .tools/bin.
    assert (TOOLS / "bin" / "helm").resolve() == HELMS["helm3"].resolve()
