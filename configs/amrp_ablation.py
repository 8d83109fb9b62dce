r"""AMRP Table 6: ablations of the shortfall (S), volatility (V) and progress (P) gates (paper 001).

    python -m mr_rl.main --config=configs/amrp_ablation.py:variant=no_v \
        --workdir=$WORKDIR_ROOT/amrp_ablation/variant-no_v
    launch/pod.sh $TPU $ZONE configs/amrp_ablation.py:variant=no_v $WORKDIR
    python -m mr_rl.config_lib list configs/amrp_ablation.py   # all 5 runs

Arguments: variant = full | no_s | no_v | no_p (that gate replaced by 1) | additive
(U = S + V + P instead of S V P); runlocal. Qwen3-4B-Instruct math set-up of Table 1.
TPU slice: v5p-8.
Estimate: 48 v5p chip-hours for the default point (variant=no_v); whole table 241.
"""

from mr_rl import config_lib as cl

CHOICES = {"variant": ("full", "no_s", "no_v", "no_p", "additive")}
DEFAULTS = {"variant": "no_v"}
FLAGS = {"full": {}, "no_s": {"use_s": False}, "no_v": {"use_v": False},
         "no_p": {"use_p": False}, "additive": {"additive": True}}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/amrp_ablation.py")
  c = cl.amrp_math_base("qwen3_4b")
  cl.set_aggregator(c, "amrp", **cl.AMRP_DEFAULTS,   # paper defaults (1, 5, 5, 1) ...
                    **FLAGS[a["variant"]])           # ... with one gate dropped / additive U
  if a["runlocal"]:
    cl.runlocal(c, "qwen3_4b")
  return c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/amrp_ablation.py")
