"""``simpop study``: run a human study in the browser (``serve``), report it, size it, check completion codes.

Examples::

    simpop study serve --env simpop/Persuasion-v1 --policy A=run:runs/grpo --policy B=run:runs/cotrain \\
        --participant-mode self --bonus 1 --consent consent.md --debrief debrief.md \\
        --completion-url 'https://app.prolific.com/submissions/complete?cc=C1A2B3' \\
        --exclude min_human_s=30 --exclude attention=true --attention-check --out studies/p4g
    simpop study report studies/p4g
    simpop study verify studies/p4g KX3QF-7TZ2M-PA4LN
    simpop study simulate --env simpop/Persuasion-v1 --policy A=reference --policy B=module:pkg:Policy \\
        --simulator 'persuadee?personas=heldout' --participants 40 --out studies/sim
    simpop study plan studies/sim --difference 0.1

``serve`` prints the link to give participants (``http://127.0.0.1:8765/?token=...``); it binds to 127.0.0.1
unless ``--host`` says otherwise. Policy specs are ``simpop eval``'s (:mod:`simpop.evaluation.policies`).
Restarting ``serve`` with the same ``--out`` and settings continues the study; once a participant has joined,
other settings (exclusion rules included) are refused. Exit codes: 0 done; 1 ``verify`` found a code that is not
valid; 2 bad input.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
from pathlib import Path

from simpop.user_input import PORT, SECONDS, SEED, integer, number


def _study_options(parser: argparse.ArgumentParser) -> None:
    """The settings ``serve`` and ``simulate`` share (what ``study.json`` records)."""
    parser.add_argument("--env", required=True, help="a registered text env (e.g. simpop/Persuasion-v1)")
    parser.add_argument("--policy", action="append", required=True, metavar="LABEL=SPEC",
                        help="a policy of the study (repeat: A=SPEC, B=SPEC; participants never see the label)")
    parser.add_argument("--scenarios", nargs="+", metavar="ID", help="scenario ids to draw from (default: all)")
    parser.add_argument("--out", type=Path, required=True, help="the study folder (chats, study.json, reports)")
    parser.add_argument("--seed", type=SEED, default=0, help="seeds the blinded assignment and env resets (default 0)")
    parser.add_argument("--chats-per-participant", type=integer(1, 1000),
                        help="chats each participant has (default: one per policy, in random order)")
    parser.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="env constructor argument (YAML value), repeatable, e.g. --env-arg max_turns=6")
    parser.add_argument("--participant-mode", choices=("persona", "self"), default="persona",
                        help="persona: play the scenario's card; self: people as themselves (P4G only)")
    parser.add_argument("--bonus", type=number(0, 1e6, above=True), default=2.0,
                        help="self mode: the bonus in dollars a person may pledge part of (at most 2; default 2)")
    parser.add_argument("--questionnaire", nargs="+", default=[], metavar="ITEM",
                        help="persona attributes to ask before the first chat (P4G: age sex race edu marital "
                             "employment religion ideology)")
    parser.add_argument("--questionnaire-to-policy", action="store_true",
                        help="show each participant's questionnaire answers to the policies, after their instructions "
                             "(text model policies only; fixed once the first participant joins)")
    parser.add_argument("--consent", type=Path, help="the consent page's text (default: the shipped template)")
    parser.add_argument("--debrief", type=Path, help="the debrief page's text (default: the shipped template)")
    parser.add_argument("--id-param", action="append", default=[], metavar="KIND=NAME",
                        help="query parameter of a platform id (KIND: participant, study, session; repeatable; "
                             "default PROLIFIC_PID/workerId/participant_id, STUDY_ID/hitId/study_id, "
                             "SESSION_ID/assignmentId/session_id)")
    parser.add_argument("--require-external-id", action="store_true",
                        help="refuse a join whose link lacks the platform's participant id")
    parser.add_argument("--completion-url", help="where the debrief sends the person; {code} becomes their code")
    parser.add_argument("--attention-check", action="store_true",
                        help="ask an instructed-response item with each chat's ratings")
    parser.add_argument("--exclude", action="append", default=[], metavar="RULE=VALUE",
                        help="an exclusion rule the report applies: min_human_s=SECONDS, min_mean_chars=N, "
                             "attention=true (repeatable; fixed once the first participant joins)")
    parser.add_argument("--primary-outcome", default="success",
                        help="success, reward or a numeric env info key (P4G: donation); default success")
    parser.add_argument("--temperature", type=number(0, 100), default=0.0, help="text policies' temperature (default 0)")
    parser.add_argument("--max-new-tokens", type=integer(1, 1_000_000), default=512,
                        help="text policies' reply limit (default 512)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("Examples::", 1)[1].split("``serve`` prints")[0].rstrip()
    sub = parser.add_subparsers(dest="study_command", required=True, metavar="serve|report|verify|plan|simulate")
    serve = sub.add_parser("serve", help="serve the study's web app")
    _study_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=PORT, default=8765, help="port (default 8765)")
    serve.add_argument("--token", help="the study token participants need (default: $SIMPOP_STUDY_TOKEN, "
                                       "else a random one, printed)")
    serve.add_argument("--max-message-chars", type=integer(1, 100_000), default=1000, help="longest message (default 1000)")
    serve.add_argument("--message-rate", default="1/second;20/minute",
                       help="messages allowed per chat (default '1/second;20/minute')")
    serve.add_argument("--idle-timeout", type=SECONDS, default=900.0,
                       help="seconds without a reply before a chat is abandoned (default 900)")
    report = sub.add_parser("report", help="primary outcome, success and ratings per policy, exclusions, people")
    report.add_argument("dir", type=Path, help="the study folder")
    report.add_argument("--seed", type=SEED, default=0, help="the bootstrap's seed (default 0)")
    verify = sub.add_parser("verify", help="check completion codes (exit 1 if any is not valid)")
    verify.add_argument("dir", type=Path, help="the study folder")
    verify.add_argument("codes", nargs="+", metavar="CODE", help="completion codes participants submitted")
    plan = sub.add_parser("plan", help="participants needed for a target difference, from a pilot or simulated study")
    plan.add_argument("dir", type=Path, help="the study folder (a pilot, or `simpop study simulate`'s)")
    plan.add_argument("--difference", type=number(0, 1e6, above=True), required=True,
                      help="the paired difference in the primary outcome to detect (e.g. 0.1 in success)")
    plan.add_argument("--power", type=number(0, 1, above=True), default=0.8, help="target power (default 0.8)")
    plan.add_argument("--alpha", type=number(0, 1, above=True), default=0.05, help="two-sided level (default 0.05)")
    simulate = sub.add_parser("simulate", help="panel members play the participants through the HTTP API")
    _study_options(simulate)
    simulate.add_argument("--simulator", action="append", required=True, metavar="SPEC",
                          help="a panel member's simulator spec (repeat; members take participants in turn)")
    simulate.add_argument("--participants", type=integer(1, 100_000), required=True, help="simulated participants")


def run(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="simpop study: %(levelname)s: %(message)s")
    commands = {"serve": _serve, "report": _report, "verify": _verify, "plan": _plan, "simulate": _simulate}
    try:
        return commands[args.study_command](args)
    except (ValueError, KeyError, FileNotFoundError, ImportError) as error:
        from simpop.user_input import error_line

        print(f"simpop study: error: {error_line(error)}", file=sys.stderr)
        return 2


def _open(args: argparse.Namespace, idle_timeout_s: float = 900.0):
    from simpop.agents.base import SamplingParams
    from simpop.envs.registration import parse_env_args
    from simpop.study.study import ID_PARAMS, open_study, parse_policies

    id_params = {kind: list(names) for kind, names in ID_PARAMS.items()}
    given: dict[str, list[str]] = {}
    for item in args.id_param:
        kind, sep, name = item.partition("=")
        if not sep or kind not in ID_PARAMS or not name.strip():
            raise ValueError(f"--id-param {item!r}: write KIND=NAME with KIND one of {', '.join(ID_PARAMS)}")
        given.setdefault(kind, []).append(name.strip())
    id_params.update(given)
    exclusions: dict[str, float | bool] = {}
    for item in args.exclude:
        rule, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--exclude {item!r}: write RULE=VALUE, e.g. min_human_s=30 or attention=true")
        if rule == "attention":
            if value.lower() not in ("true", "false"):
                raise ValueError(f"--exclude {item!r}: attention=true or attention=false")
            exclusions[rule] = value.lower() == "true"
        else:
            try:
                exclusions[rule] = float(value)
            except ValueError:
                raise ValueError(f"--exclude {item!r}: {rule} takes a number") from None
    if exclusions.get("attention") and not args.attention_check:
        raise ValueError("--exclude attention=true needs --attention-check (the item must be asked)")
    policies = parse_policies(args.policy)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    return open_study(args.out, args.env, policies, scenarios=args.scenarios, seed=args.seed,
                      chats_per_participant=args.chats_per_participant, env_kwargs=parse_env_args(args.env_arg),
                      sampling=sampling, idle_timeout_s=idle_timeout_s, participant_mode=args.participant_mode,
                      bonus=args.bonus, questionnaire=args.questionnaire, consent=args.consent, debrief=args.debrief,
                      id_params=id_params, require_external_id=args.require_external_id,
                      completion_url=args.completion_url, attention_check=args.attention_check,
                      exclusions=exclusions, primary_outcome=args.primary_outcome,
                      questionnaire_to_policy=args.questionnaire_to_policy)


def _serve(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get("SIMPOP_STUDY_TOKEN") or secrets.token_urlsafe(16)
    study = _open(args, args.idle_timeout)
    from simpop.study.app import create_app, serve

    app = create_app(study, token, max_message_chars=args.max_message_chars, message_rate=args.message_rate)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.warning("binding %s: anyone who can reach this address and holds the token can join", args.host)
    print(f"study {args.out}: {len(study.arms)} policies, {len(study.settings['scenarios'])} scenario(s), "
          f"{study.settings['chats_per_participant']} chat(s) per participant, participants as "
          f"{study.settings['participant_mode']}")
    print(f"participants join at: http://{args.host}:{args.port}/?token={token}")
    print("  (recruitment platforms append their ids, e.g. &PROLIFIC_PID={{%PROLIFIC_PID%}}&STUDY_ID=...)")
    print(f"stop with Ctrl-C; then: simpop study report {args.out}")
    serve(app, args.host, args.port)
    return 0


def _report(args: argparse.Namespace) -> int:
    from simpop.evaluation.eval_summary import REPORT
    from simpop.study.report import write_report

    summary = write_report(args.dir, seed=args.seed)
    report = (args.dir / REPORT).read_text(encoding="utf-8")
    print(report[report.index("## Primary outcome"):report.index("\n![")].strip())
    print(f"wrote {args.dir}/summary.json, report.md, success.png ({summary['chats']} chat(s))")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from simpop.study.study import verify_codes

    found = verify_codes(args.dir, args.codes)
    for code, participant in found.items():
        print(f"{code}: " + (f"valid (participant {participant})" if participant else
                             "NOT VALID: no participant of this study completed it with this code"))
    return 0 if all(found.values()) else 1


def _plan(args: argparse.Namespace) -> int:
    from simpop.study.plan import plan, render_plan

    print(render_plan(plan(args.dir, args.difference, args.alpha, args.power), args.dir), end="")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from simpop.simulators.registry import build_many
    from simpop.study.plan import simulate

    logging.getLogger("httpx").setLevel(logging.WARNING)  # the in-process client logs every request at INFO
    study = _open(args)
    try:
        members = build_many(args.simulator, study.make_env())
        codes = simulate(study, members, args.participants, args.seed)
    finally:
        study.close()
    print(f"simulated {len(codes)} participant(s) in {args.out}; then: simpop study report {args.out}; "
          f"simpop study plan {args.out} --difference D")
    return 0
