"""``simpop eval`` from the command line: an agent behind a loopback OpenAI-compatible server, bad input, compare."""

from __future__ import annotations

import json
import socket

import pytest

from simpop.serve.server import make_server
from simpop.cli import main
from simpop.evaluation.eval_records import EPISODES, read_records
from tests.agents.fakes import EchoBackend

ACT = ["--env", "simpop/PersuasionAct-v0", "--env-arg", "max_turns=4", "--no-progress", "--threads", "1"]
PANEL = ("name: two-persuadees\nmembers:\n  cold: persuadee?temperature=0.8\n"
         "  heldout: persuadee:heldout-1?temperature=1.2\n")


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """``--threads`` sets torch's thread count for the process: put it back for the other tests."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def panel_file(tmp_path):
    path = tmp_path / "panel.yaml"
    path.write_text(PANEL)
    return path


def error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line naming the cause
    return err[0]


def test_an_agent_behind_a_loopback_server_on_a_two_member_panel(tmp_path, panel_file, capsys):
    backend = EchoBackend()
    out = tmp_path / "eval"
    with make_server(backend, port=0).start() as server:
        assert server.url.startswith("http://127.0.0.1:")
        code = main(["eval", "--env", "simpop/Persuasion-v0", "--env-arg", "max_turns=3", "--policy",
                     f"openai:{server.url}#echo", "--panel", str(panel_file), "--episodes", "4", "--seed", "1",
                     "--concurrency", "2", "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "panel two-persuadees: 2 members" in printed and "persuadee:heldout-1" in printed  # the card, first
    assert printed.index("panel two-persuadees") < printed.index("| **all** |")
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["members"]) == {"cold", "heldout"} and summary["episodes"] == 8 and summary["errors"] == 0
    for s in [summary, *summary["members"].values()]:
        assert 0.0 <= s["ci_low"] <= s["success"] <= s["ci_high"] <= 1.0
    records = read_records(out / EPISODES)
    said = [t["text"] for r in records for t in r.transcript if t["seat"] == "persuader"]
    assert said and all(text.startswith("echo: ") for text in said)  # the served agent spoke every turn
    assert sum(rows for rows, _ in backend.calls) >= len(said)  # (plus the one-token probe)
    report = (out / "report.md").read_text()
    assert "| cold |" in report and "| heldout |" in report and "Wilson" in report
    assert (out / "success.png").read_bytes()[:4] == b"\x89PNG"


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("extra", "message"), [
    (["--policy", "reference", "--panel", "no-such-panel"], "unknown panel 'no-such-panel'; named panels: "),
    (["--policy", "reference", "--panel", "{panel_dir}/bad.yaml"], "not valid YAML"),
    (["--policy", "gpt-banana", "--panel", "p4g-act-v1"], "unknown policy spec 'gpt-banana'"),
    (["--policy", "reference", "--panel", "tau2-mock-v1"], "panel 'tau2-mock-v1' is for simpop/Tau2-mock-v0"),
    (["--env", "simpop/Nope-v0", "--policy", "reference", "--panel", "p4g-act-v1"], "unknown env id 'simpop/Nope-v0'"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, extra, message):
    (tmp_path / "bad.yaml").write_text("members: [unclosed\n")
    extra = [e.replace("{panel_dir}", str(tmp_path)) for e in extra]
    code = main(["eval", *ACT, *extra, "--episodes", "2", "--out", str(tmp_path / "out")])
    assert code == 2
    assert message in error_line(capsys)
    assert not (tmp_path / "out" / EPISODES).exists()


def test_an_unreachable_endpoint_exits_2(tmp_path, panel_file, capsys):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    code = main(["eval", "--env", "simpop/Persuasion-v0", "--policy", f"openai:{url}#agent", "--panel", str(panel_file),
                 "--episodes", "2", "--out", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    line = error_line(capsys)
    assert f"{url}/chat/completions failed after 1 attempts" in line and "ConnectError" in line


def test_resume_compare_and_held_out_checks(tmp_path, panel_file, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    common = [*ACT, "--panel", str(panel_file), "--episodes", "6", "--concurrency", "4"]
    assert main(["eval", *common, "--policy", "tests.evaluation.test_eval_policies:FirstAct", "--out", str(a)]) == 0
    assert main(["eval", *common, "--policy", "reference", "--out", str(b)]) == 0
    capsys.readouterr()
    # Finished work is never overwritten; --resume of a finished evaluation runs nothing.
    assert main(["eval", *common, "--policy", "reference", "--out", str(b)]) == 2
    assert "already holds an evaluation" in error_line(capsys)
    before = (b / EPISODES).read_text()
    assert main(["eval", *common, "--policy", "reference", "--out", str(b), "--resume"]) == 0
    assert (b / EPISODES).read_text() == before
    assert main(["eval", *common, "--policy", "reference", "--out", str(b), "--resume", "--seed", "3"]) == 2
    assert "different settings" in error_line(capsys)
    # compare: paired B - A per member and overall, printed as markdown.
    assert main(["eval", "compare", str(a), str(b), "--resamples", "500", "--out", str(tmp_path / "cmp")]) == 0
    table = capsys.readouterr().out
    assert "| member | pairs | success A | success B | B - A | 95% CI |" in table
    assert "| cold |" in table and "| **all** |" in table
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["overall"]["pairs"] >= 6
    assert main(["eval", "compare", str(a)]) == 2
    capsys.readouterr()
    # --run: the panel must be held out from that training run's simulators.
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"trainer": "grpo", "simulator": "persuadee?temperature=0.8"}))
    code = main(["eval", *common, "--policy", "reference", "--out", str(tmp_path / "c"), "--run", str(run)])
    assert code == 2
    assert "is not held out from training" in error_line(capsys)
    held_out = "persuadee:heldout-5?decoding=greedy&personas=modal"  # other model, decoding and persona set
    (run / "run.json").write_text(json.dumps({"trainer": "grpo", "simulator": held_out}))
    assert main(["eval", *common, "--policy", "reference", "--out", str(tmp_path / "c"), "--run", str(run)]) == 0
    assert "is held out from the simulators of" in capsys.readouterr().out
