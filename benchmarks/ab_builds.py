"""Two builds of spanpack in one process, in paired rounds: is B faster than A?

    python benchmarks/ab_builds.py A.so B.so ddtrace web_50_children_40_tags v0.5 put
    python benchmarks/ab_builds.py A.so B.so user plain v0.4
    python benchmarks/ab_builds.py A.so B.so otel events_links

A.so and B.so are two builds of the extension (``python setup.py build_ext
--inplace``, then copy ``python/spanpack/_spanpack*.so`` aside, before and after
a change).  Each is loaded as a package of its own (a copy of python/spanpack
under another name), so both run in this process, on this interpreter, with the
same heap.  Every round builds fresh spans for each build in turn, collects
garbage (as ddtrace_tracer.py and otel_vs_otlp.py do: the caches go cold, as
they are when a trace ends after a request's own work), and times one call;
the order alternates.  Reported: each build's best and median, and the median
of the round-by-round ratios B/A with its quartiles.

Why: on a shared machine the load moves run times by a quarter or more from
minute to minute, so best-of figures from separate runs cannot tell a 5%
change.  A ratio taken within each round cancels most of that drift; A/A runs
(the same .so twice) read 0.96 (21 rounds) and 0.985 (61 rounds) on the
2-core machine where it was written, so trust differences past about 5%, with
41 rounds or more.  Nothing here asserts anything.
"""

import argparse
import gc
import importlib
import os
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from typing import Any, Callable, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, os.pardir, "python", "spanpack")
sys.path.insert(0, os.path.join(HERE, os.pardir, "python"))
sys.path.insert(0, HERE)


def load_build(so_path: str, name: str, root: str) -> Any:
    """spanpack's Python package with `so_path` as its extension, imported as `name`."""
    target = os.path.join(root, name)
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("_spanpack*.so", "__pycache__"))
    # (Named for this interpreter whatever the file was called: a build for
    # another one would not load anyway.)
    shutil.copy(so_path, os.path.join(target, "_spanpack" + sysconfig.get_config_var("EXT_SUFFIX")))
    return importlib.import_module(name)


def workload(args: argparse.Namespace) -> Tuple[Callable[[], Any], Callable[[Any], Callable[[Any], Any]], int]:
    """(make inputs, encoder factory for a build, spans per call)."""
    if args.kind == "ddtrace":
        from spanpack import ddtrace_shapes

        body, count = ddtrace_shapes.SHAPES[args.shape]
        spans = sum(map(len, ddtrace_shapes.finished_traces(body, count)))

        def for_build(package: Any) -> Callable[[Any], Any]:
            encoder = package.TraceMsgPackEncoder(args.version)
            if args.mode == "encode_traces":
                return encoder.encode_traces
            return lambda traces: ddtrace_shapes._put_encode(encoder, traces)

        return (lambda: ddtrace_shapes.finished_traces(body, count)), for_build, spans
    if args.kind == "user":
        from spanpack import user_spans

        return ((lambda: user_spans.traces(args.shape)),
                lambda package: package.TraceMsgPackEncoder(args.version).encode_traces, user_spans.SPANS)
    import otel_vs_otlp

    return ((lambda: otel_vs_otlp.make_spans(args.shape, 100)),
            lambda package: importlib.import_module(package.__name__ + ".otel").encode_spans, 100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("a", help="build A's extension (.so)")
    parser.add_argument("b", help="build B's extension (.so)")
    parser.add_argument("kind", choices=["ddtrace", "user", "otel"])
    parser.add_argument("shape")
    parser.add_argument("version", nargs="?", default="v0.4")
    parser.add_argument("mode", nargs="?", default="put", choices=["put", "encode_traces"])
    parser.add_argument("--rounds", type=int, default=41)
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the ratios' quartiles)")
    if args.kind == "user":
        from spanpack import user_spans

        if args.shape not in user_spans.SHAPES:
            parser.error("no user shape %r: one of %s" % (args.shape, ", ".join(user_spans.SHAPES)))
    root = tempfile.mkdtemp(prefix="spanpack-ab-")
    sys.path.insert(0, root)
    try:
        make, for_build, spans = workload(args)
        encoders = [for_build(load_build(path, name, root))
                    for path, name in ((args.a, "spanpack_build_a"), (args.b, "spanpack_build_b"))]
        for encode in encoders:  # warm up, and fail early
            encode(make())
        times: List[List[float]] = [[], []]
        for round_number in range(args.rounds):
            for k in ((0, 1) if round_number % 2 == 0 else (1, 0)):
                inputs = make()
                gc.collect()
                gc.disable()
                try:
                    started = time.perf_counter()
                    encoders[k](inputs)
                    elapsed = time.perf_counter() - started
                finally:
                    gc.enable()
                times[k].append(elapsed / spans * 1e9)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratios = sorted(b / a for a, b in zip(*times))
    quartiles = statistics.quantiles(ratios, n=4)
    what = {"ddtrace": "%s %s" % (args.version, args.mode), "user": args.version, "otel": "encode_spans"}[args.kind]
    print("%s %s %s, %d rounds, ns a span:" % (args.kind, args.shape, what, args.rounds))
    for label, samples in (("A", times[0]), ("B", times[1])):
        print("  %s best %6.0f  median %6.0f" % (label, min(samples), statistics.median(samples)))
    print("  B/A median of paired ratios %.3f (quartiles %.3f-%.3f)" % (quartiles[1], quartiles[0], quartiles[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
