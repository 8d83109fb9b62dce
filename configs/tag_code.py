r"""TAG Table 2: code synthesis on DeepCoder with a fast (< 60 ms) or no-op (< 3 ms) auxiliary.

    python -m mr_rl.main --config=configs/tag_code.py:model=qwen3_4b,task=noop,method=tag \
        --workdir=$WORKDIR_ROOT/tag_code/model-qwen3_4b/task-noop/method-tag
    launch/pod.sh $TPU $ZONE configs/tag_code.py:model=qwen3_4b,task=fast,method=additive $WORKDIR
    python -m mr_rl.config_lib list configs/tag_code.py        # all 20 runs

Arguments: model = qwen3_1_7b | qwen3_4b (Instruct-2507); task = fast | noop; method = rp_only |
additive | dr_grpo | mo_grpo | tag;
lora = 0 (full fine-tuning, the paper's) | 8 | 16 | 32 | 64 (LoRA of that rank on every
attention and MLP kernel, alpha = 2 x rank, lr x 10: not a paper setting; the sweep keeps
lora=0); runlocal.
Rewards (mr_rl/rewards/code_channels.py): code_correct (every test passes in the sandbox,
10 s per test), code_fast (runtime < 60 ms) / code_noop (< 3 ms), one shared sandbox run per
response. Eval: n = 8 samples per test problem (unbiased pass@4). The DeepCoder-RT filter
(3,741 / 185 problems) is not in the summary; mr_rl.data's stdio-only rule is used.
`base_config` is also the set-up of the code rows of Table 4 (tag_drift).
TPU slice: v5p-8; the sandbox runs on the host CPUs (16 workers per host recommended).
Estimate: 179 v5p chip-hours for the default point (model=qwen3_4b,task=noop,method=tag,
probes included; sandbox time not included); whole table 2558.
"""

from mr_rl import config_lib as cl

CHOICES = {"model": ("qwen3_1_7b", "qwen3_4b"), "task": ("fast", "noop"),
           "method": ("rp_only", "additive", "dr_grpo", "mo_grpo", "tag"),
           "lora": cl.LORA_RANKS}
DEFAULTS = {"model": "qwen3_4b", "task": "noop", "method": "tag", "lora": "0"}

AUX = {"fast": "code_fast", "noop": "code_noop"}     # the auxiliary channel of each task
THRESHOLD_MS = {"fast": 60.0, "noop": 3.0}           # RA = 1 below this runtime


# optim.num_micro_batches per model on its slice, chosen by launch/check.py --fit.
FITTED_MICRO_BATCHES = {"qwen3_4b": 128}


def base_config(model: str, task: str):
  """DeepCoder with auxiliary `task` on paper model `model` (a config_lib.MODELS key), no method."""
  c = cl.paper_base()   # GRPO of both papers: 500 steps, B 32 x G 8, lr 1e-6, clip 0.2 / 0.28
  cl.set_model(c, model)                             # hub id, fp32, tensor-parallel mesh
  # Training data and prompts
  c.data.name = "deepcoder"                          # DeepCoder-Preview, stdio problems
  c.data.template = "tag_code"                       # one ```python block, stdin -> stdout
  c.data.max_prompt_len = 2048                       # problem statements with examples
  c.rollout.max_new_tokens = 4096                    # project choice (not in the summary)
  c.optim.num_micro_batches = FITTED_MICRO_BATCHES.get(model, c.optim.num_micro_batches)
  # The static sampler's cache for 256 x 6,144 tokens of Qwen3-4B is 58 GB per chip on v5p-8:
  # 98.3 GB at its peak by XLA:TPU (4% of HBM free). The continuous engine's pool of 160 slots
  # (launch/check.py --topology=v5p-8, 2026-12-06): step 76.2 GB, shrink 80.9 GB (21% free);
  # 192 slots left 9%. The 1.7B keeps the same pool (a smaller cache per slot).
  c.rollout.engine = "continuous"                    # slot pool instead of one static batch
  c.rollout.slots = 160
  # Rewards: RP = all tests pass; RA = runtime under the threshold (one shared sandbox run)
  c.rewards.channels = f"code_correct,{AUX[task]}"   # RP, RA
  c.rewards.params = {"code_correct": dict(timeout_s=10.0),  # 10 s per (small) test
                      AUX[task]: dict(timeout_s=10.0, threshold_ms=THRESHOLD_MS[task])}
  c.rewards.timeout_s = 600.0                        # one program's whole test run
  # Final evaluation: the test split (data.eval_split "test")
  c.eval.num_prompts = 185                           # DeepCoder-RT test size
  c.eval.samples_per_prompt = 8                      # n = 8 samples (unbiased pass@4)
  cl.tag_probes(c)                                   # TAG: 300-step probes, drift on 256 prompts
  return c


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/tag_code.py")
  c = base_config(a["model"], a["task"])
  cl.tag_method(c, a["method"], 2)
  cl.set_lora(c, int(a["lora"]))                     # LoRA RL (lora > 0): adapters only
  return cl.runlocal(c, a["model"]) if a["runlocal"] else c


def sweep(arg=None):
  swept = {k: v for k, v in CHOICES.items() if k != "lora"}  # the sweep keeps lora=0
  return cl.restrict(cl.grid(**swept), arg, CHOICES, "configs/tag_code.py")
