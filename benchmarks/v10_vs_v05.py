"""spanpack's v1.0 payloads against its v0.5 ones on the bench shapes: bytes
per span and time per span (best of several rounds), one-shot
(encode_traces) and buffered (put + encode), slotted spans.

    python benchmarks/v10_vs_v05.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import gc
import time

import spanpack
from spanpack import bench, samples


def best_time(run, rounds: int) -> float:
    run()  # warm up
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def measure(shape: str, version: str, quick: bool, rounds: int):
    records = samples.build(shape, quick)
    spans = samples.as_slotted(records)
    count = samples.span_count(records)
    encoder = spanpack.TraceMsgPackEncoder(version, max_size=bench.BIG)
    size = len(encoder.encode_traces(spans))

    def put_encode():
        for trace in spans:
            encoder.put(trace)
        encoder.encode()

    one_shot = best_time(lambda: encoder.encode_traces(spans), rounds)
    buffered = best_time(put_encode, rounds)
    return size / count, one_shot / count * 1e9, buffered / count * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    header = ("shape", "B/span v0.5", "B/span v1.0", "ns/span v0.5", "ns/span v1.0",
              "put+enc v0.5", "put+enc v1.0")
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for shape in samples.shape_names():
        v05 = measure(shape, "v0.5", args.quick, args.rounds)
        v10 = measure(shape, "v1.0", args.quick, args.rounds)
        print("| %s | %.1f | %.1f | %.0f | %.0f | %.0f | %.0f |"
              % (shape, v05[0], v10[0], v05[1], v10[1], v05[2], v10[2]))


if __name__ == "__main__":
    main()
