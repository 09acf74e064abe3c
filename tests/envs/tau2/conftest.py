"""Import τ² through simpop first, so that litellm never tries to download its cost map in these tests."""

import simpop.envs.tau2.domains  # noqa: F401  (sets LITELLM_LOCAL_MODEL_COST_MAP before tau2 imports litellm)
