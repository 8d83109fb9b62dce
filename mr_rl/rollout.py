"""Rollout: examples -> prompt tokens -> sampled responses -> rewards -> the update batch.

The three host-side hops of one batch, in the order the trainer makes them
(`mr_rl.train.train`), shared with evaluation (`mr_rl.evaluation`) and TAG's drift
measurement (`mr_rl.rl.anchor`):

    examples --Policy.encode--> prompt tokens [B, P]
             --rollout (jitted KV-cache sampler, settings given explicitly)--> Rollout [B, G, S]
             --score (reward runner)--> r[B, G, K]
             --update_batch (+ advantages A[B, G])--> the policy step's batch over N = B*G rows

Shape letters: B prompts, G responses per prompt, K reward channels, P prompt columns,
S response columns (the sampler's `max_new_tokens`), N = B*G rows of the update batch and
T = P' + S' its columns (the used prompt / response columns, bucketed: `update_batch`).
Packed update batches (`mr_rl.rl.packing`) have their own rows and columns.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import sampling


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  """How responses are drawn (the trainer's come from `config.rollout`).

  Attributes:
    group_size: G, responses per prompt.
    max_new_tokens: response budget S (EOS included).
    temperature: 0 = greedy.
    top_k: 0 = off.
    top_p: 1.0 = off.
    dtype: the sampler's compute dtype ('' = the model's; e.g. 'bfloat16' samples a
      float32-trained policy in bfloat16, parameters cast per layer as the model does).
    cache_dtype: the sampler's KV-cache dtype ('' = its compute dtype).
  """
  group_size: int
  max_new_tokens: int
  temperature: float
  top_k: int
  top_p: float
  dtype: str = ""
  cache_dtype: str = ""


@functools.lru_cache(maxsize=16)
def sampling_model(model, dtype: str):
  """`model` with its compute dtype set to `dtype` ('' or equal: `model` itself)."""
  if not dtype or jnp.dtype(dtype) == jnp.dtype(model.config.dtype):
    return model
  return type(model)(model.config.replace(dtype=jnp.dtype(dtype)))


@dataclasses.dataclass(frozen=True, eq=False)
class Policy:
  """What turns examples into sampled responses: the model, its tokenizer, how prompts are
  written, and the device mesh the sampler runs on (None: one device).

  Attributes:
    model: the `mr_rl.models.Transformer`.
    tokenizer: a Hugging Face tokenizer (pad / eos / bos ids, decode).
    render: example -> prompt text (a chat template, or the example's own prompt).
    max_prompt_len: P; a longer prompt is an error naming `config.data.max_prompt_len`.
    add_bos: prepend the tokenizer's BOS (untemplated prompts; templates write their own).
    mesh: a `jax.sharding.Mesh`, or None.
  """
  model: Any
  tokenizer: Any
  render: Callable[[Any], str]
  max_prompt_len: int
  add_bos: bool
  mesh: Any = None

  @property
  def pad_id(self) -> int:
    tok = self.tokenizer
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

  def prompt_ids(self, ex) -> list[int]:
    """The prompt token ids of one example (rendered; BOS added when `add_bos`)."""
    tok = self.tokenizer
    ids = tok(self.render(ex), add_special_tokens=False)["input_ids"]
    if self.add_bos and tok.bos_token_id is not None:
      ids = [tok.bos_token_id] + ids
    return ids

  def encode(self, examples: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded prompt tokens and mask `[B, P]` (P = `max_prompt_len`)."""
    P = self.max_prompt_len
    ids_B = []
    for ex in examples:
      ids = self.prompt_ids(ex)
      if len(ids) > P:
        raise ValueError(f"prompt of {getattr(ex, 'uid', ex)} has {len(ids)} tokens > "
                         f"config.data.max_prompt_len={P} (or set config.data.skip_long_prompts)")
      ids_B.append(ids)
    tokens = np.full((len(ids_B), P), self.pad_id, np.int32)
    mask = np.zeros((len(ids_B), P), np.int32)
    for i, ids in enumerate(ids_B):
      tokens[i, P - len(ids):] = ids
      mask[i, P - len(ids):] = 1
    return tokens, mask


@dataclasses.dataclass
class Rollout:
  """G sampled responses for each of B prompts (host numpy arrays).

  `logprobs` are the sampler's temperature-1 log-probs of the sampled tokens (the old
  log-probs of the policy step); after EOS, tokens are pad with mask 0 and log-prob 0.
  """
  prompt_tokens: np.ndarray   # [B, P]
  prompt_mask: np.ndarray     # [B, P]
  tokens: np.ndarray          # [B, G, S]
  logprobs: np.ndarray        # [B, G, S]
  mask: np.ndarray            # [B, G, S]
  lengths: np.ndarray         # [B, G] generated tokens, EOS included
  truncated: np.ndarray       # [B, G] no EOS within S
  texts: list                 # B lists of G decoded responses (EOS dropped)

  def take(self, m: int) -> "Rollout":
    """The first `m` prompts (drops padded rows of a partial batch)."""
    return dataclasses.replace(self, **{f.name: getattr(self, f.name)[:m]
                                        for f in dataclasses.fields(self)})

  @staticmethod
  def gather(rollouts: Sequence["Rollout"], picks: Sequence[tuple[int, int]]) -> "Rollout":
    """The groups `picks` = [(rollout index, prompt index), ...] of several rollouts, in
    order, as one Rollout (dynamic sampling's refilled batch). All share S; prompt widths
    are equal too (`Policy.encode` pads to `max_prompt_len`)."""
    out = {}
    for f in dataclasses.fields(Rollout):
      vals = [getattr(rollouts[r], f.name)[b] for r, b in picks]
      out[f.name] = list(vals) if f.name == "texts" else np.stack(vals)
    return Rollout(**out)


def rollout(policy: Policy, params, examples: Sequence[Any], key: jax.Array,
            sampling_settings: SamplingSettings) -> Rollout:
  """Samples `sampling_settings.group_size` responses per example with `params`."""
  s = sampling_settings
  p_tok, p_mask = policy.encode(examples)
  tok = policy.tokenizer
  out = sampling.generate_groups(
      sampling_model(policy.model, s.dtype), params, p_tok, p_mask, group_size=s.group_size,
      key=key,
      max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
      eos_id=tok.eos_token_id, pad_id=policy.pad_id, mesh=policy.mesh,
      cache_dtype=s.cache_dtype or None)
  out = jax.device_get(out)
  texts = []
  for b in range(len(examples)):
    row = []
    for g in range(s.group_size):
      n = int(out.lengths[b, g]) - (0 if out.truncated[b, g] else 1)  # drop the EOS token
      row.append(tok.decode(out.tokens[b, g, :n].tolist(), skip_special_tokens=False))
    texts.append(row)
  return Rollout(p_tok, p_mask, np.asarray(out.tokens), np.asarray(out.logprobs),
                 np.asarray(out.mask), np.asarray(out.lengths), np.asarray(out.truncated), texts)


def score(runner, ro: Rollout, examples: Sequence[Any]) -> tuple[np.ndarray, dict]:
  """`r[B, G, K]` and the runner's per-step metrics for a rollout of `examples`.

  Channels see everything an example carries: metadata, reference, and the conversation
  (reward models), as plain dicts (not the Example's read-only proxies) so process-kind
  channels can pickle them.
  """
  ex_dicts = [{**ex.as_mapping(), "messages": [dict(m) for m in ex.messages]} for ex in examples]
  return runner(ro.texts, ex_dicts, ro.lengths.astype(np.int64))


# ------------------------------------------------------------------- the update batch
MIN_COLUMN_BUCKET = 8


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


def column_bucket(n: int, cap: int) -> int:
  """Columns kept for `n` used ones: `size_bucket(n, MIN_COLUMN_BUCKET)`, at most `cap`."""
  return min(size_bucket(n, MIN_COLUMN_BUCKET), int(cap))


def update_batch(ro: Rollout, A_BG, *, loss_rows_BG=None, trim: bool = True) -> dict:
  """The policy step's batch over N = B*G rows (row b*G + g) and T = P' + S' columns.

  Length-aware: with `trim`, the columns are cut to the batch's longest prompt plus its
  longest response that enters the loss, rounded up by `column_bucket` (so the update, the
  reference / critic forwards and the metrics cover only the columns in use). Only the total
  width T is bucketed (the extra columns go to the prompt side, up to P, then to the
  response side): the compiled programs depend on T alone, so a run compiles at most one
  program per bucket of P + S (18 for 512 + 3000; 2-3 in the demo). Cut columns hold
  only padding (prompts are left-padded, responses right-padded), so every loss and metric
  is unchanged up to float summation order; Dr.GRPO's `norm_len` stays the configured
  `max_new_tokens` (settings.py). Without `trim`: P' = P, S' = S (the sampler's cap).

  Args:
    ro: the rollout.
    A_BG: advantages.
    loss_rows_BG: optional bool `[B, G]`; False rows keep their tokens but get response
      mask 0, so they enter no loss, normaliser or metric (DAPO overlong filtering of
      truncated responses; dynamic sampling's unfilled slots). Their responses do not count
      towards the trimmed width, so they may be cut.
    trim: cut unused columns (above).

  Keys: `tokens_NT` (prompt then response), `mask_NT` (real tokens), `response_mask_NT`
  (tokens that enter the loss), `old_logp_NT` (the sampler's log-probs, 0 on prompt
  columns) and `advantages_BG`.
  """
  B, G, S = ro.tokens.shape
  P = ro.prompt_tokens.shape[1]
  N = B * G
  resp = ro.mask.reshape(N, S)
  loss_resp = resp
  if loss_rows_BG is not None:
    keep_N = np.asarray(loss_rows_BG, bool).reshape(N)
    loss_resp = resp * keep_N[:, None].astype(resp.dtype)
  if trim:  # one bucketed width T; the prompt / response split inside it is data, not shape
    p_used = int(ro.prompt_mask.sum(1).max())
    s_used = max(int(loss_resp.sum(1).max()), 1)
    width = column_bucket(p_used + s_used, P + S)
    p_w = min(P, width - s_used)
    s_w = width - p_w
  else:
    p_w, s_w = P, S
  rep = lambda a: np.repeat(a[:, P - p_w:], G, axis=0)
  tokens = np.concatenate([rep(ro.prompt_tokens), ro.tokens.reshape(N, S)[:, :s_w]], 1)
  mask = np.concatenate([rep(ro.prompt_mask), resp[:, :s_w]], 1)
  zeros = np.zeros((N, p_w), np.int32)
  return {"tokens_NT": jnp.asarray(tokens), "mask_NT": jnp.asarray(mask),
          "response_mask_NT": jnp.asarray(np.concatenate([zeros, loss_resp[:, :s_w]], 1)),
          "old_logp_NT": jnp.asarray(np.concatenate(
              [zeros.astype(np.float32), ro.logprobs.reshape(N, S)[:, :s_w]], 1)),
          "advantages_BG": A_BG}
