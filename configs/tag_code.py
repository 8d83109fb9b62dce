r"""TAG Table 2: code synthesis on DeepCoder with a fast (< 60 ms) or no-op (< 3 ms) auxiliary.

    python -m mr_rl.main --config=configs/tag_code.py:model=qwen3_4b,task=noop,method=tag \
        --workdir=$WORKDIR_ROOT/tag_code/model-qwen3_4b/task-noop/method-tag
    launch/pod.sh $TPU $ZONE configs/tag_code.py:model=qwen3_4b,task=fast,method=additive $WORKDIR
    python -m mr_rl.config_lib list configs/tag_code.py        # all 20 runs

Arguments: model = qwen3_1_7b | qwen3_4b (Instruct-2507); task = fast | noop; method = rp_only |
additive | dr_grpo | mo_grpo | tag; runlocal.
Rewards (mr_rl/rewards/code_channels.py): code_correct (every test passes in the sandbox,
10 s per test), code_fast (runtime < 60 ms) / code_noop (< 3 ms), one shared sandbox run per
response. Eval: n = 8 samples per test problem (unbiased pass@4). The DeepCoder-RT filter
(3,741 / 185 problems) is not in the summary; mr_rl.data's stdio-only rule is used.
TPU slice: v5p-8; the sandbox runs on the host CPUs (16 workers per host recommended).
Estimate: 179 v5p chip-hours for the default point (model=qwen3_4b,task=noop,method=tag,
probes included; sandbox time not included); whole table 2558.
"""

from mr_rl import config_lib as cl

CHOICES = {"model": ("qwen3_1_7b", "qwen3_4b"), "task": ("fast", "noop"),
           "method": ("rp_only", "additive", "dr_grpo", "mo_grpo", "tag")}
DEFAULTS = {"model": "qwen3_4b", "task": "noop", "method": "tag"}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/tag_code.py")
  c = cl.tag_code_base(a["model"], a["task"])
  cl.tag_method(c, a["method"], 2)
  if a["runlocal"]:
    cl.runlocal(c, a["model"])
  return c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/tag_code.py")
