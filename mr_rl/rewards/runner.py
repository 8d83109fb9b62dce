"""Batch reward runner: r[B, G, K] from K named channels, failures score NaN.

Every reward is a host-side function ``fn(response, example, num_tokens) ->
float`` (METHODS.md section 7). The runner evaluates B*G*K calls concurrently
and never raises into the trainer because of a reward function: an exception,
a timeout or a crashed worker scores NaN and increments a per-channel error
count (``RewardRunner.error_counts``; per-call counts come back as metrics).

Two execution kinds:

* ``"thread"``: light rules (regexes, length thresholds) run directly on the
  runner's daemon threads. A call that overruns ``timeout_s`` scores NaN; the
  thread cannot be killed, so it is abandoned and replaced by a fresh one (its
  eventual result is dropped). Only use this kind for code that cannot hang.
* ``"process"``: heavy or untrusted work (sympy, math-verify) runs in a
  ``HardTimeoutPool``: a persistent ``ProcessPoolExecutor`` (forkserver
  context) whose workers are killed and replaced when a call overruns its
  wall-clock timeout. ``fn`` and its arguments must be picklable (a
  module-level function or a ``functools.partial`` of one).

The registry maps a name to a factory of ``RewardChannel``s, so a config can
pick channels by name and set their parameters:
``get_reward("brief", threshold=128)``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import queue
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from mr_rl.rewards import math as math_rewards
from mr_rl.rewards.pool import HardTimeoutPool, RewardTimeoutError, RewardWorkerError, shared_pool

__all__ = ["KINDS", "RewardChannel", "RewardRunner", "available_rewards", "get_reward",
           "register_reward", "HardTimeoutPool", "RewardTimeoutError", "RewardWorkerError",
           "shared_pool"]

KINDS = ("thread", "process")
_LOG = logging.getLogger(__name__)
RewardFn = Callable[[str, Mapping[str, Any], int], float]


# ----------------------------------------------------------------------------
# Registry.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RewardChannel:
  """One named reward channel.

  Attributes:
    name: channel name (a column k of r[B, G, K]).
    fn: ``fn(response, example, num_tokens) -> float``.
    kind: "thread" (light rule) or "process" (heavy / untrusted; picklable fn).
  """
  name: str
  fn: RewardFn
  kind: str = "thread"

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"name must be a non-empty str, got {self.name!r}")
    if not callable(self.fn):
      raise TypeError(f"fn of channel {self.name!r} must be callable, got {type(self.fn)}")
    if self.kind not in KINDS:
      raise ValueError(f"kind of channel {self.name!r} must be one of {KINDS}, got {self.kind!r}")


_REGISTRY: dict[str, Callable[..., RewardChannel]] = {}
# Other reward modules register their channels when imported; get_reward
# imports them on first lookup. A module that does not exist is skipped.
_PLUGIN_MODULES = ("mr_rl.rewards.code", "mr_rl.rewards.alce",
                   # added by the reward-model / code-channels helper: code_correct,
                   # code_fast, code_noop and the armorm_* reward-model channels.
                   "mr_rl.rewards.code_channels", "mr_rl.rewards.reward_model",
                   "mr_rl.rewards.overlong")
_plugins_loaded = False


def register_reward(name: str, factory: Callable[..., RewardChannel]) -> None:
  """Registers ``factory(**params) -> RewardChannel`` under ``name``."""
  if name in _REGISTRY:
    raise ValueError(f"reward {name!r} is already registered")
  _REGISTRY[name] = factory


def _load_plugins() -> None:
  global _plugins_loaded
  if _plugins_loaded:
    return
  _plugins_loaded = True
  for module in _PLUGIN_MODULES:
    try:
      importlib.import_module(module)
    except ModuleNotFoundError as e:
      if e.name != module:  # the module exists but one of its imports is missing
        raise


def available_rewards() -> list[str]:
  _load_plugins()
  return sorted(_REGISTRY)


def get_reward(name: str, **params: Any) -> RewardChannel:
  """Builds the registered channel ``name`` with ``params``.

  Raises:
    ValueError: unknown name (the message lists the valid ones).
  """
  _load_plugins()
  if name not in _REGISTRY:
    raise ValueError(f"unknown reward {name!r}; valid names: {sorted(_REGISTRY)}")
  return _REGISTRY[name](**params)


def _accuracy_channel(response, example, num_tokens, *, reference_key):
  del num_tokens
  if reference_key not in example:
    raise KeyError(f"example has no {reference_key!r} (keys: {sorted(example)})")
  return math_rewards.accuracy_in_process(response, example[reference_key])


def _format_channel(response, example, num_tokens):
  del example, num_tokens
  return math_rewards.format_reward(response)


def _length_channel(response, example, num_tokens, *, max_full, zero_at):
  del response, example
  return math_rewards.length_reward(num_tokens, max_full=max_full, zero_at=zero_at)


def _brief_channel(response, example, num_tokens, *, threshold):
  del response, example
  return math_rewards.brief(num_tokens, threshold)


def _negative_channel(response, example, num_tokens):
  del example, num_tokens
  return math_rewards.negative_in_process(response)


def _accuracy_factory(reference_key: str = "reference") -> RewardChannel:
  return RewardChannel(
      "accuracy", functools.partial(_accuracy_channel, reference_key=reference_key), "process")


def _length_factory(max_full: int = 2800, zero_at: int = 3000) -> RewardChannel:
  math_rewards.length_reward(0, max_full=max_full, zero_at=zero_at)  # validates
  return RewardChannel(
      "length", functools.partial(_length_channel, max_full=max_full, zero_at=zero_at))


def _brief_factory(threshold: int = 200) -> RewardChannel:
  math_rewards.brief(0, threshold)  # validates
  return RewardChannel("brief", functools.partial(_brief_channel, threshold=threshold))


# Built-in channels (METHODS.md section 7):
#   accuracy(reference_key="reference")  process  math-verify vs example[reference_key]
#   format()                             thread   AMRP <reasoning>/<answer> format
#   length(max_full=2800, zero_at=3000)  thread   AMRP soft length rule on num_tokens
#   brief(threshold=200)                 thread   TAG: num_tokens < threshold
#   negative()                           process  TAG: final answer is a number < 0
register_reward("accuracy", _accuracy_factory)
register_reward("format", lambda: RewardChannel("format", _format_channel))
register_reward("length", _length_factory)
register_reward("brief", _brief_factory)
register_reward("negative", lambda: RewardChannel("negative", _negative_channel, "process"))


# ----------------------------------------------------------------------------
# Runner.
# ----------------------------------------------------------------------------


class _Call:
  """One reward evaluation, filled in by a worker thread."""

  __slots__ = ("channel", "args", "index", "t0", "done", "abandoned", "value", "error",
               "timed_out")

  def __init__(self, channel: RewardChannel, args: tuple[Any, ...], index: tuple[int, int, int]):
    self.channel, self.args, self.index = channel, args, index
    self.t0: float | None = None
    self.done = self.abandoned = self.timed_out = False
    self.value = float("nan")
    self.error: BaseException | None = None


class _ThreadWorkers:
  """Daemon threads that run ``_Call``s; a thread abandoned on timeout is replaced."""

  def __init__(self, num_threads: int, pool_getter: Callable[[], HardTimeoutPool],
               timeout_s: float):
    self._queue: queue.SimpleQueue[_Call] = queue.SimpleQueue()
    self._cond = threading.Condition()
    self._pool_getter = pool_getter
    self._timeout_s = timeout_s
    for _ in range(num_threads):
      self._spawn()

  def _spawn(self) -> None:
    threading.Thread(target=self._loop, daemon=True, name="reward-worker").start()

  def _loop(self) -> None:
    while True:
      call = self._queue.get()
      with self._cond:
        call.t0 = time.monotonic()
      try:
        if call.channel.kind == "process":
          value = self._pool_getter().call(call.channel.fn, *call.args, timeout_s=self._timeout_s)
        else:
          value = call.channel.fn(*call.args)
        value, error = float(value), None
      except BaseException as e:  # pylint: disable=broad-except
        value, error = float("nan"), e
      with self._cond:
        if call.abandoned:
          return  # a replacement thread already took over this slot
        call.value, call.error, call.done = value, error, True
        call.timed_out = isinstance(error, TimeoutError)
        self._cond.notify_all()

  def submit(self, call: _Call) -> None:
    self._queue.put(call)

  def wait(self, calls: Sequence[_Call]) -> None:
    """Blocks until every call is done or (thread kind) abandoned after its timeout."""
    pending = list(calls)
    with self._cond:
      while pending:
        now = time.monotonic()
        still = []
        for c in pending:
          if c.done:
            continue
          if c.channel.kind == "thread" and c.t0 is not None and now - c.t0 > self._timeout_s:
            c.abandoned = c.done = c.timed_out = True
            c.error = RewardTimeoutError(f"{c.channel.name} exceeded {self._timeout_s:g} s")
            self._spawn()
            continue
          still.append(c)
        pending = still
        if pending:
          self._cond.wait(timeout=0.05)


class RewardRunner:
  """Computes r[B, G, K] (float32) for a batch over K named channels.

  Usage::

    runner = RewardRunner(["accuracy", "format", get_reward("brief", threshold=128)])
    r_BGK, metrics = runner(responses_BG, examples_B, num_tokens_BG)

  Thread-safe: several threads may call the same runner at once.

  Args:
    channels: names (built with default parameters) or ``RewardChannel``s.
    timeout_s: wall-clock budget of one call (one response, one channel).
    num_threads: runner threads (they also wait on the process pool, so keep
      it >= the pool's workers).
    pool: process pool for "process" channels; default ``shared_pool()``.
  """

  def __init__(self, channels: Sequence[str | RewardChannel], timeout_s: float = 10.0,
               num_threads: int = 8, pool: HardTimeoutPool | None = None):
    if isinstance(channels, (str, RewardChannel)) or not channels:
      raise ValueError(f"channels must be a non-empty sequence, got {channels!r}")
    self.channels = tuple(c if isinstance(c, RewardChannel) else get_reward(c) for c in channels)
    names = [c.name for c in self.channels]
    if len(set(names)) != len(names):
      raise ValueError(f"channel names must be unique, got {names}")
    if not timeout_s or timeout_s <= 0:
      raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if not isinstance(num_threads, int) or num_threads < 1:
      raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
    self.names = tuple(names)
    self.timeout_s = float(timeout_s)
    self._pool = pool
    self._workers = _ThreadWorkers(num_threads, self._get_pool, self.timeout_s)
    self._lock = threading.Lock()
    self.error_counts = {n: 0 for n in self.names}    # cumulative failures (incl. timeouts)
    self.timeout_counts = {n: 0 for n in self.names}  # cumulative timeouts
    self.last_errors: dict[str, str] = {}             # channel -> repr of its latest failure

  def _get_pool(self) -> HardTimeoutPool:
    return self._pool if self._pool is not None else shared_pool()

  def __call__(self, responses_BG: Sequence[Sequence[str]], examples_B: Sequence[Mapping[str, Any]],
               num_tokens_BG: Any) -> tuple[np.ndarray, dict[str, float]]:
    """Scores every response on every channel.

    Args:
      responses_BG: B lists of G decoded responses.
      examples_B: one mapping per prompt (reference answer etc.).
      num_tokens_BG: [B, G] generated-token counts.

    Returns:
      r_BGK: float32 [B, G, K]; NaN where a call failed.
      metrics: per-call logging stats: ``rewards/<name>/errors``,
        ``rewards/<name>/timeouts``, ``rewards/<name>/mean`` (NaN-ignoring) and
        ``rewards/seconds``.
    """
    B = len(responses_BG)
    if B == 0:
      raise ValueError("responses_BG is empty")
    G = len(responses_BG[0])
    if any(len(row) != G for row in responses_BG) or G == 0:
      raise ValueError(f"responses_BG must be B lists of the same G >= 1 responses, "
                       f"got lengths {[len(row) for row in responses_BG]}")
    if len(examples_B) != B:
      raise ValueError(f"examples_B has {len(examples_B)} entries, expected B={B}")
    num_tokens_BG = np.asarray(num_tokens_BG)
    if num_tokens_BG.shape != (B, G) or not np.issubdtype(num_tokens_BG.dtype, np.integer):
      raise ValueError(f"num_tokens_BG must be an integer array of shape {(B, G)}, "
                       f"got {num_tokens_BG.dtype} {num_tokens_BG.shape}")
    for b, row in enumerate(responses_BG):
      for g, resp in enumerate(row):
        if not isinstance(resp, str):
          raise TypeError(f"responses_BG[{b}][{g}] must be str, got {type(resp)}")

    t0 = time.monotonic()
    calls = []
    for b in range(B):
      for g in range(G):
        for k, ch in enumerate(self.channels):
          call = _Call(ch, (responses_BG[b][g], examples_B[b], int(num_tokens_BG[b, g])), (b, g, k))
          calls.append(call)
          self._workers.submit(call)
    self._workers.wait(calls)

    r_BGK = np.full((B, G, len(self.channels)), np.nan, np.float32)
    errors = dict.fromkeys(self.names, 0)
    timeouts = dict.fromkeys(self.names, 0)
    last_errors = {}
    for c in calls:
      if c.error is None:
        r_BGK[c.index] = c.value
      else:
        errors[c.channel.name] += 1
        timeouts[c.channel.name] += int(c.timed_out)
        last_errors[c.channel.name] = repr(c.error)
    with self._lock:
      for n in self.names:
        self.error_counts[n] += errors[n]
        self.timeout_counts[n] += timeouts[n]
      self.last_errors.update(last_errors)
    for n, err in last_errors.items():
      _LOG.warning("reward channel %r: %d failures in this batch (last: %s)", n, errors[n], err)
    metrics = {"rewards/seconds": time.monotonic() - t0}
    for k, n in enumerate(self.names):
      metrics[f"rewards/{n}/errors"] = float(errors[n])
      metrics[f"rewards/{n}/timeouts"] = float(timeouts[n])
      col = r_BGK[..., k]
      metrics[f"rewards/{n}/mean"] = float(np.nanmean(col)) if np.isfinite(col).any() else float("nan")
    return r_BGK, metrics
