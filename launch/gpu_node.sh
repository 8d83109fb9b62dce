#!/usr/bin/env bash
# Run one paper config on a single multi-GPU node (one process drives all local GPUs).
#
#   launch/gpu_node.sh CONFIG WORKDIR [extra mr_rl.main flags]
#   CUDA_VISIBLE_DEVICES=0,1,2,3 launch/gpu_node.sh configs/amrp_math.py:method=amrp /data/runs/x
#
# The config's mesh uses every visible GPU (its fsdp axis is -1); check the memory first with
#   python launch/check.py --config=CONFIG --devices=<number of GPUs> --chip=h100
# Environment: MR_RL_VENV (default ~/mr_rl_venv_gpu), MR_RL_JAX_SPEC (default "jax[cuda12]"),
# MR_RL_SKIP_INSTALL=1 (reuse the venv), HF_HOME, MR_RL_CACHE. The log goes to WORKDIR/run.log
# when WORKDIR is a local path (and to stdout).
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"

mr_rl_args "$@"
mr_rl_setup "$HOME/mr_rl_venv_gpu" "${MR_RL_JAX_SPEC:-jax[cuda12]}"
# Let XLA take most of each GPU (the KV cache of the rollout batch is large).
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}

LOG=/dev/null
case "$WORKDIR" in
  gs://*) ;;
  *) mkdir -p "$WORKDIR"; LOG="$WORKDIR/run.log" ;;
esac
echo "[gpu_node] $(hostname) gpus=${CUDA_VISIBLE_DEVICES:-all} config=$CONFIG workdir=$WORKDIR" >&2
# Status 75 = preempted (SIGTERM, e.g. a Kubernetes eviction): with_restarts.sh runs the
# command again, which resumes from the checkpoint it saved.
launch/with_restarts.sh python -m mr_rl.main --config="$CONFIG" --workdir="$WORKDIR" \
    ${MAIN_FLAGS[@]+"${MAIN_FLAGS[@]}"} 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
