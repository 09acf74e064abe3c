"""simpop environments: one folder per benchmark, registered by id (see :func:`ids`)."""

from simpop.envs.registration import EnvSpec, ids, make, register, spec

__all__ = ["EnvSpec", "ids", "make", "register", "spec"]
