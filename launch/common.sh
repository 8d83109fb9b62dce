# Sourced (not run) by launch/gpu_node.sh and launch/run_tpu.sh: what both do on one host before
# they start mr_rl.main. Functions only; sourcing it runs nothing.

# mr_rl_check_args NARGS: exits 2 with the usage line unless CONFIG and WORKDIR were given.
mr_rl_check_args() {
  if [ "$1" -lt 2 ]; then
    echo "usage: $0 CONFIG WORKDIR [extra mr_rl.main flags]" >&2
    exit 2
  fi
}

# mr_rl_venv DEFAULT_VENV PIP_ARGS...: from the repository root, creates (if missing) and
# activates the virtual environment $MR_RL_VENV (default DEFAULT_VENV), then, unless
# MR_RL_SKIP_INSTALL=1, upgrades pip and installs PIP_ARGS (jax for the accelerator) and this
# checkout (-e .) into it.
mr_rl_venv() {
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
}

# mr_rl_export_env: the environment of a run (unbuffered logs, caches under ~/.cache unless set).
mr_rl_export_env() {
  export PYTHONUNBUFFERED=1
  export TOKENIZERS_PARALLELISM=false
  export HF_HOME=${HF_HOME:-$HOME/.cache/huggingface}
  export MR_RL_CACHE=${MR_RL_CACHE:-$HOME/.cache/mr_rl}
  # Persistent XLA compilation cache: restarts of the same config skip compilation.
  export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/jax_compilation}
}
