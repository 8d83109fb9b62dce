r"""AMRP Table 7 (App. A.3): sensitivity to lambda, k_s, k_p and the update interval N (paper 001).

    python -m mr_rl.main --config=configs/amrp_sensitivity.py:lam=0.5 \
        --workdir=$WORKDIR_ROOT/amrp_sensitivity/lam-0.5
    launch/pod.sh $TPU $ZONE configs/amrp_sensitivity.py:interval=4 $WORKDIR
    python -m mr_rl.config_lib list configs/amrp_sensitivity.py  # all 10 runs

Arguments: lam = 0.5 | 1.0 | 2.0; k_s = 2.5 | 5 | 10; k_p = 2.5 | 5 | 10; interval (N) = 1 | 2 |
4 | 8; runlocal. Unset keys keep AMRP's defaults (lambda, k_s, k_p, N) = (1.0, 5, 5, 1) from
mr_rl.aggregators.amrp.DEFAULTS. The sweep varies one at a time (plus the default point). The
text gives N in {1, 2, 4, 8} and names lambda = 0.5; the other values (halving and doubling the
default) are the project's choice. Qwen3-4B-Instruct math set-up of Table 1 (amrp_math).
TPU slice: v5p-8.
Estimate: 48 v5p chip-hours for the default point (all defaults); whole table 482.
"""

from mr_rl import config_lib as cl
from mr_rl.aggregators import amrp

amrp_math = cl.load_sibling(__file__, "amrp_math")  # Table 1's set-up (base_config)

CHOICES = {"lam": ("0.5", "1.0", "2.0"), "k_s": ("2.5", "5", "10"), "k_p": ("2.5", "5", "10"),
           "interval": ("1", "2", "4", "8")}
TYPES = {"lam": float, "k_s": float, "k_p": float, "interval": int}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, {}, "configs/amrp_sensitivity.py")  # unset: amrp.DEFAULTS
  c = amrp_math.base_config("qwen3_4b")
  cl.set_amrp(c, **{k: TYPES[k](a[k]) for k in CHOICES if k in a})  # the symbols given in arg
  return cl.runlocal(c, "qwen3_4b") if a["runlocal"] else c


def sweep(arg=None):
  """The default point (every symbol at amrp.DEFAULTS), then each symbol off it, one at a time."""
  points = ["lam=1.0"] + [f"{k}={v}" for k, vals in CHOICES.items() for v in vals
                          if TYPES[k](v) != amrp.DEFAULTS[k]]
  return cl.restrict(points, arg, CHOICES, "configs/amrp_sensitivity.py")
