"""The in-place readers of CPython internals and their public-API fallbacks.

spanpack reads dict entries, instance values arrays and int digits in place
only after module exec has proven each reader on probe objects
(ext/layout_probes.c); ``SPANPACK_DISABLE_FAST_PATHS`` switches readers off by
name.  These tests check that the interpreters whose layouts are known prove
every reader (a probe that fails quietly would only cost speed, so nothing
else would notice), and that each fallback writes the same bytes, and raises
the same errors, as the fast path, for every payload version and entry point
on many span shapes.  Each configuration runs in a child interpreter, since
the choice is made once at import.
"""

import hashlib
import json
import os
import subprocess
import sys
import sysconfig

import pytest

import spanpack._spanpack as _spanpack
from spanpack import TraceMsgPackEncoder, samples

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
VERSIONS = ("v0.4", "v0.5", "v1.0")
SPANS_PER_TRACE = 60
TRACES_PER_SHAPE = 3


def expected_fast_paths():
    if FREE_THREADED or sys.implementation.name != "cpython":
        return ()
    if (3, 11) <= sys.version_info[:2] <= (3, 15):
        return ("dict", "instance", "int")
    if sys.version_info[:2] < (3, 11):
        return ("int",)  # dicts and instances are read through the C API there
    return ()  # layouts this build was not told about


def test_known_interpreters_prove_every_fast_path():
    assert _spanpack._fast_paths == expected_fast_paths()


def run_child(code, disabled=None):
    env = dict(os.environ)
    env.pop("SPANPACK_DISABLE_FAST_PATHS", None)
    if disabled is not None:
        env["SPANPACK_DISABLE_FAST_PATHS"] = disabled
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "disabled, left",
    [
        ("dict", {"instance", "int"}),
        ("instance", {"dict", "int"}),
        ("int", {"dict", "instance"}),
        ("dict,int", {"instance"}),
        ("all", set()),
        ("", {"dict", "instance", "int"}),
    ],
)
def test_disabling_fast_paths_by_name(disabled, left):
    child = run_child("import spanpack._spanpack as m; print(','.join(m._fast_paths))", disabled)
    assert child.returncode == 0, child.stderr
    assert set(filter(None, child.stdout.strip().split(","))) == left & set(expected_fast_paths())


def test_unknown_fast_path_name_is_refused_at_import():
    child = run_child("import spanpack", "dict,digits")
    assert child.returncode != 0
    assert "ValueError: SPANPACK_DISABLE_FAST_PATHS: unknown fast path 'digits'" in child.stderr


# --------------------------------------------------------------------------------------------
# The corpus: every reader's input forms, each through every version and entry point


class Plain:
    pass


class SlotsThenDict:
    __slots__ = ("service", "__dict__")


class SlottedBase:
    __slots__ = ("service", "name")


class DictOfSlotted(SlottedBase):
    """The 3.14 case: values array past the slots (obj + tp_basicsize)."""


def as_instances(records, cls, ask_dict=False):
    traces = []
    for trace in records:
        spans = []
        for record in trace:
            span = cls()
            for key, value in record.items():
                setattr(span, key, dict(value) if isinstance(value, dict) else value)
            if ask_dict:
                span.__dict__  # noqa: B018 (the values array goes behind a dict)
            spans.append(span)
        traces.append(spans)
    return traces


def as_dataclasses(records):
    import dataclasses

    names = sorted({key for trace in records for record in trace for key in record})
    cls = dataclasses.make_dataclass("DataSpan", names)
    return [[cls(**{name: record.get(name) for name in names}) for record in trace] for trace in records]


INT_VALUES = [0, 1, 7, 2**30 - 1, 2**30, 2**31, 2**60 - 1, 2**60, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def int_records():
    """Span ids, times, errors and metrics across digit counts and signs."""
    spans = []
    for i, value in enumerate(INT_VALUES):
        spans.append({
            "trace_id": value or 1, "span_id": value, "parent_id": INT_VALUES[-1 - i],
            "service": "ints", "name": "int.%d" % i, "resource": "r", "span_type": "t",
            "start_ns": min(value, 2**63 - 1), "duration_ns": min(value, 2**62), "error": value % 3,
            "meta": {"k": "v"},
            "metrics": {"pos": min(value, 2**63 - 1), "neg": -min(value, 2**63)},
        })
    return [spans, [dict(spans[0], trace_id=2**128 - 1, span_id=5)], [dict(spans[0], trace_id=2**64 + 3)]]


def bad_records():
    """Out-of-range ints: the error, as the fast path words it, is the reference."""
    base = int_records()[0][1]
    return {
        "trace_id_too_wide": [[dict(base, trace_id=2**128)]],
        "negative_span_id": [[dict(base, span_id=-1)]],
        "span_id_too_wide": [[dict(base, span_id=2**64)]],
        "metric_too_wide": [[dict(base, metrics={"m": 2**64})]],
        "metric_too_negative": [[dict(base, metrics={"m": -(2**63) - 1})]],
        "start_too_wide": [[dict(base, start_ns=2**64)]],
    }


def corpus():
    """name -> traces; deterministic, so that two interpreters build the same."""
    cases = {}
    for shape in samples.shape_names():
        records = [trace[:SPANS_PER_TRACE] for trace in samples.build(shape, quick=True)[:TRACES_PER_SHAPE]]
        cases[shape + "/slotted"] = samples.as_slotted(records)
        cases[shape + "/dict"] = samples.as_dicts(records)
        plain_records = samples.as_dicts(records)
        cases[shape + "/plain"] = as_instances(plain_records, Plain)
        cases[shape + "/plain-dict-asked"] = as_instances(plain_records, Plain, ask_dict=True)
        cases[shape + "/slots-then-dict"] = as_instances(plain_records, SlotsThenDict)
        cases[shape + "/dict-of-slotted"] = as_instances(plain_records, DictOfSlotted)
        cases[shape + "/dataclass"] = as_dataclasses(plain_records)
        if samples.ddtrace_available():
            cases[shape + "/ddtrace"] = samples.as_ddtrace(records)
    ints = int_records()
    cases["ints/dict"] = ints
    cases["ints/plain"] = as_instances(ints, Plain)
    cases["ints/dict-of-slotted"] = as_instances(ints, DictOfSlotted)
    for name, traces in bad_records().items():
        cases["bad/" + name + "/dict"] = traces
        cases["bad/" + name + "/plain"] = as_instances(traces, Plain)
    return cases


def serialised(result):
    """encode_traces' bytes, or encode()'s payloads (with their trace counts), as bytes."""
    if isinstance(result, (bytes, bytearray, memoryview)):
        return bytes(result)
    if isinstance(result, int):
        return b"%d;" % result
    return b"[" + b",".join(serialised(item) for item in result) + b"]"


def outcome(call):
    try:
        result = call()
    except (TypeError, ValueError, OverflowError) as error:
        return "%s: %s" % (type(error).__name__, error)
    return hashlib.sha256(serialised(result)).hexdigest()


def encode_corpus():
    """name/version/entry point -> sha256 of the payloads, or the error raised."""
    results = {}
    for name, traces in corpus().items():
        fields = "ddtrace" if name.endswith("/ddtrace") else None
        for version in VERSIONS:
            key = "%s/%s" % (name, version)
            one_shot = TraceMsgPackEncoder(version, fields=fields)
            results[key + "/encode_traces"] = outcome(lambda: one_shot.encode_traces(traces))
            buffered = TraceMsgPackEncoder(version, fields=fields)

            def put_all():
                for trace in traces:
                    buffered.put(trace)
                return buffered.encode()

            results[key + "/put"] = outcome(put_all)
    return results


CHILD = (
    "import json, gc; gc.disable()\n"
    "from tests.robustness.test_fast_paths import encode_corpus\n"
    "import spanpack._spanpack as m\n"
    "print(json.dumps({'fast_paths': list(m._fast_paths), 'results': encode_corpus()}))\n"
)


@pytest.fixture(scope="module")
def fast_path_results():
    child = run_child(CHILD)
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout)
    assert tuple(out["fast_paths"]) == expected_fast_paths()
    return out["results"]


@pytest.mark.skipif(not expected_fast_paths(), reason="no fast path on this interpreter to fall back from")
@pytest.mark.parametrize("disabled", ["dict", "instance", "int", "all"])
def test_fallback_writes_the_same_bytes(fast_path_results, disabled):
    child = run_child(CHILD, disabled)
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout)
    assert not set(out["fast_paths"]) & set(disabled.replace("all", "dict,instance,int").split(","))
    results = out["results"]
    assert results.keys() == fast_path_results.keys()
    differing = [key for key in results if results[key] != fast_path_results[key]]
    assert differing == []
    # The corpus reaches both outcomes, on every version and entry point.
    assert any(":" in value for value in results.values())
    assert sum(":" not in value for value in results.values()) > len(results) // 2


def test_corpus_in_this_process_matches_the_child(fast_path_results):
    """The child's results are this interpreter's (nothing in the child's setup changes them)."""
    here = encode_corpus()
    assert here == fast_path_results
