#!/usr/bin/env bash
# Per-worker set-up and launch on one TPU VM worker (pod.sh runs this on every worker).
#
#   launch/run_tpu.sh CONFIG WORKDIR [extra mr_rl.main flags, e.g. --config.total_steps=10]
#
# CONFIG is configs/<file>.py[:key=value,...]; WORKDIR must be shared by all workers
# (gs://bucket/path or a shared file system): orbax writes one checkpoint for the whole pod.
# Environment (all optional):
#   MR_RL_VENV       virtual environment directory           (default ~/mr_rl_venv)
#   MR_RL_JAX_SPEC   pip spec of jax for TPU                  (default "jax[tpu]")
#   MR_RL_PIP_EXTRA  extra pip arguments (e.g. -f <libtpu wheel index>)
#   HF_HOME          Hugging Face cache (model and data downloads, per worker)
#   MR_RL_CACHE      mr_rl cache (tiny runlocal assets)
#   MR_RL_SKIP_INSTALL=1  reuse the venv as it is (faster restarts)
# The process id goes to ~/mr_rl_run.pid so pod.sh can stop this worker's run precisely.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"

mr_rl_args "$@"
# shellcheck disable=SC2086
mr_rl_setup "$HOME/mr_rl_venv" ${MR_RL_PIP_EXTRA:-} "${MR_RL_JAX_SPEC:-jax[tpu]}"
# Larger host<->device staging buffer: every step moves the rollout batch to the host (rewards).
export TPU_PREMAPPED_BUFFER_SIZE=${TPU_PREMAPPED_BUFFER_SIZE:-4294967296}

echo "[run_tpu] $(hostname) worker=${TPU_WORKER_ID:-?} config=$CONFIG workdir=$WORKDIR" >&2
# Status 75 = preempted (SIGTERM): with_restarts.sh runs the command again, which resumes.
launch/with_restarts.sh python -m mr_rl.main --multihost --config="$CONFIG" \
    --workdir="$WORKDIR" ${MAIN_FLAGS[@]+"${MAIN_FLAGS[@]}"} &
PID=$!
echo "$PID" > "$HOME/mr_rl_run.pid"
wait "$PID"
