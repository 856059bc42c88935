"""The artifact the agent writes: a training job directory (config, data, verifiers env)."""
