"""Who writes jobs: the Policy protocol and its implementations (composer, lm, tinker, openai)."""
