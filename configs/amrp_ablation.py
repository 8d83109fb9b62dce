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

amrp_math = cl.load_sibling(__file__, "amrp_math")  # Table 1's set-up (base_config)

CHOICES = {"variant": ("full", "no_s", "no_v", "no_p", "additive")}
DEFAULTS = {"variant": "no_v"}
FLAGS = {"full": {}, "no_s": {"use_s": False}, "no_v": {"use_v": False},
         "no_p": {"use_p": False}, "additive": {"additive": True}}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/amrp_ablation.py")
  c = amrp_math.base_config("qwen3_4b")
  cl.set_amrp(c, **FLAGS[a["variant"]])              # paper values, one gate dropped / U = sum
  return cl.runlocal(c, "qwen3_4b") if a["runlocal"] else c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/amrp_ablation.py")
