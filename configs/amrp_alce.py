r"""AMRP Table 2: citation-grounded long-form QA on ALCE ASQA and ELI5 (paper 001, Sec. 5.1).

    python -m mr_rl.main --config=configs/amrp_alce.py:model=qwen3_4b,dataset=asqa,method=amrp \
        --workdir=$WORKDIR_ROOT/amrp_alce/model-qwen3_4b/dataset-asqa/method-amrp
    launch/pod.sh $TPU $ZONE configs/amrp_alce.py:model=qwen3_4b,dataset=asqa,method=amrp $WORKDIR
    python -m mr_rl.config_lib list configs/amrp_alce.py       # all 20 runs of the table

Arguments: model = qwen3_4b (Qwen3-4B-Instruct-2507) | llama3_1_8b (Llama-3.1-8B-Instruct);
dataset = asqa | eli5; method = base | static | drbo_inverse | drbo_delta | amrp;
lora = 0 (full fine-tuning, the paper's) | 8 | 16 | 32 | 64 (LoRA of that rank on every
attention and MLP kernel, alpha = 2 x rank, lr x 10: not a paper setting; the sweep keeps
lora=0); runlocal.
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
           "method": ("base", "static", "drbo_inverse", "drbo_delta", "amrp"),
           "lora": cl.LORA_RANKS}
DEFAULTS = {"model": "qwen3_4b", "dataset": "asqa", "method": "amrp", "lora": "0"}
MODEL_KEYS = {"qwen3_4b": "qwen3_4b", "llama3_1_8b": "llama3_1_8b_instruct"}  # AMRP: instruct

TRAIN_PROMPTS = {"asqa": 758, "eli5": 800}           # 80/20 split of ALCE (App. B.1)
TEST_PROMPTS = {"asqa": 190, "eli5": 200}
MAX_NEW_TOKENS = {"asqa": 400, "eli5": 500}


# optim.num_micro_batches per model on its slice, chosen by launch/check.py --fit at ASQA's
# lengths (2,048 + 400 tokens; Qwen3-4B 68.0 GB at 4 rows, Llama-3.1-8B 64.6 GB; 8 rows do not
# fit); ELI5's 500 new tokens were not fitted apart.
FITTED_MICRO_BATCHES = {"qwen3_4b": 64, "llama3_1_8b_instruct": 64}  # v5p-8; v5p-16


def base_config(model: str, dataset: str):
  """ALCE `dataset` (asqa | eli5) on paper model `model` (a config_lib.MODELS key), no method."""
  c = cl.paper_base()   # GRPO of both papers: B 32 x G 8, lr 1e-6, clip 0.2 / 0.28, rollout T 1
  cl.set_model(c, model)                             # hub id, fp32, tensor-parallel mesh
  c.total_steps = cl.epochs_to_steps(TRAIN_PROMPTS[dataset], 3)  # three epochs (72 / 75 steps)
  c.checkpoint_every = 25                            # short runs: checkpoint every 25 steps
  # Training data and prompts
  c.data.name = f"alce_{dataset}"                    # 3 passages + 1 demonstration per prompt
  c.data.template = "alce"                           # the ALCE prompt carries its instruction
  c.data.max_prompt_len = 2048                       # instruction + demo + 3 passages + query
  c.rollout.max_new_tokens = MAX_NEW_TOKENS[dataset]  # 400 (ASQA) / 500 (ELI5) tokens
  c.optim.num_micro_batches = FITTED_MICRO_BATCHES.get(model, c.optim.num_micro_batches)
  # Rewards
  c.rewards.channels = "alce_correctness,alce_citation"  # STR-EM or claims-NLI; AutoAIS F1
  c.rewards.timeout_s = 120.0                        # NLI verifier on the reward host
  # Final evaluation: the held-out 20% (data.eval_split "test")
  c.eval.num_prompts = TEST_PROMPTS[dataset]         # 190 / 200 prompts
  c.eval.samples_per_prompt = 1                      # one sampled response per prompt
  c.eval.temperature = 1.0                           # ALCE responses sampled at T = 1
  return c


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/amrp_alce.py")
  model = MODEL_KEYS[a["model"]]
  c = base_config(model, a["dataset"])
  cl.amrp_method(c, a["method"])                     # aggregator; base: 0 steps (eval only)
  cl.set_lora(c, int(a["lora"]))                     # LoRA RL (lora > 0): adapters only
  return cl.runlocal(c, model) if a["runlocal"] else c


def sweep(arg=None):
  swept = {k: v for k, v in CHOICES.items() if k != "lora"}  # the sweep keeps lora=0
  return cl.restrict(cl.grid(**swept), arg, CHOICES, "configs/amrp_alce.py")
