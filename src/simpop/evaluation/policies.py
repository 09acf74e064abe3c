"""Policy specs for ``simpop eval``: what plays the policy seat, named by a string.

:func:`load_policy` turns a spec into a :class:`~simpop.seat.Player` for the policy seat (the one place a policy
spec is read):

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
``reference``                      the benchmark's reference agent: P4G (act and text)
                                   :class:`~simpop.envs.persuasion.reference.ReferencePersuader`; τ²
                                   :class:`~simpop.envs.tau2.reference.GoldTau2Agent` (the task's gold actions; it
                                   cannot solve the tasks that
                                   :func:`~simpop.envs.tau2.simulators.gold_unreachable` names);
                                   CooperBench a :class:`~simpop.envs.cooperbench.simulators.ScriptedTeammate`
                                   writing the policy seat's gold patch
``module:attr``                    any importable :class:`~simpop.seat.Player` (or a zero-argument factory
                                   returning one); an ``entropy(trajectories)`` method is optional
=================================  ===========================================================================

**Text policies** (:class:`TextPolicy`) turn each text observation into a chat: the observation's
``instructions`` as the system message, then its ``messages`` (the policy's own turns are ``assistant``;
tool results become ``user`` messages headed ``[tool result: NAME]`` so that any OpenAI-compatible server
takes them; consecutive messages of one role are merged), plus a note when the env rejected the last
action. Envs with their own :class:`~simpop.seat.TextFormat` (CooperBench's state + JSON action language,
``env.text_format``) are read through it instead, built for the policy seat (``type(fmt)(policy_seat)``);
its fallbacks (``unparsed_actions``) are counted in :attr:`TextPolicy.stats`. Each batched call is seeded
from the rollout's generator, so local models are reproducible. Text policies report no entropy (nan).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from simpop import checkpoint
from simpop.agents.base import Chat, SamplingParams
from simpop.envs.dialogue import parse_observation
from simpop.seat import Player, TextFormat

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
        return TextPolicy(backend, sampling, name=spec, text_format=policy_format(env))

    if kind == "openai":
        if "#" not in target or not target.rpartition("#")[2]:
            raise PolicySpecError(f"policy {spec!r}: write openai:BASE_URL#MODEL, e.g. "
                                  f"openai:http://127.0.0.1:8000/v1#smollm2")
        from simpop.agents import load_backend

        backend = load_backend(spec, max_concurrency=max_concurrency)
        if probe:
            probe_endpoint(spec)
        return TextPolicy(backend, sampling, name=spec, text_format=policy_format(env))
    if kind in ("hf", "transformers") or spec in EMBEDDED_MODELS:
        if kind in ("hf", "transformers") and not target:
            raise PolicySpecError(f"policy {spec!r}: name the model folder, e.g. hf:/models/my-agent")
        from simpop.agents import load_backend

        backend = load_backend(spec if spec in EMBEDDED_MODELS else f"transformers:{target}")
        return TextPolicy(backend, sampling, name=spec, text_format=policy_format(env))
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
class TextPolicy(Player):
    """An untracked text policy on any backend: observations to chats, one batched ``generate`` per turn.

    Args:
        backend: Any :class:`~simpop.agents.base.Backend`.
        sampling: Decoding of the policy's turns (``seed`` is drawn per call from the first slot's generator,
            the rollout's).
        name: Shown in logs and reports.
        text_format: The env's text format for the policy seat (:func:`policy_format`); None: the
            observation's own chat (:func:`observation_chat`).

    Attributes:
        stats: Counters of the env text format's fallbacks (e.g. CooperBench ``unparsed_actions``) and
            ``backend_calls``.
    """

    def __init__(self, backend: Any, sampling: SamplingParams = DEFAULT_SAMPLING, name: str | None = None,
                 text_format: TextFormat | None = None):
        self.backend = backend
        self.sampling = sampling
        self.name = str(name or getattr(backend, "name", "text-policy"))
        self.text_format = text_format
        self.stats: dict[str, int] = {"backend_calls": 0, **{c: 0 for c in getattr(text_format, "counters", ())}}

    @property
    def rng_free(self) -> bool:
        """Greedy decoding: the replies do not depend on the seed drawn from the rollout generator."""
        return self.sampling.temperature == 0

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        super().reset_batch(scenarios, rngs)
        self.scenarios = list(scenarios)

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        """One reply per text observation, in one batched backend call."""
        fmt = self.text_format
        chats = [fmt.chat(obs, self.scenarios[slot]) if fmt is not None else observation_chat(obs)
                 for obs, slot in zip(observations, slots, strict=True)]
        params = SamplingParams(max_new_tokens=self.sampling.max_new_tokens, temperature=self.sampling.temperature,
                                top_p=self.sampling.top_p, stop=self.sampling.stop,
                                seed=int(self.rngs[slots[0]].integers(2**31)))
        self.stats["backend_calls"] += 1
        generations = self.backend.generate(chats, params)
        if len(generations) != len(chats):
            raise RuntimeError(f"backend {self.name} returned {len(generations)} generations for {len(chats)} chats")
        return [fmt.to_action(g.text, self.stats) if fmt is not None else g.text.strip() for g in generations]


def policy_format(env: Any) -> TextFormat | None:
    """``env``'s text format (``env.text_format``) built for its policy seat, or None where it has none."""
    fmt = getattr(env, "text_format", None)
    return type(fmt)(env.policy_seat) if fmt is not None and hasattr(fmt, "seat") else fmt


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

        from simpop.envs.persuasion.reference import ReferencePersuader

        return ReferencePersuader(not isinstance(env.action_space(env.policy_seat), spaces.Discrete), env.max_turns)
    if benchmark == "simpop.envs.tau2":
        from simpop.envs.tau2.reference import GoldTau2Agent

        return GoldTau2Agent()
    if benchmark == "simpop.envs.cooperbench":
        from simpop.envs.cooperbench.simulators import ScriptedTeammate

        return ScriptedTeammate(seat=env.policy_seat, mode="cooperative", name="cooperbench-gold")
    raise PolicySpecError(f"no reference agent for {type(env).__name__}; 'reference' exists for: "
                          + "; ".join(REFERENCE_AGENTS.values()))


# ---------------------------------------------------------------------------------------------- objects
def load_object_policy(spec: str) -> Any:
    """``module:attr``: a :class:`~simpop.seat.Player`, or a zero-argument factory of one."""
    from simpop.envs.registration import load

    try:
        value = load(spec)
    except Exception as error:  # the module may raise anything while it is imported
        raise PolicySpecError(f"policy {spec!r}: cannot import it ({type(error).__name__}: {error})") from None
    if not isinstance(value, Player) and callable(value):
        try:
            value = value()
        except TypeError as error:
            raise PolicySpecError(f"policy {spec!r}: a factory must take no arguments ({error})") from None
        except Exception as error:
            raise PolicySpecError(f"policy {spec!r}: its factory raised {type(error).__name__}: {error}") from None
    if not isinstance(value, Player):
        raise PolicySpecError(f"policy {spec!r} is a {type(value).__name__}, not a simpop.seat.Player with "
                              f"act_batch(observations, slots) (nor a zero-argument factory of one)")
    return value


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


