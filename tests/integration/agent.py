"""Start, talk to and stop Datadog's APM test agent (the ``ddapm-test-agent`` package).

The agent is a real trace intake: it decodes v0.4/v0.5 msgpack payloads, runs
checks on the request, and keeps what it received so a test can read the
decoded traces back from ``/test/session/traces``.  Only the standard library
is used here so that this module works wherever pytest does.

Behaviour of ddapm-test-agent 1.69.1 that the helpers rely on (checked by
experiment, see tests/integration/test_agent_smoke.py):

* a PUT that decodes and passes the enabled checks answers ``200`` with the
  JSON body ``{"rate_by_service": {}}``;
* a failed check answers ``400`` with a plain-text report naming the check,
  e.g. ``Check 'trace_count_header' failed: X-Datadog-Trace-Count value (2)
  does not match actual number of traces (1)``; a payload that does not decode
  answers ``400`` with a short reason (``400: Trace payload must be a list.``)
  or an empty one (``400: ``);
* the agent stores every trace request *before* checking or decoding it, so a
  rejected payload still shows up in its session, and one that does not decode
  makes ``/test/session/traces`` answer 400 for that session from then on.
  Give each test its own session token (see ``start_session``).

Set ``SPANPACK_TEST_AGENT_URL`` to use an agent that is already running
instead of starting one; it is then neither started nor stopped here.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Mapping, Optional, Tuple

HOST = "127.0.0.1"

#: Checks the agent enforces on every trace request (its ENABLED_CHECKS).
ENABLED_CHECKS = "trace_count_header,meta_tracer_version_header,trace_content_length"

SESSION_TOKEN_HEADER = "X-Datadog-Test-Session-Token"

STARTUP_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
REQUEST_TIMEOUT = 30.0

# Variables that would make the agent forward what it receives somewhere else,
# or that are meant for the code under test (a sanitizer runtime preloaded into
# pytest) rather than for the agent.
_SCRUBBED_ENV = (
    "DD_AGENT_URL",
    "DD_TRACE_AGENT_URL",
    "DD_API_KEY",
    "DD_SITE",
    "LD_PRELOAD",
    "ASAN_OPTIONS",
    "UBSAN_OPTIONS",
    "PYTHONMALLOC",
)


class AgentUnavailable(RuntimeError):
    """The test agent could not be started or did not answer."""


class AgentError(AssertionError):
    """The agent answered a query endpoint with an unexpected status."""


def _tracer_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("spanpack")
    except PackageNotFoundError:
        return "0.0.0"


def _free_ports(count: int) -> List[int]:
    """Ports the kernel hands out for 127.0.0.1, all distinct.

    The sockets stay open until every port is chosen so the same one is not
    handed out twice; another process could still take one before the agent
    binds it, which ``start_agent`` covers by retrying.
    """
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _agent_command() -> List[str]:
    """How to run the agent: from this interpreter if it can import it, else from PATH."""
    import importlib.util

    if importlib.util.find_spec("ddapm_test_agent") is not None:
        return [sys.executable, "-m", "ddapm_test_agent.agent"]
    exe = shutil.which("ddapm-test-agent")
    if exe:
        return [exe]
    raise AgentUnavailable(
        "ddapm-test-agent is not installed: `import ddapm_test_agent` fails in %s and there is "
        "no `ddapm-test-agent` on PATH (install the test extra: pip install -e '.[test]')"
        % sys.executable
    )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """In the child before exec: have the kernel SIGTERM it if pytest dies.

    This covers the cases atexit cannot (pytest killed by a signal).
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except Exception:
        pass


class DDTestAgent:
    """A running test agent and the HTTP helpers the tests use."""

    def __init__(
        self,
        base_url: str,
        proc: Optional[subprocess.Popen] = None,
        workdir: Optional[str] = None,
        log_path: Optional[str] = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        parsed = urllib.parse.urlsplit(self.base_url)
        self.host = parsed.hostname or HOST
        self.port = parsed.port or 80
        self.proc = proc
        self.workdir = workdir
        self.log_path = log_path
        self.session_token: Optional[str] = None
        #: The agent's Unix socket for traces (None for an agent not started here).
        self.uds_path: Optional[str] = None
        self._stopped = proc is None

    # -- HTTP --------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Optional[bytes] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: float = REQUEST_TIMEOUT,
    ) -> Tuple[int, bytes]:
        """Send one request; return (status, raw body) whatever the status."""
        req = urllib.request.Request(
            self.base_url + path, data=body, method=method, headers=dict(headers or {})
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            try:
                return e.code, e.read()
            finally:
                e.close()

    def _get_ok(self, path: str) -> bytes:
        status, body = self.request("GET", path)
        if status != 200:
            raise AgentError(
                "GET %s answered %d: %s" % (path, status, body.decode("utf-8", "replace"))
            )
        return body

    @staticmethod
    def _query(token: Optional[str]) -> str:
        if token is None:
            return ""
        return "?" + urllib.parse.urlencode({"test_session_token": token})

    def info(self) -> Dict[str, Any]:
        return json.loads(self._get_ok("/info"))

    def start_session(self, token: str) -> None:
        """Start a test session; later helpers default to this token."""
        self._get_ok("/test/session/start" + self._query(token))
        self.session_token = token

    def put_payload(
        self,
        version: str,
        payload: bytes,
        trace_count: Optional[int],
        headers: Optional[Mapping[str, Optional[str]]] = None,
        token: Optional[str] = None,
    ) -> Tuple[int, str]:
        """PUT an encoded payload to /v0.4/traces, /v0.5/traces or /v1.0/traces.

        ``version`` is "v0.4", "0.4", "v0.5", "0.5", "v1.0" or "1.0".  The headers a Python
        tracer sends are filled in; ``trace_count`` becomes X-Datadog-Trace-Count
        (None leaves it out).  ``headers`` are applied last: a value of None
        removes that header.  ``token`` (default: the last ``start_session``
        token) is sent as X-Datadog-Test-Session-Token.

        Returns (HTTP status, body as text).
        """
        v = version[1:] if version.startswith("v") else version
        if v not in ("0.4", "0.5", "1.0"):
            raise ValueError("unsupported trace API version %r" % (version,))
        hdrs: Dict[str, Optional[str]] = {
            "Content-Type": "application/msgpack",
            "Datadog-Meta-Lang": "python",
            "Datadog-Meta-Lang-Version": platform.python_version(),
            "Datadog-Meta-Lang-Interpreter": platform.python_implementation(),
            "Datadog-Meta-Tracer-Version": _tracer_version(),
        }
        if trace_count is not None:
            hdrs["X-Datadog-Trace-Count"] = str(trace_count)
        token = self.session_token if token is None else token
        if token is not None:
            hdrs[SESSION_TOKEN_HEADER] = token
        hdrs.update(headers or {})
        sent = {k: val for k, val in hdrs.items() if val is not None}
        status, body = self.request("PUT", "/v%s/traces" % v, bytes(payload), sent)
        return status, body.decode("utf-8", "replace")

    def traces(self, token: Optional[str] = None) -> List[List[Dict[str, Any]]]:
        """The decoded traces of a session (default: the last started one).

        The agent groups spans by trace_id across all payloads of the session.
        """
        token = self.session_token if token is None else token
        return json.loads(self._get_ok("/test/session/traces" + self._query(token)))

    def clear(self, token: Optional[str] = None) -> None:
        """Forget what the agent received: everything, or one session's requests."""
        self._get_ok("/test/session/clear" + self._query(token))

    # -- lifecycle ---------------------------------------------------------

    def log_tail(self, lines: int = 80) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Terminate the agent, kill it if it does not exit; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        proc = self.proc
        assert proc is not None
        if proc.poll() is None:
            # Signal the whole group (the agent runs in its own session) while
            # the leader is unreaped, so its pid cannot have been reused.
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=STOP_TIMEOUT)
        if self.workdir and not os.environ.get("SPANPACK_KEEP_AGENT_LOG"):
            shutil.rmtree(self.workdir, ignore_errors=True)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_until_ready(agent: DDTestAgent, deadline: float) -> None:
    last = "no answer yet"
    while time.monotonic() < deadline:
        assert agent.proc is not None
        if agent.proc.poll() is not None:
            raise AgentUnavailable(
                "ddapm-test-agent exited with status %s before answering:\n%s"
                % (agent.proc.returncode, agent.log_tail())
            )
        try:
            status, _ = agent.request("GET", "/info", timeout=2.0)
            if status == 200:
                return
            last = "GET /info answered %d" % status
        except (OSError, urllib.error.URLError) as e:
            last = repr(e)
        time.sleep(0.1)
    raise AgentUnavailable(
        "ddapm-test-agent did not answer on %s within %.0fs (%s):\n%s"
        % (agent.base_url, STARTUP_TIMEOUT, last, agent.log_tail())
    )


def start_agent(attempts: int = 3) -> DDTestAgent:
    """Start an agent on free loopback ports and wait until it answers.

    Raises AgentUnavailable with the reason (and the agent's log) on failure.
    The agent is stopped at interpreter exit if nobody stops it before.
    """
    url = os.environ.get("SPANPACK_TEST_AGENT_URL")
    if url:
        agent = DDTestAgent(url)
        try:
            status, _ = agent.request("GET", "/info")
        except (OSError, urllib.error.URLError) as e:
            raise AgentUnavailable("SPANPACK_TEST_AGENT_URL=%s does not answer: %r" % (url, e))
        if status != 200:
            raise AgentUnavailable("SPANPACK_TEST_AGENT_URL=%s: GET /info answered %d" % (url, status))
        return agent

    cmd = _agent_command()
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env.update(
        {
            "ENABLED_CHECKS": ENABLED_CHECKS,
            "LOG_LEVEL": "INFO",
            "DISABLE_LLMOBS_DATA_FORWARDING": "true",
            "PYTHONUNBUFFERED": "1",
        }
    )
    error: Optional[AgentUnavailable] = None
    for _ in range(attempts):
        port, otlp_http, otlp_grpc = _free_ports(3)
        # Its own directory: the agent looks for snapshots/ and vcr-cassettes/ in its cwd.
        workdir = tempfile.mkdtemp(prefix="spanpack-test-agent-")
        log_path = os.path.join(workdir, "agent.log")
        args = cmd + ["--host", HOST, "--port", str(port)]
        args += ["--otlp-http-port", str(otlp_http), "--otlp-grpc-port", str(otlp_grpc)]
        # The same agent also takes traces on a Unix socket (AgentWriter's unix:// tests).
        uds_path = os.path.join(workdir, "apm.sock")
        args += ["--trace-uds-socket", uds_path]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                args,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        agent = DDTestAgent("http://%s:%d" % (HOST, port), proc, workdir, log_path)
        agent.uds_path = uds_path
        atexit.register(agent.stop)
        try:
            _wait_until_ready(agent, time.monotonic() + STARTUP_TIMEOUT)
            return agent
        except AgentUnavailable as e:
            error = e
            agent.stop()
    assert error is not None
    raise error
