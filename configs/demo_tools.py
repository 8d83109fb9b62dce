r"""The multi-turn CPU demo: arithmetic with a calculator the policy calls (runs on 2 CPU cores).

    python -m mr_rl.main --config=configs/demo_tools.py --workdir=/tmp/mr_rl_demo_tools

The policy answers `Q:7+5-9+3=` in turns: a turn ending in `</r>` is a call, whose argument
(the text after `<r>`) the calculator evaluates; its result comes back as the observation
`=6;` (or `=;` when the argument is not arithmetic), prefilled into the trajectory's slot, and
the policy writes its answer in the next turn (`mr_rl/demo/calculator.py`). Base policy:
mr_rl/demo/assets/calculator_policy (`python -m mr_rl.demo.warmstart --recipe=calculator`),
which calls the calculator with the question on about a quarter of the problems and otherwise
reasons or guesses as the single-turn demo's base does.

Channels (the demo's `calculator` task): `arith_acc` (the policy's own answer; the
observation is not read as it), `tool_success` (the calls ran: an environment channel, mean
over calls) and `arith_brief` (fewer than 14 tokens the policy wrote: on 5-7 terms only a
guess is that short). Methods: additive, AMRP and TAG (anchor elected by single-channel
multi-turn probes); 60 steps each on chains of 4-7 terms. Writes WORKDIR/report.{json,md}
with the targets of `mr_rl.demo.summary.TOOL_TARGETS` (docs/multiturn.md "The CPU demo").

Variants (`configs/demo_tools.py:ARG[,ARG]`): seed=N; smoke (seconds, tests).
"""

import os

import ml_collections

from mr_rl import config_lib as cl

single_turn = cl.load_sibling(__file__, "demo")  # the single-turn demo's set-up

_POLICY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "mr_rl", "demo", "assets", "calculator_policy")


def get_config(arg=None):
  args = single_turn._parse(arg)  # pylint: disable=protected-access
  unknown = set(args) - {"smoke", "seed"}
  if unknown:
    raise ValueError(f"configs/demo_tools.py: unknown arguments {sorted(unknown)}; valid: "
                     "smoke, seed")
  c = single_turn.get_config(",".join(f"{k}={v}" if v is not True else k
                                      for k, v in args.items()))
  c.model.path = _POLICY
  c.total_steps = 60 if "smoke" not in args else 2
  c.rollout.max_new_tokens = 48     # every turn and observation of a trajectory
  # The calculator environment (mr_rl/demo/calculator.py), its format and limits.
  c.multiturn.env = "mr_rl.demo.calculator:make_env"
  c.multiturn.renderer = "mr_rl.demo.calculator:renderer"
  c.multiturn.tool_format = "plain"  # a turn also ends at `</r>` (the call's closing marker)
  c.multiturn.plain_open = "<r>"
  c.multiturn.plain_close = "</r>"
  c.multiturn.max_turns = 3
  c.multiturn.max_observation_tokens = 8
  c.multiturn.step_timeout_s = 5.0
  c.multiturn.workers = 4
  c.demo.tasks = "calculator"
  c.demo.methods = "additive,amrp,tag"
  c.demo.methods_for = ml_collections.ConfigDict()
  c.demo.problems_for = ml_collections.ConfigDict({"calculator": {"min_terms": 4}})
  c.demo.brief_threshold = 14
  if "smoke" in args:
    c.demo.methods = "tag"          # probes, training and evaluation, all multi-turn
  return c
