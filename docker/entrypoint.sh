#!/usr/bin/env bash
# Image entrypoint. On an MPIJob's launcher (the MPI Operator sets K_MPI_JOB_ROLE=launcher) it
# first waits until every host of the hostfile resolves: a worker is Ready before its DNS record
# of the job's headless Service may exist, and ssh does not retry a name that does not resolve.
# Then it runs the command it was given (the launch command the chart renders), as PID 1.
set -euo pipefail

hostfile=${SHARDBENCH_HOSTFILE:-/etc/mpi/hostfile}
wait_s=${SHARDBENCH_DNS_WAIT_S:-120}

if [ "${K_MPI_JOB_ROLE:-}" = "launcher" ] && [ -f "$hostfile" ]; then
  deadline=$((SECONDS + wait_s))
  # "host slots=N" lines; comments and blank lines skipped.
  for host in $(sed -e 's/#.*//' "$hostfile" | awk 'NF {print $1}'); do
    until getent hosts "$host" >/dev/null; do
      if [ "$SECONDS" -ge "$deadline" ]; then
        echo "shardbench-entrypoint: $host (from $hostfile) did not resolve within ${wait_s}s" >&2
        exit 1
      fi
      sleep 2
    done
  done
fi

exec "$@"
