"""The learner batch: the one type the policy step, the anchor election and the metrics read.

`make_batch` is the only place it is built: from a rollout and its group advantages, over
N = B*G rows (row b*G + g) and T columns (prompt then response), optionally with PPO's
targets (GAE on the critic's values) or packed (several sequences per row). Shape letters
follow `docs/shapes.md`.

Columns are length-aware (`trim`): the batch keeps the longest used prompt plus the longest
response that enters the loss, rounded up by `column_bucket`, so a run compiles the step
for a few widths only. Cut columns hold only padding (prompts are left-padded, responses
right-padded), so every loss and metric is unchanged up to float summation order.

The LM head only where a loss needs it: an unpacked batch records `response_start`, a static
column (part of the compiled program, not an array) at or before its first response column,
rounded down to `response_start_bucket` (the `size_bucket` grid or P itself), and the policy
step runs the head over columns [response_start - 1, T - 1) only. A run compiles one step
per (width, response start) pair met (docs/architecture.md, "The learner
batch"). Packed rows keep the head on every column (`response_start` None): their sequences'
responses start at data-dependent columns.

Packing (`pack=PackSpec(...)`): every sequence that carries a loss token is written, without
its padding, back to back into rows of width `column_bucket(longest sequence)`, first-fit
decreasing; `segment_ids` (1, 2, ... per sequence, 0 on the row's tail) restart positions
and keep attention inside each sequence. The aggregation weights are computed on the
unpacked rows first (a packed row is not a sequence), so the packed step gives the unpacked
loss, gradients and metrics up to float summation order. Row counts are rounded up to
`row_multiple` (micro-batches x data shards) times a `fine_bucket` (`PACKED_ROWS_PER_OCTAVE`
sizes per octave: a padding row costs a full row of compute, so the coarser `size_bucket` of
the widths, up to 1.5x, would undo most of what packing saves).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import distributed
from mr_rl.rl import gae
from mr_rl.rl.losses import token_logprobs_and_entropy, token_weights

MIN_COLUMN_BUCKET = 8
PACKED_ROWS_PER_OCTAVE = 16  # packed row counts: `fine_bucket`, at most 6.25% padding rows


def size_bucket(n: int, minimum: int = 1) -> int:
  """Smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (2^k and 3 * 2^(k-1)) that is >= n.

  The widths and row counts the update compiles for: at most 1.5x the size in use, and two
  shapes per octave, so a run compiles at most ~2 log2(cap / minimum) + 2 sizes per axis.
  `minimum` must itself be one of the sizes.
  """
  n = max(int(n), int(minimum))
  p = 1
  while True:
    if p >= n:
      return p
    if p >= 2 and p * 3 // 2 >= n:
      return p * 3 // 2
    p *= 2


def fine_bucket(n: int, per_octave: int = 8) -> int:
  """Smallest size >= n on a grid of `per_octave` sizes per octave: every integer up to
  2 x `per_octave`, then 2^k + j 2^k / per_octave (j = 0 .. per_octave - 1); `per_octave` a
  power of two. At most 1 + 1 / per_octave times n: the packed row counts, where a row of
  padding costs as much as a row of tokens (docs/architecture.md, "The learner
  batch"; figures in docs/benchmarks.md)."""
  if per_octave < 1 or per_octave & (per_octave - 1):
    raise ValueError(f"per_octave must be a power of two, got {per_octave}")
  n = max(int(n), 1)
  if n <= per_octave:
    return n
  step = (1 << (n.bit_length() - 1)) // per_octave
  return -(-n // step) * step


def column_bucket(n: int, cap: int) -> int:
  """Columns kept for `n` used ones: `size_bucket(n, MIN_COLUMN_BUCKET)`, at most `cap`."""
  return min(size_bucket(n, MIN_COLUMN_BUCKET), int(cap))


def response_buckets(S: int, n: int) -> tuple[int, ...]:
  """The n response widths of `make_batch(column_buckets=n)`: S, then halved (rounded up to a
  multiple of 8), down to `MIN_COLUMN_BUCKET`, smallest first; fewer when S is small."""
  if n < 1:
    raise ValueError(f"column_buckets must be >= 1 here, got {n}")
  out = [int(S)]
  while len(out) < n:
    nxt = max(MIN_COLUMN_BUCKET, -(-(-(-out[-1] // 2)) // 8) * 8)
    if nxt >= out[-1]:
      break
    out.append(nxt)
  return tuple(sorted(out))


def response_start_bucket(p_w: int, P: int) -> int:
  """The static response start of a batch whose responses begin at column `p_w` (>= 1): the
  largest of P and the `size_bucket` sizes (1, 2, 3, 4, 6, 8, ...) that is <= `p_w`. At
  least 2/3 of `p_w`, and exactly `p_w` when the prompt side is its full width P (the usual
  case once responses are shorter than the cap, since the trimmed width's slack goes to the
  prompt side first)."""
  p_w, P = int(p_w), int(P)
  if p_w < 1:
    raise ValueError(f"the response start must be >= 1 (column 0 predicts nothing), got {p_w}")
  if p_w >= P:
    return P if p_w == P else p_w  # p_w > P only for hand-built batches: keep it exact
  best, n = 1, 1
  while True:
    n = size_bucket(n + 1)
    if n > p_w:
      return best
    best = n


@flax.struct.dataclass
class LearnerBatch:
  """What one policy step consumes: N rows x T columns (host or device arrays).

  Attributes:
    tokens: int32 [N, T], prompt then response (prompts left-padded, responses
      right-padded; packed rows: sequences back to back).
    mask: [N, T], 1 on real (prompt or response) tokens.
    response_mask: [N, T], 1 on the response tokens that enter the loss (never column 0).
    old_logp: float32 [N, T], the behaviour policy's (the sampler's) log-probs of
      `tokens[:, t]`, 0 off the response.
    advantages: float32 [N] per row (group-relative estimators) or [N, T] per token (PPO's
      GAE; packed rows).
    weights: float32 [N, T] loss-aggregation weights, or None: the step computes them from
      `response_mask` over the whole batch (`mr_rl.rl.losses.token_weights`). Packed batches
      carry the weights of their unpacked rows.
    metric_weights: float32 [N, T] token-mean weights of the metrics (None: as `weights`).
    segment_ids: int32 [N, T] packed rows only: 1, 2, ... per sequence, 0 on padding.
    ref_logp: float32 [N, T] reference-policy log-probs (the KL penalty), or None.
    returns, old_values: float32 [N, T] PPO's GAE returns and the critic's values at rollout
      time, or None.
    response_start: a static int (not an array: part of the step's compiled shape) or None:
      `response_mask` is 0 on every column before it, so the step applies the LM head to
      columns [response_start - 1, T - 1) only; None: the head runs over every column.
  """
  tokens: Any
  mask: Any
  response_mask: Any
  old_logp: Any
  advantages: Any
  weights: Any = None
  metric_weights: Any = None
  segment_ids: Any = None
  ref_logp: Any = None
  returns: Any = None
  old_values: Any = None
  response_start: Optional[int] = flax.struct.field(pytree_node=False, default=None)

  @property
  def shape(self) -> tuple[int, int]:
    """(N, T)."""
    return tuple(self.tokens.shape)

  def fields(self) -> tuple[str, ...]:
    """Names of the fields that hold arrays (not None)."""
    return tuple(f.name for f in dataclasses.fields(self)
                 if f.name != "response_start" and getattr(self, f.name) is not None)

  def check(self) -> "LearnerBatch":
    """Raises ValueError naming a field whose shape is not [N, T] (advantages: [N] or
    [N, T]); returns the batch."""
    N, T = self.shape
    for name in self.fields():
      shape = tuple(np.shape(getattr(self, name)))
      ok = shape in ((N,), (N, T)) if name == "advantages" else shape == (N, T)
      if not ok:
        want = f"({N},) or ({N}, {T})" if name == "advantages" else f"({N}, {T})"
        raise ValueError(f"LearnerBatch.{name} has shape {shape}, expected {want}")
    if (self.weights is None) != (self.metric_weights is None):
      raise ValueError("LearnerBatch.weights and metric_weights are given together or not at all")
    if (self.returns is None) != (self.old_values is None):
      raise ValueError("LearnerBatch.returns and old_values are given together (PPO) or not at "
                       "all")
    r0 = self.response_start
    if r0 is not None:
      if not isinstance(r0, (int, np.integer)) or not 1 <= r0 < T:
        raise ValueError(f"LearnerBatch.response_start must be an int in [1, T={T}) or None, "
                         f"got {r0!r}")
      if self.segment_ids is not None:
        raise ValueError("LearnerBatch.response_start is for unpacked rows; packed rows "
                         "(segment_ids) keep the LM head on every column")
      if isinstance(self.response_mask, np.ndarray) and self.response_mask[:, :r0].any():
        raise ValueError(f"LearnerBatch.response_mask has loss tokens before response_start="
                         f"{r0}")
    return self


@dataclasses.dataclass(frozen=True)
class PackSpec:
  """How `make_batch` packs rows: the loss aggregation (for the unpacked rows' weights) and
  the row multiple (micro-batches x data shards)."""
  loss_agg: str
  norm_len: Optional[int]
  row_multiple: int


@dataclasses.dataclass(frozen=True)
class PPOTargets:
  """What `make_batch` needs for PPO: the critic's values of a batch's columns
  (`values_fn(tokens_NT, mask_NT) -> values_NT`), the scalar rewards R[B, G] and GAE's
  gamma and lambda (docs/methods.md §3)."""
  values_fn: Callable[[Any, Any], Any]
  R_BG: Any
  gamma: float = 1.0
  lam: float = 1.0


def make_batch(ro, advantages_BG=None, *, loss_rows_BG=None, trim: bool = True,
               column_buckets: int = 0, ppo: PPOTargets | None = None,
               pack: PackSpec | None = None, policy_mask_BGS=None) -> LearnerBatch:
  """The learner batch of a rollout (`mr_rl.rollout.Rollout`).

  Args:
    ro: the rollout (B prompts x G responses, host arrays).
    advantages_BG: group-relative advantages [B, G] (None with `ppo`), or [B, G, S] per
      response token (multi-turn per-turn credit, `mr_rl.multiturn.credit`).
    loss_rows_BG: optional bool [B, G]; False rows keep their tokens but get response mask 0,
      so they enter no loss, normaliser or metric (DAPO overlong filtering; dynamic
      sampling's unfilled slots). They do not count towards the trimmed width, and packing
      leaves them out.
    trim: keep only the columns in use (module docstring); else T = P + S.
    column_buckets: with `trim`, 0 = the fine grid (widths on `column_bucket`, response starts
      on `response_start_bucket`: least padding, O(log^2) shapes); n > 0 = the whole prompt
      width P and the smallest of the n `response_buckets` that holds the longest response
      (n shapes, response start P: what an accelerator run compiles, docs/accelerators.md).
    ppo: PPO's targets: advantages and returns per token from GAE on the critic's values.
    pack: pack the rows (module docstring); GRPO family only.
    policy_mask_BGS: optional [B, G, S], 1 on the response tokens the policy sampled: a
      multi-turn rollout's observation tokens (`ro.mask` 1: attended to) get loss mask 0
      (docs/multiturn.md). The kept columns are `ro.mask`'s.

  Returns:
    A checked `LearnerBatch` of host (numpy) arrays, the same on every process; the learner
    places it on the mesh (`Learner.place_batch`).
  """
  if (advantages_BG is None) == (ppo is None):
    raise ValueError("make_batch takes group advantages_BG or ppo targets (exactly one)")
  if ppo is not None and pack is not None:
    raise ValueError("packed learner batches are for the GRPO family; PPO's critic and GAE run "
                     "on unpacked rows")
  B, G, S = ro.tokens.shape
  P = ro.prompt_tokens.shape[1]
  N = B * G
  resp = ro.mask.reshape(N, S)
  loss_resp = resp
  if loss_rows_BG is not None:
    keep_N = np.asarray(loss_rows_BG, bool).reshape(N)
    loss_resp = resp * keep_N[:, None].astype(resp.dtype)
  if trim and column_buckets:  # the prompt side whole, the response side on n buckets
    s_used = max(int(loss_resp.sum(1).max()), 1)
    p_w, s_w = P, next(b for b in response_buckets(S, column_buckets) if b >= s_used)
  elif trim:  # one bucketed width T; the prompt / response split inside it is data, not shape
    p_used = int(ro.prompt_mask.sum(1).max())
    s_used = max(int(loss_resp.sum(1).max()), 1)
    width = column_bucket(p_used + s_used, P + S)
    p_w = min(P, width - s_used)
    s_w = width - p_w
  else:
    p_w, s_w = P, S
  rep = lambda a: np.repeat(a[:, P - p_w:], G, axis=0)
  zeros = np.zeros((N, p_w), np.int32)
  batch = LearnerBatch(
      tokens=np.concatenate([rep(ro.prompt_tokens), ro.tokens.reshape(N, S)[:, :s_w]], 1),
      mask=np.concatenate([rep(ro.prompt_mask), resp[:, :s_w]], 1),
      response_mask=np.concatenate([zeros, loss_resp[:, :s_w]], 1),
      old_logp=np.concatenate([zeros.astype(np.float32), ro.logprobs.reshape(N, S)[:, :s_w]], 1),
      advantages=None if advantages_BG is None else _row_or_token_advantages(
          advantages_BG, N, S, s_w, p_w),
      response_start=response_start_bucket(p_w, P))
  if policy_mask_BGS is not None:
    policy = np.asarray(policy_mask_BGS).reshape(N, S)[:, :s_w].astype(batch.response_mask.dtype)
    batch = batch.replace(response_mask=batch.response_mask * np.concatenate([zeros + 1, policy],
                                                                             1))
  if ppo is not None:  # the critic's values come back to the host: GAE runs on every process
    values = distributed.to_host(ppo.values_fn(batch.tokens, batch.mask))
    R_N = np.nan_to_num(np.asarray(ppo.R_BG).reshape(N), nan=0.0)
    adv, ret = gae.ppo_advantages(R_N, values, batch.response_mask, gamma=ppo.gamma,
                                  lam=ppo.lam)
    batch = batch.replace(advantages=np.asarray(adv), returns=np.asarray(ret), old_values=values)
  if pack is not None:
    batch = pack_rows(batch, pack)
  return batch.check()


def _row_or_token_advantages(advantages_BG, N: int, S: int, s_w: int, p_w: int) -> np.ndarray:
  """[N] from [B, G]; [N, p_w + s_w] (0 on prompt columns) from [B, G, S]."""
  a = np.asarray(advantages_BG)
  if a.ndim == 3:
    return np.concatenate([np.zeros((N, p_w), a.dtype), a.reshape(N, S)[:, :s_w]], 1)
  return a.reshape(N)  # as before: single-turn batches are unchanged


def response_logprobs(logits_fn, params, row_keys, mb: LearnerBatch):
  """(logp_NT, entropy_NT) of `mb`'s tokens as `token_logprobs_and_entropy` gives them, with
  the LM head over the response window only: columns [r0 - 1, T) for a batch with a static
  `response_start` r0 (the trunk still sees every column); 0 before r0, where `response_mask`
  is 0. `logits_fn(params, row_keys, tokens, mask[, segments], head_start=...)`."""
  seg = () if mb.segment_ids is None else (mb.segment_ids,)
  r0 = mb.response_start
  if r0 is None or r0 <= 1:
    return token_logprobs_and_entropy(logits_fn(params, row_keys, mb.tokens, mb.mask, *seg),
                                      mb.tokens)
  h0 = int(r0) - 1  # position h0 predicts the first response column r0
  logits = logits_fn(params, row_keys, mb.tokens, mb.mask, *seg, head_start=h0)
  logp, ent = token_logprobs_and_entropy(logits, mb.tokens[:, h0:])
  pad = jnp.zeros((mb.tokens.shape[0], h0), jnp.float32)
  return jnp.concatenate([pad, logp], 1), jnp.concatenate([pad, ent], 1)


# ------------------------------------------------------------------------------- packing
def placement(lengths_N, width: int) -> list[list[int]]:
  """First-fit decreasing: rows (lists of sequence indices, in placement order) of `width`."""
  lengths_N = np.asarray(lengths_N, np.int64)
  if lengths_N.size and lengths_N.max() > width:
    i = int(lengths_N.argmax())
    raise ValueError(f"sequence {i} has {lengths_N[i]} tokens > packed width {width}")
  order = np.argsort(-lengths_N, kind="stable")
  rows: list[list[int]] = []
  free = np.zeros((len(order),), np.int64)  # free columns of each opened row
  for i in order:
    n = lengths_N[i]
    fits = np.flatnonzero(free[:len(rows)] >= n)
    if fits.size:
      rows[fits[0]].append(int(i))
      free[fits[0]] -= n
    else:
      free[len(rows)] = width - n
      rows.append([int(i)])
  return rows


def learner_shapes(P: int, S: int, trim: bool = True, column_buckets: int = 0) -> set:
  """Every (T, response_start) an unpacked learner batch of prompt width P and response cap S
  can take (`make_batch`): the shapes the policy step, the reference and critic forwards
  compile for."""
  if not trim:
    return {(P + S, response_start_bucket(P, P))}
  if column_buckets:
    return {(P + b, P) for b in response_buckets(S, column_buckets)}
  out = set()
  for s_used in range(1, S + 1):
    widths = {column_bucket(t, P + S) for t in range(s_used + 1, s_used + P + 1)}
    for width in widths:
      p_w = min(P, width - s_used)
      out.add((width, response_start_bucket(p_w, P)))
  return out


def packed_sequences(batch: LearnerBatch) -> int:
  """How many sequences a packed batch holds (for logging)."""
  seg = np.asarray(batch.segment_ids)
  return int(seg.max(1).sum()) if seg.size else 0


def pack_rows(batch: LearnerBatch, spec: PackSpec) -> LearnerBatch:
  """The packed form of an unpacked GRPO-family batch (module docstring; `make_batch` with
  `pack=` calls it)."""
  tok = np.asarray(batch.tokens)
  mask = np.asarray(batch.mask) > 0
  resp = np.asarray(batch.response_mask)
  N, T = tok.shape
  adv_N = np.asarray(batch.advantages, np.float32)
  if adv_N.shape != (N,):
    raise ValueError(f"packing takes per-row advantages [N]={N}, got shape {adv_N.shape}")
  per_token = {"old_logp": np.asarray(batch.old_logp, np.float32),
               "weights": np.asarray(token_weights(resp, spec.loss_agg, spec.norm_len),
                                     np.float32),
               "metric_weights": np.asarray(token_weights(resp, "token-mean"), np.float32),
               "advantages": np.broadcast_to(adv_N[:, None], (N, T))}
  if batch.ref_logp is not None:
    per_token["ref_logp"] = np.asarray(batch.ref_logp, np.float32)
  used = np.flatnonzero(resp.sum(1) > 0)
  starts = mask.argmax(1)
  lengths = mask.sum(1)
  for i in used:  # a sequence is one run of real tokens (left-padded prompt, right-padded reply)
    if not mask[i, starts[i]:starts[i] + lengths[i]].all():
      raise ValueError(f"row {i}: real tokens are not contiguous; cannot pack it")
  width = column_bucket(int(lengths[used].max()) if used.size else 1, T)
  rows = placement(lengths[used], width)
  m = spec.row_multiple
  n_rows = m * fine_bucket(-(-max(len(rows), 1) // m), PACKED_ROWS_PER_OCTAVE)
  n_rows = min(n_rows, -(-N // m) * m)  # never more rows than unpacked
  out = {"tokens": np.zeros((n_rows, width), tok.dtype),
         "mask": np.zeros((n_rows, width), np.int32),
         "segment_ids": np.zeros((n_rows, width), np.int32),
         "response_mask": np.zeros((n_rows, width), resp.dtype),
         **{k: np.zeros((n_rows, width), np.float32) for k in per_token}}
  for r, members in enumerate(rows):
    col = 0
    for seg, j in enumerate(members, start=1):
      i = used[j]
      a, n = starts[i], lengths[i]
      dst, src = slice(col, col + n), slice(a, a + n)
      out["tokens"][r, dst] = tok[i, src]
      out["mask"][r, dst] = 1
      out["segment_ids"][r, dst] = seg
      out["response_mask"][r, dst] = resp[i, src]
      for k, v in per_token.items():
        out[k][r, dst] = v[i, src]
      col += n
  return LearnerBatch(**out)  # response_start None: the head runs over every column


def batch_fields(config, ppo: bool) -> tuple[str, ...]:
  """The `LearnerBatch` fields a run"s step takes (`make_batch`"s output plus the reference
  log-probs when ``kl_coef > 0``); `config` is a `mr_rl.rl.update.UpdateConfig`."""
  fields = ["tokens", "mask", "response_mask", "old_logp", "advantages"]
  if ppo:
    fields += ["returns", "old_values"]
  elif config.pack:
    fields += ["weights", "metric_weights", "segment_ids"]
  if config.loss.kl_coef > 0:
    fields.append("ref_logp")
  return tuple(fields)


def example_batch(config, ppo: bool) -> LearnerBatch:
  """A `LearnerBatch` of ShapeDtypeStructs with a run"s fields and ranks (what the batch
  shardings are built from; sizes do not matter)."""
  x = jax.ShapeDtypeStruct((1, 1), jnp.float32)
  per_row = not ppo and not config.pack  # group advantages [N]; per token [N, T] otherwise
  return LearnerBatch(**{
      f: jax.ShapeDtypeStruct((1,), jnp.float32) if f == "advantages" and per_row else x
      for f in batch_fields(config, ppo)})
