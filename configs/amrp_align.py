r"""AMRP Table 3: open-ended alignment, HelpSteer2 prompts scored by ArmoRM heads (paper 001).

    python -m mr_rl.main --config=configs/amrp_align.py:model=qwen3_4b,method=amrp \
        --workdir=$WORKDIR_ROOT/amrp_align/model-qwen3_4b/method-amrp
    launch/pod.sh $TPU $ZONE configs/amrp_align.py:model=qwen3_4b,method=amrp $WORKDIR
    python -m mr_rl.config_lib list configs/amrp_align.py      # all 10 runs of the table

Arguments: model = qwen3_4b (Qwen3-4B-Instruct-2507) | llama3_1_8b (Llama-3.1-8B-Instruct);
method = base | static | drbo_inverse | drbo_delta | amrp; runlocal.
Rewards: ArmoRM-Llama3-8B-v0.1 helpfulness, correctness, coherence (channels
armorm_helpfulness, armorm_correctness, armorm_coherence: one shared bf16 scorer on the
policy's mesh, scores mapped to [0, 1] as rating / 4; runlocal: a tiny 3-objective Llama).
Three epochs over ~10.2K unique prompts (953 steps), completions up to 512 tokens, greedy
evaluation on the HelpSteer2 validation prompts (the paper's AlpacaEval / ArenaHard / MT-Bench
prompts: configs/README.md).
TPU slice: v5p-8 (Qwen3-4B), v5p-16 (Llama-3.1-8B); the 8B scorer adds 16 GB (bf16) to the mesh.
Estimate: 97 v5p chip-hours for the default point (model=qwen3_4b,method=amrp), policy only;
whole table 966 (configs/README.md).
"""

from mr_rl import config_lib as cl

CHOICES = {"model": ("qwen3_4b", "llama3_1_8b"),
           "method": ("base", "static", "drbo_inverse", "drbo_delta", "amrp")}
DEFAULTS = {"model": "qwen3_4b", "method": "amrp"}
MODEL_KEYS = {"qwen3_4b": "qwen3_4b", "llama3_1_8b": "llama3_1_8b_instruct"}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/amrp_align.py")
  model = MODEL_KEYS[a["model"]]
  c = cl.amrp_align_base(model)
  cl.amrp_method(c, a["method"])
  if a["runlocal"]:
    cl.runlocal(c, model)
  return c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/amrp_align.py")
