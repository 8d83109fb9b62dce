r"""AMRP Table 3: open-ended alignment, HelpSteer2 prompts scored by ArmoRM heads (paper 001).

    python -m mr_rl.main --config=configs/amrp_align.py:model=qwen3_4b,method=amrp \
        --workdir=$WORKDIR_ROOT/amrp_align/model-qwen3_4b/method-amrp
    launch/pod.sh $TPU $ZONE configs/amrp_align.py:model=qwen3_4b,method=amrp $WORKDIR
    python -m mr_rl.config_lib list configs/amrp_align.py      # all 10 runs of the table

Arguments: model = qwen3_4b (Qwen3-4B-Instruct-2507) | llama3_1_8b (Llama-3.1-8B-Instruct);
method = base | static | drbo_inverse | drbo_delta | amrp;
lora = 0 (full fine-tuning, the paper's) | 8 | 16 | 32 | 64 (LoRA of that rank on every
attention and MLP kernel, alpha = 2 x rank, lr x 10: not a paper setting; the sweep keeps
lora=0); runlocal.
Rewards: ArmoRM-Llama3-8B-v0.1 helpfulness, correctness, coherence (channels
armorm_helpfulness, armorm_correctness, armorm_coherence: one shared bf16 scorer on the
policy's mesh, scores mapped to [0, 1] as rating / 4; runlocal: a tiny 3-objective Llama).
Three epochs over ~10.2K unique prompts (953 steps), completions up to 512 tokens, greedy
evaluation on the first 256 HelpSteer2 validation prompts (the paper's AlpacaEval / ArenaHard /
MT-Bench prompts: configs/README.md).
TPU slice: v5p-8 (Qwen3-4B), v5p-16 (Llama-3.1-8B); the 8B scorer adds 16 GB (bf16) to the mesh.
launch/check.py: the static sampler does NOT fit (the prefill of 256 x 4,096-token prompts at
once: 213 GB per chip for Llama-3.1-8B on v5p-16), so both models sample with the continuous
engine: Llama-3.1-8B 192 slots (80.5 GB per chip), Qwen3-4B 96 slots (72.3 GB); see
docs/benchmarks.md "Paper configs on a pod".
Estimate: 97 v5p chip-hours for the default point (model=qwen3_4b,method=amrp), policy only;
whole table 966 (configs/README.md).
"""

import ml_collections

from mr_rl import config_lib as cl

CHOICES = {"model": ("qwen3_4b", "llama3_1_8b"),
           "method": ("base", "static", "drbo_inverse", "drbo_delta", "amrp"),
           "lora": cl.LORA_RANKS}
DEFAULTS = {"model": "qwen3_4b", "method": "amrp", "lora": "0"}
MODEL_KEYS = {"qwen3_4b": "qwen3_4b", "llama3_1_8b": "llama3_1_8b_instruct"}

TRAIN_PROMPTS = 10_162  # ~20,324 train rows with about two responses per prompt (assumed)
CHANNELS = "armorm_helpfulness,armorm_correctness,armorm_coherence"  # ArmoRM objectives 0 / 1 / 2


# optim.num_micro_batches per model on its slice, by launch/check.py --fit: Qwen3-4B 2 rows
# (65.9 GB per chip; 4 rows 96.5 GB); Llama-3.1-8B on v5p-16 passes at 4 rows (90.8 GB, 88%)
# but takes 2 (62.7 GB): the check does not count the ArmoRM scorer resident on the same chips
# (8B in bf16, 2-4 GB per chip), which would leave under 10% at 4 rows. Qwen3-4B's slot search
# allowed 168 slots (engine peak 92.4 GB); the slot counts below stay for the same reason.
FITTED_MICRO_BATCHES = {"qwen3_4b": 128, "llama3_1_8b_instruct": 128}


def base_config(model: str):
  """HelpSteer2 + ArmoRM on paper model `model` (a config_lib.MODELS key), before the method."""
  c = cl.paper_base()   # GRPO of both papers: B 32 x G 8, lr 1e-6, clip 0.2 / 0.28, rollout T 1
  cl.set_model(c, model)                             # hub id, fp32, tensor-parallel mesh
  c.total_steps = cl.epochs_to_steps(TRAIN_PROMPTS, 3)  # three epochs (~953 steps)
  # Training data and prompts
  c.data.name = "helpsteer2"                         # unique HelpSteer2 prompts, chat turns
  c.data.template = "helpsteer2"                     # no extra instruction
  c.data.max_prompt_len = 4096                       # some prompts hold long documents
  c.rollout.max_new_tokens = 512                     # max completion length 512
  c.optim.num_micro_batches = FITTED_MICRO_BATCHES.get(model, c.optim.num_micro_batches)
  # The static sampler prefills all 256 prompts of 4,096 tokens at once: 213 GB per chip for
  # Llama-3.1-8B on v5p-16 (compiled), over 137 GB of attention scores alone for Qwen3-4B on
  # v5p-8. The continuous engine prefills M = slots / 8 at a time (launch/check.py, compiled):
  c.rollout.engine = "continuous"                    # slot pool instead of one static batch
  c.rollout.slots = {"llama3_1_8b_instruct": 192,    # 80.5 GB per chip at its peak (step)
                     "qwen3_4b": 96}[model]          # 72.3 GB per chip at its peak (shrink)
  # Rewards: one ArmoRM-Llama3-8B-v0.1 scorer shared by the three channels
  c.rewards.channels = CHANNELS                      # helpfulness, correctness, coherence
  rm = dict(rescale="helpsteer",                     # rating / 4 in [0, 1] (App. B.2; project map)
            dtype="bfloat16",                        # the 8B scorer in bf16 (inference only)
            mesh=dict(cl.MODELS[model].mesh))        # sharded over the policy's devices
  c.rewards.params = {ch: ml_collections.ConfigDict(rm) for ch in CHANNELS.split(",")}  # copies
  c.rewards.timeout_s = 300.0                        # first call loads and compiles the RM
  # Final evaluation
  c.data.eval_split = "validation"                   # held-out HelpSteer2 prompts
  c.eval.num_prompts = 256                           # the first 256 of them
  c.eval.samples_per_prompt = 1                      # one response per prompt
  c.eval.temperature = 0.0                           # greedy (App. B.1)
  return c


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/amrp_align.py")
  model = MODEL_KEYS[a["model"]]
  c = base_config(model)
  cl.amrp_method(c, a["method"])                     # aggregator; base: 0 steps (eval only)
  cl.set_lora(c, int(a["lora"]))                     # LoRA RL (lora > 0): adapters only
  return cl.runlocal(c, model) if a["runlocal"] else c


def sweep(arg=None):
  swept = {k: v for k, v in CHOICES.items() if k != "lora"}  # the sweep keeps lora=0
  return cl.restrict(cl.grid(**swept), arg, CHOICES, "configs/amrp_align.py")
