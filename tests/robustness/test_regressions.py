"""One test per crash or bug found by fuzzing and review of ext/ (see fuzz/).

Tests of bugs that are not fixed yet are marked xfail(strict=True): they fail
today, and the marker must go once ext/ is fixed (a strict xfail that passes
fails the run).  Crashes run in a child interpreter so that a segfault fails
one test instead of killing the session.
"""

import ctypes
import os
import subprocess
import sys
import textwrap

import msgpack
import pytest

import spanpack


def run_child(code, timeout=120, **extra_env):
    """Run `code` in a fresh interpreter (same environment, so an ASan build's
    LD_PRELOAD carries over, plus `extra_env`); return (returncode, combined
    output)."""
    env = dict(os.environ)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    for name, value in extra_env.items():
        env.setdefault(name, value)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return result.returncode, result.stdout + result.stderr


SPAN_CLASS = """
    import spanpack

    class Span:
        trace_id = 1
        span_id = 2
        parent_id = None
        service = "svc"
        resource = "res"
        span_type = None
        start_ns = 0
        duration_ns = 1
        error = 0
        meta = {}
        metrics = {}
        name = "op"
"""


# ---------------------------------------------------------------------------
# Bug 1: TraceEncoder.__init__ called by span code (a property) while
# encode_traces() / encode_trace() is running.  __init__ refuses only while a
# put() is encoding (scratch_in_use); during the one-shot paths it frees and
# replaces the string cache, the field reader and the version under the
# running SpanWriter: strcache_lookup() dereferences the new cache's NULL
# slots (ext/intern.h strcache_lookup), a v0.5 writer runs against a v0.4
# PayloadBuilder, and a dotted field path tuple is freed while get_attribute()
# walks it (heap-use-after-free under ASan).

REINIT_CASES = {
    "encode_traces_v04_to_v05": """
        enc = spanpack.TraceMsgPackEncoder("v0.4")

        class Reinit(Span):
            @property
            def name(self):
                enc.__init__("v0.5")
                return "op"

        try:
            enc.encode_traces([[Reinit()]])
        except RuntimeError:
            print("refused")
    """,
    "encode_trace_intern_off": """
        enc = spanpack.TraceMsgPackEncoder("v0.4", intern=True)

        class Reinit(Span):
            @property
            def name(self):
                enc.__init__("v0.4", intern=False)
                return "op"

        try:
            enc.encode_trace([Reinit()])
        except RuntimeError:
            print("refused")
    """,
}


@pytest.mark.parametrize("case", sorted(REINIT_CASES))
def test_reinit_from_span_code_during_one_shot_encode(case):
    code = textwrap.dedent(SPAN_CLASS) + textwrap.dedent(REINIT_CASES[case])
    returncode, output = run_child(code)
    assert returncode == 0, output[-3000:]


# ---------------------------------------------------------------------------
# Bug 2: encode_traces() keeps PySequence_Fast(traces) -- the caller's own
# list -- and its length from before the loop; span code that shrinks that
# list makes PySequence_Fast_GET_ITEM read past the end (after list.clear(),
# through a NULL ob_item: SEGV in trace_encoder_encode_traces).


def test_traces_list_shrunk_by_span_code_during_encode_traces():
    code = textwrap.dedent(SPAN_CLASS) + textwrap.dedent(
        """
        traces = []

        class Clearing(Span):
            @property
            def name(self):
                traces.clear()
                return "op"

        traces[:] = [[Clearing()], [Span()], [Span()]]
        enc = spanpack.TraceMsgPackEncoder("v0.4")
        try:
            payload = enc.encode_traces(traces)
        except RuntimeError:
            print("refused")
        """
    )
    returncode, output = run_child(code)
    assert returncode == 0, output[-3000:]


# ---------------------------------------------------------------------------
# Bug 3: Packer.getbuffer() called from `default` while pack() runs.  pack()
# checks for exported views only on entry; the rest of the pack grows the
# buffer (PyMem_Realloc in outbuf_grow) under the live memoryview, which then
# points at freed memory (heap-use-after-free on bytes(view) under ASan).  The
# test compares buffer addresses, without touching the freed memory.


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


def buffer_address(obj):
    view = _PyBuffer()
    get_buffer = ctypes.pythonapi.PyObject_GetBuffer
    get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    release = ctypes.pythonapi.PyBuffer_Release
    release.argtypes = [ctypes.POINTER(_PyBuffer)]
    if get_buffer(obj, ctypes.byref(view), 0) != 0:
        raise RuntimeError("PyObject_GetBuffer failed")
    try:
        return view.buf
    finally:
        release(ctypes.byref(view))


def test_getbuffer_export_taken_inside_default_stays_valid():
    """The buffer may still move while packing: exporting it then is refused
    (BufferError out of pack), so no view can outlive its memory."""
    views = []

    def default(obj):
        views.append(packer.getbuffer())
        return b"x" * (1 << 20)

    packer = spanpack.Packer(autoreset=False, default=default)
    with pytest.raises(BufferError):
        packer.pack([object()])
    assert views == []
    packer.pack(1)
    view = packer.getbuffer()
    assert buffer_address(view) == buffer_address(packer)
    assert bytes(view) == spanpack.packb(1)
    view.release()


def test_packer_methods_called_from_default_are_refused():
    packer = spanpack.Packer(autoreset=False)

    def default(obj):
        packer.reset()
        return 0

    packer.__init__(autoreset=False, default=default)
    packer.pack("kept")
    with pytest.raises(RuntimeError):
        packer.pack([object()])
    assert packer.bytes() == spanpack.packb("kept")


# ---------------------------------------------------------------------------
# Bug 4: `default` deletes a key of a dict being packed (already written) and
# inserts another: the size is unchanged, so the size check passes, and the
# new key is written too -- map header 2, three pairs, undecodable output.
# docs/security.md: spanpack never writes a map whose header disagrees with its items.


def test_default_swaps_dict_key_without_changing_size():
    data = {"a": object(), "b": 1}

    def default(obj):
        del data["a"]
        data["c"] = 2
        return 0

    try:
        packed = spanpack.packb(data, default=default)
    except RuntimeError:
        return  # raising, as for a resize, is the fix
    msgpack.unpackb(packed, strict_map_key=False)  # ExtraData today


# ---------------------------------------------------------------------------
# Bug 5: the same for the span encoder: a meta_struct value whose packing
# runs Python code (a list subclass's __iter__) swaps a meta_struct key.
# write_dict_entries() checks only the size and reports the original count,
# so the v0.4 span's meta_struct map has more pairs than its header says.


def test_meta_struct_key_swapped_while_encoding():
    meta_struct = {}

    class Sneaky(list):
        def __iter__(self):
            if "a" in meta_struct:
                del meta_struct["a"]
                meta_struct["c"] = 3
            return list.__iter__(self)

    meta_struct.update({"a": 1, "b": Sneaky([1])})
    span = {"trace_id": 1, "span_id": 2, "service": "s", "name": "n", "resource": "r",
            "start_ns": 0, "duration_ns": 1, "meta": {}, "metrics": {},
            "meta_struct": meta_struct}
    # (lenient=True counts the pairs it writes and is not affected)
    encoder = spanpack.TraceMsgPackEncoder("v0.4")
    try:
        payload = encoder.encode_traces([[span]])
    except RuntimeError:
        return
    msgpack.unpackb(payload, strict_map_key=False)


# ---------------------------------------------------------------------------
# Borrowed values: the span writers read a __slots__ span's fields (and a
# dict span's, when its keys are interned str) without taking references, and
# must own them before anything that can run Python code.  Here that code (a link's to_dict, an event's attribute, an
# error int subclass's __bool__) replaces every slot of the span being written
# and churns memory, so values still borrowed would be freed and reused.
# Owned, the span is written with the values it had when it was read.

BORROW_CHILD = """
    import msgpack, spanpack

    FIELDS = ("trace_id", "span_id", "parent_id", "service", "name", "resource",
              "span_type", "start_ns", "duration_ns", "error", "meta", "metrics",
              "meta_struct", "links", "events")

    class Span:
        __slots__ = FIELDS

    def fresh(tag):
        # objects only the span refers to, so replacing the slot frees them
        return {
            "service": "service-" + tag, "name": "name-" + tag, "resource": "resource-" + tag,
            "span_type": "type-" + tag, "start_ns": 10**15 + len(tag) * 7919,
            "duration_ns": 10**9 + len(tag), "meta": {"key-" + tag: "value-" + tag},
            "metrics": {"metric-" + tag: float(len(tag))},
        }

    def replace_everything(span):
        for name, value in fresh("replaced-by-python-code").items():
            if isinstance(span, dict):
                span[name] = value
            else:
                setattr(span, name, value)
        garbage = [("x%d" % i) * 3 for i in range(20000)]  # reuse freed memory
        del garbage

    def make_span(trigger):
        fields = dict(trace_id=1, span_id=2, parent_id=None, error=0, meta_struct=None,
                      links=None, events=None, **fresh("original"))
        if FORM == "dict":
            span = fields
        else:
            span = Span()
            for name, value in fields.items():
                setattr(span, name, value)

        def set_field(name, value):
            if isinstance(span, dict):
                span[name] = value
            else:
                setattr(span, name, value)

        class Link:
            def to_dict(self):
                replace_everything(span)
                return {"trace_id": "%032x" % 5, "span_id": "%016x" % 6}

        class Event:
            name = "event"
            time_unix_nano = 1
            @property
            def attributes(self):
                replace_everything(span)
                return {}

        class Error(int):
            def __bool__(self):
                replace_everything(span)
                return True

        if trigger == "links":
            set_field("links", [Link()])
        elif trigger == "events":
            set_field("events", [Event()])
        elif trigger == "error":
            set_field("error", Error(1))
        return span

    version, trigger = VERSION, TRIGGER
    encoder = spanpack.TraceMsgPackEncoder(version, intern=True)
    expected = fresh("original")
    for attempt in range(3):  # the v0.4 string cache admits strings on their 2nd sighting
        payload = encoder.encode_traces([[make_span(trigger)]])
        data = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        if version == "v0.4":
            span = data[0][0]
            got = {name: span.get(key) for name, key in (
                ("service", "service"), ("name", "name"), ("resource", "resource"),
                ("span_type", "type"), ("start_ns", "start"), ("duration_ns", "duration"))}
            got["meta"] = {k: v for k, v in span["meta"].items() if k.startswith("key-")}
            got["metrics"] = span["metrics"]
        else:
            strings, traces = data
            fields = traces[0][0]
            got = {"service": strings[fields[0]], "name": strings[fields[1]],
                   "resource": strings[fields[2]], "start_ns": fields[6], "duration_ns": fields[7],
                   "span_type": strings[fields[11]]}
            got["meta"] = {strings[k]: strings[v] for k, v in fields[9].items()
                           if strings[k].startswith("key-")}
            got["metrics"] = {strings[k]: v for k, v in fields[10].items()}
        assert got == expected, (attempt, got)
    print("ok")
"""


@pytest.mark.parametrize("form", ["slots", "dict"])
@pytest.mark.parametrize(
    "version,trigger",
    [("v0.4", "links"), ("v0.4", "events"), ("v0.4", "error"), ("v0.5", "links"), ("v0.5", "events")],
)
def test_span_code_replacing_fields_while_span_is_written(version, trigger, form):
    code = (
        textwrap.dedent(BORROW_CHILD)
        .replace("VERSION", repr(version))
        .replace("TRIGGER", repr(trigger))
        .replace("FORM", repr(form))
    )
    returncode, output = run_child(code)
    assert returncode == 0 and output.strip().endswith("ok"), output[-3000:]


# ---------------------------------------------------------------------------
# Found in review: an error message names the metrics key after formatting
# the value, and an int subclass's __repr__ (Python code) could drop the
# metrics dict -- and with it the key -- in between (use-after-free: a crash
# on 3.12, freed memory printed as the key elsewhere).

METRIC_REPR_CHILD = """
    import spanpack

    class Span:
        __slots__ = ("trace_id", "span_id", "parent_id", "service", "name", "resource",
                     "span_type", "start_ns", "duration_ns", "error", "meta", "metrics",
                     "meta_struct", "links", "events")

    span = Span()
    for name in Span.__slots__:
        setattr(span, name, None)
    span.trace_id, span.span_id, span.name, span.start_ns = 1, 2, "n", 1

    class Evil(int):
        def __repr__(self):
            if HOW == "clear":
                span.metrics.clear()
            else:
                span.metrics = None
            junk = ["x" * 40 + str(i) for i in range(1000)]
            return "Evil"

    for version in ("v0.4", "v0.5"):
        span.metrics = {"".join(["k", "e", "y"]) * 10: Evil(2**70)}
        try:
            spanpack.TraceMsgPackEncoder(version).encode_traces([[span]])
        except ValueError as error:
            assert "metrics key 'keykeykeykeykeykeykeykeykeykey'" in str(error), str(error)
        else:
            raise AssertionError("no error")
    print("ok")
"""


@pytest.mark.parametrize("how", ["clear", "replace"])
def test_value_repr_dropping_the_key_named_in_the_error(how):
    code = textwrap.dedent(METRIC_REPR_CHILD).replace("HOW", repr(how))
    # Debug allocator hooks (unless an ASan run set its own): freed memory is
    # overwritten, so a key read after it was freed shows in the message.
    returncode, output = run_child(code, PYTHONMALLOC="debug")
    assert returncode == 0 and output.strip().endswith("ok"), output[-3000:]
