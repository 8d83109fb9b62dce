"""Multi-objective reward model (ArmoRM layout) on the Flax Llama backbone, and its channels.

AMRP open-ended alignment (METHODS.md section 7; AMRP section 5 and appendix B.2): the reward
profile is ``[r_help, r_corr, r_coh]``, the helpfulness, correctness and coherence scores of
ArmoRM-Llama3-8B-v0.1 (Wang et al. 2024a), and every reward is scaled to [0, 1] (B.2).

Model (``RLHFlow/ArmoRM-Llama3-8B-v0.1``, remote class ``LlamaForRewardModelWithGating``): a
Llama-3-8B backbone, a ``regression_layer`` Linear(hidden, 19, bias=False) applied to the
final-normed hidden state of the LAST token of the chat-templated conversation, plus a
gating network and a ``reward_transform_matrix`` that only form the overall preference
score. We compute the 19 per-objective rewards (the model card's ``output.rewards``); the
gating tensors are read past and ignored. Objective order: ``ARMORM_OBJECTIVES`` (the model
card's ``attributes`` list; objectives 0-4 are the HelpSteer attributes),
so AMRP's help / corr / coh are objectives 0 / 1 / 2. A plain ``score.weight`` head
(transformers ``LlamaForSequenceClassification``, [num_labels, hidden], no bias) loads the
same way; objectives are then its labels in order.

Input and pooling (exact): the conversation is ``messages + [{"role": "assistant",
"content": response}]`` rendered and tokenized by the reward model's own chat template
(``apply_chat_template(..., tokenize=True, add_generation_prompt=False)``, as in the model
card's demo); the pooled token is the last token of that sequence (for Llama 3's template,
the ``<|eot_id|>`` closing the assistant turn), i.e. the last position whose attention mask
is 1. Batches are padded on the right (default) or left; positions come from the mask, so
the two give the same scores, equal to scoring each sequence alone (the model card's
batch-1 call and transformers' rightmost-non-pad pooling).

Rescaling to [0, 1] (``rescale``): AMRP says only that rewards are scaled to [0, 1]. ArmoRM
regresses HelpSteer ratings r in {0..4} onto (r + 0.5) / 5 (the model card maps predictions
back with ``rating = 5 x - 0.5``), so ``rescale="helpsteer"`` is rating / 4 =
``clip((x - 0.1) / 0.8, 0, 1)`` **(project definition)**; ``rescale=(lo, hi)`` is
``clip((x - lo) / (hi - lo), 0, 1)``; ``None`` keeps the raw head output.

Channels (kind "thread"; the model lives in the trainer process): ``armorm_helpfulness``,
``armorm_correctness``, ``armorm_coherence`` and the generic ``reward_model(objective=...)``.
All channels with the same (path, dtype, head, mesh, max_len) share ONE loaded model and one
``RewardModelScorer``: an LRU of per-(conversation, response) score vectors with in-flight
de-duplication (the three AMRP channels cost one forward per response) and a micro-batcher
that collects concurrent calls (the runner's threads) into one forward of up to
``max_batch`` sequences. ``scorer.score_many`` scores a whole rollout in batches up front, so
the channels then only read the cache. The prompt comes from ``example["messages"]`` (chat
turns) or ``example["prompt"]`` (one user turn).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
import math
import os
import threading
import time
from typing import Any, Mapping, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mr_rl.models import hf_io
from mr_rl.models import sharding as shd
from mr_rl.models.transformer import Transformer, abstract_params, positions_from_mask
from mr_rl.rewards.channels import (DEFAULT_VALUE_RANGE, REWARDS, UNIT_RANGE, MissingFieldError,
                                    RewardChannel)

ARMORM_HUB = "RLHFlow/ArmoRM-Llama3-8B-v0.1"
ARMORM_OBJECTIVES = (  # model card order; AMRP's help / corr / coh are 0 / 1 / 2
    "helpsteer-helpfulness", "helpsteer-correctness", "helpsteer-coherence",  # 0-2
    "helpsteer-complexity", "helpsteer-verbosity", "ultrafeedback-overall_score",  # 3-5
    "ultrafeedback-instruction_following", "ultrafeedback-truthfulness",
    "ultrafeedback-honesty", "ultrafeedback-helpfulness", "beavertails-is_safe",
    "prometheus-score", "argilla-overall_quality", "argilla-judge_lm", "code-complexity",
    "code-style", "code-explanation", "code-instruction-following", "code-readability")
HEAD_LAYOUTS = ("regression_layer", "score")  # ArmoRM / LlamaForSequenceClassification
HELPSTEER_RANGE = (0.1, 0.9)  # ArmoRM targets (r + 0.5) / 5 for HelpSteer ratings r in 0..4
# Tensors of the ArmoRM checkpoint that only feed the overall preference score (or an LM
# head a reward model does not use); read past.
_IGNORED_PREFIXES = ("gating.", "reward_transform_matrix", "lm_head.")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# ----------------------------------------------------------------------------- loading
class LoadedRewardModel(NamedTuple):
  model: Transformer
  params: Any
  w_DK: np.ndarray
  b_K: np.ndarray
  layout: str
  objectives: tuple[str, ...]


def _head_tensors(index: Mapping[str, str], head: str, read) -> tuple[np.ndarray, np.ndarray, str]:
  """Reads the regression head: (w_DK float32, b_K float32, layout)."""
  present = [h for h in HEAD_LAYOUTS if f"{h}.weight" in index]
  if head == "auto":
    if len(present) != 1:
      raise ValueError(f"head='auto' needs exactly one of regression_layer.weight / score.weight "
                       f"in the checkpoint, found {present or 'neither'}; pass head=")
    head = present[0]
  elif head not in HEAD_LAYOUTS:
    raise ValueError(f"head must be 'auto' or one of {sorted(HEAD_LAYOUTS)}, got {head!r}")
  elif head not in present:
    raise ValueError(f"head={head!r} but the checkpoint has no {head}.weight")
  w = np.asarray(read(f"{head}.weight"), np.float32)
  if w.ndim != 2:
    raise ValueError(f"{head}.weight must be [num_objectives, hidden], got shape {w.shape}")
  b = (np.asarray(read(f"{head}.bias"), np.float32) if f"{head}.bias" in index
       else np.zeros(w.shape[0], np.float32))
  if b.shape != (w.shape[0],):
    raise ValueError(f"{head}.bias has shape {b.shape}, expected ({w.shape[0]},)")
  return np.ascontiguousarray(w.T), b, head


def load_reward_model(path_or_hub_id: str, *, dtype=jnp.float32, mesh=None, rules=None,
                      head: str = "auto", **config_overrides):
  """Loads backbone + regression head from a transformers checkpoint.

  Backbone tensors are mapped with ``hf_io.param_mapping`` (one tensor at a time, straight
  into its NamedSharding when ``mesh`` is given). The backbone config is built with
  ``tie_embeddings=True`` so that no LM head parameter is needed; the (unused) logits are
  dead code that XLA removes under ``jit``.

  Args:
    path_or_hub_id: local directory (config.json, safetensors) or hub id.
    dtype: backbone parameter / activation dtype; the head is kept in float32.
    mesh, rules: optional mesh and logical axis rules (``mr_rl.models.sharding``).
    head: 'auto', 'regression_layer' (ArmoRM) or 'score' (LlamaForSequenceClassification).
    **config_overrides: other ModelConfig fields (e.g. max_seq_len).

  Returns:
    LoadedRewardModel(model, params, w_DK, b_K, layout, objectives): objectives are
    ARMORM_OBJECTIVES for a 19-output regression_layer, the config's id2label for a score
    head, else ``objective_<k>``.

  Raises:
    ValueError / FileNotFoundError / TypeError naming the problem (missing or unexpected
    tensors, shapes, unknown head layout).
  """
  dt = jnp.dtype(dtype)
  if not jnp.issubdtype(dt, jnp.floating):
    raise TypeError(f"dtype must be a floating dtype, got {dt}")
  path = hf_io.resolve_path(path_or_hub_id, ["*.json", "*.safetensors", "tokenizer*", "*.txt",
                                             "*.model", "*.tiktoken", "*.jinja"])
  hf_cfg = hf_io._read_config(path)  # pylint: disable=protected-access
  overrides = dict(config_overrides, tie_embeddings=True)
  config = hf_io.config_from_hf(hf_cfg, param_dtype=dt, dtype=dt, **overrides)
  model = Transformer(config)
  index = hf_io._tensor_index(path)  # pylint: disable=protected-access
  handles: dict[str, Any] = {}

  def read(name):
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top
    fn = index[name]
    if fn not in handles:
      handles[fn] = safe_open(fn, framework="np")
    return handles[fn].get_tensor(name)

  w_DK, b_K, layout = _head_tensors(index, head, read)
  if w_DK.shape[0] != config.d_model:
    raise ValueError(f"{layout}.weight has hidden size {w_DK.shape[0]}, backbone has {config.d_model}")
  n_obj = hf_cfg.get("num_objectives")
  if n_obj is not None and n_obj != w_DK.shape[1]:
    raise ValueError(f"config.json num_objectives={n_obj} but {layout}.weight has "
                     f"{w_DK.shape[1]} rows")
  mapping = hf_io.param_mapping(config)
  expected = {n for _, names, _, _ in mapping for n in names}
  head_names = {f"{layout}.weight", f"{layout}.bias"}
  missing = sorted(expected - set(index))
  unexpected = sorted(n for n in set(index) - expected - head_names
                      if not n.startswith(_IGNORED_PREFIXES) and not n.endswith(_IGNORED_SUFFIXES))
  if missing:
    raise ValueError(f"checkpoint {path} is missing {len(missing)} backbone tensor(s): {missing[:8]}")
  if unexpected:
    raise ValueError(f"checkpoint {path} has {len(unexpected)} unexpected tensor(s) for a "
                     f"reward model with a {layout} head: {unexpected[:8]}")
  shapes = abstract_params(model)
  shardings = shd.param_shardings(model, mesh, rules) if mesh is not None else None
  params: dict = {}
  for ours, names, to_ours, _ in mapping:
    target = hf_io._get(shapes, ours)  # pylint: disable=protected-access
    arr = to_ours([read(n) for n in names])
    if arr.shape != target.shape:
      raise ValueError(f"tensor {names[0]} maps to shape {arr.shape}; {'/'.join(ours)} expects "
                       f"{target.shape}")
    arr = np.asarray(arr).astype(dt)
    if shardings is None:
      value = jnp.asarray(arr)
    else:
      value = jax.make_array_from_callback(arr.shape, hf_io._get(shardings, ours),  # pylint: disable=protected-access
                                           lambda idx, a=arr: a[idx])
    hf_io._set(params, ours, value)  # pylint: disable=protected-access
  K = w_DK.shape[1]
  id2label = hf_cfg.get("id2label") or {}
  if layout == "regression_layer" and K == len(ARMORM_OBJECTIVES):
    objectives = ARMORM_OBJECTIVES
  elif layout == "score" and len(id2label) == K and all(str(k) in id2label for k in range(K)):
    objectives = tuple(str(id2label[str(k)]) for k in range(K))
  else:
    objectives = tuple(f"objective_{k}" for k in range(K))
  return LoadedRewardModel(model, params, w_DK, b_K, layout, objectives)


# ----------------------------------------------------------------------------- model
def _last_index(mask_BT: jax.Array) -> jax.Array:
  """Index of the last position with mask 1 in each row (works for left and right padding)."""
  T = mask_BT.shape[1]
  return T - 1 - jnp.argmax(mask_BT[:, ::-1].astype(jnp.int32), axis=1)


def _forward(model: Transformer, params, w_DK, b_K, tokens_BT, mask_BT):
  """r_BK: the head on the final-normed hidden state of each row's last real token."""
  _, _, h_BTD = model.apply({"params": params}, tokens_BT, positions_from_mask(mask_BT),
                            kv_mask_BS=mask_BT, return_hidden=True)
  last_B = _last_index(mask_BT)
  h_BD = jnp.take_along_axis(h_BTD, last_B[:, None, None], axis=1)[:, 0].astype(jnp.float32)
  return jnp.einsum("bd,dk->bk", h_BD, w_DK, precision=jax.lax.Precision.HIGHEST) + b_K


class MultiObjectiveRewardModel:
  """Per-objective rewards r[B, K] of (conversation, response) pairs (module docstring).

  Args:
    model: the backbone ``Transformer``.
    params: its params (optionally sharded on ``mesh``).
    w_DK, b_K: regression head (float32 [D, K], [K]).
    tokenizer: a transformers tokenizer with a chat template (needed for ``score``).
    objectives: names of the K objectives (default ARMORM_OBJECTIVES when K == 19, else
      ``objective_<k>``).
    mesh, rules: run the forward on this mesh (batch over the batch axes).
    padding_side: 'right' or 'left' (same scores; see the module docstring).
    length_bucket: pad lengths up to a multiple of this (fewer compiles).
    max_len: longest accepted sequence (default the backbone's max_seq_len).
  """

  def __init__(self, model: Transformer, params, w_DK, b_K=None, *, tokenizer=None,
               objectives: Sequence[str] | None = None, mesh=None, rules=None,
               padding_side: str = "right", length_bucket: int = 64, max_len: int | None = None):
    w_DK = np.asarray(w_DK, np.float32)
    if w_DK.ndim != 2 or w_DK.shape[0] != model.config.d_model:
      raise ValueError(f"w_DK must be [{model.config.d_model}, K], got {w_DK.shape}")
    K = w_DK.shape[1]
    b_K = np.zeros(K, np.float32) if b_K is None else np.asarray(b_K, np.float32)
    if b_K.shape != (K,):
      raise ValueError(f"b_K must have shape ({K},), got {b_K.shape}")
    if objectives is None:
      objectives = ARMORM_OBJECTIVES if K == len(ARMORM_OBJECTIVES) else tuple(
          f"objective_{k}" for k in range(K))
    if len(objectives) != K:
      raise ValueError(f"objectives has {len(objectives)} names for K={K} head outputs")
    if padding_side not in ("left", "right"):
      raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if not isinstance(length_bucket, int) or length_bucket < 1:
      raise ValueError(f"length_bucket must be a positive int, got {length_bucket!r}")
    max_len = model.config.max_seq_len if max_len is None else max_len
    if not isinstance(max_len, int) or max_len < 1:
      raise ValueError(f"max_len must be a positive int, got {max_len!r}")
    self.model, self.params, self.tokenizer = model, params, tokenizer
    self.objectives = tuple(objectives)
    self.mesh, self.rules = mesh, rules
    self.padding_side, self.length_bucket, self.max_len = padding_side, length_bucket, max_len
    self._tok_lock = threading.Lock()
    fwd = functools.partial(_forward, model)
    if mesh is None:
      self._w, self._b = jnp.asarray(w_DK), jnp.asarray(b_K)
      self._fn = jax.jit(fwd)
      self._batch_multiple = 1
    else:
      rep = NamedSharding(mesh, P())
      self._w, self._b = jax.device_put(w_DK, rep), jax.device_put(b_K, rep)
      self._fn = jax.jit(fwd, out_shardings=rep)
      rules_ = shd.validate_rules(shd.DEFAULT_RULES if rules is None else rules)
      axes = nn.logical_to_mesh_axes(("activation_batch",), rules_)[0]
      axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
      self._batch_multiple = math.prod(mesh.shape[a] for a in axes)
    self.num_forwards = 0  # forward passes run (for batching diagnostics)

  @property
  def num_objectives(self) -> int:
    return len(self.objectives)

  @classmethod
  def from_pretrained(cls, path_or_hub_id: str, *, dtype=jnp.float32, mesh=None, rules=None,
                      head: str = "auto", tokenizer: Any = True, **kwargs):
    """Loads an ArmoRM-style or LlamaForSequenceClassification checkpoint (+ its tokenizer
    when ``tokenizer`` is True; pass a tokenizer object or None otherwise)."""
    loaded = load_reward_model(path_or_hub_id, dtype=dtype, mesh=mesh, rules=rules, head=head)
    if tokenizer is True:
      tokenizer = hf_io.load_tokenizer(path_or_hub_id)
    objectives = kwargs.pop("objectives", None) or loaded.objectives
    return cls(loaded.model, loaded.params, loaded.w_DK, loaded.b_K, tokenizer=tokenizer,
               objectives=objectives, mesh=mesh, rules=rules, **kwargs)

  def objective_index(self, objective: int | str) -> int:
    """Index of an objective given as an int, a full name or a HelpSteer short name."""
    if isinstance(objective, (int, np.integer)) and not isinstance(objective, bool):
      if not 0 <= objective < self.num_objectives:
        raise ValueError(f"objective index {objective} out of range [0, {self.num_objectives})")
      return int(objective)
    if isinstance(objective, str):
      for name in (objective, f"helpsteer-{objective}"):
        if name in self.objectives:
          return self.objectives.index(name)
    raise ValueError(f"unknown objective {objective!r}; valid: {self.objectives}")

  # --------------------------------------------------------------------------- encoding
  def encode(self, conversation: str | Sequence[Mapping[str, str]], response: str) -> list[int]:
    """Token ids of the chat-templated conversation + response (see module docstring).

    Raises:
      ValueError: no tokenizer / chat template, bad messages, or longer than max_len.
    """
    if self.tokenizer is None:
      raise ValueError("this reward model has no tokenizer; pass token ids to score_ids")
    if not isinstance(response, str):
      raise TypeError(f"response must be a str, got {type(response).__name__}")
    messages = [{"role": r, "content": c} for r, c in normalise_conversation(conversation)]
    messages.append({"role": "assistant", "content": response})
    with self._tok_lock:
      out = self.tokenizer.apply_chat_template(messages, tokenize=True,
                                               add_generation_prompt=False, return_dict=True)
    ids = list(out["input_ids"])
    if len(ids) > self.max_len:
      raise ValueError(f"conversation + response is {len(ids)} tokens, longer than the reward "
                       f"model's max_len {self.max_len}")
    return ids

  def pad(self, ids_list: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens_BT, mask_BT) int32, bucketed: B up to a power of two (and the mesh's batch
    multiple; filler rows hold one pad token), T up to a multiple of length_bucket."""
    if not ids_list or any(len(x) == 0 for x in ids_list):
      raise ValueError("ids_list must hold at least one non-empty sequence")
    n = len(ids_list)
    B = 1 << (n - 1).bit_length()
    B = -(-B // self._batch_multiple) * self._batch_multiple
    L = max(len(x) for x in ids_list)
    T = min(-(-L // self.length_bucket) * self.length_bucket, max(self.max_len, L))
    pad_id = getattr(self.tokenizer, "pad_token_id", None) or 0
    tokens = np.full((B, T), pad_id, np.int32)
    mask = np.zeros((B, T), np.int32)
    for i, x in enumerate(ids_list):
      sl = slice(0, len(x)) if self.padding_side == "right" else slice(T - len(x), T)
      tokens[i, sl] = x
      mask[i, sl] = 1
    mask[n:, 0 if self.padding_side == "right" else T - 1] = 1  # filler rows: one pad token
    return tokens, mask

  # --------------------------------------------------------------------------- scoring
  def score_tokens(self, tokens_BT, mask_BT) -> np.ndarray:
    """r_BK float32 for a padded batch (mask 1 on real tokens; left or right padding)."""
    tokens_BT, mask_BT = np.asarray(tokens_BT, np.int32), np.asarray(mask_BT, np.int32)
    if tokens_BT.ndim != 2 or tokens_BT.shape != mask_BT.shape:
      raise ValueError(f"tokens_BT and mask_BT must be equal [B, T], got {tokens_BT.shape} and "
                       f"{mask_BT.shape}")
    if not mask_BT.any(axis=1).all():
      raise ValueError("every row of mask_BT needs at least one real token")
    self.num_forwards += 1
    if self.mesh is None:
      return np.asarray(self._fn(self.params, self._w, self._b, tokens_BT, mask_BT))
    sh = shd.batch_sharding(self.mesh, tokens_BT.shape, self.rules)
    with shd.activation_sharding(self.mesh, self.rules):
      out = self._fn(self.params, self._w, self._b, jax.device_put(tokens_BT, sh),
                     jax.device_put(mask_BT, sh))
    return np.asarray(jax.device_get(out))

  def score_ids(self, ids_list: Sequence[Sequence[int]]) -> np.ndarray:
    """r_BK for token-id sequences (padded and bucketed here)."""
    tokens, mask = self.pad(ids_list)
    return self.score_tokens(tokens, mask)[:len(ids_list)]

  def score(self, conversations: Sequence[str | Sequence[Mapping[str, str]]],
            responses: Sequence[str]) -> np.ndarray:
    """r_BK float32: per-objective rewards of each (conversation, response) pair."""
    if len(conversations) != len(responses):
      raise ValueError(f"{len(conversations)} conversations but {len(responses)} responses")
    return self.score_ids([self.encode(c, r) for c, r in zip(conversations, responses)])


def normalise_conversation(conversation) -> tuple[tuple[str, str], ...]:
  """A prompt str (one user turn) or a sequence of chat turns -> ((role, content), ...).

  Raises:
    TypeError / ValueError: not a str or a non-empty sequence of {role, content} mappings.
  """
  if isinstance(conversation, str):
    return (("user", conversation),)
  if not isinstance(conversation, (list, tuple)) or not conversation:
    raise TypeError(f"conversation must be a prompt str or a non-empty sequence of chat turns, "
                    f"got {type(conversation).__name__}")
  out = []
  for m in conversation:
    if not isinstance(m, Mapping) or not {"role", "content"} <= set(m):
      raise ValueError(f"each chat turn needs role and content, got {m!r:.100}")
    if not isinstance(m["content"], str) or not isinstance(m["role"], str):
      raise TypeError(f"chat turn role and content must be str, got {m!r:.100}")
    out.append((m["role"], m["content"]))
  return tuple(out)


# ----------------------------------------------------------------------------- shared scorer
class RewardModelScorer:
  """Cached, micro-batched scoring of (conversation, response) pairs for the channels.

  ``score(conversation, response)`` may be called from many threads: a request already
  cached (or in flight) is answered from it; otherwise its token ids join a queue that one
  daemon thread drains in forwards of up to ``max_batch`` sequences, waiting at most
  ``max_wait_ms`` after the first request for others to arrive. A failed forward fails its
  requests (the runner scores NaN) and is not cached.

  Attributes:
    model: the MultiObjectiveRewardModel.
    num_requests: sequences sent to the model (cache misses).
  """

  def __init__(self, model: MultiObjectiveRewardModel, *, max_batch: int = 32,
               max_wait_ms: float = 10.0, cache_size: int = 8192):
    for name, v in (("max_batch", max_batch), ("cache_size", cache_size)):
      if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not isinstance(max_wait_ms, (int, float)) or not 0 <= max_wait_ms < 60_000:
      raise ValueError(f"max_wait_ms must be in [0, 60000), got {max_wait_ms!r}")
    self.model, self.max_batch, self.max_wait_s = model, max_batch, max_wait_ms / 1e3
    self.cache_size = cache_size
    self._cache: collections.OrderedDict[tuple, cf.Future] = collections.OrderedDict()
    self._queue: list[tuple[list[int], cf.Future]] = []
    self._cond = threading.Condition()
    self._thread: threading.Thread | None = None
    self.num_requests = 0

  def _lookup(self, conversation, response) -> tuple[cf.Future, bool]:
    """(future, is_new) for a pair; a new future is registered in the cache."""
    key = (normalise_conversation(conversation), response)
    with self._cond:
      fut = self._cache.get(key)
      if fut is not None:
        self._cache.move_to_end(key)
        return fut, False
      fut = self._cache[key] = cf.Future()
      fut.key = key
      if len(self._cache) > self.cache_size:  # evict the oldest finished entries
        excess = len(self._cache) - self.cache_size
        for k in [k for k, f in self._cache.items() if f.done()][:excess]:
          del self._cache[k]
      return fut, True

  def _fail(self, fut: cf.Future, e: BaseException) -> None:
    with self._cond:
      if self._cache.get(fut.key) is fut:
        del self._cache[fut.key]
    fut.set_exception(e)

  def _request(self, conversation, response) -> tuple[cf.Future, list[int] | None]:
    """(future, token ids or None when cached / in flight) for one pair."""
    fut, new = self._lookup(conversation, response)
    if not new:
      return fut, None
    try:
      return fut, self.model.encode(conversation, response)
    except BaseException as e:
      self._fail(fut, e)
      raise

  def score(self, conversation, response: str) -> np.ndarray:
    """r_K (read-only float32) for one pair; blocks until its batch has run."""
    fut, ids = self._request(conversation, response)
    if ids is not None:
      with self._cond:
        self._queue.append((ids, fut))
        self.num_requests += 1
        if self._thread is None:
          self._thread = threading.Thread(target=self._loop, daemon=True, name="reward-model")
          self._thread.start()
        self._cond.notify_all()
    return fut.result()

  def _loop(self) -> None:
    while True:
      with self._cond:
        while not self._queue:
          self._cond.wait()
        deadline = time.monotonic() + self.max_wait_s
        while len(self._queue) < self.max_batch and time.monotonic() < deadline:
          self._cond.wait(max(deadline - time.monotonic(), 0.0))
        batch, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
      self._run(batch)

  def _run(self, batch) -> None:
    try:
      r_BK = self.model.score_ids([ids for ids, _ in batch])
    except BaseException as e:  # pylint: disable=broad-except
      for _, fut in batch:
        self._fail(fut, e)
      return
    r_BK.setflags(write=False)
    for (_, fut), r_K in zip(batch, r_BK):
      fut.set_result(r_K)

  def score_many(self, conversations: Sequence, responses: Sequence[str]) -> np.ndarray:
    """r_NK for many pairs, computed in forwards of max_batch on the calling thread and
    cached (call it on a whole rollout before the runner so the channels only read)."""
    if len(conversations) != len(responses):
      raise ValueError(f"{len(conversations)} conversations but {len(responses)} responses")
    reqs = []
    try:
      for c, r in zip(conversations, responses):
        reqs.append(self._request(c, r))
    except BaseException as e:  # release the pairs registered so far
      for fut, ids in reqs:
        if ids is not None:
          self._fail(fut, e)
      raise
    todo = [(ids, fut) for fut, ids in reqs if ids is not None]
    with self._cond:
      self.num_requests += len(todo)
    for i in range(0, len(todo), self.max_batch):
      self._run(todo[i:i + self.max_batch])
    return np.stack([fut.result() for fut, _ in reqs])


_MODELS: dict[tuple, MultiObjectiveRewardModel] = {}
_SCORERS: dict[tuple, RewardModelScorer] = {}
_CACHE_LOCK = threading.Lock()


def get_scorer(path: str = ARMORM_HUB, *, dtype: str = "float32", head: str = "auto",
               mesh: Any = None, max_len: int | None = None, padding_side: str = "right",
               max_batch: int = 32, max_wait_ms: float = 10.0) -> RewardModelScorer:
  """The process-wide scorer for a checkpoint: the model is loaded once per (path, dtype,
  head, mesh, max_len, padding_side), the scorer (cache + batcher) once per those and the
  batching options.

  ``mesh``: None, a ``jax.sharding.Mesh`` or mesh axis sizes (``{'fsdp': -1, 'tensor': 2}``).
  """
  if mesh is not None and hasattr(mesh, "items"):  # a dict or ConfigDict of axis sizes
    mesh = {str(k): int(v) for k, v in mesh.items()}
    mesh_key: Any = tuple(sorted(mesh.items()))
  elif mesh is None or isinstance(mesh, jax.sharding.Mesh):
    mesh_key = mesh
  else:
    raise TypeError(f"mesh must be None, a Mesh or a dict of axis sizes, got {type(mesh).__name__}")
  real = os.path.realpath(path) if os.path.isdir(path) else path
  model_key = (real, jnp.dtype(dtype).name, head, mesh_key, max_len, padding_side)
  key = model_key + (max_batch, float(max_wait_ms))
  with _CACHE_LOCK:
    if key not in _SCORERS:
      if model_key not in _MODELS:
        _MODELS[model_key] = MultiObjectiveRewardModel.from_pretrained(
            path, dtype=jnp.dtype(dtype), head=head, max_len=max_len, padding_side=padding_side,
            mesh=shd.make_mesh(mesh) if isinstance(mesh, dict) else mesh)
      _SCORERS[key] = RewardModelScorer(_MODELS[model_key], max_batch=max_batch,
                                        max_wait_ms=max_wait_ms)
    return _SCORERS[key]


# ----------------------------------------------------------------------------- channels
def _rescale_fn(rescale):
  if rescale is None:
    return None
  if isinstance(rescale, str) and rescale == "helpsteer":
    rescale = HELPSTEER_RANGE
  if (not isinstance(rescale, (tuple, list)) or len(rescale) != 2
      or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in rescale)
      or not rescale[0] < rescale[1]):
    raise ValueError(f"rescale must be None, 'helpsteer' or a finite (lo, hi) with lo < hi, "
                     f"got {rescale!r}")
  lo, hi = float(rescale[0]), float(rescale[1])
  return lambda x: min(max((x - lo) / (hi - lo), 0.0), 1.0)


def conversation_of(example: Mapping[str, Any]):
  """The prompt turns of a runner example: ``messages`` (chat turns) or ``prompt`` (str)."""
  if "messages" in example:
    return example["messages"]
  if "prompt" in example:
    return example["prompt"]
  raise MissingFieldError(f"reward-model channels need example['messages'] or example['prompt'] "
                          f"(keys: {sorted(example)})")


def _rm_channel_fn(response, example, num_tokens, *, scorer, index, rescale):
  del num_tokens
  value = float(scorer.score(conversation_of(example), response)[index])
  return value if rescale is None else rescale(value)


def reward_model_channel(objective: int | str, *, path: str = ARMORM_HUB,
                         name: str | None = None, rescale: Any = None, **scorer_kw) -> RewardChannel:
  """A channel returning one objective of the reward model (METHODS.md section 7).

  Args:
    objective: index, full name ('helpsteer-coherence') or HelpSteer short name ('coherence').
    path: checkpoint directory or hub id (default ArmoRM-Llama3-8B-v0.1).
    name: channel name (default ``rm_<objective name>``).
    rescale: None (raw), 'helpsteer' (rating / 4, clipped to [0, 1]) or (lo, hi).
    **scorer_kw: ``get_scorer`` options (dtype, head, mesh, max_len, padding_side,
      max_batch, max_wait_ms). Channels with equal options share one model.

  The model is loaded (and cached) when the channel is built; the first forward of each
  padded shape compiles, so give the runner a ``timeout_s`` that covers it.
  """
  rescale_fn = _rescale_fn(rescale)
  scorer = get_scorer(path, **scorer_kw)
  index = scorer.model.objective_index(objective)
  fn = functools.partial(_rm_channel_fn, scorer=scorer, index=index, rescale=rescale_fn)
  return RewardChannel(name or f"rm_{scorer.model.objectives[index]}", fn, "thread",
                       value_range=DEFAULT_VALUE_RANGE if rescale_fn is None else UNIT_RANGE)


# Registered channels (AMRP alignment profile, objectives 0 / 1 / 2 of ArmoRM), each named as
# registered and taking `reward_model_channel`'s keyword arguments (path=ARMORM_HUB,
# rescale=None, dtype='float32', mesh=None, ...).
@REWARDS.register
def armorm_helpfulness(**kw: Any) -> RewardChannel:
  """ArmoRM objective 0 (helpsteer-helpfulness)."""
  return reward_model_channel(0, name="armorm_helpfulness", **kw)


@REWARDS.register
def armorm_correctness(**kw: Any) -> RewardChannel:
  """ArmoRM objective 1 (helpsteer-correctness)."""
  return reward_model_channel(1, name="armorm_correctness", **kw)


@REWARDS.register
def armorm_coherence(**kw: Any) -> RewardChannel:
  """ArmoRM objective 2 (helpsteer-coherence)."""
  return reward_model_channel(2, name="armorm_coherence", **kw)


@REWARDS.register
def reward_model(objective: int | str, **kw: Any) -> RewardChannel:
  """Any one objective of a reward model, channel named ``reward_model``."""
  return reward_model_channel(objective, name="reward_model", **kw)
