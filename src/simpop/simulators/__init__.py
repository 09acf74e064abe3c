"""simpop.simulators: the generic simulator kinds (frozen LLM, verbalized, trainable LoRA), populations,
checkpoint pools and panels, and the registry that builds every simulator from its spec
(:mod:`.registry`; the contract is :mod:`simpop.seat`)."""
