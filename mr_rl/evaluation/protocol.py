"""A run's configured evaluation: which examples, which protocol, which key.

`run_evaluation` is what the trainer calls every `eval.every` steps and the pipelines call at
the end of a run (`final_eval`): `config.eval` (samples per prompt, temperature, number of
prompts) on `evaluation_examples`, through `mr_rl.evaluation.evaluate`. With
`data.eval_sets`, `eval/<metric>` pools every record and `eval/<set>/<metric>` is per set
(several sets also give `eval/macro/<metric>`).
"""

from __future__ import annotations

from typing import Mapping

import jax

from mr_rl.evaluation.evaluator import EvalConfig, evaluate

FINAL_EVAL_KEY = 7_000_000  # fold_in(PRNGKey(seed), FINAL_EVAL_KEY + offset): end-of-run eval


def eval_config(eval_settings) -> EvalConfig:
  """The `EvalConfig` of `config.eval`: greedy at temperature 0, else sampled."""
  greedy = eval_settings.temperature == 0
  return EvalConfig(mode="greedy" if greedy else "sampled",
                    num_samples=None if greedy else eval_settings.samples_per_prompt,
                    temperature=None if greedy else eval_settings.temperature)


def evaluation_examples(eval_data, num_prompts: int) -> list:
  """What evaluation runs on: the first `num_prompts` examples of each set of `eval_data`
  ({name: examples}, the run's `data.eval_sets`, pooled), or of `eval_data` itself when it is
  a list (the eval split)."""
  if isinstance(eval_data, Mapping):
    return [ex for examples in eval_data.values() for ex in examples[:num_prompts]]
  return list(eval_data[:num_prompts])


def run_evaluation(policy, runner, settings, eval_data, params, key,
                   eval_settings=None, turns=None) -> dict[str, float]:
  """`eval_settings` (default `settings.eval`) on `evaluation_examples(eval_data)`; the flat
  `eval/...` metrics: per-channel means, `eval/<primary>&<aux>` joint rates, pass@k of the
  primary channel, lengths.

  Args:
    policy, runner: the run's `mr_rl.rollout.Policy` and reward runner.
    settings: the run's settings (the data / rollout / rewards sections fill the evaluation
      config's defaults, `EvalConfig.resolve`).
    eval_data: {set name: examples} or a list of examples (`evaluation_examples`).
    params: the policy parameters.
    key: the evaluation's PRNG key.
    turns: a multi-turn run's draws (`mr_rl.train.Components.turns`), or None.
  """
  e = settings.eval if eval_settings is None else eval_settings
  cfg = eval_config(e).resolve(settings, settings.num_channels)
  result = evaluate(policy, runner, params, evaluation_examples(eval_data, e.num_prompts), cfg,
                    key, turns=turns, rewards=None if turns is None else settings.rewards)
  m = result.metrics("eval/")
  if isinstance(eval_data, Mapping) and len(eval_data) == 1:  # one set is not split out
    (name,) = eval_data
    m.update({f"eval/{name}/{k[len('eval/'):]}": v for k, v in list(m.items())})
  return m


def final_eval(policy, runner, settings, eval_data, params, key_offset: int = 0,
               turns=None) -> dict[str, float]:
  """The end-of-run evaluation (`run_evaluation` with the final-eval key of `settings.seed`)."""
  key = jax.random.fold_in(jax.random.PRNGKey(settings.seed), FINAL_EVAL_KEY + key_offset)
  return run_evaluation(policy, runner, settings, eval_data, params, key, settings.eval,
                        turns=turns)
