"""The committed shardbench/ folder (issue 27): its subpackages are the checkout's top-level
folders as relative symlinks, so `shardbench.*` resolves from a plain checkout. A second checkout
on PYTHONPATH runs its own code under `python -m shardbench...` (it ran the installed checkout's
before), and the wheel built from the tree holds the packages with their data files. The tree
shows the architecture: one module file name per module across the project, and suite/ as one
subpackage per concern (matrix, execute, faults, analyze, report, tune, cli, backends)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "suite", "tui")
SOURCE_DIRS = (*PACKAGES, "tests", "scripts", "benchmarks")
SHARED_NAMES = {"__init__.py", "__main__.py", "conftest.py"}
"""File names every package or test folder may have: package markers and pytest's per-folder file."""


def test_no_module_file_name_repeats():
    """A module's file name says which module it is (a traceback, grep, an editor's tabs): two
    metrics.py or two faults.py read as one. Rename the newer one to say what it is."""
    where: dict[str, list[str]] = {}
    for folder in SOURCE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name not in SHARED_NAMES and "__pycache__" not in path.parts:
                where.setdefault(path.name, []).append(path.relative_to(REPO).as_posix())
    repeated = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert repeated == {}, repeated


def test_suite_is_one_subpackage_per_concern():
    """No module sits flat at suite/'s top (its entry points are `python -m shardbench.suite.cli`,
    suite/cli/__main__.py, and the console script's suite/cli/commands.py); every folder of
    modules is a package."""
    suite = REPO / "suite"
    assert sorted(p.name for p in suite.glob("*.py")) == ["__init__.py"]
    for folder in suite.rglob("*"):
        if folder.is_dir() and any(folder.glob("*.py")):
            assert (folder / "__init__.py").is_file(), folder


def test_the_package_folder_links_every_top_level_package():
    tree = REPO / "shardbench"
    assert (tree / "__init__.py").is_file()
    for name in PACKAGES:
        link = tree / name
        assert link.is_symlink() and os.readlink(link) == f"../{name}", name
        assert (link / "__init__.py").is_file()
    # every top-level folder that is a package is linked (a new one must be added here)
    top = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file() and p.name not in ("tests", "shardbench")}
    assert top == set(PACKAGES)


def copy_checkout(root: Path) -> Path:
    for part in ("shardbench", *PACKAGES):
        shutil.copytree(REPO / part, root / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__",
                                                                                              "__snapshots__"))
    return root


def test_python_m_in_a_second_checkout_runs_that_checkout_s_code(tmp_path):
    second = copy_checkout(tmp_path / "second")
    init = second / "suite" / "__init__.py"
    init.write_text(init.read_text() + "\nimport sys\nprint('second checkout', file=sys.stderr)\n")
    env = {**os.environ, "PYTHONPATH": str(second)}
    for cwd in (second, tmp_path):  # from inside it and from elsewhere
        out = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "--help"], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "second checkout" in out.stderr, out.stderr
        where = subprocess.run([sys.executable, "-c", "import shardbench.trainer.config as c; print(c.__file__)"],
                               cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert where.stdout.strip() == str(second / "shardbench" / "trainer" / "config.py"), where.stderr


def test_the_wheel_holds_the_packages_and_their_data(tmp_path):
    tree = copy_checkout(tmp_path / "tree")  # built from a copy: a build writes build/ and egg-info
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "dist").glob("shardbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ("shardbench/__init__.py", "shardbench/trainer/config.py", "shardbench/trainer/plan/trace.py",
                 "shardbench/suite/cli/commands.py", "shardbench/suite/backends/kube/helm.py", "shardbench/tui/app/main.py",
                 "shardbench/trainer/ds_configs/zero3.json", "shardbench/trainer/schema/result.schema.json",
                 "shardbench/suite/matrices/default.yaml", "shardbench/tui/app/app.tcss"):
        assert path in names, path
    assert not any(n.startswith(("trainer/", "suite/", "tui/", "tests/")) for n in names)
