"""The CooperBench env: two coding agents, one feature each, merged code must pass both.

Seats: ``agent1`` (the policy; it gets the lower feature id) and ``agent2`` (the teammate
simulator). Turn order is fixed: ``agent1`` acts first, then the seats alternate; once a seat has
submitted it never acts again and the other seat takes every remaining turn. A rejected action
(see below) does not pass the turn. The episode ends when both have submitted (``terminated``) or
at ``max_steps`` (``truncated``).

Each seat edits its own copy of the repository at the base commit; the env keeps a seat's copy as
its changes over the base (path -> new content), so the env holds no open files or directories and
pickles. A seat's patch is the diff of its copy against the base, taken when it submits (or, at
truncation, from its copy as it is: upstream grades whatever an agent leaves behind).

Actions are JSON in text (see :mod:`simpop.envs.cooperbench.actions`): ``message``, ``view``,
``write``, ``delete``, ``test`` (run the seat's own feature's hidden tests on its copy) and
``submit``. Malformed actions, unsafe paths (absolute, ``..``, ``.git``, a name over 255 bytes, a
path over 1024 bytes or 32 levels deep), overlong messages and
writes onto directories are rejected through the base class (error observation +
``info[seat]["invalid_action"]``). Viewing a missing file is a valid action with a "no such file"
result.

Observations: the base's JSON (``seat``, ``to_act``, ``step``, ``messages``, ``error``) where
``messages`` is this seat's view: its own actions (``assistant``), the results of its actions and
the teammate's messages (``user``; the teammate's other actions are invisible), plus ``feature_id``
and ``feature`` (its ``feature.md``), ``files`` (its copy's file list), ``inbox`` (teammate messages
since its last turn), ``result`` (of its last action), ``submitted`` and ``steps_left``.

Reward: 1.0 for both seats if both features pass on the merged code (see
:mod:`simpop.envs.cooperbench.evaluator`, including its conflict rule), else 0.0; the full
evaluation (apply/merge status, per-feature counts, output tails) is in ``info["cooperbench"]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar


from simpop.envs.cooperbench.actions import Action, ActionError, parse_action
from simpop.envs.cooperbench.dataset import load_dataset
from simpop.envs.cooperbench.evaluator import Evaluator, PairResult
from simpop.envs.cooperbench.patches import is_test_path, path_problem, touched_paths
from simpop.envs.cooperbench.sandbox import Limits
from simpop.envs.cooperbench.scenario import FeaturePair, Task
from simpop.envs.dialogue import NOT_UNICODE, DialogueEnv, Outcome, TextSpace, Turn, is_unicode

SEATS = ("agent1", "agent2")
#: Longest action (a write carries a whole file).
ACTION_MAX_CHARS = 100_000
#: Longest message to the teammate.
MESSAGE_MAX_CHARS = 4_000
_FEATURE_CAP = 20_000
_RESULT_CAP = 20_000
_FILES_CAP = 400
_HISTORY_ACTION_CAP = 2_000
_HISTORY_RESULT_CAP = 1_000
_TAIL_CAP = 1_500


class CooperBenchEnv(DialogueEnv):
    """CooperBench feature pairs as a two-seat env.

    Args:
        dataset: The benchmark's ``dataset/`` folder, or ``"mini"`` for the packaged mini set.
        repos: Where the repository checkouts live (see :mod:`simpop.envs.cooperbench.dataset`).
        subset: A subset name from ``dataset/subsets/`` (default: every pair of every task).
        max_steps: Step cap (both seats' steps together).
        conflict_rule: ``"lead"`` (upstream today) or ``"union"`` (see the evaluator).
        limits: Limits for every test run (default: 60 s, 4 GiB, no network).
        python: Interpreter for the tests (default: this one).
        render_mode: ``"ansi"`` or ``"human"``.
    """

    metadata: ClassVar[dict[str, Any]] = {**DialogueEnv.metadata, "name": "cooperbench_v0"}
    policy_seat = "agent1"
    user_seat = "agent2"
    first_seat = "agent1"

    def __init__(self, dataset: str | Path | None = None, repos: str | Path | None = None,
                 subset: str | None = None, max_steps: int = 60, conflict_rule: str = "lead",
                 limits: Limits | None = None, python: str | None = None, render_mode: str | None = None):
        if dataset is None:
            raise ValueError("simpop/CooperBench-v0 needs dataset=<CooperBench's dataset/ folder> and usually "
                             "repos=<folder of checkouts at their base commits>; simpop/CooperBench-mini-v0 runs "
                             "the packaged mini tasks without either")
        self.dataset = load_dataset(dataset, repos)
        pairs = self.dataset.pairs(subset)
        for task in {p.task.key: p.task for p in pairs}.values():
            task.require_runnable()
        self._pairs = {p.id: p for p in pairs}
        self.evaluator = Evaluator(limits, conflict_rule, python)
        self._base_files: dict[str, list[str]] = {}
        self._changes: dict[str, dict[str, str | None]] = {}
        self._submitted: dict[str, bool] = {}
        self._patches: dict[str, str] = {}
        self._results: dict[str, str | None] = {}
        self._inbox: dict[str, list[str]] = {}
        self._evaluation: PairResult | None = None
        super().__init__(max_steps, render_mode)

    # ----------------------------------------------------------------- DialogueEnv hooks
    def _make_spaces(self):
        per_turn = MESSAGE_MAX_CHARS + _HISTORY_ACTION_CAP + _HISTORY_RESULT_CAP + 200
        fixed = _FEATURE_CAP + _RESULT_CAP + _FILES_CAP * 260 + 4096
        # Worst case: every character JSON-escaped to six (\uXXXX).
        observation = TextSpace(max_length=6 * (2 * self.max_steps * per_turn + fixed))
        action = TextSpace(max_length=ACTION_MAX_CHARS)
        return {s: observation for s in SEATS}, {s: action for s in SEATS}

    @property
    def text_format(self):
        """How an LLM simulator in the user seat reads observations and writes actions."""
        return self.text_format_for(self.user_seat)

    def text_format_for(self, seat: str):
        """How an LLM in ``seat`` reads observations and writes actions (self-play: an LLM in both seats)."""
        from simpop.envs.cooperbench.simulators import CooperBenchFormat

        return CooperBenchFormat(seat)

    def scenario_ids(self) -> list[str]:
        return list(self._pairs)

    def load_scenario(self, scenario_id: str) -> FeaturePair:
        return self._pairs[scenario_id]

    def _start(self) -> None:
        self._changes = {s: {} for s in SEATS}
        self._submitted = {s: False for s in SEATS}
        self._patches = {}
        self._results = {s: None for s in SEATS}
        self._inbox = {s: [] for s in SEATS}
        self._evaluation = None

    def _validate(self, seat: str, action: Any) -> str | None:
        if not self.action_space(seat).contains(action):
            return f"an action is a string of at most {ACTION_MAX_CHARS} characters"
        try:
            parsed = parse_action(action)
        except ActionError as exc:
            return str(exc)
        if not is_unicode(action, parsed.text, parsed.path, parsed.content):
            return NOT_UNICODE
        if parsed.type == "message" and len(parsed.text or "") > MESSAGE_MAX_CHARS:
            return f"messages are limited to {MESSAGE_MAX_CHARS} characters"
        if parsed.path is not None:
            path = _normalise(parsed.path)
            problem = path_problem(path) if path else None
            if not path and parsed.type != "view":
                problem = "that is the repository root; name a file"
            if problem:
                return f"path {parsed.path!r} is not allowed: {problem}"
            if parsed.type == "write" and path in self._dirs(seat):
                return f"{path!r} is a directory; write a file path"
            parents = ["/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)]
            if parsed.type == "write" and any(p in self._files(seat) for p in parents):
                return f"a parent of {path!r} is a file"
        return None

    def _apply(self, seat: str, action: str) -> str:
        parsed = parse_action(action)
        self._inbox[seat] = []
        result = getattr(self, f"_do_{parsed.type}")(seat, parsed)
        self._results[seat] = result
        data: dict[str, Any] = {"result": result}
        if parsed.type == "message":
            data["text"] = parsed.text
        self.transcript.append(Turn(seat, parsed.to_json(), act=parsed.type, data=data))
        other = _other(seat)
        if not self._submitted[other]:
            return other
        return seat

    def _outcome(self) -> Outcome | None:
        if not all(self._submitted.values()):
            return None
        return self._evaluate()

    def _truncated_outcome(self) -> Outcome:
        for seat in SEATS:
            if seat not in self._patches:
                self._patches[seat] = self._current_patch(seat)
        outcome = self._evaluate()
        outcome.info["cooperbench"]["unsubmitted_patches_graded"] = [s for s in SEATS if not self._submitted[s]]
        return outcome

    def _observe(self, seat: str) -> str:
        feature = self.scenario.feature(seat)
        files = self._files(seat)
        listing = files[:_FILES_CAP] + ([f"... ({len(files) - _FILES_CAP} more; view a directory to list it)"]
                                        if len(files) > _FILES_CAP else [])
        return self.text_observation(
            seat, feature_id=feature.id, feature=_cap(feature.description, _FEATURE_CAP), files=listing,
            inbox=list(self._inbox[seat]), result=self._results[seat], submitted=dict(self._submitted),
            steps_left=self.max_steps - self.steps)

    def chat_view(self, seat: str) -> list[dict[str, str]]:
        """This seat's dialogue: its actions, their results, and the teammate's messages."""
        view = []
        for turn in self.transcript:
            if turn.seat == seat:
                view.append({"role": "assistant", "content": _cap(turn.text, _HISTORY_ACTION_CAP)})
                view.append({"role": "user", "content": "[Result] " + _cap(turn.data["result"], _HISTORY_RESULT_CAP)})
            elif turn.act == "message":
                view.append({"role": "user", "content": _message_line(turn.seat, turn.data["text"])})
        return view

    # ----------------------------------------------------------------- actions
    def _do_message(self, seat: str, action: Action) -> str:
        self._inbox[_other(seat)].append(_message_line(seat, action.text or ""))
        return f"message sent to {_other(seat)}"

    def _do_view(self, seat: str, action: Action) -> str:
        path = _normalise(action.path or "")
        if path == "" or path in self._dirs(seat):
            prefix = f"{path}/" if path else ""
            entries = sorted({prefix + f[len(prefix):].split("/")[0] + ("/" if "/" in f[len(prefix):] else "")
                              for f in self._files(seat) if f.startswith(prefix)})
            return f"directory {path or '.'}:\n" + "\n".join(entries)
        content = self._read(seat, path)
        if content is None:
            return f"no such file: {path}"
        return f"{path}:\n{_cap(content, _RESULT_CAP)}"

    def _do_write(self, seat: str, action: Action) -> str:
        path = _normalise(action.path or "")
        self._changes[seat][path] = action.content or ""
        note = " (test files are left out of your patch when it is graded)" if is_test_path(path) else ""
        return f"wrote {path} ({len(action.content or '')} characters){note}"

    def _do_delete(self, seat: str, action: Action) -> str:
        path = _normalise(action.path or "")
        if path not in self._files(seat):
            return f"no such file: {path}"
        self._changes[seat][path] = None
        return f"deleted {path}"

    def _do_test(self, seat: str, action: Action) -> str:
        feature = self.scenario.feature(seat)
        result = self.evaluator.test_feature(self.scenario.task, feature.id, self._current_patch(seat))
        return f"{result.summary()}\n{_cap(result.output_tail, _TAIL_CAP, keep='end')}"

    def _do_submit(self, seat: str, action: Action) -> str:
        self._patches[seat] = self._current_patch(seat)
        self._submitted[seat] = True
        touched = touched_paths(self._patches[seat])
        return "submitted; your patch changes: " + (", ".join(touched) if touched else "nothing")

    # ----------------------------------------------------------------- helpers
    def _evaluate(self) -> Outcome:
        if self._evaluation is None:
            pair: FeaturePair = self.scenario
            self._evaluation = self.evaluator.evaluate(pair.task, pair.first.id, pair.second.id,
                                                       self._patches["agent1"], self._patches["agent2"])
        reward = 1.0 if self._evaluation.both_passed else 0.0
        info = {"cooperbench": self._evaluation.to_dict(), "patches": dict(self._patches)}
        return Outcome({s: reward for s in SEATS}, info)

    def _current_patch(self, seat: str) -> str:
        changes = self._changes[seat]
        return self.evaluator.diff(self.scenario.task, changes) if changes else ""

    def _task_files(self, task: Task) -> list[str]:
        if task.key not in self._base_files:
            self._base_files[task.key] = self.evaluator.base_files(task)
        return self._base_files[task.key]

    def _files(self, seat: str) -> list[str]:
        files = set(self._task_files(self.scenario.task))
        for path, content in self._changes[seat].items():
            if content is None:
                files.discard(path)
            else:
                files.add(path)
        return sorted(files)

    def _dirs(self, seat: str) -> set[str]:
        """Every directory of the seat's copy (``a``, ``a/b`` for ``a/b/c.py``)."""
        dirs: set[str] = set()
        for path in self._files(seat):
            parts = path.split("/")
            dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        return dirs

    def _read(self, seat: str, path: str) -> str | None:
        if path in self._changes[seat]:
            return self._changes[seat][path]
        if path not in self._task_files(self.scenario.task):
            return None
        content = self.evaluator.read_base(self.scenario.task, path)
        if content is not None and ("\0" in content or "\ufffd" in content):
            return f"(binary file, {len(content)} characters)"
        return content


def _other(seat: str) -> str:
    return "agent2" if seat == "agent1" else "agent1"


def _normalise(path: str) -> str:
    """``./a//b/`` -> ``a/b``; keeps ``..`` so that the safety check sees it."""
    path = path.strip().replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return ("/" if path.startswith("/") else "") + "/".join(parts)


def _message_line(seat: str, text: str) -> str:
    return f"[Message from {seat}]: {text}"


def _cap(text: str, limit: int, keep: str = "start") -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + "\n[... truncated]" if keep == "start" else "[truncated ...]\n" + text[-limit:]
