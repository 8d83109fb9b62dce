r"""AMRP Table 4: AMRP with GRPO, GDPO and PPO on Qwen3-4B-Instruct math reasoning (paper 001).

    python -m mr_rl.main --config=configs/amrp_algorithms.py:algorithm=gdpo,method=amrp \
        --workdir=$WORKDIR_ROOT/amrp_algorithms/algorithm-gdpo/method-amrp
    launch/pod.sh $TPU $ZONE configs/amrp_algorithms.py:algorithm=gdpo,method=amrp $WORKDIR
    python -m mr_rl.config_lib list configs/amrp_algorithms.py  # all 12 runs

Arguments: algorithm = grpo | gdpo | ppo; method = static | drbo_inverse | drbo_delta | amrp;
runlocal. The Table 1 set-up (amrp_math) with the advantage estimator swapped. GDPO multiplies
the per-channel normalised advantages by the aggregator's weights (AMRP's w^(t-1)), then
normalises over the batch (docs/methods.md §3). PPO scalarises with the aggregator, puts the
outcome reward on the last response token and uses GAE (gamma = lambda = 1, whitened) with a
critic initialised from the same checkpoint (critic lr 1e-5: project choice, the paper gives none).
The GRPO rows are the Table 1 runs. The text does not list Table 4's baselines beyond static /
AMRP; the sweep covers all four methods.
TPU slice: v5p-8 (PPO: the critic doubles the train state; 2 rows per micro-batch fit).
Estimate: 48 v5p chip-hours for the default point (algorithm=gdpo,method=amrp); whole table
659 (PPO points include the critic; configs/README.md).
"""

from mr_rl import config_lib as cl

amrp_math = cl.load_sibling(__file__, "amrp_math")  # Table 1's set-up (base_config)

CHOICES = {"algorithm": ("grpo", "gdpo", "ppo"),
           "method": ("static", "drbo_inverse", "drbo_delta", "amrp")}
DEFAULTS = {"algorithm": "gdpo", "method": "amrp"}
# PPO's optim.num_micro_batches on v5p-8, chosen by launch/check.py --fit (XLA:TPU, 2026-12-06,
# T = 4,024): 2 rows per micro-batch (ppo_step 91.0 GB, 11.5% of HBM free; 4 rows 117.7 GB), as
# the critic's state (12.1 GB per chip) and its activations join the policy's.
PPO_MICRO_BATCHES = 128


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/amrp_algorithms.py")
  c = amrp_math.base_config("qwen3_4b")
  cl.amrp_method(c, a["method"])                     # the aggregator (Table 1's methods)
  c.advantage.name = a["algorithm"]                  # grpo | gdpo | ppo (advantage estimator)
  if a["algorithm"] == "ppo":
    c.advantage.gamma = 1.0                          # GAE discount (outcome reward at the end)
    c.advantage.lam = 1.0                            # GAE lambda
    c.optim.value_lr = 1e-5                          # critic AdamW lr (project choice)
    c.optim.num_micro_batches = PPO_MICRO_BATCHES    # 2 rows each (launch/check.py --fit)
  return cl.runlocal(c, "qwen3_4b") if a["runlocal"] else c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/amrp_algorithms.py")
