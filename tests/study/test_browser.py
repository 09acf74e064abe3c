"""The study page in a real headless browser (Playwright driving Debian's chromium; `make browser` installs it).

``SIMPOP_STUDY_SCREENSHOT=docs/study/page.png pytest tests/study/test_browser.py -k survey`` refreshes the docs'
screenshot of the page.
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
from simpop.study.storage import read_chats  # noqa: E402
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


def test_chat_survey_ratings_transcript_and_report(page, tmp_path, capsys):
    study = make_study(tmp_path / "study")
    with Server(create_app(study, TOKEN, message_rate="20/second")) as url:
        page.goto(f"{url}/?token={TOKEN}")
        page.wait_for_selector("#messages li.agent")
        assert "token" not in page.url  # the token leaves the address bar
        assert "Who you are" in page.text_content("#instructions")
        say(page, "Hi! What is this charity about?")
        say(page, "Interesting, and where does the money go?")
        if path := os.environ.get("SIMPOP_STUDY_SCREENSHOT"):
            page.screenshot(path=path, full_page=True)
        say(page, "Let me think about it.", reply=False)
        page.wait_for_selector("#survey:not([hidden])")
        assert page.is_hidden("#composer")
        page.get_by_role("button", name="I donate $0.50").click()
        page.wait_for_selector("#rating:not([hidden])")
        assert page.text_content("#status") == "The chat is over."
        page.check("input[name=naturalness][value='4']")
        page.check("input[name=again][value='yes']")
        page.click("#rate")
        page.wait_for_selector("#next:not([hidden])")
        texts = page.locator("#messages li").all_text_contents()
        page.click("#next-chat")  # the same participant (kept by the page) meets the other policy
        sync_api.expect(page.locator("#progress")).to_have_text("Chat 2 of 2")
        page.wait_for_selector("#messages li.agent")
    study.close()
    first, second = read_chats(tmp_path / "study")
    assert second.member == first.member and second.trial == 1 and second.error.startswith("Abandoned")
    assert {first.extra["study"]["policy"], second.extra["study"]["policy"]} == {"A", "B"}
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
    assert "## Paired comparison" in capsys.readouterr().out or "Paired comparison" in report


@pytest.mark.parametrize("page", [True], indirect=True)
def test_html_and_script_in_chat_text_show_as_text(page, tmp_path):
    """With the page's CSP bypassed, so that only the escaping stands between chat text and the DOM."""
    study = make_study(tmp_path / "study", policies={"A": "tests.study.policies:Payload"})
    typed = '<script>window.__pwned = 3</script><img src=x onerror="window.__pwned = 4">'
    with Server(create_app(study, TOKEN, message_rate="20/second")) as url:
        page.goto(f"{url}/?token={TOKEN}")
        page.wait_for_selector("#messages li.agent")
        say(page, typed)
        items = page.locator("#messages li")
        texts = items.all_text_contents()
        assert texts[0] == "Chat partner" + Payload.TEXT and texts[1] == "You" + typed
        assert page.locator("#messages img, #messages script, #messages b").count() == 0
        assert page.evaluate("window.__pwned") is None
    study.close()
