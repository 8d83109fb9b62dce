"""Multi-turn training through the trainer (`config.multiturn`, `mr_rl.multiturn.draw`):
a run with the demo's calculator environment trains on the policy's tokens and resumes
bit-exactly; environment channels follow the reward rules; what a tool writes never pays.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from mr_rl import metrics as metrics_lib
from mr_rl import settings as settings_lib
from mr_rl import train as train_lib
from mr_rl.demo import calculator, task
from mr_rl.errors import ConfigError
from mr_rl.multiturn import channels as mt_channels
from mr_rl.multiturn import trajectories
from mr_rl.multiturn.rollout import Trajectory
from mr_rl.rewards import runner as runner_lib
from mr_rl.testing.runs import arith_config, assert_same_metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLICY = os.path.join(os.path.dirname(task.__file__), "assets", "calculator_policy")
CHANNELS = "arith_acc,tool_success,arith_brief"


def _config(total_steps: int, **multiturn):
  c = arith_config(POLICY, total_steps, aggregator="amrp")
  c.data.max_prompt_len = 18
  c.rollout.max_new_tokens = 40
  c.rewards.channels = CHANNELS
  c.multiturn.env = "mr_rl.demo.calculator:make_env"
  c.multiturn.renderer = "mr_rl.demo.calculator:renderer"
  c.multiturn.tool_format = "plain"
  c.multiturn.max_turns = 3
  c.multiturn.max_observation_tokens = 8
  for k, v in multiturn.items():
    c.multiturn[k] = v
  return c


def test_a_multiturn_run_trains_and_resumes_bit_exactly(tmp_path):
  s2, s4 = (settings_lib.from_config(_config(n)) for n in (2, 4))
  comp = train_lib.build(s4)
  assert comp.turns is not None and comp.runner.names == ("arith_acc", "arith_brief")
  resumed, straight = str(tmp_path / "resumed"), str(tmp_path / "straight")
  train_lib.train(dataclasses.replace(s2, checkpoint_every=2), resumed, comp=comp, log=None)
  res = train_lib.train(s4, resumed, comp=comp, log=None)
  assert [h["step"] for h in res.history] == [2, 3]
  train_lib.train(s4, straight, comp=comp, log=None)
  a = metrics_lib.read_jsonl(os.path.join(resumed, "metrics.jsonl"))
  b = metrics_lib.read_jsonl(os.path.join(straight, "metrics.jsonl"))
  assert len(a) == 4
  assert_same_metrics(a, b)
  m = a[-1]
  for k in ("reward/tool_success/mean", "weights/tool_success", "multiturn/turns_mean",
            "multiturn/tool_calls", "multiturn/observation_token_share",
            "multiturn/slot_utilization", "loss/policy"):
    assert k in m, k
  assert all(h["multiturn/token_mismatches"] == 0 for h in a)
  assert any(h["multiturn/tool_calls"] > 0 for h in a)  # the base policy's `</r>` calls
  assert np.isfinite([h["reward/tool_success/mean"] for h in a]).all()


def test_per_turn_credit_puts_turn_advantages_in_the_batch(monkeypatch):
  """With multiturn.per_turn_credit the trainer hands make_batch the per-token advantages of
  `credit.per_turn_advantages` (whose values and batch layout tests/multiturn/test_collect.py
  checks) over the trajectories it drew, weighted 1 per environment channel by default."""
  from mr_rl import train_step
  from mr_rl.multiturn import credit
  s = settings_lib.from_config(_config(1, per_turn_credit=True))
  assert credit.turn_weights(s) == {"tool_success": 1.0}
  made, given = [], []
  real_credit, real_batch = credit.per_turn_advantages, train_step.batch_lib.make_batch

  def spy_credit(trajs, A_BG, weights, **kw):
    made.append((len(trajs), np.asarray(A_BG), weights, real_credit(trajs, A_BG, weights, **kw)))
    return made[-1][-1]

  def spy_batch(ro, advantages_BG=None, **kw):
    given.append(advantages_BG)
    return real_batch(ro, advantages_BG, **kw)

  monkeypatch.setattr(credit, "per_turn_advantages", spy_credit)
  monkeypatch.setattr(train_step.batch_lib, "make_batch", spy_batch)
  res = train_lib.train(s, None, log=None)
  assert len(res.history) == 1 and len(made) == 1
  n, A_BG, weights, A_BGS = made[0]
  assert n == s.rows and A_BG.shape == (4, 4) and weights == {"tool_success": 1.0}
  assert A_BGS.shape == (4, 4, s.rollout.max_new_tokens)
  assert given[0] is A_BGS


def test_a_multiturn_run_compiles_the_turn_programs_it_predicts():
  """The draws run on the turn programs (`draw.TURN_PROGRAMS`), each compiled at most as often
  as `program_plan.expected_programs` says, and no sampler or shrink."""
  from mr_rl import compilation, program_plan
  s = settings_lib.from_config(_config(1))
  log = compilation.compile_log()
  start = len(log)
  train_lib.train(s, None, log=None)
  got, bound = compilation.counts(log.since(start)), program_plan.expected_programs(s)
  assert set(got) <= {n for n, c in bound.items() if c}, (got, bound)
  assert all(got[k] <= bound[k] for k in got), (got, bound)
  assert {"engine_prefill", "engine_step", "engine_append"} <= set(got), got
  assert not bound.get("sampler") and not bound.get("engine_shrink"), bound


def test_multiturn_evaluation_scores_every_channel():
  from mr_rl import evaluation
  s = settings_lib.from_config(_config(1))
  s = dataclasses.replace(s, eval=dataclasses.replace(s.eval, num_prompts=4,
                                                      samples_per_prompt=2))
  comp = train_lib.build(s)
  ev = evaluation.final_eval(comp.policy, comp.runner, s, comp.eval_data, comp.base_params,
                             turns=comp.turns)
  for name in CHANNELS.split(","):
    assert 0.0 <= ev[f"eval/{name}"] <= 1.0
  assert "eval/arith_acc&tool_success" in ev and ev["eval/length_mean"] > 0


@pytest.mark.parametrize("change,needle", [
    (dict(env=""), "scored from an environment's step rewards"),            # no multiturn
    (dict(channels="tool_success"), "needs at least one text channel"),
    (dict(advantage="ppo"), "advantage.name=ppo"),
    (dict(dynamic="refill"), "dynamic.mode"),
    (dict(warmup=True), "compile.warmup"),
    (dict(plain_close="</a></r>"), "must be one token"),
    (dict(turn_weights={"arith_acc": 1.0}), "not environment channels"),
])
def test_multiturn_settings_refuse_what_they_do_not_support(change, needle):
  c = _config(1)
  if "env" in change:
    c.multiturn.env = ""
  if "channels" in change:
    c.rewards.channels = change["channels"]
  if "advantage" in change:
    c.advantage.name = "ppo"
  if "dynamic" in change:
    c.dynamic.mode = "refill"
  if "turn_weights" in change:
    c.multiturn.turn_weights = change["turn_weights"]
  if "warmup" in change:
    c.compile.warmup = True
  if "plain_close" in change:
    c.multiturn.plain_close = change["plain_close"]
    with pytest.raises(ValueError, match=needle):
      train_lib.build(settings_lib.from_config(c))
    return
  with pytest.raises((ConfigError, ValueError), match=needle):
    settings_lib.from_config(c)


def test_the_reward_runner_refuses_environment_channels():
  with pytest.raises(ValueError, match="need config.multiturn"):
    runner_lib.RewardRunner(["arith_acc", "tool_success"])


def test_environment_channels_reduce_reports_and_never_give_nan():
  mean = mt_channels.EnvironmentChannel("c", value_range=(0.0, 1.0))
  assert mean.score([1.0, 0.0, 1.0], failed=False) == pytest.approx(2 / 3)
  assert mean.score([], failed=False) == 0.0            # never reported: the floor, not NaN
  assert mean.score([1.0], failed=True) == 0.0          # a failed environment: on_failure
  assert mean.score([float("nan")], failed=False) == 0.0  # outside its range: a failure
  total = mt_channels.EnvironmentChannel("c", reduce="sum", value_range=(0.0, 2.0), missing=1.0)
  assert total.score([1.0, 1.0], False) == 2.0 and total.score([], False) == 1.0
  assert total.score([1.0, 1.0, 1.0], False) == 0.0     # 3 is past hi = 2: a failure
  last = mt_channels.EnvironmentChannel("c", reduce="last", on_failure=-1.0)
  assert last.score([0.2, 0.7], False) == 0.7
  with pytest.raises(ValueError, match="reduce"):
    mt_channels.EnvironmentChannel("c", reduce="max", value_range=(0.0, 1.0))
  with pytest.raises(ValueError, match="missing"):
    mt_channels.EnvironmentChannel("c", value_range=(0.0, 1.0), missing=2.0)
  # tool_success is a mean over calls: calling more often is not paid more.
  ts = runner_lib.get_reward("tool_success")
  assert ts.score([1.0], False) == ts.score([1.0, 1.0, 1.0], False) == 1.0


def test_an_observation_holding_the_answer_does_not_pay_the_policy():
  """The attack: call a tool whose observation holds the answer (`<a>6</a>`: an environment
  that hints, or echoes a retrieved solution) and stop. On the trajectory's whole text the
  accuracy rule finds that block; rewards see only what the policy wrote, so it earns
  nothing, and its token count leaves the observation out."""
  tok = task.make_tokenizer()
  problem = task.Problem((7, 5, 9, 3), ("+", "-", "+"))
  call = tok.encode("<r>7+5-9+3</r>", add_special_tokens=False)
  hint = tok.encode("<a>6</a>", add_special_tokens=False)
  ids = call + hint + [tok.eos_token_id]
  mask = [1] * len(call) + [0] * len(hint) + [1]
  t = Trajectory(row=0, tokens=np.array(ids, np.int32), policy_mask=np.array(mask, np.int32))
  full = tok.decode(ids, skip_special_tokens=False)
  assert task.accuracy(full, problem.answer) == 1.0  # the attack is real on the whole text
  text, count = trajectories.policy_text(calculator.renderer(tok), t)
  assert "<a>" not in text and count == len(call) + 1
  assert task.accuracy(text, problem.answer) == 0.0


def test_tool_prompts_are_the_templated_turns_with_the_tools_schemas(tmp_path):
  """With `multiturn.tools` and the chat template (configs/math_tools.py): the environments
  get the data template's turns (the \\boxed{} request), the template gets the tools' schemas,
  the start-up length check reads that rendering, and prompts pad to data.max_prompt_len (a
  longer one is an error naming it)."""
  from mr_rl import config_lib, models, rollout
  from mr_rl.data import templates
  from mr_rl.data.example import Example
  from mr_rl.multiturn import builtin_tools, collect, draw, tools
  from mr_rl.tiny_assets import tokenizer as tiny_tokenizer
  c = config_lib.load_config_module(
      os.path.join(REPO, "configs", "math_tools.py")).get_config("runlocal")
  s = settings_lib.from_config(c)
  tok = tiny_tokenizer.make_tokenizer(str(tmp_path), "qwen3", vocab_size=1024)
  policy = rollout.Policy(models.Transformer(models.get_preset("tiny_qwen3")), tok,
                          lambda ex: "", s.data.max_prompt_len, add_bos=True)
  turns = draw.TurnDraws(s, policy)
  assert turns.render.tools == [tools.schema(builtin_tools.python)]
  ex = Example(uid="t/1", dataset="t", messages=({"role": "user", "content": "2+2?"},),
               reference="4")
  first = turns.first_examples([ex])[0]
  assert first.messages[-1]["content"].endswith(templates.TAG_BOXED_INSTRUCTION)
  checked = turns.checked_policy(policy)
  assert not checked.add_bos
  assert checked.render(ex) == turns.render.prompt_text(first.messages)
  tokens, mask = collect.left_pad([[5, 6, 7]], 0, width=s.data.max_prompt_len)
  assert tokens.shape == (1, s.data.max_prompt_len) and mask.sum() == 3
  with pytest.raises(ValueError, match="max_prompt_len"):
    collect.left_pad([[5] * (s.data.max_prompt_len + 1)], 0, width=s.data.max_prompt_len)
