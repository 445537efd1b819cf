"""`benchtui` entry point: parse the command line (cheaply: --help must not import Textual)."""
from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchtui",
        description="Pick a DDP/FSDP/ZeRO benchmark matrix, run it on this machine or on a Kubernetes "
                    "cluster (one Helm release per run), tail the logs live and compare the results.")
    parser.add_argument("--results", default="results", metavar="DIR",
                        help="results directory: results/<run-id>/result.json (default: results)")
    parser.add_argument("--matrix", metavar="FILE", help="matrix YAML file to start from")
    parser.add_argument("--backend", choices=("local", "kubernetes"),
                        help="backend to preselect (overrides the matrix file's)")
    parser.add_argument("--kubeconfig", help="kubeconfig for the cluster backend (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--namespace", help="namespace of the releases (default: the context's)")
    parser.add_argument("--keep-failed", action="store_true",
                        help="cluster backend: keep the Helm release of a failed run for inspection")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tui.suite.matrix import MatrixSpec, load_matrix

    matrix = MatrixSpec()
    if args.matrix:
        try:
            matrix = load_matrix(args.matrix)
        except (OSError, ValueError) as exc:
            print(f"benchtui: {exc}", file=sys.stderr)
            return 2
    if args.backend:
        matrix.backend = args.backend
    from tui.app.app import BenchApp
    from tui.app.backends import ClusterOptions

    app = BenchApp(results_dir=args.results, matrix=matrix, matrix_path=args.matrix,
                   cluster=ClusterOptions(args.kubeconfig, args.context, args.namespace, args.keep_failed))
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
