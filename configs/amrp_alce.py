r"""AMRP Table 2: citation-grounded long-form QA on ALCE ASQA and ELI5 (paper 001, Sec. 5.1).

    python -m mr_rl.main --config=configs/amrp_alce.py:model=qwen3_4b,dataset=asqa,method=amrp \
        --workdir=$WORKDIR_ROOT/amrp_alce/model-qwen3_4b/dataset-asqa/method-amrp
    launch/pod.sh $TPU $ZONE configs/amrp_alce.py:model=qwen3_4b,dataset=asqa,method=amrp $WORKDIR
    python -m mr_rl.config_lib list configs/amrp_alce.py       # all 20 runs of the table

Arguments: model = qwen3_4b (Qwen3-4B-Instruct-2507) | llama3_1_8b (Llama-3.1-8B-Instruct);
dataset = asqa | eli5; method = base | static | drbo_inverse | drbo_delta | amrp; runlocal.
Rewards [alce_correctness (STR-EM / claims-NLI), alce_citation (AutoAIS F1)] with the default
NLI verifier (runlocal: the lexical verifier); 3 passages + 1 demonstration per prompt;
three epochs over the 80% train split (72 / 75 steps); completions up to 400 / 500 tokens;
the end-of-run eval samples the 190 / 200 held-out prompts at T = 1.
TPU slice: v5p-8 (Qwen3-4B), v5p-16 (Llama-3.1-8B).
Estimate: 3 v5p chip-hours for the default point (model=qwen3_4b,dataset=asqa,method=amrp);
whole table 75 (NLI verifier time on the reward host not included; configs/README.md).
"""

from mr_rl import config_lib as cl

CHOICES = {"model": ("qwen3_4b", "llama3_1_8b"), "dataset": ("asqa", "eli5"),
           "method": ("base", "static", "drbo_inverse", "drbo_delta", "amrp")}
DEFAULTS = {"model": "qwen3_4b", "dataset": "asqa", "method": "amrp"}
MODEL_KEYS = {"qwen3_4b": "qwen3_4b", "llama3_1_8b": "llama3_1_8b_instruct"}  # AMRP: instruct


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/amrp_alce.py")
  model = MODEL_KEYS[a["model"]]
  c = cl.amrp_alce_base(model, a["dataset"])
  cl.amrp_method(c, a["method"])
  if a["runlocal"]:
    cl.runlocal(c, model)
  return c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/amrp_alce.py")
