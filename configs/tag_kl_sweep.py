r"""TAG Table 7: Additive + KL penalty, beta swept from 0.01 to 1, on Qwen3-1.7B.

    python -m mr_rl.main --config=configs/tag_kl_sweep.py:task=negative,beta=0.01 \
        --workdir=$WORKDIR_ROOT/tag_kl_sweep/task-negative/beta-0.01
    launch/pod.sh $TPU $ZONE configs/tag_kl_sweep.py:task=brief,beta=1.0 $WORKDIR
    python -m mr_rl.config_lib list configs/tag_kl_sweep.py    # all 6 runs

Arguments: task = brief | negative; beta = 0.01 | 0.1 | 1.0 (the summary names the end points
0.01 and 1; 0.1 is the project's midpoint); runlocal. Additive aggregation with a k3 KL penalty
beta * KL(pi || pi_0) per token (docs/methods.md §4-5); otherwise the tag_math set-up.
TPU slice: v5p-8.
Estimate: 62 v5p chip-hours for the default point (task=negative,beta=0.1); whole table
374.
"""

from mr_rl import config_lib as cl

tag_math = cl.load_sibling(__file__, "tag_math")  # Table 1's set-up (base_config)

CHOICES = {"task": ("brief", "negative"), "beta": ("0.01", "0.1", "1.0")}
DEFAULTS = {"task": "negative", "beta": "0.1"}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/tag_kl_sweep.py")
  c = tag_math.base_config("qwen3_1_7b", a["task"])
  cl.tag_method(c, "additive_kl", 2, kl_coef=float(a["beta"]))
  return cl.runlocal(c, "qwen3_1_7b") if a["runlocal"] else c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/tag_kl_sweep.py")
