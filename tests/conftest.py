"""Guards for the whole suite: process-wide state a test must leave as it found it."""
import signal

import pytest


@pytest.fixture(autouse=True)
def sigpipe_stays_ignored():
    """Python ignores SIGPIPE so a closed pipe is an error, not a death. Code run in-process that
    resets it (the CLI did, for `| head`) made the next write to a finished subprocess's pipe kill
    pytest itself: CI ended at 88% with exit 141 and no report. Fail the test that did it instead."""
    yield
    handler = signal.getsignal(signal.SIGPIPE)
    if handler is not signal.SIG_IGN:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        pytest.fail(f"this test left SIGPIPE's handler at {handler}: process-wide settings belong "
                    "in a console-script entry, never in code tests call in-process")


@pytest.fixture(scope="session", autouse=True)
def shared_runs_and_fork_server(tmp_path_factory):
    """Where this session's shared reference runs and kept plans live (tests/reference_runs.py:
    one directory for all xdist workers), and the one-rank fork server's end (tests/forkserver.py)."""
    import os

    from tests import forkserver, reference_runs

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    reference_runs.set_root(shared / "shared-runs")
    # the planner's kept predictions (suite/matrix/plan_cache.py): the session's, never ~/.cache
    os.environ.setdefault("SHARDBENCH_CACHE_DIR", str(shared / "cache"))
    yield
    forkserver.close()
