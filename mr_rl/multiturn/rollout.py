"""Multi-turn rollouts on the continuous engine: one slot per trajectory, across turns.

Shape letters (docs/shapes.md): B prompts, G trajectories per prompt, N slots, P prompt
columns, S response columns (a trajectory's whole budget after its prompt: sampled and
observation tokens), A the observation bucket.

`TurnRollout.run` is the host loop of `mr_rl.sampling.engine.Engine.stream` with turns
(docs/multiturn.md has the slot lifecycle):
  1. free slots take queued trajectories (the prompt's prefill shared by its G rows);
  2. one `step` call decodes every live slot; a slot that samples an end-of-turn id pauses;
  3. each paused slot's turn is read out and its environment step submitted to the host
     threads (the step runs there or in a worker process, `mr_rl.multiturn.workers`), while
     the next `step` call decodes the other slots;
  4. a finished step either ends the trajectory (its slot is freed) or inserts the
     observation's delta ids into the same slot, which resumes it: one `TurnPrograms.append`
     call for up to `append_rows` observations of the steps that finished together.
An environment step that raises, runs past `step_timeout_s` or kills its worker process fails
its trajectory only (`Trajectory.status`), the rest go on; a rollout in which every trajectory
fails raises `AllTrajectoriesFailed` naming the first error.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import math
import time
import weakref
from typing import Any, Sequence

import jax
import numpy as np

from mr_rl.multiturn import workers as workers_lib
from mr_rl.multiturn.env import Environment, Turn
from mr_rl.multiturn.turn_slots import TurnPrograms
from mr_rl.sampling import processing
from mr_rl.sampling.sampler import normalize_eos, prepare_prompts
from mr_rl.sampling.slots import GATHER_ROWS, unpack_report

# Trajectory.status values; FAILED_STATUSES are scored as failures.
STATUSES = ("done", "max_turns", "budget", "error", "timeout")
FAILED_STATUSES = ("error", "timeout")


class AllTrajectoriesFailed(RuntimeError):
  """Every trajectory of a rollout failed in its environment."""


@dataclasses.dataclass(frozen=True)
class TurnLimits:
  """Limits of one trajectory.

  Attributes:
    max_turns: policy turns at most (the trajectory ends after the env step of the last).
    max_observation_tokens: an observation's delta is truncated to this many ids (a marker
      appended, `render.TRUNCATION_MARKER`); also the `append` program's width A.
    step_timeout_s: an environment step running longer fails its trajectory.
  """
  max_turns: int = 4
  max_observation_tokens: int = 256
  step_timeout_s: float = 30.0

  def __post_init__(self):
    if self.max_turns < 1 or self.max_observation_tokens < 1 or not self.step_timeout_s > 0:
      raise ValueError(f"TurnLimits need max_turns >= 1, max_observation_tokens >= 1 and "
                       f"step_timeout_s > 0, got {self}")


@dataclasses.dataclass
class Trajectory:
  """One finished trajectory (row n = b * G + g).

  Attributes:
    tokens: int32 [length], the slot's response columns: sampled and observation ids.
    logprobs: float32 [length], the sampler's log-probs; 0 on observation ids.
    policy_mask: int32 [length], 1 on sampled ids, 0 on observation ids (the loss mask).
    turn_ends: index in `tokens` of each policy turn's last sampled id.
    rewards: {channel: summed step rewards}; info: {counter: summed step info}.
    turn_rewards: per policy turn with a step, that step's {channel: reward}.
    status: one of `STATUSES`; error: why a failed trajectory failed.
    observations_truncated: observations cut to `max_observation_tokens`.
  """
  row: int
  tokens: np.ndarray = None
  logprobs: np.ndarray = None
  policy_mask: np.ndarray = None
  turn_ends: list = dataclasses.field(default_factory=list)
  rewards: dict = dataclasses.field(default_factory=dict)
  turn_rewards: list = dataclasses.field(default_factory=list)
  info: dict = dataclasses.field(default_factory=dict)
  status: str = ""
  error: str | None = None
  observations_truncated: int = 0
  inserted: list = dataclasses.field(default_factory=list)  # (start, ids) per observation

  @property
  def turns(self) -> int:
    return len(self.turn_ends)

  @property
  def failed(self) -> bool:
    return self.status in FAILED_STATUSES


@dataclasses.dataclass
class TurnStats:
  """Counters of one multi-turn rollout (`TurnRollout.last_stats`; the metrics of
  `mr_rl.multiturn.rewards.turn_metrics`)."""
  rows: int = 0
  calls: int = 0
  prefills: int = 0
  appends: int = 0              # `append` calls (each inserts up to `append_rows` observations)
  observations: int = 0         # observations inserted
  decode_steps: int = 0
  slot_steps: int = 0
  busy_slot_steps: int = 0
  waiting_slot_steps: int = 0   # slot-steps of slots paused for their environment
  env_steps: int = 0
  env_time_s: float = 0.0       # summed wall time of environment steps (on workers)
  decode_time_s: float = 0.0    # wall time of the step calls (host waits included)
  wait_time_s: float = 0.0      # host time blocked with every live slot paused
  token_mismatches: int = 0

  @property
  def slot_utilization(self) -> float:
    return self.busy_slot_steps / max(1, self.slot_steps)

  @property
  def waiting_share(self) -> float:
    """Share of slot-steps spent by slots paused for their environment step."""
    return self.waiting_slot_steps / max(1, self.slot_steps)


class TurnRollout:
  """Multi-turn rollouts of one model and decode settings (module docstring).

  Args:
    model: an `mr_rl.models.Transformer`.
    slots: N decode slots.
    max_new_tokens: S, the budget of a trajectory's response columns.
    end_of_turn_ids: ids that end a policy turn (the family's end-of-turn id; for a
      plain format also the call's closing id).
    limits: `TurnLimits`.
    workers: host threads running environment steps (and, for "process", worker processes).
    workers_kind: "thread" (steps run on the host threads) or "process" (each step in a fresh
      worker process, killed at the timeout: `mr_rl.multiturn.workers`).
    append_rows: observations inserted per `append` call at most (its fixed row bucket).
    temperature, top_k, top_p, steps_per_call, prompt_buckets, pad_id, cache_dtype: as
      `mr_rl.sampling.engine.Engine`.
    mesh, rules: the device mesh and logical rules (as the engine's): slots and caches split
      over the batch axes, every program (`append` too) traced and run under the mesh.
  """

  def __init__(self, model, *, slots: int, max_new_tokens: int, end_of_turn_ids,
               limits: TurnLimits = TurnLimits(), workers: int = 8,
               workers_kind: str = "thread", append_rows: int = 8, temperature: float = 1.0,
               top_k: int = 0, top_p: float = 1.0, steps_per_call: int = 8,
               prompt_buckets: Sequence[int] | None = None, pad_id: int = 0,
               cache_dtype=None, mesh=None, rules=None):
    for name, value in (("slots", slots), ("max_new_tokens", max_new_tokens),
                        ("workers", workers), ("steps_per_call", steps_per_call),
                        ("append_rows", append_rows)):
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if workers_kind not in workers_lib.KINDS:
      raise ValueError(f"workers_kind must be one of {workers_lib.KINDS}, got {workers_kind!r}")
    self.model = model
    self.slots, self.max_new_tokens = int(slots), int(max_new_tokens)
    self.end_of_turn_ids = normalize_eos(end_of_turn_ids)
    if not self.end_of_turn_ids:
      raise ValueError("multi-turn rollouts need at least one end-of-turn id")
    self.limits = limits
    self.workers, self.workers_kind = int(workers), workers_kind
    self.append_rows = min(int(append_rows), self.slots)
    self._pool = None  # the worker processes ("process"), started by the first run
    self.sampling = processing.SamplingParams(temperature, top_k, top_p)
    self.steps_per_call = int(steps_per_call)
    self.prompt_buckets = prompt_buckets
    self.pad_id = pad_id
    self.cache_dtype = cache_dtype
    self.mesh, self.rules = mesh, rules
    self._programs = {}
    self.last_stats = TurnStats()

  def programs(self, prefill_prompts: int) -> TurnPrograms:
    if prefill_prompts not in self._programs:
      self._programs[prefill_prompts] = TurnPrograms(
          self.model, slots=self.slots, max_new_tokens=self.max_new_tokens,
          sampling=self.sampling, eos_ids=self.end_of_turn_ids,
          steps_per_call=self.steps_per_call, refill_at=self.slots, shrink_at=0,
          prefill_prompts=prefill_prompts, cache_dtype=self.cache_dtype,
          append_rows=self.append_rows, mesh=self.mesh, rules=self.rules)
    return self._programs[prefill_prompts]

  def step_runner(self, envs: Sequence[Environment]) -> workers_lib.StepRunner:
    """The runner of this rollout's environment steps ("process": the pool, started once and
    closed with the rollout or `close`, told the environments' modules)."""
    if self.workers_kind == "thread":
      return workers_lib.StepRunner("thread", self.limits.step_timeout_s)
    workers_lib.check_picklable(envs)
    if self._pool is None:
      self._pool = workers_lib.process_pool(self.workers)
      weakref.finalize(self, self._pool.close)
    workers_lib.preload(self._pool, envs)
    return workers_lib.StepRunner("process", self.limits.step_timeout_s, self._pool)

  def close(self) -> None:
    """Stops the worker processes ("process"; a later run starts them again)."""
    if self._pool is not None:
      self._pool.close()
      self._pool = None

  def run(self, params, prompts_BP, prompt_mask_BP, envs: Sequence[Environment], *,
          key: jax.Array, group_size: int, render: Any) -> list[Trajectory]:
    """Runs B * G trajectories; returns them in row order.

    Args:
      params: the model's parameters.
      prompts_BP, prompt_mask_BP: left-padded prompt ids and mask (the rendered first
        messages of each prompt).
      envs: B * G environments, already `reset` (row n's is envs[n]; with "process" workers
        each step runs on a copy, and the list is not updated).
      key: PRNG key (row n's token at response column s from fold_in(fold_in(key, n), s)).
      group_size: G.
      render: the renderer (`turn_text(ids)`, `observation_ids(messages, max_tokens)`).
    """
    tokens_BP, mask_BP = prepare_prompts(prompts_BP, prompt_mask_BP, pad_id=self.pad_id,
                                         vocab_size=self.model.config.vocab_size,
                                         buckets=self.prompt_buckets)
    n_prompts, bucket = tokens_BP.shape
    rows, group = n_prompts * group_size, group_size
    if len(envs) != rows:
      raise ValueError(f"{len(envs)} environments for {rows} trajectories")
    envs = list(envs)  # "process": row n's environment as its last step left it
    runner = self.step_runner(envs)
    m = math.ceil(self.slots / group)
    progs = self.programs(m)
    a = self.limits.max_observation_tokens
    stats = self.last_stats = TurnStats(rows=rows)
    state, store = progs.init(key, bucket)
    trajs = [Trajectory(row=n) for n in range(rows)]
    slot_row = np.full((self.slots,), -1, np.int64)
    waiting = np.zeros((self.slots,), bool)
    turn_start = np.zeros((self.slots,), np.int64)
    free = collections.deque(range(self.slots))
    pending: dict[int, tuple[cf.Future, float]] = {}  # slot -> (env step, start time)
    s_now = np.zeros((self.slots,), np.int64)  # tokens in each slot's response columns
    head, chunks = 0, 0
    threads = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="mr_rl-env")

    def finish(slot: int, status: str, error: str | None = None):
      t = trajs[slot_row[slot]]
      t.status, t.error = status, error
      slot_row[slot], waiting[slot] = -1, False
      free.append(slot)

    def env_step(n: int, turn: Turn):
      t0 = time.perf_counter()
      envs[n], result = runner(envs[n], turn)
      obs = None if result.done else render.observation_ids(result.messages, a)
      return result, obs, time.perf_counter() - t0

    def append(batch):  # [(slot, ids)], at most append_rows
      nonlocal state
      slots_R = np.zeros((progs.append_rows,), np.int32)
      ids_RA = np.zeros((progs.append_rows, a), np.int32)
      n_R = np.zeros((progs.append_rows,), np.int32)
      for r, (slot, ids) in enumerate(batch):
        slots_R[r], ids_RA[r, :len(ids)], n_R[r] = slot, ids, len(ids)
        waiting[slot] = False
        turn_start[slot] = s_now[slot] + len(ids)
      state = progs.append(params, state, slots_R, ids_RA, n_R)
      stats.appends += 1
      stats.observations += len(batch)

    try:
      while True:
        # Finished environment steps: end the trajectory or insert the observation.
        now = time.perf_counter()
        inserts = []
        for slot, (fut, t0) in list(pending.items()):
          if not fut.done() and (runner.kills_on_timeout
                                 or now - t0 <= self.limits.step_timeout_s):
            continue  # (a process step ends by itself: its worker is killed at the timeout)
          del pending[slot]
          t = trajs[slot_row[slot]]
          if not fut.done():  # the worker thread is abandoned (Python cannot stop it)
            finish(slot, "timeout", f"environment step ran past {self.limits.step_timeout_s} s")
            continue
          try:
            result, obs, seconds = fut.result()
          except workers_lib.StepTimeout as e:
            finish(slot, "timeout", str(e))
            continue
          except Exception as e:  # pylint: disable=broad-except  (the env's fault: one row)
            finish(slot, "error", f"{type(e).__name__}: {e}")
            continue
          stats.env_steps += 1
          stats.env_time_s += seconds
          t.turn_rewards.append({k: float(v) for k, v in result.rewards.items()})
          for k, v in result.rewards.items():
            t.rewards[k] = t.rewards.get(k, 0.0) + float(v)
          for k, v in result.info.items():
            t.info[k] = t.info.get(k, 0.0) + float(v)
          if result.done:
            finish(slot, "done")
          elif t.turns >= self.limits.max_turns:
            finish(slot, "max_turns")
          elif not obs[0]:  # nothing to feed: the slot could not resume
            finish(slot, "error", f"the observation {list(result.messages)!r:.200} rendered to "
                   "no ids")
          elif int(s_now[slot]) + len(obs[0]) >= self.max_new_tokens:
            finish(slot, "budget")  # no room for the observation and one more token
          else:
            ids, truncated = obs
            t.observations_truncated += int(truncated)
            t.inserted.append((int(s_now[slot]), list(ids)))
            inserts.append((slot, ids))
        for i in range(0, len(inserts), progs.append_rows):
          append(inserts[i:i + progs.append_rows])
        # New trajectories into free slots.
        plan = np.concatenate([np.full((self.slots,), -1, np.int32),
                               np.zeros((self.slots + 1,), np.int32)])
        while free and head < rows:
          prompt = head // group
          chunk = prompt // m
          if chunk >= chunks:
            idx = np.minimum(np.arange(chunk * m, chunk * m + m), n_prompts - 1)
            store = progs.prefill(params, store, tokens_BP[idx], mask_BP[idx],
                                  np.int32(chunk % 2))
            chunks += 1
            stats.prefills += 1
          slot = free.popleft()
          plan[slot] = (chunk % 2) * m + prompt - chunk * m
          plan[self.slots + slot] = head
          slot_row[slot], turn_start[slot] = head, 0
          head += 1
        live_host = (slot_row >= 0) & ~waiting
        if not live_host.any():
          if not pending:
            break
          t0 = time.perf_counter()
          cf.wait([f for f, _ in pending.values()],
                  timeout=None if runner.kills_on_timeout else self._next_deadline(pending),
                  return_when=cf.FIRST_COMPLETED)
          stats.wait_time_s += time.perf_counter() - t0
          continue
        t0 = time.perf_counter()
        state, report = progs.step(params, state, store, plan)
        live, s, _, steps, busy = unpack_report(np.asarray(report), self.slots)
        stats.decode_time_s += time.perf_counter() - t0
        s_now = s.astype(np.int64)
        stats.calls += 1
        stats.decode_steps += steps
        stats.slot_steps += steps * self.slots
        stats.busy_slot_steps += busy
        stats.waiting_slot_steps += steps * int(waiting.sum())
        ended = np.flatnonzero(live_host & ~live)
        for i in range(0, ended.size, GATHER_ROWS):
          part = ended[i:i + GATHER_ROWS]
          take = np.concatenate([part, np.full(GATHER_ROWS - part.size, part[0])])
          tok_mS, lp_mS = (np.asarray(x) for x in progs.gather(state, take.astype(np.int32)))
          for j, slot in enumerate(part):
            self._turn_ended(trajs[slot_row[slot]], tok_mS[j], lp_mS[j], int(s[slot]), stats)
            t = trajs[slot_row[slot]]
            last = int(tok_mS[j][s[slot] - 1])
            if last not in self.end_of_turn_ids and s[slot] >= self.max_new_tokens:
              finish(slot, "budget")
              continue
            turn = Turn(text=render.turn_text(t.tokens[turn_start[slot]:]),
                        token_ids=tuple(int(x) for x in t.tokens[turn_start[slot]:]),
                        index=t.turns - 1)
            waiting[slot] = True
            pending[slot] = (threads.submit(env_step, int(slot_row[slot]), turn),
                             time.perf_counter())
    finally:
      threads.shutdown(wait=False, cancel_futures=True)
    if all(t.failed for t in trajs):
      raise AllTrajectoriesFailed(f"all {rows} trajectories failed in their environment; the "
                                  f"first: {trajs[0].error}")
    return trajs

  def _next_deadline(self, pending) -> float:
    now = time.perf_counter()
    return max(0.0, min(t0 + self.limits.step_timeout_s - now for _, t0 in pending.values()))

  @staticmethod
  def _turn_ended(t: Trajectory, tokens_S, logprobs_S, s: int, stats: TurnStats) -> None:
    """Records the slot's row as read out at the end of a turn: every column up to s, with
    the observations' ids checked against what was inserted."""
    t.tokens = np.asarray(tokens_S[:s], np.int32)
    t.logprobs = np.asarray(logprobs_S[:s], np.float32)
    mask = np.ones((s,), np.int32)
    for at, ids in t.inserted:
      mask[at:at + len(ids)] = 0
      stats.token_mismatches += int(np.sum(t.tokens[at:at + len(ids)] != np.asarray(ids)))
    t.policy_mask = mask
    t.turn_ends.append(s - 1)
