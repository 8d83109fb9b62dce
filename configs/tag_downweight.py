r"""TAG Figure 6: static down-weighting of the auxiliary, w_A from 0.5 to 0.1 (Qwen3-1.7B, negative).

    python -m mr_rl.main --config=configs/tag_downweight.py:w_a=0.1 \
        --workdir=$WORKDIR_ROOT/tag_downweight/w_a-0.1
    launch/pod.sh $TPU $ZONE configs/tag_downweight.py:w_a=0.3 $WORKDIR
    python -m mr_rl.config_lib list configs/tag_downweight.py  # all 5 runs

Arguments: w_a = 0.5 | 0.4 | 0.3 | 0.2 | 0.1 (R = (1 - w_A) RP + w_A RA); runlocal.
The figure plots training curves: WORKDIR/metrics.jsonl has reward/accuracy/mean and
reward/negative/mean every step. Otherwise the tag_math set-up.
TPU slice: v5p-8.
Estimate: 62 v5p chip-hours for the default point (w_a=0.1); whole figure 311.
"""

from mr_rl import config_lib as cl

tag_math = cl.load_sibling(__file__, "tag_math")  # Table 1's set-up (base_config)

CHOICES = {"w_a": ("0.5", "0.4", "0.3", "0.2", "0.1")}
DEFAULTS = {"w_a": "0.1"}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/tag_downweight.py")
  c = tag_math.base_config("qwen3_1_7b", "negative")
  w_a = float(a["w_a"])
  cl.set_aggregator(c, "weighted", w=[1.0 - w_a, w_a])  # (1 - w_A) RP + w_A RA
  return cl.runlocal(c, "qwen3_1_7b") if a["runlocal"] else c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/tag_downweight.py")
