"""A rank blocked in the rendezvous ends on SIGTERM (issue 35 item 6): under torchrun, a second
run on a busy checkpoint dir has rank 0 refuse at once (exit 2) while rank 1 waits in the
rendezvous for it; torchrun then SIGTERMs rank 1, which ignored it (a Python handler cannot run
inside that C++ wait) until torchrun's SIGKILL 30 s later."""
from __future__ import annotations

import fcntl
import os
import subprocess

import pytest

from tests.trainer.conftest import BIN, REPO, cpu_env, free_port

pytestmark = pytest.mark.slow  # a real torchrun (~15-30 s here)


def test_rank_1_in_the_rendezvous_ends_on_sigterm_when_rank_0_refuses(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    holder = os.open(ckpt / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another run holds the checkpoint dir
    try:
        # rank 0 waits this long for the lock: by then rank 1 is in the rendezvous
        env = {**cpu_env(), "SHARDBENCH_CKPT_LOCK_WAIT_S": "10"}
        proc = subprocess.run(
            [str(BIN / "torchrun"), "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
             "--master-port", str(free_port()), "-m", "shardbench.trainer", "--strategy", "ddp", "--seq-len", "32",
             "--steps", "4", "--warmup-steps", "1", "--device", "cpu", "--precision", "fp32",
             "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--output-dir", str(tmp_path / "out")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        os.close(holder)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "is in use by" in out, out[-3000:]
    # torchrun names how each rank ended: rank 1 by SIGTERM (-15), not by its SIGKILL (-9)
    assert "exitcode  : -15" in out and "exitcode  : -9" not in out, out[-3000:]
