r"""TAG Table 4 (and Fig. 7): isolated per-channel drift after 300 single-channel GRPO steps.

    python -m mr_rl.main --config=configs/tag_drift.py:model=qwen3_4b,task=brief \
        --workdir=$WORKDIR_ROOT/tag_drift/model-qwen3_4b/task-brief
    launch/pod.sh $TPU $ZONE configs/tag_drift.py:model=qwen3_1_7b,task=negative $WORKDIR
    python -m mr_rl.config_lib list configs/tag_drift.py       # all 8 runs

Arguments: model = qwen3_1_7b | qwen3_4b (Instruct-2507); task = brief | negative | fast | noop;
runlocal. Pipeline 'tag' with total_steps = 0: probe each channel from pi_0 (T = 300 steps,
rollout batch 32), measure per-token reverse KL (and forward KL) on 256 held-out prompts, write
WORKDIR/drift.{json,md} and elect the anchor; the zero-step joint run then evaluates pi_0 (the
base row). The code tasks use the tag_code set-up (DeepCoder, sandboxed channels).
A TAG run of tag_math / tag_code started in the same WORKDIR reuses this election.
TPU slice: v5p-8.
Estimate: 20 v5p chip-hours for the default point (model=qwen3_4b,task=brief); whole table
151.
"""

from mr_rl import config_lib as cl

tag_math = cl.load_sibling(__file__, "tag_math")  # Table 1's set-up (base_config)
tag_code = cl.load_sibling(__file__, "tag_code")  # Table 2's

CHOICES = {"model": ("qwen3_1_7b", "qwen3_4b"), "task": ("brief", "negative", "fast", "noop")}
DEFAULTS = {"model": "qwen3_4b", "task": "brief"}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/tag_drift.py")
  if a["task"] in ("fast", "noop"):
    c = tag_code.base_config(a["model"], a["task"])
  else:
    c = tag_math.base_config(a["model"], a["task"])
  cl.tag_method(c, "tag", 2)                         # pipeline 'tag': probes, drift, election
  c.total_steps = 0                                  # election only; joint run evaluates pi_0
  return cl.runlocal(c, a["model"]) if a["runlocal"] else c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/tag_drift.py")
