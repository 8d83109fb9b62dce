r"""Entry point: parse flags, hand the config to the pipeline. Nothing else lives here.

    python -m mr_rl.main --config=configs/demo.py --workdir=/tmp/mr_rl_demo
    python -m mr_rl.main --config=configs/amrp_math.py:model=qwen3_4b,method=amrp \
        --workdir=gs://bucket/run --config.total_steps=500
    python -m mr_rl.main --config=configs/amrp_math.py --dry_run   # settings + compute estimate

Pipelines (`config.pipeline`): 'train' (one run), 'tag' (probe every channel, elect the
anchor by per-token reverse KL, then train TAG from pi_0), 'demo' (the CPU comparison).
`--multihost` runs one process of a multi-process job over one global mesh
(`mr_rl.distributed`; `python launch/local_multiprocess.py N ...` starts N on one machine).
On SIGTERM a run saves a checkpoint at the next step boundary and exits with status 75
(`mr_rl.train.PREEMPTED_EXIT_CODE`); running the same command again resumes it.
`--dry_run` prints the resolved settings and the compute estimate of the run
(`mr_rl.config_lib.dry_run`) without loading weights or data; it needs no `--workdir`.
"""

import logging
import sys

from absl import app, flags
from absl import logging as absl_logging
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
_BREAK_LOCK = flags.DEFINE_bool(
    "break_lock", False, "Take over the workdir's lock (WORKDIR/run.lock) left by a run that is "
    "gone; a run still alive then shares the workdir with this one (mr_rl.workdir).")
_TERM_TIMEOUT = flags.DEFINE_float(
    "term_timeout_s", 120.0, "After SIGTERM, exit within this many seconds even if the run "
    "cannot reach a step boundary (a peer process stuck or gone); the last finished "
    "checkpoint is kept. 0 = wait for the step boundary however long.")
_STALL_TIMEOUT = flags.DEFINE_float(
    "stall_timeout_s", 0.0, "Exit (status 1) when no training step finishes for this many "
    "seconds, e.g. a hung peer of a multi-process run; set it above the first step's compile "
    "time. 0 = off.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the resolved settings and the compute "
                             "estimate, then exit (no weights are loaded; no --workdir needed).")
flags.mark_flags_as_required(["config"])
flags.register_validator("workdir", lambda v: v is not None or _DRY_RUN.value,
                         message="--workdir is required (except with --dry_run)")


def _config_overrides(argv) -> tuple[str | None, list[str]]:
  """The `--config` file argument and the dotted paths of the `--config.<path>` overrides."""
  config_arg, paths = None, []
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      config_arg = a.split("=", 1)[1]
    elif a == "--config" and i + 1 < len(argv):
      config_arg = argv[i + 1]
    elif a.startswith("--config."):
      paths.append(a[len("--config."):].split("=", 1)[0])
  return config_arg, paths


_HELP = ("--help", "-h", "--helpshort", "-?")


def config_fields(config, prefix: str = "", helps: dict | None = None) -> list[str]:
  """`--config.<path>=<value>` for every field of a ConfigDict (sections flattened), each
  followed by its declared help line where `helps` has one."""
  lines, helps = [], {} if helps is None else helps
  for k in sorted(config.keys()):
    v, path = config[k], f"{prefix}{k}"
    section = hasattr(v, "keys") and not isinstance(v, dict)
    if section and len(v):
      if helps.get(path):
        lines.append(f"  config.{path}: {helps[path]}")
      lines += config_fields(v, path + ".", helps)
    else:
      lines.append(f"  --config.{path}={v.to_dict() if section else v!r}")
      if helps.get(path):
        lines.append(f"      {helps[path]}")
  return lines


def _print_help(argv) -> None:
  """The flags, and with --config the config's fields and their values."""
  print(__doc__)
  for module in flags.FLAGS.flags_by_module_dict():  # (this module's, under any name)
    if not module.startswith("absl."):
      print(flags.FLAGS.module_help(module))
  print("(--helpfull: absl's flags too, e.g. --verbosity)")
  config_arg, _ = _config_overrides(argv)
  if config_arg is None:
    print("\nGive --config=FILE[:ARG] with --help to list that config's fields.")
    return
  from ml_collections.config_flags import config_flags as config_file
  config = config_file.ConfigFileFlagParser(name="config").parse(config_arg)
  print(f"\nFields of --config={config_arg} (override any with --config.<field>=<value>; "
        f"--dry_run prints the settings they resolve to):")
  from mr_rl import settings
  print("\n".join(config_fields(config, helps=settings.field_help())))


def _renamed_overrides(argv) -> list[str]:
  """`argv` with each `--config.<path>` override under a deprecated config name
  (`mr_rl.settings.ALIASES`) given its name now, and a one-line warning for it."""
  if not any(a.startswith("--config.") for a in argv):
    return argv
  from mr_rl import settings
  out = []
  for a in argv:
    path, eq, value = a[len("--config."):].partition("=") if a.startswith("--config.") else \
        ("", "", "")
    new = settings.resolve_alias(path) if path else None
    if new:
      print(f"WARNING --{settings.deprecation(path, new)}", file=sys.stderr)
      a = f"--config.{new}{eq}{value}"
    out.append(a)
  return out


def parse_flags(argv):
  """absl's flag parsing, where a `--config.<path>` override naming no field of the config
  (ml_collections raises a bare AttributeError / KeyError for it) fails naming the field and
  the valid fields of its section. `--help` lists the config's fields too and exits 0."""
  if any(a in _HELP for a in argv[1:]):
    _print_help(argv)
    sys.exit(0)
  renamed = _renamed_overrides(argv)
  if argv == sys.argv:  # ml_collections reads the overrides from sys.argv itself
    sys.argv[:] = renamed
  argv = renamed
  try:
    return app.parse_flags_with_usage(argv)
  except (AttributeError, KeyError):
    config_arg, paths = _config_overrides(argv)
    if config_arg is None:
      raise
    from ml_collections.config_flags import config_flags as config_file
    from mr_rl import settings
    config = config_file.ConfigFileFlagParser(name="config").parse(config_arg)
    for path in paths:
      try:
        settings.check_field_path(config, path)
      except ValueError as e:
        print(f"FATAL Flags parsing error: --{e}", file=sys.stderr)
        sys.exit(1)
    raise


def _quiet_third_party() -> None:
  """Third-party INFO logging (orbax, jax) off unless --verbosity is given; mr_rl's own
  loggers keep INFO (the run's progress lines are printed, not logged)."""
  if flags.FLAGS["verbosity"].present:
    return
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger("mr_rl").setLevel(logging.INFO)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  _quiet_third_party()
  from mr_rl import errors
  try:
    _main()
  except errors.UserError as e:  # its message says what to fix; the stack would bury it
    if flags.FLAGS["verbosity"].present and flags.FLAGS.verbosity >= 1:
      raise
    print(f"FATAL {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    sys.exit(1)


def _main():
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
  from mr_rl import pipelines, preemption
  from mr_rl import train
  preemption.configure(_TERM_TIMEOUT.value, _STALL_TIMEOUT.value)
  try:
    pipelines.run(_CONFIG.value, _WORKDIR.value, break_lock=_BREAK_LOCK.value)
  except train.Preempted as e:  # checkpointed at a step boundary: the same command resumes
    print(f"preempted: {e}; exiting with status {train.PREEMPTED_EXIT_CODE}", flush=True)
    sys.exit(train.PREEMPTED_EXIT_CODE)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
