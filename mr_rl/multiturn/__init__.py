"""Multi-turn rollouts with tools and environments (docs/multiturn.md).

Modules: `env` (the environment protocol, `Turn`, `StepResult`, import paths), `tools` (tool
schemas from typed functions, call formats, `ToolEnv`), `builtin_tools` (`calculator`,
`python` in the reward sandbox), `render` (observations as chat-template token deltas),
`turn_slots` (the engine's slot programs plus `append`), `rollout` (`TurnRollout`: one slot
per trajectory across turns, host workers, limits and failures), `workers` (environment steps
on host threads or in worker processes), `trajectories` (the learner's rollout, trajectory
rewards, metrics) and `settings` (`config.multiturn`).
"""
