"""simpop.train: the run loop (:mod:`.loop`), GRPO and its variants (:mod:`.grpo`, :mod:`.objectives`), PPO,
co-training, checkpoints, the TRL adapter and ``simpop train`` (docs/architecture.md)."""
