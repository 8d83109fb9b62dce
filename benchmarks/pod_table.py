r"""The paper configs on their TPU slices, by XLA:TPU: docs/benchmarks.md's pod table.

    pip install -e ".[tpu]"
    python benchmarks/pod_table.py                 # every config below, 2 at a time
    python benchmarks/pod_table.py --only amrp_math --jobs 1

Runs `launch/check.py --config=... --topology=SLICE` (XLA:TPU, deviceless) for each paper config
at the slice its docstring names (config_lib.MODELS), and prints one markdown row per config:
GB per chip of each program (total = XLA:TPU's peak + what the trainer keeps resident), its
share of the HBM XLA:TPU allows, compile seconds, the policy step's analytic time, and the
verdict at 10% headroom. Configs whose programs have the same shapes as one above (same model,
lengths, mesh, micro-batches, engine) are not compiled again: their row names the one they share.
Compiles of 4B-30B models take 1-5 minutes each on 2 cores.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (config argument, slice): every paper config file at its default point, plus the model points
# whose slice differs.
CONFIGS = [
    ("amrp_math.py", "v5p-8"),
    ("amrp_math.py:model=deepseek_math_7b", "v5p-32"),
    ("amrp_alce.py", "v5p-8"),
    ("amrp_alce.py:model=llama3_1_8b", "v5p-16"),
    ("amrp_align.py", "v5p-8"),
    ("amrp_align.py:model=llama3_1_8b", "v5p-16"),
    ("amrp_algorithms.py", "v5p-8"),
    ("amrp_algorithms.py:algorithm=ppo", "v5p-8"),
    ("amrp_ablation.py", "v5p-8"),
    ("amrp_priors.py", "v5p-8"),
    ("amrp_sensitivity.py", "v5p-8"),
    ("amrp_dynamics.py", "v5p-8"),
    ("tag_math.py", "v5p-8"),
    ("tag_math.py:model=qwen3_4b", "v5p-8"),
    ("tag_math.py:model=llama3_2_3b", "v5p-8"),
    ("tag_math.py:model=llama3_1_8b", "v5p-16"),
    ("tag_code.py", "v5p-8"),
    ("tag_moe.py", "v5p-32"),
    ("tag_downweight.py", "v5p-8"),
    ("tag_drift.py", "v5p-8"),
    ("tag_kl_sweep.py", "v5p-8"),
    ("tag_lambda.py", "v5p-8"),
    ("tag_three_channels.py", "v5p-8"),
    ("math_tools.py", "v5p-8"),  # multi-turn: the turn programs (launch/check_turns.py)
]


def shape_key(config_arg: str) -> tuple:
  """What fixes a config's programs: model, dtypes, lengths, rows, mesh, micro-batches, engine,
  LoRA, loss terms that add arrays (KL's reference log-probs), the critic, multi-turn rollouts
  (tools or environment, observation width)."""
  sys.path.insert(0, REPO)
  from mr_rl import config_lib  # pylint: disable=import-outside-toplevel
  path, _, arg = config_arg.partition(":")
  c = config_lib.load_config_module(os.path.join(REPO, "configs", path)).get_config(arg or None)
  return (c.model.path, c.model.dtype, c.model.get("compute_dtype", ""), c.model.moe_impl,
          bool(c.model.get("remat")), c.model.get("attention_impl", "auto"), int(c.model.lora.rank),
          int(c.data.max_prompt_len), int(c.rollout.max_new_tokens), int(c.data.batch_prompts),
          int(c.rollout.group_size), tuple(sorted((k, int(v)) for k, v in c.mesh.items())),
          int(c.optim.num_micro_batches), c.rollout.engine, int(c.rollout.get("slots", 0)),
          c.rollout.get("dtype", ""), c.rollout.get("cache_dtype", ""),
          float(c.optim.loss.kl_coef) > 0, c.advantage.name == "ppo",
          bool(c.multiturn.env or c.multiturn.tools), int(c.multiturn.max_observation_tokens))


def run_check(config_arg: str, topology: str) -> dict:
  cmd = [sys.executable, os.path.join(REPO, "launch", "check.py"),
         f"--config=configs/{config_arg}", f"--topology={topology}"]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
  text = out.stdout
  programs = {}
  for m in re.finditer(r"^  (\w+)\s+(?:args .*= +([\d.]+) (MB|GB) (.*?)|DOES NOT FIT: (.*?))"
                       r"\s+\(compiled in (\d+) s\)", text, re.MULTILINE):
    gb = float(m.group(2)) * (1e-3 if m.group(3) == "MB" else 1) if m.group(2) else None
    programs[m.group(1)] = (gb, int(m.group(6)), m.group(4) or "refused by the compiler")
  hbm = re.search(r"budget\s+([\d.]+) GB per device", text)
  step = re.search(r"-> >= ([\d.]+) s per step at peak", text)
  return dict(rc=out.returncode, programs=programs, hbm=float(hbm.group(1)) if hbm else None,
              step=step.group(1) if step else "", tail=(text + out.stderr)[-1500:])


def row(config_arg, topology, r) -> str:
  cells = []
  for name in ("policy_step", "ppo_step", "value_forward", "ref_logprob", "sampler",
               "engine_init", "engine_prefill", "engine_step", "engine_gather", "engine_shrink",
               "engine_append"):
    if name in r["programs"]:
      gb, secs, _ = r["programs"][name]
      share = f"{gb:.1f} ({100 * gb / r['hbm']:.0f}%)" if gb is not None else "refused"
      cells.append(f"{name} {share}, {secs} s")
  verdict = "yes" if r["rc"] == 0 else "**no**"
  return (f"| `{config_arg}` | {topology} | " + "; ".join(cells) + f" | {r['step']} s | "
          f"{verdict} |")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--only", default="", help="comma-separated substrings of config arguments")
  p.add_argument("--jobs", type=int, default=2, help="checks at once")
  a = p.parse_args(argv)
  todo = [(c, t) for c, t in CONFIGS
          if not a.only or any(x in c for x in a.only.split(","))]
  first, same = {}, {}
  for c, t in todo:
    key = (shape_key(c), t)
    if key in first:
      same[c] = first[key]
    else:
      first[key] = c
  runs = [(c, t) for c, t in todo if c not in same]
  print(f"{datetime.date.today()}, XLA:TPU (launch/check.py --topology), GB per chip "
        "(share of the HBM XLA:TPU allows), compile seconds; policy step at the chip's peak "
        "(analytic); fits = every program with 10% headroom\n")
  print("| config | slice | programs | step (analytic) | fits |\n|---|---|---|---|---|", flush=True)
  with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
    futures = {pool.submit(run_check, c, t): (c, t) for c, t in runs}
    for f in concurrent.futures.as_completed(futures):
      c, t = futures[f]
      r = f.result()
      print(row(c, t, r), flush=True)
      if not r["programs"]:
        print(f"<!-- {c}: {r['tail']!r} -->", flush=True)
  for c, t in todo:
    if c in same:
      print(f"| `{c}` | {t} | the programs of `{same[c]}` (same shapes) | | |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
