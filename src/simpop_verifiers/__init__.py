"""The verifiers plugin ``simpop-verifiers`` (verifiers imports plugins by top-level module name); the code lives in
:mod:`simpop.integrations.verifiers_env`."""

from simpop.integrations.verifiers_env import SimpopChatHarness, SimpopEnv, SimpopTaskset

__all__ = ["SimpopChatHarness", "SimpopEnv", "SimpopTaskset"]
