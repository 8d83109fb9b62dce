"""Jitted KV-cache sampler: bucketed prefill plus a `lax.while_loop` decode.

Shape letters (docs/shapes.md): N rows decoded together, one prompt copy each
(`generate_groups` decodes its B prompts x G responses as N = B * G rows; `Sampler` and
`generate` see only rows); P prompt columns (as given, then the prompt bucket the sampler
re-pads to); S response columns (max_new_tokens); C key/value slots of the cache; V
vocabulary. The decode step `s` (0 <= s < S) writes response column s.

Layout of one call (all inside a single `jax.jit`):

  * Prompts arrive left-padded, `[N, P]` with a mask (1 on real tokens). On the host they
    are trimmed of all-padding columns and left-padded again to a *prompt bucket* of `P`
    columns (powers of two by default, or a configured list), so one compilation serves every
    prompt length in the bucket. The compile key is (N, P, settings); the settings,
    `max_new_tokens` included, are fixed per `Sampler`.
  * The KV cache is allocated once, at its final `P + S` slots (on TPU rounded up to a
    multiple of 128, `cache_slots`), and every write goes into it in place. Prefill runs the first `P - 1` prompt tokens through the model, writing
    slots `[0, P - 1)` (its attention covers the prompt's columns only, reading no cache
    slot; its logits are unused and compiled away).
  * Decode step `s` (s = 0 .. S-1) feeds one token per row -- the last prompt token at
    s = 0, the token sampled at step s-1 afterwards -- into slot `P - 1 + s`, at per-row
    position `len_n - 1 + s` (`len_n` = real prompt length of row n), and samples token `s`.
  * Attention does not read the whole cache: decoding runs in a few *segments*; each
    segment is its own `lax.while_loop` whose attention reads a static prefix window of the
    cache just large enough for that segment (`P + end_of_segment` slots; the Transformer's
    `attend_len`), while the steps write into the one full-length cache. Attention therefore
    never scans far past the filled slots, which is where a fixed-length loop loses most of
    its time on CPU (docs/architecture.md, "Sampling"), and the cache is held once (no copy
    per segment: XLA:TPU's memory report, docs/accelerators.md).
  * The loop stops when every row has produced EOS or after `max_new_tokens` tokens. The
    PRNG key travels in the loop state, as in gemma's `text/_sampler_loop.py` (which splits
    it every step); here the base key is carried unchanged from step to step and segment to
    segment, and step `s` draws all rows' tokens with `fold_in(key, s)`, so a draw depends
    only on (key, s), not on the segment layout (docs/style.md §6). With
    `key_schedule="row"` row n draws from `fold_in(fold_in(key, n), s)` instead, the schedule
    of the continuous engine (`engine.py`), where a row's draws cannot depend on its batch
    position.

Returned log-probabilities are those of the *policy* -- `log_softmax(logits)` at
temperature 1 with no top-k/top-p filter -- at the sampled tokens, so the RL update can
use them as `logp_old` (docs/methods.md §4): they equal a fresh forward pass over the
generated sequence. Tokens after EOS are `pad_id` with log-prob 0 and mask 0; the EOS
token itself is part of the response (mask 1).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Optional, Sequence, Union

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import compilation
from mr_rl.models import init_cache, positions_from_mask
from mr_rl.models.layers import cache_batch, cache_length
from mr_rl.sampling import processing

EosIds = Union[None, int, Sequence[int]]

# Smallest default prompt bucket; buckets are powers of two from here up.
MIN_PROMPT_BUCKET = 8
# Default number of generated tokens per attention-window segment.
DEFAULT_SEGMENT_TOKENS = 64
# Upper bound on the number of segments (each one is a separately compiled loop body).
MAX_SEGMENTS = 8
# On TPU the cache's length and each segment's attention window are rounded up to a multiple
# of this many slots (the lane width): XLA:TPU lays out a loop's cache for the width its
# attention reads, and widths off the 128-lane grid got the keys' other layout, a full copy of
# the cache between segments.
TPU_WINDOW_ALIGN = 128
# Key schedules of sampled draws (see `Sampler`).
KEY_SCHEDULES = ("step", "row")


@flax.struct.dataclass
class SampleOutput:
  """Result of `generate` (leading dims `[N]`, or `[B, G]` from `generate_groups`).

  Attributes:
    tokens: int32 `[..., S]`, generated tokens; `pad_id` after EOS / after the stop.
    logprobs: float32 `[..., S]`, policy log-prob `log_softmax(logits)[token]` at
      temperature 1 (unfiltered); 0 where `mask` is 0.
    mask: int32 `[..., S]`, 1 on generated tokens (EOS included), 0 on padding.
    lengths: int32 `[...]`, number of generated tokens including EOS (= `mask.sum(-1)`).
    truncated: bool `[...]`, True iff the row did not produce EOS within `max_new_tokens`
      (always True when `eos_id` is None).
    steps: int32 scalar, decode steps actually run (< S when every row stopped early).
  """

  tokens: jax.Array
  logprobs: jax.Array
  mask: jax.Array
  lengths: jax.Array
  truncated: jax.Array
  steps: jax.Array


@flax.struct.dataclass
class DecodeState:
  """The decode loop's carry (`Sampler`'s `lax.while_loop` state; the continuous engine's is
  `slots.SlotState`).

  Attributes:
    s: int32 scalar, the decode step (response column written next).
    cache: the KV cache (`init_cache`), all its C = P + S slots (on TPU rounded up to the
      128 lanes, `cache_slots`).
    kv_mask: bool [N, C], filled real key columns.
    x: int32 [N], the token fed at the next step (the last prompt token first).
    done: bool [N], the row has produced EOS.
    tokens: int32 [N, S], the responses so far (`pad_id` after EOS and past step s).
    logprobs: float32 [N, S], their temperature-1 policy log-probs (0 where not generated).
    lengths: int32 [N], tokens generated per row (EOS included).
    key: the base PRNG key, carried unchanged: step s draws with `fold_in(key, s)`.
  """
  s: jax.Array
  cache: tuple
  kv_mask: jax.Array
  x: jax.Array
  done: jax.Array
  tokens: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  key: jax.Array


def prompt_bucket(length: int, buckets: Optional[Sequence[int]] = None) -> int:
  """Smallest bucket >= `length` (powers of two >= MIN_PROMPT_BUCKET when buckets is None)."""
  if length < 1:
    raise ValueError(f"prompt length must be >= 1, got {length}")
  if buckets is None:
    return max(MIN_PROMPT_BUCKET, 1 << (length - 1).bit_length())
  for b in sorted(buckets):
    if b >= length:
      return int(b)
  raise ValueError(f"prompt length {length} exceeds the largest prompt bucket {max(buckets)}")


def segment_ends(max_new_tokens: int, segment_tokens: int) -> tuple[int, ...]:
  """End steps (exclusive) of the decode segments, e.g. S=256, 64 -> (64, 128, 192, 256).

  The segment length is raised so that there are at most MAX_SEGMENTS segments.
  """
  seg = max(segment_tokens, math.ceil(max_new_tokens / MAX_SEGMENTS))
  return tuple(min(e, max_new_tokens) for e in range(seg, max_new_tokens + seg, seg))


def cache_slots(bucket: int, max_new_tokens: int, align: int = 1, max_len: int = 0) -> int:
  """Slots of the sampler's cache: P + S, rounded up to a multiple of `align` if that fits in
  `max_len` (the model's max_seq_len; 0: no limit)."""
  slots = -(-(bucket + max_new_tokens) // align) * align
  return slots if not max_len or slots <= max_len else bucket + max_new_tokens


def segment_windows(bucket: int, max_new_tokens: int, ends: Sequence[int],
                    align: int = 1, max_len: int = 0) -> tuple[tuple[int, int], ...]:
  """(end step, attention window) of each decode loop: the window P + end rounded up to a
  multiple of `align` (at most the cache's `cache_slots`); segments whose windows come out
  equal run as one loop."""
  loops = []
  slots = cache_slots(bucket, max_new_tokens, align, max_len)
  for end in ends:
    window = min(slots, -(-(bucket + end) // align) * align)
    if loops and loops[-1][1] == window:
      loops.pop()
    loops.append((end, window))
  return tuple(loops)


def prepare_prompts(prompts_NP, prompt_mask_NP, *, pad_id: int, vocab_size: int,
                    buckets: Optional[Sequence[int]] = None) -> tuple[np.ndarray, np.ndarray]:
  """Validates a left-padded prompt batch `[N, P]` and re-pads it (host numpy, int32) to the
  prompt bucket of its longest row: the layout `Sampler` and the continuous engine decode."""
  tokens = np.asarray(prompts_NP)
  mask = np.asarray(prompt_mask_NP)
  if tokens.ndim != 2:
    raise ValueError(f"prompts_NP must be [N, P] (rows, prompt columns), got shape "
                     f"{tokens.shape}")
  if mask.shape != tokens.shape:
    raise ValueError(f"prompt_mask_NP shape {mask.shape} != prompts_NP shape {tokens.shape}")
  if not np.issubdtype(tokens.dtype, np.integer):
    raise TypeError(f"prompts_NP must hold integer token ids, got dtype {tokens.dtype}")
  mask = mask.astype(bool)
  lengths = mask.sum(axis=1)
  if (lengths == 0).any():
    raise ValueError(f"prompt_mask_NP has empty rows: {np.flatnonzero(lengths == 0).tolist()}")
  if (np.diff(mask.astype(np.int8), axis=1) < 0).any():
    raise ValueError("prompt_mask_NP must be left-padded (each row 0...0 1...1)")
  if tokens[mask].min() < 0 or tokens[mask].max() >= vocab_size:
    raise ValueError(f"prompts_NP holds token ids outside [0, {vocab_size})")
  longest = int(lengths.max())
  bucket = prompt_bucket(longest, buckets)
  batch = tokens.shape[0]
  out_tokens = np.full((batch, bucket), pad_id, dtype=np.int32)
  out_mask = np.zeros((batch, bucket), dtype=np.int32)
  out_tokens[:, bucket - longest:] = np.where(mask, tokens, pad_id)[:, -longest:]
  out_mask[:, bucket - longest:] = mask[:, -longest:]
  return out_tokens, out_mask


def normalize_eos(eos_id: EosIds) -> tuple[int, ...]:
  if eos_id is None:
    return ()
  ids = (eos_id,) if isinstance(eos_id, (int, np.integer)) else tuple(eos_id)
  for e in ids:
    if not isinstance(e, (int, np.integer)) or isinstance(e, bool) or e < 0:
      raise ValueError(f"eos_id must be None, a non-negative int or a sequence of them, got "
                       f"{eos_id!r}")
  return tuple(int(e) for e in ids)


def _pad_seq_axis(x: jax.Array, extra: int) -> jax.Array:
  """Zero-pads axis 1 (the key mask's sequence axis) by `extra` slots."""
  return jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2))


class Sampler:
  """A compiled sampler for one model and one set of decode settings.

  Create once and reuse: each (rows N, prompt bucket P) pair compiles once.

  Args:
    model: an `mr_rl.models.Transformer`.
    max_new_tokens: S, the cap on generated tokens per row.
    temperature: 0 for greedy decoding.
    top_k: 0 disables the filter.
    top_p: 1.0 disables the filter.
    eos_id: None (never stop early), one id, or a sequence of ids.
    pad_id: token written after EOS.
    prompt_buckets: sorted prompt-length buckets; None for powers of two.
    segment_tokens: decode steps per attention-window segment (see module docstring).
    cache_dtype: KV-cache dtype (default: init_cache's default, the model's dtype).
    mesh: optional `jax.sharding.Mesh`; prompts are placed row-sharded, the KV cache is
      constrained to `sharding.cache_shardings` and the model's logical activation
      constraints bind to the mesh (params should already be sharded, e.g. by
      `load_pretrained(..., mesh=mesh)`).
    rules: logical axis rules for the mesh (default `sharding.DEFAULT_RULES`).
    max_traces: if set, raise (chex.assert_max_traces) when the jitted body is traced
      more often than this -- a guard against silent recompiles.
    key_schedule: "step" (default): step s draws all rows' uniforms from `fold_in(key, s)`, so
      a row's draw depends on its batch position; "row": row n draws from
      `fold_in(fold_in(key, n), s)` (`processing.row_step_keys`), the schedule of the
      continuous engine (`engine.py`), whose draws do not depend on the slot a row gets.
  """

  def __init__(self, model, *, max_new_tokens: int, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, eos_id: EosIds = None, pad_id: int = 0,
               prompt_buckets: Optional[Sequence[int]] = None,
               segment_tokens: int = DEFAULT_SEGMENT_TOKENS, cache_dtype=None, mesh=None,
               rules=None, max_traces: Optional[int] = None, key_schedule: str = "step"):
    if (not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool)
        or max_new_tokens < 1):
      raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not isinstance(pad_id, int) or pad_id < 0:
      raise ValueError(f"pad_id must be a non-negative int, got {pad_id!r}")
    if not isinstance(segment_tokens, int) or segment_tokens < 1:
      raise ValueError(f"segment_tokens must be an int >= 1, got {segment_tokens!r}")
    if key_schedule not in KEY_SCHEDULES:
      raise ValueError(f"key_schedule must be one of {KEY_SCHEDULES}, got {key_schedule!r}")
    if prompt_buckets is not None:
      prompt_buckets = tuple(int(b) for b in prompt_buckets)
      if not prompt_buckets or min(prompt_buckets) < 1:
        raise ValueError(f"prompt_buckets must be positive lengths, got {prompt_buckets!r}")
    self.model = model
    self.max_new_tokens = max_new_tokens
    self.sampling = processing.SamplingParams(temperature, top_k, top_p)
    self.eos_ids = normalize_eos(eos_id)
    self.pad_id = pad_id
    self.prompt_buckets = prompt_buckets
    self.segments = segment_ends(max_new_tokens, segment_tokens)
    self.cache_dtype = cache_dtype
    self.mesh = mesh
    self.rules = rules
    self.key_schedule = key_schedule
    fn = self._sample
    if max_traces is not None:
      fn = chex.assert_max_traces(fn, n=max_traces)
    self._jitted = jax.jit(compilation.program("sampler", fn))

  # ----------------------------------------------------------------------------- host side
  def prepare(self, prompts_NP, prompt_mask_NP) -> tuple[np.ndarray, np.ndarray]:
    """Validates a left-padded batch and re-pads it to its prompt bucket (host numpy)."""
    return prepare_prompts(prompts_NP, prompt_mask_NP, pad_id=self.pad_id,
                           vocab_size=self.model.config.vocab_size, buckets=self.prompt_buckets)

  def __call__(self, params, prompts_NP, prompt_mask_NP, *, key: jax.Array) -> SampleOutput:
    """Samples up to `max_new_tokens` tokens for each left-padded prompt row (`[N, P]`)."""
    args, context = self._placed(params, prompts_NP, prompt_mask_NP, key)
    with context:
      return self._jitted(*args)

  def lower(self, params, prompts_NP, prompt_mask_NP, *, key: jax.Array):
    """The `jax.stages.Lowered` program a call with these arguments runs (for inspecting its
    HLO or cost analysis, e.g. `.compile().as_text()`)."""
    args, context = self._placed(params, prompts_NP, prompt_mask_NP, key)
    with context:
      return self._jitted.lower(*args)

  def _placed(self, params, prompts_NP, prompt_mask_NP, key):
    """Bucketed prompts placed for the jitted body (row-sharded on a mesh), and the context
    the body must be traced and run in (the mesh's logical activation rules)."""
    tokens_NP, mask_NP = self.prepare(prompts_NP, prompt_mask_NP)
    if self.mesh is None:
      return (params, tokens_NP, mask_NP, key), contextlib.nullcontext()
    from mr_rl.models import sharding as shd
    batch_sh = shd.batch_sharding(self.mesh, tokens_NP.shape, self.rules)
    tokens_NP, mask_NP = jax.device_put((tokens_NP, mask_NP), batch_sh)
    return ((params, tokens_NP, mask_NP, key),
            shd.activation_sharding(self.mesh, self.rules))

  # ------------------------------------------------------------------------------- device
  def _apply(self, params, tokens, positions, kv_mask_NC, cache, cache_index, attend_len=None):
    """One model call on tokens / positions [N, T] (T = P - 1 at prefill, 1 per decode step);
    attention reads the cache's first `attend_len` slots (default all)."""
    return self.model.apply({"params": params}, tokens, positions, kv_mask_NC=kv_mask_NC,
                            cache=cache, cache_index=cache_index, attend_len=attend_len)

  def _platform(self) -> str:
    """The platform the program is compiled for: the mesh's devices', else the default
    backend's."""
    if self.mesh is not None:
      return self.mesh.devices.flat[0].platform
    return jax.default_backend()

  def _constrain_cache(self, cache):
    if self.mesh is None:
      return cache
    from mr_rl.models import sharding as shd
    batch, length = cache_batch(cache), cache_length(cache)
    return jax.lax.with_sharding_constraint(
        cache, shd.cache_shardings(self.model.config, self.mesh, batch, length, self.rules))

  def _sample(self, params, tokens_NP, mask_NP, key) -> SampleOutput:
    rows, bucket = tokens_NP.shape
    n_new = self.max_new_tokens
    mask_NP = mask_NP.astype(jnp.bool_)
    len_N = jnp.sum(mask_NP, axis=1, dtype=jnp.int32)
    row_N = jnp.arange(rows, dtype=jnp.int32)  # row indices of the "row" key schedule

    # The cache is allocated once, at its final P + S slots, and written in place from the
    # prefill to the last step. Prefill: slots [0, P-1), its attention the self-attention of
    # the prompt's columns (it reads no cache slot). Its logits are never used, so XLA drops
    # the LM head.
    # On TPU the cache's length and the windows are multiples of the 128 lanes (one layout).
    align = TPU_WINDOW_ALIGN if self._platform() == "tpu" else 1
    max_len = self.model.config.max_seq_len
    slots = cache_slots(bucket, n_new, align, max_len)
    cache = self._constrain_cache(
        init_cache(self.model.config, rows, slots, dtype=self.cache_dtype))
    kv_mask_NC = _pad_seq_axis(mask_NP, slots - bucket)
    if bucket > 1:
      _, cache = self._apply(params, tokens_NP[:, :-1], positions_from_mask(mask_NP)[:, :-1],
                             kv_mask_NC, cache, 0)  # (a static 0: the self-attention kernel)
      cache = self._constrain_cache(cache)

    state = DecodeState(
        s=jnp.int32(0),
        cache=cache,
        kv_mask=kv_mask_NC,
        x=tokens_NP[:, -1],
        done=jnp.zeros((rows,), jnp.bool_),
        tokens=jnp.full((rows, n_new), self.pad_id, jnp.int32),
        logprobs=jnp.zeros((rows, n_new), jnp.float32),
        lengths=jnp.zeros((rows,), jnp.int32),
        key=key,
    )

    def body(st: DecodeState, window: int) -> DecodeState:
      """Decode step s; attention reads the cache's first `window` slots (the segment's)."""
      s = st.s
      slot = bucket - 1 + s
      kv_mask = jax.lax.dynamic_update_slice(st.kv_mask, jnp.ones((rows, 1), jnp.bool_),
                                             (jnp.int32(0), slot))
      pos_N1 = (len_N - 1 + s)[:, None]
      logits_N1V, cache = self._apply(params, st.x[:, None], pos_N1, kv_mask, st.cache, slot,
                                      attend_len=window)
      logits_NV = logits_N1V[:, 0]
      if self.key_schedule == "row":
        tok_N = processing.sample_tokens_rows(
            logits_NV, processing.row_step_keys(st.key, row_N, jnp.full((rows,), s)),
            self.sampling)
      else:
        tok_N = processing.sample_tokens(logits_NV, jax.random.fold_in(st.key, s),
                                         self.sampling)
      lp_N = processing.token_log_probs(logits_NV, tok_N)
      live_N = ~st.done
      tok_N = jnp.where(live_N, tok_N, self.pad_id)
      lp_N = jnp.where(live_N, lp_N, 0.0)
      done_N = st.done
      for e in self.eos_ids:
        done_N = done_N | (tok_N == e)
      zero = jnp.int32(0)
      return st.replace(
          s=s + 1,
          cache=cache,
          kv_mask=kv_mask,
          x=tok_N,
          done=done_N,
          tokens=jax.lax.dynamic_update_slice(st.tokens, tok_N[:, None], (zero, s)),
          logprobs=jax.lax.dynamic_update_slice(st.logprobs, lp_N[:, None], (zero, s)),
          lengths=st.lengths + live_N.astype(jnp.int32),
      )

    # One loop per segment over the same full-length cache (no copy between segments); its
    # attention reads a static prefix window of P + end slots (on TPU rounded up to the lanes).
    for end, window in segment_windows(bucket, n_new, self.segments, align, max_len):
      state = jax.lax.while_loop(
          lambda st, end=end: (st.s < end) & ~jnp.all(st.done),
          functools.partial(body, window=window), state)

    lengths_N = state.lengths
    mask_NS = (jnp.arange(n_new)[None, :] < lengths_N[:, None]).astype(jnp.int32)
    return SampleOutput(tokens=state.tokens, logprobs=state.logprobs, mask=mask_NS,
                        lengths=lengths_N, truncated=~state.done, steps=state.s)


@functools.lru_cache(maxsize=32)
def cached_sampler(model, max_new_tokens, temperature, top_k, top_p, eos_ids, pad_id,
                    prompt_buckets, mesh, cache_dtype=None, key_schedule="step") -> Sampler:
  return Sampler(model, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                 top_p=top_p, eos_id=eos_ids, pad_id=pad_id, prompt_buckets=prompt_buckets,
                 mesh=mesh, cache_dtype=cache_dtype, key_schedule=key_schedule)


def generate(model, params, prompts_NP, prompt_mask_NP, *, key: jax.Array, max_new_tokens: int,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, eos_id: EosIds = None,
             pad_id: int = 0, prompt_buckets: Optional[Sequence[int]] = None,
             mesh=None, cache_dtype: Optional[str] = None,
             key_schedule: str = "step") -> SampleOutput:
  """Samples continuations of a left-padded prompt batch (functional form of `Sampler`).

  Args:
    model: an `mr_rl.models.Transformer`.
    params: its parameters (the tree under "params").
    prompts_NP: int `[N, P]` left-padded prompt tokens.
    prompt_mask_NP: `[N, P]`, 1 on real tokens, 0 on left padding; no empty rows.
    key: PRNG key (ignored when temperature == 0).
    max_new_tokens: S.
    temperature, top_k, top_p: see `processing.SamplingParams` (temperature 0 = greedy).
    eos_id: None, one id or several; rows stop after producing one of them.
    pad_id: token id written after EOS.
    prompt_buckets: prompt-length buckets (None: powers of two).
    mesh: optional device mesh (see `Sampler`).
    cache_dtype: KV-cache dtype name (None: the model's dtype).
    key_schedule: "step" or "row" (see `Sampler`).

  Returns:
    SampleOutput with `[N, S]` tokens / logprobs / mask and `[N]` lengths / truncated.
    Compiled samplers are cached per (model, settings), so repeated calls do not retrace.
  """
  eos_ids = normalize_eos(eos_id)
  buckets = None if prompt_buckets is None else tuple(int(b) for b in prompt_buckets)
  sampler = cached_sampler(model, max_new_tokens, temperature, top_k, top_p, eos_ids, pad_id,
                            buckets, mesh, None if cache_dtype is None else str(cache_dtype),
                            key_schedule)
  return sampler(params, prompts_NP, prompt_mask_NP, key=key)


def repeat_groups(prompts_BP, prompt_mask_BP, group_size: int) -> tuple[np.ndarray, np.ndarray]:
  """Repeats each prompt row `group_size` times: `[B, P] -> [B * G, P]` (row b*G + g)."""
  if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
    raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
  return (np.repeat(np.asarray(prompts_BP), group_size, axis=0),
          np.repeat(np.asarray(prompt_mask_BP), group_size, axis=0))


def generate_groups(model, params, prompts_BP, prompt_mask_BP, *, group_size: int,
                    key: jax.Array, **kwargs) -> SampleOutput:
  """GRPO group sampling: G independent samples per prompt (leading dims `[B, G]`).

  Each prompt is repeated G times and the N = B * G rows (row b*G + g) are decoded as one
  batch; every row draws its own noise, so the G responses of a prompt are independent
  samples.

  Returns:
    SampleOutput whose fields have leading dims `[B, G]` (e.g. tokens `[B, G, S]`).
  """
  batch = np.asarray(prompts_BP).shape[0]
  rep_tokens, rep_mask = repeat_groups(prompts_BP, prompt_mask_BP, group_size)
  out = generate(model, params, rep_tokens, rep_mask, key=key, **kwargs)
  regroup = lambda a: a.reshape((batch, group_size) + a.shape[1:])
  return out.replace(tokens=regroup(out.tokens), logprobs=regroup(out.logprobs),
                     mask=regroup(out.mask), lengths=regroup(out.lengths),
                     truncated=regroup(out.truncated))
