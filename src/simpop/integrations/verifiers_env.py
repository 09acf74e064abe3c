"""A simpop text env as a verifiers v1 environment: both seats are verifiers agents, the user seat trainable or not.

verifiers (``pip install 'simpop[verifiers]'``; it pins ``mcp==2.0.0`` where ``openenv`` needs ``mcp<2``, so
``make verifiers-env`` gives it a ``.venv-verifiers`` of its own) runs an environment as a taskset plus an
``Env.run(task, agents)`` that drives agents turn by turn. Here:

- :class:`SimpopTaskset`: one task per scenario of the env (``env.scenario_ids()``), with the reset seed;
- :class:`SimpopEnv`: two roles, ``policy`` and ``user`` (each its own model, endpoint and trace). ``run`` steps the
  real simpop env: the seat to act gets, as its next user message, what the other seat said since its last turn
  (plus the env's rejection note or closing-survey question, as simpop's own LLM seats see them), and its reply is
  the seat's action. Each seat's system prompt is its ``instructions`` from the text observation.
- Rewards go through the traces: each agent's trace records ``outcome`` (the env's reward for its seat) and metrics
  (``donation``, ``turns``, ``invalid_actions``; P4G's ``donated``), plus ``trace.info["simpop"]``.
- ``user_simulator`` names the simulator kind the user agent stands for (a simpop spec): ``trainable:...`` makes
  ``agents.user.trainable`` True (prime-rl then trains on its tokens too), any other kind False.
- :class:`SimpopChatHarness` (the taskset's bundled harness): verifiers' own tool-less chat program (the ``null``
  harness's), run with this interpreter, which has the program's dependencies (they are verifiers' own), instead
  of ``uv sync``-ing them from PyPI at every start; pin ``harness={"id": "null"}`` on a role to use uv instead.

The plugin id is ``simpop-verifiers`` (verifiers imports tasksets, envs and harnesses by top-level module name;
``simpop_verifiers`` re-exports this module). ``evaluate`` runs episodes in-process; ``python -m
simpop.integrations.verifiers_env`` does it from the command line (``docs/integrations/verifiers.md``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import verifiers.v1 as vf
    from verifiers.v1.harnesses.null import NullHarness
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("simpop.integrations.verifiers_env needs verifiers (Python >= 3.11): "
                      "pip install 'simpop[verifiers]', or `make verifiers-env`") from error

import simpop
from simpop.envs.dialogue import DialogueEnv, TextSpace
from simpop.integrations.turns import instructions, next_message
from simpop.seat import SimulatorSpec
from simpop.user_input import ArgumentParser, integer

#: The plugin id verifiers loads this taskset, env and harness by.
PLUGIN_ID = "simpop-verifiers"


class SimpopTasksetConfig(vf.TasksetConfig):
    """Which simpop env the tasks come from."""

    id: str = PLUGIN_ID
    env_id: str = "simpop/Persuasion-v1"
    env_kwargs: dict[str, Any] = {}
    seed: int = 0
    """Task ``i`` resets the env with seed ``seed + i``."""


class SimpopData(vf.TaskData):
    """One simpop episode: env, scenario and reset seed."""

    env_id: str
    scenario_id: str
    seed: int
    env_kwargs: dict[str, Any] = {}


class SimpopTask(vf.Task[SimpopData, vf.State, vf.TaskConfig]):
    """A simpop scenario (scoring happens in :meth:`SimpopEnv.run`, through the traces)."""


class SimpopTaskset(vf.Taskset[SimpopTask, SimpopTasksetConfig]):
    """One task per scenario of ``env_id``, in the env's order."""

    def load(self) -> Iterator[SimpopTask]:
        """The tasks: scenario ``i`` of the env (its ``scenario_ids()`` order) with reset seed ``seed + i``."""
        env = _make(self.config.env_id, self.config.env_kwargs)
        for i, scenario_id in enumerate(env.scenario_ids()):
            yield SimpopTask(SimpopData(id=scenario_id, name=f"{self.config.env_id}:{scenario_id}",
                                        env_id=self.config.env_id, scenario_id=scenario_id,
                                        seed=self.config.seed + i, env_kwargs=self.config.env_kwargs),
                             self.config.task)


class SimpopEnvConfig(vf.EnvConfig):
    """The two seats as agents (tool-less chat on this machine by default) and the user's simulator kind."""

    taskset: SimpopTasksetConfig = SimpopTasksetConfig()
    policy: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    user: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    user_simulator: str = "frozen:smollm2"
    """The simpop simulator spec the user agent stands for; kind ``trainable`` makes it trainable."""


def user_is_trainable(spec: str) -> bool:
    """Whether the simulator ``spec`` names is co-trained (its kind is ``trainable``)."""
    return SimulatorSpec.parse(spec).kind == "trainable"


class SimpopEnv(vf.Env[SimpopEnvConfig]):
    """A simpop dialogue between the ``policy`` and ``user`` agents, stepped through the real simpop env."""

    async def setup(self, agents: vf.Agents) -> None:
        """Mark the ``user`` agent trainable when ``user_simulator``'s kind is ``trainable``."""
        agents.user.trainable = user_is_trainable(self.config.user_simulator)

    async def run(self, task: SimpopTask, agents: vf.Agents) -> None:
        """Play ``task``'s dialogue: the seat to act chats its next turn, its reply is the seat's action in the
        simpop env, until the env is done (or an agent's own limits end its run: the dialogue stops undecided).
        Each agent's trace gets its seat's reward as ``outcome``, the metrics, and ``info["simpop"]``."""
        data = task.data
        env = _make(data.env_id, data.env_kwargs)
        observations, _ = env.reset(seed=data.seed, options={"scenario_id": data.scenario_id})
        roles = {env.policy_seat: "policy", env.user_seat: "user"}
        seat_tasks = {seat: vf.Task(vf.TaskData(idx=data.idx, name=f"{data.name}:{seat}", prompt=None,
                                                system_prompt=instructions(observations[seat])))
                      for seat in roles}
        rewards = {seat: 0.0 for seat in roles}
        infos: dict[str, dict[str, Any]] = {seat: {} for seat in roles}
        invalid, stopped_by = 0, None
        async with (agents.policy.interaction(seat_tasks[env.policy_seat]) as policy,
                    agents.user.interaction(seat_tasks[env.user_seat]) as user):
            talk = {env.policy_seat: policy, env.user_seat: user}
            while not env.done:
                seat = env.to_act
                assert seat is not None  # a live dialogue always has a seat to act
                segment = await talk[seat].turn(next_message(observations[seat]))
                if segment.terminated:  # the agent's own limits ended its run: the dialogue stops undecided
                    stopped_by = roles[seat]
                    break
                observations, rewards, _, _, infos = env.step({seat: segment.last_reply})
                invalid += "invalid_action" in infos[seat]
        summary = {"env_id": data.env_id, "scenario_id": data.scenario_id, "seed": data.seed,
                   "turns": len(env.transcript), "invalid_actions": invalid, "stopped_by": stopped_by,
                   "transcript": [{"seat": t.seat, "text": t.text} for t in env.transcript],
                   **{k: v for k, v in infos[env.policy_seat].items() if _plain(v)}}
        for seat, interaction in talk.items():
            trace = interaction.trace
            trace.record_reward("outcome", float(rewards.get(seat, 0.0)))
            trace.record_metrics({"turns": float(len(env.transcript)), "invalid_actions": float(invalid)})
            for key in ("donation", "donated"):
                if isinstance(summary.get(key), (bool, int, float)):
                    trace.record_metric(key, float(summary[key]))
            trace.info["simpop"] = {**summary, "seat": seat}


def _make(env_id: str, env_kwargs: dict[str, Any]) -> DialogueEnv:
    env = simpop.make(env_id, **env_kwargs)
    if not isinstance(env.observation_space(env.policy_seat), TextSpace):
        raise ValueError(f"{env_id} is not a text env (its observations are not text); verifiers agents chat, "
                         f"so use a text env such as simpop/Persuasion-v1")
    return env


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


# ----------------------------------------------------------------------------------------------- the harness
class _ThisInterpreter:
    """A local runtime whose PEP 723 scripts run with this Python instead of a ``uv sync``-ed environment."""

    def __init__(self, runtime: SubprocessRuntime):
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def prepare_uv_script(self, script: str | bytes, env: dict[str, str] | None = None, *,
                                activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = f"{self._runtime.scripts_dir}/{hashlib.sha256(data).hexdigest()}.py"
        if not await asyncio.to_thread(Path(path).is_file):
            await self._runtime.write(path, data)
        return [sys.executable, path]


class SimpopChatHarness(NullHarness):
    """verifiers' ``null`` harness (its tool-less chat program) run with this interpreter, on a local runtime."""

    @staticmethod
    def _local(runtime: Any) -> _ThisInterpreter:
        if not isinstance(runtime, SubprocessRuntime):
            raise TypeError(f"the {PLUGIN_ID} harness runs its chat program with this machine's Python, so it needs "
                            f"the subprocess runtime (got {type(runtime).__name__}); pin harness={{'id': 'null'}} "
                            f"on the role for other runtimes")
        return _ThisInterpreter(runtime)

    async def setup(self, runtime: Any) -> None:
        """The ``null`` harness's setup on ``runtime`` (a subprocess runtime; others are refused)."""
        await super().setup(self._local(runtime))

    async def launch(self, ctx: Any, trace: Any, runtime: Any, *args: Any, **kwargs: Any) -> vf.ProgramResult:
        """Run the ``null`` harness's chat program with this Python (no ``uv sync``)."""
        return await super().launch(ctx, trace, self._local(runtime), *args, **kwargs)


# ----------------------------------------------------------------------------------------------- running it
def env_config(policy_url: str, user_url: str, policy_model: str = "policy", user_model: str = "user",
               user_simulator: str = "frozen:smollm2", env_id: str = "simpop/Persuasion-v1",
               env_kwargs: dict[str, Any] | None = None, max_tokens: int = 64, temperature: float = 1.0,
               api_key_var: str = "SIMPOP_API_KEY") -> SimpopEnvConfig:
    """A :class:`SimpopEnvConfig` with each seat on its own OpenAI-compatible endpoint (e.g. ``simpop serve``)."""
    sampling = vf.SamplingConfig(max_tokens=max_tokens, temperature=temperature)

    def agent(url: str, model: str) -> vf.AgentConfig:
        return vf.AgentConfig(model=model, client=vf.EvalClientConfig(base_url=url, api_key_var=api_key_var),
                              sampling=sampling, runtime=vf.SubprocessConfig())

    return SimpopEnvConfig(taskset=SimpopTasksetConfig(env_id=env_id, env_kwargs=env_kwargs or {}),
                           policy=agent(policy_url, policy_model), user=agent(user_url, user_model),
                           user_simulator=user_simulator)


async def evaluate(config: SimpopEnvConfig, episodes: int = 1) -> list[vf.Episode]:
    """Run the first ``episodes`` tasks of the taskset, one after another; returns the verifiers episodes."""
    env = SimpopEnv(config)
    ctx = vf.ModelContext(model=config.policy.model or "policy", client=config.policy.client or vf.EvalClientConfig())
    results = []
    async with env.serving():
        for task in env.taskset.take(episodes):
            results.append(await env.run_episode(task, ctx))
    return results


def summarise(episode: vf.Episode) -> dict[str, Any]:
    """One JSON-able record per episode: ok/errors and, per agent trace, reward, rewards, metrics, trainable and
    the chat it saw."""
    return {"ok": episode.ok, "errors": [f"{e.type}: {e.message}" for e in episode.errors],
            "traces": {t.agent.name: {"reward": t.reward, "rewards": {k: r.value for k, r in t.rewards.items() if r},
                                      "metrics": dict(t.metrics), "trainable": t.agent.trainable,
                                      "num_turns": t.num_turns, "simpop": t.info.get("simpop"),
                                      "messages": [m.model_dump(mode="json", include={"role", "content"})
                                                   for m in t.messages]}
                       for t in episode.traces}}


def main(argv: list[str] | None = None) -> int:
    """``python -m simpop.integrations.verifiers_env``: play ``--episodes`` episodes and print one JSON line each
    (:func:`summarise`); bad arguments print one line and return 2."""
    parser = ArgumentParser(prog="python -m simpop.integrations.verifiers_env",
                            description="Play simpop episodes as a verifiers environment; prints JSON lines.")
    parser.add_argument("--policy-url", required=True, help="OpenAI-compatible base URL of the policy's model")
    parser.add_argument("--user-url", required=True, help="OpenAI-compatible base URL of the user's model")
    parser.add_argument("--policy-model", default="policy")
    parser.add_argument("--user-model", default="user")
    parser.add_argument("--user-simulator", default="frozen:smollm2", help="simulator spec the user agent stands for")
    parser.add_argument("--env", default="simpop/Persuasion-v1")
    parser.add_argument("--env-kwargs", default="{}", help="JSON object of env arguments, e.g. '{\"max_turns\": 2}'")
    parser.add_argument("--episodes", type=integer(1, 100_000), default=1)
    parser.add_argument("--max-tokens", type=integer(1, 1_000_000), default=64)
    args = parser.parse_args(argv)
    try:
        env_kwargs = json.loads(args.env_kwargs)
        if not isinstance(env_kwargs, dict):
            raise ValueError("--env-kwargs must be a JSON object")
        SimulatorSpec.parse(args.user_simulator)
        _make(args.env, env_kwargs)
    except (ValueError, KeyError, TypeError) as error:
        print(f"error: {str(error).strip(chr(34))}", file=sys.stderr)
        return 2
    config = env_config(args.policy_url, args.user_url, args.policy_model, args.user_model, args.user_simulator,
                        args.env, env_kwargs, args.max_tokens)
    for episode in asyncio.run(evaluate(config, args.episodes)):
        print(json.dumps(summarise(episode)))
    return 0


if __name__ == "__main__":
    # verifiers resolves the plugin's classes through `simpop_verifiers`, i.e. this module under its own name.
    from simpop.integrations.verifiers_env import main as _main

    sys.exit(_main())
