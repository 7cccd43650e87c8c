"""Python code that runs while spanpack holds span values or class internals
without references must not be able to free them.

Each scenario runs in a child interpreter with the debug allocator (freed
memory is poisoned, so a use-after-free crashes instead of passing by luck):
a pending signal handler or a collection's finalizer that replaces a span's
field while an error about it is being raised, and a class-dict key whose
__eq__ switches the span's class (freeing the old one) while spanpack reads
the class's layout.
"""

import os
import subprocess
import sys
import textwrap

import pytest

FIELDS = (
    "trace_id", "span_id", "parent_id", "service", "name", "resource", "span_type",
    "start_ns", "duration_ns", "error", "meta", "metrics", "meta_struct", "links",
    "events", "origin",
)

PRELUDE = textwrap.dedent(
    """
    import gc, signal, spanpack
    FIELDS = %r

    class SlotSpan:
        __slots__ = FIELDS

    def slot_span(**values):
        span = SlotSpan()
        for field in FIELDS:
            setattr(span, field, None)
        span.trace_id, span.span_id, span.name, span.start_ns = 1, 2, "n", 0
        for field, value in values.items():
            setattr(span, field, value)
        return span
    """
    % (FIELDS,)
)


def run_child(body):
    """Run PRELUDE + body under the debug allocator; it must print 'ok'."""
    env = dict(os.environ, PYTHONMALLOC="debug")
    completed = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0 and completed.stdout.strip().endswith("ok"), (
        "child exited with %d\nstdout: %s\nstderr: %s"
        % (completed.returncode, completed.stdout[-2000:], completed.stderr[-4000:])
    )


@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
@pytest.mark.parametrize("entry", ["encode_traces", "put"])
def test_finalizer_replacing_an_out_of_range_int_during_its_error(version, entry):
    """An int subclass beyond 64 bits in start_ns: a collection started while
    the error is raised runs a finalizer that replaces the field (dropping
    the last reference to the bad value) before the message names it."""
    run_child(
        """
        class Big(int):
            pass

        class Replacer:                 # cyclic garbage whose finalizer edits the span
            def __init__(self, span):
                self.span, self.cycle = span, self
            def __del__(self):
                self.span.start_ns = 0

        class Pad:
            pass

        encoder = spanpack.TraceMsgPackEncoder(%(version)r)
        # Line gen-0's count up with each allocation the error path makes.
        for shift in range(-20, 6):
            span = slot_span(start_ns=Big(2 ** 70))
            handled = KeyError()
            gc.collect()
            gc.set_threshold(200)
            Replacer(span)
            pad = [Pad() for _ in range(max(0, 200 - gc.get_count()[0] + shift))]
            try:
                raise handled
            except KeyError:            # chaining makes exceptions eagerly
                try:
                    encoder.%(entry)s([span] if %(entry)r == "put" else [[span]])
                except ValueError as error:
                    assert "start_ns" in str(error), error
            gc.set_threshold(700)
            del pad, span
        print("ok")
        """
        % {"version": version, "entry": entry}
    )


@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
@pytest.mark.parametrize("field, bad_value, replacement", [
    ("span_id", "int('18446744073709563961')", "1"),
    ("metrics", "{''.join(['m', 'x']): int('18446744073709563961')}", "{}"),
])
def test_signal_handler_replacing_a_field_during_its_error(version, field, bad_value, replacement):
    """A signal arriving while a long trace is written: its handler runs when
    the error message formats the bad value, and replaces that field."""
    run_child(
        """
        busy = slot_span(meta={"k%%d" %% i: "v" for i in range(300_000)})
        bad = slot_span()

        def handler(signum, frame):
            bad.%(field)s = %(replacement)s

        signal.signal(signal.SIGALRM, handler)
        encoder = spanpack.TraceMsgPackEncoder(%(version)r)
        for _ in range(5):
            bad.%(field)s = %(bad_value)s
            signal.setitimer(signal.ITIMER_REAL, 0.005)
            try:
                encoder.encode_traces([[busy, bad]])
            except ValueError:
                pass
        signal.setitimer(signal.ITIMER_REAL, 0)
        print("ok")
        """
        % {"version": version, "field": field, "bad_value": bad_value, "replacement": replacement}
    )


def test_class_key_eq_switching_the_span_class_while_its_layout_is_read():
    """A str-subclass key in the span class's dict whose hash collides with a
    field name: looking the field up runs its __eq__, which moves the span to
    another class and frees the first one."""
    run_child(
        """
        class Other:
            __slots__ = FIELDS

        armed = False

        class Key(str):
            def __hash__(self):
                return hash("trace_id")
            def __eq__(self, other):
                global First
                if armed and First is not None:
                    span.__class__ = Other
                    First = None
                    gc.collect()
                return False

        First = type("First", (), {"__slots__": FIELDS, Key("x"): 1})
        span = First()
        for field in FIELDS:
            setattr(span, field, None)
        span.trace_id, span.span_id, span.name, span.start_ns = 1, 2, "n", 0
        armed = True
        for version in ("v0.4", "v0.5"):
            spanpack.TraceMsgPackEncoder(version).encode_traces([[span]])
        print("ok")
        """
    )


def test_context_module_key_eq_switching_the_context_class():
    """fields="ddtrace" recognises ddtrace's Context by its class's
    __module__; a colliding key's __eq__ there frees the class."""
    run_child(
        """
        armed = False

        class Key(str):
            def __hash__(self):
                return hash("__module__")
            def __eq__(self, other):
                global Context
                if armed and Context is not None:
                    context.__class__ = Plain
                    Context = None
                    gc.collect()
                return False

        Context = type("Context", (), {"__slots__": ("_meta",), Key("x"): 1,
                                       "__module__": "ddtrace._trace.context"})

        class Plain:
            __slots__ = ("_meta",)
            dd_origin = None

        context = Context()
        context._meta = {"_dd.origin": "synthetics"}

        class Span:
            def __init__(self):
                self.trace_id, self.span_id, self.name, self.start_ns = 1, 2, "n", 0
                self._meta, self._metrics, self.context = {}, {}, context

        encoder = spanpack.TraceMsgPackEncoder("v0.4", fields="ddtrace")
        armed = True
        encoder.encode_traces([[Span()]])
        encoder.encode_traces([[Span()]])
        print("ok")
        """
    )
