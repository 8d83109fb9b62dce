#!/usr/bin/env bash
# Runs a command, and runs it again each time it exits with status 75: an mr_rl run that got
# SIGTERM (a spot / preemptible VM, a Kubernetes eviction) saved a checkpoint at a step
# boundary and exited with 75 (mr_rl.train.PREEMPTED_EXIT_CODE); the same command resumes it.
#
#   launch/with_restarts.sh python -m mr_rl.main --config=... --workdir=...
#
# At most MR_RL_MAX_RESTARTS (default 20) restarts. A SIGTERM / SIGINT sent to this script is
# passed to the run, which then stops for good (no restart after it).
set -u
max=${MR_RL_MAX_RESTARTS:-20}
restarts=0
child=""
stopping=0
trap 'stopping=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
while true; do
  "$@" &
  child=$!
  wait "$child"
  status=$?
  while kill -0 "$child" 2>/dev/null; do  # `wait` returned for a trapped signal
    wait "$child"
    status=$?
  done
  if [ "$status" -ne 75 ] || [ "$stopping" -eq 1 ] || [ "$restarts" -ge "$max" ]; then
    exit "$status"
  fi
  restarts=$((restarts + 1))
  echo "[with_restarts] preempted (status 75): running it again ($restarts/$max)" >&2
done
