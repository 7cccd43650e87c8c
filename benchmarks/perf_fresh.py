"""Encode fresh spans of a spanpack.user_spans class in a loop, for perf.

    python benchmarks/perf_fresh.py plain 150 [v0.4]
    mkfifo ctl ack
    perf record -e cpu-clock -F 20000 -D -1 --control=fifo:ctl,ack -- \\
        env PERF_CTL=ctl PERF_ACK=ack python benchmarks/perf_fresh.py plain 150

Each round builds 8 sets of 10 traces x 100 spans, then encodes each once
with one encoder kept across rounds, as a tracer does.  With PERF_CTL and
PERF_ACK (the fifos of perf's --control) perf records only while spanpack
encodes, not while the spans are built or freed.  Prints the best and mean
time per span (docs/speed-3.11.md).
"""

import gc
import os
import sys
import time

import spanpack
from spanpack import user_spans

SETS = 8


def main() -> int:
    shape, rounds = sys.argv[1], int(sys.argv[2])
    version = sys.argv[3] if len(sys.argv) > 3 else "v0.4"
    control = os.environ.get("PERF_CTL")
    control_fd = os.open(control, os.O_WRONLY) if control else None
    ack_fd = os.open(os.environ["PERF_ACK"], os.O_RDONLY) if control else None

    def perf(command: bytes) -> None:
        if control_fd is not None:
            os.write(control_fd, command + b"\n")
            os.read(ack_fd, 5)

    encoder = spanpack.TraceMsgPackEncoder(version)
    best, total = float("inf"), 0.0
    gc.disable()
    for _ in range(rounds):
        sets = [user_spans.traces(shape) for _ in range(SETS)]
        perf(b"enable")
        start = time.perf_counter()
        for traces in sets:
            encoder.encode_traces(traces)
        elapsed = time.perf_counter() - start
        perf(b"disable")
        best, total = min(best, elapsed), total + elapsed
        del sets
    per_call = SETS * user_spans.SPANS
    print("%s %s %s: best %.1f ns a span, mean %.1f" % (sys.version.split()[0], shape, version,
                                                       best / per_call * 1e9, total / rounds / per_call * 1e9))
    return 0


if __name__ == "__main__":
    sys.exit(main())
