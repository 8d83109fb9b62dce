"""One process of a multi-process test job (tests/test_multihost.py), or the one-process
reference: runs a list of scenarios on the CPU devices it is given and writes what it saw.

    python tests/multihost_worker.py OUT_DIR BASE_POLICY NUM_PROCESSES PROCESS_ID PORT SCENARIOS

XLA_FLAGS (the device count) and JAX_PLATFORMS=cpu are set by the caller. Every process
writes OUT_DIR/<scenario>/result-<process id>.json (its histories and evaluations), so the
test can check that all processes agree and that N processes equal one.
"""

import json
import os
import sys


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(base_policy, total_steps, **kw):
  from mr_rl.testing.runs import arith_config
  c = arith_config(base_policy, total_steps, aggregator=kw.pop("aggregator", "amrp"))
  # Length-based channels (and format): a barely trained policy's responses vary in length, so
  # rewards, advantages and dynamic sampling's decisions are not all zero.
  c.rewards.channels = "arith_len,arith_brief,arith_fmt"
  c.rewards.params.arith_len = dict(full_until=8, zero_at=24)
  c.rewards.params.arith_brief = dict(threshold=14)
  c.mesh.data, c.mesh.fsdp = 4, 2     # 8 devices: rows over data x fsdp, params over fsdp
  c.data.batch_prompts = 4            # 16 rows: 2 per device
  c.optim.num_micro_batches = 2
  c.kl_ref_every = 1
  c.eval.num_prompts = 4
  c.eval.samples_per_prompt = 2
  c.eval.temperature = 1.0
  for k, v in kw.items():
    section, _, field = k.rpartition(".")
    (c[section] if section else c)[field] = v
  return c


def run(scenario: str, base_policy: str, out: str) -> dict:
  import jax
  from mr_rl import pipelines, settings as settings_lib
  from mr_rl import rollout as rollout_lib
  from mr_rl import train as train_lib
  from mr_rl import metrics as metrics_lib
  wd = os.path.join(out, "workdir")
  if scenario == "train_resume":
    # 2 steps, stop; the same command with 3 steps resumes, exports WORKDIR/hf
    # (`export.hf_at_end`) and runs the final evaluation. Rollouts on the continuous engine
    # (16 rows streamed through 8 slots); after the run, one more rollout of the trained
    # policy records its tokens and rewards row by row.
    c = _config(base_policy, 2, checkpoint_every=1, **{
        "rollout.engine": "continuous", "rollout.slots": 8, "export.hf_at_end": True})
    s = settings_lib.from_config(c)
    comp = train_lib.build(s)
    train_lib.train(s, wd, comp=comp, log=None)
    c.total_steps = 3
    s = settings_lib.from_config(c)
    hf_writes = _watch_writes(os.path.join(wd, "hf"))
    res, ev = pipelines.run_train(s, wd, comp=comp)
    hf_writes = hf_writes()
    examples = comp.eval_examples[:4]
    ro = rollout_lib.rollout(comp.policy, res.params, examples, jax.random.PRNGKey(11), s.rollout)
    r_BGK, _ = rollout_lib.score(comp.runner, ro, examples)
    history = metrics_lib.read_jsonl(os.path.join(wd, "metrics.jsonl")) \
        if os.path.exists(os.path.join(wd, "metrics.jsonl")) else None
    return {"history": history, "eval": ev, "hf_writes": hf_writes,
            "rollout": {"tokens": ro.tokens.tolist(), "lengths": ro.lengths.tolist(),
                        "logprobs": ro.logprobs.tolist(), "rewards": r_BGK.tolist()}}
  if scenario == "dynamic":
    c = _config(base_policy, 2, aggregator="additive", **{
        "dynamic.mode": "refill", "dynamic.max_rounds": 2,
        "checkpoint_every": 0})
    res = train_lib.train(settings_lib.from_config(c), None, log=None)
    return {"history": res.history}
  if scenario == "ppo":
    # PPO with a KL penalty; one channel is a reward model (a tiny ArmoRM stand-in) sharded
    # over each process's own devices (`mesh`): 4 of them with 2 processes, 8 with one.
    from mr_rl.tiny_assets import tiny_reward_model
    c = _config(base_policy, 2, **{"advantage.name": "ppo", "checkpoint_every": 0,
                                   "optim.loss.kl_coef": 0.01, "rewards.timeout_s": 300.0})
    c.rewards.channels = "arith_len,arith_brief,reward_model"
    c.rewards.params.reward_model = dict(objective="helpsteer-helpfulness",
                                         path=tiny_reward_model(), mesh={"fsdp": -1},
                                         on_failure=-100.0)  # raw scores: no floor
    res = train_lib.train(settings_lib.from_config(c), None, log=None)
    return {"history": res.history}
  if scenario == "demo_smoke":
    # The demo's smoke variant: TAG (probes, drift, election, training) and additive on the
    # `negative` task, then the report (written by process 0; every process returns it).
    from mr_rl.config_lib.args import load_config_module
    c = load_config_module(os.path.join(REPO, "configs", "demo.py")).get_config("smoke")
    c.mesh.data, c.mesh.fsdp = 4, 2
    c.anchor.samples_per_prompt = 2   # the drift's 4 prompts x 2 rows split over 8 devices
    report = pipelines.run(c, wd)
    return {"report": report}
  if scenario == "async":
    # asynchrony.max_staleness = 1 on one device set (issue 26): the draw of step t + 1 sampled on
    # the continuous engine before step t's update, its scoring waited for on the worker thread
    # while the main thread updates; 2 steps (staleness 0 then 1). Then the same at s = 1 with
    # the sampler and the learner on disjoint devices (`asynchrony.sampler_devices = 4`: 2 of each
    # process's 4 devices; the learner's 4 as data 2 x fsdp 2), the weights pushed after each
    # update; its result is read on the sampler's devices.
    import numpy as np
    c = _config(base_policy, 2, checkpoint_every=0, **{
        "rollout.engine": "continuous", "rollout.slots": 8, "asynchrony.max_staleness": 1,
        "optim.loss.tis_cap": 2.0})
    res = train_lib.train(settings_lib.from_config(c), None, log=None)
    c = _config(base_policy, 2, checkpoint_every=0, **{
        "asynchrony.max_staleness": 1, "asynchrony.sampler_devices": 4, "optim.loss.tis_cap": 2.0})
    c.mesh.data, c.mesh.fsdp = 2, 2
    s = settings_lib.from_config(c)
    comp = train_lib.build(s)
    split = train_lib.train(s, None, comp=comp, log=None)
    from mr_rl import distributed
    sampler = [d for d in comp.policy.mesh.devices.flat]
    learner = [d for d in comp.mesh.devices.flat]
    params = {"/".join(str(k) for k in path): float(np.asarray(
        distributed.to_host(x), np.float64).sum())
        for path, x in jax.tree_util.tree_leaves_with_path(split.params)}
    return {"history": res.history, "split_history": split.history, "split_params": params,
            "split_devices": {"sampler": sorted((d.process_index, d.id) for d in sampler),
                              "learner": sorted((d.process_index, d.id) for d in learner),
                              "result_on": sorted({d.id for x in jax.tree.leaves(split.params)
                                                   for d in x.sharding.device_set})}}
  if scenario == "fail_one":
    # A reward that raises on process 1 only: every process must stop, not hang.
    c = _config(base_policy, 2, checkpoint_every=0)
    c.rewards.channels = "arith_len,multihost_worker:fails_on_process_1"
    c.rewards.params = {"arith_len": dict(full_until=8, zero_at=24),
                        "fails_on_process_1": dict(on_failure=0.0)}
    train_lib.train(settings_lib.from_config(c), None, log=None)
    return {}
  if scenario == "stream":
    # One rollout on the continuous engine (16 rows through 8 slots over the 8 devices), scored
    # as rows finish and after the rollout: which rows this process scored, and the rewards.
    import jax
    import numpy as np
    from mr_rl import rollout as rollout_lib
    from mr_rl.rewards import runner as rr
    c = _config(base_policy, 1, **{"rollout.engine": "continuous", "rollout.slots": 8,
                                   "rollout.max_new_tokens": 12})
    s = settings_lib.from_config(c)
    comp = train_lib.build(s)
    examples = list(comp.train_examples[:s.data.batch_prompts])
    key = jax.random.PRNGKey(5)
    runner = lambda: rr.RewardRunner([rr.RewardChannel("calls", counted_length, on_failure=0.0),
                                      rr.get_reward("arith_fmt")], timeout_s=60)
    CALLS.clear()
    ro = rollout_lib.rollout(comp.policy, comp.base_params, examples, key, s.rollout)
    r_after, m_after = rollout_lib.score(runner(), ro, examples)
    after_calls = sorted(CALLS)
    CALLS.clear()
    scoring = rollout_lib.StreamingScore(runner(), comp.policy, examples, s.rollout.group_size)
    ro2 = rollout_lib.rollout(comp.policy, comp.base_params, examples, key, s.rollout,
                              on_row=scoring)
    r_stream, m_stream = scoring.finish(ro2)
    assert np.array_equal(ro.tokens, ro2.tokens) and ro.texts == ro2.texts
    drop = lambda m: {k: v for k, v in m.items() if k != "rewards/seconds"}
    owned_calls = sorted([examples[b].uid, ro.texts[b][g]] for b, g in zip(*np.nonzero(
        scoring.owned)))
    return {"owned": scoring.owned.tolist(), "owned_calls": owned_calls, "after_calls": after_calls,
            "stream_calls": sorted(CALLS), "r_after": r_after.tolist(),
            "r_stream": r_stream.tolist(), "m_after": drop(m_after), "m_stream": drop(m_stream)}
  raise ValueError(f"unknown scenario {scenario!r}")


def _watch_writes(directory: str):
  """Starts recording the files this process creates, changes or removes under `directory` or
  a sibling `directory.*` (where an export is staged, `mr_rl.staged_dir`), with Python's audit
  events and the safetensors writer, whose file I/O is native code; returns a function that
  stops recording and gives the paths (relative to `directory` or that sibling)."""
  from mr_rl.models import hf_io
  root, seen, active = os.path.realpath(directory), [], [True]
  parent, name = os.path.split(root)

  def note(path):
    path = os.path.realpath(os.fsdecode(path))
    head, _, rest = os.path.relpath(path, parent).partition(os.sep)
    if active[0] and (head == name or head.startswith(name + ".")):
      seen.append(rest or head)

  def hook(event, args):
    paths = ()
    if event == "open":  # (path, mode str or None, flags)
      mode, flags = args[1] if isinstance(args[1], str) else "", args[2] or 0
      if any(m in mode for m in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
        paths = args[:1]
    elif event in ("os.remove", "os.mkdir", "os.chmod", "os.truncate", "os.utime"):
      paths = args[:1]
    elif event in ("os.rename", "shutil.copyfile", "os.link", "os.symlink"):
      paths = args[:2] if event == "os.rename" else args[1:2]
    for path in paths:
      if isinstance(path, (str, bytes, os.PathLike)):
        note(path)

  sys.addaudithook(hook)
  save_file = hf_io.save_file

  def recording_save_file(tensors, filename, *a, **kw):
    note(filename)
    return save_file(tensors, filename, *a, **kw)

  hf_io.save_file = recording_save_file

  def stop():
    active[0] = False
    hf_io.save_file = save_file
    return sorted(set(seen))

  return stop


CALLS: list = []  # (uid, response) of each "calls" reward evaluated in this process


def counted_length(response, example, num_tokens):
  """A reward that records where it ran (the "stream" scenario)."""
  CALLS.append([example["uid"], response])
  return float(num_tokens)


def fails_on_process_1(response, example, num_tokens):
  """A reward function that breaks the run on process 1 (a set-up error, not a response's)."""
  import jax
  from mr_rl.rewards.channels import RewardConfigError
  if jax.process_index() == 1:
    raise RewardConfigError("this reward cannot run on process 1")
  return 1.0


def main():
  out, base_policy, n, pid, port, scenarios = sys.argv[1:7]
  n, pid = int(n), int(pid)
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for fails_on_process_1
  if n > 1:
    from mr_rl import distributed
    distributed.initialize(f"127.0.0.1:{port}", n, pid)
  import jax
  for scenario in scenarios.split(","):
    d = os.path.join(out, scenario)
    os.makedirs(d, exist_ok=True)
    result = run(scenario, base_policy, d)
    result["devices"] = jax.device_count()
    with open(os.path.join(d, f"result-{pid}.json"), "w") as f:
      json.dump(result, f, default=float)
    print(f"[worker {pid}] {scenario} done", flush=True)


if __name__ == "__main__":
  main()
