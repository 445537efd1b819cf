"""`benchtui` entry point: parse the command line (cheaply: --help must not import Textual)."""
from __future__ import annotations

import argparse
import sys

from shardbench.trainer.contract import BACKENDS
from shardbench.suite.backends import add_cluster_flags, cluster_options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchtui",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Pick a DDP/FSDP/ZeRO benchmark matrix, run it on this machine or on a Kubernetes\n"
                    "cluster (one Helm release per run), tail the logs live and compare the results.",
        epilog="""\
screens and keys (F1 in the app lists them all):
  F2 Matrix   the runs to make: ctrl+r run, ctrl+f re-measure (asks first), ctrl+l plan, ctrl+s/ctrl+o save/load
  F3 Runs     state, tok/s, loss, time, ETA and why a run failed; c cancel one, x cancel all
  F4 Logs     the selected run's log: / search, e last error, f follow, [ ] other run
  F5 Results  mean [95% interval] per configuration, verdicts, plots; w writes the report
  q quits (asks while runs are in progress; enter stops them)

examples:
  benchtui                                  the default matrix, runs into results/benchtui
  benchtui --matrix my.yaml                 runs into my.yaml's results dir (or results/benchtui-my)
  benchtui --results results/default        make bench's results, on the Results screen
  benchtui --backend kubernetes --namespace bench   one Helm release per run on the cluster""")
    parser.add_argument("--results", metavar="DIR",
                        help="open this result set on the Results screen at once (default: the matrix's results "
                             "directory). Runs started in the app go to the Matrix screen's Results dir field")
    parser.add_argument("--matrix", metavar="FILE",
                        help="matrix YAML file to start from (default: suite/matrices/default.yaml); its runs go "
                             "to the file's results directory, or results/benchtui-<file name> when that is "
                             "make bench's results/default")
    parser.add_argument("--backend", choices=BACKENDS, help="backend to preselect (overrides the matrix file's)")
    parser.add_argument("--ray-cluster", action="store_true", default=None,
                        help="backend ray as KubeRay RayJobs on the cluster (the matrix's ray_cluster: true)")
    add_cluster_flags(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from shardbench.suite.matrix.expand import DEFAULT_MATRIX, load_matrix

    try:
        matrix = load_matrix(args.matrix or DEFAULT_MATRIX)
    except ValueError as exc:
        print(f"benchtui: {exc}", file=sys.stderr)
        return 2
    if args.backend:
        matrix.backend = args.backend
    if args.ray_cluster:
        matrix.ray_cluster = True
    from shardbench.tui.app.app import BenchApp
    from shardbench.tui.app.matrix_plan import benchtui_results

    # results/default is `make bench`'s: benchtui's runs must not change its report
    matrix.results = benchtui_results(matrix.results, args.matrix)
    try:
        cluster = cluster_options(args)
    except ValueError as exc:
        print(f"benchtui: {exc}", file=sys.stderr)
        return 2
    app = BenchApp(matrix=matrix, matrix_path=args.matrix, cluster=cluster, results_dir=args.results,
                   show_results=bool(args.results))
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
