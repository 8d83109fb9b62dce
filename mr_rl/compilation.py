"""What a run compiles: named programs, a log of every compile, jax's persistent compilation
cache, and the set of programs the settings predict.

Every device program of the trainer is jitted through `program(name, fn)`, so XLA's compile of
it carries that name (`PROGRAMS`), and the first trace of each new input shape is recorded.
`CompileLog` (one per process, `compile_log()`) listens to jax's monitoring events and keeps one
`Compiled` record per compile: the program, its input shapes, the seconds spent and whether the
executable came from the persistent cache. The trainer logs each record as it happens and
reports `compile/seconds`, `compile/programs` and `compile/cache_hits` per step.

`enable_cache` turns on jax's persistent compilation cache (every executable, however quick to
compile, is written), so a restarted or resumed run, or a second run of the same shapes, loads
its programs instead of compiling them. `mr_rl.program_plan.expected_programs(settings)` bounds
how many programs of each name a run compiles. Design: docs/accelerators.md,
"Compile model"; figures: docs/benchmarks.md, "Layer scan on XLA:CPU".
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
from typing import Callable

import jax

_LOG = logging.getLogger(__name__)

# The trainer's device programs, by the name `program` gives them.
PROGRAMS = ("sampler", "engine_init", "engine_prefill", "engine_step", "engine_gather",
            "engine_shrink", "engine_append", "policy_step", "ppo_step", "logprob_forward", "value_forward",
            "signal", "lora_merge", "finite_check")
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"


def default_cache_dir() -> str:
  """$MR_RL_CACHE/xla (default ~/.cache/mr_rl/xla): one cache for every run of this user."""
  root = os.environ.get("MR_RL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                       "mr_rl")
  return os.path.join(root, "xla")


def enable_cache(directory: str) -> str:
  """Turns on jax's persistent compilation cache in `directory` (created) for this process and
  caches every executable. Returns the directory. A process uses one cache directory: asking
  for another once compiles have used the first is an error naming both."""
  directory = os.path.abspath(os.path.expanduser(directory))
  current = jax.config.jax_compilation_cache_dir
  if current and os.path.abspath(current) != directory:
    from jax._src import compilation_cache as cc  # the cache is set once per process
    if cc.is_initialized():
      raise ValueError(f"this process already caches compiled programs in {current}; "
                       f"config.compile.cache_dir={directory!r} needs a new process")
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return directory


# ---------------------------------------------------------------------------- named programs
_TRACING = threading.local()


def _shapes(args, kwargs) -> str:
  """The shapes that tell two compiles of a program apart: its integer arrays of rank >= 2
  (token and mask batches, prompts), else its last array argument."""
  leaves = [x for x in jax.tree.leaves((args, kwargs)) if hasattr(x, "shape")]
  ints = [x for x in leaves if len(x.shape) >= 2 and jax.numpy.issubdtype(x.dtype, jax.numpy.integer)]
  picked = ints or leaves[-1:]
  return ",".join(dict.fromkeys("x".join(map(str, x.shape)) for x in picked))


def program(name: str, fn: Callable) -> Callable:
  """`fn` under the program name `name` (one of `PROGRAMS`): pass the result to `jax.jit`.
  Its compiles are logged under that name, with the input shapes of the trace that caused
  them."""
  if name not in PROGRAMS:
    raise ValueError(f"unknown program name {name!r}; add it to compilation.PROGRAMS")

  @functools.wraps(fn)
  def traced(*args, **kwargs):
    _TRACING.shapes = (name, _shapes(args, kwargs))
    return fn(*args, **kwargs)

  traced.__name__ = traced.__qualname__ = name
  return traced


@dataclasses.dataclass(frozen=True)
class Compiled:
  """One compile: program name, its input shapes (the largest arrays), seconds, and whether
  the executable came from the persistent cache."""
  name: str
  shapes: str
  seconds: float
  cached: bool

  def line(self) -> str:
    how = "loaded from the compilation cache" if self.cached else "compiled"
    return f"program {self.name} [{self.shapes}] {how} in {self.seconds:.2f} s"


class CompileLog:
  """The compiles of the named programs in this process (jax monitoring listeners)."""

  def __init__(self):
    self.records: list[Compiled] = []
    self._lock = threading.Lock()
    self._hit = threading.local()
    jax.monitoring.register_event_listener(self._on_event)
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)

  def _on_event(self, event: str, **kwargs) -> None:
    if event == _CACHE_HIT:
      self._hit.value = True

  def _on_duration(self, event: str, seconds: float, **kwargs) -> None:
    if event != _BACKEND_COMPILE:
      return
    fun = str(kwargs.get("fun_name", ""))
    name = fun[4:-1] if fun.startswith("jit(") and fun.endswith(")") else fun
    hit = getattr(self._hit, "value", False)
    self._hit.value = False
    if name not in PROGRAMS:
      return
    traced = getattr(_TRACING, "shapes", None)
    shapes = traced[1] if traced and traced[0] == name else ""
    with self._lock:
      self.records.append(Compiled(name, shapes, float(seconds), bool(hit)))

  def since(self, start: int) -> list[Compiled]:
    """The records after the first `start` ones."""
    with self._lock:
      return list(self.records[start:])

  def __len__(self) -> int:
    return len(self.records)


@functools.lru_cache(maxsize=1)
def compile_log() -> CompileLog:
  """The process's `CompileLog` (listeners installed on first use)."""
  return CompileLog()


def metrics(records: list[Compiled], total: int) -> dict[str, float]:
  """`compile/*` metrics of one step: its compile seconds and cache hits, and the number of
  program compiles in the run so far."""
  return {"compile/seconds": float(sum(r.seconds for r in records)),
          "compile/cache_hits": float(sum(r.cached for r in records)),
          "compile/programs": float(total)}


class StepCompiles:
  """A run's compiles, step by step: `take(log)` logs the programs compiled (or loaded from
  the cache) since its last call and gives their `compile/*` metrics, `compile/programs`
  counting from the counter's creation."""

  def __init__(self):
    self._log = compile_log()
    self._first = self._seen = len(self._log)

  def take(self, log: Callable[[str], None] | None) -> dict[str, float]:
    new = self._log.since(self._seen)
    self._seen += len(new)
    log_compiles(new, log)
    return metrics(new, self._seen - self._first)


def counts(records: list[Compiled]) -> dict[str, int]:
  """{program name: compiles} of some records."""
  out: dict[str, int] = {}
  for r in records:
    out[r.name] = out.get(r.name, 0) + 1
  return out


def log_compiles(records: list[Compiled], log: Callable[[str], None] | None) -> None:
  """One line per compile record."""
  if log is None:
    return
  for r in records:
    log(r.line())


__all__ = ("PROGRAMS", "program", "Compiled", "CompileLog", "compile_log", "enable_cache",
           "default_cache_dir", "metrics", "counts", "log_compiles")
