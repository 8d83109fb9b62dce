"""Token identity of multi-turn rollouts for every model family: a retry-with-feedback
environment, the family's chat-template deltas, its tiny checkpoint; 0 id mismatches and the
learner's log-probs equal to the sampler's on every policy token (the observation prefill,
`TurnPrograms.append`, runs each family's attention and MLP, the MoE's included)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from mr_rl import models
from mr_rl.data import Example
from mr_rl.models import positions_from_mask
from mr_rl.multiturn import collect, env as env_lib
from mr_rl.multiturn import render as render_lib
from mr_rl.multiturn import rollout as mt
from mr_rl.rl import batch as batch_lib
from mr_rl.tiny_assets import checkpoints

G = 2
S = 128


class Retry:
  """Asks again until the answer is right (the tiny random policy never is)."""

  def reset(self, example):
    self.answer = example.reference
    return list(example.messages)

  def step(self, turn):
    ok = turn.text.strip() == self.answer
    if ok:
      return env_lib.StepResult(rewards={"correct": 1.0}, done=True)
    return env_lib.StepResult(messages=[{"role": "user", "content": "Wrong. Try again."}],
                              rewards={"correct": 0.0})


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_moe"])
def test_zero_mismatches_and_logprob_parity(family, tmp_path):
  path = checkpoints.make_tiny_checkpoint(str(tmp_path / family), family, vocab_size=512)
  from transformers import AutoTokenizer
  tok = AutoTokenizer.from_pretrained(path)
  model, params = models.load_pretrained(path)[:2]
  render = render_lib.ChatRenderer(tok)
  # The family's end of turn, plus ids common under a random policy, so turns end early.
  ends = (render.end_of_turn_id,) + tuple(range(40, len(tok), 16))
  engine = mt.TurnRollout(model, slots=3, max_new_tokens=S, end_of_turn_ids=ends,
                          limits=mt.TurnLimits(max_turns=3, max_observation_tokens=48,
                                               step_timeout_s=10.0))
  examples = [Example.single_turn(f"q{i}", "toy", q, reference="4")
              for i, q in enumerate(["What is 2+2?", "Add 1 and 3.", "Two plus two?"])]
  d = collect.draw(engine, params, examples, Retry, render, group_size=G,
                   key=jax.random.PRNGKey(1), env_channels=("correct",))
  assert d.metrics["multiturn/token_mismatches"] == 0
  assert d.metrics["multiturn/turns_mean"] > 1.5
  assert sum(len(t.inserted) for t in d.trajectories) >= 3
  b = batch_lib.make_batch(d.rollout, np.zeros((3, G)), trim=False,
                           policy_mask_BGS=d.policy_mask_BGS)
  P = d.rollout.prompt_tokens.shape[1]
  delta = render.observation_ids([{"role": "user", "content": "Wrong. Try again."}])[0]
  for n, t in enumerate(d.trajectories):
    np.testing.assert_array_equal(b.tokens[n, P:P + len(t.tokens)], t.tokens)
    for at, ids in t.inserted:
      assert ids == delta  # the family's own delta, inserted as rendered
  logits = model.apply({"params": params}, b.tokens, positions_from_mask(b.mask),
                       kv_mask_NC=b.mask.astype(bool))
  logits = logits[0] if isinstance(logits, tuple) else logits
  logp = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float32)[:, :-1], -1))
  logp = np.take_along_axis(logp, b.tokens[:, 1:, None], -1)[..., 0]
  on = b.response_mask[:, 1:] > 0
  assert on.sum() > 0
  np.testing.assert_allclose(logp[on], b.old_logp[:, 1:][on], atol=5e-5)
