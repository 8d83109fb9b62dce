"""Hugging Face checkpoint IO: config.json <-> ModelConfig, safetensors <-> params, tokenizer.

Loading reads one tensor at a time (safetensors memory-maps each file) and puts it straight
into its target sharding (`jax.make_array_from_callback` with the NamedSharding derived from
the parameter's logical axes when a mesh is given), so the model is never materialised whole
on a host. Saving writes transformers' layout (per-expert MoE tensors, [out, in] Linear
weights, `model.safetensors` or shards + index) and a config.json transformers/vLLM read.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for safetensors)
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from mr_rl import distributed, package_paths
from mr_rl.errors import DamagedFileError, UserError
from mr_rl.models import families
from mr_rl.models.config import ModelConfig, get_preset
from mr_rl.models.transformer import LAYERS, Transformer, abstract_params

_DTYPE_NAMES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# Architecture fields a preset fixes (dtype / impl fields may differ).
_ARCH_FIELDS = ("family", "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                "head_dim", "d_ff", "rope_theta", "rope_scaling", "norm_eps", "qk_norm",
                "tie_embeddings", "num_experts", "num_experts_per_tok", "moe_d_ff",
                "norm_topk_prob")
_IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)  # non-persistent buffers some old exports carry


# ----------------------------------------------------------------------------- config mapping
def config_from_hf(hf: dict, **overrides) -> ModelConfig:
  """Maps a transformers config.json dict to ModelConfig.

  Reads RoPE settings in both forms: transformers-5 `rope_parameters` and hub-style top-level
  `rope_theta` / `rope_scaling`.

  Raises:
    ValueError: unsupported model_type or features (biases, sliding window, non-SiLU MLP,
      dense layers inside a MoE model).
  """
  spec = families.for_model_type(hf.get("model_type"))
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"config.json hidden_act {hf['hidden_act']!r} unsupported (only 'silu')")
  for flag in ("attention_bias", "mlp_bias"):
    if hf.get(flag, False):
      raise ValueError(f"config.json {flag}=true is not supported")
  if hf.get("use_sliding_window", False):
    raise ValueError("config.json use_sliding_window=true is not supported")
  own = spec.config_from_hf(hf)
  rp = hf.get("rope_parameters") or {}
  if isinstance(rp, dict) and "rope_theta" in rp:
    theta, scaling = rp["rope_theta"], rp
  else:
    theta, scaling = hf.get("rope_theta", 10000.0), hf.get("rope_scaling")
  heads = hf["num_attention_heads"]
  kw: dict[str, Any] = dict(
      family=spec.name, vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
      n_layers=hf["num_hidden_layers"], n_heads=heads,
      n_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      d_ff=hf.get("intermediate_size", 0), rope_theta=float(theta), rope_scaling=scaling,
      norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      max_seq_len=int(hf.get("max_position_embeddings", 4096)))
  kw.update(own)
  kw.update(overrides)
  return ModelConfig(**kw)


def hf_config_from(config: ModelConfig, extra: dict | None = None) -> dict:
  """The transformers config.json dict for a ModelConfig (hub-style rope_theta/rope_scaling)."""
  dtype_name = jnp.dtype(config.param_dtype).name
  spec = families.FAMILIES.get(config.family)
  hf: dict[str, Any] = {
      "architectures": [spec.architecture], "model_type": spec.model_types[0],
      "vocab_size": config.vocab_size, "hidden_size": config.d_model,
      "intermediate_size": config.d_ff, "num_hidden_layers": config.n_layers,
      "num_attention_heads": config.n_heads, "num_key_value_heads": config.n_kv_heads,
      "head_dim": config.head_dim, "hidden_act": "silu",
      "max_position_embeddings": config.max_seq_len, "rms_norm_eps": config.norm_eps,
      "rope_theta": config.rope_theta,
      "rope_scaling": None if config.rope_scaling is None else dict(config.rope_scaling),
      "tie_word_embeddings": config.tie_embeddings, "attention_bias": False,
      "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
      "dtype": dtype_name, "torch_dtype": dtype_name,
  }
  hf.update(spec.hf_config_extra(config))
  for k, v in (extra or {}).items():
    hf.setdefault(k, v)
  return hf


def check_against_preset(config: ModelConfig, preset: str) -> None:
  """Raises ValueError naming every architecture field where config differs from the preset."""
  ref = get_preset(preset)
  diff = {f: (getattr(config, f), getattr(ref, f)) for f in _ARCH_FIELDS
          if getattr(config, f) != getattr(ref, f)}
  if diff:
    lines = ", ".join(f"{f}: checkpoint {a!r} vs preset {b!r}" for f, (a, b) in diff.items())
    raise ValueError(f"checkpoint config does not match preset {preset!r}: {lines}")


# ----------------------------------------------------------------------------- name mapping
class Mapped(NamedTuple):
  """One parameter of ours and the transformers tensors it comes from.

  Attributes:
    path: our param path, e.g. ('layers', 'attn', 'q_proj').
    names: the HF tensor names per layer ([L] tuples: the entry is a stacked
      [L, ...] param of the layer scan) or a single tuple (`per_layer` False).
    to_ours: list of HF arrays (one layer's) -> our array (one layer's).
    to_hf: our array (one layer's) -> list of HF arrays.
    per_layer: whether `path` is a stacked param of the decoder's layer scan.
  """
  path: tuple
  names: tuple
  to_ours: Callable
  to_hf: Callable
  per_layer: bool = False

  def all_names(self) -> list[str]:
    """Every HF tensor name of this entry."""
    return [n for ns in self.names for n in ns] if self.per_layer else list(self.names)


def param_mapping(config: ModelConfig) -> list[Mapped]:
  """Every parameter of a config with its transformers tensors (`Mapped`); the decoder
  blocks' params are stacked over layers (`per_layer`), each layer i read from
  `model.layers.{i}.*`. The MLP's entries are the family's (`FamilySpec.mlp_mapping`)."""
  c = config
  same, lin, lin_in = families.SAME, families.linear, families.linear_in
  out = [Mapped(("embedding",), ("model.embed_tokens.weight",), *same),
         Mapped(("final_norm", "scale"), ("model.norm.weight",), *same)]
  if not c.tie_embeddings:
    out.append(Mapped(("lm_head",), ("lm_head.weight",), lambda ts: ts[0].T,
                      lambda a: [np.ascontiguousarray(a.T)]))
  block = [  # (our path inside the block, HF names inside model.layers.{i}, to_ours, to_hf)
      (("attn_norm", "scale"), ["input_layernorm.weight"], *same),
      (("mlp_norm", "scale"), ["post_attention_layernorm.weight"], *same),
      (("attn", "q_proj"), ["self_attn.q_proj.weight"], *lin((c.n_heads, c.head_dim))),
      (("attn", "k_proj"), ["self_attn.k_proj.weight"], *lin((c.n_kv_heads, c.head_dim))),
      (("attn", "v_proj"), ["self_attn.v_proj.weight"], *lin((c.n_kv_heads, c.head_dim))),
      (("attn", "o_proj"), ["self_attn.o_proj.weight"], *lin_in((c.n_heads, c.head_dim))),
  ]
  if c.qk_norm:
    block += [(("attn", "q_norm", "scale"), ["self_attn.q_norm.weight"], *same),
              (("attn", "k_norm", "scale"), ["self_attn.k_norm.weight"], *same)]
  block += families.FAMILIES.get(c.family).mlp_mapping(c)
  for path, names, to_ours, to_hf in block:
    per_layer = tuple(tuple(f"model.layers.{i}.{n}" for n in names) for i in range(c.n_layers))
    out.append(Mapped((LAYERS,) + path, per_layer, to_ours, to_hf, True))
  return out


def expected_names(mapping: list[Mapped]) -> set[str]:
  """The HF tensor names a mapping reads."""
  return {n for m in mapping for n in m.all_names()}


# ----------------------------------------------------------------------------- path resolution
class ModelPathError(UserError, FileNotFoundError):
  """A model path that is no checkpoint directory (a PEFT adapter directory included)."""


class HubUnavailableError(UserError, OSError):
  """A hub id that cannot be fetched (offline, unknown, no access)."""


def _safetensors(fn: str, handle=None, name: str = ""):
  """`safe_open(fn)`, or with `handle` (fn's) its tensor `name`; a file that does not read
  (truncated, damaged) is a DamagedFileError naming it."""
  try:
    return safe_open(fn, framework="np") if handle is None else handle.get_tensor(name)
  except Exception as e:  # pylint: disable=broad-except  # (SafetensorError, OSError)
    raise DamagedFileError(f"{fn} is incomplete or damaged (safetensors: {e}): copy or "
                           "download the checkpoint again") from e


def resolve_path(path_or_hub_id: str, allow_patterns: list[str] | None = None,
                 field: str = "model.path") -> str:
  """A local directory for a path or a hub id (snapshot_download; fails clearly offline).

  A hub failure is an OSError that says how to point at a local copy instead: the config
  `field` (`--config.model.path=DIR` for the policy) and a reward model's `path` parameter.
  """
  if not isinstance(path_or_hub_id, (str, os.PathLike)):
    raise TypeError(f"path_or_hub_id must be a str path or hub id, got {type(path_or_hub_id)}")
  p = package_paths.local(os.fspath(path_or_hub_id))  # (a settings record's <mr_rl>/...)
  if os.path.isdir(p):
    return p
  if os.path.exists(p) or p.startswith((".", "/", "~")) or p.count("/") != 1:
    raise ModelPathError(f"config.{field}={p!r} is not a checkpoint directory (and not a hub "
                         "id 'org/name')")
  try:
    from huggingface_hub import snapshot_download
    return snapshot_download(repo_id=p, allow_patterns=allow_patterns)
  except Exception as e:  # network / auth / offline errors all end here
    raise HubUnavailableError(
        f"could not fetch {p!r} from the Hugging Face hub ({type(e).__name__}: {e}). If this "
        f"machine is offline, download it elsewhere (`huggingface-cli download {p} --local-dir "
        f"DIR`), copy DIR here and pass the local directory instead of the hub id: "
        f"--config.{field}=DIR (a reward-model channel: "
        f"--config.rewards.params.<channel>.path=DIR).") from e


def tensor_index(path: str) -> dict[str, str]:
  """Tensor name -> safetensors file (validates that every referenced shard exists)."""
  index = os.path.join(path, "model.safetensors.index.json")
  single = os.path.join(path, "model.safetensors")
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    files = sorted(set(weight_map.values()))
    missing = [fn for fn in files if not os.path.exists(os.path.join(path, fn))]
    if missing:
      raise FileNotFoundError(f"{index} names shard file(s) {missing} that are not in {path}")
    return {k: os.path.join(path, v) for k, v in weight_map.items()}
  if os.path.exists(single):
    with _safetensors(single) as f:
      return {k: single for k in f.keys()}
  others = [fn for fn in os.listdir(path) if fn.endswith((".bin", ".pt", ".pth"))]
  raise FileNotFoundError(
      f"no model.safetensors or model.safetensors.index.json in {path}" +
      (f" (found PyTorch pickles {others[:3]}; convert them to safetensors first)" if others
       else ""))


# ----------------------------------------------------------------------------- load / save
def read_config(path: str) -> dict:
  cfg_path = os.path.join(path, "config.json")
  adapter = os.path.join(path, "adapter_config.json")
  if not os.path.exists(cfg_path) and os.path.exists(adapter):
    try:
      with open(adapter) as f:
        base = json.load(f).get("base_model_name_or_path") or "(not recorded)"
    except (OSError, ValueError):
      base = "(adapter_config.json does not read)"
    raise ModelPathError(
        f"{path} is a PEFT adapter directory (adapter_config.json), not a model: give its base "
        f"model as config.model.path ({base}) and the adapters as "
        f"config.model.lora.init_from={path}")
  if not os.path.exists(cfg_path):
    raise FileNotFoundError(f"no config.json in {path}")
  with open(cfg_path) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{cfg_path} is not valid JSON (line {e.lineno}, column {e.colno}: "
                       f"{e.msg}); the model checkpoint's config is corrupt") from e


def load_pretrained(path_or_hub_id: str, *, dtype=jnp.float32, compute_dtype=None, mesh=None,
                    rules=None, preset: str | None = None, **config_overrides):
  """Loads a transformers checkpoint into (Transformer, params).

  Args:
    path_or_hub_id: local directory with config.json + safetensors, or a hub id.
    dtype: parameter dtype (a float dtype); logits stay float32.
    compute_dtype: matmul / activation dtype (None: `dtype`); bf16 over float32 params is
      mixed precision (`ModelConfig.dtype`).
    mesh: optional jax Mesh; every param is created directly in its NamedSharding.
    rules: logical axis rules (default `sharding.DEFAULT_RULES`).
    preset: if given, the checkpoint's architecture must equal this preset's.
    **config_overrides: other ModelConfig fields (moe_impl, remat, max_seq_len, ...).

  Raises:
    ValueError / FileNotFoundError / TypeError naming the problem (config/preset mismatch,
    missing shard files, missing / unexpected tensors, wrong shapes or dtypes).
  """
  try:
    dt = jnp.dtype(dtype)
  except TypeError as e:
    raise TypeError(f"load_pretrained: dtype {dtype!r} is not a dtype") from e
  if not jnp.issubdtype(dt, jnp.floating):
    raise TypeError(f"load_pretrained: dtype must be floating, got {dt}")
  path = resolve_path(path_or_hub_id, ["*.json", "*.safetensors", "tokenizer*", "*.txt",
                                       "*.model", "*.tiktoken"])
  cdt = dt if compute_dtype is None else jnp.dtype(compute_dtype)
  config = config_from_hf(read_config(path), param_dtype=dt, dtype=cdt, **config_overrides)
  if preset is not None:
    check_against_preset(config, preset)
  model = Transformer(config)
  index = tensor_index(path)
  mapping = param_mapping(config)
  expected = expected_names(mapping)
  optional = {"lm_head.weight"} if config.tie_embeddings else set()
  missing = sorted(expected - set(index))
  unexpected = sorted(n for n in set(index) - expected - optional
                      if not n.endswith(_IGNORABLE_SUFFIXES))
  if missing:
    raise ValueError(f"checkpoint {path} is missing {len(missing)} tensor(s): {missing[:8]}")
  if unexpected:
    raise ValueError(f"checkpoint {path} has {len(unexpected)} unexpected tensor(s) for a "
                     f"{config.family} model: {unexpected[:8]}")

  return model, load_params(model, mapping, tensor_reader(index), dt, mesh, rules)


def tensor_reader(index: dict[str, str]) -> Callable[[str], np.ndarray]:
  """`read(name) -> np.ndarray` over the safetensors files of `tensor_index` (each file opened
  once); a tensor that is not floating point is a TypeError naming it and its file."""
  handles: dict[str, Any] = {}

  def read(name: str) -> np.ndarray:
    fn = index[name]
    if fn not in handles:
      handles[fn] = _safetensors(fn)
    t = _safetensors(fn, handles[fn], name)
    if not np.issubdtype(t.dtype, np.floating) and t.dtype != ml_dtypes.bfloat16:
      raise TypeError(f"tensor {name} in {fn} has dtype {t.dtype}; expected a float dtype")
    return t

  return read


def load_params(model, mapping: list[Mapped], read: Callable[[str], np.ndarray], dtype, mesh=None,
                rules=None) -> dict:
  """The model's parameters from checkpoint tensors (`param_mapping` entries, each converted by
  its `to_ours` and checked against the model's shapes), cast to `dtype`, created straight into
  their shards on `mesh`. A stacked per-layer param is assembled layer by layer into the
  distinct shards this host holds (never more than the param's local part on the host)."""
  shapes = abstract_params(model)
  shardings = None
  if mesh is not None:
    from mr_rl.models import sharding as shd
    shardings = shd.param_shardings(model, mesh, rules)
  params: dict = {}
  for entry in mapping:
    target = tree_get(shapes, entry.path)
    sharding = None if shardings is None else tree_get(shardings, entry.path)
    if entry.per_layer:
      value = _load_layered(entry, read, dtype, target.shape, sharding)
    else:
      arr = _converted(entry, entry.names, read, target.shape).astype(dtype)
      value = jnp.asarray(arr) if sharding is None else jax.make_array_from_callback(
          arr.shape, sharding, lambda idx, a=arr: a[idx])
      del arr
    tree_set(params, entry.path, value)
  return params


def _converted(entry: Mapped, names, read, shape) -> np.ndarray:
  """`entry.to_ours` of the tensors `names`, checked against `shape`."""
  where = "/".join(entry.path)
  tensors = [read(n) for n in names]
  try:
    arr = np.asarray(entry.to_ours(tensors))
  except ValueError as e:  # a reshape that cannot work: wrong source shape
    raise ValueError(f"tensor {names[0]} has shape {tensors[0].shape}, which cannot map to "
                     f"{where} of shape {tuple(shape)}: {e}") from e
  if arr.shape != tuple(shape):
    raise ValueError(f"tensor(s) {names[0]}{'...' if len(names) > 1 else ''} have shape "
                     f"{arr.shape} after conversion; {where} expects {tuple(shape)}")
  return arr


def _load_layered(entry: Mapped, read, dtype, shape, sharding):
  """A stacked [L, ...] param read one layer at a time."""
  L = shape[0]
  if sharding is None:
    out = np.empty(shape, dtype)
    for i in range(L):
      out[i] = _converted(entry, entry.names[i], read, shape[1:])
    return jnp.asarray(out)
  index_of = sharding.addressable_devices_indices_map(tuple(shape))
  key = lambda idx: tuple((s.start, s.stop, s.step) for s in idx)
  buffers = {}
  for idx in index_of.values():
    if key(idx) not in buffers:
      local = tuple(len(range(*s.indices(n))) for s, n in zip(idx, shape))
      buffers[key(idx)] = (idx, np.empty(local, dtype))
  for i in range(L):
    layer = _converted(entry, entry.names[i], read, shape[1:])
    for idx, buf in buffers.values():
      rows = np.arange(L)[idx[0]]
      hit = np.flatnonzero(rows == i)
      if hit.size:
        buf[hit[0]] = layer[idx[1:]]
    del layer
  arrays = [jax.device_put(buffers[key(idx)][1], d) for d, idx in index_of.items()]
  return jax.make_array_from_single_device_arrays(tuple(shape), sharding, arrays)


def tree_get(tree, path):
  """`tree[path[0]][path[1]]...`."""
  for k in path:
    tree = tree[k]
  return tree


def tree_set(tree, path, value):
  """Sets `tree[path[0]]...[path[-1]] = value`, creating dicts on the way."""
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value


def save_pretrained(model: Transformer, params, path: str, *, source: str | None = None,
                    max_shard_bytes: int = 5 * 2**30, write: bool | None = None) -> None:
  """Writes a transformers-loadable checkpoint (safetensors + config.json) to `path`.

  Tensors are converted one at a time; files hold at most max_shard_bytes (then an index json
  is written, as transformers does). Params keep their dtype. `source` (a local checkpoint
  directory) copies its tokenizer / generation_config files and token ids into the output.
  In a multi-process run only process 0 writes (a run's outputs), unless `write` says whether
  this process writes: `write=True` for files each process needs on its own disk (the tiny
  assets `mr_rl.tiny_assets` builds from host params, on every host of a multi-process job).
  """
  config = model.config
  is_writer = jax.process_index() == 0 if write is None else write
  if is_writer:
    os.makedirs(path, exist_ok=True)
  extra = {}
  if source is not None:
    src = read_config(source)
    extra = {k: src[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in src}
  shard: dict[str, np.ndarray] = {}
  shard_bytes, files, weight_map, total = 0, [], {}, 0

  def flush():
    nonlocal shard, shard_bytes
    if shard:
      fn = f"model-{len(files) + 1:05d}.safetensors"
      if is_writer:
        save_file(shard, os.path.join(path, fn), metadata={"format": "pt"})
      files.append(fn)
      weight_map.update({k: fn for k in shard})
      shard, shard_bytes = {}, 0

  for entry in param_mapping(config):
    try:
      value = tree_get(params, entry.path)
    except (KeyError, TypeError) as e:
      raise ValueError(f"params has no entry {'/'.join(entry.path)} for this {config.family} "
                       "model") from e
    layers = ([(entry.names[i], value[i]) for i in range(config.n_layers)] if entry.per_layer
              else [(entry.names, value)])
    for names, v in layers:  # (a stacked param leaves the device one layer at a time)
      for n, t in zip(names, entry.to_hf(distributed.to_host(v))):
        if shard_bytes and shard_bytes + t.nbytes > max_shard_bytes:
          flush()
        shard[n] = t
        shard_bytes += t.nbytes
        total += t.nbytes
  flush()
  if not is_writer:
    return
  if len(files) == 1:
    os.replace(os.path.join(path, files[0]), os.path.join(path, "model.safetensors"))
  else:
    n = len(files)
    for i, fn in enumerate(files):
      new = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
      os.replace(os.path.join(path, fn), os.path.join(path, new))
      weight_map = {k: (new if v == fn else v) for k, v in weight_map.items()}
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config_from(config, extra), f, indent=2)
  if source is not None:
    for fn in os.listdir(source):
      if fn.startswith(("tokenizer", "special_tokens", "added_tokens", "vocab", "merges",
                        "generation_config", "chat_template")):
        shutil.copy(os.path.join(source, fn), os.path.join(path, fn))
  make_readable(path)


def make_readable(path: str) -> None:
  """Gives the files directly in `path` the mode a plain `open` would (0666 less the umask):
  safetensors writes its files 0600, which a server running as another user cannot read."""
  umask = os.umask(0)
  os.umask(umask)
  for fn in os.listdir(path):
    full = os.path.join(path, fn)
    if os.path.isfile(full) and not os.path.islink(full):
      os.chmod(full, 0o666 & ~umask)


def load_tokenizer(path_or_hub_id: str):
  """transformers.AutoTokenizer for a local directory or hub id."""
  from transformers import AutoTokenizer
  path = resolve_path(path_or_hub_id, ["*.json", "tokenizer*", "*.txt", "*.model", "*.tiktoken",
                                       "*.jinja"])
  return AutoTokenizer.from_pretrained(path)
