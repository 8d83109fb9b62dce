"""A run's configured evaluation: which examples, which protocol, which key.

`run_evaluation` is what the trainer calls every `eval.every` steps and the pipelines call at
the end of a run (`final_eval`): `config.eval` (samples per prompt, temperature, number of
prompts) on `evaluation_examples`, through `mr_rl.evaluation.evaluate`. With
`data.eval_sets`, `eval/<metric>` pools every record and `eval/<set>/<metric>` is per set
(several sets also give `eval/macro/<metric>`).
"""

from __future__ import annotations

import jax

from mr_rl.evaluation.evaluator import EvalConfig, evaluate

FINAL_EVAL_KEY = 7_000_000  # fold_in(PRNGKey(seed), FINAL_EVAL_KEY + offset): end-of-run eval


def eval_config(eval_settings) -> EvalConfig:
  """The `EvalConfig` of `config.eval`: greedy at temperature 0, else sampled."""
  greedy = eval_settings.temperature == 0
  return EvalConfig(mode="greedy" if greedy else "sampled",
                    num_samples=None if greedy else eval_settings.samples_per_prompt,
                    temperature=None if greedy else eval_settings.temperature)


def evaluation_examples(comp, num_prompts: int) -> list:
  """What evaluation runs on: the first `num_prompts` examples of each `data.eval_sets` set
  (pooled), or of the eval split when no sets are configured."""
  if comp.eval_sets:
    return [ex for examples in comp.eval_sets.values() for ex in examples[:num_prompts]]
  return list(comp.eval_examples[:num_prompts])


def run_evaluation(comp, params, key, eval_settings=None) -> dict[str, float]:
  """`eval_settings` (default `comp.settings.eval`) on `evaluation_examples`; the flat
  `eval/...` metrics: per-channel means, `eval/<primary>&<aux>` joint rates, pass@k of the
  primary channel, lengths."""
  e = comp.settings.eval if eval_settings is None else eval_settings
  result = evaluate(comp, params, evaluation_examples(comp, e.num_prompts), eval_config(e), key)
  m = result.metrics("eval/")
  if len(comp.eval_sets) == 1:  # the evaluator only splits out sets when there are several
    (name,) = comp.eval_sets
    m.update({f"eval/{name}/{k[len('eval/'):]}": v for k, v in list(m.items())})
  return m


def final_eval(comp, params, key_offset: int = 0) -> dict[str, float]:
  """The end-of-run evaluation of `comp.settings` (`run_evaluation` with the final-eval key)."""
  s = comp.settings
  key = jax.random.fold_in(jax.random.PRNGKey(s.seed), FINAL_EVAL_KEY + key_offset)
  return run_evaluation(comp, params, key, s.eval)
