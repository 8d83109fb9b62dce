"""Rollout: examples -> prompt tokens -> sampled responses -> rewards.

The host-side hops of one batch before its learning signal, in the order the trainer makes
them (`mr_rl.train.train`), shared with evaluation (`mr_rl.evaluation`) and TAG's drift
measurement (`mr_rl.rl.anchor`):

    examples --Policy.encode--> prompt tokens [B, P]
             --rollout (jitted KV-cache sampler, settings given explicitly)--> Rollout [B, G, S]
             --score (reward runner)--> r[B, G, K]

`StreamingScore` is `score` started row by row, `rollout`'s `on_row` callback: with the
continuous engine a row's host-side rewards start as soon as it finishes decoding.

The learner batch is built from a `Rollout` by `mr_rl.rl.batch.make_batch`. Shape letters:
docs/shapes.md.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import distributed, fields, rollout_engines
from mr_rl.data import lengths
from mr_rl.models import lora, sharding


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  """How responses are drawn (the trainer's come from `config.rollout`; each field declared
  with `mr_rl.fields.setting` and checked here).

  `engine`: a `mr_rl.rollout_engines` name: "static" (`sampling.generate_groups`: all B * G
  rows decoded as one batch) or "continuous" (`sampling.Engine`: a pool of `slots` decode slots
  kept full; sampled draws follow its per-row key schedule, greedy tokens are the same).
  `engine_options`: the engines' own options by name (`EngineSpec.options`, each a field of
  `config.rollout` read by `rollout_engines.options_from_config`); one left out takes its
  default (`rollout_engines.option`), e.g. {"slots": 4} for the continuous engine.
  """
  SECTION: ClassVar[str] = "rollout"
  group_size: int = fields.setting(8, "G, responses per prompt (papers: 8)", fields.Int(lo=1))
  max_new_tokens: int = fields.setting(3000, "response budget S (EOS included)",
                                       fields.Int(lo=1))
  temperature: float = fields.setting(1.0, "0 = greedy", fields.Float(lo=0.0))
  top_k: int = fields.setting(0, "0 = off", fields.Int(lo=0))
  top_p: float = fields.setting(1.0, "1.0 = off", fields.Float(0.0, 1.0, lo_open=True))
  dtype: str = fields.setting(
      "", "sampler compute dtype ('' = the learner's, model.compute_dtype or model.dtype; "
      "parameters cast per layer)", fields.Choice(("",) + fields.DTYPES))
  cache_dtype: str = fields.setting("", "sampler KV-cache dtype ('' = its compute dtype)",
                                    fields.Choice(("",) + fields.DTYPES))
  engine: str = fields.setting(rollout_engines.DEFAULT, "a mr_rl.rollout_engines name: "
                               "'static' (one batch of B*G rows) | 'continuous' (slot pool)",
                               fields.Choice(fields.registered(rollout_engines.ENGINES)))
  engine_options: Mapping[str, Any] = fields.setting(
      help="the engines' own options (config.rollout.<option>)", factory=dict, derived=True)

  def __post_init__(self):
    fields.validate(self)


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

  @functools.cached_property
  def max_prompt_chars(self) -> int:
    """A rendered prompt with more characters has more than P tokens (`data.lengths`)."""
    return lengths.char_bound(self.tokenizer, self.max_prompt_len)

  def prompt_lengths(self, examples: Sequence[Any]) -> np.ndarray:
    """Prompt token counts of `examples` (batch-tokenized), -1 for a prompt over
    `max_prompt_chars` characters (too long, not tokenized)."""
    return lengths.token_lengths([self.render(ex) for ex in examples], self.tokenizer,
                                 self.add_bos, self.max_prompt_chars)

  def prompt_ids(self, ex) -> list[int]:
    """The prompt token ids of one example (rendered; BOS added when `add_bos`).

    Raises:
      ValueError: the prompt has more than `max_prompt_chars` characters (not tokenized).
    """
    tok = self.tokenizer
    text = self.render(ex)
    if len(text) > self.max_prompt_chars:
      raise ValueError(f"prompt of {getattr(ex, 'uid', ex)} has {len(text)} characters, more "
                       f"than config.data.max_prompt_len={self.max_prompt_len} tokens can hold "
                       f"(or set config.data.skip_long_prompts)")
    ids = tok(text, add_special_tokens=False)["input_ids"]
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


def rows_owned(policy: Policy, batch_prompts: int, group_size: int) -> np.ndarray:
  """bool [B, G]: the rows of a rollout whose rewards this process computes (all rows with one
  process; on a mesh, those its devices decode, `distributed.owned_rows`)."""
  rows = batch_prompts * group_size
  if policy.mesh is None:
    return np.ones((batch_prompts, group_size), bool)
  owned = distributed.owned_rows(sharding.batch_sharding(policy.mesh, (rows,)), rows)
  return owned.reshape(batch_prompts, group_size)


def _response_text(tok, tokens_S, length: int, truncated: bool) -> str:
  n = int(length) - (0 if truncated else 1)  # drop the EOS token
  return tok.decode(np.asarray(tokens_S[:n]).tolist(), skip_special_tokens=False)


def rollout(policy: Policy, params, examples: Sequence[Any], key: jax.Array,
            sampling_settings: SamplingSettings,
            on_row: Callable[[int, int, str, int], None] | None = None) -> Rollout:
  """Samples `sampling_settings.group_size` responses per example with `params`.

  The engine is `sampling_settings.engine`'s (`mr_rl.rollout_engines.ENGINES`).
  `on_row(b, g, text, num_tokens)` is called once for each row (every row, on every process):
  with an engine that finishes rows one at a time (continuous) as soon as the row finishes,
  while the others decode; otherwise (static) after the batch, in row order.
  `StreamingScore` is such a callback.
  """
  s = sampling_settings
  params = lora.merge(params)  # LoRA samples merged weights (docs/architecture.md "Models")
  p_tok, p_mask = policy.encode(examples)
  tok = policy.tokenizer
  B, G = len(examples), s.group_size
  texts = {}  # row n = b * G + g -> decoded response (EOS dropped)

  def finished(row):  # a streaming engine's rows, as they complete
    texts[row.row] = _response_text(tok, row.tokens, row.length, row.truncated)
    if on_row is not None:
      on_row(row.row // G, row.row % G, texts[row.row], int(row.length))

  engine = rollout_engines.ENGINES.get(s.engine)  # (an unknown name lists the valid ones)
  out = engine.generate(sampling_model(policy.model, s.dtype), params, p_tok, p_mask, s=s,
                        key=key, eos_id=tok.eos_token_id, pad_id=policy.pad_id,
                        mesh=policy.mesh, on_finished=finished)
  owned = rows_owned(policy, B, G)
  tokens, logprobs, mask, lengths, truncated = (
      distributed.to_host(x) for x in (out.tokens, out.logprobs, out.mask, out.lengths,
                                       out.truncated))
  for n in range(B * G):
    if n not in texts:  # rows the engine did not hand on (static: every row) now
      b, g = divmod(n, G)
      texts[n] = _response_text(tok, tokens[b, g], lengths[b, g], truncated[b, g])
      if on_row is not None:
        on_row(b, g, texts[n], int(lengths[b, g]))
  return Rollout(p_tok, p_mask, tokens, logprobs, mask, lengths, truncated,
                 [[texts[b * G + g] for g in range(G)] for b in range(B)], owned)


def example_dicts(examples: Sequence[Any]) -> list[dict]:
  """Examples as the channels see them: everything an example carries (metadata, reference,
  the conversation for reward models) as plain dicts, not the Example's read-only proxies, so
  process-kind channels can pickle them."""
  return [{**_plain(ex.as_mapping()), "messages": [dict(m) for m in ex.messages]}
          for ex in examples]


def _plain(value: Any) -> Any:
  """Read-only mappings (nested metadata included) as dicts; tuples stay tuples."""
  if isinstance(value, Mapping):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, tuple):
    return tuple(_plain(v) for v in value)
  return value


def _gathered(runner, r_BGK: np.ndarray, owned_BG: np.ndarray, counts, seconds):
  """Each process's rows and counts gathered, then `runner.finish` on the same values
  everywhere."""
  B, G, K = r_BGK.shape
  r_BGK = distributed.gather_rows(r_BGK.reshape(B * G, K), owned_BG.reshape(-1))
  seconds = float(distributed.allgather(np.float64(seconds)).max())  # the slowest process
  return runner.finish(r_BGK.reshape(B, G, K), distributed.sum_metrics(counts), seconds)


def score(runner, ro: Rollout, examples: Sequence[Any]) -> tuple[np.ndarray, dict]:
  """`r[B, G, K]` and the runner's per-step metrics for a rollout of `examples`, the same on
  every process.

  Each process scores the rows it owns (`Rollout.owned`); the rows are then gathered and the
  runner's rules over whole groups and its guards run on the gathered values
  (`RewardRunner.finish`), so every process sees the same rewards and takes the same
  decisions. `StreamingScore` gives the same values with the scoring started row by row.
  """
  r_BGK, counts, seconds = runner.score(ro.texts, example_dicts(examples),
                                        ro.lengths.astype(np.int64), rows_BG=ro.owned)
  return _gathered(runner, r_BGK, ro.owned, counts, seconds)


class StreamingScore:
  """`score`, started row by row: the `on_row` callback of `rollout`.

  Usage (the trainer's `draw_groups`)::

    scoring = StreamingScore(runner, policy, examples, group_size)
    ro = rollout(policy, params, examples, key, settings, on_row=scoring)
    r_BGK, metrics = scoring.finish(ro)

  Each call `scoring(b, g, text, num_tokens)` submits a row this process owns (`rows_owned`)
  to the runner at once (`RewardRunner.start`), so with the continuous engine its host-side
  rewards (threads, worker processes, the sandbox) run while the rest of the batch decodes;
  other processes' rows are skipped. `finish` waits for the calls (batched channels start
  there: they need every row), gathers the rows over the processes and applies
  `RewardRunner.finish` (applicability per prompt, counters, guards) to the gathered batch:
  rewards and metrics equal `score(runner, ro, examples)`'s; only `rewards/seconds` (from
  the first row to the last call, overlapping the decoding) differs. One rollout per object.
  """

  def __init__(self, runner, policy: Policy, examples: Sequence[Any], group_size: int):
    self._runner = runner
    self.owned = rows_owned(policy, len(examples), group_size)
    self._seen = np.zeros_like(self.owned)
    self._pending = runner.start(example_dicts(examples), group_size)
    self._local = None

  def __call__(self, b: int, g: int, text: str, num_tokens: int) -> None:
    if self._seen[b, g]:
      raise ValueError(f"row ({b}, {g}) was handed to StreamingScore twice")
    self._seen[b, g] = True
    if self.owned[b, g]:
      self._pending.add(b, g, text, num_tokens)

  def wait(self) -> tuple:
    """This process's raw scores, once its calls are done (`PendingScores.result`). Host-local,
    no collective, so the asynchronous trainer runs it on a worker thread; `finish` reuses it."""
    if not self._seen.all():
      raise RuntimeError(f"StreamingScore.finish before every row was handed in "
                         f"({int(self._seen.sum())} of {self._seen.size}): pass it as the "
                         f"rollout's on_row")
    if self._local is None:
      self._local = self._pending.result()
    return self._local

  def finish(self, ro: Rollout) -> tuple[np.ndarray, dict]:
    """`score(runner, ro, examples)`'s `(r[B, G, K], metrics)`, once every row was handed in:
    `wait`, then the rows gathered over the processes and `RewardRunner.finish` (collective:
    the main thread's, in the order draws are consumed)."""
    if ro.owned.shape != self.owned.shape or not (ro.owned == self.owned).all():
      raise ValueError(f"the rollout's owned rows {ro.owned.shape} are not the ones this "
                       f"StreamingScore was made for {self.owned.shape}")
    r_BGK, counts, seconds = self.wait()
    return _gathered(self._runner, r_BGK, self.owned, counts, seconds)
