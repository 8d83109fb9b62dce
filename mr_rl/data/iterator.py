"""Deterministic, epoch-aware, resumable batch iteration.

The order of epoch `e` is a permutation drawn from `numpy.random.PCG64([seed, e])`
(no shuffle: file order). The position is `(epoch, index)`, `index` counting the
examples of that epoch already handed out, so `state()` is three ints that go into a
checkpoint, and `restore(state)` continues with exactly the batches an uninterrupted
run would have produced. Batches never straddle an epoch boundary.

Multi-host: with `process_count > 1` every process walks the same global order and
takes its contiguous `batch_size / process_count` slice of each global batch.
"""

from __future__ import annotations

from typing import Generic, Mapping, Sequence, TypeVar

import numpy as np

T = TypeVar("T")
_STATE_KEYS = ("epoch", "index", "seed")


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
  """The visiting order of `n` items in `epoch` (int64[n])."""
  if not shuffle:
    return np.arange(n, dtype=np.int64)
  return np.random.Generator(np.random.PCG64([seed, epoch])).permutation(n).astype(np.int64)


class ResumableIterator(Generic[T]):
  """Yields lists of examples (this process's share of each global batch).

  Args:
    examples: the data (any sequence; e.g. a list of `Example`).
    batch_size: global batch size (all processes together).
    seed: shuffle seed (non-negative int).
    shuffle: permute each epoch (False: file order every epoch).
    drop_remainder: drop the last partial batch of an epoch (required with
      `process_count > 1`).
    num_epochs: stop after this many epochs (None: never stop).
    process_index: this process's index in [0, process_count).
    process_count: number of processes sharing each global batch.
  """

  def __init__(self, examples: Sequence[T], batch_size: int, *, seed: int = 0,
               shuffle: bool = True, drop_remainder: bool = True,
               num_epochs: int | None = None, process_index: int = 0,
               process_count: int = 1):
    if not isinstance(batch_size, int) or batch_size < 1:
      raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if num_epochs is not None and (not isinstance(num_epochs, int) or num_epochs < 1):
      raise ValueError(f"num_epochs must be a positive int or None, got {num_epochs!r}")
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index must be in [0, {process_count}), got {process_index}")
    if batch_size % process_count:
      raise ValueError(f"batch_size {batch_size} is not divisible by process_count "
                       f"{process_count}")
    if process_count > 1 and not drop_remainder:
      raise ValueError("drop_remainder must be True when process_count > 1")
    usable = len(examples) - (len(examples) % batch_size if drop_remainder else 0)
    if usable == 0:
      raise ValueError(f"examples: {len(examples)} examples give no batch of {batch_size}")
    self._examples = examples
    self._batch_size = batch_size
    self._seed = int(seed)
    self._shuffle = shuffle
    self._usable = usable
    self._num_epochs = num_epochs
    self._per_process = batch_size // process_count
    self._process_index = process_index
    self._epoch = 0
    self._index = 0
    self._order_epoch = -1
    self._order = np.zeros(0, np.int64)

  @property
  def usable(self) -> int:
    """Examples handed out per epoch (all of them, or without the last partial batch)."""
    return self._usable

  @property
  def batches_per_epoch(self) -> int:
    return -(-self._usable // self._batch_size)

  def state(self) -> dict[str, int]:
    """The position: `{"epoch", "index", "seed"}` (plain ints)."""
    return {"epoch": self._epoch, "index": self._index, "seed": self._seed}

  def restore(self, state: Mapping[str, int]) -> None:
    """Moves to a position saved by `state()`.

    Raises:
      ValueError: wrong keys, negative or out-of-range values, or a different seed.
    """
    if set(state) != set(_STATE_KEYS):
      raise ValueError(f"state must have keys {_STATE_KEYS}, got {sorted(state)}")
    epoch, index, seed = (int(state[k]) for k in _STATE_KEYS)
    if seed != self._seed:
      raise ValueError(f"state seed {seed} differs from this iterator's seed {self._seed}")
    if epoch < 0 or not 0 <= index <= self._usable:
      raise ValueError(f"state position (epoch={epoch}, index={index}) out of range for "
                       f"{self._usable} usable examples per epoch")
    if index == self._usable:
      epoch, index = epoch + 1, 0
    self._epoch, self._index = epoch, index

  def __iter__(self) -> "ResumableIterator[T]":
    return self

  def __next__(self) -> list[T]:
    if self._num_epochs is not None and self._epoch >= self._num_epochs:
      raise StopIteration
    if self._order_epoch != self._epoch:
      self._order = epoch_order(len(self._examples), self._seed, self._epoch, self._shuffle)
      self._order_epoch = self._epoch
    stop = min(self._index + self._batch_size, self._usable)
    idx = self._order[self._index:stop]
    lo = self._process_index * self._per_process
    idx = idx[lo:lo + self._per_process] if self._per_process < self._batch_size else idx
    batch = [self._examples[int(i)] for i in idx]
    self._index = stop
    if self._index >= self._usable:
      self._epoch, self._index = self._epoch + 1, 0
    return batch
