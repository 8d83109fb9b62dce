"""mr_rl: multi-reward RL post-training of LLMs in JAX."""

__version__ = "0.1.0"
