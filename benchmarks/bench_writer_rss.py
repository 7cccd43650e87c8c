"""AgentWriter's resident memory over a 60 s soak against a misbehaving agent.

    python benchmarks/bench_writer_rss.py [seconds] [max_buffer_size_MiB]

Four producer threads write one-span dict traces (each a new object, dropped
by the producer after ``write()``, so whatever the writer keeps is the
writer's) as fast as they can, for ``seconds`` (60) in four phases, a
quarter each, against the tests' fault server:

dead       nothing listens (connections refused)
slow       every payload is read and never answered
trickle    every reply comes one header byte every 50 ms, never ending
endless    every reply is a 200 with an endless chunked body

RSS (``/proc/self/statm``) is sampled every second; the table gives each
phase's peak growth over the baseline taken after a warm-up, next to the
bound docs/agent-writer.md states: 2 x ``max_buffer_size`` plus a small constant.
"""

import gc
import itertools
import os
import resource
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import spanpack  # noqa: E402

from tests.integration.fault_server import FaultServer, refusing_url  # noqa: E402

PRODUCERS = 4


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def trace(trace_id):
    return [
        {
            "trace_id": trace_id,
            "span_id": trace_id + 1,
            "parent_id": 0,
            "service": "svc-%d" % (trace_id % 17),
            "name": "web.request",
            "resource": "GET /users/%d" % (trace_id % 1000),
            "start_ns": 1_700_000_000_000_000_000 + trace_id,
            "duration_ns": 1000 + trace_id % 5000,
            "meta": {"http.method": "GET", "http.url": "/users/%d" % trace_id, "component": "web"},
            "metrics": {"_sampling_priority_v1": 1.0, "_dd.measured": 1.0},
        }
    ]


PHASES = ("dead", "slow", "trickle", "endless")


def phase_at(started, seconds):
    elapsed = time.monotonic() - started
    if elapsed < 0:
        return "warm-up"
    return PHASES[min(int(elapsed / (seconds / 4)), 3)]


def child(url, dead_url, started, seconds, max_buffer, version):
    """The writer and its producers, alone in this process (the server is in the parent)."""
    writer = spanpack.AgentWriter(url, version=version, flush_interval=0.2, timeout=0.5,
                                  max_buffer_size=max_buffer, max_payload_size=min(5 << 20, max_buffer))
    live_address, dead_address = writer._address, spanpack.transport.parse_agent_url(dead_url)
    ids = itertools.count(1, 10)
    stop = threading.Event()

    def produce():
        for i in range(100_000_000):  # bounded; ends with the event
            if i % 256 == 0 and stop.is_set():
                return
            writer.write(trace(next(ids)))

    for _ in range(2000):
        writer.write(trace(next(ids)))
    writer.flush(10)
    gc.collect()
    base = rss()
    print("max_buffer_size %.1f MiB, %s, baseline RSS %.1f MiB; bound 2 x max_buffer_size = %.1f MiB"
          % (max_buffer / 2**20, version, base / 2**20, 2 * max_buffer / 2**20))
    print("%6s %-8s %10s %12s %10s %10s %10s" % ("t (s)", "phase", "RSS +MiB", "written", "sent", "unconf.",
                                                 "dropped"), flush=True)
    while time.monotonic() < started:
        time.sleep(0.01)
    threads = [threading.Thread(target=produce) for _ in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    peaks = {}
    current = None
    for _ in range(int(seconds) + 10):
        name = phase_at(started, seconds)
        if name != current:
            current = name
            # The agent "moves": as if it died, or came back misbehaving (the
            # flush thread picks the address up with its next connection).
            writer._address = dead_address if name == "dead" else live_address
            writer._connection = None
        time.sleep(1.0)
        grown = rss() - base
        peaks[name] = max(peaks.get(name, 0), grown)
        s = writer.stats
        print("%6.1f %-8s %10.1f %12d %10d %10d %10d" % (time.monotonic() - started, name, grown / 2**20,
                                                         s["traces_written"], s["traces_sent"],
                                                         s["traces_sent_unconfirmed"], s["traces_dropped"]),
              flush=True)
        if time.monotonic() - started >= seconds:
            break
    stop.set()
    for thread in threads:
        thread.join(30)
    writer.stop(timeout=5)
    s = writer.stats
    print("\npeak RSS growth per phase (MiB):", ", ".join("%s %.1f" % (k, v / 2**20) for k, v in peaks.items()))
    print("bound: %.1f MiB (+ a small constant); peak %.1f MiB; written %d, sent %d (unconfirmed %d), dropped %s"
          % (2 * max_buffer / 2**20, max(peaks.values()) / 2**20, s["traces_written"], s["traces_sent"],
             s["traces_sent_unconfirmed"], {k: v for k, v in s["dropped_by_reason"].items() if v}))


def main():
    import subprocess

    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0  # noqa: the phases take a quarter each
    max_buffer = int(float(sys.argv[2]) * (1 << 20)) if len(sys.argv) > 2 else 8 << 20
    version = sys.argv[3] if len(sys.argv) > 3 else "v0.4"
    server = FaultServer().start()
    holder, dead_url = refusing_url()
    started = time.monotonic() + 3.0  # the child's warm-up first
    server.rule = lambda path, payload: {"slow": "slow", "trickle": "trickle", "endless": "huge"}.get(
        phase_at(started, seconds), "ok")
    try:
        args = [server.url, dead_url, repr(started), repr(seconds), str(max_buffer), version]
        subprocess.run([sys.executable, os.path.abspath(__file__), "--child"] + args, check=True,
                       timeout=seconds + 120)
    finally:
        server.release()
        server.close()
        holder.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        url, dead_url, started, seconds, max_buffer, version = sys.argv[2:8]
        child(url, dead_url, float(started), float(seconds), int(max_buffer), version)
    else:
        main()
