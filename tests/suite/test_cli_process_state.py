"""The `shardbench` CLI's process-wide settings live in its console-script entry only: tests and
benchtui call `main` in-process, and a SIGPIPE reset there killed a whole CI pytest run (exit 141)."""
import os
import signal
import subprocess
import sys

from shardbench.suite.cli.commands import main
from shardbench.trainer.streams import TolerantStream



def test_in_process_dry_run_leaves_sigpipe_and_stdout_alone(capsys):
    assert main(["run", "--dry-run", "--strategies", "ddp", "--world-sizes", "1"]) == 0
    assert signal.getsignal(signal.SIGPIPE) is signal.SIG_IGN
    assert not isinstance(sys.stdout, TolerantStream)
    assert "ddp" in capsys.readouterr().out


def test_console_script_ends_quietly_on_a_closed_pipe():
    # A pipe whose reader is already gone, as after `| head` exits: the first write must end the
    # command by SIGPIPE, with no BrokenPipeError traceback on stderr.
    read_end, write_end = os.pipe()
    os.close(read_end)
    code = "import sys; from shardbench.suite.cli.commands import entry; sys.exit(entry())"
    proc = subprocess.run([sys.executable, "-c", code, "run", "--dry-run", "--strategies", "ddp"],
                          stdout=write_end, stderr=subprocess.PIPE, text=True)
    os.close(write_end)
    assert proc.returncode == -signal.SIGPIPE
    assert proc.stderr == ""
