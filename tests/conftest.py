"""Shared fixtures: Datadog's APM test agent, started once per test session.

``test_agent`` yields a tests/integration/agent.py ``DDTestAgent`` (base_url,
start_session, put_payload, traces, clear).  ``agent_session`` gives each test
its own session token on that agent, so what one test sends never shows up in
another's traces.

When the agent cannot be started, tests that use it are skipped on a
developer's machine but fail (with the reason and the agent's log) when the CI
environment variable is set, so CI can never pass without having talked to it.

With CI set, hypothesis runs the "ci" profile: the same examples on every run
(derandomized, no example database, so nothing one run found changes the
next), each test's own max_examples, and no deadline (a loaded machine makes
any per-example time limit a chance failure).  A failure prints the blob that
reproduces it (@reproduce_failure).  Without CI, hypothesis keeps its defaults:
random examples, and failures saved in .hypothesis/ and replayed first.
"""

import os
import re
import uuid

import msgpack
import pytest
from hypothesis import settings

# The Packer is held to msgpack-python 1.2's behaviour (nesting limit,
# float32 overflow, header checks); older msgpack (all Python 3.9 can
# install) is no reference for it, so those modules are not collected there.
collect_ignore_glob = ["test_packer_*.py"] if msgpack.version < (1, 2) else []


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
