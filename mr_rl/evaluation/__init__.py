"""Evaluation loops: greedy (AMRP) and sampled pass@k (TAG) over data sets, with reports.

    cfg = EvalConfig(mode="sampled", num_samples=4, ks=(1, 4), temperature=1.0)
    result = evaluate(policy, runner, params, examples, cfg.resolve(settings, K), key)
    to_json(result, "eval.json"); print(to_markdown(result))

A run's configured evaluation (`config.eval` on its eval split or `data.eval_sets`):
`run_evaluation` (periodic, from the trainer) and `final_eval` (end of a run).
"""

from mr_rl.evaluation.evaluator import MODES, EvalConfig, EvalResult, evaluate
from mr_rl.evaluation.protocol import (eval_config, evaluation_examples, final_eval,
                                       run_evaluation)
from mr_rl.evaluation.report import (compare_markdown, default_metrics, from_dict, from_json,
                                     to_dict, to_json, to_markdown)
from mr_rl.evaluation.summary import ALL, MACRO, group_metrics, macro_average, success, summarize

__all__ = ["MODES", "EvalConfig", "EvalResult", "evaluate", "eval_config", "evaluation_examples",
           "final_eval", "run_evaluation", "compare_markdown", "default_metrics",
           "from_dict", "from_json", "to_dict", "to_json", "to_markdown", "ALL", "MACRO",
           "group_metrics", "macro_average", "success", "summarize"]
