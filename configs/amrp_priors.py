r"""AMRP Table 5: the accuracy-biased prior 1.5 : 0.75 : 0.75 over [acc, fmt, len] (paper 001).

    python -m mr_rl.main --config=configs/amrp_priors.py:variant=prior \
        --workdir=$WORKDIR_ROOT/amrp_priors/variant-prior
    launch/pod.sh $TPU $ZONE configs/amrp_priors.py:variant=prior $WORKDIR
    python -m mr_rl.config_lib list configs/amrp_priors.py     # all 3 runs

Arguments: variant = static (fixed weights 1.5/0.75/0.75) | init (AMRP with w^(0) = a, then
a = 1: persistent_prior=False) | prior (AMRP keeps a in every update: persistent_prior=True);
runlocal. Qwen3-4B-Instruct math set-up of Table 1 (amrp_math); the uniform rows are Table 1's.
TPU slice: v5p-8.
Estimate: 48 v5p chip-hours for the default point (variant=prior); whole table 145.
"""

from mr_rl import config_lib as cl

amrp_math = cl.load_sibling(__file__, "amrp_math")  # Table 1's set-up (base_config)

CHOICES = {"variant": ("static", "init", "prior")}
DEFAULTS = {"variant": "prior"}
PRIOR = [1.5, 0.75, 0.75]  # mean-one, over [accuracy, format, length]


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/amrp_priors.py")
  c = amrp_math.base_config("qwen3_4b")
  if a["variant"] == "static":
    cl.set_aggregator(c, "weighted", w=PRIOR)        # the biased ratio as a fixed projection
  else:
    cl.set_amrp(c, prior=PRIOR,                      # a = w^(0) = 1.5 : 0.75 : 0.75
                persistent_prior=a["variant"] == "prior")  # prior: a kept in every update
  return cl.runlocal(c, "qwen3_4b") if a["runlocal"] else c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/amrp_priors.py")
