"""How many decode slots of the continuous engine (`engine.py`) fit a device's memory.

Shape letters (docs/shapes.md): P prompt columns, S response columns, C = P + S cache slots of
one decode slot, G responses per prompt, L layers, J key/value heads, W head width, H query
heads, D model width, F MLP width, V vocabulary.

Per decode slot the engine keeps (`slots.SlotState`, `slots.PromptStore`):
  * its KV cache: 2 (keys, values) * L * J * W * C elements of the cache dtype;
  * a share of the prompt store: 2 * M entries of P columns with M = ceil(slots / G), i.e.
    2 / G prompt caches per slot (2 * L * J * W * P elements each) plus their masks;
  * small buffers: the key mask (C bytes), the response's tokens and log-probs (8 * S bytes).
On a mesh, slots are split over the batch axes (data, fsdp, expert) and each slot's cache over
the tensor axis (key/value heads). A decode step also needs working memory per slot (float32
logits and their sampling temporaries over the vocabulary share, attention scores over C,
the MLP hidden) and a prefill of M prompts (activations over P columns, scores P x P); both
are estimated, not exact: keep headroom (`launch/check.py` compiles the real programs). With
the tail shrink on (`Engine(shrink_tail=True)`, the default), the first shrink holds the full
pool, its half-size copy and the gather's temporary (a quarter) at once: 3/4 of a slot's cache
and buffers more per slot (launch/check.py's engine_shrink, compiled).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import jax.numpy as jnp

# float32 copies of a slot's [V] logits alive in a decode step (logits, exp / filtered,
# log-softmax, sampling blocks).
LOGIT_COPIES = 4


@dataclasses.dataclass(frozen=True)
class SlotBudget:
  """Bytes per device, and the slots that fit (`slots_that_fit`).

  Attributes:
    slots: slots over the whole mesh (a multiple of the data-parallel size; 0 if none fit).
    slots_per_device: slots / data-parallel size.
    params_bytes: parameters per device.
    reserved_bytes: other resident memory per device (e.g. the train state), as given.
    cache_bytes_per_slot: one slot's KV cache on one device.
    store_bytes_per_slot: its share of the prompt store.
    buffer_bytes_per_slot: key mask, tokens, log-probs.
    shrink_bytes_per_slot: the tail shrink's transient copy (0 without it).
    work_bytes_per_slot: estimated decode and prefill working memory per slot.
    budget_bytes: usable bytes per device (HBM less headroom).
  """
  slots: int
  slots_per_device: int
  params_bytes: float
  reserved_bytes: float
  cache_bytes_per_slot: float
  store_bytes_per_slot: float
  buffer_bytes_per_slot: float
  work_bytes_per_slot: float
  budget_bytes: float
  shrink_bytes_per_slot: float = 0.0

  @property
  def bytes_per_slot(self) -> float:
    """Everything one slot costs on its device."""
    return (self.cache_bytes_per_slot + self.store_bytes_per_slot + self.buffer_bytes_per_slot
            + self.work_bytes_per_slot + self.shrink_bytes_per_slot)


def _axis(mesh_shape: Optional[Mapping[str, int]], name: str) -> int:
  return int((mesh_shape or {}).get(name, 1))


def slot_cache_bytes(config, prompt_len: int, max_new_tokens: int, cache_dtype=None,
                     tensor: int = 1) -> int:
  """Bytes of one slot's KV cache (keys and values of C = P + S columns) on one device, the
  key/value heads split over `tensor` devices."""
  itemsize = jnp.dtype(config.dtype if cache_dtype is None else cache_dtype).itemsize
  heads = config.n_kv_heads // tensor if config.n_kv_heads % tensor == 0 else config.n_kv_heads
  return 2 * config.n_layers * heads * config.head_dim * (prompt_len + max_new_tokens) * itemsize


def decode_work_bytes(config, cols: int, tensor: int = 1) -> float:
  """Estimated working memory of one slot in one decode step (float32 logits and their sampling
  temporaries over the vocabulary share, attention scores over the C = `cols` columns, the MLP
  hidden), on one device, heads and vocabulary split over `tensor` devices."""
  heads = max(1, config.n_heads // tensor)
  d_ff = max(config.d_ff, config.moe_d_ff * max(1, config.num_experts_per_tok))
  return 4 * (LOGIT_COPIES * config.vocab_size / tensor + 2 * heads * cols + 3 * d_ff / tensor
              + 8 * config.d_model)


def slot_budget(config, *, hbm_bytes: float, prompt_len: int, max_new_tokens: int,
                group_size: int = 1, mesh_shape: Optional[Mapping[str, int]] = None,
                cache_dtype=None, params_count: Optional[int] = None,
                reserved_bytes: float = 0.0, headroom: float = 0.1,
                shrink_tail: bool = True) -> SlotBudget:
  """The per-device memory of the continuous engine's slots and how many fit.

  Args:
    config: the model's `ModelConfig`.
    hbm_bytes: memory per device (e.g. `config_lib.CHIPS[chip].hbm_bytes`).
    prompt_len: P (the prompt bucket the rollout pads to; `data.max_prompt_len` at most).
    max_new_tokens: S.
    group_size: G (the prompt store holds 2 * ceil(slots / G) prompts).
    mesh_shape: mesh axis sizes, e.g. {"data": 1, "fsdp": 1, "tensor": 4, "expert": 1}
      (None: one device).
    cache_dtype: KV-cache dtype (None: config.dtype).
    params_count: parameter count (None: `models.count_params(config)`, from eval_shape).
    reserved_bytes: other memory resident per device while sampling (e.g. the train state's
      optimizer moments, which launch/check.py lists per device).
    headroom: fraction of `hbm_bytes` kept free (fragmentation, XLA temporaries).
    shrink_tail: the engine compacts its tail into half-size pools (module docstring).

  Returns:
    SlotBudget; `slots` is 0 when not even one slot per data-parallel group fits.
  """
  if prompt_len < 1 or max_new_tokens < 1 or group_size < 1:
    raise ValueError(f"prompt_len, max_new_tokens and group_size must be >= 1, got "
                     f"{prompt_len}, {max_new_tokens}, {group_size}")
  if not 0.0 <= headroom < 1.0:
    raise ValueError(f"headroom must be in [0, 1), got {headroom}")
  tensor, fsdp, expert = (_axis(mesh_shape, a) for a in ("tensor", "fsdp", "expert"))
  dp = _axis(mesh_shape, "data") * fsdp * expert
  if params_count is None:
    from mr_rl.models import count_params
    params_count = count_params(config)
  p_item = jnp.dtype(config.param_dtype).itemsize
  # Large weights split over fsdp and tensor; with experts the expert weights over `expert` too.
  params_bytes = params_count * p_item / (fsdp * tensor * (expert if config.num_experts else 1))
  cols = prompt_len + max_new_tokens
  cache = slot_cache_bytes(config, prompt_len, max_new_tokens, cache_dtype, tensor)
  prompt_cache = slot_cache_bytes(config, prompt_len, 0, cache_dtype, tensor)
  store = 2.0 / group_size * (prompt_cache + prompt_len + 8)
  buffers = cols + 8 * max_new_tokens + 18  # key mask, tokens, log-probs, 6 per-slot scalars
  # The first shrink: the half-size pool and its gather's temporary (half of that, as
  # compiled), beside the full pool.
  shrink = 0.75 * (cache + buffers) if shrink_tail else 0.0
  heads = max(1, config.n_heads // tensor)
  d_ff = max(config.d_ff, config.moe_d_ff * max(1, config.num_experts_per_tok))
  decode_work = decode_work_bytes(config, cols, tensor)
  prefill_work = 4 * prompt_len * (heads * prompt_len + 3 * d_ff / tensor
                                   + 8 * config.d_model) / group_size
  work = decode_work + prefill_work
  budget = hbm_bytes * (1.0 - headroom)
  free = budget - params_bytes - reserved_bytes
  per_slot = cache + store + buffers + work + shrink
  per_device = max(0, int(free // per_slot))
  return SlotBudget(slots=per_device * dp, slots_per_device=per_device, params_bytes=params_bytes,
                    reserved_bytes=float(reserved_bytes), cache_bytes_per_slot=float(cache),
                    store_bytes_per_slot=float(store), buffer_bytes_per_slot=float(buffers),
                    work_bytes_per_slot=float(work), budget_bytes=float(budget),
                    shrink_bytes_per_slot=float(shrink))


def slots_that_fit(config, *, hbm_bytes: float, prompt_len: int, max_new_tokens: int,
                   group_size: int = 1, mesh_shape: Optional[Mapping[str, int]] = None,
                   cache_dtype=None, reserved_bytes: float = 0.0, headroom: float = 0.1,
                   shrink_tail: bool = True) -> int:
  """The number of engine slots (over the whole mesh) that fit `hbm_bytes` per device; see
  `slot_budget` for the arguments and the memory model."""
  return slot_budget(config, hbm_bytes=hbm_bytes, prompt_len=prompt_len,
                     max_new_tokens=max_new_tokens, group_size=group_size,
                     mesh_shape=mesh_shape, cache_dtype=cache_dtype,
                     reserved_bytes=reserved_bytes, headroom=headroom,
                     shrink_tail=shrink_tail).slots
