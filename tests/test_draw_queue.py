"""The draw queue and its asynchronous mode (`mr_rl.draw_queue`, issue 26): the bound, the
schedule, s = 0 equal to the synchronous loop, s = 1 resumed bit-exactly, and the sampler /
learner split on 8 fake CPU devices (this file run as a script in a subprocess, XLA_FLAGS set
before jax is imported); the pod timeline model against hand-computed periods.
"""

import collections
import json
import os
import sys

from mr_rl.testing import xla_env

if __name__ == "__main__":
  xla_env.use_cpu_devices(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mr_rl import data  # noqa: E402
from mr_rl import draw_queue  # noqa: E402
from mr_rl import metrics as metrics_lib  # noqa: E402
from mr_rl import settings as settings_lib  # noqa: E402
from mr_rl import train as train_lib  # noqa: E402
from mr_rl import train_step  # noqa: E402
from mr_rl.rewards.runner import RewardFailureError  # noqa: E402
from mr_rl.rl import signal as signal_lib  # noqa: E402
from mr_rl.rl import update as update_lib  # noqa: E402
from mr_rl.testing import runs  # noqa: E402


# ------------------------------------------------------------------ the queue and schedule
def test_a_group_older_than_s_is_never_consumed():
  q = draw_queue.StaleQueue(max_staleness=1)
  for step, version in ((3, 1), (4, 3), (5, 4)):
    q.put(draw_queue.InFlight(step, version, draw=f"draw {step}"))
  with pytest.raises(ValueError, match="submitted after step 5"):
    q.put(draw_queue.InFlight(7, 5, draw="draw 7"))
  with pytest.raises(ValueError, match="for step 3, not 4"):
    q.take(4, 4)
  assert q.take(3, 3) is None and q.dropped == 1  # version 1 at learner 3: 2 > s, dropped
  assert q.take(4, 4).draw == "draw 4"            # 1 update old: consumed
  assert q.take(5, 5).draw == "draw 5"
  assert q.take(6, 6) is None and q.dropped == 1  # nothing in flight


@pytest.mark.parametrize("s", [0, 1, 3])
def test_the_queue_consumes_the_draw_of_version_t_minus_s(s):
  submitted = []

  def draw_fn(u):  # the call that draws step u now, with the policy the queue holds now
    version = draws.policy_params()
    return lambda: submitted.append((u, version)) or {"step": u, "version": version}

  policy = lambda train_state: train_state["version"]  # (the learner's policy of its state)
  with draw_queue.DrawQueue(draw_queue.AsyncSettings(max_staleness=s), policy=policy) as draws:
    with pytest.raises(RuntimeError, match="before any push"):
      draws.policy_params()
    draws.push({"version": 0})
    for step in range(7):
      draws.fill(step, draw_fn)
      assert len(draws.in_flight) == s + 1
      draw, m = draws.take(step, draw_fn), draws.metrics()
      assert draw == {"step": step, "version": max(0, step - s)}
      if s:
        assert m["async/staleness"] == min(step, s) and m["async/stale_dropped"] == 0
      else:
        assert m == {}  # the synchronous loop logs what it always did
      draws.push({"version": step + 1})  # the step's update
  assert [u for u, _ in submitted] == list(range(7 + s))  # in step order, s past the end


def test_staleness_needs_the_lag_correction_and_valid_counts():
  c = runs.arith_config("unused/path", 2)
  c.asynchrony.max_staleness = 1
  with pytest.raises(ValueError, match="max_staleness=1 needs the lag correction.*tis_cap"):
    settings_lib.from_config(c)
  c.asynchrony.max_staleness = -1
  with pytest.raises(ValueError, match="asynchrony.max_staleness"):
    settings_lib.from_config(c)
  with pytest.raises(ValueError, match="sampler_devices=1 must leave devices"):
    draw_queue.split_devices(jax.devices()[:1], 1)


def test_split_gives_each_process_the_same_share_of_its_devices():
  # 2 processes x 4 devices (as jax lists them: process by process): each process gives its
  # first sampler_devices / 2 to the sampler, so both sides span both processes.
  Device = collections.namedtuple("Device", "id process_index")
  devices = [Device(p * 1024 + i, p) for p in range(2) for i in range(4)]
  sampler, learner = draw_queue.split_devices(devices, 4)
  assert [(d.process_index, d.id % 1024) for d in sampler] == [(0, 0), (0, 1), (1, 0), (1, 1)]
  assert [(d.process_index, d.id % 1024) for d in learner] == [(0, 2), (0, 3), (1, 2), (1, 3)]
  sampler, learner = draw_queue.split_devices(devices, 2)
  assert [d.process_index for d in sampler] == [0, 1] and len(learner) == 6
  with pytest.raises(ValueError, match="multiple of the process count 2"):
    draw_queue.split_devices(devices, 3)
  with pytest.raises(ValueError, match="must leave devices.*4 per process"):
    draw_queue.split_devices(devices, 8)


# --------------------------------------------------------------------- the timeline model
def test_timeline_model_against_hand_computed_steps():
  t = draw_queue.StepTimes(rollout=1.0, score=2.0, update=1.5, push=0.25)
  period = lambda *a, **k: 1.0 / draw_queue.timeline(t, 8, *a, **k)
  # one device set: s = 0 adds everything; s >= 1 hides the scoring tail behind the next
  # rollout + update (2.5 s > 2 s of scoring)
  assert period() == pytest.approx(1.0 + 2.0 + 1.5)
  assert period(max_staleness=1) == period(max_staleness=3) == pytest.approx(2.5)
  # scoring longer than rollout + update bounds the step: 4 s
  assert 1.0 / draw_queue.timeline(draw_queue.StepTimes(1.0, 4.0, 1.5), 8, max_staleness=1) == \
      pytest.approx(4.0)
  # 4 + 4 of 8 devices: rollout 2 s, update 3 s; s = 0 in series, s = 1 the longer side
  assert period(4) == pytest.approx(2.0 + 2.0 + 3.0 + 0.25)
  assert period(4, max_staleness=1) == pytest.approx(max(2.0 + 2.0, 3.0 + 0.25))
  # 2 samplers: rollout 4 s + 2 s of scoring against update 1.5 x 8 / 6 = 2 s + push
  assert period(2, max_staleness=1) == pytest.approx(6.0)
  with pytest.raises(ValueError, match="sampler_devices=8"):
    draw_queue.timeline(t, 8, 8)


# ------------------------------------------------------------------------ the trainer
@pytest.fixture(scope="module")
def policy(tmp_path_factory):
  """A random policy: its responses vary in length, so the length rewards teach."""
  return runs.write_random_policy(str(tmp_path_factory.mktemp("policy")))


def _reference_synchronous_loop(s, comp, steps):
  """The loop of `mr_rl.train.train` before issue 26, written out: each step draws with the
  policy of that step, then signal -> batch -> update. Returns (params, aggregator state)."""
  assert s.update.loss.kl_coef == 0 and s.dynamic.mode == "off"
  agg, signal = signal_lib.signal_fn(s.aggregator.name, s.aggregator.hp, s.advantage,
                                     s.advantage_hp)
  learner = update_lib.learner(comp.model, s.update, comp.mesh, False)
  root = jax.random.PRNGKey(s.seed)
  st = learner.init(comp.base_params, jax.random.fold_in(root, 2**30))
  agg_state = jax.device_get(agg.init(s.num_channels))
  it = data.ResumableIterator(list(comp.train_examples), s.data.batch_prompts, seed=s.seed)
  for step in range(steps):
    k_roll, k_agg, k_upd = jax.random.split(jax.random.fold_in(root, step), 3)
    draw = train_step.draw_groups(comp, st.params, agg_state, it, signal, k_roll, k_agg)
    sig = signal(agg_state, jnp.asarray(draw.r_BGK), k_agg)
    agg_state = jax.device_get(sig.agg_state)
    batch = train_step.learner_batch(s, draw, sig, learner, st, None,
                                     s.update.num_micro_batches)
    st, _ = learner.update(st, learner.place_batch(batch), k_upd, comp.base_params)
  return st.params, agg_state


def _assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _trees_differ(a, b) -> bool:
  return any(not np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _async_config(policy, steps, staleness):
  c = runs.length_config(policy, steps)
  c.aggregator.name = "amrp"  # stateful: its state advances in the order groups are consumed
  c.checkpoint_every = 3
  c.optim.loss.tis_cap = 2.0
  c.asynchrony.max_staleness = staleness
  return c


def test_s0_is_the_synchronous_loop_and_s1_trains_on_stale_groups(policy):
  s0 = settings_lib.from_config(_async_config(policy, 3, 0))
  comp = train_lib.build(s0)
  sync = train_lib.train(s0, None, comp=comp, log=None)
  params, agg_state = _reference_synchronous_loop(s0, comp, 3)
  _assert_trees_equal(sync.params, params)  # bit-exact, AMRP's state too
  _assert_trees_equal(sync.aggregator_state, agg_state)
  assert not any(k.startswith("async/") for k in sync.history[-1])
  s1 = settings_lib.from_config(_async_config(policy, 3, 1))
  stale = train_lib.train(s1, None, comp=comp, log=None)
  assert [h["async/staleness"] for h in stale.history] == [0.0, 1.0, 1.0]
  # Step 0 is the same draw from the same policy; step 1 learns from version 0's groups.
  assert stale.history[0]["loss/policy"] == sync.history[0]["loss/policy"]
  assert _trees_differ(stale.params, sync.params)
  assert all(h["time/reward_wait"] >= 0 and h["time/weight_push"] == 0 for h in stale.history)


def test_s1_resume_reproduces_the_uninterrupted_run(policy, tmp_path):
  s3 = settings_lib.from_config(_async_config(policy, 3, 1))
  s6 = settings_lib.from_config(_async_config(policy, 6, 1))
  comp = train_lib.build(s6)
  resumed, straight = str(tmp_path / "resumed"), str(tmp_path / "straight")
  train_lib.train(s3, resumed, comp=comp, log=None)
  # The draw of step 3 (sampled by version 2) went to disk with the checkpoint of step 3.
  assert os.listdir(os.path.join(resumed, "inflight")) == ["3.p0.pkl"]
  res = train_lib.train(s6, resumed, comp=comp, log=None)
  assert [h["step"] for h in res.history] == [3, 4, 5]
  train_lib.train(s6, straight, comp=comp, log=None)
  a = metrics_lib.read_jsonl(os.path.join(resumed, "metrics.jsonl"))
  b = metrics_lib.read_jsonl(os.path.join(straight, "metrics.jsonl"))
  runs.assert_same_metrics(a, b)
  assert [h["async/staleness"] for h in a] == [0.0] + [1.0] * 5
  assert sorted(os.listdir(os.path.join(straight, "inflight"))) == ["3.p0.pkl", "6.p0.pkl"]
  os.remove(os.path.join(resumed, "inflight", "6.p0.pkl"))
  s7 = settings_lib.from_config(_async_config(policy, 7, 1))
  with pytest.raises(FileNotFoundError, match="no draws in flight"):
    train_lib.train(s7, resumed, comp=comp, log=None)


def test_guards_and_dynamic_sampling_keep_their_meaning_at_s1(policy, tmp_path, monkeypatch):
  # A channel that always fails trips the failure guard (patience 2) while the same step's
  # groups are taken, at s = 1 as at s = 0: the guard counts consumed batches in order.
  (tmp_path / "broken_rewards.py").write_text(
      "def broken(response, example, num_tokens):\n  raise ValueError('no')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path),
                                                    os.environ.get("PYTHONPATH", "")]))
  steps_logged = {}
  for staleness in (0, 1):
    c = _async_config(policy, 4, staleness)
    c.rewards.channels = "arith_len,arith_brief,broken_rewards:broken"
    c.rewards.params.broken = dict(on_failure=0.0)
    c.rewards.failure_patience = 2
    c.log_every = 1
    lines = []
    with pytest.raises(RewardFailureError, match="broken"):
      train_lib.train(settings_lib.from_config(c), None, log=lines.append)
    steps_logged[staleness] = sum(line.startswith("step ") for line in lines)  # not compiles
  assert steps_logged == {0: 1, 1: 1}
  # Dynamic sampling draws its rounds when the draw is submitted (the aggregator state of
  # then decides a scalar signal) and still fills the batch with groups that carry a signal.
  c = _async_config(policy, 3, 1)
  c.dynamic.mode = "refill"
  res = train_lib.train(settings_lib.from_config(c), None, log=None)
  assert [h["async/staleness"] for h in res.history] == [0.0, 1.0, 1.0]
  assert all(0 < h["dynamic/kept_frac"] <= 1 for h in res.history)


# ------------------------------------------------- sampler and learner on disjoint devices
def _split_worker(policy_path: str) -> dict:
  """In the 8-device process: a split run (4 sampler + 4 learner devices) at s = 0 and at
  s = 1, a shared-device run at s = 0, a push of weights across the split, and PPO and LoRA
  runs shared against split."""
  out = {}
  for name, split, staleness in (("shared", 0, 0), ("split", 4, 0), ("split_s1", 4, 1)):
    c = runs.length_config(policy_path, 3)
    c.optim.loss.tis_cap = 2.0
    c.asynchrony.max_staleness, c.asynchrony.sampler_devices = staleness, split
    s = settings_lib.from_config(c)
    comp = train_lib.build(s)
    res = train_lib.train(s, None, comp=comp, log=None)
    out[name] = res.history
    if split:
      sampler = {d.id for d in comp.policy.mesh.devices.flat}
      learner = {d.id for d in comp.mesh.devices.flat}
      out["disjoint"] = not sampler & learner and len(sampler | learner) == 8
      on = lambda tree, devices: all({d.id for d in x.sharding.device_set} <= devices
                                     for x in jax.tree.leaves(tree))
      out["base_on_learner"] = on(comp.base_params, learner)
      out["result_on_sampler"] = on(res.params, sampler)  # the last push
      draws = draw_queue.DrawQueue.for_run(s.asynchrony, comp.model, comp.policy.mesh, comp.mesh)
      draws.push(comp.base_params)
      pushed = draws.policy_params()
      out["pushed_on_sampler"] = on(pushed, sampler)
      out["pushed_equal"] = not _trees_differ(pushed, comp.base_params)
      draws.close()
  # PPO (the critic stays with the learner) and LoRA (pushed merged), shared against split.
  for kind in ("ppo", "lora"):
    for split in (0, 4):
      c = runs.length_config(policy_path, 2)
      c.asynchrony.sampler_devices = split
      if kind == "ppo":
        c.advantage.name = "ppo"
      else:
        c.model.lora.rank, c.model.lora.alpha = 4, 8.0
        c.optim.lr = 1e-2  # adapters start at b = 0: move them within 2 steps
      res = train_lib.train(settings_lib.from_config(c), None, log=None)
      out[f"{kind}_{'split' if split else 'shared'}"] = res.history
  return out


def test_sampler_and_learner_on_disjoint_devices(policy):
  res = xla_env.run_worker(__file__, policy, timeout=900)
  assert res["disjoint"] and res["base_on_learner"] and res["result_on_sampler"]
  assert res["pushed_on_sampler"] and res["pushed_equal"]
  shared, split, split1 = res["shared"], res["split"], res["split_s1"]
  for x, y in zip(shared, split):  # the same run, sampled on 4 devices with pushed weights
    for k in ("reward/arith_len/mean", "reward/scalar/mean", "response/length_mean"):
      assert x[k] == y[k], (x["step"], k, x[k], y[k])
    np.testing.assert_allclose(x["loss/policy"], y["loss/policy"], rtol=1e-4, atol=1e-6)
  assert all(h["time/weight_push"] > 0 for h in split + split1)
  assert [h["async/staleness"] for h in split1] == [0.0, 1.0, 1.0]
  assert all(np.isfinite(h["loss/policy"]) for h in split1)
  for kind in ("ppo", "lora"):  # the same runs with the sampler on devices of its own
    shared, split = res[f"{kind}_shared"], res[f"{kind}_split"]
    for x, y in zip(shared, split):
      for k in ("reward/arith_len/mean", "response/length_mean"):
        assert x[k] == y[k], (kind, x["step"], k, x[k], y[k])
      np.testing.assert_allclose(x["loss/policy"], y["loss/policy"], rtol=1e-4, atol=1e-6)
    assert all(h["time/weight_push"] > 0 for h in split)


if __name__ == "__main__":
  print(json.dumps(_split_worker(sys.argv[1])))
