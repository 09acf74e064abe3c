"""CooperBench in simpop: two coding agents, one feature each; success = both features' tests pass on the merge.

Env ids: ``simpop/CooperBench-mini-v0`` (the packaged mini task set, offline, seconds per episode) and
``simpop/CooperBench-v0`` (the real benchmark: ``dataset=`` its ``dataset/`` folder, ``repos=`` the
repository checkouts at their base commits). Seats: ``agent1`` (policy) and ``agent2`` (teammate).

Modules, each documented in its docstring:

- :mod:`~simpop.envs.cooperbench.dataset`: the dataset layout, feature pairs (scenarios), subsets.
- :mod:`~simpop.envs.cooperbench.evaluator`: upstream's merge-and-test evaluation and its conflict rule.
- :mod:`~simpop.envs.cooperbench.sandbox`: containment of every process (time, output, memory,
  processes, network, filesystem).
- :mod:`~simpop.envs.cooperbench.patches`: patch parsing, test-file stripping, path safety.
- :mod:`~simpop.envs.cooperbench.actions`: the JSON action language.
- :mod:`~simpop.envs.cooperbench.env`: the two-seat env (turn order, observations, reward).
- :mod:`~simpop.envs.cooperbench.teammates`: scripted (gold patch, failure modes) and LLM teammates.
- :mod:`~simpop.envs.cooperbench.validate`: ``python -m simpop.envs.cooperbench.validate`` checks a
  dataset (base fails, gold passes, combined passes, which gold pairs conflict).

The mini set (``mini/``) has three stdlib-only tasks (``textkit``, ``kvstore``, ``calc``) of four
features each, in the upstream layout plus a ``repo/`` folder holding each repository at its base.
In every task, features 1 and 2 edit the same lines on purpose, and so do features 3 and 4; the
other four pairs merge cleanly.
"""
