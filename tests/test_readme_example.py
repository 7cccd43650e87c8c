"""The README's example, from a user's own span class to `AgentWriter`, runs
as printed against the APM test agent, and the agent receives what the
README says it receives.

The code is taken from the README itself (the first python block under its
heading), so an edit that breaks the example fails here.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_PATH = ROOT / "README.md"
if not README_PATH.is_file() or not (ROOT / "ext").is_dir():
    # The installed-wheel test (scripts/wheels.py) runs tests/ alone.
    pytest.skip("runs the repository's README example: no checkout beside these tests",
                allow_module_level=True)

HEADING = "\n## From your span class to the agent\n"


def readme_example() -> str:
    readme = README_PATH.read_text(encoding="utf-8")
    section = readme[readme.index(HEADING):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_example_is_about_twenty_lines_and_ends_at_the_writer():
    code = readme_example()
    lines = [line for line in code.splitlines() if line.strip()]
    assert 15 <= len(lines) <= 30, len(lines)
    assert "spanpack.AgentWriter(" in code and "writer.write(" in code


def test_the_example_runs_and_the_agent_receives_what_the_readme_says(agent_session, monkeypatch):
    for name in ("DD_AGENT_HOST", "DD_TRACE_AGENT_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DD_TRACE_AGENT_URL", agent_session.base_url)
    namespace = {"__name__": "readme_example"}
    exec(compile(readme_example(), str(README_PATH), "exec"), namespace)

    stats = namespace["writer"].stats
    assert (stats["traces_written"], stats["traces_sent"], stats["traces_dropped"]) == (1, 1, 0), stats
    [trace] = agent_session.traces()
    spans = {span["name"]: span for span in trace}
    root, child = spans["web.request"], spans["db.query"]
    made = {"web.request": namespace["root"], "db.query": namespace["child"]}
    for name, span in spans.items():
        assert span["trace_id"] == 0x5B8E1C2D3A4F6071
        assert span["service"] == "checkout"
        # Float seconds written as int nanoseconds, rounded to the nearest.
        assert span["start"] == round(made[name].start * 1e9)
        assert span["duration"] == round(made[name].duration * 1e9)
    assert (root["span_id"], root.get("parent_id", 0), child["span_id"], child["parent_id"]) == (1, 0, 2, 1)
    # The one mixed tags dict, split as the README says.
    assert {k: v for k, v in root["meta"].items() if not k.startswith("_dd.")} == {"http.method": "GET"}
    assert root["metrics"] == {"http.status_code": 200}
    assert {k: v for k, v in child["meta"].items() if not k.startswith("_dd.")} == {"cache.hit": "false"}
    assert child["metrics"] == {"db.rows": 3}
