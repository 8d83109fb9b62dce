"""Continuous-batching rollout engine: a fixed pool of decode slots that stays full.

Shape letters (docs/shapes.md): B prompts, G responses per prompt, N rows of a result (the
B * G responses, row b * G + g, as `sampler.generate_groups` orders them), P prompt columns
(the prompt bucket), S response columns (`max_new_tokens`). The slot pool's own arrays live in
`slots.py` (where N are the slots).

The static sampler (`sampler.py`) decodes all rows of a call as one batch until the last one
stops: a row that ended early holds its slot to the end, each of the G responses of a prompt
prefills it again, and memory grows with the row count. This engine instead keeps `slots`
decode slots and a queue of rows; a host loop (`Engine.stream`) alternates

  1. planning: each free slot takes the next queued row (rows in order b * G + g); prompts are
     prefilled M at a time into a double-buffered prompt store, once per prompt, and each of
     its G rows copies the prompt's KV columns from the store into its slot (shared prefill);
  2. one jitted `step` call: the copies, then up to `steps_per_call` decode steps over all
     slots, ending early as soon as a slot is free while rows are queued;
  3. collection: slots whose row finished are read out (`FinishedRow`, one gather) and freed.

Compiled shapes are fixed by (slots, prompt bucket): a rollout larger than the pool streams
through it. Finished rows come out as they complete (`stream` is an iterator; `__call__` takes
an `on_finished` callback), so host-side rewards can run while the rest decodes: the next
`step` is dispatched before the previous call's rows are handed out.

Sampled draws use the per-row key schedule `processing.row_step_keys`: the token of row n at
step s is drawn from `fold_in(fold_in(key, n), s)`, so a row's tokens depend on (key, n) only,
not on the slot count, its slot or when it was inserted; `Sampler(key_schedule="row")` /
`generate_groups(..., key_schedule="row")` draw the same tokens. Greedy decoding equals the
static sampler's default. Log-probs are the temperature-1 policy log-probs, as the sampler's.
Design notes and measurements: docs/architecture.md, "Sampling";
docs/benchmarks.md, "Continuous engine".
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import Callable, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl.sampling import processing
from mr_rl.sampling.sampler import EosIds, SampleOutput, normalize_eos, prepare_prompts
from mr_rl.sampling.slots import GATHER_ROWS, SlotPrograms, unpack_report


# Default refill threshold: a call ends once slots // 16 slots are free (see `Engine`).
DEFAULT_REFILL_FRACTION = 16


@dataclasses.dataclass(frozen=True)
class FinishedRow:
  """One finished response, handed out as soon as its slot stops.

  Attributes:
    row: its index n = b * G + g in the rollout.
    tokens: int32 [length], generated tokens (EOS included when the row produced it).
    logprobs: float32 [length], temperature-1 policy log-probs of `tokens`.
    length: generated tokens.
    truncated: True iff the row did not produce EOS within `max_new_tokens`.
  """
  row: int
  tokens: np.ndarray
  logprobs: np.ndarray
  length: int
  truncated: bool


@dataclasses.dataclass
class EngineStats:
  """Counters of one engine run (`Engine.last_stats`).

  Attributes:
    rows: rows decoded. calls: `step` calls. prefills: `prefill` calls.
    decode_steps: decode steps run (each over all slots of the pool).
    slot_steps: sum over decode steps of the pool size (smaller in a compacted tail).
    busy_slot_steps: slot-steps that decoded a live row (= generated tokens).
  """
  rows: int = 0
  calls: int = 0
  prefills: int = 0
  decode_steps: int = 0
  slot_steps: int = 0
  busy_slot_steps: int = 0

  @property
  def slot_utilization(self) -> float:
    """Fraction of slot-steps spent on live rows."""
    return self.busy_slot_steps / max(1, self.slot_steps)


def _to_host(x) -> np.ndarray:
  """A replicated (or single-device) array as numpy, without a cross-process gather."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(x.addressable_data(0))
  return np.asarray(x)


class Engine:
  """A continuous-batching sampler for one model and one set of decode settings.

  Create once and reuse: the slot programs compile once per (prompt bucket, prefill size M).

  Args:
    model: an `mr_rl.models.Transformer`.
    slots: the number of decode slots (a multiple of the mesh's data-parallel size).
    max_new_tokens: S, the cap on generated tokens per row.
    temperature, top_k, top_p: see `processing.SamplingParams` (temperature 0 = greedy).
    eos_id: None, one id or several; a row stops after producing one of them.
    pad_id: token written after EOS in the assembled result (`__call__`).
    prompt_buckets: prompt-length buckets (None: powers of two, as `Sampler`).
    steps_per_call: the most decode steps one device call runs (it bounds how late a row
      finishing in the tail is handed out).
    refill_at: while rows are queued, a call ends (and the host refills the free slots) once
      this many slots are free (0: max(1, slots // 16)). Larger values mean fewer calls (less
      host round-trip time) but more idle slot-steps (about refill_at / 2 per step).
    shrink_tail: once no rows are queued and at most half the slots are live, compact the
      live rows into a pool of half the size (`pool_sizes`), and so on: the tail's idle
      slots are not computed (one more compile per pool size).
    prefill_prompts: M, prompts prefilled per prefill call (0: ceil(slots / G) of the rollout;
      at least that, so a refill never waits for a prefill of a prompt still in use).
    cache_dtype: KV-cache dtype (None: the model's dtype).
    mesh, rules: optional device mesh and logical axis rules; slots, prompt store and caches
      are split over the mesh's batch axes (params should already be sharded).
    max_traces: if set, raise (chex.assert_max_traces) when a jitted program is traced more
      often than this, counted over all pool sizes: each program traces once per prompt
      bucket and pool size (`pool_sizes()`; the initial pool only for `prefill`).
  """

  def __init__(self, model, *, slots: int, max_new_tokens: int, temperature: float = 1.0,
               top_k: int = 0, top_p: float = 1.0, eos_id: EosIds = None, pad_id: int = 0,
               prompt_buckets: Optional[Sequence[int]] = None, steps_per_call: int = 8,
               refill_at: int = 0, shrink_tail: bool = True, prefill_prompts: int = 0,
               cache_dtype=None, mesh=None, rules=None, max_traces: Optional[int] = None):
    for name, value, low in (("slots", slots, 1), ("max_new_tokens", max_new_tokens, 1),
                             ("steps_per_call", steps_per_call, 1), ("refill_at", refill_at, 0),
                             ("prefill_prompts", prefill_prompts, 0)):
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if not isinstance(pad_id, int) or pad_id < 0:
      raise ValueError(f"pad_id must be a non-negative int, got {pad_id!r}")
    if mesh is not None:
      from mr_rl.models import sharding as shd
      dp = shd.data_parallel_size(mesh)
      if slots % dp:
        raise ValueError(f"slots={slots} must be a multiple of the mesh's data-parallel size "
                         f"{dp} (axes {shd.data_axes(mesh)})")
    self.model = model
    self.slots = int(slots)
    self.max_new_tokens = int(max_new_tokens)
    self.sampling = processing.SamplingParams(temperature, top_k, top_p)
    self.eos_ids = normalize_eos(eos_id)
    self.pad_id = pad_id
    self.prompt_buckets = None if prompt_buckets is None else tuple(int(b) for b in prompt_buckets)
    self.steps_per_call = int(steps_per_call)
    self.refill_at = int(refill_at) or max(1, self.slots // DEFAULT_REFILL_FRACTION)
    self.shrink_tail = bool(shrink_tail)
    self.prefill_prompts = int(prefill_prompts)
    self.cache_dtype = cache_dtype
    self.mesh = mesh
    self.rules = rules
    self.max_traces = max_traces
    self.last_stats = EngineStats()

  @functools.lru_cache(maxsize=32)
  def programs(self, slots: int, prefill_prompts: int) -> SlotPrograms:
    """The jitted slot programs of a pool of `slots` slots with M = `prefill_prompts`."""
    ladder = self.pool_sizes()
    smaller = [n for n in ladder if n < slots]
    return SlotPrograms(self.model, slots=slots, max_new_tokens=self.max_new_tokens,
                        sampling=self.sampling, eos_ids=self.eos_ids,
                        steps_per_call=self.steps_per_call,
                        refill_at=min(slots, self.refill_at),
                        shrink_at=smaller[0] if smaller and self.shrink_tail else 0,
                        prefill_prompts=prefill_prompts, cache_dtype=self.cache_dtype,
                        mesh=self.mesh, rules=self.rules, max_traces=self.max_traces)

  def pool_sizes(self) -> tuple[int, ...]:
    """Slot counts the pool takes, largest first: `slots`, then halved (rounded up to a
    multiple of the data-parallel size) down to that size, as the tail empties."""
    dp = 1
    if self.mesh is not None:
      from mr_rl.models import sharding as shd
      dp = shd.data_parallel_size(self.mesh)
    sizes = [self.slots]
    while self.shrink_tail and sizes[-1] > dp:
      half = -(-sizes[-1] // 2)
      nxt = -(-half // dp) * dp  # rounded up to a multiple of dp
      if nxt >= sizes[-1]:
        break
      sizes.append(nxt)
    return tuple(sizes)

  def prefill_size(self, group_size: int) -> int:
    """M, the prompts one prefill call runs for rollouts of group size G."""
    need = math.ceil(self.slots / group_size)
    m = self.prefill_prompts or need
    if m < need:
      raise ValueError(f"prefill_prompts={m} < ceil(slots / group_size) = {need}: a refill "
                       "could need a third prompt chunk while two are in use")
    if self.mesh is not None:  # M (and the store's 2M entries) split evenly over the batch axes
      from mr_rl.models import sharding as shd
      dp = shd.data_parallel_size(self.mesh)
      m = -(-m // dp) * dp
    return m

  def _put(self, x):
    """Host values as (replicated) device arrays for a program call."""
    if self.mesh is None:
      return jnp.asarray(x)
    from jax.sharding import NamedSharding, PartitionSpec
    return jax.device_put(x, NamedSharding(self.mesh, PartitionSpec()))

  # ------------------------------------------------------------------------------ stream
  def stream(self, params, prompts_BP, prompt_mask_BP, *, key: jax.Array,
             group_size: int = 1) -> Iterator[FinishedRow]:
    """Decodes G responses for each left-padded prompt; yields rows as they finish.

    Args:
      params: the model's parameters.
      prompts_BP: int `[B, P]` left-padded prompt tokens.
      prompt_mask_BP: `[B, P]`, 1 on real tokens; no empty rows.
      key: PRNG key (row n at step s draws from fold_in(fold_in(key, n), s)).
      group_size: G, responses per prompt.

    Yields:
      `FinishedRow`s in order of completion, each of the B * G rows exactly once.
    """
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
      raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    tokens_BP, mask_BP = prepare_prompts(prompts_BP, prompt_mask_BP, pad_id=self.pad_id,
                                         vocab_size=self.model.config.vocab_size,
                                         buckets=self.prompt_buckets)
    n_prompts, bucket = tokens_BP.shape
    group, rows, pool = group_size, n_prompts * group_size, self.slots
    m = self.prefill_size(group)
    progs = self.programs(pool, m)
    stats = self.last_stats = EngineStats(rows=rows)
    state, store = progs.init(key, bucket)
    slot_row = np.full((pool,), -1, np.int64)  # host view: row in each slot, -1 free
    free = collections.deque(range(pool))
    head, chunks = 0, 0  # next queued row; prompt chunks prefilled so far
    pending = []  # the previous call's finished rows, gathered on device

    while True:
      plan = np.concatenate([np.full((pool,), -1, np.int32), np.zeros((pool + 1,), np.int32)])
      while free and head < rows:
        prompt = head // group
        chunk = prompt // m
        if chunk >= chunks:  # prefill the next M prompts into the store half chunk % 2
          idx = np.minimum(np.arange(chunk * m, chunk * m + m), n_prompts - 1)  # pad: repeat
          store = progs.prefill(params, store, self._put(tokens_BP[idx]),
                                self._put(mask_BP[idx]), self._put(np.int32(chunk % 2)))
          chunks += 1
          stats.prefills += 1
        slot = free.popleft()
        plan[slot] = (chunk % 2) * m + prompt - chunk * m
        plan[pool + slot] = head
        slot_row[slot] = head
        head += 1
      if (slot_row < 0).all():
        break
      plan[-1] = head < rows
      state, report = progs.step(params, state, store, self._put(plan))
      for gathered, meta in pending:  # hand out the previous call's rows while this one runs
        yield from self._emit(gathered, meta)
      pending = []
      live, s, eos, steps, busy = unpack_report(_to_host(report), pool)
      stats.calls += 1
      stats.decode_steps += steps
      stats.slot_steps += steps * pool
      stats.busy_slot_steps += busy
      done = np.flatnonzero((slot_row >= 0) & ~live)
      for i in range(0, done.size, GATHER_ROWS):
        part = done[i:i + GATHER_ROWS]
        take = np.concatenate([part, np.full(GATHER_ROWS - part.size, part[0])]).astype(np.int32)
        pending.append((progs.gather(state, self._put(take)),
                        [(int(slot_row[n]), int(s[n]), not bool(eos[n])) for n in part]))
      slot_row[done] = -1
      free.extend(int(n) for n in done)
      n_live = int((slot_row >= 0).sum())
      if head >= rows and 0 < n_live <= progs.shrink_at:  # tail: compact into the next pool
        target = progs.shrink_at  # one level at a time: one `shrink` trace per pool size
        keep = np.concatenate([np.flatnonzero(slot_row >= 0), np.flatnonzero(slot_row < 0)])
        keep = keep[:target].astype(np.int32)
        state = progs.shrink(state, self._put(keep))
        slot_row, pool = slot_row[keep], target
        progs = self.programs(pool, m)
        free = collections.deque(int(n) for n in np.flatnonzero(slot_row < 0))
    for gathered, meta in pending:
      yield from self._emit(gathered, meta)

  def warm_up(self, params, prompts_BP, prompt_mask_BP, *, group_size: int) -> int:
    """Compiles every program `stream` runs for prompts of this batch's bucket (its init and
    prefill, and the step, gather and shrink of each pool size) with the arguments `stream`
    passes; `init` and each `shrink` run (one pool's memory, freed after). Returns how many
    programs were compiled (into the persistent cache, when it is on)."""
    tokens_BP, mask_BP = prepare_prompts(prompts_BP, prompt_mask_BP, pad_id=self.pad_id,
                                         vocab_size=self.model.config.vocab_size,
                                         buckets=self.prompt_buckets)
    n_prompts, bucket = tokens_BP.shape
    m = self.prefill_size(group_size)
    progs = self.programs(self.slots, m)
    state, store = progs.init(jax.random.PRNGKey(0), bucket)
    idx = np.arange(m) % n_prompts
    progs.prefill.lower(params, store, self._put(tokens_BP[idx]), self._put(mask_BP[idx]),
                        self._put(np.int32(0))).compile()
    count = 2
    for size in self.pool_sizes():
      progs = self.programs(size, m)
      plan = np.concatenate([np.full((size,), -1, np.int32), np.zeros((size + 1,), np.int32)])
      progs.step.lower(params, state, store, self._put(plan)).compile()
      progs.gather.lower(state, self._put(np.zeros((GATHER_ROWS,), np.int32))).compile()
      count += 2
      if progs.shrink_at:
        state = progs.shrink(state, self._put(np.arange(progs.shrink_at, dtype=np.int32)))
        count += 1
    return count

  @staticmethod
  def _emit(gathered, meta) -> Iterator[FinishedRow]:
    tokens_mS, logprobs_mS = (_to_host(a) for a in gathered)
    for i, (row, length, truncated) in enumerate(meta):
      yield FinishedRow(row=row, tokens=tokens_mS[i, :length].copy(),
                        logprobs=logprobs_mS[i, :length].copy(), length=length,
                        truncated=truncated)

  def __call__(self, params, prompts_BP, prompt_mask_BP, *, key: jax.Array, group_size: int = 1,
               on_finished: Optional[Callable[[FinishedRow], None]] = None) -> SampleOutput:
    """Decodes every row and assembles them (host numpy arrays, leading dim N = B * G).

    `on_finished(row)` is called for each `FinishedRow` as it completes (before the result
    is assembled). `steps` of the result counts decode steps over the slot pool.
    """
    rows = np.asarray(prompts_BP).shape[0] * group_size if np.ndim(prompts_BP) == 2 else 0
    tokens = np.full((rows, self.max_new_tokens), self.pad_id, np.int32)
    logprobs = np.zeros((rows, self.max_new_tokens), np.float32)
    lengths = np.zeros((rows,), np.int32)
    truncated = np.zeros((rows,), bool)
    for fin in self.stream(params, prompts_BP, prompt_mask_BP, key=key, group_size=group_size):
      tokens[fin.row, :fin.length] = fin.tokens
      logprobs[fin.row, :fin.length] = fin.logprobs
      lengths[fin.row] = fin.length
      truncated[fin.row] = fin.truncated
      if on_finished is not None:
        on_finished(fin)
    mask = (np.arange(self.max_new_tokens)[None, :] < lengths[:, None]).astype(np.int32)
    return SampleOutput(tokens=tokens, logprobs=logprobs, mask=mask, lengths=lengths,
                        truncated=truncated, steps=np.int32(self.last_stats.decode_steps))


@functools.lru_cache(maxsize=16)
def cached_engine(model, slots, max_new_tokens, temperature, top_k, top_p, eos_ids, pad_id,
                   prompt_buckets, mesh, cache_dtype) -> Engine:
  return Engine(model, slots=slots, max_new_tokens=max_new_tokens, temperature=temperature,
                top_k=top_k, top_p=top_p, eos_id=eos_ids, pad_id=pad_id,
                prompt_buckets=prompt_buckets, mesh=mesh, cache_dtype=cache_dtype)


def generate_continuous(model, params, prompts_BP, prompt_mask_BP, *, group_size: int,
                        key: jax.Array, slots: int, max_new_tokens: int,
                        temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                        eos_id: EosIds = None, pad_id: int = 0,
                        prompt_buckets: Optional[Sequence[int]] = None, mesh=None,
                        cache_dtype: Optional[str] = None,
                        on_finished: Optional[Callable[[FinishedRow], None]] = None
                        ) -> SampleOutput:
  """`generate_groups` on the continuous engine (leading dims `[B, G]`, host numpy).

  `slots` = 0 uses one slot per row (B * G). Engines are cached per (model, settings), so
  repeated calls do not recompile.
  """
  batch = np.asarray(prompts_BP).shape[0]
  if not isinstance(slots, int) or slots < 0:
    raise ValueError(f"slots must be an int >= 0 (0 = one per row), got {slots!r}")
  buckets = None if prompt_buckets is None else tuple(int(b) for b in prompt_buckets)
  engine = cached_engine(model, slots or batch * group_size, max_new_tokens, temperature, top_k,
                          top_p, normalize_eos(eos_id), pad_id, buckets, mesh,
                          None if cache_dtype is None else str(cache_dtype))
  out = engine(params, prompts_BP, prompt_mask_BP, key=key, group_size=group_size,
               on_finished=on_finished)
  regroup = lambda a: a.reshape((batch, group_size) + a.shape[1:])
  return out.replace(tokens=regroup(out.tokens), logprobs=regroup(out.logprobs),
                     mask=regroup(out.mask), lengths=regroup(out.lengths),
                     truncated=regroup(out.truncated))
