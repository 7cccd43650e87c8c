"""Span payload benchmarks: spanpack against ddtrace, msgpack, ormsgpack and msgspec.

    pip install -e '.[bench]'
    pytest benchmarks/bench_spans.py --benchmark-only
    pytest benchmarks/ --benchmark-only --benchmark-group-by=group -k web
    SPANPACK_BENCH_QUICK=1 pytest benchmarks/bench_spans.py --benchmark-only   # 10 x 1000 many_traces

The contenders and sample shapes are the ones of ``python -m spanpack bench``
(``spanpack.bench.CONTENDERS``, ``spanpack.samples.SHAPES``), one benchmark
group per shape, each timed call on spans made for it alone outside the
timing (``ShapeInputs.fresh``: new span objects, new str objects for each
span's own values; pytest-benchmark's pedantic mode with a setup, one call
per round).  Every contender's payload is checked against spanpack's
before it is timed: a peer that produces different data is skipped with the
reason (ddtrace 4.2.3's v0.5 encoder corrupts payloads whose string table has
65,536 to 131,071 entries, which the many_tags shape reaches); a spanpack input
form that differs is a failure.

Also here:

* test_intern: spanpack's string interning on and off (``intern=False``);
* test_threads: put+encode from 1, 4 and 16 producer threads into one encoder,
  spanpack vs ddtrace (throughput in extra_info);
* test_payload_size: bytes per span, v0.4 vs v0.5 vs v1.0 (extra_info);
* test_v10_vs_v05: spanpack's v1.0 against its v0.5, one-shot and
  put+encode (``python benchmarks/v10_vs_v05.py`` prints the table);
* test_peak_memory: tracemalloc peak (and the peak RSS growth where Linux can
  report it) while encoding a ~20 MB v0.4 payload, spanpack vs ddtrace
  (extra_info; the timed part runs without tracemalloc).

No test asserts anything about timings.
"""

import functools
import gc
import os
import threading
import tracemalloc

import pytest

import spanpack
from spanpack import bench, samples

QUICK = bool(os.environ.get("SPANPACK_BENCH_QUICK"))
HAVE_DDTRACE = samples.ddtrace_available()
BIG = bench.BIG


@functools.lru_cache(maxsize=None)
def inputs(shape):
    return bench.ShapeInputs(shape, QUICK)


def contender_ids():
    return ["%s-%s" % (c.version, c.key) for c in bench.CONTENDERS]


@functools.lru_cache(maxsize=None)
def reference_data(shape, version):
    return bench.decode(inputs(shape).reference(version), version)


def checked_callable(shape, contender):
    """The contender's timed callable for `shape`, after checking its output."""
    for module in contender.requires:
        if not bench.available(module):
            pytest.skip("%s is not installed" % module)
    data = inputs(shape)
    fn = contender.make(data)
    payload = fn(data.fresh(contender.form))
    reference = data.reference(contender.version)
    status = bench.check(payload, reference, contender.version,
                         lambda: reference_data(shape, contender.version))
    if status.startswith("differs"):
        if contender.family == "spanpack":
            pytest.fail("spanpack %s differs from the slotted-object payload: %s"
                        % (contender.label, status))
        pytest.skip("%s %s: %s" % (contender.label, contender.version, status))
    return fn, payload, status


@pytest.mark.parametrize("contender", bench.CONTENDERS, ids=contender_ids())
@pytest.mark.parametrize("shape", samples.shape_names())
def test_encode(benchmark, shape, contender):
    fn, payload, status = checked_callable(shape, contender)
    data = inputs(shape)
    benchmark.group = "shape %s" % shape
    benchmark.extra_info.update(
        shape=shape,
        version=contender.version,
        contender=contender.key,
        label=contender.label,
        spans=data.spans,
        traces=data.traces,
        payload_bytes=len(payload),
        bytes_per_span=round(len(payload) / data.spans, 1),
        check=status,
    )
    del payload
    gc.collect()
    # One call per round, each on inputs of its own; fewer rounds where a set is 100,000 spans.
    benchmark.pedantic(fn, setup=lambda: ((data.fresh(contender.form),), {}),
                       rounds=FRESH_ROUNDS if data.spans <= 10_000 else 5, iterations=1)


FRESH_ROUNDS = 40


# --------------------------------------------------------------------------------------------
# Interning on and off


@pytest.mark.parametrize("intern", [True, False], ids=["intern", "no-intern"])
@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
@pytest.mark.parametrize("shape", ["web", "many_tags"])
def test_intern(benchmark, shape, version, intern):
    data = inputs(shape)
    encoder = spanpack.TraceMsgPackEncoder(version, max_size=BIG, intern=intern)
    traces = data.slotted
    payload = encoder.encode_traces(traces)
    assert payload == data.reference(version)
    benchmark.group = "intern %s %s" % (shape, version)
    benchmark.extra_info.update(shape=shape, version=version, intern=intern, spans=data.spans,
                                payload_bytes=len(payload))
    benchmark(encoder.encode_traces, traces)


# --------------------------------------------------------------------------------------------
# Producer threads


def web_ddtrace_traces(count):
    """`count` web request traces as ddtrace Spans (16 distinct ones, repeated)."""
    distinct = samples.as_ddtrace(samples.web_traces(16))
    return [distinct[i % len(distinct)] for i in range(count)]


class Producers:
    """`n` threads that put their share of `traces` into `encoder` once per round."""

    def __init__(self, n, encoder, traces):
        self.encoder = encoder
        self.shares = [traces[i::n] for i in range(n)]
        self.start = threading.Barrier(n + 1)
        self.done = threading.Barrier(n + 1)
        self.stop = False
        self.errors = []
        self.threads = [threading.Thread(target=self._work, args=(share,), daemon=True)
                        for share in self.shares]
        for t in self.threads:
            t.start()

    def _work(self, share):
        put = self.encoder.put
        while True:
            self.start.wait()
            if self.stop:
                return
            try:
                for trace in share:
                    put(trace)
            except BaseException as exc:  # reported by the main thread
                self.errors.append(exc)
            self.done.wait()

    def round(self):
        """Producers put everything, then this thread encodes: one payload."""
        self.start.wait()
        self.done.wait()
        payloads = self.encoder.encode()
        if self.errors:
            raise self.errors[0]
        return payloads

    def close(self):
        self.stop = True
        self.start.wait()
        for t in self.threads:
            t.join()


THREAD_TRACES = 64 if QUICK else 256


@pytest.mark.skipif(not HAVE_DDTRACE, reason="ddtrace is not installed")
@pytest.mark.parametrize("threads", [1, 4, 16])
@pytest.mark.parametrize("encoder_name", ["spanpack", "ddtrace"])
@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
def test_threads(benchmark, version, encoder_name, threads):
    traces = web_ddtrace_traces(THREAD_TRACES)
    spans = samples.span_count(traces)
    if encoder_name == "spanpack":
        encoder = spanpack.TraceMsgPackEncoder(version, fields="ddtrace", max_size=BIG,
                                               max_item_size=BIG, max_payload_size=BIG)
    else:
        from ddtrace.internal._encoding import MsgpackEncoderV04, MsgpackEncoderV05

        cls = MsgpackEncoderV04 if version == "v0.4" else MsgpackEncoderV05
        encoder = cls(BIG, BIG)
    producers = Producers(threads, encoder, traces)
    try:
        payloads = producers.round()
        assert sum(n for _, n in payloads) == len(traces)
        benchmark.group = "threads put+encode %s (%d web traces, %d spans)" % (
            version, len(traces), spans)
        benchmark.extra_info.update(version=version, encoder=encoder_name, threads=threads,
                                    traces=len(traces), spans=spans)
        benchmark(producers.round)
    finally:
        producers.close()
    stats = benchmark.stats.stats if benchmark.stats else None
    if stats is not None:
        benchmark.extra_info["spans_per_s_median"] = round(spans / stats.median)
        benchmark.extra_info["spans_per_s_best"] = round(spans / stats.min)


# --------------------------------------------------------------------------------------------
# Bytes per span


@pytest.mark.parametrize("version", ["v0.4", "v0.5", "v1.0"])
@pytest.mark.parametrize("shape", samples.shape_names())
def test_payload_size(benchmark, shape, version):
    data = inputs(shape)
    sizes = {v: len(data.reference(v)) for v in ("v0.4", "v0.5", "v1.0")}
    encoder = spanpack.TraceMsgPackEncoder(version, max_size=BIG)
    benchmark.group = "payload size %s" % shape
    benchmark.extra_info.update(
        shape=shape,
        version=version,
        spans=data.spans,
        payload_bytes=sizes[version],
        bytes_per_span=round(sizes[version] / data.spans, 1),
        v04_bytes_per_span=round(sizes["v0.4"] / data.spans, 1),
        v05_bytes_per_span=round(sizes["v0.5"] / data.spans, 1),
        v05_over_v04=round(sizes["v0.5"] / sizes["v0.4"], 3),
        v10_bytes_per_span=round(sizes["v1.0"] / data.spans, 1),
        v10_over_v05=round(sizes["v1.0"] / sizes["v0.5"], 3),
    )
    benchmark(encoder.encode_traces, data.slotted)


@pytest.mark.parametrize("entry", ["encode_traces", "put_encode"])
@pytest.mark.parametrize("version", ["v0.5", "v1.0"])
@pytest.mark.parametrize("shape", samples.shape_names())
def test_v10_vs_v05(benchmark, shape, version, entry):
    data = inputs(shape)
    encoder = spanpack.TraceMsgPackEncoder(version, max_size=BIG)
    if entry == "encode_traces":
        run = functools.partial(encoder.encode_traces, data.slotted)
    else:
        def run():
            for trace in data.slotted:
                encoder.put(trace)
            return encoder.encode()
    benchmark.group = "v1.0 vs v0.5 %s %s" % (shape, entry)
    benchmark.extra_info.update(shape=shape, version=version, entry=entry, spans=data.spans,
                                bytes_per_span=round(len(data.reference(version)) / data.spans, 1))
    benchmark(run)


# --------------------------------------------------------------------------------------------
# Peak memory for a ~20 MB payload


def _peak_rss_reset():
    """Reset the kernel's peak-RSS mark; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def memory_profile(fn):
    """(tracemalloc peak bytes, peak RSS growth bytes or None, payload bytes) of one fn() call."""
    gc.collect()
    rss_ok = _peak_rss_reset()
    rss_before = _rss_kib("VmRSS") if rss_ok else None
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        payload = fn()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    rss_peak = None
    if rss_ok and rss_before is not None:
        rss_peak = (_rss_kib("VmHWM") - rss_before) * 1024
    return peak, rss_peak, len(payload)


MEMORY_TRACES = 180 if QUICK else 720  # x 51 web spans ~ 5 / 20 MB of v0.4


@functools.lru_cache(maxsize=None)
def memory_traces(form):
    records = samples.web_traces(MEMORY_TRACES)
    return samples.as_ddtrace(records) if form == "ddtrace" else samples.as_slotted(records)


def _memory_callable(encoder_name, version):
    if encoder_name.startswith("ddtrace"):
        from ddtrace.internal._encoding import MsgpackEncoderV04, MsgpackEncoderV05

        cls = MsgpackEncoderV04 if version == "v0.4" else MsgpackEncoderV05
        traces = memory_traces("ddtrace")

        def run():
            encoder = cls(BIG, BIG)
            for trace in traces:
                encoder.put(trace)
            return encoder.encode()[0][0]

        return run
    form = "ddtrace" if encoder_name.endswith("ddtrace spans") else "slotted"
    fields = "ddtrace" if form == "ddtrace" else None
    traces = memory_traces(form)
    if encoder_name.startswith("spanpack put"):
        def run():
            encoder = spanpack.TraceMsgPackEncoder(version, fields=fields, max_size=BIG,
                                                   max_item_size=BIG, max_payload_size=BIG)
            for trace in traces:
                encoder.put(trace)
            return encoder.encode()[0][0]

        return run
    return lambda: spanpack.TraceMsgPackEncoder(version, fields=fields,
                                                max_size=BIG).encode_traces(traces)


MEMORY_CONTENDERS = [
    "spanpack encode_traces slotted",
    "spanpack encode_traces ddtrace spans",
    "spanpack put+encode ddtrace spans",
    "ddtrace put+encode",
]


@pytest.mark.parametrize("encoder_name", MEMORY_CONTENDERS)
@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
def test_peak_memory(benchmark, version, encoder_name):
    if "ddtrace" in encoder_name and not HAVE_DDTRACE:
        pytest.skip("ddtrace is not installed")
    fn = _memory_callable(encoder_name, version)
    peak, rss_peak, size = memory_profile(fn)
    benchmark.group = "peak memory %s (%d web traces)" % (version, MEMORY_TRACES)
    benchmark.extra_info.update(
        version=version,
        encoder=encoder_name,
        payload_bytes=size,
        tracemalloc_peak_bytes=peak,
        tracemalloc_peak_over_payload=round(peak / size, 2),
        peak_rss_growth_bytes=rss_peak,
    )
    benchmark.pedantic(fn, rounds=5 if QUICK else 10, iterations=1, warmup_rounds=1)
