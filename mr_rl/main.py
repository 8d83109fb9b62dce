r"""Entry point: parse flags, hand the config to the pipeline. Nothing else lives here.

    python -m mr_rl.main --config=configs/demo.py --workdir=/tmp/mr_rl_demo
    python -m mr_rl.main --config=configs/amrp_math.py:model=qwen3_4b,method=amrp \
        --workdir=gs://bucket/run --config.total_steps=500
    python -m mr_rl.main --config=configs/amrp_math.py --dry_run   # settings + compute estimate

Pipelines (`config.pipeline`): 'train' (one run), 'tag' (probe every channel, elect the
anchor by per-token reverse KL, then train TAG from pi_0), 'demo' (the CPU comparison).
`--multihost` runs one process of a multi-process job over one global mesh
(`mr_rl.distributed`; `launch/local_multiprocess.sh N ...` starts N on one machine).
`--dry_run` prints the resolved settings and the compute estimate of the run
(`mr_rl.config_lib.dry_run`) without loading weights or data; it needs no `--workdir`.
"""

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (path[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (metrics, checkpoints).")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "Run as one process of a multi-process job (mr_rl.distributed): jax "
    "detects the cluster (Cloud TPU, SLURM, ...) unless --coordinator_address, --num_processes "
    "and --process_id (or MR_RL_COORDINATOR_ADDRESS / MR_RL_NUM_PROCESSES / MR_RL_PROCESS_ID) "
    "describe it.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0's coordinator (with --multihost).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None,
                                      "Number of processes (with --multihost).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None,
                                   "This process's index, 0..num_processes-1 (with --multihost).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the resolved settings and the compute "
                             "estimate, then exit (no weights are loaded; no --workdir needed).")
flags.mark_flags_as_required(["config"])
flags.register_validator("workdir", lambda v: v is not None or _DRY_RUN.value,
                         message="--workdir is required (except with --dry_run)")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _DRY_RUN.value:
    from mr_rl.config_lib.dry_run import dry_run
    print(dry_run(_CONFIG.value))
    return
  manual = (_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  if any(v is not None for v in manual) and not _MULTIHOST.value:
    raise app.UsageError("--coordinator_address / --num_processes / --process_id need --multihost")
  if _MULTIHOST.value:  # before anything touches a device
    from mr_rl import distributed
    distributed.initialize(*manual)
  from mr_rl import pipelines
  pipelines.run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
