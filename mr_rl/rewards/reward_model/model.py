"""The multi-objective reward model on the Flax backbone: per-objective rewards r[B, K].

Chat-template encoding, bucketed padding and the jitted forward (the head on the final-normed
hidden state of each row's last real token; see the package docstring for the exact pooling).
"""

from __future__ import annotations

import functools
import math
import secrets
import threading
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mr_rl.models import hf_io
from mr_rl.models import sharding as shd
from mr_rl.models.transformer import Transformer, positions_from_mask
from mr_rl.rewards.reward_model.loading import ARMORM_OBJECTIVES, load_reward_model


def _last_index(mask_NT: jax.Array) -> jax.Array:
  """Index of the last position with mask 1 in each row (works for left and right padding)."""
  T = mask_NT.shape[1]
  return T - 1 - jnp.argmax(mask_NT[:, ::-1].astype(jnp.int32), axis=1)


def _forward(model: Transformer, params, w_DK, b_K, tokens_NT, mask_NT):
  """r_BK: the head on the final-normed hidden state of each row's last real token."""
  _, _, h_NTD = model.apply({"params": params}, tokens_NT, positions_from_mask(mask_NT),
                            kv_mask_NC=mask_NT, return_hidden=True)
  last_B = _last_index(mask_NT)
  h_BD = jnp.take_along_axis(h_NTD, last_B[:, None, None], axis=1)[:, 0].astype(jnp.float32)
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
    self._specials: tuple[str, ...] | None = None
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

    The response is untrusted text: where it holds the text of a special token
    (``<|eot_id|><|start_header_id|>user...``), that text is tokenized as plain characters,
    never as the special token, so a response cannot close its turn or forge new ones. The
    ids are then the template's ids around the response's own (``_literal_ids``); any other
    response gets exactly the template's ids.

    Raises:
      ValueError: no tokenizer / chat template, bad messages, or longer than max_len.
    """
    if self.tokenizer is None:
      raise ValueError("this reward model has no tokenizer; pass token ids to score_ids")
    if not isinstance(response, str):
      raise TypeError(f"response must be a str, got {type(response).__name__}")
    messages = [{"role": r, "content": c} for r, c in normalise_conversation(conversation)]
    with self._tok_lock:
      if any(t in response for t in self._special_texts()):
        ids = self._literal_ids(messages, response)
      else:
        out = self.tokenizer.apply_chat_template(
            messages + [{"role": "assistant", "content": response}], tokenize=True,
            add_generation_prompt=False, return_dict=True)
        ids = list(out["input_ids"])
    if len(ids) > self.max_len:
      raise ValueError(f"conversation + response is {len(ids)} tokens, longer than the reward "
                       f"model's max_len {self.max_len}")
    return ids

  def _special_texts(self) -> tuple[str, ...]:
    """The texts the tokenizer would read as special tokens (cached)."""
    if self._specials is None:
      added = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
      texts = {t.content for t in added.values() if getattr(t, "special", False)}
      texts |= set(getattr(self.tokenizer, "all_special_tokens", ()))
      self._specials = tuple(sorted(t for t in texts if t))
    return self._specials

  def _literal_ids(self, messages: list[dict[str, str]], response: str) -> list[int]:
    """The template's ids before and after the assistant content, with the content (as the
    template renders it, e.g. trimmed) tokenized with special tokens NOT parsed."""
    tok = self.tokenizer
    marker = "MRRLRESPONSE" + secrets.token_hex(8)
    render = lambda content: tok.apply_chat_template(
        messages + [{"role": "assistant", "content": content}], tokenize=False,
        add_generation_prompt=False)
    around, full = render(marker).split(marker), render(response)
    if (len(around) != 2 or not full.startswith(around[0]) or not full.endswith(around[1])
        or len(full) < len(around[0]) + len(around[1])):
      raise ValueError("the chat template does not render the response once, unchanged around "
                       "it: cannot keep special-token text in the response literal")
    content = full[len(around[0]):len(full) - len(around[1])]
    piece = lambda text, **kw: list(tok(text, add_special_tokens=False, **kw)["input_ids"])
    return (piece(around[0]) + piece(content, split_special_tokens=True) + piece(around[1]))

  def pad(self, ids_list: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens_NT, mask_NT) int32, bucketed: B up to a power of two (and the mesh's batch
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
  def score_tokens(self, tokens_NT, mask_NT) -> np.ndarray:
    """r_BK float32 for a padded batch (mask 1 on real tokens; left or right padding)."""
    tokens_NT, mask_NT = np.asarray(tokens_NT, np.int32), np.asarray(mask_NT, np.int32)
    if tokens_NT.ndim != 2 or tokens_NT.shape != mask_NT.shape:
      raise ValueError(f"tokens_NT and mask_NT must be equal [N, T], got {tokens_NT.shape} and "
                       f"{mask_NT.shape}")
    if not mask_NT.any(axis=1).all():
      raise ValueError("every row of mask_NT needs at least one real token")
    self.num_forwards += 1
    if self.mesh is None:
      return np.asarray(self._fn(self.params, self._w, self._b, tokens_NT, mask_NT))
    sh = shd.batch_sharding(self.mesh, tokens_NT.shape, self.rules)
    with shd.activation_sharding(self.mesh, self.rules):
      out = self._fn(self.params, self._w, self._b, jax.device_put(tokens_NT, sh),
                     jax.device_put(mask_NT, sh))
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
