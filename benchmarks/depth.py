"""Compile cost against depth on XLA:CPU: the same trainer run on 2- and 28-layer checkpoints of
equal width (design: docs/accelerators.md, "Layer stack: compiled once"; figures:
docs/benchmarks.md, "Layer scan on XLA:CPU").

    python benchmarks/depth.py            # 2 vs 28 layers, d 32, 3 steps, compile cache off
    python benchmarks/depth.py --steps 1 --layers 2,8,28

For each depth, a fresh process writes a random checkpoint of the demo architecture (d 32, the
demo tokenizer) with that many layers and runs `mr_rl.testing.runs.length_config` for `--steps`
steps with the persistent compilation cache off, so every program compiles. It prints the wall
time of the run, the compile seconds the run logged (`compile/seconds`) and the optimized HLO
size of the policy step and of the sampler, each with its ratio to the shallowest depth. The
decoder runs its layers under one scan, so neither size nor compile time should grow with
depth; the run's compute does (28 layers do 14x the 2-layer FLOPs) but at this width it is a
small part of the time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_ONE = textwrap.dedent("""
    import json, os, sys, time
    import jax, numpy as np
    from mr_rl import models, settings as settings_lib, train as train_lib
    from mr_rl.rl import update as update_lib
    from mr_rl.sampling import sampler as sampler_lib
    from mr_rl.testing.runs import length_config, write_random_policy
    layers, steps, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    path = write_random_policy(os.path.join(out, f"policy{layers}"), n_layers=layers)
    c = length_config(path, steps)
    c.compile.cache_dir = "off"
    s = settings_lib.from_config(c)
    t0 = time.perf_counter()
    res = train_lib.train(s, None, log=None)
    wall = time.perf_counter() - t0
    compile_s = sum(h["compile/seconds"] for h in res.history)
    # Optimized HLO of the two largest programs at the run's shapes.
    model, params = models.load_pretrained(path)
    learner = update_lib.learner(model, s.update)
    state = learner.init(params, jax.random.PRNGKey(0))
    from mr_rl.rl.batch import LearnerBatch
    N, T = s.data.batch_prompts * s.rollout.group_size, s.data.max_prompt_len + 12
    z = np.zeros((N, T), np.int32)
    batch = LearnerBatch(tokens=z, mask=z + 1, response_mask=z, old_logp=z.astype(np.float32),
                         advantages=np.zeros((N,), np.float32), response_start=s.data.max_prompt_len)
    step_hlo = learner.step.lower(state, batch, jax.random.PRNGKey(0)).compile().as_text()
    smp = sampler_lib.Sampler(model, max_new_tokens=s.rollout.max_new_tokens)
    p = np.ones((N, s.data.max_prompt_len), np.int32)
    sampler_hlo = smp.lower(params, p, p, key=jax.random.PRNGKey(0)).compile().as_text()
    print(json.dumps(dict(layers=layers, wall=wall, compile=compile_s,
                          step_hlo=len(step_hlo), sampler_hlo=len(sampler_hlo))))
""")


def measure(layers: int, steps: int, out: str) -> dict:
  """One depth's figures, in a fresh process (its own compiles, no cache)."""
  run = subprocess.run([sys.executable, "-c", _ONE, str(layers), str(steps), out],
                       capture_output=True, text=True, cwd=REPO, timeout=3600,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  if run.returncode:
    raise RuntimeError(run.stderr[-3000:])
  return json.loads(run.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
  base = rows[0]
  cols = ("wall", "compile", "step_hlo", "sampler_hlo")
  head = "layers | " + " | ".join(f"{c} (x{base['layers']}-layer)" for c in cols)
  lines = [head, "-" * len(head)]
  for r in rows:
    cells = [f"{r[c]:.1f}s" if c in ("wall", "compile") else f"{r[c]:,}" for c in cols]
    lines.append(f"{r['layers']:>6} | " + " | ".join(
        f"{cell} ({r[c] / base[c]:.2f}x)" for cell, c in zip(cells, cols)))
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--layers", default="2,28", help="comma-separated depths")
  p.add_argument("--steps", type=int, default=3)
  a = p.parse_args(argv)
  with tempfile.TemporaryDirectory() as out:
    rows = [measure(int(n), a.steps, out) for n in a.layers.split(",")]
  print(f"load average before: {os.getloadavg()[0]:.2f}")
  print(table(rows))
  return rows


if __name__ == "__main__":
  main()
