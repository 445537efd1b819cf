#!/usr/bin/env bash
# Image entrypoint. On an MPIJob's launcher (the MPI Operator sets K_MPI_JOB_ROLE=launcher) it
# first waits until every host of the hostfile answers ssh, then runs the command it was given
# (the launch command the chart renders) under trainer/launch_guard.py, which stops a launcher
# that outlives rank 0's record (OpenMPI 5's teardown hang). Elsewhere the command runs as PID 1.
#
# Why ssh and not only DNS: a worker is Ready before its DNS record of the job's headless Service
# may exist (ssh does not retry a name that does not resolve), and under Kueue the operator's
# WaitForWorkersReady check passes with 0 of 0 workers while the job is suspended
# (kubeflow/mpi-operator#868), so the launcher can start while the workers still pull a
# multi-GB image. SHARDBENCH_WORKER_WAIT_S (the chart's workerWaitSeconds, which the suite sets
# to its start timeout) bounds the wait; then the launcher fails with the host and ssh's reason.
set -euo pipefail

hostfile=${SHARDBENCH_HOSTFILE:-/etc/mpi/hostfile}
wait_s=${SHARDBENCH_WORKER_WAIT_S:-${SHARDBENCH_DNS_WAIT_S:-900}}

if [ "${K_MPI_JOB_ROLE:-}" = "launcher" ] && [ -f "$hostfile" ]; then
  deadline=$((SECONDS + wait_s))
  hosts=$(sed -e 's/#.*//' "$hostfile" | awk 'NF {print $1}')  # "host slots=N" lines
  waited=""
  for host in $hosts; do
    # BatchMode: a key problem fails at once instead of prompting; the port and host-key
    # settings come from the image's ssh_config.
    until getent hosts "$host" >/dev/null \
        && said=$(ssh -n -o BatchMode=yes -o ConnectTimeout=5 "$host" true 2>&1); do
      if [ "$SECONDS" -ge "$deadline" ]; then
        if ! getent hosts "$host" >/dev/null; then
          echo "shardbench-entrypoint: $host (from $hostfile) did not resolve within ${wait_s}s" >&2
        else
          echo "shardbench-entrypoint: $host (from $hostfile) did not answer ssh within ${wait_s}s: ${said:-no reason}" >&2
        fi
        exit 1
      fi
      if [ -z "$waited" ]; then
        echo "shardbench-entrypoint: waiting for $host to answer ssh (up to ${wait_s}s)" >&2
        waited=1
      fi
      said=""
      sleep 2
    done
  done
  echo "shardbench-entrypoint: every worker answers ssh ($(echo "$hosts" | wc -w) hosts, ${SECONDS}s)" >&2
  # The launch command starts now (exec keeps this process): the suite measures the launcher's
  # start-up from here to the last rank's own start stamp (suite/execute/startup.py, trainer/record.py).
  echo "SHARDBENCH_START {\"launcher\": $(date +%s.%N | cut -c1-14)}" >&2
fi

if [ "${K_MPI_JOB_ROLE:-}" = "launcher" ]; then
  # OpenMPI 5's mpirun can hang after every rank has exited (openpmix/prrte#1839): the guard
  # stops it once rank 0's record is out and the grace has passed (trainer/launch_guard.py).
  exec python -m shardbench.trainer.launch_guard "$@"
fi
exec "$@"
