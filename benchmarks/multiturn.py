"""Multi-turn rollout throughput: slots kept across turns vs re-prefilling the history.

A random Qwen3-layout model (`--d-model`, `--layers`, vocab 256) runs `--rows` trajectories
of `--turns` turns; each environment step sleeps `--latency-ms` and answers with `--obs`
observation ids. Turn ends are every `--turn-len`-th id of the vocabulary (turns of ~that many
sampled tokens; 16 by default).
Two engines, same model, slots and budgets:
  * kept: `mr_rl.multiturn.rollout.TurnRollout` (a slot keeps its trajectory; observations
    are appended to its cache; environment steps overlap decoding);
  * re-prefill: per turn, every unfinished trajectory's whole history is a new prompt for the
    continuous engine (`mr_rl.sampling.Engine`), then all environment steps run (in parallel
    threads), then the next turn.
Reports sampled tokens/s (after one warm-up run of each, compiles excluded), the kept engine's
slot utilization (busy slot-steps / slot-steps; also over the step calls made while rows were
still queued, and the tail's share of slot-steps), the share of slot-steps paused for
environments, slot-steps paused per environment step and the decode step's time (the step
calls' wall time over their decode steps). `--kept-only` skips the re-prefill engine.

  python benchmarks/multiturn.py --quick
  python benchmarks/multiturn.py --latency-ms 0,50,500 --turns 4,8 --json out.json
  python benchmarks/multiturn.py --kept-only --rows 256 --slots 64 --turns 4 --latency-ms 50 \
      --d-model 512 --layers 4 --turn-len 64 --budget 800   # utilization at 64 slots
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import sys
import time

import jax
import numpy as np

from mr_rl import models
from mr_rl.multiturn import env as env_lib
from mr_rl.multiturn import rollout as mt
from mr_rl.sampling import Engine
from mr_rl.sampling.slots import unpack_report
from mr_rl.tiny_assets import checkpoints

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

VOCAB = 256


def end_ids(turn_len: int) -> tuple[int, ...]:
  """Every `turn_len`-th id: a random model's turns run ~`turn_len` sampled tokens."""
  return tuple(range(7, VOCAB, turn_len))


class LatencyEnv:
  """Sleeps `latency_s` per step; answers with `obs` fixed ids; done after `turns` turns."""

  def __init__(self, turns: int, latency_s: float, obs: int):
    self.turns, self.latency_s, self.obs = turns, latency_s, obs

  def reset(self, example):
    return [{"role": "user", "content": ""}]

  def step(self, turn):
    time.sleep(self.latency_s)
    if turn.index + 1 >= self.turns:
      return env_lib.StepResult(done=True)
    return env_lib.StepResult(messages=[{"role": "tool", "content": "x" * self.obs}])


class IdsRenderer:
  """Observation ids 1, 2, ... (one per content character); turn text unused."""

  def observation_ids(self, messages, max_tokens=None):
    ids = [1 + i % 5 for i in range(len(messages[0]["content"]))]
    return ids[:max_tokens], False

  def turn_text(self, ids):
    return ""


def kept(model, params, prompts, mask, a, key):
  rows = len(prompts)
  ro = mt.TurnRollout(model, slots=a.slots, max_new_tokens=a.budget,
                      end_of_turn_ids=end_ids(a.turn_len), steps_per_call=a.steps_per_call,
                      limits=mt.TurnLimits(a.turns_now, max(a.obs, 1), 60.0), workers=a.slots)
  envs = lambda n: [LatencyEnv(a.turns_now, a.latency_s, a.obs) for _ in range(n)]
  warm = min(rows, a.slots)  # the programs depend on the slots, not on the rows
  ro.run(params, prompts[:warm], mask[:warm], envs(warm), key=key, group_size=1,
         render=IdsRenderer())
  # Each step call's slot-steps, split by whether rows were still queued (fewer rows started,
  # counting the plans' inserts, than there are): the tail (no row left to start) leaves slots
  # free that no scheduling could fill.
  progs, calls, started = ro.programs(a.slots), {True: [0, 0], False: [0, 0]}, [0]
  step = progs.step

  def counted(params_, state, store, plan):
    state, report_ = step(params_, state, store, plan)
    _, _, _, steps, busy = unpack_report(np.asarray(report_), a.slots)
    started[0] += int((plan[:a.slots] >= 0).sum())
    calls[started[0] < rows][0] += steps * a.slots
    calls[started[0] < rows][1] += busy
    return state, report_

  progs.step = counted
  t0 = time.perf_counter()
  trajs = ro.run(params, prompts, mask, envs(rows), key=key, group_size=1, render=IdsRenderer())
  dt = time.perf_counter() - t0
  progs.step = step
  sampled = sum(int(t.policy_mask.sum()) for t in trajs)
  turns = sum(t.turns for t in trajs)
  st = ro.last_stats
  (q_slot_steps, q_busy), (tail_slot_steps, _) = calls[True], calls[False]
  return dict(tokens_per_s=sampled / dt, seconds=dt, sampled=sampled,
              slot_utilization=st.slot_utilization, waiting_share=st.waiting_share,
              utilization_while_queued=q_busy / max(1, q_slot_steps),
              tail_share=tail_slot_steps / max(1, q_slot_steps + tail_slot_steps),
              turns_mean=turns / rows, tokens_per_turn=sampled / turns,
              paused_steps_per_env_step=st.waiting_slot_steps / max(1, st.env_steps),
              decode_step_ms=1e3 * st.decode_time_s / max(1, st.decode_steps),
              steps_per_s=st.decode_steps / dt, wait_s=st.wait_time_s,
              statuses={s: sum(t.status == s for t in trajs) for s in mt.STATUSES})


def reprefill(model, params, prompts, mask, a, key):
  eng = Engine(model, slots=a.slots, max_new_tokens=a.budget, eos_id=end_ids(a.turn_len),
               prompt_buckets=tuple(range(16, 16 + 2 * a.budget + prompts.shape[1] + 16, 16)))
  pool = cf.ThreadPoolExecutor(a.slots)

  def once():
    hist = [list(p[m > 0]) for p, m in zip(prompts, mask)]
    used = [0] * len(hist)
    live = list(range(len(hist)))
    sampled = 0
    for turn in range(a.turns_now):
      if not live:
        break
      width = max(len(hist[n]) for n in live)
      toks = np.zeros((len(live), width), np.int32)
      msk = np.zeros_like(toks)
      for i, n in enumerate(live):
        toks[i, width - len(hist[n]):], msk[i, width - len(hist[n]):] = hist[n], 1
      out = {r.row: r for r in eng.stream(params, toks, msk, key=jax.random.fold_in(key, turn))}
      envs = [LatencyEnv(a.turns_now, a.latency_s, a.obs) for _ in live]
      futs = [pool.submit(e.step, env_lib.Turn("", (), turn)) for e in envs]
      nxt = []
      for i, n in enumerate(live):
        r = out[i]
        hist[n] += r.tokens.tolist()
        used[n] += r.length
        sampled += r.length
        res = futs[i].result()
        if res.done or r.truncated or used[n] + a.obs >= a.budget:
          continue
        hist[n] += IdsRenderer().observation_ids(res.messages)[0]
        used[n] += a.obs
        nxt.append(n)
      live = nxt
    return sampled

  once()  # warm-up
  t0 = time.perf_counter()
  sampled = once()
  dt = time.perf_counter() - t0
  return dict(tokens_per_s=sampled / dt, seconds=dt, sampled=sampled)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--rows", type=int, default=32)
  p.add_argument("--slots", type=int, default=16)
  p.add_argument("--budget", type=int, default=192, help="S: sampled + observation ids")
  p.add_argument("--obs", type=int, default=8)
  p.add_argument("--turns", default="4,8")
  p.add_argument("--latency-ms", default="0,50,500")
  p.add_argument("--d-model", type=int, default=128)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--turn-len", type=int, default=16, help="~sampled tokens per turn")
  p.add_argument("--steps-per-call", type=int, default=8, help="decode steps per step call")
  p.add_argument("--kept-only", action="store_true", help="skip the re-prefill engine")
  p.add_argument("--quick", action="store_true", help="rows 8, slots 4, turns 4, 0 and 50 ms")
  p.add_argument("--json")
  a = p.parse_args()
  if a.quick:
    a.rows, a.slots, a.turns, a.latency_ms, a.budget = 8, 4, "4", "0,50", 96
  cfg = checkpoints.tiny_model_config("qwen3", VOCAB, d_model=a.d_model, n_layers=a.layers)
  model = models.Transformer(cfg)
  params = checkpoints.host_params(model, np.random.default_rng(0))
  rng = np.random.default_rng(1)
  prompts = rng.integers(20, VOCAB, (a.rows, 16)).astype(np.int32)
  mask = np.ones_like(prompts)
  key = jax.random.PRNGKey(0)
  results = []
  for turns in [int(x) for x in a.turns.split(",")]:
    for ms in [float(x) for x in a.latency_ms.split(",")]:
      a.turns_now, a.latency_s = turns, ms / 1000
      load = report.load_avg()
      k = kept(model, params, prompts, mask, a, key)
      row = dict(turns=turns, latency_ms=ms, kept=k, load_avg=load)
      line = (f"turns {turns} latency {ms:4.0f} ms: kept {k['tokens_per_s']:8.1f} tok/s "
              f"(util {k['slot_utilization']:.2f}, while rows queued "
              f"{k['utilization_while_queued']:.2f}, tail {k['tail_share']:.2f} of slot-steps, "
              f"paused {k['waiting_share']:.2f}, paused "
              f"steps/env step {k['paused_steps_per_env_step']:.1f}, step "
              f"{k['decode_step_ms']:.1f} ms, {k['tokens_per_turn']:.1f} tok/turn, turns "
              f"{k['turns_mean']:.1f})")
      if not a.kept_only:
        r = row["reprefill"] = reprefill(model, params, prompts, mask, a, key)
        row["speedup"] = k["tokens_per_s"] / r["tokens_per_s"]
        line += f" re-prefill {r['tokens_per_s']:8.1f} tok/s -> {row['speedup']:.2f}x"
      results.append(row)
      print(f"{line}; load {load[0]}", flush=True)
  report.write_json(dict(args=vars(a), results=results), a.json)


if __name__ == "__main__":
  main()
