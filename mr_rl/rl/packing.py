"""Sequence packing of the update batch: several sequences per row, none of their padding.

`pack(batch, config, row_multiple)` turns the trainer's update batch (N rows of prompt +
response, `mr_rl.rollout.update_batch`) into N' packed rows of width W: every sequence that
enters the loss is written, without its padding, back to back into a packed row, and
`segment_ids_NT` (1, 2, ... per sequence, 0 on the row's tail padding) tells the model to
restart positions and to attend only inside each segment (`mr_rl.models.logits`). Sequences
that carry no loss token (masked truncated responses, dynamic sampling's unfilled slots) are
left out, so the step computes on the tokens in use.

The loss is a weighted sum over tokens (`mr_rl.rl.losses`), and the weights are computed on
the unpacked rows before packing (`weights_NT`, `metric_weights_NT`), so a packed batch gives
the unpacked loss, gradients and metrics up to float summation order in every aggregation
mode (a packed row is not a sequence: per-sequence normalisers cannot be recomputed on it).

Placement: first-fit decreasing by length into rows of width W = `column_bucket` of the longest
sequence; the row count is rounded up to `row_multiple` (micro-batches x data shards) times a
`size_bucket`, so the compiled shapes stay few. Shape letters: N rows of the unpacked batch,
T its columns, N' / W the packed rows / columns (`_NT` in the returned dict, as the step reads
every batch key).
"""

from __future__ import annotations

import numpy as np

from mr_rl.rollout import column_bucket, size_bucket
from mr_rl.rl.losses import token_weights


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


def pack(batch: dict, loss_agg: str, norm_len, row_multiple: int) -> dict:
  """The packed form of an unpacked GRPO-family update batch (module docstring).

  Args:
    batch: `update_batch` keys (`tokens_NT`, `mask_NT`, `response_mask_NT`, `old_logp_NT`,
      `advantages_BG`), optionally `ref_logp_NT`; host or device arrays.
    loss_agg, norm_len: the loss aggregation (`PolicyLossConfig`), for the weights.
    row_multiple: packed rows are a multiple of this (micro-batches x data shards).

  Returns:
    {tokens, mask, segment_ids, response_mask, old_logp, advantages, weights,
    metric_weights[, ref_logp]}_NT over N' packed rows x W columns, plus `rows_packed` (int,
    sequences placed) for logging.
  """
  tok = np.asarray(batch["tokens_NT"])
  mask = np.asarray(batch["mask_NT"]) > 0
  resp = np.asarray(batch["response_mask_NT"])
  per_token = {"old_logp_NT": np.asarray(batch["old_logp_NT"], np.float32)}
  if "ref_logp_NT" in batch:
    per_token["ref_logp_NT"] = np.asarray(batch["ref_logp_NT"], np.float32)
  adv_N = np.asarray(batch["advantages_BG"], np.float32).reshape(-1)
  N, T = tok.shape
  if adv_N.shape != (N,):
    raise ValueError(f"advantages_BG has {adv_N.size} values for {N} rows")
  w = np.asarray(token_weights(resp, loss_agg, norm_len), np.float32)
  mw = np.asarray(token_weights(resp, "token-mean"), np.float32)
  used = np.flatnonzero(resp.sum(1) > 0)
  starts = mask.argmax(1)
  lengths = mask.sum(1)
  for i in used:  # a sequence is one run of real tokens (left-padded prompt, right-padded reply)
    if not mask[i, starts[i]:starts[i] + lengths[i]].all():
      raise ValueError(f"row {i}: real tokens are not contiguous; cannot pack it")
  width = column_bucket(int(lengths[used].max()) if used.size else 1, T)
  rows = placement(lengths[used], width)
  n_rows = row_multiple * size_bucket(-(-max(len(rows), 1) // row_multiple))
  n_rows = min(n_rows, -(-N // row_multiple) * row_multiple)  # never more rows than unpacked
  out = {k: np.zeros((n_rows, width), d) for k, d in (
      ("tokens_NT", tok.dtype), ("mask_NT", np.int32), ("segment_ids_NT", np.int32),
      ("response_mask_NT", resp.dtype), ("advantages_NT", np.float32),
      ("weights_NT", np.float32), ("metric_weights_NT", np.float32),
      *((k, np.float32) for k in per_token))}
  for r, members in enumerate(rows):
    col = 0
    for seg, j in enumerate(members, start=1):
      i = used[j]
      a, n = starts[i], lengths[i]
      dst = slice(col, col + n)
      src = slice(a, a + n)
      out["tokens_NT"][r, dst] = tok[i, src]
      out["mask_NT"][r, dst] = 1
      out["segment_ids_NT"][r, dst] = seg
      out["response_mask_NT"][r, dst] = resp[i, src]
      for k, v in per_token.items():
        out[k][r, dst] = v[i, src]
      out["advantages_NT"][r, dst] = adv_N[i]
      out["weights_NT"][r, dst] = w[i, src]
      out["metric_weights_NT"][r, dst] = mw[i, src]
      col += n
  out["rows_packed"] = int(used.size)
  return out
