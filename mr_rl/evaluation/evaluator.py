"""Greedy and sampled evaluation of a policy over a data set (docs/methods.md §8).

Two protocols, one loop:

* ``greedy`` (AMRP appendix B.1): temperature 0, one response per example. AMC and AIME
  records replicated 32 times (`mr_rl.data.replicate`) are separate examples, so their
  metrics average over all records, as AMRP does.
* ``sampled`` (TAG): ``n`` samples per problem at a temperature; pass@1 and unbiased
  pass@k on the primary channel (math: n=4, pass@1 and pass@4; code: n=8, pass@4).

Examples go through the trainer's own pieces (`mr_rl.rollout.rollout` with the run's
`Policy`, then `mr_rl.rollout.score` with its reward runner), so evaluation sees the prompts,
sampler and reward channels training sees; only the sampling settings are its own. Every
sampler call holds ``batch_prompts`` prompts (``min(batch_prompts, number of examples)``): the last partial
batch is padded by repeating its own examples, and the padded rows are dropped before
scoring, so every example is evaluated once and the sampler compiles once. With a device
mesh (`policy.mesh`, set by the trainer on more than one device) the sampler runs
sharded and ``batch_prompts`` is rounded up so the ``batch_prompts * n`` rows split evenly
over the mesh's data axes. Metrics are computed by `mr_rl.evaluation.summary`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from mr_rl import rollout as rollout_lib
from mr_rl.evaluation import summary as summary_lib
from mr_rl.models import sharding

_LOG = logging.getLogger(__name__)

MODES = ("greedy", "sampled")
# What `EvalConfig.resolve` fills from a run's settings.
_RESOLVED = ("top_k", "top_p", "max_new_tokens", "batch_prompts", "primary")


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """How to evaluate. ``None`` fields are filled from the run settings by `evaluate`.

  Attributes:
    mode: ``'greedy'`` (temperature 0, n = 1; AMRP) or ``'sampled'`` (n samples; TAG).
    num_samples: n samples per example; greedy: 1 (the default), sampled: default 4.
    ks: the k of pass@k, each ``1 <= k <= n``; default (1,) greedy, (1, 4) or (1,) sampled.
    temperature: sampling temperature; greedy: must be None or 0; sampled: > 0, default 1.
    top_k, top_p: sampling filters (None: ``settings.rollout``).
    max_new_tokens: response budget (None: ``settings.rollout.max_new_tokens``).
    batch_prompts: prompts per sampler call (None: ``settings.data.batch_prompts``).
    max_examples: evaluate only the first this many examples (None: all).
    primary: index of the primary channel (None: ``settings.rewards.primary``).
    success_threshold: a reward ``>=`` this is a success (pass@k, joint rates).
    keep_texts: keep the decoded responses in the result (and its JSON).
  """
  mode: str = "sampled"
  num_samples: int | None = None
  ks: tuple[int, ...] | None = None
  temperature: float | None = None
  top_k: int | None = None
  top_p: float | None = None
  max_new_tokens: int | None = None
  batch_prompts: int | None = None
  max_examples: int | None = None
  primary: int | None = None
  success_threshold: float = 1.0
  keep_texts: bool = False

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"EvalConfig.mode={self.mode!r} is not valid; choose one of {MODES}")
    greedy = self.mode == "greedy"
    n = self.num_samples
    if n is None:
      n = 1 if greedy else 4
    if not _is_int(n) or n < 1:
      raise ValueError(f"EvalConfig.num_samples must be a positive int, got {self.num_samples!r}")
    if greedy and n != 1:
      raise ValueError(f"EvalConfig.num_samples={n} with mode='greedy': greedy decoding gives "
                       "one response per example (replicate examples instead, AMRP B.1)")
    ks = self.ks
    if ks is None:
      ks = (1, 4) if n >= 4 else (1,)
    if isinstance(ks, (int, np.integer)):
      raise ValueError(f"EvalConfig.ks must be a sequence of ints, got {ks!r}")
    ks = tuple(ks)
    if not ks or not all(_is_int(k) for k in ks):
      raise ValueError(f"EvalConfig.ks must be a non-empty sequence of ints, got {self.ks!r}")
    ks = tuple(int(k) for k in ks)
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
      raise ValueError(f"EvalConfig.ks={ks} holds {bad} outside 1..num_samples={n} "
                       "(unbiased pass@k needs k <= n)")
    if len(set(ks)) != len(ks):
      raise ValueError(f"EvalConfig.ks={ks} has duplicates")
    t = self.temperature
    if greedy:
      if t not in (None, 0, 0.0):
        raise ValueError(f"EvalConfig.temperature={t!r} with mode='greedy' (greedy is "
                         "temperature 0); use mode='sampled' to sample")
      t = 0.0
    else:
      t = 1.0 if t is None else t
      if not isinstance(t, (int, float)) or isinstance(t, bool) or not t > 0:
        raise ValueError(f"EvalConfig.temperature must be > 0 in mode='sampled', got {t!r} "
                         "(use mode='greedy' for temperature 0)")
    for field in ("top_k", "max_new_tokens", "batch_prompts", "max_examples", "primary"):
      v = getattr(self, field)
      if v is not None and (not _is_int(v) or v < (0 if field in ("top_k", "primary") else 1)):
        lo = ">= 0" if field in ("top_k", "primary") else "a positive int"
        raise ValueError(f"EvalConfig.{field} must be {lo} or None, got {v!r}")
    if self.top_p is not None and not 0 < self.top_p <= 1:
      raise ValueError(f"EvalConfig.top_p must be in (0, 1], got {self.top_p!r}")
    if not np.isfinite(self.success_threshold):
      raise ValueError(f"EvalConfig.success_threshold must be finite, got "
                       f"{self.success_threshold!r}")
    object.__setattr__(self, "num_samples", int(n))
    object.__setattr__(self, "ks", ks)
    object.__setattr__(self, "temperature", float(t))

  def sampling(self) -> rollout_lib.SamplingSettings:
    """The sampler settings of a resolved config (n responses per example)."""
    return rollout_lib.SamplingSettings(
        group_size=self.num_samples, max_new_tokens=self.max_new_tokens,
        temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

  def resolve(self, settings, num_channels: int) -> "EvalConfig":
    """A copy with every ``None`` filled from the run settings (what the result records)."""
    r, d, rw = settings.rollout, settings.data, settings.rewards
    pick = lambda v, default: default if v is None else v
    primary = pick(self.primary, rw.primary)
    if not 0 <= primary < num_channels:
      raise ValueError(f"EvalConfig.primary={primary} is out of range for {num_channels} "
                       "reward channels")
    return dataclasses.replace(
        self, top_k=pick(self.top_k, r.top_k), top_p=pick(self.top_p, r.top_p),
        max_new_tokens=pick(self.max_new_tokens, r.max_new_tokens),
        batch_prompts=pick(self.batch_prompts, d.batch_prompts), primary=primary)


@dataclasses.dataclass(frozen=True, eq=False)
class EvalResult:
  """What one evaluation produced: raw per-sample records and their summaries.

  Attributes:
    config: the resolved `EvalConfig` that ran.
    channels: the K reward channel names.
    uids, datasets: per example (B), in input order.
    r_BGK: float32 rewards [B, G, K] (B examples, G = n samples), NaN = the channel does not apply.
    lengths_BG: generated tokens per sample (EOS included).
    truncated_BG: bool, sample hit ``max_new_tokens``.
    groups: ``{group: {metric: value}}`` (`mr_rl.evaluation.summary.summarize`).
    texts: the decoded responses (B lists of G) if ``config.keep_texts``, else None.
    wall_s: seconds the evaluation took.
  """
  config: EvalConfig
  channels: tuple[str, ...]
  uids: tuple[str, ...]
  datasets: tuple[str, ...]
  r_BGK: np.ndarray
  lengths_BG: np.ndarray
  truncated_BG: np.ndarray
  groups: Mapping[str, Mapping[str, float]]
  texts: tuple[tuple[str, ...], ...] | None = None
  wall_s: float = float("nan")

  @property
  def primary(self) -> int:
    return self.config.primary

  @property
  def dataset_names(self) -> tuple[str, ...]:
    return tuple(g for g in self.groups if g not in (summary_lib.MACRO, summary_lib.ALL))

  @property
  def overall(self) -> Mapping[str, float]:
    """Every example pooled (the ``all`` group; the only data set when there is one)."""
    return self.groups.get(summary_lib.ALL) or self.groups[self.dataset_names[0]]

  def metrics(self, prefix: str = "eval/") -> dict[str, float]:
    """Flat scalars for metric writers: ``<prefix><metric>`` for all examples pooled, and
    with several data sets also ``<prefix><group>/<metric>`` per data set and ``macro``."""
    out = {f"{prefix}{m}": v for m, v in self.overall.items()}
    if summary_lib.ALL in self.groups:
      for g, row in self.groups.items():
        if g != summary_lib.ALL:
          out.update({f"{prefix}{g}/{m}": v for m, v in row.items()})
    return out


def _check_pieces(policy, runner) -> None:
  if not isinstance(policy, rollout_lib.Policy):
    raise TypeError(f"policy must be a mr_rl.rollout.Policy, got {type(policy).__name__}")
  if not hasattr(runner, "names"):
    raise TypeError(f"runner must be a mr_rl.rewards.runner.RewardRunner, got "
                    f"{type(runner).__name__}")


def evaluate(policy, runner, params, examples: Sequence[Any], config: EvalConfig,
             key: jax.Array | None = None, turns=None, rewards=None) -> EvalResult:
  """Evaluates ``params`` on ``examples`` (see the module docstring for the protocols).

  Args:
    policy: the `mr_rl.rollout.Policy` that samples (model, tokenizer, prompts, mesh).
    runner: the reward runner (`mr_rl.rewards.runner.RewardRunner`) that scores.
    params: the policy parameters.
    examples: `mr_rl.data.Example`s (``uid``, ``dataset``, ``metadata``, ``reference``).
    config: a resolved `EvalConfig` (`EvalConfig.resolve` fills its None fields from a
      run's settings).
    key: PRNG key (required in sampled mode; batch i samples with ``fold_in(key, i)``).
    turns, rewards: a multi-turn run's draws (`mr_rl.multiturn.draw.TurnDraws`) and its
      `RewardSettings`: trajectories instead of single responses, scored on every channel
      (the runner holds the text ones); lengths count the policy's own tokens.

  Returns:
    EvalResult with one record per example, in input order.

  Raises:
    ValueError / TypeError naming the offending argument or config field.
  """
  t0 = time.perf_counter()
  if not isinstance(config, EvalConfig):
    raise TypeError(f"config must be an EvalConfig, got {type(config).__name__}")
  _check_pieces(policy, runner)
  unresolved = [f for f in _RESOLVED if getattr(config, f) is None]
  if unresolved:
    raise ValueError(f"EvalConfig fields {unresolved} are None; fill them, e.g. with "
                     "config.resolve(settings, num_channels)")
  if config.mode == "sampled" and key is None:
    raise ValueError("key is required in mode='sampled'")
  examples = list(examples)
  if config.max_examples is not None:
    examples = examples[:config.max_examples]
  if not examples:
    raise ValueError("examples is empty: nothing to evaluate")
  for i, ex in enumerate(examples):
    for attr in ("uid", "dataset"):
      if not isinstance(getattr(ex, attr, None), str):
        raise TypeError(f"examples[{i}] must be a mr_rl.data.Example with a str .{attr}, "
                        f"got {type(ex).__name__}")
  if (turns is None) != (rewards is None):
    raise ValueError("evaluate: give turns and rewards together (a multi-turn run's)")
  names = tuple(runner.names) if turns is None else tuple(rewards.channels)
  cfg = config
  if not 0 <= cfg.primary < len(names):
    raise ValueError(f"EvalConfig.primary={cfg.primary} is out of range for {len(names)} "
                     "reward channels")
  mesh = policy.mesh
  sampling = cfg.sampling()
  num_examples, n = len(examples), cfg.num_samples
  B = min(cfg.batch_prompts, num_examples)
  if mesh is not None:
    # The sampler splits the B * n rows over the mesh's data axes: round B up so they divide
    # evenly. The extra prompts repeat the batch's own and are dropped like the last batch's.
    d = sharding.data_parallel_size(mesh)
    step = d // math.gcd(n, d)
    B = -(-B // step) * step
  key = jax.random.PRNGKey(0) if key is None else key  # greedy ignores it
  rs, lens, truncs, texts = [], [], [], []
  for b, start in enumerate(range(0, num_examples, B)):
    chunk = examples[start:start + B]
    m = len(chunk)
    padded = chunk + [chunk[i % m] for i in range(B - m)]
    if turns is None:
      ro = rollout_lib.rollout(policy, params, padded, jax.random.fold_in(key, b),
                               sampling).take(m)
      r_BGK, _ = rollout_lib.score(runner, ro, chunk)
      lengths = ro.lengths
    else:
      d, r_BGK = turns.draw(params, padded, jax.random.fold_in(key, b), runner, rewards,
                            sampling.group_size, sampling=sampling)[:2]
      ro, r_BGK, lengths = d.rollout.take(m), r_BGK[:m], d.policy_mask_BGS[:m].sum(-1)
    rs.append(np.asarray(r_BGK, np.float32))
    lens.append(np.asarray(lengths))
    truncs.append(np.asarray(ro.truncated, bool))
    texts.extend(tuple(row) for row in ro.texts)
    _LOG.debug("evaluated %d/%d examples", start + m, num_examples)  # (--verbosity=1)
  r_BGK, lengths_BG, truncated_BG = np.concatenate(rs), np.concatenate(lens), np.concatenate(truncs)
  datasets = tuple(ex.dataset for ex in examples)
  groups = summary_lib.summarize(r_BGK, lengths_BG, truncated_BG, datasets, names, cfg.primary,
                                 cfg.ks, cfg.success_threshold)
  return EvalResult(
      config=cfg, channels=names, uids=tuple(ex.uid for ex in examples), datasets=datasets,
      r_BGK=r_BGK, lengths_BG=lengths_BG, truncated_BG=truncated_BG, groups=groups,
      texts=tuple(texts) if cfg.keep_texts else None, wall_s=time.perf_counter() - t0)
