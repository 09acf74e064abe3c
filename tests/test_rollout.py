"""RolloutEngine: batching, groups, seeds and token-in/token-out bookkeeping (toy env and model)."""

from __future__ import annotations

import numpy as np
import pytest

from simpop.agents.policy import ChatDelta
from simpop.rollout import Job, RolloutEngine
from simpop.seat import Player
from tests.train.toys import (IM_END, MERGED_AB, CountingSimulator, PrefilledToyEnv, ToyTextEnv, ToyTextPolicy,
                              ToyTokenBackend)


def _engine(n_envs=None, replies=None, turns=3):
    backend = ToyTokenBackend(replies=replies)
    simulator = CountingSimulator()
    engine = RolloutEngine(lambda: ToyTextEnv(turns=turns), ToyTextPolicy(backend), simulator, n_envs=n_envs)
    return engine, backend, simulator


def _policy_view(trajectory, backend, system: str) -> list[dict]:
    """The whole dialogue as the policy saw it, as chat messages (for rendering with the template)."""
    chat = [{"role": "system", "content": system}]
    for seat, action in _interleave(trajectory):
        chat.append({"role": "assistant" if seat == "agent" else "user", "content": action})
    return chat


def _interleave(t):
    a, u = list(t.actions["agent"]), list(t.actions["user"])
    out, seat = [], "agent"
    while a or u:
        out.append((seat, (a if seat == "agent" else u).pop(0)))
        seat = "user" if seat == "agent" else "agent"
    return out


def test_one_batched_call_per_seat_per_turn():
    engine, backend, simulator = _engine()
    trajectories = engine.collect(["s0", "s1"], group_size=2, seed=0)
    assert len(trajectories) == 4
    # 3 agent turns and 2 user turns per dialogue, all 4 dialogues in lock-step: one call each.
    assert backend.calls == [4, 4, 4]
    assert simulator.batches == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert engine.stats.policy_calls == 3 and engine.stats.simulator_calls == 2
    assert engine.stats.env_steps == 4 * 5
    assert sorted(simulator.feedbacks) == [(s, 1.0) for s in range(4)]
    assert 0 <= engine.stats.outside_model_frac <= 1


def test_waves_of_n_envs_reset_the_simulator_per_wave():
    engine, backend, simulator = _engine(n_envs=3)
    trajectories = engine.collect(["s0", "s1"], group_size=2, seed=0)
    assert len(trajectories) == 4 and backend.calls == [3, 3, 3, 1, 1, 1]
    assert simulator.resets == [["s0", "s0", "s1"], ["s1"]]


def test_groups_seeds_and_determinism():
    engine, _, _ = _engine()
    a = engine.collect(["s2", "s0", "s3"], group_size=3, seed=5)
    assert [t.group for t in a] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [t.scenario_id for t in a] == ["s2"] * 3 + ["s0"] * 3 + ["s3"] * 3
    assert len({t.seed for t in a}) == 9  # distinct reset seeds within and across groups
    b = _engine()[0].collect(["s2", "s0", "s3"], group_size=3, seed=5)
    assert [(t.seed, t.token_ids, t.actions) for t in a] == [(t.seed, t.token_ids, t.actions) for t in b]
    c = _engine()[0].collect(["s2", "s0", "s3"], group_size=3, seed=6)
    assert [t.seed for t in a] != [t.seed for t in c]
    drawn = engine.collect(3, group_size=2, seed=1)
    assert len(drawn) == 6 and len({t.scenario_id for t in drawn}) == 3  # drawn without replacement


def test_trajectory_records_seats_rewards_and_success():
    engine, _, _ = _engine()
    t = engine.collect(["s1"], group_size=2, seed=0)[0]
    assert t.policy_seat == "agent" and t.user_seat == "user" and t.simulator == "counting"
    assert len(t.actions["agent"]) == 3 and len(t.actions["user"]) == 2
    assert len(t.observations["agent"]) == 3 and t.actions["user"][0] == "reply 0 1"
    assert t.rewards["agent"] == [0, 0, 0, 0, 1.0] and t.total_reward == 1.0 and t.success and t.terminated
    assert len(t.infos) == 5 and t.infos[-1]["success"] is True


def test_tokens_kept_exactly_as_generated_and_masked():
    engine, backend, _ = _engine()
    t = engine.collect(["s0"], group_size=2, seed=0)[0]
    ids, mask, logprobs = t.token_ids, t.mask, t.logprobs
    assert len(ids) == len(mask) == len(logprobs)
    # The generated "ab" stays two tokens; re-encoding the dialogue would merge it into one.
    generated = [i for i, m in zip(ids, mask) if m]
    reply = [ord(c) for c in "ab yes 0"] + [IM_END]
    assert generated[:len(reply)] == reply and MERGED_AB not in generated
    system = "Persuade (s0)."
    full = backend.encode_chat(_policy_view(t, backend, system), add_generation_prompt=False)
    assert ids != full[:len(ids)]
    # ... but the sequence is the template's rendering of the whole dialogue, token for token in text.
    assert backend.decode(ids) == backend.render(_policy_view(t, backend, system), False)[:len(backend.decode(ids))]
    # Mask: exactly the three replies; log-probs exactly as returned, zero elsewhere.
    assert sum(mask) == 3 * len(reply)
    spans = [j for j in range(len(mask)) if mask[j] and (j == 0 or not mask[j - 1])]
    assert len(spans) == 3
    for start in spans:
        assert logprobs[start:start + len(reply)] == pytest.approx([-0.25 - 0.01 * j for j in range(len(reply))])
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if not m)
    assert t.prompt_length == len(backend.encode_chat([{"role": "system", "content": system}]))


def test_no_retokenisation_of_earlier_turns():
    engine, backend, _ = _engine()
    trajectories = engine.collect(["s0", "s1"], group_size=1, seed=0)
    generated_texts = {a for t in trajectories for a in t.actions["agent"]}
    user_texts = [a for t in trajectories for a in t.actions["user"]]
    for chat in backend.encoded:
        contents = [m["content"] for m in chat]
        assert not generated_texts & set(contents), "a generated turn was re-encoded"
        # Each call encodes at most the messages that arrived since the policy's last turn.
        assert sum(c in user_texts for c in contents) <= 1


def test_rejected_policy_turn_adds_an_error_note_and_keeps_the_tokens():
    # Dialogue 0's first reply is empty: the env rejects it and the agent speaks again.
    engine, backend, _ = _engine(replies=lambda i, k: "" if (i, k) == (0, 0) else f"ab yes {k}")
    t = engine.collect(["s0"], group_size=2, seed=0)[0]
    assert t.actions["agent"][0] == "" and len(t.actions["agent"]) == 4
    text = backend.decode(t.token_ids)
    assert "<|im_start|>assistant\n<|im_end|>\n<|im_start|>user\n(Your last message was not accepted" in text
    assert sum(t.mask) == 1 + 3 * len("ab yes 0<")  # empty reply = just the end-of-turn token


def test_assistant_messages_the_policy_did_not_write_reach_its_prompt_as_context():
    backend = ToyTokenBackend()
    engine = RolloutEngine(lambda: PrefilledToyEnv(turns=2), ToyTextPolicy(backend), CountingSimulator())
    [t] = engine.collect(["s0"], seed=0)
    env = engine._envs[0]
    text = backend.decode(t.token_ids)
    # The greeting opens the first prompt; each env note follows the user's reply, in transcript order.
    chat = [{"role": "system", "content": "Persuade (s0)."}] + env.chat_view("agent")
    assert text == backend.render(chat, False)[:len(text)]
    assert "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nreply 0 1<|im_end|>\n" \
           "<|im_start|>assistant\n(note 2)<|im_end|>\n<|im_start|>assistant\n" in text
    for note in ("Hello!", "(note 2)", "(note 5)"):
        ids = backend.tokenize(note)
        [start] = [j for j in range(len(t.token_ids)) if t.token_ids[j:j + len(ids)] == ids]
        assert not any(t.mask[start:start + len(ids)])
    # The policy's own replies are kept exactly as generated (unmerged "ab") and are the only mask-1 tokens.
    reply = [ord(c) for c in "ab yes 0"] + [IM_END]
    generated = [i for i, m in zip(t.token_ids, t.mask) if m]
    assert generated == reply + [ord(c) for c in "ab yes 1"] + [IM_END] and sum(t.mask) == len(generated)
    assert t.prompt_length == len(backend.encode_chat(chat[:4]))  # system, greeting, reply, note
    for encoded in backend.encoded:  # no turn, generated or not, is encoded twice
        assert not {m["content"] for m in encoded} & {"ab yes 0", "ab yes 1"}


def test_chat_delta_closing_and_overlap():
    delta = ChatDelta(ToyTokenBackend())
    assert delta.closing == [IM_END, ord("\n")]
    assert delta.close_reply([65, IM_END]) == [ord("\n")]
    assert delta.close_reply([65, 66]) == [IM_END, ord("\n")]  # cut by the token limit: close it
    new = delta.messages([{"role": "user", "content": "hi"}])
    assert ToyTokenBackend().decode(new) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_act_policy_path_and_bad_arguments():
    class Constant(Player):
        def act_batch(self, observations, slots):
            return [f"yes {self.rngs[slot].integers(10)}" for slot in slots]

    simulator = CountingSimulator()
    engine = RolloutEngine(lambda: ToyTextEnv(), Constant(), simulator, n_envs=2)
    out = engine.run([Job("s0", 0, 1), Job("s1", 0, 2)], np.random.default_rng(0))
    assert all(t.success and t.token_ids == [] for t in out)
    with pytest.raises(TypeError, match="act_batch"):
        RolloutEngine(lambda: ToyTextEnv(), object(), simulator)
    with pytest.raises(ValueError, match="n_envs"):
        RolloutEngine(lambda: ToyTextEnv(), Constant(), simulator, n_envs=0)
    with pytest.raises(ValueError, match="group_size"):
        engine.collect(["s0"], group_size=0)


def test_a_seat_that_answers_too_few_or_too_many_actions_is_named_in_one_error():
    class Short(Player):
        def act_batch(self, observations, slots):
            return ["yes"] * (len(slots) - 1)

    class Long(CountingSimulator):
        def act_batch(self, observations, slots):
            return list(super().act_batch(observations, slots)) * 2

    with pytest.raises(ValueError, match=r"policy Short returned 1 action\(s\) for 2 observation\(s\)"):
        RolloutEngine(lambda: ToyTextEnv(), Short(), CountingSimulator(), n_envs=2).collect(["s0"], group_size=2)
    engine, _, _ = _engine()
    engine.simulator = Long()
    with pytest.raises(ValueError, match=r"simulator .* returned 4 action\(s\) for 2 observation\(s\)"):
        engine.collect(["s0"], group_size=2)


def test_rejected_user_seat_actions_are_counted_per_dialogue_and_logged(caplog):
    """A simulator whose messages the env rejects (here: over-long) burns its dialogues: counted, not silent."""
    from simpop.seat import Simulator

    class Overlong(Simulator):
        name = "overlong"

        def reset_batch(self, scenarios, rngs):
            pass

        def act_batch(self, observations, slots):
            return ["x" * 5000 for _ in slots]

    class Hello(Player):
        def act_batch(self, observations, slots):
            return ["Hello! Would you donate to Save the Children?" for _ in observations]

    engine = RolloutEngine("simpop/Persuasion-v1", Hello(), Overlong(), env_kwargs={"max_turns": 2})
    with caplog.at_level("WARNING", logger="simpop.rollout"):
        trajectories = engine.collect(2, group_size=2, seed=0)
    # A rejected seat acts again and every attempt spends a step: after the persuader's first message the user
    # seat burns the other 3 of the 4 dialogue steps; the closing survey answer is read, never rejected.
    assert [t.user_rejected for t in trajectories] == [3] * 4 and engine.stats.user_rejected == 12
    assert all(t.policy_turns == 1 and t.infos[-1]["outcome_source"] == "survey" for t in trajectories)
    assert "rejected 12 user-seat actions of simulator 'overlong'" in caplog.text
