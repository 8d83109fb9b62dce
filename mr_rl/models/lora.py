"""LoRA adapters on the Flax decoder: their config, parameters, shardings, merge and PEFT IO.

An adapted kernel W [*in, *out] gets y = x W + (alpha / R) (x a) b with a [*in, R] and
b [R, *out] (R = rank; `*in` / `*out` are the kernel's own input / output dims, e.g. q_proj
[D, H, W]: a [D, R], b [R, H, W]; o_proj [H, W, D]: a [H, W, R], b [R, D]).

The adapters are a pytree of their own, stacked over layers like the decoder's scanned params:
{'layers': {'attn': {'q_proj': {'a' [L, *in, R], 'b' [L, R, *out]}}, ...}} for every kernel
name some layer adapts, passed to the model as the 'lora' variable collection, which the layer
scan slices per layer (`layers.lora_delta`). Targets that adapt a kernel in some layers only
(`layers_3/attn/*`) keep a = b = 0 in the others: their update is exactly 0 and so are both
gradients ((x a) b with a = b = 0), so they stay 0 under AdamW and never reach a PEFT file. The base params
are never copied:

  * training: the train state holds the adapters and their optimizer state only; the step
    takes the frozen base as a separate (not donated) argument (`mr_rl.rl.update`);
  * the reference policy pi_0 is the base applied without the collection (adapters off), so
    the KL reference costs no memory;
  * elsewhere (sampling, evaluation, TAG's drift, export) the policy is `Adapted(base, lora,
    scale)`, a pytree that `models.logits` applies and `merge` folds into plain params (the
    sampler runs merged weights, merged once per rollout: docs/architecture.md "Models").

Adapters shard like their kernels (`adapter_specs`): a carries the kernel's input logical axes,
b its output axes, and the rank axis 'lora_rank' is replicated (`sharding.DEFAULT_RULES`).
PEFT: `save_peft` writes `adapter_config.json` + `adapter_model.safetensors` that
`peft.PeftModel.from_pretrained(base, dir)` loads; `load_peft` reads one back (trained by
peft or by us). Only attention and dense-MLP kernels take adapters: MoE expert kernels are
refused (`target_paths`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
from typing import Any, ClassVar, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import compilation, fields
from mr_rl.models.config import ModelConfig

KERNELS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_IN_DIMS = {"o_proj": 2}  # input dims of a kernel (1 for the others)
RANK_AXIS = "lora_rank"


def _targets(path, value):
  value = fields.Csv()(path, value)
  if not value:
    raise ValueError(f"config.{path} names no kernel")
  return value


def _adapter_dir(path, value):
  value = fields.string(path, value)
  if value and not os.path.isfile(os.path.join(value, "adapter_config.json")):
    raise ValueError(f"config.{path}={value!r} is not a PEFT adapter directory (no "
                     "adapter_config.json)")
  return value


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Which kernels take adapters, and their size.

  Attributes:
    rank: R.
    alpha: the update is scaled by alpha / R (PEFT's lora_alpha; rsLoRA is not used).
    targets: fnmatch patterns, each matched against a kernel's name ('q_proj') and its path
      ('layers_3/attn/q_proj'); candidates are the attention (q/k/v/o_proj) and dense-MLP
      (gate/up/down_proj) kernels.
    init_from: '' (fresh: a random, b zero) or a PEFT adapter directory to start from.
    dropout: p, PEFT's lora_dropout: the learner's training forward computes
      x W + (alpha / R) (dropout_p(x) a) b (`Adapted.dropout`); every other forward (sampler,
      pi_old recompute, reference, evaluation) has none.
  """
  SECTION: ClassVar[str] = "model.lora"
  rank: int = fields.setting(8, "R, adapter rank (the config's 0 = off: full fine-tuning)",
                             fields.Int(lo=1), config=0)
  alpha: float = fields.setting(16.0, "the update is scaled by alpha / R (PEFT's lora_alpha)",
                                fields.Float(lo=0.0, lo_open=True))
  targets: tuple[str, ...] = fields.setting(
      KERNELS, "kernel names or path patterns ('layers_1/attn/*'), comma-separated; not MoE "
      "experts", _targets, config=",".join(KERNELS))
  init_from: str = fields.setting("", "a PEFT adapter directory to start from ('' = fresh)",
                                  _adapter_dir)
  dropout: float = fields.setting(0.0, "PEFT's lora_dropout p, in the learner's forward only",
                                  fields.Float(0.0, 1.0, hi_open=True))

  def __post_init__(self):
    fields.validate(self)

  @property
  def scale(self) -> float:
    return float(self.alpha) / int(self.rank)


def target_paths(config: ModelConfig, lora: LoraConfig) -> tuple[tuple[str, str, str], ...]:
  """The adapted kernels, one per layer, as ('layers_0', 'attn', 'q_proj'), ..., in model order
  (the names patterns and PEFT files use; the adapters themselves are stacked, `layers_i` being
  index i of the 'layers' axis).

  Raises:
    ValueError: a pattern matches no kernel, or targets MLP kernels of an MoE model.
  """
  out, used = [], set()
  for i in range(config.n_layers):
    for name in KERNELS:
      path = (f"layers_{i}", "attn" if name in _ATTN else "mlp", name)
      hits = [t for t in lora.targets
              if fnmatch.fnmatchcase(name, t) or fnmatch.fnmatchcase("/".join(path), t)]
      if not hits:
        continue
      if config.is_moe and name not in _ATTN:
        raise ValueError(f"LoRA targets {hits} select {'/'.join(path)}, an MoE expert kernel "
                         "(this is an MoE model): LoRA on MoE experts is not supported (not "
                         "implemented); adapt the attention "
                         "kernels only, e.g. config.model.lora.targets="
                         "'q_proj,k_proj,v_proj,o_proj'")
      used.update(hits)
      out.append(path)
  unused = [t for t in lora.targets if t not in used]
  if unused:
    raise ValueError(f"LoRA targets {unused} match no kernel (candidates: {KERNELS}, or paths "
                     "such as 'layers_0/attn/q_proj')")
  return tuple(out)


def _kernel_shape_axes(config: ModelConfig, name: str):
  """(shape, logical axes) of one layer's dense kernel (as `layers` declares it)."""
  c = config
  D, F, H, J, W = c.d_model, c.d_ff, c.n_heads, c.n_kv_heads, c.head_dim
  return {"q_proj": ((D, H, W), ("embed", "heads", "kv")),
          "k_proj": ((D, J, W), ("embed", "kv_heads", "kv")),
          "v_proj": ((D, J, W), ("embed", "kv_heads", "kv")),
          "o_proj": ((H, W, D), ("heads", "kv", "embed")),
          "gate_proj": ((D, F), ("embed", "mlp")),
          "up_proj": ((D, F), ("embed", "mlp")),
          "down_proj": ((F, D), ("mlp", "embed"))}[name]


def _nest(items) -> dict:
  out: dict = {}
  for path, v in items:
    d = out
    for k in path[:-1]:
      d = d.setdefault(k, {})
    d[path[-1]] = v
  return out


def _block(name: str) -> str:
  return "attn" if name in _ATTN else "mlp"


@dataclasses.dataclass(frozen=True)
class _Stacked:
  """One adapted kernel name, stacked over layers: its path in the adapter tree
  (('layers', block, name)), a / b shapes and logical axes (leading 'layers'), and which layers
  it adapts."""
  path: tuple
  a_shape: tuple
  a_axes: tuple
  b_shape: tuple
  b_axes: tuple
  on: tuple  # bool per layer


def _adapter_layout(config: ModelConfig, lora: LoraConfig) -> list[_Stacked]:
  """The stacked adapters of a LoRA config, in KERNELS order."""
  targeted = set(target_paths(config, lora))
  L, R = config.n_layers, int(lora.rank)
  out = []
  for name in KERNELS:
    on = tuple((f"layers_{i}", _block(name), name) in targeted for i in range(L))
    if not any(on):
      continue
    shape, axes = _kernel_shape_axes(config, name)
    k = _IN_DIMS.get(name, 1)
    out.append(_Stacked(("layers", _block(name), name), (L,) + shape[:k] + (R,),
                        ("layers",) + axes[:k] + (RANK_AXIS,), (L, R) + shape[k:],
                        ("layers", RANK_AXIS) + axes[k:], on))
  return out


def adapter_specs(config: ModelConfig, lora: LoraConfig):
  """PartitionSpecs of logical axis names of the adapters (a: 'layers', the kernel's input
  axes, 'lora_rank'; b: 'layers', 'lora_rank', its output axes)."""
  P = jax.sharding.PartitionSpec
  return _nest((st.path, {"a": P(*st.a_axes), "b": P(*st.b_axes)})
               for st in _adapter_layout(config, lora))


def abstract_adapters(config: ModelConfig, lora: LoraConfig):
  """Adapter shapes/dtypes (ShapeDtypeStructs, the param dtype)."""
  dt = config.param_dtype
  return _nest((st.path, {"a": jax.ShapeDtypeStruct(st.a_shape, dt),
                          "b": jax.ShapeDtypeStruct(st.b_shape, dt)})
               for st in _adapter_layout(config, lora))


def init_adapters(config: ModelConfig, lora: LoraConfig, rng: jax.Array, shardings=None):
  """Fresh adapters: a ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PEFT's default) in the adapted
  layers (0 in the others), b = 0, so the adapted policy starts equal to the base. With
  `shardings` (`mr_rl.models.sharding.adapter_shardings`), created in their shards."""
  layout = _adapter_layout(config, lora)
  dt = config.param_dtype

  def init(key):
    items = []
    for i, st in enumerate(layout):
      bound = 1.0 / np.sqrt(np.prod(st.a_shape[1:-1]))
      a = jax.random.uniform(jax.random.fold_in(key, i), st.a_shape, dt, -bound, bound)
      a = a * jnp.asarray(st.on, dt).reshape((-1,) + (1,) * (a.ndim - 1))
      items.append((st.path, {"a": a, "b": jnp.zeros(st.b_shape, dt)}))
    return _nest(items)

  return jax.jit(init, out_shardings=shardings)(rng)


def start_adapters(config: ModelConfig, lora: LoraConfig, params, rng, shardings=None):
  """A run's first adapters: those of `params` if it is an `Adapted` policy (a copy), else
  those of `lora.init_from`, else fresh ones (`init_adapters`).

  Raises:
    ValueError: `lora.init_from` has another rank, alpha or set of adapted kernels.
  """
  if isinstance(params, Adapted):
    return jax.tree.map(lambda x: jnp.array(x, copy=True), params.lora)
  if not lora.init_from:
    return init_adapters(config, lora, rng, shardings)
  adapters, got = load_peft(lora.init_from, config)
  if (got.rank, got.scale) != (lora.rank, lora.scale) or \
      target_paths(config, got) != target_paths(config, lora):
    raise ValueError(f"config.model.lora.init_from={lora.init_from!r} has rank {got.rank}, "
                     f"alpha {got.alpha} and targets {got.targets}; the config asks for rank "
                     f"{lora.rank}, alpha {lora.alpha}, targets {lora.targets}")
  return adapters if shardings is None else jax.device_put(adapters, shardings)


@flax.struct.dataclass
class Adapted:
  """A LoRA policy: the frozen `base` params, the `lora` adapters and the scale alpha / R.

  `models.logits` and `merge` accept it wherever plain params go. With `dropout` p > 0 and
  `row_keys` (one raw PRNG key [N, 2] per batch row: the learner's step, `dropout_row_keys`),
  its forward is the training one: kernel `name` of layer l sees, on row n, its input times
  mask / (1 - p), mask ~ Bernoulli(1 - p) of the row's input shape drawn from
  fold_in(row_keys[n], l * len(KERNELS) + KERNELS.index(name)) (`layers.lora_delta`); the base
  branch sees x as is (PEFT's LoRA dropout). Without `row_keys` there is no dropout (`merge` ignores it).
  """
  base: Any
  lora: Any
  scale: float = flax.struct.field(pytree_node=False, default=1.0)
  dropout: float = flax.struct.field(pytree_node=False, default=0.0)
  row_keys: Any = None

  def variables(self) -> dict:
    """The model's variables: {'params': base, 'lora': adapters with b scaled (and, for a
    dropout forward, each kernel's row keys 'keys' [L, N, 2] and rate 'p' [L], sliced per layer
    by the layer scan)}."""
    scaled = jax.tree_util.tree_map_with_path(
        lambda p, x: x * jnp.asarray(self.scale, x.dtype) if p[-1].key == "b" else x, self.lora)
    if self.row_keys is not None and self.dropout > 0:
      items = []
      for path, ab in _flat_adapters(scaled):
        L = ab["a"].shape[0]
        ids = jnp.arange(L, dtype=jnp.uint32) * len(KERNELS) + KERNELS.index(path[-1])
        keys = jax.vmap(lambda i: jax.vmap(jax.random.fold_in, (0, None))(self.row_keys, i))(ids)
        items.append((path, {**ab, "p": jnp.full((L,), self.dropout, jnp.float32),
                             "keys": keys}))
      scaled = _nest(items)
    return {"params": self.base, "lora": scaled}


def dropout_row_keys(rng: jax.Array, num_rows: int) -> jax.Array:
  """The per-row dropout keys of a learner step: fold_in(rng, n) for n < num_rows, [N, 2].

  Row n's masks depend on its index in the step's batch only, not on the micro-batch split."""
  return jax.vmap(jax.random.fold_in, (None, 0))(rng, jnp.arange(num_rows, dtype=jnp.uint32))


def variables_of(params) -> dict:
  """Model variables of plain params or of an `Adapted` policy."""
  return params.variables() if isinstance(params, Adapted) else {"params": params}


def _delta(a, b):
  """a [L, *in, R] @ b [L, R, *out] -> [L, *in, *out] (float32)."""
  return jax.vmap(lambda x, y: jnp.tensordot(x, y, axes=1))(a.astype(jnp.float32),
                                                           b.astype(jnp.float32))


def _merge_impl(adapted: Adapted):
  base = flax.core.unfreeze(adapted.base) if isinstance(adapted.base, flax.core.FrozenDict) \
      else jax.tree.map(lambda x: x, adapted.base)
  for path, ab in _flat_adapters(adapted.lora):
    d = base
    for k in path[:-1]:
      d = d[k]
    w = d[path[-1]]
    d[path[-1]] = (w.astype(jnp.float32) + adapted.scale * _delta(ab["a"], ab["b"])).astype(w.dtype)
  return base


_merge = jax.jit(compilation.program("lora_merge", _merge_impl))


def merge(params):
  """Plain params: the base with every adapter folded in (W + alpha / R * a @ b per layer,
  computed in float32); plain params are returned as they are."""
  return _merge(params) if isinstance(params, Adapted) else params


def _flat_adapters(lora) -> list[tuple[tuple[str, ...], dict]]:
  out = []

  def walk(d, path):
    if isinstance(d, dict) and set(d) == {"a", "b"}:
      out.append((path, d))
      return
    for k in d:
      walk(d[k], path + (k,))

  walk(dict(lora), ())
  return out


# ----------------------------------------------------------------------------- PEFT IO
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_HF_BLOCK = {"attn": "self_attn", "mlp": "mlp"}
_PEFT_KEY = re.compile(r"(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\."
                       r"(\w+)\.lora_([AB])(?:\.default)?\.weight")


def _hf_module(path) -> str:
  return f"model.layers.{path[0].split('_')[1]}.{_HF_BLOCK[path[1]]}.{path[2]}"


def save_peft(out: str, lora, config: ModelConfig, lora_config: LoraConfig,
              base_model: str = "") -> str:
  """Writes `lora` as a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors).

  PEFT keeps lora_A.weight [R, in] and lora_B.weight [out, R] per nn.Linear (in / out
  flattened in transformers' order, the same reshape as `hf_io`), scaled by lora_alpha / r.
  """
  from safetensors.numpy import save_file
  from mr_rl import distributed
  os.makedirs(out, exist_ok=True)
  paths = target_paths(config, lora_config)
  tensors, modules = {}, []
  flat = dict(_flat_adapters(jax.tree.map(distributed.to_host, lora)))
  layout = _adapter_layout(config, lora_config)
  if set(flat) != {st.path for st in layout}:
    raise ValueError(f"adapters cover {sorted(flat)}, the LoRA config targets "
                     f"{sorted(st.path for st in layout)}")
  for st in layout:  # a layer the targets do not adapt must hold no update (it is not written)
    off = ~np.asarray(st.on)
    stray = [i for i in np.flatnonzero(off) if np.any(flat[st.path]["a"][i]) and
             np.any(flat[st.path]["b"][i])]
    if stray:
      raise ValueError(f"adapters of {'/'.join(st.path)} are non-zero in layers {stray}, which "
                       f"the LoRA targets {lora_config.targets} do not adapt")
  for path in paths:
    layer = int(path[0].split("_")[1])
    a, b = (np.asarray(flat[("layers",) + path[1:]][k][layer], np.float32) for k in ("a", "b"))
    R, mod = a.shape[-1], _hf_module(path)
    tensors[f"base_model.model.{mod}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, R).T)
    tensors[f"base_model.model.{mod}.lora_B.weight"] = np.ascontiguousarray(b.reshape(R, -1).T)
    modules.append(mod)
  names = sorted({p[-1] for p in paths})
  every = len(paths) == len(names) * config.n_layers
  cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": int(lora_config.rank),
         "lora_alpha": float(lora_config.alpha), "lora_dropout": float(lora_config.dropout),
         "target_modules": names if every else modules, "bias": "none",
         "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
         "init_lora_weights": True, "modules_to_save": None, "inference_mode": True,
         "base_model_name_or_path": base_model or None}
  save_file(tensors, os.path.join(out, ADAPTER_WEIGHTS), metadata={"format": "pt"})
  with open(os.path.join(out, ADAPTER_CONFIG), "w") as f:
    json.dump(cfg, f, indent=2, sort_keys=True)
  return out


def load_peft(path: str, config: ModelConfig, dtype=None):
  """(adapters, LoraConfig with exact-path targets) of a PEFT LoRA adapter directory.

  Raises:
    ValueError: a PEFT option this model cannot reproduce (rsLoRA, DoRA, fan_in_fan_out,
      biases, per-module ranks, modules_to_save), or weights that are not LoRA A/B pairs of
      attention / dense-MLP kernels of this architecture.
  """
  from safetensors.numpy import load_file
  with open(os.path.join(path, ADAPTER_CONFIG)) as f:
    cfg = json.load(f)
  unsupported = {"peft_type": cfg.get("peft_type") != "LORA",
                 "use_rslora": bool(cfg.get("use_rslora")), "use_dora": bool(cfg.get("use_dora")),
                 "fan_in_fan_out": bool(cfg.get("fan_in_fan_out")),
                 "bias": cfg.get("bias", "none") != "none",
                 "rank_pattern": bool(cfg.get("rank_pattern")),
                 "alpha_pattern": bool(cfg.get("alpha_pattern")),
                 "modules_to_save": bool(cfg.get("modules_to_save"))}
  bad = [k for k, v in unsupported.items() if v]
  if bad:
    raise ValueError(f"PEFT adapter {path}: unsupported settings {bad} in {ADAPTER_CONFIG}")
  R = int(cfg["r"])
  tensors = load_file(os.path.join(path, ADAPTER_WEIGHTS))
  pairs: dict = {}
  for key, t in tensors.items():
    m = _PEFT_KEY.fullmatch(key)
    if m is None:
      raise ValueError(f"PEFT adapter {path}: unexpected tensor {key!r}")
    layer, block, name, ab = m.groups()
    if name not in KERNELS or (block == "self_attn") != (name in _ATTN):
      raise ValueError(f"PEFT adapter {path}: no such kernel {key!r}")
    pairs.setdefault((f"layers_{layer}", "attn" if block == "self_attn" else "mlp", name),
                     {})[ab] = t
  paths = [p for p in ((f"layers_{i}", "attn" if n in _ATTN else "mlp", n)
                       for i in range(config.n_layers) for n in KERNELS) if p in pairs]
  if len(paths) != len(pairs):
    raise ValueError(f"PEFT adapter {path}: layers beyond the model's {config.n_layers}")
  lora_config = LoraConfig(rank=R, alpha=float(cfg["lora_alpha"]),
                           targets=tuple("/".join(p) for p in paths), init_from=path,
                           dropout=float(cfg.get("lora_dropout") or 0.0))
  dt = config.param_dtype if dtype is None else dtype
  stacked = {st.path: {"a": np.zeros(st.a_shape, np.float32), "b": np.zeros(st.b_shape,
                                                                             np.float32)}
             for st in _adapter_layout(config, lora_config)}
  for p in paths:
    a_shape, b_shape = _ab_shapes(config, p[-1], R)
    ab = pairs[p]
    if set(ab) != {"A", "B"}:
      raise ValueError(f"PEFT adapter {path}: {'/'.join(p)} lacks lora_A or lora_B")
    a, b = ab["A"].T, ab["B"].T
    if a.size != np.prod(a_shape) or b.size != np.prod(b_shape):
      raise ValueError(f"PEFT adapter {path}: {'/'.join(p)} has shapes {ab['A'].shape}, "
                       f"{ab['B'].shape}; the model needs a {a_shape}, b {b_shape}")
    layer = int(p[0].split("_")[1])
    stacked[("layers",) + p[1:]]["a"][layer] = a.reshape(a_shape)
    stacked[("layers",) + p[1:]]["b"][layer] = b.reshape(b_shape)
  return _nest((p, {k: jnp.asarray(v, dt) for k, v in ab.items()})
               for p, ab in stacked.items()), lora_config


def _ab_shapes(config: ModelConfig, name: str, R: int):
  shape, _ = _kernel_shape_axes(config, name)
  k = _IN_DIMS.get(name, 1)
  return shape[:k] + (R,), (R,) + shape[k:]


def count_bytes(tree) -> int:
  """Bytes of the array leaves of a pytree."""
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


__all__: Sequence[str] = ("KERNELS", "LoraConfig", "Adapted", "target_paths", "adapter_specs",
                          "abstract_adapters", "init_adapters", "start_adapters", "merge",
                          "dropout_row_keys",
                          "variables_of", "save_peft", "load_peft", "count_bytes")
