"""The outer RL loop: groups of episodes per task, group-relative advantages, asynchronous
off-policy importance-sampling GRPO updates, checkpoints and resume."""
