"""Device mesh, logical-axis rules and sharded parameter / cache creation (docs/style.md §7, §8).

The model only names logical axes ('vocab', 'embed', 'heads', 'kv_heads', 'kv', 'mlp',
'expert', 'router', 'norm' and the layer scan's 'layers' for params; 'activation_*' for activations; 'cache_*' for the KV
cache). This module maps them onto the mesh axes (data, fsdp, tensor, expert):

  * params: 'embed' -> fsdp (ZeRO-3 style), heads / kv_heads / mlp / vocab -> tensor,
    'expert' -> expert; norms, head_dim and the stacked 'layers' axis replicated.
  * activations / cache / token batches: batch over (data, fsdp, expert), the rest replicated
    except the MLP hidden and vocab dims (tensor).

Training state and batches (used by `mr_rl.rl.update.learner`): optimizer moments follow
their params (`train_state_shardings`), update-batch rows split over `data_axes(mesh)`
(`batch_shardings`).

Typical use:
  mesh = make_mesh({'data': 1, 'fsdp': -1, 'tensor': 2, 'expert': 1})
  params = init_sharded(model, rng, mesh)            # or hf_io.load_pretrained(..., mesh=mesh)
  with activation_sharding(mesh):                      # constraints inside the model apply
    out = jax.jit(fn, in_shardings=..., out_shardings=...)(params, ...)
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import optax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from mr_rl.models import lora as lora_lib
from mr_rl.models.config import ModelConfig
from mr_rl.models.layers import CACHE_K_AXES, CACHE_V_AXES, LayerCache, cache_shapes
from mr_rl.models.transformer import Transformer, abstract_params

MESH_AXES = ("data", "fsdp", "tensor", "expert")
BATCH_AXES = ("data", "fsdp", "expert")

DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    # parameters
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("expert", "expert"),
    ("router", None),
    ("norm", None),
    ("lora_rank", None),  # LoRA adapters: a [*in, R], b [R, *out] (mr_rl.models.lora)
    ("layers", None),     # the layer scan's stacked axis (params, adapters, KV cache): every
                          # device holds every layer of its shard
    # activations
    ("activation_batch", BATCH_AXES),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
    # KV cache
    ("cache_batch", BATCH_AXES),
    ("cache_length", None),
)


def validate_rules(rules: Sequence[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
  """Checks rules are (logical name, mesh axis | tuple of mesh axes | None) pairs."""
  out = []
  for r in rules:
    if not (isinstance(r, (tuple, list)) and len(r) == 2 and isinstance(r[0], str)):
      raise ValueError(f"logical axis rule {r!r} is not a (logical_name, mesh_axis) pair")
    name, ax = r
    axes = () if ax is None else ((ax,) if isinstance(ax, str) else tuple(ax))
    bad = [a for a in axes if a not in MESH_AXES]
    if bad:
      raise ValueError(f"rule for {name!r} names unknown mesh axes {bad}; valid: {MESH_AXES}")
    out.append((name, ax if ax is None or isinstance(ax, str) else tuple(ax)))
  return tuple(out)


def make_mesh(axis_sizes: Mapping[str, int] | Sequence[int], devices=None) -> Mesh:
  """Mesh over (data, fsdp, tensor, expert); one size may be -1 (fills the remaining devices).

  Args:
    axis_sizes: dict (or ConfigDict) with some of the four axes (missing ones are 1), or a
      sequence of four sizes in MESH_AXES order.
    devices: devices to use (default jax.devices()).

  Raises:
    ValueError: unknown axis, more than one -1, or sizes whose product != device count.
  """
  devices = list(jax.devices() if devices is None else devices)
  if isinstance(axis_sizes, Mapping) or hasattr(axis_sizes, "items"):
    sizes = dict(axis_sizes.items())
    unknown = set(sizes) - set(MESH_AXES)
    if unknown:
      raise ValueError(f"make_mesh: unknown mesh axes {sorted(unknown)}; valid: {MESH_AXES}")
    shape = [int(sizes.get(a, 1)) for a in MESH_AXES]
  else:
    shape = [int(s) for s in axis_sizes]
    if len(shape) != len(MESH_AXES):
      raise ValueError(f"make_mesh: need {len(MESH_AXES)} sizes {MESH_AXES}, got {shape}")
  if shape.count(-1) > 1:
    raise ValueError(f"make_mesh: at most one axis may be -1, got {dict(zip(MESH_AXES, shape))}")
  if any(s == 0 or s < -1 for s in shape):
    raise ValueError(f"make_mesh: sizes must be positive or -1, got {dict(zip(MESH_AXES, shape))}")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if len(devices) % known:
      raise ValueError(f"make_mesh: {len(devices)} devices not divisible by the fixed axes "
                       f"product {known}")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    raise ValueError(f"make_mesh: mesh {dict(zip(MESH_AXES, shape))} needs {math.prod(shape)} "
                     f"devices, have {len(devices)}")
  try:
    dev_array = mesh_utils.create_device_mesh(shape, devices)
  except (ValueError, NotImplementedError, AssertionError):
    dev_array = np.asarray(devices).reshape(shape)
  return Mesh(dev_array, MESH_AXES)


def _sharding_for(spec: P, shape, mesh: Mesh, what: str) -> NamedSharding:
  for dim, ax in zip(shape, spec):
    if ax is None:
      continue
    n = math.prod(mesh.shape[a] for a in ((ax,) if isinstance(ax, str) else ax))
    if dim % n:
      raise ValueError(f"{what}: dimension {dim} of shape {tuple(shape)} is not divisible by "
                       f"mesh axes {ax} (size {n}); change the mesh or the logical rules")
  return NamedSharding(mesh, spec)


def logical_specs(model: Transformer):
  """PartitionSpecs of logical axis names for every param (from jax.eval_shape)."""
  return nn.get_partition_spec(abstract_params(model, boxed=True))


def param_shardings(model: Transformer, mesh: Mesh, rules=None):
  """NamedSharding for every param (same tree as params)."""
  rules = validate_rules(DEFAULT_RULES if rules is None else rules)
  specs = logical_specs(model)
  shapes = abstract_params(model)
  mesh_specs = nn.logical_to_mesh(specs, rules)
  flat, treedef = jax.tree_util.tree_flatten_with_path(
      mesh_specs, is_leaf=lambda x: isinstance(x, P))
  shape_leaves = jax.tree_util.tree_leaves(shapes)
  out = [_sharding_for(spec, s.shape, mesh, f"param {jax.tree_util.keystr(path)}")
         for (path, spec), s in zip(flat, shape_leaves)]
  return jax.tree_util.tree_unflatten(treedef, out)


def adapter_shardings(config: ModelConfig, lora: lora_lib.LoraConfig, mesh: Mesh, rules=None):
  """NamedSharding of every LoRA adapter leaf (`mr_rl.models.lora.adapter_specs`: a has its
  kernel's input axes, b its output axes, the rank replicated)."""
  rules = validate_rules(DEFAULT_RULES if rules is None else rules)
  mesh_specs = nn.logical_to_mesh(lora_lib.adapter_specs(config, lora), rules)
  return jax.tree.map(lambda spec, s: _sharding_for(spec, s.shape, mesh, "LoRA adapter"),
                      mesh_specs, lora_lib.abstract_adapters(config, lora),
                      is_leaf=lambda x: isinstance(x, P))


def init_sharded(model: Transformer, rng: jax.Array, mesh: Mesh, rules=None):
  """Random params created already sharded: eval_shape -> shardings -> jit(init, out_shardings)."""
  shardings = param_shardings(model, mesh, rules)

  def init(key):
    tokens = jnp.zeros((1, 8), jnp.int32)
    return nn.meta.unbox(model.init(key, tokens, tokens)["params"])

  return jax.jit(init, out_shardings=shardings)(rng)


def shard_params(params, model: Transformer, mesh: Mesh, rules=None):
  """Moves existing params onto their shardings (device_put per leaf)."""
  return jax.device_put(params, param_shardings(model, mesh, rules))


def logical_sharding(mesh: Mesh, logical_axes: Sequence[str | None], shape=None,
                     rules=None) -> NamedSharding:
  """NamedSharding for an array whose dims carry the given logical names."""
  rules = validate_rules(DEFAULT_RULES if rules is None else rules)
  spec = nn.logical_to_mesh_axes(tuple(logical_axes), rules)
  if shape is None:
    return NamedSharding(mesh, spec)
  return _sharding_for(spec, shape, mesh, f"array with logical axes {tuple(logical_axes)}")


def batch_sharding(mesh: Mesh, shape=None, rules=None) -> NamedSharding:
  """Sharding of an [N, T, ...] token / mask / logits batch: batch over (data, fsdp, expert)."""
  ndim = 2 if shape is None else len(shape)
  return logical_sharding(mesh, ("activation_batch",) + (None,) * (ndim - 1), shape, rules)


def cache_shardings(config: ModelConfig, mesh: Mesh, batch_size: int, max_len: int,
                    rules=None) -> tuple:
  """Shardings of `init_cache(config, batch_size, max_len)` (one LayerCache, layers stacked)."""
  k_shape, v_shape = cache_shapes(config, batch_size, max_len)
  return LayerCache(k=logical_sharding(mesh, CACHE_K_AXES, k_shape, rules),
                    v=logical_sharding(mesh, CACHE_V_AXES, v_shape, rules))


def data_axes(mesh: Mesh) -> tuple[str, ...]:
  """The mesh axes batch rows are split over: those of `BATCH_AXES` the mesh has."""
  return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def data_parallel_size(mesh: Mesh) -> int:
  """How many ways batch rows are split (the product of `data_axes(mesh)`)."""
  return math.prod(mesh.shape[a] for a in data_axes(mesh))


def batch_shardings(batch_abstract, mesh: Mesh):
  """Shardings of a learner batch (`mr_rl.rl.batch.LearnerBatch`, or any pytree of
  `[N, ...]` arrays or ShapeDtypeStructs): rows split over `data_axes(mesh)`."""
  axes = data_axes(mesh)
  return jax.tree.map(lambda x: NamedSharding(mesh, P(axes, *[None] * (jnp.ndim(x) - 1))),
                      batch_abstract)


def optimizer_state_shardings(tx: optax.GradientTransformation, opt_state_abstract,
                              param_shardings, mesh: Mesh):
  """Shardings of `tx.init(params)`: moments follow their params, counters replicate."""
  repl = NamedSharding(mesh, P())
  return optax.tree_map_params(tx, lambda _, s: s, opt_state_abstract, param_shardings,
                               transform_non_params=lambda _: repl)


def train_state_shardings(state_abstract, tx, param_shardings, mesh: Mesh, value_tx=None,
                          value_param_shardings=None):
  """Shardings of a `mr_rl.rl.update.TrainState` (same dataclass, sharding leaves).

  Args:
    state_abstract: `jax.eval_shape` of the state.
    tx / value_tx: the policy / critic optimizers that built it.
    param_shardings / value_param_shardings: `param_shardings(...)` of the policy and the
      critic's (None without a critic).
  """
  repl = NamedSharding(mesh, P())
  return state_abstract.replace(
      step=repl, params=param_shardings,
      opt_state=optimizer_state_shardings(tx, state_abstract.opt_state, param_shardings, mesh),
      value_params=value_param_shardings,
      value_opt_state=None if value_tx is None else optimizer_state_shardings(
          value_tx, state_abstract.value_opt_state, value_param_shardings, mesh))


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules=None):
  """Context in which the model's logical activation constraints bind to `mesh`."""
  rules = validate_rules(DEFAULT_RULES if rules is None else rules)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield
