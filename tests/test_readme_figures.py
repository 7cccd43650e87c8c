"""The figures the README and docs quote agree with the tables they are quoted from.

The benchmark tables in docs/benchmarks.md are pasted from runs of `python -m
spanpack bench` and benchmarks/callgrind_per_span.py; the prose around them,
and the README's speed headline, quote their extremes and ratios.  These
tests parse each table and check every quoted figure against it, so that a
table pasted from a new run cannot leave the text describing the old one;
the same for the README's ddtrace figures and docs/ddtrace.md's table.  They
also check that the tables have the columns and shapes the bench prints
today; that every figure the README shows names the command that reproduces
it; that the docstrings and the layer diagram in ARCHITECTURE.md name every
payload version; and that docs/ci.md starts a test agent of one's own the way
the suite starts its own.
"""

import re
from pathlib import Path

import pytest

from spanpack import bench, samples

ROOT = Path(__file__).resolve().parent.parent
if not (ROOT / "ext").is_dir() or not (ROOT / "README.md").is_file() or not (ROOT / "docs").is_dir():
    # The installed-wheel test (scripts/wheels.py) runs tests/ alone, away
    # from any checkout: these checks are of the repository's own documents.
    pytest.skip("checks the repository's README, docs/, benchmarks/README.md, ARCHITECTURE.md and ext/: "
                "no checkout beside these tests (an installed-wheel run)", allow_module_level=True)
README = (ROOT / "README.md").read_text(encoding="utf-8")
BENCHMARKS = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8") + "\n\n"
CI_DOC = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
DDTRACE_DOC = (ROOT / "docs" / "ddtrace.md").read_text(encoding="utf-8")


def _peer_table():
    """The "Peers vs spanpack" block: its title line, column titles and {shape: {column: text}}."""
    start = BENCHMARKS.index(bench.SUMMARY_TITLE)
    block = BENCHMARKS[start:BENCHMARKS.index("```", start)].rstrip("\n").splitlines()
    title, header, rule, *rows = block
    columns = re.split(r"\s{2,}", header.strip())
    assert set(rule) <= {"-", " "}
    table = {}
    for row in rows:
        shape, *cells = row.split()
        assert len(cells) == len(columns) - 1, row
        table[shape] = dict(zip(columns[1:], cells))
    return title, columns, table


def _ratio(cell):
    """A table cell as a float ("4.66x"), None for "differs"."""
    return None if cell == "differs" else float(cell.rstrip("x"))


def _sentence(start, text=BENCHMARKS):
    """The text from `start` to the end of its paragraph, on one line."""
    at = text.index(start)
    return " ".join(text[at:text.index("\n\n", at)].split())


def test_the_peer_table_has_the_columns_and_shapes_the_bench_prints():
    title, columns, table = _peer_table()
    assert title == bench.SUMMARY_TITLE
    assert columns == ["shape"] + [column for column, *_ in bench.SUMMARY]
    assert list(table) == samples.shape_names()


def test_the_smallest_margins_over_msgpack_are_the_tables():
    _title, _columns, table = _peer_table()
    column = {shape: _ratio(cells["msgpack prebuilt"]) for shape, cells in table.items()}
    sentence = _sentence("The smallest margins over msgpack-python's prebuilt dicts")
    named = re.findall(r"(\w+) \((\d+\.\d+)×", sentence)
    lowest = sorted(column, key=column.get)[:len(named)]
    assert [shape for shape, _ in named] == lowest
    assert [float(ratio) for _, ratio in named] == [column[shape] for shape in lowest]
    low, high = re.search(r"on the other shapes the margin is (\d+\.\d+)–(\d+\.\d+)×", sentence).groups()
    rest = [ratio for shape, ratio in column.items() if shape not in lowest]
    assert (float(low), float(high)) == (min(rest), max(rest))


def test_the_lowest_put_encode_cell_is_the_tables():
    _title, _columns, table = _peer_table()
    cells = {(shape, column.split()[1]): _ratio(row[column])
             for shape, row in table.items() for column in ("ddtrace v0.4", "ddtrace v0.5")}
    lowest = min((ratio, key) for key, ratio in cells.items() if ratio is not None)
    version, shape, quoted = re.search(r"The lowest put\+encode cell, (v\d\.\d) (\w+) \((\d+\.\d+)×",
                                       BENCHMARKS).groups()
    assert (float(quoted), (shape, version)) == lowest


def test_the_range_of_the_encode_traces_ratios_is_that_of_the_figures_listed():
    sentence = _sentence("The ddtrace columns compare put+encode with put+encode")
    low, high, listed = re.search(r"the ratios are (\d+\.\d+)–(\d+\.\d+)× \((.*?)\)\.", sentence).groups()
    figures = [float(f) for f in re.findall(r"(\d+\.\d+)×", listed)]
    assert len(figures) >= 2
    assert (float(low), float(high)) == (min(figures), max(figures))


def test_the_instruction_ratios_are_those_of_their_rows():
    start = BENCHMARKS.index("| shape | v0.4 spanpack |")
    rows = BENCHMARKS[start:BENCHMARKS.index("\n\n", start)].splitlines()
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    checked = 0
    for row in rows[2:]:
        cells = dict(zip(header, (c.strip() for c in row.strip("|").split("|"))))
        for version in ("v0.4", "v0.5"):
            spanpack = int(cells[version + " spanpack"].replace(",", ""))
            count, ratio = re.fullmatch(r"([\d,]+) \((\d+\.\d)×\)", cells[version + " ddtrace"]).groups()
            assert float(ratio) == pytest.approx(int(count.replace(",", "")) / spanpack, abs=0.05 + 1e-9), row
            checked += 1
    assert checked >= 2


def test_the_rounds_quoted_are_those_the_bench_runs():
    full = "%d–%d" % (bench.DEFAULT_BUDGET.min_rounds, bench.DEFAULT_BUDGET.max_rounds)
    quick = "%d–%d" % (bench.QUICK_BUDGET.min_rounds, bench.QUICK_BUDGET.max_rounds)
    assert "best of %s rounds per contender (%s with `--quick`" % (full, quick) in " ".join(BENCHMARKS.split())
    notes = " ".join((ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8").split())
    assert "is %s per contender (%s with `--quick`)" % (full.replace("–", "-"), quick.replace("–", "-")) in notes


@pytest.mark.parametrize("version", ["v0.4", "v0.5", "v1.0"])
def test_the_docstrings_and_the_layer_diagram_name_every_payload_version(version):
    import spanpack

    spanpack.TraceMsgPackEncoder(version)  # a version the encoder takes ...
    assert '"%s"' % version in spanpack.TraceMsgPackEncoder.version.__doc__  # ... is named
    assert "/%s/traces" % version in spanpack.send.__doc__
    architecture = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    layers = architecture[architecture.index("## Layers"):architecture.index("## Files")]
    writer = "span_v%s.c" % version[1:].replace(".", "")
    assert (ROOT / "ext" / writer).exists() and writer in layers
    assert "%s_write_trace" % version.replace(".", "") in layers


def test_the_readmes_own_agent_command_enables_the_checks_the_suite_enables():
    from tests.integration import agent

    assert "ENABLED_CHECKS=%s ddapm-test-agent --port" % agent.ENABLED_CHECKS in CI_DOC
    assert "SPANPACK_TEST_AGENT_URL=http://" in CI_DOC
    assert 'os.environ.get("SPANPACK_TEST_AGENT_URL")' in Path(agent.__file__).read_text(encoding="utf-8")


def _range(text):
    low, high = re.split(r"[-–]", text)
    return float(low), float(high)


def _readme_paragraph(start):
    return _sentence(start, README)


def test_the_readmes_speed_headline_is_the_peer_tables_range():
    _title, _columns, table = _peer_table()
    sentence = _readme_paragraph("On the bench's")
    assert "`python -m spanpack bench`" in sentence  # the command that reproduces it
    assert "%s sample shapes" % {11: "eleven"}.get(len(table), len(table)) in sentence
    quoted = dict(
        (column, _range(figures)) for figures, column in (
            (re.search(r"is (\S+)× faster than ddtrace 4\.2\.3's own v0\.4 encoder", sentence).group(1), "ddtrace v0.4"),
            (re.search(r"(\S+)× faster than `msgpack\.packb` of prebuilt", sentence).group(1), "msgpack prebuilt"),
            (re.search(r"(\S+)× faster than msgspec", sentence).group(1), "msgspec Structs"),
        ))
    for column, (low, high) in quoted.items():
        ratios = [_ratio(row[column]) for row in table.values() if _ratio(row[column]) is not None]
        assert (low, high) == (min(ratios), max(ratios)), column


def test_the_readmes_ddtrace_install_figures_are_docs_ddtrace_tables():
    sentence = _readme_paragraph("A program traced by ddtrace")
    assert "`python benchmarks/ddtrace_put_cost.py`" in sentence  # the command that reproduces them
    quoted = re.findall(r"(\d\.\d-\d\.\d)x (?:lower )?with (?:ddtrace )?(\d+\.\d+\.\d+)", sentence)
    assert len(quoted) == 3, sentence
    ratios = {}
    for row in re.findall(r"^\| (4\.\d+\.\d+) \| v0\.[45] \|.*\| (\d+\.\d+)x \|$", DDTRACE_DOC, re.M):
        ratios.setdefault(row[0], []).append(float(row[1]))
    for figures, version in quoted:
        low, high = _range(figures)
        assert (low, high) == (round(min(ratios[version]), 1), round(max(ratios[version]), 1)), version


def test_every_figure_in_the_readme_names_its_command():
    # A ratio or a time in the README's prose is in a paragraph that names the
    # command reproducing it (the two checked above, and any added later).
    figures = 0
    for paragraph in re.split(r"\n\s*\n", README):
        if paragraph.lstrip().startswith(("```", "|")) or "```" in paragraph:
            continue
        if re.search(r"\d(?:\.\d+)?(?:x|×)|\d (?:ns|µs|us|ms) per", paragraph):
            figures += 1
            assert re.search(r"`python (?:-m spanpack bench|benchmarks/\S+\.py)", paragraph), paragraph
    assert figures >= 2
