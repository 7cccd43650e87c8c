"""Against real consumers: the APM test agent, libdatadog, the AgentWriter."""


def chained_trace(trace_id, spans, id_stride, service, resource, meta, metrics):
    """A trace of `spans` dict spans named "op", each the child of the one
    before: span ids trace_id * id_stride + 1, + 2, ... (so `spans` stays below
    `id_stride`), start times 1 ns apart, each span with its own copy of
    `meta` and `metrics`."""
    return [
        {
            "trace_id": trace_id,
            "span_id": trace_id * id_stride + i + 1,
            "parent_id": trace_id * id_stride + i if i else 0,
            "service": service,
            "name": "op",
            "resource": resource,
            "start_ns": 1_700_000_000_000_000_000 + i,
            "duration_ns": 1000,
            "meta": dict(meta),
            "metrics": dict(metrics),
        }
        for i in range(spans)
    ]
