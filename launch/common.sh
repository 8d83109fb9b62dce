# Sourced (not run) by launch/gpu_node.sh and launch/run_tpu.sh: what both do on one host before
# they start mr_rl.main. Functions only; sourcing it runs nothing.

# mr_rl_args "$@": CONFIG and WORKDIR from the script's first two arguments, MAIN_FLAGS (an
# array) from the rest (extra mr_rl.main flags); exits 2 with the usage line when fewer than two.
# Pass them on as ${MAIN_FLAGS[@]+"${MAIN_FLAGS[@]}"}: bash < 4.4 calls an empty array unbound
# under `set -u`.
mr_rl_args() {
  if [ "$#" -lt 2 ]; then
    echo "usage: $0 CONFIG WORKDIR [extra mr_rl.main flags]" >&2
    exit 2
  fi
  CONFIG=$1
  WORKDIR=$2
  MAIN_FLAGS=("${@:3}")
}

# mr_rl_setup DEFAULT_VENV PIP_ARGS...: goes to the repository root; creates (if missing) and
# activates the virtual environment $MR_RL_VENV (default DEFAULT_VENV) and, unless
# MR_RL_SKIP_INSTALL=1, upgrades pip and installs PIP_ARGS (jax for the accelerator) and this
# checkout (-e .) into it; exports the environment of a run (unbuffered logs, caches under
# ~/.cache unless set).
mr_rl_setup() {
  cd "$(dirname "$0")/.."
  local venv=${MR_RL_VENV:-$1}
  shift
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  # shellcheck disable=SC1091
  source "$venv/bin/activate"
  if [ "${MR_RL_SKIP_INSTALL:-0}" != "1" ]; then
    python -m pip install --quiet --upgrade pip
    python -m pip install --quiet "$@" -e .
  fi
  export PYTHONUNBUFFERED=1
  export TOKENIZERS_PARALLELISM=false
  export HF_HOME=${HF_HOME:-$HOME/.cache/huggingface}
  export MR_RL_CACHE=${MR_RL_CACHE:-$HOME/.cache/mr_rl}
  # Persistent XLA compilation cache: restarts of the same config skip compilation.
  export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/jax_compilation}
}
