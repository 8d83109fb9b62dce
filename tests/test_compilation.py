"""The compile model (mr_rl.compilation, mr_rl.program_plan): a run compiles at most the programs
its settings predict, logs each compile, warms them up before step 0, and a restarted run loads
every program from the persistent cache instead of compiling it."""

import json
import os
import subprocess
import sys
import textwrap

from mr_rl import compilation, program_plan
from mr_rl import settings as settings_lib
from mr_rl import train as train_lib
from mr_rl.demo import warmstart
from mr_rl.testing.runs import arith_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The demo's base policy: its responses vary in length from step to step.
BASE = os.path.join(os.path.dirname(warmstart.__file__), "assets", "base_policy")


def test_a_run_with_varied_lengths_compiles_at_most_the_predicted_programs():
  s = settings_lib.from_config(arith_config(BASE, 8))  # the fine width grid (column_buckets 0)
  log = compilation.compile_log()
  start = len(log)
  lines = []
  res = train_lib.train(s, None, log=lines.append)
  records = log.since(start)
  got, bound = compilation.counts(records), program_plan.expected_programs(s)
  assert set(got) <= set(bound) and all(got[k] <= bound[k] for k in got), (got, bound)
  widths = {h["batch/columns"] for h in res.history}
  assert len(widths) >= 2, widths                            # the lengths did vary
  assert got["policy_step"] == len(widths)                  # one program per width met
  assert sum(h["compile/programs"] > 0 for h in res.history[-1:]) == 1
  assert res.history[-1]["compile/programs"] == len(records)
  assert sum(h["compile/seconds"] for h in res.history) > 0
  assert sum("program policy_step [" in line for line in lines) == len(widths)


def test_paper_configs_predict_a_few_learner_programs():
  """Accelerator configs put the learner on `batch.column_buckets` widths: 4 policy-step
  programs for any response length, where the fine grid could compile hundreds."""
  from mr_rl import config_lib
  c = config_lib.load_config_module(os.path.join(REPO, "configs", "tag_math.py")).get_config("")
  s = settings_lib.from_config(c)
  plan = program_plan.expected_programs(s)
  assert plan["policy_step"] == 4 and plan["logprob_forward"] == 4
  assert plan["sampler"] == len(program_plan.prompt_buckets(s.data.max_prompt_len)) == 7
  c.batch.column_buckets = 0
  assert program_plan.expected_programs(settings_lib.from_config(c))["policy_step"] > 200


_RUN = textwrap.dedent("""
    import json, sys
    from mr_rl import settings as settings_lib, train as train_lib
    from mr_rl.testing.runs import arith_config
    c = arith_config({base!r}, 3)
    c.rollout.engine, c.rollout.slots = "continuous", 8
    c.batch.column_buckets = 2
    c.compile.warmup = True
    lines = []
    train_lib.train(settings_lib.from_config(c), sys.argv[1], log=lines.append)
    print(json.dumps(lines))
""")


def test_warm_up_compiles_every_program_and_a_restart_loads_them_all(tmp_path):
  """With `compile.warmup` the steps compile nothing the warm-up did not (the signal, which
  has no shape to predict, aside); a second process on the same cache compiles nothing."""
  runs = []
  for name in ("first", "restart"):
    out = subprocess.run(
        [sys.executable, "-c", _RUN.format(base=BASE), str(tmp_path / name)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env=dict(os.environ, MR_RL_CACHE=str(tmp_path / "cache"), JAX_PLATFORMS="cpu"))
    assert out.returncode == 0, out.stderr[-3000:]
    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
  first, restart = runs
  warm = next(i for i, line in enumerate(first) if line.startswith("warm-up: compiled"))
  names = {line.split()[1] for line in first[warm:] if " compiled in " in line}
  assert names <= {"signal"}, first[warm:]
  assert {line.split()[1] for line in first[:warm]} >= {"policy_step", "engine_step",
                                                        "engine_prefill", "engine_shrink"}
  loaded = [line for line in restart if line.startswith("program ")]
  assert loaded and all(" loaded from the compilation cache " in line for line in loaded), \
      restart


def test_programs_do_not_grow_with_depth():
  """The layer scan: the policy step's and the sampler's optimized HLO are the same size for 2
  and 28 layers of equal width (the unrolled decoder grew 10.8x and 8.7x)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from mr_rl import models
  from mr_rl.rl import update as update_lib
  from mr_rl.rl.batch import LearnerBatch
  from mr_rl.sampling.sampler import Sampler
  sizes = {}
  for L in (2, 28):
    model = models.Transformer(models.ModelConfig(vocab_size=64, d_model=32, n_layers=L,
                                                  n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                                                  max_seq_len=64))
    params = models.abstract_params(model)
    learner = update_lib.learner(model, update_lib.UpdateConfig())
    state = jax.eval_shape(lambda p: update_lib.init_train_state(p, learner.tx), params)
    i32 = jax.ShapeDtypeStruct((8, 24), jnp.int32)
    f32 = jax.ShapeDtypeStruct((8, 24), jnp.float32)
    batch = LearnerBatch(tokens=i32, mask=i32, response_mask=i32, old_logp=f32,
                         advantages=jax.ShapeDtypeStruct((8,), jnp.float32), response_start=8)
    step = learner.step.lower(state, batch, jax.random.PRNGKey(0)).compile().as_text()
    prompts = np.ones((8, 8), np.int32)
    smp = Sampler(model, max_new_tokens=16).lower(params, prompts, prompts,
                                                  key=jax.random.PRNGKey(0)).compile().as_text()
    sizes[L] = (len(step), len(smp))
  assert sizes[28][0] < 1.1 * sizes[2][0] and sizes[28][1] < 1.1 * sizes[2][1], sizes
