"""CooperBench in simpop: two coding agents, one feature each; success = both features' tests pass on the merge.

Env ids: ``simpop/CooperBench-mini-v0`` (the packaged mini task set, offline, seconds per episode) and
``simpop/CooperBench-v0`` (the real benchmark: ``dataset=`` its ``dataset/`` folder, ``repos=`` the
repository checkouts at their base commits). Seats: ``agent1`` (policy) and ``agent2`` (teammate).

Modules (env, scenario, simulators, then data; each documented in its docstring):

- :mod:`~simpop.envs.cooperbench.env`: the two-seat env (turn order, observations, reward).
- :mod:`~simpop.envs.cooperbench.scenario`: the scenario, :class:`FeaturePair` (two features of one
  task), and the task and feature types it is made of.
- :mod:`~simpop.envs.cooperbench.simulators`: the native teammates (scripted: gold patch, failure modes)
  and the text format LLM teammates play through.
- :mod:`~simpop.envs.cooperbench.dataset`: the dataset layout and its loader (tasks, feature pairs, subsets).
- :mod:`~simpop.envs.cooperbench.actions`: the JSON action language.
- :mod:`~simpop.envs.cooperbench.patches`: patch parsing, stripping of test files and test
  infrastructure (``conftest.py``, pytest config, ``sitecustomize``, ``.pth``, plugins), path safety
  (including name and depth limits, so an over-long path is a rejected action, never a crash).
- :mod:`~simpop.envs.cooperbench.evaluator`: upstream's merge-and-test evaluation and its conflict
  rule; it runs each task's own ``run_tests.sh``/``runner.sh`` in the sandbox.
- :mod:`~simpop.envs.cooperbench.pytest_guard`: a pytest plugin loaded into every test run that
  records what really happened (sessions, per-test outcomes, tampering); a feature passes only if
  the script exits 0 *and* the guard saw finished sessions with passing tests and no tampering.
- :mod:`~simpop.envs.cooperbench.sandbox`: containment of every process (time, output, memory,
  processes, network, filesystem).
- :mod:`~simpop.envs.cooperbench.validate`: ``python -m simpop.envs.cooperbench.validate`` checks a
  dataset (base fails, gold passes, combined passes, which gold pairs conflict).

The mini set (``mini/``) has three stdlib-only tasks (``textkit``, ``kvstore``, ``calc``) of four
features each, in the upstream layout plus a ``repo/`` folder holding each repository at its base.
In every task, features 1 and 2 edit the same lines on purpose, and so do features 3 and 4; the
other four pairs merge cleanly.
"""
