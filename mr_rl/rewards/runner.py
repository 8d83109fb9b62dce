"""Batch reward runner: r[B, G, K] from K named channels (docs/methods.md §7).

Shapes: B prompts, G responses per prompt, K channels.

Every reward is a host-side function ``fn(response, example, num_tokens) -> float | None``
(or a batched ``fn(responses, examples, num_tokens) -> list[float | None]``, see
``RewardChannel``). The runner evaluates the B*G*K calls concurrently. Each (row, channel)
ends in one of these ways, and the line between them is drawn here:

* **does not apply**: the channel declares the prompts it scores (``RewardChannel.applies``,
  a function of the example only, asked once per prompt and batch); where it says no, the
  channel is not called and the whole group scores NaN, which every aggregator reads as
  "this channel does not apply to this sample" (it renormalises over the other channels).
  Counted per response in ``rewards/<name>/not_applicable``. Applicability is never inferred
  from what a channel returns: a group of G unscorable responses ("I don't know" twice) once
  made a channel NaN for its prompt, and the aggregate, averaged over the other channels,
  paid it like exact answers.
* **a score**: a real number (bools count as 0 / 1).
* **unscorable**: the function returned ``None`` or NaN -> the channel's ``on_failure`` value
  (counted in ``rewards/<name>/unscorable``), so a policy earns nothing by writing
  responses a channel cannot parse. A channel that scores no response of a batch (every row
  does not apply, is unscorable or failed) for ``not_applicable_patience`` consecutive runner
  calls stops the run (``RewardFailureError``, naming it): a channel that never scores is a
  set-up error (or the policy has collapsed).
* **failure** (the response broke the scorer): the function raised anything but a
  ``RewardConfigError``, overran ``timeout_s``, its worker process died, or it returned a
  number that is no score (``RewardValueError``: +-inf, an int too large for a float, a
  value outside the channel's ``value_range``; built-in channels declare theirs, e.g.
  [0, 1]; a channel without one has ``[on_failure, 1e6]``) -> the channel's ``on_failure``
  value, never NaN and never above its lowest honest score (its floor by default; a channel
  declaring no range must give it), so a policy cannot earn reward by making a verifier
  crash or time out. Counted in ``rewards/<name>/errors`` (timeouts also in
  ``/timeouts``), cumulatively in ``error_counts`` / ``timeout_counts``, with the latest
  error in ``last_errors``. The failure-rate guard stops the run when a channel fails on
  more than ``max_failure_share`` of a batch on ``failure_patience`` consecutive calls
  (``RewardFailureError``, naming the channel and its last error).
* **configuration error** (the scorer cannot run here; no response could fix it): the
  function raised ``RewardConfigError`` (a ``MissingFieldError`` when it reads an example
  field the data does not have: examples reach channels as ``ExampleFields``, whose missing
  keys raise it), it returned something that is not a reward (a str, a list from a
  per-sample function, a batched list of the wrong length: a channel declared as the wrong
  kind), or a "process" call
  could not be sent to or loaded in a worker (``pool.WorkerSetupError``: a function in
  ``__main__``, a plugin module that does not import there, workers that cannot start).
  The runner raises ``RewardConfigError`` at the first batch, naming the channel, the error
  and the keys the example has. Bad parameters fail earlier, when the channel is built.

Two execution kinds:

* ``"thread"``: light rules (regexes, length thresholds) run directly on the runner's
  daemon threads. A call that overruns ``timeout_s`` fails; the thread cannot be killed, so
  it is abandoned and replaced by a fresh one (its eventual result is dropped). Only use
  this kind for code that cannot hang.
* ``"process"``: heavy or untrusted work (sympy, math-verify) runs in a ``HardTimeoutPool``
  (``process/pool.py``): our own worker processes, one killed and replaced when its call overruns.
  ``fn`` and its arguments must be importable by name in a worker (a module-level function
  or a ``functools.partial`` of one; never one defined in ``__main__``).

Channels come from the registry in ``mr_rl.rewards.channels`` (re-exported here), so a
config can pick channels by name and set their parameters:
``get_reward("brief", threshold=128)``.
"""

from __future__ import annotations

import logging
import math
import numbers
import threading
import time
from typing import Any, Mapping, Sequence

import numpy as np

from mr_rl.rewards.calls import Call, ThreadWorkers
from mr_rl.rewards.channels import (DEFAULT_VALUE_RANGE, KINDS, REWARDS, ExampleFields,
                                    MissingFieldError, ReadOnlyExampleError, RewardChannel,
                                    RewardConfigError, available_rewards, batched_reward,
                                    channel_name, get_reward, is_import_path, register_reward)
from mr_rl.rewards.process.pool import (HardTimeoutPool, RewardTimeoutError, RewardWorkerError,
                                        WorkerSetupError, shared_pool)
from mr_rl.rewards.values import RewardValueError
from mr_rl.rewards.values import as_score as _as_score
from mr_rl.rewards.values import as_scores as _as_scores

__all__ = ["DEFAULT_VALUE_RANGE", "KINDS", "REWARDS", "ExampleFields", "HardTimeoutPool",
           "MissingFieldError", "ReadOnlyExampleError", "RewardChannel", "RewardConfigError",
           "RewardFailureError", "RewardRunner", "RewardTimeoutError", "RewardValueError",
           "RewardWorkerError", "WorkerSetupError", "available_rewards", "batched_reward",
           "channel_name", "get_reward", "is_import_path", "register_reward", "shared_pool"]

_LOG = logging.getLogger(__name__)
_FATAL = (RewardConfigError, WorkerSetupError)
_COUNTS = ("errors", "timeouts", "not_applicable", "unscorable")  # per-channel counts per call


class RewardFailureError(RuntimeError):
  """A channel failed on too large a share of its calls for too many consecutive batches."""


# ----------------------------------------------------------------------------
# Runner.
# ----------------------------------------------------------------------------


class RewardRunner:
  """Computes r[B, G, K] (float32) for a batch over K named channels.

  Usage::

    runner = RewardRunner(["accuracy", "format", get_reward("brief", threshold=128)])
    r_BGK, metrics = runner(responses_BG, examples_B, num_tokens_BG)

  Thread-safe: several threads may call the same runner at once.

  Args:
    channels: registered names or import paths (built with ``get_reward``, default
      parameters) or ``RewardChannel``s.
    timeout_s: wall-clock budget of one call (one response and channel, or one batched call).
    num_threads: runner threads (they also wait on the process pool, so keep it >= the
      pool's workers).
    pool: process pool for "process" channels; default ``shared_pool()``.
    max_failure_share: the guard's limit on the share of a channel's calls in one batch that
      fail (raise, time out, worker died); 1.0 never trips.
    failure_patience: consecutive runner calls over the limit that stop the run.
    not_applicable_patience: consecutive runner calls in which a channel scores no response
      (each does not apply, is unscorable or failed) that stop the run.
  """

  def __init__(self, channels: Sequence[str | RewardChannel], timeout_s: float = 10.0,
               num_threads: int = 8, pool: HardTimeoutPool | None = None,
               max_failure_share: float = 0.5, failure_patience: int = 3,
               not_applicable_patience: int = 10):
    if isinstance(channels, (str, RewardChannel)) or not channels:
      raise ValueError(f"channels must be a non-empty sequence, got {channels!r}")
    self.channels = tuple(c if isinstance(c, RewardChannel) else get_reward(c) for c in channels)
    names = [c.name for c in self.channels]
    env = [c.name for c in self.channels if c.kind == "environment"]
    if env:
      raise ValueError(f"channels {env} are scored from an environment's step rewards "
                       "(mr_rl.multiturn.channels): they need config.multiturn, which keeps "
                       "them out of the reward runner")
    if len(set(names)) != len(names):
      raise ValueError(f"channel names must be unique, got {names}")
    if not timeout_s or timeout_s <= 0:
      raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if not isinstance(num_threads, int) or num_threads < 1:
      raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
    if (isinstance(max_failure_share, bool) or not isinstance(max_failure_share, numbers.Real)
        or not 0.0 <= max_failure_share <= 1.0):
      raise ValueError(f"max_failure_share must be in [0, 1], got {max_failure_share!r}")
    for field, v in (("failure_patience", failure_patience),
                     ("not_applicable_patience", not_applicable_patience)):
      if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{field} must be a positive int, got {v!r}")
    self.names = tuple(names)
    self.timeout_s = float(timeout_s)
    self.max_failure_share = float(max_failure_share)
    self.failure_patience = failure_patience
    self.not_applicable_patience = not_applicable_patience
    self._pool = pool
    self._workers = ThreadWorkers(num_threads, self._get_pool, self.timeout_s)
    self._lock = threading.Lock()
    self.error_counts = {n: 0 for n in self.names}    # cumulative failures (incl. timeouts)
    self.timeout_counts = {n: 0 for n in self.names}  # cumulative timeouts
    self.last_errors: dict[str, str] = {}             # channel -> repr of its latest failure
    self._streaks = {n: 0 for n in self.names}        # consecutive calls over the share limit
    self._na_streaks = {n: 0 for n in self.names}     # consecutive calls scoring no response

  def _get_pool(self) -> HardTimeoutPool:
    return self._pool if self._pool is not None else shared_pool()

  def _check(self, responses_BG, examples_B, num_tokens_BG) -> tuple[int, int, np.ndarray]:
    B = len(responses_BG)
    if B == 0:
      raise ValueError("responses_BG is empty")
    G = len(responses_BG[0])
    if any(len(row) != G for row in responses_BG) or G == 0:
      raise ValueError(f"responses_BG must be B lists of the same G >= 1 responses, "
                       f"got lengths {[len(row) for row in responses_BG]}")
    if len(examples_B) != B:
      raise ValueError(f"examples_B has {len(examples_B)} entries, expected B={B}")
    for b, ex in enumerate(examples_B):
      if not isinstance(ex, Mapping):
        raise TypeError(f"examples_B[{b}] must be a mapping, got {type(ex).__name__}")
    num_tokens_BG = np.asarray(num_tokens_BG)
    if num_tokens_BG.shape != (B, G) or not np.issubdtype(num_tokens_BG.dtype, np.integer):
      raise ValueError(f"num_tokens_BG must be an integer array of shape {(B, G)}, "
                       f"got {num_tokens_BG.dtype} {num_tokens_BG.shape}")
    for b, row in enumerate(responses_BG):
      for g, resp in enumerate(row):
        if not isinstance(resp, str):
          raise TypeError(f"responses_BG[{b}][{g}] must be str, got {type(resp)}")
    return B, G, num_tokens_BG

  def __call__(self, responses_BG: Sequence[Sequence[str]], examples_B: Sequence[Mapping[str, Any]],
               num_tokens_BG: Any) -> tuple[np.ndarray, dict[str, float]]:
    """Scores every response on every channel (`score` then `finish`).

    Args:
      responses_BG: B lists of G decoded responses.
      examples_B: one mapping per prompt (reference answer etc.).
      num_tokens_BG: [B, G] generated-token counts.

    Returns:
      r_BGK: float32 [B, G, K]; NaN where a channel does not apply to a prompt (its
        ``applies(example)`` is False: all G responses), ``on_failure`` where a call failed or
        returned None / NaN.
      metrics: per-call logging stats: ``rewards/<name>/errors``, ``rewards/<name>/timeouts``,
        ``rewards/<name>/not_applicable``, ``rewards/<name>/unscorable``,
        ``rewards/<name>/mean`` (NaN-ignoring) and ``rewards/seconds``.

    Raises:
      RewardConfigError: a channel cannot run on this data (see the module docstring).
      RewardFailureError: the failure-rate guard tripped, or a channel scored no response
        for ``not_applicable_patience`` calls in a row.
    """
    return self.finish(*self.score(responses_BG, examples_B, num_tokens_BG))

  def score(self, responses_BG: Sequence[Sequence[str]], examples_B: Sequence[Mapping[str, Any]],
            num_tokens_BG: Any, rows_BG=None) -> tuple[np.ndarray, dict[str, int], float]:
    """Runs the channels on the responses of `rows_BG` (bool [B, G], default all): the raw
    half of `__call__`, before the rules over whole batches (`finish`).

    A multi-process run scores each process's own rows, gathers the rewards and sums the
    counts over the processes, then calls `finish` with the same values on every process
    (`mr_rl.rollout.score`). `start` is the same, row by row.

    Returns:
      (r_BGK: NaN outside `rows_BG`; counts {"<what>/<channel>": int}; seconds).

    Raises:
      RewardConfigError: a channel cannot run on this data.
    """
    B, G, num_tokens_BG = self._check(responses_BG, examples_B, num_tokens_BG)
    rows_BG = np.ones((B, G), bool) if rows_BG is None else np.asarray(rows_BG, bool)
    if rows_BG.shape != (B, G):
      raise ValueError(f"rows_BG must have shape {(B, G)}, got {rows_BG.shape}")
    pending = self.start(examples_B, G)
    for b, g in zip(*np.nonzero(rows_BG)):
      pending.add(int(b), int(g), responses_BG[b][g], int(num_tokens_BG[b, g]))
    return pending.result()

  def start(self, examples_B: Sequence[Mapping[str, Any]], group_size: int) -> "PendingScores":
    """Scores of one batch of B prompts x G responses, submitted row by row as the rows come
    (`PendingScores.add`: a row's per-sample calls start at once, on the runner's threads and
    worker processes) and collected once (`PendingScores.result`, what `score` returns)."""
    return PendingScores(self, examples_B, group_size)

  def finish(self, r_BGK: np.ndarray, counts: Mapping[str, float],
             seconds: float) -> tuple[np.ndarray, dict[str, float]]:
    """The batch-level half of `__call__`, on the whole batch's rewards and the calls' counts
    ({"errors/<channel>": n, "timeouts/<channel>": n, "unscorable/<channel>": n}): the
    cumulative counters, the guards and the metrics."""
    B, G, _ = r_BGK.shape
    stats = {what: {n: int(counts.get(f"{what}/{n}", 0)) for n in self.names} for what in _COUNTS}
    self._count_scored(r_BGK, stats)
    with self._lock:
      for n in self.names:
        self.error_counts[n] += stats["errors"][n]
        self.timeout_counts[n] += stats["timeouts"][n]
    for n in self.names:
      if stats["errors"][n]:
        _LOG.warning("reward channel %r: %d failures in this batch (scored %g; last: %s)", n,
                     stats["errors"][n], self.channels[self.names.index(n)].on_failure,
                     self.last_errors.get(n))
    self._guard(stats, B * G)
    metrics = {"rewards/seconds": float(seconds)}
    for k, n in enumerate(self.names):
      for what in _COUNTS:
        metrics[f"rewards/{n}/{what}"] = float(stats[what][n])
      col = r_BGK[..., k]
      metrics[f"rewards/{n}/mean"] = float(np.nanmean(col)) if np.isfinite(col).any() else math.nan
    return r_BGK, metrics

  def _collect(self, calls: Sequence[Call], B: int, G: int):
    """Fills r[B, G, K] at the rows of finished calls (None / NaN -> on_failure, unscorable);
    raises on configuration errors."""
    r_BGK = np.full((B, G, len(self.channels)), np.nan, np.float32)
    stats = {w: dict.fromkeys(self.names, 0) for w in _COUNTS}
    last_errors, config_errors = {}, []
    for c in calls:
      name, on_failure = c.channel.name, c.channel.on_failure
      if c.error is None:
        try:
          if c.index is None:
            values = _as_scores(c.value, c.channel, len(c.rows))
          else:
            values = [_as_score(c.value, c.channel)]
        except RewardConfigError as e:
          config_errors.append((c, e))
          continue
        except RewardValueError as e:
          values = [e]
        for (b, g), v in zip(c.rows, values):
          if isinstance(v, RewardValueError):  # this row's failure, not the run's
            r_BGK[b, g, c.k] = on_failure
            stats["errors"][name] += 1
            last_errors[name] = repr(v)
          elif math.isnan(v):  # the channel applies here (it was called): unscorable
            r_BGK[b, g, c.k] = on_failure
            stats["unscorable"][name] += 1
          else:
            r_BGK[b, g, c.k] = v
      elif isinstance(c.error, _FATAL):
        config_errors.append((c, c.error))
      else:
        for b, g in c.rows:
          r_BGK[b, g, c.k] = on_failure
        stats["errors"][name] += len(c.rows)
        stats["timeouts"][name] += len(c.rows) * int(c.timed_out)
        last_errors[name] = repr(c.error)
    if config_errors:
      raise self._config_error(config_errors)
    with self._lock:
      self.last_errors.update(last_errors)
    return r_BGK, stats

  def applicability(self, examples_B: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """applies_BK (bool [B, K]): channel k scores prompt b (``RewardChannel.applies``).

    Raises:
      RewardConfigError: a predicate raised or returned something other than a bool.
    """
    applies_BK = np.ones((len(examples_B), len(self.channels)), bool)
    for k, ch in enumerate(self.channels):
      if ch.applies is None:
        continue
      for b, ex in enumerate(examples_B):
        try:
          got = ch.applies(ex)
        except Exception as e:  # pylint: disable=broad-except  (about the data, not a response)
          err = RewardConfigError(f"reward channel {ch.name!r}: applies(example) raised "
                                  f"{type(e).__name__}: {e} (example keys: "
                                  f"{sorted(map(str, ex))})")
          raise err from e
        if not isinstance(got, (bool, np.bool_)):
          raise RewardConfigError(f"reward channel {ch.name!r}: applies(example) must return a "
                                  f"bool, got {type(got).__name__} {got!r:.80}")
        applies_BK[b, k] = bool(got)
    return applies_BK

  @staticmethod
  def _config_error(config_errors) -> RewardConfigError:
    c, e = config_errors[0]
    same = sum(1 for c2, _ in config_errors if c2.channel is c.channel)
    msg = (f"reward channel {c.channel.name!r} cannot run on this data ({same} of its calls in "
           f"this batch): {type(e).__name__}: {e}")
    if not isinstance(e, MissingFieldError):  # its message names the keys already
      example = c.args[1] if c.index is not None else c.args[1][0]
      msg += f" (example keys: {sorted(map(str, example))})"
    err = RewardConfigError(msg)
    err.__cause__ = e
    return err

  def _count_scored(self, r_BGK: np.ndarray, stats) -> None:
    """Counts the rows where each channel does not apply (NaN: only where it declared so) and
    tracks the calls in a row in which a channel scored no response at all."""
    B, G, _ = r_BGK.shape
    nan_K = np.isnan(r_BGK).sum(axis=(0, 1))
    idle = []
    with self._lock:
      for k, n in enumerate(self.names):
        stats["not_applicable"][n] = int(nan_K[k])
        scored = B * G - nan_K[k] - stats["unscorable"][n] - stats["errors"][n]
        self._na_streaks[n] = 0 if scored > 0 else self._na_streaks[n] + 1
        if self._na_streaks[n] >= self.not_applicable_patience:
          idle.append(n)
    if idle:
      n = idle[0]
      raise RewardFailureError(
          f"reward channel {n!r} scored no response for {self._na_streaks[n]} consecutive "
          f"batches (not_applicable_patience={self.not_applicable_patience}; this batch: "
          f"{stats['not_applicable'][n]} of {B * G} where it does not apply, "
          f"{stats['unscorable'][n]} unscorable (None / NaN), {stats['errors'][n]} failed): "
          f"fix what it reads, its applies(example), or remove it from config.rewards.channels")

  def _guard(self, stats, calls_per_channel: int) -> None:
    """The failure-rate guard: counts consecutive over-limit batches per channel."""
    tripped = []
    with self._lock:
      for n in self.names:
        share = stats["errors"][n] / calls_per_channel
        self._streaks[n] = self._streaks[n] + 1 if share > self.max_failure_share else 0
        if self._streaks[n] >= self.failure_patience:
          tripped.append((n, share, self._streaks[n]))
    if tripped:
      n, share, streak = tripped[0]
      raise RewardFailureError(
          f"reward channel {n!r} failed on {share:.0%} of this batch ({stats['errors'][n]} of "
          f"{calls_per_channel} responses, {stats['timeouts'][n]} timeouts), more than "
          f"max_failure_share={self.max_failure_share:g} for {streak} consecutive batches "
          f"(failure_patience={self.failure_patience}); last error: {self.last_errors.get(n)}")


class PendingScores:
  """The calls of one batch (B prompts x G responses), submitted row by row (`RewardRunner.start`).

  `add(b, g, response, num_tokens)` starts the row's per-sample calls at once; batched channels
  need every row, so their one call starts in `result`, over the added rows in (b, g) order, as
  `RewardRunner.score` makes it. `result` waits for every call and returns what `score` does,
  the same values whatever the order and timing of the `add`s. Not thread-safe: one producer.
  """

  def __init__(self, runner: RewardRunner, examples_B: Sequence[Mapping[str, Any]],
               group_size: int):
    for b, ex in enumerate(examples_B):
      if not isinstance(ex, Mapping):
        raise TypeError(f"examples_B[{b}] must be a mapping, got {type(ex).__name__}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
      raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    self._runner = runner
    self._examples = [ExampleFields.of(ex) for ex in examples_B]  # read-only: shared
    self.applies_BK = runner.applicability(self._examples)
    self._G = group_size
    self._rows: dict[tuple[int, int], tuple[str, int]] = {}
    self._calls: list[Call] = []
    self._pending: list[Call] = []  # submitted calls not done yet
    self._t0: float | None = None

  def add(self, b: int, g: int, response: str, num_tokens: int) -> None:
    """Submits row (b, g): its per-sample calls start as soon as a worker thread is free."""
    if not (0 <= b < len(self._examples) and 0 <= g < self._G):
      raise ValueError(f"row ({b}, {g}) is outside the batch's {len(self._examples)} x {self._G}")
    if (b, g) in self._rows:
      raise ValueError(f"row ({b}, {g}) was added twice")
    if not isinstance(response, str):
      raise TypeError(f"the response of row ({b}, {g}) must be str, got {type(response)}")
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)):
      raise TypeError(f"num_tokens of row ({b}, {g}) must be an int, got {num_tokens!r}")
    if self._t0 is None:
      self._t0 = time.monotonic()
    self._rows[(b, g)] = (response, int(num_tokens))
    workers = self._runner._workers  # pylint: disable=protected-access
    new = [Call(ch, k, (response, self._examples[b], int(num_tokens)), (b, g))
           for k, ch in enumerate(self._runner.channels)
           if not ch.batched and self.applies_BK[b, k]]
    for call in new:
      workers.submit(call)
    self._calls += new
    # A hung "thread" call frees its thread now, not only when `result` waits.
    self._pending = workers.expire(self._pending + new)

  def result(self) -> tuple[np.ndarray, dict[str, int], float]:
    """Waits for every call: (r_BGK: NaN outside the added rows; counts; seconds from the
    first `add` to the end, overlapping whatever ran meanwhile)."""
    runner = self._runner
    picked = sorted(self._rows)
    t0 = time.monotonic() if self._t0 is None else self._t0
    calls = []
    for k, ch in enumerate(runner.channels):  # batched calls first: they are the long ones
      rows = [r for r in picked if self.applies_BK[r[0], k]]
      if ch.batched and rows:
        calls.append(Call(ch, k, ([self._rows[r][0] for r in rows],
                                  [self._examples[b] for b, _ in rows],
                                  [self._rows[r][1] for r in rows]), None, rows))
    for call in calls:  # ahead of the per-sample calls still queued
      runner._workers.submit(call, first=True)  # pylint: disable=protected-access
    calls += sorted(self._calls, key=lambda c: (c.index, c.k))  # score's order: same errors
    runner._workers.wait(calls)  # pylint: disable=protected-access
    r_BGK, stats = runner._collect(calls, len(self._examples), self._G)  # pylint: disable=protected-access
    counts = {f"{what}/{n}": stats[what][n] for what in ("errors", "timeouts", "unscorable")
              for n in runner.names}
    return r_BGK, counts, time.monotonic() - t0
