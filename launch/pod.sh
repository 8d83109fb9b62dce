#!/usr/bin/env bash
# Launch one paper config on every worker of a TPU pod slice; one log per worker.
#
#   launch/pod.sh TPU_NAME ZONE CONFIG WORKDIR [extra mr_rl.main flags]
#   launch/pod.sh my-v5p-8 us-east5-a configs/tag_math.py:model=qwen3_4b,method=tag \
#       gs://my-bucket/mr_rl/tag_math/qwen3_4b-tag
#
# Steps: (1) pack the checkout (git-tracked files plus uncommitted changes) and copy it to
# every worker with `gcloud compute tpus tpu-vm scp --worker=all`; (2) start
# launch/run_tpu.sh on each worker with its own `gcloud compute tpus tpu-vm ssh --worker=i`,
# streaming into $LOGDIR/worker-<i>.log; (3) wait, and at the first worker that fails stop the
# runs on all workers (by the pid each run_tpu.sh recorded) and exit with its status.
# Environment: GCP_PROJECT (optional --project), LOGDIR (default logs/<time>-<tpu>),
# MR_RL_REMOTE_DIR (checkout on the workers, default mr_rl), and run_tpu.sh's variables,
# which are forwarded (MR_RL_VENV, MR_RL_JAX_SPEC, MR_RL_PIP_EXTRA, MR_RL_SKIP_INSTALL, HF_HOME).
# What each host runs: the same command, `python -m mr_rl.main --multihost --config=CONFIG
# --workdir=WORKDIR`, one process per host; jax finds the slice's coordinator and process
# index itself (Cloud TPU metadata), and the processes run one SPMD program over one global
# mesh (mr_rl/distributed.py): each samples and scores the rows on its own chips, rewards and
# counters are gathered so every host takes the same decisions, process 0 writes metrics,
# eval.json and the export, and all write the orbax checkpoints to the shared WORKDIR.
# To try the same on one machine: python launch/local_multiprocess.py N DEVICES CONFIG WORKDIR.
# Before booking a slice, check memory with launch/check.py (see configs/README.md).
set -euo pipefail

if ((BASH_VERSINFO[0] < 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] < 1))); then
  echo "$0 needs bash >= 5.1 (wait -n -p)" >&2
  exit 2
fi
if [ "$#" -lt 4 ]; then
  echo "usage: $0 TPU_NAME ZONE CONFIG WORKDIR [extra mr_rl.main flags]" >&2
  exit 2
fi
TPU=$1
ZONE=$2
CONFIG=$3
WORKDIR=$4
shift 4
EXTRA=("$@")

REPO=$(cd "$(dirname "$0")/.." && pwd)
REMOTE_DIR=${MR_RL_REMOTE_DIR:-mr_rl}
LOGDIR=${LOGDIR:-$REPO/logs/$(date +%Y%m%d-%H%M%S)-$TPU}
PROJECT_FLAG=()
if [ -n "${GCP_PROJECT:-}" ]; then
  PROJECT_FLAG=(--project "$GCP_PROJECT")
fi
GC=(gcloud compute tpus tpu-vm)
mkdir -p "$LOGDIR"

# Number of workers = number of network endpoints of the slice.
NUM_WORKERS=$("${GC[@]}" describe "$TPU" --zone "$ZONE" "${PROJECT_FLAG[@]}" --format=json \
  | python3 -c 'import json, sys; print(len(json.load(sys.stdin).get("networkEndpoints", [])))')
if [ "$NUM_WORKERS" -lt 1 ]; then
  echo "[pod] could not read the workers of $TPU in $ZONE" >&2
  exit 1
fi
echo "[pod] $TPU: $NUM_WORKERS worker(s); logs in $LOGDIR" >&2

# (1) Ship the checkout.
TARBALL=$(mktemp /tmp/mr_rl-XXXXXX.tgz)
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
  | tar --null -czf "$TARBALL" -T -)
"${GC[@]}" scp "$TARBALL" "$TPU:~/mr_rl.tgz" --zone "$ZONE" --worker=all "${PROJECT_FLAG[@]}"
"${GC[@]}" ssh "$TPU" --zone "$ZONE" --worker=all "${PROJECT_FLAG[@]}" --command \
  "rm -rf ~/$REMOTE_DIR && mkdir -p ~/$REMOTE_DIR && tar -xzf ~/mr_rl.tgz -C ~/$REMOTE_DIR"
rm -f "$TARBALL"

# (2) Start every worker.
FORWARD=""
for v in MR_RL_VENV MR_RL_JAX_SPEC MR_RL_PIP_EXTRA MR_RL_SKIP_INSTALL HF_HOME MR_RL_CACHE; do
  if [ -n "${!v:-}" ]; then
    FORWARD+="$v=$(printf '%q' "${!v}") "
  fi
done
REMOTE_CMD="cd ~/$REMOTE_DIR && env $FORWARD bash launch/run_tpu.sh $(printf '%q ' "$CONFIG" "$WORKDIR" "${EXTRA[@]}")"
declare -A PIDS=()
for ((i = 0; i < NUM_WORKERS; i++)); do
  "${GC[@]}" ssh "$TPU" --zone "$ZONE" --worker="$i" "${PROJECT_FLAG[@]}" --command "$REMOTE_CMD" \
    > "$LOGDIR/worker-$i.log" 2>&1 &
  PIDS[$!]=$i
done

stop_all() {
  "${GC[@]}" ssh "$TPU" --zone "$ZONE" --worker=all "${PROJECT_FLAG[@]}" --command \
    'if [ -f ~/mr_rl_run.pid ]; then kill "$(cat ~/mr_rl_run.pid)" 2>/dev/null || true; fi' \
    > "$LOGDIR/stop.log" 2>&1 || true
  for pid in "${!PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}
trap 'echo "[pod] interrupted; stopping all workers" >&2; stop_all; exit 130' INT TERM

# (3) Wait; the first failure stops everything.
REMAINING=$NUM_WORKERS
while [ "$REMAINING" -gt 0 ]; do
  set +e
  wait -n -p DONE_PID "${!PIDS[@]}"
  STATUS=$?
  set -e
  WORKER=${PIDS[$DONE_PID]}
  unset "PIDS[$DONE_PID]"
  REMAINING=$((REMAINING - 1))
  if [ "$STATUS" -ne 0 ]; then
    echo "[pod] worker $WORKER failed (exit $STATUS); see $LOGDIR/worker-$WORKER.log" >&2
    tail -n 20 "$LOGDIR/worker-$WORKER.log" >&2 || true
    stop_all
    exit "$STATUS"
  fi
  echo "[pod] worker $WORKER finished" >&2
done
echo "[pod] all $NUM_WORKERS workers finished; logs in $LOGDIR" >&2
