"""What `python -m spanpack bench` prints and draws says what it measured."""

import pytest

from spanpack import bench


def _result(shape, key, status="same bytes", best=1e-6, rounds=5):
    timed = not status.startswith("differs")
    return bench.Result(shape=shape, version="v0.5", key=key, label=key, family=key, spans=10, traces=1,
                        status=status, best=best if timed else None, rounds=rounds if timed else 0)


def test_rounds_range_is_the_n_of_best_of_n():
    results = [_result("a", "x", rounds=5), _result("a", "y", rounds=40), _result("a", "z", status="differs: no")]
    assert bench.rounds_range(results) == "5-40"  # a contender that was not timed has no rounds
    assert bench.rounds_range(results[:1]) == "5"
    assert bench.rounds_range(results[2:]) == "N"


def test_chart_labels_the_gap_of_a_contender_that_differs(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    results = [_result("one", "spanpack-slotted"), _result("one", "ddtrace-put"),
               _result("two", "spanpack-slotted"), _result("two", "ddtrace-put", status="differs: corrupt")]
    figures = []
    real_close = plt.close
    try:
        plt.close = figures.append  # keep the figure to inspect it
        bench.chart(results, str(tmp_path / "chart.png"), "title")
    finally:
        plt.close = real_close
    [figure] = figures
    [axes] = figure.axes
    texts = [t.get_text() for t in axes.texts]
    assert texts == ["differs (not timed)"]
    assert "best of 5 rounds" in axes.get_ylabel()
    assert any("floor = " in t.get_text() for t in figure.texts)
    assert (tmp_path / "chart.png").stat().st_size > 0
    real_close(figure)
