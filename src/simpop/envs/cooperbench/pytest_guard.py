"""simpop's pytest guard: what really happened in a test run, recorded apart from pytest's own report.

The evaluator copies this file into each test run's workspace as ``simpop_pytest_guard`` and loads
it into every pytest process through ``PYTEST_PLUGINS`` (so before any ``conftest.py`` or test
module, and whatever the task's script passes to pytest). It appends JSON lines to the file named
by ``SIMPOP_PYTEST_GUARD``:

- ``start`` / ``finish`` (with pytest's exit status) per session: a process that exits before its
  session finishes (``os._exit`` after printing a fake summary) leaves a ``start`` without ``finish``;
  an exit status forced later (``atexit``) does not change the recorded one.
- ``test`` per test: the outcome from the exception the test *itself* raised (setup, call,
  teardown), taken in a hook wrapper, not from pytest's report, which plugins can rewrite.
- ``tamper``: pytest internals replaced after this module was imported (``Function.runtest``,
  ``TestReport``, ``CallInfo.from_call`` ...), run-protocol hooks registered after start-up by a
  plugin that is neither a ``conftest.py``, pytest's own nor installed (``site-packages``), or a
  skip raised from outside the test's own module.

This is a guard inside the process it watches: code in that process can defeat any of it with
enough effort (it is a bar against the generic tricks, not a proof). The first lines of defence
are outside the process: test infrastructure is stripped from patches and the sandbox confines
the run (see :mod:`simpop.envs.cooperbench.evaluator`).
"""

import json
import os
import sys
from typing import Any

import _pytest.outcomes
import _pytest.python
import _pytest.reports
import _pytest.runner
import pytest

_PATH = os.environ.get("SIMPOP_PYTEST_GUARD")
_FD = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if _PATH else None
_write = os.write
_dumps = json.dumps
_PID = os.getpid()
_WATCHED = {
    "Function.runtest": (_pytest.python.Function, "runtest"),
    "pytest_pyfunc_call": (_pytest.python, "pytest_pyfunc_call"),
    "runner.call_and_report": (_pytest.runner, "call_and_report"),
    "runner.call_runtest_hook": (_pytest.runner, "call_runtest_hook"),
    "CallInfo.from_call": (_pytest.runner.CallInfo, "from_call"),
    "TestReport.__init__": (_pytest.reports.TestReport, "__init__"),
    "TestReport.from_item_and_call": (_pytest.reports.TestReport, "from_item_and_call"),
    "TestReport.outcome": (_pytest.reports.TestReport, "outcome"),
    "TestReport.passed": (_pytest.reports.BaseReport, "passed"),
    "TestReport.failed": (_pytest.reports.BaseReport, "failed"),
}
_ORIGINAL = {name: vars(owner).get(attr) for name, (owner, attr) in _WATCHED.items()}
_PROTOCOL_HOOKS = ("pytest_runtest_protocol", "pytest_runtest_setup", "pytest_runtest_call",
                   "pytest_runtest_teardown", "pytest_runtest_makereport", "pytest_runtest_logreport",
                   "pytest_pyfunc_call", "pytest_report_teststatus", "pytest_sessionfinish",
                   "pytest_collection_modifyitems", "pytest_terminal_summary")
_TRUSTED_DIRS = tuple(os.path.dirname(os.path.realpath(str(m.__file__))) + os.sep for m in (_pytest.outcomes, pytest))
_SKIP = _pytest.outcomes.Skipped
_XFAIL = _pytest.outcomes.XFailed
_known_plugins: set[Any] = set()
_outcomes: dict[Any, Any] = {}


def _record(event: str, **data) -> None:
    if _FD is not None:
        _write(_FD, (_dumps({"event": event, "pid": _PID, **data}) + "\n").encode())


def _check_internals(config) -> None:
    for name, (owner, attr) in _WATCHED.items():
        if vars(owner).get(attr) is not _ORIGINAL[name]:
            _record("tamper", what=f"pytest internals replaced: {name}")
    for hook in _PROTOCOL_HOOKS:
        for impl in getattr(config.hook, hook).get_hookimpls():
            plugin = impl.plugin
            if id(plugin) in _known_plugins:
                continue
            origin = _origin(plugin)
            if os.path.basename(origin) == "conftest.py" and os.path.isfile(origin):
                continue
            if origin.startswith(_TRUSTED_DIRS) or any(d in origin for d in ("/site-packages/", "/dist-packages/")):
                continue  # pytest's own plugins and installed ones
            _record("tamper", what=f"hook {hook} registered at run time by {impl.plugin_name!r}")


def _origin(plugin) -> str:
    """The file a plugin (a module, or an object of some class) was defined in."""
    try:
        module = plugin if isinstance(plugin, type(os)) else sys.modules.get(type(plugin).__module__)
        return os.path.realpath(getattr(module, "__file__", "") or "")
    except Exception:  # noqa: BLE001 - a hostile object may raise anything
        return ""


def _skip_origin_ok(item, excinfo) -> bool:
    """A skip counts when it comes from pytest itself, a conftest or the test's own module."""
    module_file = os.path.realpath(getattr(getattr(item, "module", None), "__file__", "") or "")
    tb = excinfo[2]
    caller = None
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if os.path.realpath(filename) == os.path.realpath(_pytest.outcomes.__file__):
            break
        caller = filename
        tb = tb.tb_next
    if caller is None:
        return True
    caller = os.path.realpath(caller)
    pytest_dir = os.path.dirname(os.path.realpath(_pytest.outcomes.__file__))
    return caller == module_file or caller.startswith(pytest_dir) or os.path.basename(caller) == "conftest.py"


def _phase(item, excinfo, when: str) -> None:
    if excinfo is None:
        if when == "call":
            _outcomes.setdefault(item.nodeid, "passed")
        return
    exc = excinfo[1]
    if isinstance(exc, _SKIP):
        if not _skip_origin_ok(item, excinfo):
            _record("tamper", what=f"{item.nodeid}: skipped from outside its test module")
        _outcomes[item.nodeid] = "skipped"
    elif isinstance(exc, _XFAIL) or (when == "call" and item.get_closest_marker("xfail") is not None):
        _outcomes[item.nodeid] = "xfailed"
    else:
        _outcomes[item.nodeid] = "failed" if when == "call" else "error"


def pytest_configure(config):
    """Record the plugins present at start (to detect tampering) and the session's start."""
    _known_plugins.update(id(p) for p in config.pluginmanager.get_plugins())
    _record("start", argv=[str(a) for a in sys.argv[1:]][:50])


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Before each test, check that pytest's internals and hooks are untampered; after it, record its outcome."""
    _check_internals(item.config)
    yield
    _record("test", nodeid=item.nodeid, outcome=_outcomes.pop(item.nodeid, "not run"))


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_setup(item):
    """Record the setup phase's outcome."""
    outcome = yield
    _phase(item, outcome.excinfo, "setup")


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_call(item):
    """Record the test call's outcome."""
    outcome = yield
    _phase(item, outcome.excinfo, "call")


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Record an error in teardown (a skip is not one)."""
    outcome = yield
    if outcome.excinfo is not None and not isinstance(outcome.excinfo[1], _SKIP):
        _outcomes[item.nodeid] = "error"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Check pytest's internals once more and record the session's end and exit status."""
    _check_internals(session.config)
    _record("finish", exitstatus=int(exitstatus))
