r"""Compile a paper config's device programs ahead of time for its TPU slice; report memory.

    pip install -e ".[tpu]"    # libtpu: XLA:TPU's compiler, runs on any machine
    python launch/check.py --config=configs/amrp_math.py --topology=v5p-8
    python launch/check.py --config=configs/amrp_math.py --topology=v5p-8 --fit
    python launch/check.py --config=configs/tag_moe.py --topology=v5p-32
    python launch/check.py --config=configs/tag_math.py:model=qwen3_4b --devices=4   # XLA:CPU

Two compilers. With `--topology=SLICE` (a Cloud TPU name: v5p-8, v5p-32, v5e-16, v6e-8, v4-8, ...)
every program is compiled by XLA:TPU itself, deviceless (launch/tpu_slice.py: libtpu's topology
gives the slice's devices, chips, hosts and kind; the compiler gives the HBM it allows a program):
the compiler, scheduler and buffer assignment the pod runs, the Pallas TPU attention kernel
'auto' resolves to there (inside its `shard_map`), and the MoE's real `jax.lax.ragged_dot`. A
multi-host slice (v5p-32: 4 hosts) compiles its global programs as the pod runs them. This is the
verdict to trust before booking a slice. Without it, the programs are compiled by XLA:CPU on N
fake devices, an approximation (same sharded shapes, another scheduler and buffer assignment: for
configs/amrp_math.py's sampler it said 147.5 GB per chip where XLA:TPU says 93.6) kept for machines
without libtpu. A program passes when its total leaves `--headroom` (10%) of HBM free; a program
XLA:TPU refuses (RESOURCE_EXHAUSTED) does not fit. `--fit` bisects the largest micro-batch (rows
per `optim.num_micro_batches` chunk) and, for the continuous engine, the most slots with which
every program passes, and prints the `--set` line to use.

Either way the config's mesh is built on the devices (fake CPU devices: XLA_FLAGS=
--xla_force_host_platform_device_count gives N of them), parameters are abstract
(`jax.eval_shape`, nothing is allocated), and each program the trainer runs per step is
lowered with the shardings of `mr_rl.models.sharding` (`train_state_shardings`,
`batch_shardings`) and compiled (`jax.jit(...).lower(...).compile()`):

  * `policy_step`: the GRPO update (`update.make_policy_step` with mesh, rules, state and batch
    shardings; optimizer state included, the state donated);
  * `ref_logprob`: one chunk of the reference log-prob pass (the trainer runs it in
    `optim.num_micro_batches` row chunks, `mr_rl.rl.update.chunked_forward`; `--ref_chunks M`
    compiles a chunk of rows / M rows instead, 1 = the whole rollout batch in one call);
  * `sampler`: the static KV-cache rollout of B*G rows (`mr_rl.sampling.Sampler` on the mesh);
  * `engine_prefill`, `engine_step`, `engine_shrink` (`--programs=engine` for the three; the
    default instead of `sampler` when `rollout.engine = "continuous"`): the continuous engine's
    slot programs at S slots (`--slots`: the config's `rollout.slots`, one per row if 0, or
    `budget`: the count `mr_rl.sampling.memory` says fits), see launch/check_engine.py. The
    analytic slot budget (bytes per slot, slots that fit) is printed for every config;
  * a multi-turn config (`config.multiturn.env` or `.tools`) rolls out on the turn programs
    instead, whatever its engine: `engine_init`, `engine_prefill`, `engine_step`,
    `engine_gather` and `engine_append` (`--programs=engine` for the five) at S slots, built as
    the trainer builds them (launch/check_turns.py); `--fit` searches their slots;
  * PPO (`advantage.name = "ppo"`): `ppo_step` and `value_forward` (the critic's forward over a
    chunk) in place of `policy_step`; the critic's state joins the residents (launch/check_ppo.py).

LoRA (`config.model.lora.rank > 0`): the train state is the adapters and their Adam moments; the
policy step takes the frozen base params as a further argument (not donated); the reference
pass is the base itself (no copy); the sampler samples the merged weights (`lora.merge`, a full
copy) while the base and the adapter state stay resident. Residents follow (below).

For each it prints XLA's per-device memory (`compiled.memory_analysis()`: arguments, outputs,
temporaries, aliasing; peak = args + out - alias + temp), then what stays resident on the device
next to that program while the trainer runs it (`resident`: pi_0, the base parameters, during the
policy step; the train state, i.e. parameters and Adam moments, during the reference pass; the
Adam moments and pi_0 during the sampler, whose arguments are the policy parameters; with LoRA:
nothing during the step, the adapter state during the reference pass, the base and the adapter
state during the sampler), and
judges total = peak + resident (+ the MoE kernel workspace below) against the chip's HBM. It
lists the largest arrays of the train state with their sharding and per-device size. `--remat`
(or the config's `model.remat`) rematerialises each decoder block (ModelConfig.remat); the CPU
compile keeps jax.checkpoint's optimization barriers (`KEEP_REMAT_FLAG`), as TPU and GPU do, so
the saving shows.
The sampler follows `rollout.dtype` / `rollout.cache_dtype` of the config. CPU compilation of
a 30-layer model takes minutes; the CPU backend's buffer assignment approximates the TPU one
(same sharded shapes, a different scheduler), so keep 10-20% headroom. Exit status 1 if a
program does not fit.

MoE models (`moe_impl` 'ragged' or 'ep', from `config.model.moe_impl`; 'ep' runs the same grouped
matmuls per device inside a shard_map, counted by `ep_block_bytes`): XLA:CPU lowers `jax.lax.ragged_dot` to dense dots over a
group-masked copy of the left operand, [M, local experts, K] temporaries (thousands of GB per
device for Qwen3-30B-A3B), where TPU runs a grouped-matmul kernel (megablox GMM / XLA's
ragged-dot) that holds its operands and result in HBM and its tiles in VMEM. So by default
(`--moe_matmul=stand_in`) every program is compiled with the three grouped matmuls of each MoE
block replaced by `mr_rl.models.moe.stand_in_grouped_matmul`: the ragged dot's operand, result,
gradient and residual shapes and shardings without the expansion (its values are wrong; memory
only). Assumed: (1) the TPU kernel's HBM footprint is its result, plus group metadata
(`gmm_metadata_bytes`, KB; added to the total), and its transpose writes a per-group weight
gradient (the stand-in materialises one too); (2) XLA's partitioning of the ragged-dot
instruction gives each device the same per-device operand and result shapes as the stand-in's
einsum (all M routed rows against the device's E/expert experts and F/tensor columns; the
sort / gather / scatter around it are the model's own ops, compiled unchanged). Verified here
on CPU only (no TPU compile): the `moe_block` program compiles one MoE block's forward at the
policy step's micro-batch with the stand-in and with `ragged_dot` and prints both next to an
analytic count of the block's arrays (`moe_block_bytes`); tests/launch/test_check.py checks the
stand-in stays within that count and the ragged lowering does not. `--moe_matmul=ragged_dot`
compiles the ragged dot as XLA:CPU lowers it (the old, meaningless numbers).

`--programs=none` compiles nothing: the train state, the residents and the slot budget only
(seconds, an analytic lower bound to narrow down sizes before compiling).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import sys
import time


def _attention_note(cfg, T: int, backend: str) -> str:
  """What the policy step's attention holds, as compiled here (for `backend`)."""
  from mr_rl.models import attention
  here = attention.resolve(cfg.attention_impl, dtype=cfg.dtype, packed=False, T=T,
                           backend=backend)
  scores = "T x T scores per layer" if here == "reference" else "one block's scores"
  if backend == "tpu":
    return f"{here} for the TPU ({scores})"
  return f"{here} here ({scores}), a flash kernel on TPU / GPU"


def _libtpu_version() -> str:
  from importlib import metadata
  try:
    return metadata.version("libtpu")
  except metadata.PackageNotFoundError:
    return "unknown"


def _parse_mesh(text: str) -> dict[str, int]:
  out = {}
  for part in filter(None, text.split(",")):
    k, sep, v = part.partition("=")
    if not sep:
      raise ValueError(f"--mesh: expected axis=size pairs, got {part!r}")
    out[k.strip()] = int(v)
  return out


def _args(argv):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", required=True, help="configs/<file>.py[:key=value,...]")
  p.add_argument("--devices", type=int, default=0,
                 help="number of (fake) devices = chips (default: the product of the mesh's "
                      "sizes, --mesh or config.mesh, a -1 axis counting 1)")
  p.add_argument("--chip", default="v5p", help="fake-CPU path: HBM budget per device from "
                 "config_lib.CHIPS (with --topology the compiler's own figure is used)")
  p.add_argument("--topology", default="",
                 help="compile with XLA:TPU for this Cloud TPU slice, deviceless, on any machine "
                      "(v5p-8, v5p-32, v5e-16, v6e-8, v4-8, ... or a libtpu topology such as "
                      "v5p:2x2x1); needs libtpu: pip install -e \".[tpu]\"")
  p.add_argument("--headroom", type=float, default=0.10,
                 help="fraction of HBM a program must leave free to pass (default 0.10)")
  p.add_argument("--fit", action="store_true",
                 help="search the largest micro-batch (optim.num_micro_batches) and, for the "
                      "continuous engine, the most slots with which every program fits with "
                      "--headroom; prints the settings to use (--slots=N keeps N slots)")
  p.add_argument("--preset", default="",
                 help="model preset instead of the config's model; fields may follow, e.g. "
                      "tiny_moe:num_experts=32,moe_d_ff=64")
  p.add_argument("--mesh", default="", help="override config.mesh, e.g. data=1,fsdp=4")
  p.add_argument("--rows", type=int, default=0, help="override B*G rows")
  p.add_argument("--prompt_len", type=int, default=0, help="override data.max_prompt_len")
  p.add_argument("--new_tokens", type=int, default=0, help="override rollout.max_new_tokens")
  p.add_argument("--micro_batches", type=int, default=0, help="override optim.num_micro_batches")
  p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                 help="set a config field before the check (repeatable), e.g. "
                      "--set rollout.cache_dtype=bfloat16 --set optim.num_micro_batches=128")
  p.add_argument("--programs", default="",
                 help="comma-separated, from policy_step, ref_logprob, sampler, engine (= "
                      "engine_prefill, engine_step, engine_shrink; a multi-turn config's turn "
                      "programs), moe_block, or none "
                      "(default: policy_step, ref_logprob, then sampler or with "
                      "rollout.engine=continuous the engine's, and moe_block for an MoE model)")
  p.add_argument("--slots", default="",
                 help="continuous engine's slot count S: an int, 'budget' (the slots "
                      "mr_rl.sampling.memory says fit) or '' (rollout.slots; 0 = one per row)")
  p.add_argument("--moe_matmul", default="stand_in", choices=("stand_in", "ragged_dot"),
                 help="MoE models: compile the grouped matmuls as the memory stand-in (default; "
                      "see above) or as XLA:CPU's lowering of jax.lax.ragged_dot")
  p.add_argument("--remat", action="store_true",
                 help="rematerialise decoder blocks (ModelConfig.remat) to see its effect")
  p.add_argument("--ref_chunks", type=int, default=0,
                 help="compile the reference pass on rows/ref_chunks rows (0: the micro-batch "
                      "count, as the trainer runs it; 1: all rows in one call)")
  p.add_argument("--response_start", type=int, default=-1,
                 help="policy step: the batch's static response start (the LM head runs from "
                      "it on; -1 = the prompt width P, as make_batch's full-width batch; 0 = "
                      "the head over every column)")
  p.add_argument("--top", type=int, default=8, help="largest state arrays to list")
  return p.parse_args(argv)


def _gb(x: float) -> str:
  """Bytes in GB, or MB below 0.1 GB (tiny models)."""
  return f"{x / 1e9:8.2f} GB" if x >= 1e8 else f"{x / 1e6:8.2f} MB"


def _parse_preset(text: str) -> tuple[str, dict]:
  """'name[:field=value,...]' -> (name, {field: int | float | str})."""
  name, _, rest = text.partition(":")
  fields = {}
  for part in filter(None, rest.split(",")):
    k, sep, v = part.partition("=")
    if not sep:
      raise ValueError(f"--preset: expected field=value after ':', got {part!r}")
    for cast in (int, float, str):
      try:
        fields[k.strip()] = cast(v)
        break
      except ValueError:
        pass
  return name, fields


def _set_field(c, item: str) -> None:
  """`--set a.b=value` on ConfigDict `c`, cast to the type of the field's current value."""
  key, sep, text = item.partition("=")
  if not sep:
    raise ValueError(f"--set: expected FIELD=VALUE, got {item!r}")
  *parents, leaf = key.strip().split(".")
  node = c
  for name in parents:
    node = node[name]
  old = node[leaf]  # KeyError for a field the config does not have
  if isinstance(old, bool):
    value = {"true": True, "false": False}[text.lower()]
  elif isinstance(old, (int, float)):
    value = type(old)(text)
  else:
    value = text
  node[leaf] = value


def gmm_metadata_bytes(m_rows: int, groups: int, tile_m: int = 128) -> int:
  """HBM the TPU grouped-matmul kernel needs besides its operands and result, per call: the
  group offsets [G + 1] and the (group id, row tile) schedule [tiles + G - 1] x 2, int32
  (megablox `make_group_metadata`); the tiles themselves live in VMEM."""
  tiles = -(-m_rows // tile_m)
  return 4 * ((groups + 1) + 2 * (tiles + groups - 1))


def moe_block_bytes(cfg, mesh_shape: dict, tokens: int, act_bytes: int) -> dict[str, int]:
  """Per-device bytes of the arrays one MoE block's forward creates (no buffer reuse), for
  `tokens` tokens entering the block on the whole mesh, as the 'ragged' path lays them out
  under GSPMD: the routed (token, expert) rows are sorted over the whole batch, so every device
  holds all X*U of them (HLO: an all-gather before the sort), against its E/expert experts and
  F/tensor columns. An upper bound of the forward's temporaries; the largest entry is a lower
  bound."""
  X, U, E, D = tokens, cfg.num_experts_per_tok, cfg.num_experts, cfg.d_model
  e, t = mesh_shape.get("expert", 1), mesh_shape.get("tensor", 1)
  XU, F_l = X * U, cfg.moe_d_ff // t
  return {
      "router logits + probabilities [X, E] (float32)": 2 * X * E * 4,
      "top-k weights + ids [X, U]": X * U * 8,
      "sort keys, order, token ids [X*U]": 3 * XU * 4,
      "gathered rows xs [X*U, D]": XU * D * act_bytes,
      "gate, up, silu(gate)*up [X*U, F/tensor] (grouped matmul results)": 3 * XU * F_l * act_bytes,
      "down [X*U, D] (grouped matmul result) + its all-reduce": 2 * XU * D * act_bytes,
      "combined y [X, D]": X * D * act_bytes,
      "kernel metadata (3 calls)": 3 * gmm_metadata_bytes(XU, E // e),
  }


def ep_block_bytes(cfg, mesh_shape: dict, tokens: int, act_bytes: int) -> dict[str, int]:
  """As `moe_block_bytes` for moe_impl='ep' (`mr_rl.models.moe.ep_moe`, default rules): a
  device's X/(data*fsdp*expert) tokens split again over tensor, routed locally, a send and a
  receive buffer of expert x `ep_capacity` rows each, grouped matmuls over its E/expert experts
  at full width F, the results sent back. Upper bound (no buffer reuse); the largest entry is a
  lower bound."""
  from mr_rl.models.moe import ep_capacity
  U, E, D, F = cfg.num_experts_per_tok, cfg.num_experts, cfg.d_model, cfg.moe_d_ff
  e, t = mesh_shape.get("expert", 1), mesh_shape.get("tensor", 1)
  x_b = tokens // (mesh_shape.get("data", 1) * mesh_shape.get("fsdp", 1) * e)
  x_dev = -(-x_b // t)
  rows = e * ep_capacity(x_dev, U, E // e)
  return {
      "router logits + probabilities [X/dev, E] (float32)": 2 * x_dev * E * 4,
      "top-k weights + ids, slots [X/dev, U]": x_dev * U * 12,
      "send / receive indices, expert ids [rows] (5, int32)": 5 * rows * 4,
      "send, received, sorted rows [rows, D]": 3 * rows * D * act_bytes,
      "gate, up, silu(gate)*up [rows, F] (grouped matmul results)": 3 * rows * F * act_bytes,
      "down [rows, D] (grouped matmul result), unsorted, returned": 3 * rows * D * act_bytes,
      "returned rows per token [X/dev, U, D]": x_dev * U * D * act_bytes,
      "combined y, its sum over tensor [X/dev*tensor, D]": 2 * x_dev * t * D * act_bytes,
      "local experts' weights at full width, all-gathered (3 x [E/expert, D, F])":
          3 * E // e * D * F * act_bytes,
      "kernel metadata (3 calls)": 3 * gmm_metadata_bytes(rows, E // e),
  }


# XLA:CPU's `cse_barrier_expander` pass deletes the optimization barriers that jax.checkpoint puts
# around a rematerialised block's recomputation, and CSE then merges the recomputation into the
# forward: on CPU remat saves nothing (a 4-layer grad kept every layer's activations), while TPU
# and GPU keep the barriers. Disabling the pass makes the CPU compile honour remat as they do.
KEEP_REMAT_FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"


def cpu_widened_bytes(name: str, cfg, cache_dtype, slots: int, prompt_cols: int, resp_cols: int,
                      mesh_shape: dict) -> int:
  """Bytes of the float32 copies of a 16-bit KV cache in the engine step's temporaries that
  only XLA:CPU makes: it has no 16-bit scatter, so the step's one scatter of the new keys and
  values into the stacked cache runs on a float32 copy of it (2x the cache's bytes); TPU and
  GPU scatter in place. 0 for other programs and float32 caches."""
  import jax.numpy as jnp
  from mr_rl.sampling import memory
  dtype = jnp.dtype(cfg.dtype if cache_dtype is None else cache_dtype)
  if name != "engine_step" or dtype.itemsize != 2:
    return 0
  dp = math.prod(mesh_shape.get(a, 1) for a in ("data", "fsdp", "expert"))
  per_slot = memory.slot_cache_bytes(cfg, prompt_bucket_of(prompt_cols), resp_cols, dtype,
                                     mesh_shape.get("tensor", 1))
  return int(2 * per_slot * slots / dp)


def prompt_bucket_of(prompt_cols: int) -> int:
  from mr_rl.sampling.sampler import prompt_bucket
  return prompt_bucket(prompt_cols, None)


def _load_config(a):
  """The config file (with --set applied); loading it starts no jax backend."""
  from mr_rl import config_lib
  path, sep, arg = a.config.partition(":")
  c = config_lib.load_config_module(path).get_config(arg if sep else None)
  for item in a.set:
    _set_field(c, item)
  return c


def main(argv=None) -> int:
  a = _args(sys.argv[1:] if argv is None else argv)
  c = _load_config(a)
  target = None
  if a.topology:  # XLA:TPU for a slice: no fake devices, no CPU-only flags
    import tpu_slice  # launch/tpu_slice.py, next to this script
    try:
      target = tpu_slice.topology(a.topology)
    except tpu_slice.SliceError as e:
      print(f"check.py: {e}", file=sys.stderr)
      return 2
    a.devices = len(target.devices)
  else:
    if not a.devices:
      sizes = _parse_mesh(a.mesh) if a.mesh else {k: int(c.mesh[k]) for k in c.mesh}
      a.devices = math.prod(max(1, v) for v in sizes.values())
    # Must happen before a jax backend starts (XLA reads the flags then).
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count={a.devices} "
                               f"{KEEP_REMAT_FLAG}").strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
  import jax
  if target is None and jax.device_count() != a.devices:
    raise RuntimeError(f"jax sees {jax.device_count()} devices, expected {a.devices}; was a jax "
                       "backend started before XLA_FLAGS was set?")
  if a.fit:
    return fit(a, c, target)
  ok, _ = check(a, c, target)
  return 0 if ok else 1


def _mesh_sizes(a, c) -> dict[str, int]:
  """The mesh's axis sizes with a -1 axis filled from the device count."""
  sizes = _parse_mesh(a.mesh) if a.mesh else {k: int(c.mesh[k]) for k in c.mesh}
  known = math.prod(v for v in sizes.values() if v != -1)
  return {k: (a.devices // known if v == -1 else v) for k, v in sizes.items()}


def _bisect(candidates, passes, describe):
  """The largest of ascending `candidates` for which `passes(x)` holds (memory grows with x),
  by bisection; None when even the first fails. Prints one line per compile."""
  lo, hi, best = 0, len(candidates) - 1, None
  while lo <= hi:
    mid = (lo + hi) // 2
    t0 = time.time()
    ok, words = passes(candidates[mid])
    print(f"  {describe(candidates[mid]):44s} {words}  ({time.time() - t0:.0f} s)", flush=True)
    if ok:
      best, lo = candidates[mid], mid + 1
    else:
      hi = mid - 1
  return best


def fit(a, c, target) -> int:
  """--fit: the largest micro-batch (rows per `optim.num_micro_batches` chunk) with which the
  policy step and the reference pass pass with `a.headroom`, and for the continuous engine the
  most slots with which its programs pass; then the whole check at those settings."""
  from mr_rl.models import sharding as shd
  sizes = _mesh_sizes(a, c)
  dp = math.prod(sizes.get(ax, 1) for ax in shd.BATCH_AXES)
  rows = a.rows or int(c.data.batch_prompts) * int(c.rollout.group_size)
  where = f"XLA:TPU, {target.name}" if target is not None else "XLA:CPU's approximation"
  print(f"fit      {a.config}: {rows} rows, batch split {dp} ways, {100 * a.headroom:.0f}% "
        f"headroom ({where})", flush=True)

  def summary(results):
    worst = max((t for t, _ in results.values() if t is not None), default=0)
    refused = [n for n, (t, _) in results.items() if t is None]
    ok = all(p for _, p in results.values())
    return ok, (("passes" if ok else "fails") + f": largest {worst / 1e9:.1f} GB"
                + (f", refused: {refused}" if refused else ""))

  base = dict(vars(a))
  chosen = []
  # Micro-batches: rows per chunk r (r divides rows, a multiple of the batch split).
  per_micro = [r for r in range(dp, rows + 1, dp) if rows % r == 0]

  def micro_passes(r):
    trial = argparse.Namespace(**dict(base, micro_batches=rows // r, ref_chunks=0,
                                      programs="policy_step,ref_logprob", fit=False))
    return summary(check(trial, c, target, quiet=True)[1])

  best = _bisect(per_micro, micro_passes,
                 lambda r: f"micro-batch {r} rows (num_micro_batches={rows // r})")
  if best is None:
    print("\nresult: even one row per data-parallel group does not fit: change the mesh, slice "
          "or lengths")
    return 1
  chosen.append(f"optim.num_micro_batches={rows // best}")
  a.micro_batches = rows // best
  from mr_rl import rollout_engines
  import check_turns  # launch/check_turns.py: multi-turn rollouts have slots, any engine
  slotted = "turn programs" if check_turns.settings(c) is not None else "continuous engine"
  engine_has_slots = slotted == "turn programs" or any(
      o.name == "slots" for o in rollout_engines.ENGINES.get(c.rollout.engine).options)
  if engine_has_slots and a.slots.isdigit():
    print(f"  {slotted}: {a.slots} slots as given (--slots), not searched", flush=True)
  elif engine_has_slots:
    slot_counts = list(range(dp, rows + 1, dp))

    def slots_pass(n):
      trial = argparse.Namespace(**dict(vars(a), slots=str(n), programs="engine", fit=False))
      return summary(check(trial, c, target, quiet=True)[1])

    slots = _bisect(slot_counts, slots_pass, lambda n: f"{slotted}, {n} slots")
    if slots is None:
      print("\nresult: no slot count fits the engine's programs: change the mesh, slice or "
            "lengths")
      return 1
    chosen.append(f"rollout.slots={slots}")
    a.slots = str(slots)
  print("\nsettings that fit: " + " ".join(f"--set {x}" for x in chosen)
        + "\nthe whole check at these settings:\n", flush=True)
  a.programs = base["programs"]
  ok, _ = check(a, c, target)
  return 0 if ok else 1


# Chip peaks for the analytic step time (config_lib.CHIPS) by XLA:TPU's device_kind.
KIND_TO_CHIP = {"TPU v5": "v5p", "TPU v5 lite": "v5e", "TPU v6 lite": "v6e", "TPU v4": "v4"}


def analytic_step(cfg, *, rows: int, micro: int, T: int, chips: int, chip: str,
                  param_dev_bytes: int, state_dev_bytes: int, compute_bytes: int) -> str:
  """The policy step's time at the chip's peak, from an analytic count: per micro-batch of
  rows / micro rows, FLOPs = 6 x active params x tokens + 12 x T^2 x attention width per row
  (forward and backward, causal half of 4 T^2 x width per pass counted whole), split over the
  chips; bytes = the weights read in the compute dtype three times (forward, two backward
  products) and the float32 gradient accumulator read and written once; then one Adam update
  over the train state (read and written). Roofline: each micro-batch takes the longer of its
  FLOPs at peak and its bytes at HBM bandwidth. A lower bound (real steps reach 20-50% of
  peak: docs/accelerators.md)."""
  from mr_rl import config_lib
  from mr_rl.config_lib import estimates
  c = config_lib.CHIPS[chip]
  sizes = estimates.model_sizes(cfg)
  r = rows // micro
  flops = (6 * sizes["active"] * r * T + 12 * T * T * sizes["attn_width"] * r) / chips
  import numpy as np
  weights = param_dev_bytes // np.dtype(cfg.param_dtype).itemsize   # parameters per chip
  bytes_micro = 3 * weights * compute_bytes + 2 * param_dev_bytes
  t_micro = max(flops / c.peak_flops, bytes_micro / c.hbm_bw)
  t_adam = 2 * state_dev_bytes / c.hbm_bw
  total = micro * t_micro + t_adam
  bound = "FLOPs" if flops / c.peak_flops >= bytes_micro / c.hbm_bw else "HBM bandwidth"
  return (f"policy step, analytic ({chip} peak {c.peak_flops / 1e12:.0f} TFLOP/s, "
          f"{c.hbm_bw / 1e12:.2f} TB/s): {micro} micro-batches of {r} rows x {T} tokens, "
          f"{flops / 1e12:.1f} TFLOP per chip each ({bound}-bound) -> >= {total:.2f} s per step "
          f"at peak ({total / estimates.MFU:.2f} s at {estimates.MFU:.0%} MFU)")


def _verdict(total: float, hbm: float, headroom: float) -> tuple[bool, str]:
  """(passes, words): a program passes when it leaves `headroom` of HBM free."""
  share = total / hbm
  if share <= 1 - headroom:
    return True, f"fits, {100 * (1 - share):.1f}% headroom"
  if share <= 1:
    return False, (f"fits with only {100 * (1 - share):.1f}% headroom (under the "
                   f"{100 * headroom:.0f}% asked)")
  return False, f"DOES NOT FIT ({100 * share:.0f}% of HBM)"


def check(a, c, target, quiet: bool = False):
  """Compiles the programs `a.programs` of config `c`; prints the report (unless `quiet`).

  Returns:
    (ok, results): ok when every program passes with `a.headroom`; results maps each compiled
    program to (total bytes per device or None when the compiler refused it, passes).
  """
  if quiet:
    with contextlib.redirect_stdout(io.StringIO()):
      return check(a, c, target)
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P

  from mr_rl import config_lib, models, rollout_engines
  from mr_rl.models import attention
  from mr_rl.models import sharding as shd
  from mr_rl.models.transformer import layer_of
  from mr_rl.rl import update as update_lib
  from mr_rl.rl.batch import LearnerBatch
  from mr_rl.rl.losses import PolicyLossConfig
  from mr_rl.sampling import Sampler
  import check_turns  # launch/check_turns.py, next to this script

  turns = check_turns.settings(c)  # a multi-turn config's MultiTurnSettings, else None
  preset, preset_fields = _parse_preset(a.preset)
  preset = preset or next((m.preset for m in config_lib.MODELS.values()
                           if m.hub == c.model.path), "") or c.model.get("preset", "")
  if not preset and not (c.model.path and os.path.isfile(os.path.join(c.model.path,
                                                                      "config.json"))):
    raise ValueError(f"config.model.path={c.model.path!r} is neither a paper model nor a local "
                     "checkpoint directory; pass --preset")
  if target is not None:  # XLA:TPU: the slice's devices and the compiler's own HBM figure
    devices, hbm = list(target.devices), target.hbm_bytes
    budget_of = f"{target.kind}, XLA:TPU's figure"
  else:
    if a.chip not in config_lib.CHIPS:
      raise ValueError(f"--chip={a.chip!r}; valid: {sorted(config_lib.CHIPS)}")
    devices, hbm = jax.devices(), config_lib.CHIPS[a.chip].hbm_bytes
    budget_of = f"{a.chip}, config_lib.CHIPS"
  dtype = jnp.dtype(c.model.dtype)  # parameters and Adam moments (master weights)
  compute = jnp.dtype(c.model.get("compute_dtype", "") or c.model.dtype)  # matmuls, activations
  preset_fields.setdefault("moe_impl", c.model.moe_impl)  # config.model.moe_impl unless --preset
  preset_fields.setdefault("attention_impl", c.model.get("attention_impl", "auto"))
  if preset:
    base_cfg = models.get_preset(preset, **preset_fields)
  else:  # a local checkpoint (e.g. the demo's base policy): its own config.json
    from mr_rl.models import hf_io
    base_cfg = hf_io.config_from_hf(hf_io.read_config(c.model.path), **preset_fields)
    preset = os.path.basename(os.path.normpath(c.model.path))
  cfg = base_cfg.replace(param_dtype=dtype, dtype=compute,
                         remat=bool(a.remat or c.model.get("remat")))
  grouped = cfg.is_moe and cfg.moe_impl in ("ragged", "ep")  # paths with grouped matmuls
  # XLA:TPU compiles the real jax.lax.ragged_dot; the stand-in is for XLA:CPU only.
  stand_in = grouped and a.moe_matmul == "stand_in" and target is None
  model = models.Transformer(cfg)
  mesh_sizes = _parse_mesh(a.mesh) if a.mesh else {k: int(c.mesh[k]) for k in c.mesh}
  mesh = shd.make_mesh(mesh_sizes, devices=devices)
  # 'auto' kernels resolve for the backend compiled for (the Pallas TPU kernel for a slice).
  backend = "tpu" if target is not None else "cpu"
  rules = shd.DEFAULT_RULES
  rows = a.rows or int(c.data.batch_prompts) * int(c.rollout.group_size)
  group = int(c.rollout.group_size) if rows % int(c.rollout.group_size) == 0 else 1
  prompt_cols = a.prompt_len or int(c.data.max_prompt_len)  # P
  resp_cols = a.new_tokens or int(c.rollout.max_new_tokens)  # S (max_new_tokens)
  T = prompt_cols + resp_cols
  micro = a.micro_batches or int(c.optim.num_micro_batches)
  if rows % micro:
    raise ValueError(f"micro-batches {micro} must divide rows {rows}; pass --micro_batches")
  norm_len = resp_cols if c.optim.loss.loss_agg == "seq-mean-token-sum-norm" else None
  cl = c.optim.loss
  loss = PolicyLossConfig(eps_low=float(cl.eps_low), eps_high=float(cl.eps_high),
                          loss_agg=cl.loss_agg, norm_len=norm_len,
                          kl_coef=float(cl.kl_coef), kl_estimator=cl.kl_estimator,
                          entropy_coef=float(cl.entropy_coef))
  lora_cfg = None
  if int(c.model.lora.rank):  # as mr_rl.settings reads config.model.lora
    from mr_rl.models import lora as lora_lib
    lora_cfg = lora_lib.LoraConfig(
        rank=int(c.model.lora.rank), alpha=float(c.model.lora.alpha),
        targets=tuple(t.strip() for t in c.model.lora.targets.split(",") if t.strip()))
    lora_lib.target_paths(cfg, lora_cfg)  # a pattern that matches no kernel fails here
  ucfg = update_lib.UpdateConfig(loss=loss, num_micro_batches=micro, lr=float(c.optim.lr),
                                 weight_decay=float(c.optim.weight_decay), lora=lora_cfg)
  ref_chunks = a.ref_chunks or micro
  if rows % ref_chunks:
    raise ValueError(f"--ref_chunks={ref_chunks} must divide rows {rows}")
  sets = "".join(f" --set {x}" for x in a.set)
  training = "full fine-tuning" if lora_cfg is None else (
      f"LoRA rank {lora_cfg.rank}, alpha {lora_cfg.alpha:g}, on "
      f"{len(lora_lib.target_paths(cfg, lora_cfg))} kernels (frozen base)")
  print(f"config   {a.config}{sets}\n"
        f"model    {preset} ({config_lib.model_sizes(cfg)['total'] / 1e9:.2f}B params, "
        f"{dtype.name} master weights, {compute.name} compute"
        f"{', remat' if cfg.remat else ''}; attention {cfg.attention_impl!r}: "
        f"{_attention_note(cfg, prompt_cols + resp_cols, backend)})\n"
        f"training {training}\n"
        f"mesh     {dict(mesh.shape)} on "
        + (f"{target.describe()}\ncompiler XLA:TPU (libtpu {_libtpu_version()}), deviceless: "
           "the compiler and buffer assignment the pod runs\n" if target is not None else
           f"{a.devices} fake CPU devices\ncompiler XLA:CPU: an APPROXIMATION of a TPU's memory "
           "(same sharded shapes, another scheduler and buffer assignment); --topology=SLICE "
           "gives XLA:TPU's own verdict\n") +
        f"batch    rows={rows} (G={group}), T={prompt_cols}+{resp_cols}, micro_batches={micro}, "
        f"reference pass in {ref_chunks} chunk(s)\n"
        f"sampler  {'multi-turn rollouts' if turns else c.rollout.engine + ' engine'}, compute "
        f"{c.rollout.get('dtype', '') or compute.name}, KV cache "
        f"{c.rollout.get('cache_dtype', '') or c.rollout.get('dtype', '') or compute.name}\n"
        f"budget   {_gb(hbm)} per device ({budget_of}); a program passes with "
        f"{100 * a.headroom:.0f}% of it free")
  if grouped:
    print(f"moe      moe_impl={cfg.moe_impl!r}, grouped matmuls compiled as " + (
        "mr_rl.models.moe.stand_in_grouped_matmul (TPU kernel's memory: operands + result; "
        "group metadata added analytically; values wrong, memory only)" if stand_in else
        "jax.lax.ragged_dot, as XLA:TPU compiles it for the pod" if target is not None else
        "XLA:CPU's lowering of jax.lax.ragged_dot ([M, experts, K] temporaries TPU does not "
        "have: not a TPU estimate)"))

  p_sh = shd.param_shardings(model, mesh, rules)
  params_abs = models.abstract_params(model)
  tx = update_lib.make_optimizer(ucfg)
  if lora_cfg is None:  # the state trains the params themselves
    train_abs, train_sh = params_abs, p_sh
  else:  # the state trains the adapters; the base is a frozen argument
    train_abs = lora_lib.abstract_adapters(cfg, lora_cfg)
    train_sh = shd.adapter_shardings(cfg, lora_cfg, mesh, rules)
  state_abs = jax.eval_shape(lambda p: update_lib.init_train_state(p, tx), train_abs)
  st_sh = shd.train_state_shardings(state_abs, tx, train_sh, mesh)
  with_sh = lambda tree, sh: jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, sh)
  state_in = with_sh(state_abs, st_sh)
  params_in = with_sh(params_abs, p_sh)
  i32, f32 = jnp.int32, jnp.float32
  row_col = lambda dtype: jax.ShapeDtypeStruct((rows, T), dtype)
  batch_abs = LearnerBatch(tokens=row_col(i32), mask=row_col(i32), response_mask=row_col(i32),
                           old_logp=row_col(f32), advantages=jax.ShapeDtypeStruct((rows,), f32),
                           ref_logp=row_col(f32) if loss.kl_coef > 0 else None,
                           response_start=(prompt_cols if a.response_start < 0 else
                                           a.response_start or None))
  repl = NamedSharding(mesh, P())
  key_in = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=repl)

  # Largest arrays of the train state, with their shardings.
  leaves = []
  for (path, x), (_, s) in zip(jax.tree_util.tree_leaves_with_path(state_abs),
                               jax.tree_util.tree_leaves_with_path(st_sh)):
    nbytes = math.prod(x.shape) * x.dtype.itemsize
    per_dev = math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
    leaves.append((nbytes, per_dev, jax.tree_util.keystr(path), x.shape, s.spec))
  leaves.sort(key=lambda t: -t[0])
  print(f"\ntrain state: {_gb(sum(l[0] for l in leaves))} total, "
        f"{_gb(sum(l[1] for l in leaves))} per device; largest arrays:")
  for nbytes, per_dev, name, shape, spec in leaves[:a.top]:
    print(f"  {name:60s} {str(shape):22s} {str(spec):40s} {_gb(per_dev)}/device")
  # What the trainer keeps on the device next to each program (mr_rl/train.py: the train state
  # and pi_0, `base_params`, live for the whole run; the program's own arguments are in its peak).
  params_dev = sum(math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
                   for x, s in zip(jax.tree.leaves(params_abs), jax.tree.leaves(p_sh)))
  state_dev = sum(l[1] for l in leaves)
  if lora_cfg is None:
    resident = {"policy_step": params_dev,   # pi_0 (the state is the step's argument)
                "ref_logprob": state_dev,    # the train state (pi_0 is the argument)
                "sampler": state_dev}        # Adam moments + pi_0 (the policy params: argument)
  else:
    print(f"frozen base (pi_0, not donated, no reference copy): {_gb(params_dev)} per device")
    resident = {"policy_step": 0,                      # the base is the step's argument
                "ref_logprob": state_dev,              # adapters + moments (base: argument)
                "sampler": params_dev + state_dev}     # base + adapter state (merged: argument)
  resident["moe_block"] = 0
  # The programs' large arguments per device. XLA leaves arguments a program does not read
  # out of its argument size (e.g. the LM head in the engine's prefill), but they stay on the
  # device: the peak counts at least these.
  declared = {"policy_step": state_dev + (0 if lora_cfg is None else params_dev),
              "ref_logprob": params_dev, "sampler": params_dev, "moe_block": 0}
  import check_ppo  # launch/check_ppo.py: PPO's critic state and programs
  ppo_lowerings = check_ppo.lowerings(
      c, model, ucfg, mesh, rules, train_abs=train_abs, batch_abs=batch_abs, rows=rows,
      micro=micro, params_in=params_in, params_dev=params_dev, state_dev=state_dev,
      resident=resident, declared=declared, gb=_gb) if check_ppo.is_ppo(c) else {}

  def lower_step():
    step = update_lib.make_policy_step(
        update_lib.model_logits_fn(model), ucfg, tx, mesh=mesh, rules=rules,
        state_sharding=st_sh, batch_example=batch_abs,
        base_sharding=None if lora_cfg is None else p_sh)
    b_sh = shd.batch_shardings(batch_abs, mesh)
    base = () if lora_cfg is None else (params_in,)  # LoRA: the frozen base, not donated
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return step.jitted.lower(state_in, with_sh(batch_abs, b_sh), key_in, *base)

  def lower_ref():
    fn = update_lib.make_logprob_fn(update_lib.model_logits_fn(model))
    n = rows // ref_chunks
    tok = jax.ShapeDtypeStruct((n, T), i32, sharding=shd.batch_sharding(mesh, (n, T)))
    with shd.activation_sharding(mesh, rules):
      return fn.lower(params_in, tok, tok)

  sample_dtype = c.rollout.get("dtype", "") or ""
  cache_dtype = c.rollout.get("cache_dtype", "") or None
  sample_model = (models.Transformer(cfg.replace(dtype=jnp.dtype(sample_dtype)))
                  if sample_dtype and jnp.dtype(sample_dtype) != compute else model)

  def lower_sampler():
    sampler = Sampler(sample_model, max_new_tokens=resp_cols, temperature=1.0, eos_id=0,
                      pad_id=0, mesh=mesh, rules=rules, cache_dtype=cache_dtype)
    tok = jax.ShapeDtypeStruct((rows, prompt_cols), i32,
                               sharding=shd.batch_sharding(mesh, (rows, prompt_cols)))
    with shd.activation_sharding(mesh, rules):
      return sampler._jitted.lower(params_in, tok, tok, key_in)  # pylint: disable=protected-access

  def moe_block():
    """One MoE block's forward at the policy step's micro-batch: stand-in vs ragged_dot vs the
    analytic count (`moe_block_bytes`, or `ep_block_bytes` for 'ep'; verification, not part of
    the fit)."""
    from mr_rl.models import moe
    n = rows // micro
    x = jax.ShapeDtypeStruct((n, T, cfg.d_model), dtype, sharding=shd.batch_sharding(
        mesh, (n, T, cfg.d_model)))
    w = layer_of(params_in["layers"]["mlp"], 0)  # one layer of the scanned stack
    temps = {}
    for impl in ("stand_in", "ragged_dot"):
      ctx = moe.grouped_matmul_stand_in() if impl == "stand_in" else contextlib.nullcontext()
      fn = lambda p, h: moe.MoEBlock(cfg).apply({"params": p}, h)  # a fresh trace per impl
      with ctx, shd.activation_sharding(mesh, rules):
        temps[impl] = jax.jit(fn).lower(w, x).compile().memory_analysis().temp_size_in_bytes
    count = ep_block_bytes if cfg.moe_impl == "ep" else moe_block_bytes
    parts = count(cfg, dict(mesh.shape), n * T, dtype.itemsize)
    total = sum(parts.values())
    print(f"  moe_block    one MoE block forward, {n} rows x {T} tokens (the policy step's "
          f"micro-batch), per device:")
    for k, v in parts.items():
      print(f"      {k:66s} {_gb(v)}")
    print(f"      {'analytic sum (no buffer reuse)':66s} {_gb(total)}")
    for impl, t in temps.items():
      print(f"      XLA temp with {impl:10s} {_gb(t)}  = {t / total:6.2f} x analytic")

  # The continuous engine: the analytic slot budget, then S (compiled lazily, below).
  import check_engine  # launch/check_engine.py, next to this script
  from mr_rl.sampling import memory
  from mr_rl.sampling.sampler import prompt_bucket
  budget = memory.slot_budget(sample_model.config, hbm_bytes=hbm,
                              prompt_len=prompt_bucket(prompt_cols, None),
                              max_new_tokens=resp_cols, group_size=group,
                              mesh_shape=dict(mesh.shape), cache_dtype=cache_dtype,
                              reserved_bytes=resident["sampler"])
  print("\n" + "\n".join(check_engine.budget_lines(budget, _gb)))
  if a.slots == "budget":
    if not budget.slots:
      raise ValueError("--slots=budget: no slot fits next to the params and the resident state")
    slots = budget.slots
  else:
    slots = int(a.slots or 0) or int(c.rollout.slots) or rows  # as the trainer: 0 = one per row
  # A multi-turn config rolls out on the turn programs instead (launch/check_turns.py).
  engine_names = (check_turns.program_names() if turns is not None
                  else ("engine_prefill", "engine_step", "engine_shrink"))
  engine_progs = {}

  def engine_program(name):
    if not engine_progs:
      kw = dict(slots=slots, group=group, prompt_cols=prompt_cols, resp_cols=resp_cols,
                cache_dtype=cache_dtype, mesh=mesh, rules=rules, params_in=params_in,
                key_in=key_in, param_bytes=params_dev)
      if turns is not None:
        progs, info = check_turns.lowerings(sample_model, turns, **kw)
        print(check_turns.describe(info, slots, _gb))
      else:
        progs, info = check_engine.lowerings(sample_model, **kw)
        print(f"  engine       S={slots} slots (pool sizes {info['pool_sizes']}), M="
              f"{info['prefill_prompts']} prompts per prefill, prompt bucket {info['bucket']}; "
              f"per device: slot state {_gb(info['state_bytes'])}, prompt store "
              f"{_gb(info['store_bytes'])}")
      engine_progs.update(progs)
    return engine_progs.get(name)

  lowerings = {"policy_step": lower_step, "ref_logprob": lower_ref, "sampler": lower_sampler,
               **ppo_lowerings}
  samplers = (list(engine_names) if turns is not None else  # the engine's own
              list(rollout_engines.ENGINES.get(c.rollout.engine).check_programs))
  wanted = [p.strip() for p in a.programs.split(",") if p.strip()] or (
      ["policy_step", "ref_logprob"] + samplers + (["moe_block"] if grouped else []))
  wanted = [n for p in wanted for n in (engine_names if p == "engine" else (p,))]
  wanted = check_ppo.programs(wanted) if ppo_lowerings else wanted  # PPO's step and critic
  wanted = [] if wanted == ["none"] else wanted
  valid = sorted(lowerings) + list(engine_names) + ["engine", "moe_block", "none"]
  unknown = sorted(set(wanted) - set(valid))
  if unknown:
    raise ValueError(f"--programs: unknown {unknown}; valid: {valid} ('none' alone)")
  if "moe_block" in wanted and not grouped:
    raise ValueError("--programs=moe_block needs an MoE model with moe_impl 'ragged' or 'ep'")
  # Analytic TPU kernel workspace (group metadata of the largest call) added to each total.
  if stand_in:
    rows_max = max(rows // micro * T, rows // ref_chunks * T, rows * prompt_cols)
    workspace = gmm_metadata_bytes(rows_max * cfg.num_experts_per_tok,
                                   cfg.num_experts // mesh.shape["expert"])
  else:
    workspace = 0
  ok, results = True, {}
  print("\nper-device memory (XLA memory_analysis; total = peak + resident"
        + (" + kernel workspace" if stand_in else "") + "):")
  for name in wanted:
    if name == "moe_block":
      with attention.target_backend(backend):
        moe_block()
      continue
    t0 = time.time()
    from mr_rl.models import moe
    with (moe.grouped_matmul_stand_in() if stand_in else contextlib.nullcontext()), \
        attention.target_backend(backend):
      if name in engine_names:
        program = engine_program(name)
        if program is None:
          print(f"  {name:14s} not run: a pool of {slots} slots does not shrink")
          continue
        lower, resident[name], declared[name] = program
        resident[name] += resident["sampler"]
      else:
        lower = lowerings[name]
      try:
        compiled = lower().compile()
      except Exception as e:  # pylint: disable=broad-except
        if "RESOURCE_EXHAUSTED" not in str(e):
          raise
        # XLA:TPU refuses a program whose buffers exceed the chip's HBM.
        first = next((l for l in str(e).splitlines() if "RESOURCE_EXHAUSTED" in l), str(e))
        print(f"  {name:14s} DOES NOT FIT: the compiler refused it: {first.strip()[:300]}"
              f"  (compiled in {time.time() - t0:.0f} s)")
        ok, results[name] = False, (None, False)
        continue
    m = compiled.memory_analysis()
    unread = max(0, declared[name] - m.argument_size_in_bytes)  # arguments XLA dropped
    widened = 0 if target is not None else cpu_widened_bytes(
        name, sample_model.config, cache_dtype, slots, prompt_cols, resp_cols, dict(mesh.shape))
    peak = (m.argument_size_in_bytes + unread + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes - widened)
    total = peak + resident[name] + workspace
    fits, words = _verdict(total, hbm, a.headroom)
    ok &= fits
    results[name] = (total, fits)
    print(f"  {name:14s} args {_gb(m.argument_size_in_bytes)}"
          + (f" (+ {_gb(unread)} not read)" if unread else "")
          + f"  out {_gb(m.output_size_in_bytes)}  alias {_gb(m.alias_size_in_bytes)}"
          f"  temp {_gb(m.temp_size_in_bytes)}"
          + (f" (less {_gb(widened)}: XLA:CPU's float32 copy of the cache)" if widened else "")
          + f"  => peak {_gb(peak)} + resident {_gb(resident[name])}"
          + (f" + workspace {workspace / 1e3:.1f} KB" if stand_in else "")
          + f" = {_gb(total)} {words}"
          f"  (compiled in {time.time() - t0:.0f} s)")
  if "policy_step" in wanted:
    chip_name = (KIND_TO_CHIP.get(target.kind) if target is not None else a.chip)
    if chip_name in config_lib.CHIPS:
      print("\n" + analytic_step(cfg, rows=rows, micro=micro, T=T,
                                 chips=target.chips if target is not None else len(devices),
                                 chip=chip_name, param_dev_bytes=params_dev,
                                 state_dev_bytes=state_dev, compute_bytes=compute.itemsize))
  print("\nresult: " + ("every program fits" if ok else "some program does not fit: change the "
                        "mesh, slice, micro-batches or lengths")
        + (f" with {100 * a.headroom:.0f}% headroom" if ok else "")
        + (f" (XLA:TPU, {target.name})" if target is not None
           else " (XLA:CPU's approximation; --topology for XLA:TPU's verdict)"))
  return ok, results

if __name__ == "__main__":
  sys.exit(main())
