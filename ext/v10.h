/* /v1.0/traces, the "efficient trace payload": integer-keyed maps, strings
 * streamed per payload (a string's first use is a msgpack str and takes the
 * next id, later uses write the id; id 0 is "").  The rules, with their code
 * and tests, are in docs/wire-format-v1.md.
 *
 * A trace is written either straight into a payload (one-shot encodes: ids
 * from the payload's table) or into an encoded part with a table of its own:
 * every string reference there is a hole, and joining the part into a
 * payload writes, in body order, the str at a string's first use in that
 * payload and its id afterwards. */
#ifndef SPANPACK_V10_H
#define SPANPACK_V10_H

#include "payload.h"
#include "tracewrite.h"

#define V10_VERSION 10

/* Payload keys. */
#define V10_PAYLOAD_CHUNKS 11

/* One trace as a chunk map. */
int v10_write_trace(SpanWriter *w, PyObject *trace);

/* The payload fields written in front of the chunks (keys 2-10), built by
 * spanpack.encoder: a tuple (encoded entries as bytes, number of entries,
 * tuple of the distinct non-empty strings they stream, in stream order). */
int v10_check_preamble(PyObject *preamble);

/* Give a fresh v1.0 payload its preamble (a new reference is kept) and enter
 * the preamble's strings into its table. */
int v10_payload_start(PayloadBuilder *payload, PyObject *preamble);

/* Bytes in front of `trace_count` chunks: map header, preamble (may be
 * NULL), chunks key and array header. */
Py_ssize_t v10_prefix_size(PyObject *preamble, Py_ssize_t trace_count);
void v10_put_prefix(const PayloadBuilder *payload, OutBuf *head);

/* Append an encoded part, resolving its holes against the payload's stream.
 * On failure the caller rolls the payload back. */
int v10_append_part(PayloadBuilder *payload, EncodedPart *part);

#endif /* SPANPACK_V10_H */
