"""The τ²-bench dialogue env: a τ² orchestrator whose agent and user are the two seats."""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar


from simpop.envs.dialogue import NESTED_TOO_DEEP, NOT_UNICODE, DialogueEnv, Outcome, TextSpace, Turn, is_unicode
from simpop.envs.tau2 import domains as t2
from simpop.envs.tau2.scenario import Tau2Scenario
from simpop.envs.tau2.tool_calls import ParsedAction, ToolCallError, format_tool_call, parse_action

log = logging.getLogger(__name__)

#: Tau2Env's default ``max_steps`` and ``max_errors`` (τ²'s own defaults are the same numbers).
DEFAULT_MAX_STEPS, DEFAULT_MAX_ERRORS = 100, 10


class _SeatAgent(t2.BaseAgent):
    """τ²'s agent participant: sends the message the env was given (τ²'s gym-agent stop rules)."""

    def __init__(self) -> None:
        self.pending: t2.AssistantMessage | None = None

    def generate_next_message(self, message, state):
        reply, self.pending = self.pending, None
        return reply, state

    def get_init_state(self, message_history=None):
        return None

    def stop(self, message=None, state=None) -> None:
        pass

    @classmethod
    def is_stop(cls, message) -> bool:
        return t2.GymAgent.is_stop(message)

    def set_seed(self, seed: int) -> None:
        pass


class _SeatUser(t2.BaseUser):
    """τ²'s user participant: sends the message the env was given (τ²'s user stop tokens)."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: t2.UserMessage | None = None

    def generate_next_message(self, message, state):
        reply, self.pending = self.pending, None
        return reply, state

    def get_init_state(self, message_history=None):
        return None

    @classmethod
    def is_stop(cls, message) -> bool:
        return t2.UserSimulator.is_stop(message)

    def set_seed(self, seed: int) -> None:
        pass


class Tau2Env(DialogueEnv):
    """τ²-bench: a customer-service agent (the policy) and a customer (the user simulator).

    A τ² ``Orchestrator`` runs the episode, so message flow, tool execution, stop tokens and error
    counting are τ²'s own; each seat's action becomes the message τ²'s agent or user sends.

    Actions are text: a message to the other seat, or tool calls (see
    :mod:`simpop.envs.tau2.tool_calls`). A tool call runs against the domain's environment, its result
    comes back to the caller, and the caller acts again; a message passes the turn. The agent always
    has tools (plus τ²'s gym ``done`` tool); the user has tools only in telecom (dual control).
    A tool that fails (unknown tool, bad arguments) returns τ²'s ``"Error: ..."`` result and counts
    towards ``max_errors``; text that attempts a tool call but cannot be parsed, an empty message or
    an overlong one is rejected (``info[seat]["invalid_action"]``) and the seat acts again.

    Observations are :meth:`~simpop.envs.dialogue.DialogueEnv.text_observation` JSON with two extra
    fields: ``instructions`` (the seat's system prompt: :meth:`Tau2Scenario.policy_instructions` or
    :meth:`Tau2Scenario.user_instructions`) and ``tools`` (OpenAI function schemas; empty for a user
    without tools). In ``messages`` a seat's own turns are ``assistant`` (as it wrote them), its tool
    results follow as ``tool`` messages, and the other seat's messages are ``user``; the other seat's
    tool calls are not shown.

    The episode ends (``terminated``) when τ² says it does: the user sends ``###STOP###``,
    ``###TRANSFER###`` or ``###OUT-OF-SCOPE###``; the agent sends ``###STOP###`` or calls ``done``;
    tool errors reach ``max_errors``. It also ends, with τ²'s ``user_error`` termination, when the user
    seat sends the same message ``max_user_repeats`` times in a row or has ``max_user_errors``
    consecutive actions rejected (a looping or broken user model, common at temperature 0); the final
    info then says ``user_repeats`` or ``user_errors``. A step whose tool calls failed lists the
    errors in the caller's ``info[seat]["tool_errors"]``.
    ``truncated`` means ``max_steps`` seat actions were taken first.

    Reward: τ²'s evaluator (``evaluate_simulation``, default evaluation ``ALL``; with ``nl_judge``,
    ``ALL_WITH_NL_ASSERTIONS``) on the finished trajectory, given to both seats; the final info holds
    the components (``reward_breakdown``, ``db_match``, per-check lists, ``termination_reason``) and
    ``success`` (reward 1, τ²'s pass criterion). After the episode, :meth:`simulation_run` returns it as
    τ²'s ``SimulationRun`` (messages, termination reason, reward info), the record τ²'s results files hold.

    Args:
        domain: ``"mock"``, ``"airline"``, ``"retail"``, ``"telecom"`` or ``"telecom-workflow"`` (telecom's
            tasks under τ²'s workflow tech-support policy).
        split: A task split τ² defines for the domain: ``"base"``, ``"train"``, ``"test"`` (airline,
            retail, telecom); ``"small"`` (20 tasks), ``"full"`` (2285) (telecom); ``"base"`` (mock).
            None: τ²'s default task set (``"base"``; mock: every task). Anything else is refused with
            a message that lists the domain's splits.
        max_steps: Seat actions (rejected ones included) before the episode is truncated; τ²'s own
            ``max_steps`` also counts each tool result, so 100 here is about τ²'s 100–200.
        max_errors: Failed tool calls that end the episode (τ²'s ``max_errors``).
        max_user_repeats: Identical consecutive user messages that end the episode (None: never).
        max_user_errors: Consecutive rejected user actions that end the episode (None: never).
        max_action_chars: Longest accepted action.
        nl_judge: A litellm model name (e.g. ``"simpop/judge"``, see
            :mod:`simpop.envs.tau2.litellm_provider`) that judges τ²'s natural-language assertions.
            None (τ²'s default evaluation) skips them.
        render_mode: ``"ansi"`` or ``"human"``.
    """

    metadata: ClassVar[dict[str, Any]] = {**DialogueEnv.metadata, "name": "tau2_v0"}
    policy_seat: ClassVar[str] = "agent"
    user_seat: ClassVar[str] = "user"
    first_seat: ClassVar[str] = "user"

    def __init__(self, domain: str = "mock", split: str | None = None, max_steps: int = DEFAULT_MAX_STEPS,
                 max_errors: int = DEFAULT_MAX_ERRORS,
                 max_user_repeats: int | None = 5, max_user_errors: int | None = 3, max_action_chars: int = 8192,
                 nl_judge: str | None = None, render_mode: str | None = None):
        for name, value, least in (("max_errors", max_errors, 1), ("max_user_repeats", max_user_repeats, 2),
                                   ("max_user_errors", max_user_errors, 1), ("max_action_chars", max_action_chars, 1)):
            if value is not None and value < least:
                raise ValueError(f"{name} must be >= {least}, got {value}")
        self.domain = domain
        self.split = split
        self.max_errors = max_errors
        self.max_user_repeats = max_user_repeats
        self.max_user_errors = max_user_errors
        self.max_action_chars = max_action_chars
        self.nl_judge = nl_judge
        self._ids = t2.domain(domain).task_ids(split)
        if not self._ids:
            raise ValueError(f"τ² domain {domain!r} split {split!r} has no tasks")
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        self.orchestrator: t2.Orchestrator | None = None
        self.reward_info: t2.RewardInfo | None = None
        self._simulation: t2.SimulationRun | None = None

    # ----------------------------------------------------------------- DialogueEnv hooks
    def _make_spaces(self):
        obs = TextSpace(max_length=2**26)
        act = TextSpace(max_length=self.max_action_chars)
        return {a: obs for a in self.possible_agents}, {a: act for a in self.possible_agents}

    def scenario_ids(self) -> list[str]:
        return list(self._ids)

    def load_scenario(self, scenario_id: str) -> Tau2Scenario:
        d = t2.domain(self.domain)
        return Tau2Scenario.from_task(d, d.tasks[scenario_id])

    def persona_set(self, name: str) -> tuple[str, ...]:
        """Named user-persona sets for simulator specs (``personas=NAME``): ``written-<sha>``, personas an LLM
        wrote from lost dialogues (:mod:`.failures`)."""
        from simpop.envs.tau2.failures import persona_set

        return persona_set(name)

    def _start(self) -> None:
        d = t2.domain(self.domain)
        self._agent, self._user = _SeatAgent(), _SeatUser()
        self.orchestrator = t2.Orchestrator(domain=d.name, agent=self._agent, user=self._user,
                                            environment=d.new_environment(), task=self.scenario.task,
                                            max_errors=self.max_errors)
        self.orchestrator.initialize()
        if self.orchestrator.to_role == t2.Role.ENV:  # a task history that ends with a pending tool call
            self.orchestrator.step()
        self.transcript = _history_turns(self.orchestrator.trajectory)
        self.to_act = self._seat_of(self.orchestrator.to_role)
        self.reward_info = None
        self._simulation = None
        self._start_time, self._clock = t2.get_now(), time.perf_counter()
        self._termination: t2.TerminationReason | None = None
        self._termination_info: dict[str, Any] = {}
        self._outcome_cache: Outcome | None = None
        self._parsed: ParsedAction | None = None
        self._calls = 0
        self._last_user_text: str | None = None
        self._user_repeats = 0
        self._user_rejections = 0
        self._step_info: dict[str, dict[str, Any]] = {}

    def step(self, actions: dict[str, Any]):
        """The base's step, with failed tool calls (``tool_errors``) added to the acting seat's info."""
        self._step_info = {}
        observations, rewards, terminations, truncations, infos = super().step(actions)
        for seat, flags in self._step_info.items():
            if seat in infos:
                infos[seat].update(flags)
        return observations, rewards, terminations, truncations, infos

    def _seat_of(self, role: t2.Role) -> str:
        """The seat that plays τ²'s orchestrator role ``role``."""
        return self.policy_seat if role == t2.Role.AGENT else self.user_seat

    def _seat_has_tools(self, seat: str) -> bool:
        return seat == self.policy_seat or self.scenario.user_tools is not None

    def _validate(self, seat: str, action: Any) -> str | None:
        error = self._check(seat, action)
        if seat == self.user_seat:
            # Counted here because a rejected action never reaches _apply.
            self._user_rejections = self._user_rejections + 1 if error else 0
            if error and self.max_user_errors is not None and self._user_rejections >= self.max_user_errors:
                self._end(t2.TerminationReason.USER_ERROR, user_errors=self._user_rejections)
        return error

    def _check(self, seat: str, action: Any) -> str | None:
        if not isinstance(action, str):
            return f"an action must be a string (a message or a tool call), got {type(action).__name__}"
        if not action.strip():
            return "empty message: write a message, or a tool call"
        if len(action) > self.max_action_chars:
            return f"message too long ({len(action)} > {self.max_action_chars} characters); write a shorter one"
        if not is_unicode(action):
            return NOT_UNICODE
        if not self._seat_has_tools(seat):
            self._parsed = ParsedAction(content=action)
            return None
        try:
            self._parsed = parse_action(action)
        except ToolCallError as e:
            return f"invalid tool call: {e}"
        except RecursionError:  # JSON nested thousands deep
            return NESTED_TOO_DEEP
        return None

    def _apply(self, seat: str, action: str) -> str:
        parsed, self._parsed = self._parsed, None
        assert parsed is not None and self.orchestrator is not None
        orch = self.orchestrator
        role = "assistant" if seat == self.policy_seat else "user"
        calls = [t2.ToolCall(id=f"call_{self._calls + i}", name=c.name, arguments=c.arguments, requestor=role)
                 for i, c in enumerate(parsed.tool_calls)]
        self._calls += len(calls)
        data: dict[str, Any] = {}
        if calls:
            data["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]
        if seat == self.policy_seat:
            if any(c.name == t2.GymAgent.STOP_FUNCTION_NAME for c in calls):
                # τ²'s gym agent turns a call to `done` into its stop message.
                message = t2.AssistantMessage(role="assistant", content=t2.GymAgent.STOP_TOKEN)
            else:
                message = t2.AssistantMessage(role="assistant", content=parsed.content, tool_calls=calls or None)
            self._agent.pending = message
        else:
            self._user.pending = t2.UserMessage(role="user", content=parsed.content, tool_calls=calls or None)
            self._count_user_repeat(seat, None if calls else action.strip())
        orch.step()
        if orch.to_role == t2.Role.ENV:
            before = len(orch.trajectory)
            orch.step()
            results = [m for m in orch.trajectory[before:] if isinstance(m, t2.ToolMessage)]
            names = {c.id: c.name for c in calls}
            data["tool_results"] = [{"id": m.id, "name": names.get(m.id, ""), "content": m.content or "",
                                     "error": m.error} for m in results]
            failed = [r["content"] for r in data["tool_results"] if r["error"]]
            if failed:
                self._step_info.setdefault(seat, {})["tool_errors"] = failed
            if orch.num_errors >= self.max_errors:
                self._end(t2.TerminationReason.TOO_MANY_ERRORS)
        act = "stop" if orch.done else ("tool_call" if calls else "message")
        self.transcript.append(Turn(seat, action, act=act, data=data))
        return self._seat_of(orch.to_role)

    def _count_user_repeat(self, seat: str, text: str | None) -> None:
        """Count identical consecutive user messages (tool calls do not count and do not reset)."""
        if text is None:
            return
        self._user_repeats = self._user_repeats + 1 if text == self._last_user_text else 1
        self._last_user_text = text
        if self.max_user_repeats is not None and self._user_repeats >= self.max_user_repeats:
            self._end(t2.TerminationReason.USER_ERROR, user_repeats=self._user_repeats)

    def _end(self, reason: t2.TerminationReason, **why: Any) -> None:
        """End the episode for a reason τ²'s orchestrator checks outside ``step`` (``why`` goes to the final info)."""
        self._termination = reason
        self._termination_info = why

    def _outcome(self) -> Outcome | None:
        assert self.orchestrator is not None
        # τ²'s own stop (checked first in τ²'s run loop) wins over the limits checked after it.
        reason = (self.orchestrator.termination_reason if self.orchestrator.done else None) or self._termination
        return None if reason is None else self._evaluate(reason)

    def _truncated_outcome(self) -> Outcome:
        return self._evaluate(t2.TerminationReason.MAX_STEPS)

    def _observe(self, seat: str):
        scenario: Tau2Scenario = self.scenario
        if seat == self.policy_seat:
            return self.text_observation(seat, instructions=scenario.policy_instructions(), tools=scenario.agent_tools)
        return self.text_observation(seat, instructions=scenario.user_instructions(), tools=scenario.user_tools or [])

    def chat_view(self, seat: str) -> list[dict[str, str]]:
        """Chat from ``seat``'s side: own turns as written plus their tool results; the other seat's messages."""
        messages: list[dict[str, str]] = []
        for turn in self.transcript:
            if turn.seat == seat:
                messages.append({"role": "assistant", "content": turn.text})
                messages += [{"role": "tool", "name": r["name"], "content": r["content"]}
                             for r in turn.data.get("tool_results", ())]
            elif "tool_calls" not in turn.data:
                messages.append({"role": "user", "content": turn.text})
        return messages

    # ----------------------------------------------------------------- reward
    def _evaluate(self, reason: t2.TerminationReason) -> Outcome:
        if self._outcome_cache is not None:
            return self._outcome_cache
        assert self.orchestrator is not None
        d = t2.domain(self.domain)
        task = self.scenario.task
        run = t2.SimulationRun(id=f"simpop/{d.name}/{task.id}/seed-{self.user_seed}", task_id=task.id,
                               start_time=self._start_time, end_time=t2.get_now(),
                               duration=time.perf_counter() - self._clock, termination_reason=reason,
                               messages=self.trajectory(), seed=self.user_seed)
        info: dict[str, Any] = {"termination_reason": reason.value, "num_tool_errors": self.orchestrator.num_errors,
                                **self._termination_info}
        result = None
        if self.nl_judge is not None:
            try:
                result = _with_nl_judge(self.nl_judge, lambda: t2.evaluate(
                    d, task, run, t2.EvaluationType.ALL_WITH_NL_ASSERTIONS))
            except Exception as e:  # a judge that is not a τ² judge (non-JSON reply, ...) must not end training
                log.warning("τ² NL-assertion judging failed on task %s (%s); using the default evaluation", task.id, e)
                info["nl_judge_error"] = f"{type(e).__name__}: {e}"
        if result is None:
            try:
                result = t2.evaluate(d, task, run)
            except Exception as e:  # e.g. a trajectory τ²'s replay rejects; scored 0, logged, never raised
                log.warning("τ²'s evaluator failed on task %s (%s); reward 0", task.id, e)
                info["evaluation_error"] = f"{type(e).__name__}: {e}"
        self.reward_info = result
        reward = float(result.reward) if result is not None else 0.0
        # τ²'s record of a run its evaluator could not score: reward 0 with the reason (as τ²'s own skipped runs).
        run.reward_info = result if result is not None else t2.RewardInfo(
            reward=0.0, reward_basis=None, info={"evaluation_error": info["evaluation_error"]})
        self._simulation = run
        info.update(reward=reward, success=t2.is_successful(reward), **(_components(result) if result is not None else {}))
        self._outcome_cache = Outcome({a: reward for a in self.possible_agents}, info)
        return self._outcome_cache

    def trajectory(self) -> list[t2.Message]:
        """The episode as τ² messages, exactly what τ²'s evaluator receives."""
        assert self.orchestrator is not None, "call reset() first"
        return self.orchestrator.get_trajectory()

    def simulation_run(self, trial: int | None = None) -> t2.SimulationRun:
        """The finished episode as τ²'s ``SimulationRun``: what τ²'s evaluator scored, with its ``RewardInfo``.

        It holds the task id, the τ² messages, the termination reason, the reward info (the env's reward
        is ``reward_info.reward``), start and end times and the user seat's seed (``seed``); its id is
        ``simpop/<domain>/<task>/seed-<user seed>``. Collect one per episode and hand them to
        :func:`simpop.envs.tau2.results.write_tau2_results` for a results file τ²'s tooling reads.

        Args:
            trial: The trial number to record (τ²'s ``--num-trials`` index), or None.

        Returns:
            A copy: later episodes do not change it.

        Raises:
            RuntimeError: No episode has ended since the last reset.
        """
        if self._simulation is None:
            raise RuntimeError("simulation_run() needs a finished episode: step until terminated or truncated "
                               "(after reset() the new episode has not ended yet)")
        if trial is not None and (isinstance(trial, bool) or not isinstance(trial, int) or trial < 0):
            raise ValueError(f"trial must be a non-negative int or None, got {trial!r}")
        return self._simulation.model_copy(deep=True, update={"trial": trial})


def _with_nl_judge(model: str, evaluate):
    """Run ``evaluate`` with τ²'s hard-wired NL-assertion judge model routed to ``model`` (a litellm alias)."""
    import litellm

    aliases = litellm.model_alias_map
    previous = aliases.get(t2.DEFAULT_LLM_NL_ASSERTIONS)
    aliases[t2.DEFAULT_LLM_NL_ASSERTIONS] = model
    try:
        return evaluate()
    finally:
        if previous is None:
            aliases.pop(t2.DEFAULT_LLM_NL_ASSERTIONS, None)
        else:
            aliases[t2.DEFAULT_LLM_NL_ASSERTIONS] = previous


def _components(result: t2.RewardInfo) -> dict[str, Any]:
    """The reward's parts as plain values (for ``info``)."""
    return {
        "reward_basis": [b.value for b in result.reward_basis or ()],
        "reward_breakdown": {k.value: float(v) for k, v in (result.reward_breakdown or {}).items()},
        "db_match": None if result.db_check is None else bool(result.db_check.db_match),
        "env_assertions_met": [bool(c.met) for c in result.env_assertions or ()],
        "actions_matched": [bool(c.action_match) for c in result.action_checks or ()],
        "communicate_met": [bool(c.met) for c in result.communicate_checks or ()],
        "nl_assertions_met": None if result.nl_assertions is None else [bool(c.met) for c in result.nl_assertions],
    }


def _history_turns(messages: list) -> list[Turn]:
    """Transcript turns for a task's initial message history (τ²'s greeting when it has none)."""
    turns: list[Turn] = []
    for m in messages:
        if isinstance(m, t2.ToolMessage):
            turn = turns[-1]
            names = {c["id"]: c["name"] for c in turn.data["tool_calls"]}
            turn.data.setdefault("tool_results", []).append(
                {"id": m.id, "name": names.get(m.id, ""), "content": m.content or "", "error": m.error})
            continue
        seat = "agent" if m.role == "assistant" else "user"
        data: dict[str, Any] = {"history": True}
        if m.is_tool_call():
            data["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls]
            text = "".join(format_tool_call(c.name, c.arguments) for c in m.tool_calls)
            text = f"{m.content}\n{text}" if m.has_text_content() else text
        else:
            text = m.content or ""
        turns.append(Turn(seat, text, act="tool_call" if m.is_tool_call() else "message", data=data))
    return turns
