"""What `python -m spanpack bench` prints and draws says what it measured."""

import pytest

import spanpack
from spanpack import bench, samples
from spanpack.__main__ import main as spanpack_main


def _result(shape, key, status="same bytes", best=1e-6, rounds=5):
    timed = not status.startswith("differs")
    return bench.Result(shape=shape, version="v0.5", key=key, label=key, family=key, spans=10, traces=1,
                        status=status, best=best if timed else None, rounds=rounds if timed else 0)


def test_rounds_range_is_the_n_of_best_of_n():
    results = [_result("a", "x", rounds=5), _result("a", "y", rounds=40), _result("a", "z", status="differs: no")]
    assert bench.rounds_range(results) == "5-40"  # a contender that was not timed has no rounds
    assert bench.rounds_range(results[:1]) == "5"
    assert bench.rounds_range(results[2:]) == "N"


def _chart_figure(results, tmp_path):
    """Draw the chart of `results` and return its (still open) figure."""
    import matplotlib.pyplot as plt

    figures = []
    real_close = plt.close
    try:
        plt.close = figures.append  # keep the figure to inspect it
        bench.chart(results, str(tmp_path / "chart.png"), "title")
    finally:
        plt.close = real_close
    [figure] = figures
    return figure


def test_chart_labels_the_gap_of_a_contender_that_differs(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    results = [_result("one", "spanpack-slotted"), _result("one", "ddtrace-put"),
               _result("two", "spanpack-slotted"), _result("two", "ddtrace-put", status="differs: corrupt")]
    figure = _chart_figure(results, tmp_path)
    [axes] = figure.axes
    texts = [t.get_text() for t in axes.texts]
    assert texts == ["differs (not timed)"]  # and no ratio: spanpack's put+encode was not run
    assert "best of 5 rounds" in axes.get_ylabel()
    assert any("floor = " in t.get_text() for t in figure.texts)
    assert (tmp_path / "chart.png").stat().st_size > 0
    plt.close(figure)


def test_chart_says_lower_is_better_gives_each_peer_its_ratio_and_explains_the_shapes(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    results = [_result("span_1", "spanpack-slotted", best=2e-6), _result("span_1", "spanpack-dicts", best=3e-6),
               _result("span_1", "spanpack-ddtrace-put", best=4e-6), _result("span_1", "ddtrace-put", best=20e-6),
               _result("span_1", "msgpack-prebuilt", best=7e-6)]
    figure = _chart_figure(results, tmp_path)
    [axes] = figure.axes
    assert "lower is better" in axes.get_ylabel() and "lower is better" in axes.get_title()
    # ddtrace against spanpack's put+encode (20/4), msgpack against encode_traces (7/2); spanpack's own
    # entry points carry no ratio.
    assert sorted(t.get_text() for t in axes.texts) == ["3.5×", "5.0×"]
    notes = "\n".join(t.get_text() for t in figure.texts)
    assert "span_1" in notes and samples.SHAPES["span_1"].description in notes
    # spanpack's entry points are told apart by colour and hatching, not only by a shade of blue.
    looks = {(tuple(bars.patches[0].get_facecolor()), bars.patches[0].get_hatch())
             for bars in axes.containers}
    assert len(looks) == len(axes.containers) == 5
    plt.close(figure)


def test_ratios_in_the_table_and_the_chart_use_the_same_baseline():
    results = [_result("web", "spanpack-slotted", best=1.0), _result("web", "spanpack-ddtrace-put", best=2.0),
               _result("web", "ddtrace-put", best=9.0), _result("web", "floor", best=0.25)]
    assert bench.peer_ratio(results, "web", "v0.5", "ddtrace-put") == 4.5
    assert bench.peer_ratio(results, "web", "v0.5", "floor") == 0.25
    assert bench.peer_ratio(results, "web", "v0.5", "msgpack-prebuilt") is None  # not run


def test_list_aligns_every_column_and_leaves_no_trailing_blanks():
    lines = bench.listing(bench.VERSIONS).splitlines()
    shape_lines = lines[1:lines.index("contenders:")]
    assert [line.split()[0] for line in shape_lines] == samples.shape_names()
    descriptions = {line.index(samples.SHAPES[line.split()[0]].description) for line in shape_lines}
    assert len(descriptions) == 1  # every description starts in the same column
    contender_lines = lines[lines.index("contenders:") + 1:]
    assert len(contender_lines) == len(bench.CONTENDERS)
    assert all(line == line.rstrip() for line in lines)


def test_help_is_plain_text(capsys):
    with pytest.raises(SystemExit):
        spanpack_main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "python -m spanpack bench: spanpack against" in out
    assert "``" not in out


def test_version_option_prints_the_installed_distribution_version(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as exit_info:
        spanpack_main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == "spanpack %s\n" % metadata.version("spanpack")


def test_user_class_shapes_build_fresh_spans_with_values_of_their_own():
    from spanpack import user_spans

    for shape in user_spans.SHAPES:
        first, second = user_spans.traces(shape), user_spans.traces(shape)
        assert len(first) == user_spans.TRACES and sum(map(len, first)) == user_spans.SPANS
        spans = [span for trace in first for span in trace]
        again = [span for trace in second for span in trace]
        # Each build: new span objects, and the per-span text is new str objects ...
        assert not {id(s) for s in spans} & {id(s) for s in again}
        assert all(a.resource == b.resource and a.resource is not b.resource for a, b in zip(spans, again))
        # ... and differs from span to span (a resource with an id in it, a URL, a host).
        assert len({s.resource for s in spans}) == len(spans)
        assert len({s.meta["http.url"] for s in spans}) == len(spans)
        # Every trace's spans share its trace id; traces differ.
        assert len({trace[0].trace_id for trace in first}) == user_spans.TRACES
        user_spans.check(user_spans.contenders(), first)


def test_user_class_table_says_spans_are_fresh_and_labels_re_encoding():
    assert "fresh spans" in bench.USER_CLASSES_TITLE and "re-encoding" in bench.USER_CLASSES_TITLE
    assert "re-encoded" in bench.REENCODED
    # the sample shapes are fresh by default; re-encoding them (--reencode) is said to be
    assert "fresh spans" in bench.SAMPLES_NOTE and "re-encoded" not in bench.SAMPLES_NOTE
    assert "re-encoded (--reencode)" in bench.SAMPLES_REENCODED_NOTE
    assert "fresh spans" in bench.SUMMARY_TITLE and "re-encoding" in bench.SUMMARY_REENCODED_TITLE


@pytest.mark.parametrize("shape", ["keys_per_span", "web"])
def test_sample_shapes_made_fresh_have_values_of_their_own_and_share_constants(shape):
    inputs = bench.ShapeInputs(shape, quick=True)
    first, second = inputs.fresh("slotted"), inputs.fresh("slotted")
    spans = [span for trace in first for span in trace]
    again = [span for trace in second for span in trace]
    assert not {id(s) for s in spans} & {id(s) for s in again}  # new span objects every time
    assert [s.resource for s in spans] == [s.resource for s in again]
    # Constants shared by several spans stay shared, as a tracer's literals are.
    assert all(a.service is b.service for a, b in zip(spans, again))
    if shape == "keys_per_span":
        # A resource with an id: new text for every span, a new str object every time; keys built per span.
        assert len({s.resource for s in spans}) == len(spans)
        assert all(a.resource is not b.resource for a, b in zip(spans, again))
        assert all(a is not b for x, y in zip(spans, again) for a, b in zip(x.meta, y.meta))
    else:
        # An HTTP child's URL (an id in it) and resource, a SQL child's shard host: the span's own.
        http = [(x, y) for x, y in zip(spans, again) if x.span_type == "http"]
        sql = [(x, y) for x, y in zip(spans, again) if x.span_type == "sql"]
        assert len({x.meta["http.url"] for x, _ in http}) > len(http) // 2 > 0  # an id in most
        assert all(x.meta["http.url"] is not y.meta["http.url"] and x.resource is not y.resource
                   for x, y in http)
        assert sql and all(x.meta["out.host"] is not y.meta["out.host"] for x, y in sql)
        # A query and the shared tags are the program's literals.
        assert all(x.resource is y.resource and x.meta["env"] is y.meta["env"] for x, y in sql)
    # ... and every form encodes to the reference bytes.
    for version in bench.VERSIONS:
        assert spanpack.TraceMsgPackEncoder(version).encode_traces(inputs.fresh("slotted")) == inputs.reference(version)
