r"""A trained policy out of a run's workdir as a Hugging Face checkpoint (transformers, vLLM).

    python -m mr_rl.export --workdir=W [--step=N] --out=DIR [--base=BASE_DIR] [--overwrite]
                           [--format=merged|peft]

reads the policy parameters of checkpoint step N (default: the latest) from
`W/checkpoints/<N>/state` and writes DIR: safetensors in transformers' layout, config.json,
and the base checkpoint's tokenizer files, chat template and generation config, so

    AutoModelForCausalLM.from_pretrained(DIR); AutoTokenizer.from_pretrained(DIR)
    vllm serve DIR

load it, and transformers' greedy `generate` on DIR gives mr_rl's greedy samples token for token
(tested for dense and MoE models, also from parameters sharded over 8 devices).
`config.export.hf_at_end = True` writes the same to `W/hf/` at the end of training
(`mr_rl.pipelines.run_train`).

`--out` must be a new or empty directory: the export refuses one that holds files unless
`--overwrite` is given (the earlier export there is then replaced; files that no export writes,
`EXPORT_FILES`, are kept). `config.export.hf_at_end` always rewrites the run's own `W/hf/` (a
resumed run re-exports its final policy there). The export is atomic: everything is written
into `DIR.incomplete-export.<host>.<pid>` beside DIR and renamed onto DIR when complete
(`mr_rl.staged_dir`), so an export stopped midway leaves DIR as it was (absent, or the earlier
export) and its leftover under that name, which the next export to DIR removes (and says so).
Files are written readable by other users as the umask allows (like transformers), so a
server running as another user can load them.

The export's tokenizer carries the chat template that writes prompts the way the run wrote
them (`mr_rl.data.templates.chat_template_of_run`): for a run without a prompt template
(`data.template = ''`, e.g. the demo) BOS then the single user message; for a plain-style
template its `User:` / `Assistant:` text with the task's system preamble and suffix; for a
chat-style template the base tokenizer's own. So `tok.apply_chat_template(messages,
add_generation_prompt=True)` gives the policy the prompts it was trained on.

Export works from the workdir alone: the architecture and tokenizer come from the run's base
checkpoint (`model.path` of `W/settings.json`, which every training run writes; `--base`
overrides it, e.g. when the base was a hub id and this machine is offline), and only the
`params` subtree of the checkpoint is read (orbax partial restore), never the optimizer
state, so exporting needs memory for the parameters only.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import sys
from typing import Sequence

import jax
import orbax.checkpoint as ocp
from etils import epath

from mr_rl import metrics as metrics_lib
from mr_rl import models
from mr_rl import staged_dir
from mr_rl import workdir as workdir_lib
from mr_rl.errors import DamagedFileError, UserError
from mr_rl.models import hf_io
from mr_rl.models import lora as lora_lib
from mr_rl.models.transformer import LAYERS, stack_layers, unstack_layers


def checkpoint_steps(workdir: str) -> list[int]:
  """The finished checkpoint steps under `workdir/checkpoints` (orbax renames a step's
  directory into place when it is complete), ascending."""
  d = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(d):
    return []
  return sorted(int(n) for n in os.listdir(d)
                if n.isdigit() and os.path.isdir(os.path.join(d, n, "state")))


def saved_settings(workdir: str) -> dict:
  """The run's resolved settings (`WORKDIR/settings.json`, written by the trainer)."""
  path = os.path.join(workdir, metrics_lib.SETTINGS_FILE)
  if not os.path.exists(path):
    where = workdir_lib.where_the_runs_are(workdir)
    raise FileNotFoundError(f"no {metrics_lib.SETTINGS_FILE} in {workdir!r}" + (
        where if where else " (not a training run's workdir?); give the base checkpoint with "
        "--base=DIR"))
  with open(path) as f:
    text = f.read()
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise DamagedFileError(
        f"{path} is damaged (line {e.lineno}, column {e.colno}: {e.msg}); it names the run's "
        "base checkpoint: give that with --base=DIR (and restore the file from a copy, or "
        "from a settings.resume-<step>.json of the same run)") from None


def base_checkpoint(workdir: str, base: str | None = None) -> str:
  """The local directory of the run's base checkpoint: `base`, else the run's model.path."""
  if base is None:
    model = saved_settings(workdir)["model"]
    if not model.get("path"):
      raise ValueError(f"the run in {workdir!r} trained a random-init preset "
                       f"({model.get('preset')!r}) without a base checkpoint; give one with "
                       "--base=DIR (its config.json and tokenizer are written with the params)")
    base = model["path"]
  try:
    return hf_io.resolve_path(base, ["*.json", "tokenizer*", "*.txt", "*.model", "*.tiktoken",
                                     "*.jinja"])
  except OSError as e:
    raise type(e)(f"{e} For mr_rl.export, give the local copy with --base=DIR.") from e


def _state_dir(workdir: str, step: int) -> epath.Path:
  return epath.Path(os.path.abspath(workdir)) / "checkpoints" / str(step) / "state"


def params_metadata(workdir: str, step: int):
  """Shapes and dtypes of the policy params in checkpoint `step` (read from its metadata)."""
  return ocp.PyTreeCheckpointHandler().metadata(_state_dir(workdir, step)).tree["train"]["params"]


def _export_settings(workdir: str, base: str | None, log) -> dict | None:
  """The run's settings.json, or None where there is none, or where it is damaged and `base`
  names the base checkpoint (logged: the export then goes as without one)."""
  if not os.path.exists(os.path.join(workdir, metrics_lib.SETTINGS_FILE)):
    return None
  try:
    return saved_settings(workdir)
  except DamagedFileError as e:
    if base is None:
      raise
    if log:
      log(f"{e}; exporting with --base={base} as a run without its settings (full "
          "fine-tuning, the base's chat template)")
    return None


def run_lora(workdir: str, settings: dict | None = None) -> lora_lib.LoraConfig | None:
  """The LoRA config of a run (`model.lora` of its settings.json, or of `settings`), or None
  (full fine-tuning or no settings.json)."""
  if settings is None:
    if not os.path.exists(os.path.join(workdir, metrics_lib.SETTINGS_FILE)):
      return None
    settings = saved_settings(workdir)
  cfg = settings["model"].get("lora")
  return None if not cfg else lora_lib.LoraConfig(
      rank=cfg["rank"], alpha=cfg["alpha"], targets=tuple(cfg["targets"]),
      init_from=cfg.get("init_from", ""), dropout=float(cfg.get("dropout", 0.0)))


def restore_params(workdir: str, step: int, model, mesh=None, lora=None):
  """The policy params of checkpoint `step` (only that subtree is read).

  Args:
    workdir: the run's workdir.
    step: a finished checkpoint step (`checkpoint_steps`).
    model: the `Transformer` whose parameter tree the checkpoint holds.
    mesh: optional `jax.sharding.Mesh`: params are restored into their shardings on it
      (`sharding.param_shardings`); else onto the host.
    lora: the run's `LoraConfig` (`run_lora`): the checkpoint holds its adapters.

  Raises:
    ValueError: the checkpoint's params do not have the model's structure / shapes.
  """
  path = _state_dir(workdir, step)
  saved = params_metadata(workdir, step)
  expected = models.abstract_params(model) if lora is None else \
      lora_lib.abstract_adapters(model.config, lora)
  L = model.config.n_layers
  per_layer = f"{LAYERS}_0" in saved  # written before the layer scan: converted after reading
  shape = lambda t: jax.tree.map(lambda x: tuple(x.shape), t)
  try:
    same = shape(saved) == shape(unstack_layers(expected, L) if per_layer else expected)
  except (TypeError, ValueError):
    same = False
  if not same:
    raise _ArchitectureError(
        f"the params of {path} do not match the base checkpoint's architecture "
        f"({model.config.family}, {model.config.n_layers} layers, d_model "
        f"{model.config.d_model}); was the run trained from another base?")
  if mesh is not None:
    from mr_rl.models import sharding
    shardings = sharding.param_shardings(model, mesh) if lora is None else \
        sharding.adapter_shardings(model.config, lora, mesh)
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          expected, shardings)
    if per_layer:
      target = unstack_layers(target, L)
  else:
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), saved)
  item = {"train": {"params": target}}
  handler = ocp.PyTreeCheckpointHandler()
  try:
    out = handler.restore(path, args=ocp.args.PyTreeRestore(
        item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
        partial_restore=True))
  finally:
    handler.close()
  params = out["train"]["params"]
  return stack_layers(params, L) if per_layer else params


class _ArchitectureError(ValueError):
  """A checkpoint's params do not have the base checkpoint's shapes."""


def _model_for(base_dir: str, dtype) -> models.Transformer:
  hf = hf_io.read_config(base_dir)
  return models.Transformer(hf_io.config_from_hf(hf, param_dtype=dtype, dtype=dtype))


CHAT_TEMPLATE_FILE = "chat_template.jinja"


def _write_chat_template(out: str, settings, has_chat_template: bool) -> None:
  """Writes the run's prompt format as the export's chat template (module docstring); a
  chat-style run keeps the base tokenizer's (`has_chat_template`: whether it has one)."""
  from mr_rl.data import templates
  if dataclasses.is_dataclass(settings):
    settings = metrics_lib.settings_dict(settings)
  jinja = templates.chat_template_of_run(settings["data"]["template"],
                                         settings["model"]["path"],
                                         settings["data"].get("style", ""), has_chat_template)
  if jinja is None:
    return
  for fn in ("chat_template.json", CHAT_TEMPLATE_FILE):  # the base's, replaced
    if os.path.exists(os.path.join(out, fn)):
      os.remove(os.path.join(out, fn))
  cfg_path = os.path.join(out, "tokenizer_config.json")
  if os.path.exists(cfg_path):
    with open(cfg_path) as f:
      tok_cfg = json.load(f)
    if tok_cfg.pop("chat_template", None) is not None:
      with open(cfg_path, "w") as f:
        json.dump(tok_cfg, f, indent=2)
  with open(os.path.join(out, CHAT_TEMPLATE_FILE), "w") as f:
    f.write(jinja)


def _check_not_base(out: str, base_dir: str) -> None:
  if os.path.realpath(out) == os.path.realpath(base_dir):
    raise ValueError(f"the export directory {out!r} is the base checkpoint itself; choose "
                     "another --out (the base's weights would be replaced)")


# What an export writes (`hf_io.save_pretrained`, `write_hf`, `lora.save_peft`): an existing
# `out`'s entries that match none of these (a user's notes) are taken into the new `out`.
EXPORT_FILES = ("model*.safetensors*", "config.json", "generation_config.json", "tokenizer*",
                "special_tokens*", "added_tokens*", "vocab*", "merges*", "chat_template*",
                lora_lib.ADAPTER_CONFIG, lora_lib.ADAPTER_WEIGHTS)


def _not_export_file(name: str) -> bool:
  return not any(fnmatch.fnmatch(name, pattern) for pattern in EXPORT_FILES)


def write_hf(model, params, out: str, base_dir: str, settings=None, log=print) -> str:
  """Writes `params` as a transformers checkpoint to `out` with the base's tokenizer files.

  `models.save_pretrained` writes the weights and config.json and copies the tokenizer, chat
  template and generation config of `base_dir`; where the base names no BOS / EOS / PAD ids
  (in config.json or a generation_config.json) they are taken from its tokenizer, the ids
  mr_rl's sampler stops and pads with, so `generate` and vLLM stop where mr_rl does.

  Process 0 writes everything into `<out>.incomplete-export.<host>.<pid>` and renames it onto
  `out` when complete (`mr_rl.staged_dir`): a stopped export leaves `out` as it was. An
  earlier export in `out` is replaced (this is what `config.export.hf_at_end` rewrites `W/hf/`
  with; `export` refuses a non-empty `out` without `overwrite`); files of `out` that are not
  export files (`EXPORT_FILES`) are kept. The other processes only join the parameters'
  gathers and write nothing.

  Args:
    settings: the run's `RunSettings` or its settings.json dict: the export's chat template
      then writes prompts as the run did (module docstring); None keeps the base's.
    log: callable for the lines about leftovers of stopped exports (`staged_dir`), or None.

  Returns:
    `out`.
  """
  _check_not_base(out, base_dir)
  params = lora_lib.merge(params)  # a LoRA policy: the base with its adapters folded in
  if jax.process_index() != 0:  # the others only join the parameters' gathers (no files)
    models.save_pretrained(model, params, out, source=base_dir)
    return out
  with staged_dir.staged(out, keep=_not_export_file, log=log) as tmp:
    models.save_pretrained(model, params, tmp, source=base_dir)
    _write_ids_and_template(tmp, base_dir, settings)
    hf_io.make_readable(tmp)
  return out


def _write_ids_and_template(out: str, base_dir: str, settings) -> None:
  """The BOS / EOS / PAD ids, generation config and chat template of `write_hf`."""
  tok = models.load_tokenizer(base_dir)
  ids = {f"{n}_token_id": getattr(tok, f"{n}_token_id") for n in ("bos", "eos", "pad")}
  ids = {k: v for k, v in ids.items() if v is not None}
  cfg_path = os.path.join(out, "config.json")
  with open(cfg_path) as f:
    cfg = json.load(f)
  for k, v in ids.items():
    if cfg.get(k) is None:
      cfg[k] = v
  with open(cfg_path, "w") as f:
    json.dump(cfg, f, indent=2)
  if not os.path.exists(os.path.join(out, "generation_config.json")):
    from transformers import GenerationConfig
    GenerationConfig(**{k: cfg[k] for k in ids}).save_pretrained(out)
  if settings is not None:
    _write_chat_template(out, settings, bool(getattr(tok, "chat_template", None)))


def check_out_dir(out: str, overwrite: bool) -> None:
  """Refuses an `out` that holds files unless `overwrite` (FileExistsError naming them)."""
  if os.path.isdir(out):
    present = sorted(os.listdir(out))
    if present and not overwrite:
      raise FileExistsError(
          f"--out {out!r} is not empty ({len(present)} entries: "
          f"{', '.join(present[:8])}{', ...' if len(present) > 8 else ''}); the export would "
          f"replace the export files there (config.json, tokenizer files, model*.safetensors*, "
          f"...). Choose a new directory or pass --overwrite")
  elif os.path.exists(out):
    raise FileExistsError(f"--out {out!r} exists and is not a directory")


FORMATS = ("merged", "peft")


def _newest_readable(workdir, steps, base_dir, mesh, lora, log):
  """(step, model, params) of the newest of `steps` whose params read back; each unreadable
  one is named (and logged) before the next older one is tried.

  Raises:
    ValueError: the params do not have the base's architecture (no other step would).
    OSError: none of `steps` reads back (each named with its error).
  """
  failures = []
  for step in sorted(steps, reverse=True):
    try:
      dtype = jax.tree.leaves(params_metadata(workdir, step))[0].dtype
      model = _model_for(base_dir, dtype)
      params = restore_params(workdir, step, model, mesh, lora)
    except _ArchitectureError:
      raise
    except Exception as e:  # pylint: disable=broad-except  # named, then the next older one
      failures.append(f"checkpoint {_state_dir(workdir, step).parent} cannot be read "
                      f"({type(e).__name__}: {str(e)[:300]})")
      continue
    if failures and log:
      log("; ".join(failures) + f"; exporting step {step}, the newest readable checkpoint")
    return step, model, params
  raise OSError("\n".join(failures))


def export(workdir: str, out: str, *, step: int | None = None, base: str | None = None,
           mesh=None, log=print, overwrite: bool = False, format: str = "merged") -> str:
  """Writes checkpoint `step` (default: the latest) of the run in `workdir` to `out`.

  A LoRA run (`config.model.lora`) exports as `format` 'merged' (the default: the base with
  the adapters folded in, a plain transformers checkpoint) or 'peft' (`adapter_config.json` +
  `adapter_model.safetensors`, for `peft.PeftModel.from_pretrained(base, out)`).

  Args:
    workdir: a training run's workdir (`checkpoints/`, `settings.json`).
    out: output directory (a transformers checkpoint).
    step: checkpoint step; None = the latest.
    base: the base checkpoint directory (default: the run's `model.path`).
    mesh: optional mesh to restore the params onto (sharded), see `restore_params`.
    log: callable for a one-line summary, or None.
    overwrite: replace the export in a non-empty `out` (files that are not export files,
      `EXPORT_FILES`, are kept).

  Raises:
    FileExistsError: `out` holds files and not `overwrite`.
    FileNotFoundError: no checkpoints, or `step` is not one of them (the message lists them).
  """
  if format not in FORMATS:
    raise ValueError(f"--format must be one of {FORMATS}, got {format!r}")
  settings = _export_settings(workdir, base, log)
  lora = None if settings is None else run_lora(workdir, settings)
  if format == "peft" and lora is None:
    raise ValueError(f"--format=peft needs a LoRA run (config.model.lora.rank > 0); {workdir!r} "
                     "trained every weight: export it merged")
  steps = checkpoint_steps(workdir)
  if not steps:
    raise FileNotFoundError(f"no checkpoints under {os.path.join(workdir, 'checkpoints')!r}"
                            f"{workdir_lib.where_the_runs_are(workdir)}")
  if step is not None and int(step) not in steps:
    raise FileNotFoundError(f"no checkpoint step {step} in {workdir!r}; saved steps: {steps}")
  base_dir = base_checkpoint(workdir, base)
  _check_not_base(out, base_dir)
  check_out_dir(out, overwrite)
  step, model, params = _newest_readable(workdir, steps if step is None else [int(step)],
                                         base_dir, mesh, lora, log)
  if format == "peft":
    if jax.process_index() == 0:  # (the adapters are small: no gathers to join)
      with staged_dir.staged(out, keep=_not_export_file, log=log) as tmp:
        lora_lib.save_peft(tmp, params, model.config, lora, base_model=base_dir)
        hf_io.make_readable(tmp)
    if log:
      log(f"exported the adapters of step {step} of {workdir} to {out} (PEFT; base {base_dir})")
    return out
  if lora is not None:
    dtype = jax.tree.leaves(params_metadata(workdir, step))[0].dtype
    _, base_params = models.load_pretrained(base_dir, dtype=dtype, mesh=mesh)
    params = lora_lib.Adapted(base_params, params, lora.scale)
  has_settings = settings is not None
  write_hf(model, params, out, base_dir, settings=settings, log=log)
  if log:
    log(f"exported step {step} of {workdir} to {out} (base {base_dir})"
        + ("" if has_settings else f"; no readable {metrics_lib.SETTINGS_FILE} in the "
           "workdir: the chat template is the base's"))
  return out


def main(argv: Sequence[str] | None = None) -> str:
  p = argparse.ArgumentParser(prog="python -m mr_rl.export",
                              description=__doc__.strip().split("\n\n")[0])
  p.add_argument("--workdir", required=True, help="the training run's workdir")
  p.add_argument("--out", required=True, help="output directory (a transformers checkpoint)")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
  p.add_argument("--base", default=None,
                 help="base checkpoint directory (default: the run's config.model.path)")
  p.add_argument("--format", default="merged", choices=FORMATS,
                 help="a LoRA run: 'merged' weights (default) or a 'peft' adapter directory")
  p.add_argument("--overwrite", action="store_true",
                 help="replace the export in a non-empty --out (other files there are kept)")
  a = p.parse_args(argv)
  try:
    return export(a.workdir, a.out, step=a.step, base=a.base, overwrite=a.overwrite,
                  format=a.format)
  except FileExistsError as e:
    p.error(str(e))
  except UserError as e:  # its message says what to fix (mr_rl.errors)
    print(f"FATAL {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    sys.exit(1)


if __name__ == "__main__":
  main()
