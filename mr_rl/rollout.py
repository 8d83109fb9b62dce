"""Rollout: examples -> prompt tokens -> sampled responses -> rewards.

The host-side hops of one batch before its learning signal, in the order the trainer makes
them (`mr_rl.train.train`), shared with evaluation (`mr_rl.evaluation`) and TAG's drift
measurement (`mr_rl.rl.anchor`):

    examples --Policy.encode--> prompt tokens [B, P]
             --rollout (jitted KV-cache sampler, settings given explicitly)--> Rollout [B, G, S]
             --score (reward runner)--> r[B, G, K]

The learner batch is built from a `Rollout` by `mr_rl.rl.batch.make_batch`. Shape letters:
docs/shapes.md.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import distributed, sampling
from mr_rl.models import lora, sharding


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
    engine: "static" (`sampling.generate_groups`: all B * G rows decoded as one batch) or
      "continuous" (`sampling.Engine`: a pool of `slots` decode slots kept full; sampled
      draws follow its per-row key schedule, greedy tokens are the same).
    slots: the continuous engine's slot count (0: one slot per row, B * G).
  """
  group_size: int
  max_new_tokens: int
  temperature: float
  top_k: int
  top_p: float
  dtype: str = ""
  cache_dtype: str = ""
  engine: str = "static"
  slots: int = 0


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
  """G sampled responses for each of B prompts (host numpy arrays, the whole batch on every
  process).

  `logprobs` are the sampler's temperature-1 log-probs of the sampled tokens (the old
  log-probs of the policy step); after EOS, tokens are pad with mask 0 and log-prob 0.
  `owned` marks the rows whose rewards this process computes (all rows with one process).
  """
  prompt_tokens: np.ndarray   # [B, P]
  prompt_mask: np.ndarray     # [B, P]
  tokens: np.ndarray          # [B, G, S]
  logprobs: np.ndarray        # [B, G, S]
  mask: np.ndarray            # [B, G, S]
  lengths: np.ndarray         # [B, G] generated tokens, EOS included
  truncated: np.ndarray       # [B, G] no EOS within S
  texts: list                 # B lists of G decoded responses (EOS dropped)
  owned: np.ndarray           # [B, G] bool: rows this process scores (mr_rl.distributed)

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
  params = lora.merge(params)  # a LoRA policy samples merged weights (BUILD_NOTES "LoRA")
  p_tok, p_mask = policy.encode(examples)
  tok = policy.tokenizer
  engines = {"static": sampling.generate_groups, "continuous": functools.partial(
      sampling.generate_continuous, slots=s.slots)}
  if s.engine not in engines:
    raise ValueError(f"rollout engine must be one of {sorted(engines)}, got {s.engine!r}")
  out = engines[s.engine](
      sampling_model(policy.model, s.dtype), params, p_tok, p_mask, group_size=s.group_size,
      key=key,
      max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
      eos_id=tok.eos_token_id, pad_id=policy.pad_id, mesh=policy.mesh,
      cache_dtype=s.cache_dtype or None)
  B, G = len(examples), s.group_size
  owned = np.ones((B * G,), bool)
  if policy.mesh is not None:  # the rows this process's devices decoded
    owned = distributed.owned_rows(sharding.batch_sharding(policy.mesh, (B * G,)), B * G)
  tokens, logprobs, mask, lengths, truncated = (
      distributed.to_host(x) for x in (out.tokens, out.logprobs, out.mask, out.lengths,
                                       out.truncated))
  texts = []
  for b in range(B):
    row = []
    for g in range(G):
      n = int(lengths[b, g]) - (0 if truncated[b, g] else 1)  # drop the EOS token
      row.append(tok.decode(tokens[b, g, :n].tolist(), skip_special_tokens=False))
    texts.append(row)
  return Rollout(p_tok, p_mask, tokens, logprobs, mask, lengths, truncated, texts,
                 owned.reshape(B, G))


def score(runner, ro: Rollout, examples: Sequence[Any]) -> tuple[np.ndarray, dict]:
  """`r[B, G, K]` and the runner's per-step metrics for a rollout of `examples`, the same on
  every process.

  Each process scores the rows it owns (`Rollout.owned`); the rows are then gathered and the
  runner's rules over whole groups and its guards run on the gathered values
  (`RewardRunner.finish`), so every process sees the same rewards and takes the same
  decisions. Channels see everything an example carries: metadata, reference, and the
  conversation (reward models), as plain dicts (not the Example's read-only proxies) so
  process-kind channels can pickle them. The two halves are `score_owned` (host-local; the
  asynchronous trainer runs it on a worker thread) and `finish_scores`.
  """
  return finish_scores(runner, ro, score_owned(runner, ro, examples))


def score_owned(runner, ro: Rollout, examples: Sequence[Any]) -> tuple:
  """The runner's raw scores of this process's rows (`RewardRunner.score`; no collective)."""
  ex_dicts = [{**ex.as_mapping(), "messages": [dict(m) for m in ex.messages]} for ex in examples]
  return runner.score(ro.texts, ex_dicts, ro.lengths.astype(np.int64), rows_BG=ro.owned)


def finish_scores(runner, ro: Rollout, owned: tuple) -> tuple[np.ndarray, dict]:
  """`score`'s second half: `score_owned`'s values gathered over the processes, then the
  runner's batch-level rules and guards (`RewardRunner.finish`)."""
  r_BGK, counts, seconds = owned
  B, G, K = r_BGK.shape
  r_BGK = distributed.gather_rows(r_BGK.reshape(B * G, K), ro.owned.reshape(-1))
  seconds = float(distributed.allgather(np.float64(seconds)).max())  # the slowest process
  return runner.finish(r_BGK.reshape(B, G, K), distributed.sum_metrics(counts), seconds)
