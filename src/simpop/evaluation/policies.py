"""Policy specs for ``simpop eval``: what plays the policy seat, named by a string.

:func:`load_policy` turns a spec into a policy the :class:`~simpop.rollout.RolloutEngine` can run:

=================================  ===========================================================================
``openai:BASE_URL#MODEL``          an OpenAI-compatible endpoint (vLLM, ``simpop serve``, an API), as an
                                   untracked :class:`TextPolicy`; the endpoint is probed once at load (an
                                   unreachable one is an error before any episode runs)
``vllm:BASE_URL#MODEL``            a running vLLM server (:class:`TextPolicy` on
                                   :class:`~simpop.agents.vllm_backend.VLLMBackend`), probed once at load
``vllm:PATH``                      a vLLM server launched on a model folder (or embedded name) for this run
``hf:PATH``, ``transformers:PATH`` a local HF model folder, in process (:class:`TextPolicy`)
``smollm2`` (an embedded name)     an embedded model, in process (:class:`TextPolicy`)
``run:DIR[@STEP]``                 a run folder (``simpop train``, or one run of ``simpop experiment collapse``,
                                   ``adaptive`` or ``monitor``): the policy its ``config.yaml`` describes with the
                                   newest checkpoint's weights (or step ``STEP``'s)
``reference``                      the benchmark's reference agent: P4G (act and text) a persuader playing
                                   :func:`~simpop.envs.persuasion.model.reference_persuader`'s act sequences; τ²
                                   :class:`~simpop.envs.tau2.simulators.GoldAgent` (the task's gold actions; it
                                   cannot solve the tasks that
                                   :func:`~simpop.envs.tau2.simulators.gold_unreachable` names);
                                   CooperBench a :class:`~simpop.envs.cooperbench.simulators.ScriptedTeammate`
                                   writing the policy seat's gold patch
``module:attr``                    any importable object with ``act_batch(observations, rng)`` (or a zero-argument
                                   factory returning one); an ``entropy(trajectories)`` method is optional
=================================  ===========================================================================

**Text policies** (:class:`TextPolicy`) turn each text observation into a chat: the observation's
``instructions`` as the system message, then its ``messages`` (the policy's own turns are ``assistant``;
tool results become ``user`` messages headed ``[tool result: NAME]`` so that any OpenAI-compatible server
takes them; consecutive messages of one role are merged), plus a note when the env rejected the last
action. Envs with their own :class:`~simpop.seat.TextFormat` (CooperBench's state + JSON action language,
``env.text_format``) are read through it instead, built for the policy seat (``type(fmt)(policy_seat)``);
its fallbacks (``unparsed_actions``) are counted in :attr:`TextPolicy.stats`. Each batched call is seeded
from the rollout's generator, so local models are reproducible. Text policies report no entropy (nan).

**Dialogue-aware policies** (reference agents, text policies on envs with a text format) need each
dialogue's env (its scenario, its seat). The rollout engine hands policies observations only, so the
runner tells them the envs of the next wave first (:func:`simpop.evaluation.panel.begin_wave`); the
engine asks the live dialogues whose turn it is in slot order, which is how an observation is matched
to its env (the count is checked on every call).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simpop import checkpoint
from simpop.agents.base import Chat, SamplingParams
from simpop.envs.dialogue import parse_observation

log = logging.getLogger(__name__)

#: One line per spec form, for error messages and ``--help``.
SPEC_FORMS = ("openai:BASE_URL#MODEL", "vllm:BASE_URL#MODEL", "vllm:PATH", "hf:PATH", "transformers:PATH", "an embedded model name (smollm2)",
              "run:DIR[@STEP]", "reference", "module:attr")
#: The default decoding of text policies (``simpop eval --temperature/--top-p/--max-new-tokens``).
DEFAULT_SAMPLING = SamplingParams(max_new_tokens=512, temperature=0.0)


class PolicySpecError(ValueError):
    """A policy spec that names nothing loadable (the message says why and lists what is supported)."""


def load_policy(spec: str, env: Any, *, env_id: str | None = None, sampling: SamplingParams | None = None,
                max_concurrency: int = 8, probe: bool = True) -> Any:
    """The policy ``spec`` names, ready for ``env``'s policy seat (see the module docstring for the forms).

    Args:
        spec: The policy spec.
        env: An env of the benchmark (sizes act-level policies, picks the reference agent).
        env_id: The env's registered id (compared with a run folder's env; logged when they differ).
        sampling: Decoding of text policies (default :data:`DEFAULT_SAMPLING`); run folders use their own.
        max_concurrency: Most requests in flight at once to an OpenAI-compatible endpoint.
        probe: Send one tiny request to an OpenAI-compatible endpoint now, so that an unreachable or wrong
            endpoint fails here (:class:`~simpop.agents.openai_backend.RemoteBackendError`) and not in
            every episode.

    Raises:
        PolicySpecError: The spec names nothing loadable.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise PolicySpecError(f"empty policy spec; use one of: {', '.join(SPEC_FORMS)}")
    spec = spec.strip()
    sampling = sampling or DEFAULT_SAMPLING
    kind, _, target = spec.partition(":")
    from simpop.agents.embedded import EMBEDDED_MODELS

    if kind in ("openai", "vllm", "hf", "transformers") or spec in EMBEDDED_MODELS:
        _check_text_seat(env, spec)
    if kind == "vllm":
        if not target:
            raise PolicySpecError(f"policy {spec!r}: write vllm:BASE_URL#MODEL or vllm:MODEL_FOLDER")
        from simpop.agents import load_backend

        backend = load_backend(spec, max_concurrency=max_concurrency)
        if probe:
            backend.generate([[{"role": "user", "content": "Say OK."}]], SamplingParams(max_new_tokens=1, seed=0))
        return TextPolicy(backend, sampling, name=spec)

    if kind == "openai":
        if "#" not in target or not target.rpartition("#")[2]:
            raise PolicySpecError(f"policy {spec!r}: write openai:BASE_URL#MODEL, e.g. "
                                  f"openai:http://127.0.0.1:8000/v1#smollm2")
        from simpop.agents import load_backend

        backend = load_backend(spec, max_concurrency=max_concurrency)
        if probe:
            probe_endpoint(spec)
        return TextPolicy(backend, sampling, name=spec)
    if kind in ("hf", "transformers") or spec in EMBEDDED_MODELS:
        if kind in ("hf", "transformers") and not target:
            raise PolicySpecError(f"policy {spec!r}: name the model folder, e.g. hf:/models/my-agent")
        from simpop.agents import load_backend

        backend = load_backend(spec if spec in EMBEDDED_MODELS else f"transformers:{target}")
        return TextPolicy(backend, sampling, name=spec)
    if kind == "run":
        run_dir, _, step = target.rpartition("@") if "@" in target else (target, "", "")
        if not run_dir:
            raise PolicySpecError(f"policy {spec!r}: write run:DIR or run:DIR@STEP")
        if step and not step.isdigit():
            raise PolicySpecError(f"policy {spec!r}: the step after '@' must be a number, got {step!r}")
        return load_run_policy(run_dir, int(step) if step else None, env, env_id=env_id)
    if spec == "reference":
        return reference_policy(env)
    if ":" in spec and re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", spec):
        return load_object_policy(spec)
    raise PolicySpecError(f"unknown policy spec {spec!r}; use one of: {', '.join(SPEC_FORMS)}")


def _check_text_seat(env: Any, spec: str) -> None:
    from gymnasium import spaces

    if isinstance(env.action_space(env.policy_seat), spaces.Discrete):
        raise PolicySpecError(f"policy {spec!r} is a text model but {type(env).__name__}'s policy seat takes discrete "
                              f"acts; use a text env, or run:DIR / reference / module:attr")


def probe_endpoint(spec: str) -> None:
    """One one-token request to the ``openai:`` endpoint ``spec``, without retries (raises its error)."""
    from simpop.agents import load_backend

    backend = load_backend(spec, max_retries=0, timeout_s=60.0)
    backend.generate([[{"role": "user", "content": "Say OK."}]], SamplingParams(max_new_tokens=1, seed=0))


# ---------------------------------------------------------------------------------------------- text
class TextPolicy:
    """An untracked text policy on any backend: observations to chats, one batched ``generate`` per turn.

    Args:
        backend: Any :class:`~simpop.agents.base.Backend`.
        sampling: Decoding of the policy's turns (``seed`` is drawn per call from the rollout generator).
        name: Shown in logs and reports.

    Attributes:
        stats: Counters of the env text format's fallbacks (e.g. CooperBench ``unparsed_actions``) and
            ``backend_calls``.
    """

    def __init__(self, backend: Any, sampling: SamplingParams = DEFAULT_SAMPLING, name: str | None = None):
        self.backend = backend
        self.sampling = sampling
        self.name = name or getattr(backend, "name", "text-policy")
        self.stats: dict[str, int] = {"backend_calls": 0}
        self._envs: list[Any] | None = None

    @property
    def rng_free(self) -> bool:
        """Greedy decoding: the replies do not depend on the seed drawn from the rollout generator."""
        return self.sampling.temperature == 0

    def begin_wave(self, envs: list[Any]) -> None:
        """The envs of the next wave (used where the env has its own text format)."""
        self._envs = list(envs)

    def act_batch(self, observations: list[Any], rng: np.random.Generator) -> list[str]:
        """One reply per text observation, in one batched backend call seeded from ``rng``."""
        formats = self._formats(len(observations))
        chats = [fmt.chat(obs, scenario) if fmt is not None else observation_chat(obs)
                 for obs, (fmt, scenario) in zip(observations, formats)]
        params = SamplingParams(max_new_tokens=self.sampling.max_new_tokens, temperature=self.sampling.temperature,
                                top_p=self.sampling.top_p, stop=self.sampling.stop, seed=int(rng.integers(2**31)))
        self.stats["backend_calls"] += 1
        generations = self.backend.generate(chats, params)
        if len(generations) != len(chats):
            raise RuntimeError(f"backend {self.name} returned {len(generations)} generations for {len(chats)} chats")
        actions = []
        for generation, (fmt, _) in zip(generations, formats):
            text = generation.text
            actions.append(fmt.to_action(text, self.stats) if fmt is not None else text.strip())
        return actions

    def _formats(self, n: int) -> list[tuple[Any, Any]]:
        """Per observation: (the env's text format for the policy seat, the dialogue's scenario), or Nones."""
        if self._envs is None or not self._envs or getattr(self._envs[0], "text_format", None) is None:
            return [(None, None)] * n
        slots = pending_slots(self._envs, n, self.name)
        out = []
        for slot in slots:
            env = self._envs[slot]
            fmt = env.text_format
            if hasattr(fmt, "seat"):
                fmt = type(fmt)(env.policy_seat)
            for counter in getattr(fmt, "counters", ()):
                self.stats.setdefault(counter, 0)
            out.append((fmt, env.scenario))
        return out


def observation_chat(observation: str) -> Chat:
    """The chat for a text observation: instructions, the dialogue so far, and a note on a rejected action."""
    view = parse_observation(observation)
    chat: Chat = [{"role": "system", "content": view["instructions"]}] if view.get("instructions") else []
    for message in view.get("messages", []):
        role, content = message["role"], str(message["content"])
        if role == "tool":
            role, content = "user", f"[tool result: {message.get('name', '')}]\n{content}"
        elif role not in ("user", "assistant", "system"):
            role = "user"
        if chat and chat[-1]["role"] == role and role != "system":
            chat[-1] = {"role": role, "content": chat[-1]["content"] + "\n" + content}
        else:
            chat.append({"role": role, "content": content})
    if view.get("error"):
        note = f"(Your last message was not accepted: {view['error']} Please answer again.)"
        if chat and chat[-1]["role"] == "user":
            chat[-1] = {"role": "user", "content": chat[-1]["content"] + "\n" + note}
        else:
            chat.append({"role": "user", "content": note})
    if not chat:
        chat = [{"role": "user", "content": "(The conversation starts; you speak first.)"}]
    return chat


def pending_slots(envs: Sequence[Any], n: int, name: str) -> list[int]:
    """The wave slots whose dialogues await the policy, in the order the rollout engine asks them."""
    slots = [i for i, env in enumerate(envs) if not env.done and env.to_act == env.policy_seat]
    if len(slots) != n:
        raise RuntimeError(f"{name}: got {n} observations but {len(slots)} dialogues of this wave await the "
                           f"policy; run it through simpop eval (it tells the policy each wave's envs)")
    return slots


# ---------------------------------------------------------------------------------------------- reference
class DialoguePolicy:
    """A policy that plays each dialogue from its env (scenario, seat): subclasses implement :meth:`start`
    (once per wave, when every dialogue of the wave has been reset) and :meth:`act` (one slot's turn)."""

    name = "dialogue-policy"

    def __init__(self) -> None:
        self._envs: list[Any] | None = None
        self._started = False

    def begin_wave(self, envs: list[Any]) -> None:
        """Take the envs of the next wave, in slot order (the runner calls this before the wave)."""
        self._envs, self._started = list(envs), False

    def act_batch(self, observations: list[Any], rng: np.random.Generator) -> list[Any]:
        """Actions for the dialogues whose turn it is, matched to their envs in slot order.

        Raises:
            RuntimeError: No wave was begun (the policy was run outside simpop's evaluation).
        """
        if self._envs is None:
            raise RuntimeError(f"{self.name} plays each dialogue from its env; run it with simpop eval, "
                               f"simpop.evaluation.eval_run.evaluate_panel or simpop.evaluation.panel.evaluate")
        slots = pending_slots(self._envs, len(observations), self.name)
        if not self._started:
            self.start(self._envs, rng)
            self._started = True
        return self.act_slots(slots, observations, rng)

    def start(self, envs: list[Any], rng: np.random.Generator) -> None:
        """Begin the wave's dialogues (every env is reset)."""

    def act_slots(self, slots: list[int], observations: list[Any], rng: np.random.Generator) -> list[Any]:
        """Actions for the given slots; by default :meth:`act` per slot."""
        return [self.act(slot, obs, rng) for slot, obs in zip(slots, observations)]

    def act(self, slot: int, observation: Any, rng: np.random.Generator) -> Any:
        """One slot's turn; subclasses implement it (or override :meth:`act_slots` for the whole batch)."""
        raise NotImplementedError(f"{type(self).__name__} must implement act() or act_slots()")


class ReferencePersuader(DialoguePolicy):
    """P4G's reference persuader: each dialogue plays one act sequence of
    :func:`~simpop.envs.persuasion.model.reference_persuader` (greeting, strategies at corpus frequencies,
    the proposition at a uniform turn of the second half), drawn from the rollout generator when the wave
    starts. Act level it returns the act's index; text level one phrasing of the act
    (:func:`~simpop.envs.persuasion.acts.render_persuader`)."""

    name = "reference-persuader"

    def __init__(self, text: bool):
        super().__init__()
        self.text = text
        self._plans: list[list[str]] = []

    def start(self, envs: list[Any], rng: np.random.Generator) -> None:
        from simpop.envs.persuasion.model import reference_persuader

        self._plans = [list(reference_persuader(rng, env.max_turns)) for env in envs]

    def act(self, slot: int, observation: Any, rng: np.random.Generator) -> Any:
        from simpop.envs.persuasion.acts import PERSUADER_ACTS, render_persuader

        plan = self._plans[slot]
        act = plan.pop(0) if plan else "closing"
        return render_persuader(act, rng) if self.text else PERSUADER_ACTS.index(act)


class GoldTau2Agent(DialoguePolicy):
    """τ²'s reference: a :class:`~simpop.envs.tau2.simulators.GoldAgent` per dialogue (the task's gold
    actions, then what τ² checks was communicated)."""

    name = "tau2-gold"
    rng_free = True  # the gold actions: nothing drawn

    def start(self, envs: list[Any], rng: np.random.Generator) -> None:
        from simpop.envs.tau2.simulators import GoldAgent

        self._agents = [GoldAgent(env.scenario) for env in envs]

    def act(self, slot: int, observation: Any, rng: np.random.Generator) -> Any:
        return self._agents[slot].act(observation)


class SeatSimulator(DialoguePolicy):
    """A simulator playing the policy seat (CooperBench's scripted gold-patch teammate as ``agent1``).

    Its slots are the wave's dialogues; slot ``i``'s generator is seeded from dialogue ``i``'s user seed.
    """

    def __init__(self, simulator: Any, name: str):
        super().__init__()
        self.simulator = simulator
        self.name = name

    def start(self, envs: list[Any], rng: np.random.Generator) -> None:
        self.simulator.reset_batch([env.scenario for env in envs],
                                   [np.random.default_rng([env.user_seed, 1]) for env in envs])

    def act_slots(self, slots: list[int], observations: list[Any], rng: np.random.Generator) -> list[Any]:
        """The wrapped simulator's actions for the given slots (one batched call)."""
        return list(self.simulator.act_batch(list(observations), list(slots)))


#: Benchmark package -> what ``reference`` is there (for the error message).
REFERENCE_AGENTS = {
    "simpop.envs.persuasion": "P4G: a persuader playing reference_persuader's act sequences (act and text)",
    "simpop.envs.tau2": "τ²: GoldAgent (replays the task's gold actions)",
    "simpop.envs.cooperbench": "CooperBench: a scripted teammate writing the policy seat's gold patch",
}


def reference_policy(env: Any) -> Any:
    """The reference agent of ``env``'s benchmark (see :data:`REFERENCE_AGENTS`)."""
    module = type(env).__module__
    benchmark = next((b for b in REFERENCE_AGENTS if module == b or module.startswith(b + ".")), None)
    if benchmark == "simpop.envs.persuasion":
        from gymnasium import spaces

        return ReferencePersuader(text=not isinstance(env.action_space(env.policy_seat), spaces.Discrete))
    if benchmark == "simpop.envs.tau2":
        return GoldTau2Agent()
    if benchmark == "simpop.envs.cooperbench":
        from simpop.envs.cooperbench.simulators import ScriptedTeammate

        return SeatSimulator(ScriptedTeammate(seat=env.policy_seat, mode="cooperative", name="gold-patch"),
                             "cooperbench-gold")
    raise PolicySpecError(f"no reference agent for {type(env).__name__}; 'reference' exists for: "
                          + "; ".join(REFERENCE_AGENTS.values()))


# ---------------------------------------------------------------------------------------------- objects
def load_object_policy(spec: str) -> Any:
    """``module:attr``: an object with ``act_batch`` (or a token policy), or a zero-argument factory of one."""
    from simpop.envs.registration import load

    try:
        value = load(spec)
    except Exception as error:  # the module may raise anything while it is imported
        raise PolicySpecError(f"policy {spec!r}: cannot import it ({type(error).__name__}: {error})") from None
    if not _is_policy(value) and callable(value):
        try:
            value = value()
        except TypeError as error:
            raise PolicySpecError(f"policy {spec!r}: a factory must take no arguments ({error})") from None
        except Exception as error:
            raise PolicySpecError(f"policy {spec!r}: its factory raised {type(error).__name__}: {error}") from None
    if not _is_policy(value):
        raise PolicySpecError(f"policy {spec!r} is a {type(value).__name__}, which has no act_batch(observations, "
                              f"rng) method (nor is it a zero-argument factory of such an object)")
    return value


def _is_policy(value: Any) -> bool:
    from simpop.agents.policy import TokenPolicy

    return (not isinstance(value, type)) and (callable(getattr(value, "act_batch", None))
                                              or isinstance(value, TokenPolicy))


# ---------------------------------------------------------------------------------------------- run folders
def _policy_weights(state: dict[str, Any]) -> Any:
    """The policy's weights in a trainer's checkpoint state: GRPO ``policy``, co-training ``policy_trainer``,
    adaptive pools ``inner`` (which may hold either)."""
    if "policy" in state:
        return state["policy"]
    for key in ("policy_trainer", "inner"):
        if isinstance(state.get(key), dict):
            return _policy_weights(state[key])
    return None


def load_run_policy(run_dir: str | Path, step: int | None, env: Any, env_id: str | None = None) -> Any:
    """The policy of a run folder (``simpop train``, or one run of ``simpop experiment collapse/adaptive/monitor``),
    with the weights of its newest checkpoint (or of ``step``).

    The policy is rebuilt from ``config.yaml``'s ``model`` section with
    :func:`~simpop.agents.policy.build_policy` (act level: an ``ActPolicy`` sized for ``env``; text: an
    ``LLMPolicy`` on the configured model, sampled with the run's ``grpo`` decoding) and its weights are the
    checkpoint's ``state["policy"]`` (co-training: ``state["policy_trainer"]["policy"]``).

    Checkpoints are read with :func:`simpop.checkpoint.load` (without touching the global RNGs). Load only
    run folders you trust: checkpoints are pickles.
    """
    from simpop.user_input import load_yaml_file

    run = Path(run_dir).expanduser()
    info_path, config_path = run / "run.json", run / "config.yaml"
    if not info_path.is_file() or not config_path.is_file():
        hint = ""
        if (run / "checkpoints").is_dir() and (run.parent.parent.parent / "config.json").is_file():
            hint = (f"; it is an experiment's run from before run folders recorded their policy: rerun the "
                    f"experiment with --out {run.parent.parent.parent} --resume (finished runs are not retrained)")
        raise PolicySpecError(f"{run} is not a simpop run folder (it needs run.json and config.yaml){hint}")
    info = json.loads(info_path.read_text())
    config = load_yaml_file(config_path) or {}
    if info.get("trainer") == "ppo":
        raise PolicySpecError(f"{run} is a PPO run; its actor-critic lives in simpop.train.ppo, which evaluation "
                              f"does not import; evaluate GRPO-family and co-training runs, or pass the PPO model "
                              f"as module:attr")
    if env_id is not None and info.get("env") not in (None, env_id):
        log.warning("run %s trained on %s; evaluating it on %s", run, info.get("env"), env_id)
    checkpoints = checkpoint.by_step(run)
    if not checkpoints:
        raise PolicySpecError(f"{run} has no checkpoints (checkpoints/step_*.pt); train it first")
    if step is None:
        step, path = max(checkpoints.items())
    elif step in checkpoints:
        path = checkpoints[step]
    else:
        raise PolicySpecError(f"{run} has no checkpoint of step {step}; it has steps "
                              f"{', '.join(map(str, sorted(checkpoints)))}")
    from simpop.agents.policy import ModelConfig, build_policy

    try:
        model = ModelConfig(**(config.get("model") or {}))
    except TypeError as error:
        raise PolicySpecError(f"{config_path}: bad model section ({error})") from None
    grpo = config.get("grpo") or {}
    sampling = SamplingParams(max_new_tokens=int(grpo.get("max_new_tokens", 48)),
                              temperature=float(grpo.get("temperature", 1.0)), top_p=float(grpo.get("top_p", 1.0)),
                              logprobs=True)
    policy = build_policy(env, model, sampling, int(grpo.get("seed", 0)))
    _, state = checkpoint.load(path, restore_rng=False)
    weights = _policy_weights(state)
    if weights is None:
        raise PolicySpecError(f"{path} holds no policy weights (state['policy'], or under 'policy_trainer'/'inner')")
    try:
        policy.load_state_dict(weights)
    except RuntimeError as error:
        raise PolicySpecError(f"{path} does not fit the policy for this env ({type(env).__name__}): "
                              f"{str(error).splitlines()[0]}") from None
    if hasattr(policy, "eval"):
        policy.eval()
    log.info("loaded %s (step %d) from %s", type(policy).__name__, step, path)
    return policy


