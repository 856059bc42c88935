"""Training one job: GRPO trainer, sandboxed reward server, trusted hidden-eval scorer."""
