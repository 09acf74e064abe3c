"""The study page in a real headless browser (Playwright driving Debian's chromium; `make browser` installs it).

``SIMPOP_STUDY_SCREENSHOTS=docs/study pytest tests/study/test_browser.py -k mode`` refreshes the docs'
screenshots of each page (consent, card in both modes, questionnaire, survey, rating, debrief).
"""

from __future__ import annotations

import os
import shutil

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install simpop[test])")
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
if CHROMIUM is None:
    pytest.skip("chromium is not installed (make browser, or apt-get install chromium)", allow_module_level=True)

from simpop.cli import main  # noqa: E402
from simpop.study.app import create_app  # noqa: E402
from simpop.study.storage import read_chats, read_counts, read_ledger  # noqa: E402
from simpop.study.study import verify_codes  # noqa: E402
from tests.study.conftest import TOKEN, Server, make_study  # noqa: E402
from tests.study.policies import Payload  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture(params=[False])
def page(browser, request):
    """A page under the app's Content-Security-Policy (``bypass_csp`` when the test is parametrised so)."""
    context = browser.new_context(viewport={"width": 1280, "height": 860}, bypass_csp=request.param)
    page = context.new_page()
    page.set_default_timeout(20_000)
    yield page
    context.close()


def say(page, text, reply=True):
    """Send ``text`` and wait for the agent's reply (``reply=False``: for the closing survey)."""
    count = page.locator("#messages li").count()
    page.fill("#text", text)
    page.click("#send")
    sync_api.expect(page.locator("#messages li")).to_have_count(count + 1 + int(reply))
    if reply:
        sync_api.expect(page.locator("#text")).to_be_enabled()


def snap(page, name):
    """With ``SIMPOP_STUDY_SCREENSHOTS=DIR``, save the page as ``DIR/NAME.png`` (the docs' screenshots)."""
    if folder := os.environ.get("SIMPOP_STUDY_SCREENSHOTS"):
        from PIL import Image

        path = os.path.join(folder, f"{name}.png")
        page.screenshot(path=path)
        Image.open(path).convert("RGB").quantize(128).save(path, optimize=True)  # a palette: each under 200 KB


def rate(page, attention=False):
    page.wait_for_selector("#rating:not([hidden])")
    page.check("input[name=naturalness][value='4']")
    page.check("input[name=again][value='yes']")
    if attention:
        page.check("input[name=attention][value='2']")
    page.click("#rate")


def debrief_code_and_redirect(page, study_dir):
    """The debrief shows a valid completion code; its link takes the person to the platform with it."""
    page.wait_for_selector("#debrief:not([hidden])")
    assert "computer programs" in page.text_content("#debrief-text")
    code = page.text_content("#code")
    (participant,) = {r.member for r in read_chats(study_dir)}
    assert verify_codes(study_dir, [code]) == {code: participant}
    snap(page, "debrief")
    page.click("#redirect")
    page.wait_for_url(f"**/static/style.css?cc={code}")
    return code


def test_persona_mode_consent_chats_survey_ratings_debrief_code_and_redirect(page, tmp_path, capsys):
    study = make_study(tmp_path / "study")
    with Server(create_app(study, TOKEN, message_rate="20/second")) as url:
        study.settings["completion_url"] = f"{url}/static/style.css?cc={{code}}"  # the port is known only now
        page.goto(f"{url}/?token={TOKEN}&PROLIFIC_PID=abc123&STUDY_ID=s1&SESSION_ID=x9")
        page.wait_for_selector("#consent:not([hidden])")
        assert "token" not in page.url and "abc123" not in page.url  # the token and ids leave the address bar
        assert "Consent to take part" in page.text_content("#consent-text") and page.is_hidden("#study")
        snap(page, "consent")
        page.click("#agree")
        page.wait_for_selector("#messages li.agent")
        assert "Who you are" in page.text_content("#instructions")
        assert page.text_content("#card-title") == "Your role"
        say(page, "Hi! What is this charity about?")
        say(page, "Interesting, and where does the money go?")
        snap(page, "card-persona")
        say(page, "Let me think about it.", reply=False)
        page.wait_for_selector("#survey:not([hidden])")
        assert page.is_hidden("#composer")
        snap(page, "survey")
        page.get_by_role("button", name="I donate $0.50").click()
        page.wait_for_selector("#rating:not([hidden])")
        assert page.text_content("#status") == "The chat is over."
        snap(page, "rating")
        texts = page.locator("#messages li").all_text_contents()
        rate(page)
        page.wait_for_selector("#next:not([hidden])")
        page.click("#next-chat")  # the same participant (kept by the page) meets the other policy
        sync_api.expect(page.locator("#progress")).to_have_text("Chat 2 of 2")
        page.wait_for_selector("#messages li.agent")
        say(page, "No thanks, I'll pass.", reply=False)
        rate(page)
        debrief_code_and_redirect(page, tmp_path / "study")
    study.close()
    first, second = read_chats(tmp_path / "study")
    assert second.member == first.member and second.trial == 1 and second.info["donation"] == 0.0
    assert {first.extra["study"]["policy"], second.extra["study"]["policy"]} == {"A", "B"}
    assert set(first.extra["study"]["external"]) == {"participant", "study", "session"}
    record = first
    assert [t["text"] for t in record.transcript if t["seat"] == "persuadee"] == [
        "Hi! What is this charity about?", "Interesting, and where does the money go?", "Let me think about it."]
    assert len(texts) == 6 and texts[1].endswith("Hi! What is this charity about?")
    assert record.info["survey_answer"] == "I donate $0.50" and record.success and record.reward == 1.0
    assert record.extra["study"]["ratings"] == {"naturalness": 4, "would_talk_again": True}
    assert main(["study", "report", str(tmp_path / "study")]) == 0
    report = (tmp_path / "study" / "report.md").read_text()
    label = record.extra["study"]["policy"]
    assert f"| {label} | 1 | 0 | 0 | 1 | 1.000 |" in report and "4.000 (n=1)" in report
    assert "received a completion code" in capsys.readouterr().out or "1 received a completion code" in report


def test_self_mode_consent_questionnaire_chat_attention_debrief_code_and_redirect(page, tmp_path):
    study = make_study(tmp_path / "study", participant_mode="self", bonus=1.0, chats_per_participant=1,
                       questionnaire=["age", "sex", "ideology"], attention_check=True)
    with Server(create_app(study, TOKEN, message_rate="20/second")) as url:
        study.settings["completion_url"] = f"{url}/static/style.css?cc={{code}}"
        page.goto(f"{url}/?token={TOKEN}&PROLIFIC_PID=self-1")
        page.click("#agree")
        page.wait_for_selector("#questionnaire:not([hidden])")
        page.fill("#q-age", "34")
        page.select_option("#q-sex", "Female")
        snap(page, "questionnaire")
        page.click("#answer")
        page.wait_for_selector("#messages li.agent")
        card = page.text_content("#instructions")
        assert "bonus of $1.00" in card and "Who you are" not in card
        assert page.text_content("#card-title") == "Your task"
        say(page, "Hello, who are you?")
        say(page, "What would my money do?")
        snap(page, "card-self")
        say(page, "I need to think.", reply=False)
        page.wait_for_selector("#survey:not([hidden])")
        options = page.locator("#survey-options button").all_text_contents()
        assert options[-1] == "I donate $1.00" and "I donate $2.00" not in options
        page.get_by_role("button", name="I donate $0.25").click()
        page.wait_for_selector("#rating:not([hidden])")
        page.check("input[name=naturalness][value='4']")
        page.check("input[name=again][value='yes']")
        page.click("#rate")  # the attention item is required
        sync_api.expect(page.locator("#notice")).to_have_text("Please answer every question.")
        rate(page, attention=True)
        debrief_code_and_redirect(page, tmp_path / "study")
    study.close()
    (record,) = read_chats(tmp_path / "study")
    assert record.info["donation"] == 0.25 and record.success and record.extra["study"]["ratings"]["attention"] == 2
    (joined, answered, completed) = read_ledger(tmp_path / "study")
    assert answered["answers"] == {"age": 34.0, "sex": "Female", "ideology": None}
    assert completed["event"] == "completed"


def test_declining_consent_keeps_nothing_but_a_count(page, tmp_path):
    study = make_study(tmp_path / "study")
    with Server(create_app(study, TOKEN)) as url:
        page.goto(f"{url}/?token={TOKEN}&PROLIFIC_PID=no-thanks")
        page.click("#decline")
        sync_api.expect(page.locator("#notice")).to_contain_text("Nothing about you was kept")
        assert page.is_hidden("#study") and page.is_hidden("#consent")
    study.close()
    assert sorted(p.name for p in (tmp_path / "study").iterdir()) == ["counts.json", "salt", "study.json"]
    assert read_counts(tmp_path / "study") == {"declined": 1}


@pytest.mark.parametrize("page", [True], indirect=True)
def test_html_and_script_in_chat_text_show_as_text(page, tmp_path):
    """With the page's CSP bypassed, so that only the escaping stands between chat text and the DOM."""
    study = make_study(tmp_path / "study", policies={"A": "tests.study.policies:Payload"})
    typed = '<script>window.__pwned = 3</script><img src=x onerror="window.__pwned = 4">'
    with Server(create_app(study, TOKEN, message_rate="20/second")) as url:
        page.goto(f"{url}/?token={TOKEN}")
        page.click("#agree")
        page.wait_for_selector("#messages li.agent")
        say(page, typed)
        items = page.locator("#messages li")
        texts = items.all_text_contents()
        assert texts[0] == "Chat partner" + Payload.TEXT and texts[1] == "You" + typed
        assert page.locator("#messages img, #messages script, #messages b").count() == 0
        assert page.evaluate("window.__pwned") is None
    study.close()
