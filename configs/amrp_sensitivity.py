r"""AMRP Table 7 (App. A.3): sensitivity to lambda, k_s, k_p and the update interval N (paper 001).

    python -m mr_rl.main --config=configs/amrp_sensitivity.py:lam=0.5 \
        --workdir=$WORKDIR_ROOT/amrp_sensitivity/lam-0.5
    launch/pod.sh $TPU $ZONE configs/amrp_sensitivity.py:interval=4 $WORKDIR
    python -m mr_rl.config_lib list configs/amrp_sensitivity.py  # all 10 runs

Arguments: lam = 0.5 | 1.0 | 2.0; k_s = 2.5 | 5 | 10; k_p = 2.5 | 5 | 10; interval (N) = 1 | 2 |
4 | 8; runlocal. Unset keys keep the default (lambda, k_s, k_p, N) = (1.0, 5, 5, 1). The sweep
varies one at a time (plus the default point). The text gives N in {1, 2, 4, 8} and names
lambda = 0.5; the other values (halving and doubling the default) are the project's choice.
Qwen3-4B-Instruct math set-up of Table 1.
TPU slice: v5p-8.
Estimate: 48 v5p chip-hours for the default point (all defaults); whole table 482.
"""

from mr_rl import config_lib as cl

CHOICES = {"lam": ("0.5", "1.0", "2.0"), "k_s": ("2.5", "5", "10"), "k_p": ("2.5", "5", "10"),
           "interval": ("1", "2", "4", "8")}
DEFAULTS = {"lam": "1.0", "k_s": "5", "k_p": "5", "interval": "1"}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/amrp_sensitivity.py")
  c = cl.amrp_math_base("qwen3_4b")
  hp = dict(cl.AMRP_DEFAULTS, lam=float(a["lam"]),   # volatility strength lambda
            k_s=float(a["k_s"]),                     # shortfall sharpness k_s
            k_p=float(a["k_p"]),                     # progress sharpness k_p
            interval=int(a["interval"]))             # weights recomputed every N steps
  cl.set_aggregator(c, "amrp", **hp)
  if a["runlocal"]:
    cl.runlocal(c, "qwen3_4b")
  return c


def sweep(arg=None):
  points = ["lam=1.0"] + [f"{k}={v}" for k, vals in CHOICES.items() for v in vals
                          if v != DEFAULTS[k]]
  return cl.restrict(points, arg, CHOICES, "configs/amrp_sensitivity.py")
