"""Shared fixtures: Datadog's APM test agent, started once per test session.

``test_agent`` yields a tests/integration/agent.py ``DDTestAgent`` (base_url,
start_session, put_payload, traces, clear).  ``agent_session`` gives each test
its own session token on that agent, so what one test sends never shows up in
another's traces.

When the agent cannot be started, tests that use it are skipped on a
developer's machine but fail (with the reason and the agent's log) when the CI
environment variable is set, so CI can never pass without having talked to it.

Likewise for every other test dependency: a module or test that skips through
``pytest.importorskip(name)`` (called without ``reason=``, so the hooks below
can read the module's name from the skip) because a module of spanpack's
``[test]`` extra is missing fails instead under CI, when the extra installs
that module on this interpreter.  Where the extra does not install it (ddtrace
on 3.15) the skip stays, and its reason says so.

With CI set, hypothesis runs the "ci" profile: the same examples on every run
(derandomized, no example database, so nothing one run found changes the
next), each test's own max_examples, and no deadline (a loaded machine makes
any per-example time limit a chance failure).  A failure prints the blob that
reproduces it (@reproduce_failure).  Without CI, hypothesis keeps its defaults:
random examples, and failures saved in .hypothesis/ and replayed first.
"""

import os
import re
import sys
import uuid

import msgpack
import pytest
from hypothesis import settings

# The Packer is held to msgpack-python 1.2's behaviour (nesting limit,
# float32 overflow, header checks); older msgpack (all Python 3.9 can
# install) is no reference for it, so those modules are not collected there.
collect_ignore_glob = ["packer/test_packer_*.py"] if msgpack.version < (1, 2) else []


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


# Loaded here, before the test modules are imported: their @settings(...) take
# every value they do not set from it.  Each test sets its own max_examples;
# one that does not gets 100, fixed here so hypothesis' default cannot move it.
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True, max_examples=100
)
if _in_ci():
    settings.load_profile("ci")

from tests.integration.agent import AgentUnavailable, start_agent

# Import names that differ from the distribution's (canonical) name.
_MODULE_OF_DISTRIBUTION = {
    "ddapm-test-agent": "ddapm_test_agent",
    # The OpenTelemetry distributions share one namespace package.
    "opentelemetry-sdk": "opentelemetry",
    "opentelemetry-exporter-otlp-proto-common": "opentelemetry",
}
# pytest.importorskip's own reason when called without reason=.
_IMPORT_SKIP = re.compile(r"could not import '([A-Za-z_][\w.]*)'")
_THIS_PYTHON = "Python %d.%d" % sys.version_info[:2]


def _extras_by_module():
    """{top-level module: [(extra, requirement, applies on this interpreter)]}
    from the installed spanpack's metadata."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    try:
        texts = requires("spanpack") or []
    except PackageNotFoundError:
        return {}
    found = {}
    for text in texts:
        requirement = Requirement(text)
        if requirement.marker is None:
            continue
        for extra in ("test", "bench"):
            if 'extra == "%s"' % extra not in str(requirement.marker):
                continue
            applies = requirement.marker.evaluate({"extra": extra})
            name = re.sub(r"[-_.]+", "-", requirement.name).lower()
            module = _MODULE_OF_DISTRIBUTION.get(name, name.replace("-", "_"))
            found.setdefault(module, []).append((extra, text.split(";")[0].strip(), str(requirement.marker), applies))
    return found


_EXTRAS_BY_MODULE = _extras_by_module()


def _missing_module_verdict(message):
    """For a skip message from pytest.importorskip: ("fail", text) when CI is
    set and the [test] extra installs the module here, else ("skip", the
    message with why the module is absent)."""
    match = _IMPORT_SKIP.search(message)
    if not match:
        return None
    module = match.group(1).split(".")[0]
    entries = _EXTRAS_BY_MODULE.get(module, [])
    for extra, requirement, _, applies in entries:
        if extra == "test" and applies:
            why = "%s is in the [test] extra on %s (%s) but is not importable" % (module, _THIS_PYTHON, requirement)
            if _in_ci():
                return "fail", "%s: %s\n(CI is set, so a missing test dependency is a failure, not a skip)" % (why, message)
            return "skip", "%s; pip install -e '.[test]' installs it: %s" % (why, message)
    for extra, requirement, marker, applies in entries:
        if extra == "test":
            return "skip", "%s: the [test] extra installs %s only where %s, not on %s" % (
                message, requirement, marker.replace(' and extra == "test"', ""), _THIS_PYTHON)
    for extra, requirement, _, _ in entries:
        return "skip", "%s: %s is in spanpack's [%s] extra, not [test]" % (message, requirement, extra)
    if module == "_testcapi":
        return "skip", "%s: this CPython was installed without its C-API test module (Debian: libpython%d.%d-testsuite)" % (
            (message,) + sys.version_info[:2])
    return None


def _apply_verdict(report):
    if not report.skipped or not isinstance(report.longrepr, tuple) or hasattr(report, "wasxfail"):
        return
    path, lineno, message = report.longrepr
    verdict = _missing_module_verdict(message)
    if verdict is None:
        return
    kind, text = verdict
    if kind == "fail":
        report.outcome = "failed"
        report.longrepr = "%s:%s: %s" % (path, lineno, text)
    else:
        report.longrepr = (path, lineno, text)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _apply_verdict(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _apply_verdict(outcome.get_result())


@pytest.fixture(scope="session", name="test_agent")
def _test_agent_fixture():
    try:
        agent = start_agent()
    except AgentUnavailable as e:
        message = "APM test agent unavailable: %s" % e
        if _in_ci():
            pytest.fail(message + "\n(CI is set, so this is a failure, not a skip)", pytrace=False)
        pytest.skip(message)
    try:
        yield agent
    finally:
        agent.stop()


@pytest.fixture(name="agent_session")
def _agent_session_fixture(test_agent, request):
    """The session-wide agent, with a fresh session token started for this test."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:80]
    test_agent.start_session("%s-%s" % (name, uuid.uuid4().hex[:12]))
    return test_agent
