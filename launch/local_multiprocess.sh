#!/usr/bin/env bash
# N processes of one multi-process mr_rl job on this machine, each with its own fake CPU
# devices, over localhost (gloo collectives): how a pod runs, for debugging on a laptop or CI.
#
#   launch/local_multiprocess.sh N DEVICES_PER_PROCESS CONFIG WORKDIR [extra mr_rl.main flags]
#   launch/local_multiprocess.sh 2 4 configs/demo.py:smoke /tmp/mp_demo --config.pipeline=train
#
# Process i runs `python -m mr_rl.main --multihost --coordinator_address=127.0.0.1:PORT
# --num_processes=N --process_id=i` with XLA_FLAGS=--xla_force_host_platform_device_count=D
# and JAX_PLATFORMS=cpu; its output goes to WORKDIR/logs/process-<i>.log. The script waits
# for all of them and exits with the first non-zero status (a failed process stops the
# others within mr_rl.distributed.HEARTBEAT_TIMEOUT_S). PORT: $MR_RL_PORT or a free one.
set -euo pipefail

if [ "$#" -lt 4 ]; then
  echo "usage: $0 N DEVICES_PER_PROCESS CONFIG WORKDIR [extra mr_rl.main flags]" >&2
  exit 2
fi
N=$1
DEVICES=$2
CONFIG=$3
WORKDIR=$4
shift 4
cd "$(dirname "$0")/.."
PORT=${MR_RL_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
mkdir -p "$WORKDIR/logs"
pids=()
for ((i = 0; i < N; i++)); do
  XLA_FLAGS="--xla_force_host_platform_device_count=$DEVICES" JAX_PLATFORMS=cpu \
    python -m mr_rl.main --config="$CONFIG" --workdir="$WORKDIR" --multihost \
      --coordinator_address="127.0.0.1:$PORT" --num_processes="$N" --process_id="$i" "$@" \
      >"$WORKDIR/logs/process-$i.log" 2>&1 &
  pids+=($!)
done
echo "[local_multiprocess] $N processes x $DEVICES devices on 127.0.0.1:$PORT; logs in $WORKDIR/logs" >&2
status=0
for pid in "${pids[@]}"; do
  if ! wait "$pid"; then
    rc=$?
    [ "$status" -eq 0 ] && status=$rc
  fi
done
exit "$status"
