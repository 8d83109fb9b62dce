"""The shared scorer: a cache of score vectors and a micro-batcher in front of one model.

``get_scorer`` gives one ``RewardModelScorer`` per checkpoint and options to the whole
process, so channels with equal options share one loaded model and one cache.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import os
import threading
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl.models import sharding as shd
from mr_rl.rewards.reward_model.loading import ARMORM_HUB
from mr_rl.rewards.reward_model.model import MultiObjectiveRewardModel, normalise_conversation


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

  ``mesh``: None, a ``jax.sharding.Mesh`` or mesh axis sizes (``{'fsdp': -1, 'tensor': 2}``)
  of a mesh over this process's own devices: in a multi-process run each process scores the
  rows it owns with its own copy of the reward model, so a scoring call never waits on a
  collective with the other processes (whose rows and timing differ).
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
            mesh=shd.make_mesh(mesh, devices=jax.local_devices()) if isinstance(mesh, dict)
            else mesh)
      _SCORERS[key] = RewardModelScorer(_MODELS[model_key], max_batch=max_batch,
                                        max_wait_ms=max_wait_ms)
    return _SCORERS[key]
