"""Peak memory of LLM training steps (SmolLM2-135M, float32, LoRA r=16 on every projection), one process per case.

Each case runs in a child process of its own and reports its peak resident memory (``VmHWM`` of
``/proc/self/status``) and its step time; the parent prints the table and the ratios, measured side by side
in one run:

- ``load``: the base model loaded (the floor);
- ``score``: a plain scoring pass (``token_logprobs`` under ``no_grad``) over the simulator workload;
- ``adapter``: one trainable simulator's step (its ``score``: scored pass + reference pass with adapters
  off; loss with the k3 KL, backward, Adam);
- ``cotrain``: K=4 trainable simulators and a policy adapter on one base model, ``ROUNDS`` steps each (the
  policy's step: its ``score`` and ``reference_logprobs`` of two dialogues, a GRPO-style loss, backward, Adam),
  each optimiser kept for the run as ``CoTrainer`` keeps them;
- ``cotrain_offload``: the same with every optimiser's state on disk between its steps and the gradients freed
  after them (:class:`~simpop.train.offload.OffloadedOptimizer`, what ``CoTrainer`` does since issue 29); its
  losses must equal ``cotrain``'s, step for step (printed side by side);
- ``policy``: the co-training policy's step alone (what sets ``cotrain``'s peak: its padded tokens against the
  backend's ``token_budget``, the activation checkpointing threshold); with ``--budgets`` its loss and time at each;
- ``offload``: the time of one Adam step on parameters shaped like the rank-16 SmolLM2 LoRA adapter (no model),
  plain vs :class:`~simpop.train.offload.OffloadedOptimizer` (state written to and read from disk), ``OFFLOAD_REPS``
  steps each, interleaved: the offload's cost per optimiser step (``plain_ms``, ``offload_ms``);
- ``tau2``: one τ² text GRPO step (``collect`` + ``update``: 2 dialogues on the mock domain with the scripted
  user, LoRA policy); its peak is the update's (counted from the resident memory after the rollout), the
  rollout's is ``rollout_peak_mb``;
- ``grpo_ours`` / ``grpo_trl``: the same GRPO update (the same collected batch of 4 P4G dialogues, the same
  LoRA policy, one optimiser step, no KL) timed in simpop's ``GRPOTrainer.update`` and in TRL's
  ``GRPOTrainer`` (``compute_loss`` + backward + optimiser step on the inputs TRL prepares from that batch).

The simulator workload is synthetic (the memory of a step depends on lengths, not on the words): 2
dialogues x 3 simulator turns, a 120-token first prompt growing by 64 tokens a turn, 32-token replies
(random token ids, seeded; 1,296 scored-row tokens per simulator step). Sizes are small so that a run fits
in ~20 minutes on 2 busy CPU cores.

``adapter`` takes ``ROUNDS`` steps of one simulator too. Targets (issues 19, 29): cotrain_offload <= 1.3x
adapter; tau2 <= 2 GB; grpo_ours <= 0.9x grpo_trl. ``--budgets 1024 512`` runs the cases at each token budget and
prints their peaks, times and losses side by side (issue 29: at 512 the K=4 co-training peak meets the target,
at 2.2x the policy step's time; the default stays 1024); ``--checkpoints 1024 0`` does the same for the
checkpointing threshold alone (``checkpoint_tokens``: micro-batches unchanged). ``--trim`` calls
glibc's ``malloc_trim(0)`` after every step (returning freed heap pages to the system).

Run ``PYTHONPATH=<tree>/src python benchmarks/memory.py`` to measure another checkout with the same script
(the cases use only APIs that predate the lean scoring path).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CASES = ("load", "score", "adapter", "cotrain", "cotrain_offload", "policy", "offload", "tau2", "grpo_ours",
         "grpo_trl")
ROUNDS = 2
OFFLOAD_REPS = 5
DIALOGUES, TURNS, FIRST_PROMPT, GROWTH, REPLY = 2, 3, 120, 64, 32
LORA_R, LORA_ALPHA = 16, 32


def peak_mb() -> float:
    """This process's peak resident memory (VmHWM) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def reset_peak() -> None:
    """Restart the peak (VmHWM) at the current resident memory."""
    Path("/proc/self/clear_refs").write_text("5")


def trim() -> None:
    """Return freed heap memory to the system (glibc only)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def episodes(vocab: int, seed: int = 0):
    """The synthetic simulator workload (see the module docstring)."""
    import numpy as np

    from simpop.simulators.trainable import LLMEpisode, LLMTurn

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(DIALOGUES):
        history = rng.integers(0, vocab, FIRST_PROMPT).tolist()
        episode = LLMEpisode()
        for _ in range(TURNS):
            reply = rng.integers(0, vocab, REPLY).tolist()
            episode.turns.append(LLMTurn(list(history), reply, [-1.0] * REPLY))
            history += reply + rng.integers(0, vocab, GROWTH - REPLY).tolist()
        out.append(episode)
    return out


BACKEND: dict[str, int] = {}  # --token-budget, --checkpoint-tokens (absent: the backend's defaults)


def backend():
    from simpop.agents.transformers_backend import TransformersBackend

    return TransformersBackend("smollm2", dtype="float32", **BACKEND)


def simulator_step(sim, work, optimizer) -> float:
    import torch

    scores = sim.score(work)
    advantages = torch.tensor([1.0, -1.0])
    loss = -(advantages * scores.logprob).mean() + 0.1 * scores.kl.mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def policy_step(policy, work, optimizer) -> float:
    """A GRPO-style step on whole dialogues: the simulator's turns are the policy's prompt tokens here."""
    import torch

    sequences = [e.turns[-1].prompt_ids + e.turns[-1].token_ids for e in work]
    masks = [[int(i % GROWTH < REPLY) for i in range(len(s))] for s in sequences]  # alternating seats
    reference = policy.reference_logprobs(sequences, masks)
    scores = policy.score(sequences, masks)
    delta = reference - scores.logprobs
    advantage = torch.tensor([[1.0], [-1.0]])
    per_token = -advantage * scores.logprobs + 0.04 * (torch.exp(delta) - delta - 1)
    loss = (per_token * scores.mask).sum() / scores.mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def run_case(case: str, args: argparse.Namespace) -> dict[str, float]:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from simpop.agents.base import SamplingParams
    from simpop.simulators.trainable import TrainableLLMSimulator

    after = trim if args.trim else (lambda: None)
    if case in ("tau2", "grpo_ours", "grpo_trl", "offload"):
        return globals()[f"case_{case}"](args, after)
    model = backend()
    work = episodes(model.vocab_size)
    start = time.perf_counter()
    if case == "score":
        sequences = [t.prompt_ids + t.token_ids for e in work for t in e.turns]
        masks = [[0] * len(t.prompt_ids) + [1] * len(t.token_ids) for e in work for t in e.turns]
        with torch.no_grad():
            model.token_logprobs(sequences, masks)
    elif case == "policy":
        from simpop.agents.policy import LLMPolicy

        policy = LLMPolicy(model, lora=True, lora_r=LORA_R, lora_alpha=LORA_ALPHA)
        optimizer = torch.optim.Adam(policy.parameters(), lr=1e-4)
        losses = []
        for _ in range(args.rounds):
            losses.append(policy_step(policy, work, optimizer))
            after()
        return {"step_s": time.perf_counter() - start, "losses": losses}
    elif case in ("adapter", "cotrain", "cotrain_offload"):
        wrap = lambda optimizer: optimizer  # noqa: E731
        if case == "cotrain_offload":
            from simpop.train.offload import OffloadedOptimizer as wrap  # noqa: N813
        params = SamplingParams(max_new_tokens=REPLY, temperature=1.0)
        count = 1 if case == "adapter" else 4
        sims = [TrainableLLMSimulator(model, f"sim{i}", params, lora_r=LORA_R, lora_alpha=LORA_ALPHA)
                for i in range(count)]
        steps = [(sim, simulator_step, wrap(torch.optim.Adam(sim.parameters(), lr=1e-4))) for sim in sims]
        if case != "adapter":  # the policy steps last: as in every update after the first, the simulators'
            from simpop.agents.policy import LLMPolicy  # optimiser states exist during its step

            policy = LLMPolicy(model, lora=True, lora_r=LORA_R, lora_alpha=LORA_ALPHA)
            steps.append((policy, policy_step, wrap(torch.optim.Adam(policy.parameters(), lr=1e-4))))
        losses = []
        for _ in range(args.rounds):
            for trained, step, optimizer in steps:
                losses.append(step(trained, work, optimizer))
                after()
        return {"step_s": time.perf_counter() - start, "losses": losses}
    return {"step_s": time.perf_counter() - start}


def case_offload(args: argparse.Namespace, after) -> dict[str, float]:
    """Adam steps on LoRA-adapter-shaped parameters, plain vs offloaded (module docstring)."""
    import torch

    from simpop.train.offload import OffloadedOptimizer

    torch.manual_seed(0)
    # SmolLM2-135M: 30 layers, hidden 576, MLP 1536, 9 query / 3 key-value heads of 64; rank-16 LoRA on every projection.
    shapes = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
    def adapter() -> list[torch.nn.Parameter]:
        return [torch.nn.Parameter(torch.randn(*shape) * 0.01) for _ in range(30) for o, i in shapes
                for shape in ((LORA_R, i), (o, LORA_R))]
    plain_params, offload_params = adapter(), adapter()
    plain = torch.optim.Adam(plain_params, lr=1e-4)
    offloaded = OffloadedOptimizer(torch.optim.Adam(offload_params, lr=1e-4))
    times: dict[str, list[float]] = {"plain": [], "offload": []}
    for _ in range(OFFLOAD_REPS + 1):  # the first (state creation) is not counted
        for name, params, optimizer in (("plain", plain_params, plain), ("offload", offload_params, offloaded)):
            for p in params:
                p.grad = torch.randn_like(p)
            start = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - start)
            optimizer.zero_grad(set_to_none=True)
    n = sum(p.numel() for p in plain_params)
    return {"step_s": sum(times["offload"][1:]), "params_m": n / 1e6,
            "plain_ms": 1e3 * min(times["plain"][1:]), "offload_ms": 1e3 * min(times["offload"][1:])}


def case_tau2(args: argparse.Namespace, after) -> dict[str, float]:
    from simpop.agents.policy import LLMPolicy
    from simpop.envs.tau2.simulators import ScriptedUser
    from simpop.train.grpo import GRPOConfig, GRPOTrainer

    config = GRPOConfig(group_size=2, scenarios_per_update=1, max_new_tokens=16, seed=0)
    policy = LLMPolicy(backend(), config.sampling(), lora=True, lora_r=LORA_R, lora_alpha=LORA_ALPHA)
    trainer = GRPOTrainer("simpop/Tau2-mock-v0", policy, ScriptedUser(), config,
                          env_kwargs={"domain": "mock", "max_steps": 6})
    start = time.perf_counter()
    batch = trainer.collect()
    rollout, rollout_peak = time.perf_counter() - start, peak_mb()
    after()
    reset_peak()  # from here on the peak is the update's (counted from the resident memory after the rollout)
    metrics = trainer.update(batch)
    after()
    tokens = [len(t.token_ids) for t in batch.trajectories]
    return {"step_s": time.perf_counter() - start, "rollout_s": rollout, "update_s": metrics["update_s"],
            "rollout_peak_mb": rollout_peak, "tokens": float(sum(tokens)), "longest": float(max(tokens))}


def _grpo_batch():
    """A collected GRPO batch of 4 P4G text dialogues and the LoRA policy that collected it."""
    import numpy as np

    import simpop
    from simpop.agents.policy import LLMPolicy
    from simpop.envs.persuasion.simulators import native_text
    from simpop.train.grpo import Batch, GRPOConfig, GRPOTrainer

    env, kwargs = "simpop/Persuasion-v0", {"max_turns": 2}
    config = GRPOConfig(group_size=4, scenarios_per_update=1, max_new_tokens=16, seed=0, kl_coef=0.0)
    policy = LLMPolicy(backend(), config.sampling(), lora=True, lora_r=LORA_R, lora_alpha=LORA_ALPHA)
    trainer = GRPOTrainer(env, policy, native_text(simpop.make(env, **kwargs)), config, env_kwargs=kwargs)
    batch = trainer.collect()
    # Advantages with signal, so that both trainers do the whole update.
    return trainer, Batch(batch.trajectories, np.array([1.0, -1.0, 0.5, -0.5]), batch.stats)


def case_grpo_ours(args: argparse.Namespace, after) -> dict[str, float]:
    trainer, batch = _grpo_batch()
    trainer.update(batch)  # warm-up (first-call allocations)
    start = time.perf_counter()
    trainer.update(batch)
    after()
    return {"step_s": time.perf_counter() - start}


def case_grpo_trl(args: argparse.Namespace, after) -> dict[str, float]:
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import tempfile

    import torch
    from trl import GRPOConfig, GRPOTrainer

    from simpop.train.trl_adapter import env_reward, scenario_dataset

    ours, batch = _grpo_batch()
    model = ours.policy.backend.model  # the PEFT model with the policy adapter
    trajectories = batch.trajectories

    def replay(prompts, trainer):  # the same dialogues, in TRL's rollout_func format
        return {"prompt_ids": [t.token_ids[:t.prompt_length] for t in trajectories],
                "completion_ids": [t.token_ids[t.prompt_length:] for t in trajectories],
                "logprobs": [t.logprobs[t.prompt_length:] for t in trajectories],
                "env_mask": [t.mask[t.prompt_length:] for t in trajectories],
                "env_reward": [float(a) for a in batch.advantages]}

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, per_device_train_batch_size=4, num_generations=4, max_steps=1,
                            report_to=[], use_cpu=True, save_strategy="no", bf16=False, disable_tqdm=True,
                            beta=0.0, learning_rate=1e-5, max_completion_length=4096)
        trainer = GRPOTrainer(model=model, processing_class=ours.policy.backend.tokenizer, reward_funcs=env_reward,
                              train_dataset=scenario_dataset("simpop/Persuasion-v0", n=4), rollout_func=replay,
                              args=config)
        trainer.create_optimizer_and_scheduler(num_training_steps=1)
        prompts = [{"prompt": trajectories[0].scenario_id}] * 4
        inputs = trainer._generate_and_score_completions(prompts)
        trainer.current_gradient_accumulation_steps = 1  # set by TRL's training loop, read by compute_loss
        model.train()

        def update() -> None:
            trainer.optimizer.zero_grad(set_to_none=True)
            loss = trainer.compute_loss(model, inputs)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
            trainer.optimizer.step()

        update()  # warm-up
        start = time.perf_counter()
        update()
        after()
        return {"step_s": time.perf_counter() - start}


def child(case: str, args: argparse.Namespace) -> None:
    result = run_case(case, args)
    print("RESULT " + json.dumps({**result, "peak_mb": peak_mb()}), flush=True)


def measure(args: argparse.Namespace, setting: str) -> dict[str, dict[str, float]]:
    """Each case's result (a child process each) with the backend set as ``setting`` says (:func:`settings`)."""
    results: dict[str, dict[str, float]] = {}

    def launch(case: str) -> subprocess.Popen:
        command = [sys.executable, __file__, "--child", case, "--threads", str(args.threads), "--rounds",
                   str(args.rounds)] + (["--trim"] if args.trim else []) + setting.split()
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    if args.parallel:
        children = {case: launch(case) for case in args.cases}
        outputs = {case: process.communicate() for case, process in children.items()}
    else:
        outputs = {case: launch(case).communicate() for case in args.cases}
    print(f"{setting or 'defaults'} (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}):")
    for case, (stdout, stderr) in outputs.items():
        line = next((x for x in stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{case}: failed\n{stderr[-3000:]}", file=sys.stderr)
            continue
        results[case] = json.loads(line[len("RESULT "):])
        extra = {k: round(v, 2) for k, v in results[case].items() if k not in ("peak_mb", "step_s", "losses")}
        print(f"{case:10s} peak {results[case]['peak_mb']:7.0f} MB   step {results[case]['step_s']:7.2f} s   "
              f"{extra or ''}", flush=True)
    return results


def settings(args: argparse.Namespace) -> list[str]:
    """The backend settings to measure side by side, as child-process flags (``""``: the defaults)."""
    budget = [f"--token-budget {args.token_budget}"] if args.token_budget else []
    checkpoint = [f"--checkpoint-tokens {args.checkpoint_tokens}"] if args.checkpoint_tokens is not None else []
    if args.budgets:
        return [" ".join([f"--token-budget {b}", *checkpoint]) for b in args.budgets]
    if args.checkpoints:
        return [" ".join([*budget, f"--checkpoint-tokens {c}"]) for c in args.checkpoints]
    return [" ".join(budget + checkpoint)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) after every step")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="steps of each adapter in the simulator cases")
    parser.add_argument("--token-budget", type=int, help="the backend's token budget (micro-batch size); "
                                                         "default: the backend's")
    parser.add_argument("--checkpoint-tokens", type=int, help="the backend's activation checkpointing threshold; "
                                                              "default: the backend's (its token budget)")
    parser.add_argument("--budgets", type=int, nargs="+",
                        help="measure the cases at each of these token budgets, side by side (losses compared)")
    parser.add_argument("--checkpoints", type=int, nargs="+",
                        help="measure the cases at each of these checkpointing thresholds (the budget as given)")
    parser.add_argument("--parallel", action="store_true",
                        help="run the cases' children side by side (peaks are per process; times share the CPU)")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    BACKEND.update({k: v for k, v in (("token_budget", args.token_budget),
                                      ("checkpoint_tokens", args.checkpoint_tokens)) if v is not None})
    if args.child:
        child(args.child, args)
        return
    chosen = settings(args)
    tables = {setting: measure(args, setting) for setting in chosen}
    results = tables[chosen[0]]

    def ratio(a: str, b: str, key: str = "peak_mb", table: dict | None = None) -> str:
        table = results if table is None else table
        return f"{table[a][key] / table[b][key]:.2f}x" if a in table and b in table else "n/a"

    for setting, table in tables.items():
        print(f"{setting or 'defaults'}: cotrain_offload / adapter peak: "
              f"{ratio('cotrain_offload', 'adapter', table=table)} (target <= 1.3x; without the offload "
              f"{ratio('cotrain', 'adapter', table=table)}); cotrain_offload / cotrain: "
              f"{ratio('cotrain_offload', 'cotrain', table=table)}; step time cotrain_offload / cotrain: "
              f"{ratio('cotrain_offload', 'cotrain', 'step_s', table)}")
        if "cotrain" in table and "cotrain_offload" in table:
            pairs = list(zip(table["cotrain"]["losses"], table["cotrain_offload"]["losses"]))
            print("  co-training losses, kept vs offloaded optimiser state (sim0..sim3, policy, per round): "
                  + ", ".join(f"{a:.6f}/{b:.6f}" for a, b in pairs)
                  + f"; identical: {'yes' if all(a == b for a, b in pairs) else 'NO'}")
    if len(tables) > 1:
        first, *rest = chosen
        for case in ("adapter", "cotrain", "cotrain_offload", "policy"):
            for other in rest:
                a, b = tables[first].get(case), tables[other].get(case)
                if a and b:
                    worst = max((abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a["losses"], b["losses"])),
                                default=0.0)
                    print(f"{case}: {first or 'defaults'} vs {other}: peak {a['peak_mb']:.0f} vs {b['peak_mb']:.0f} MB, "
                          f"step {a['step_s']:.2f} vs {b['step_s']:.2f} s ({b['step_s'] / a['step_s']:.2f}x); losses "
                          + ", ".join(f"{x:.6f}/{y:.6f}" for x, y in zip(a["losses"], b["losses"]))
                          + f" (largest relative difference {worst:.1e})")
    print(f"cotrain / score peak:   {ratio('cotrain', 'score')}")
    print(f"adapter / score peak:   {ratio('adapter', 'score')}")
    if "tau2" in results:
        print(f"tau2 update peak:       {results['tau2']['peak_mb'] / 1024:.2f} GB (target <= 2 GB); rollout peak "
              f"{results['tau2']['rollout_peak_mb'] / 1024:.2f} GB")
    print(f"GRPO update time ours / TRL: {ratio('grpo_ours', 'grpo_trl', 'step_s')} (target <= 0.9x)")


if __name__ == "__main__":
    main()
