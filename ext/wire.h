/* Constants of the agent protocol that the span writers, the payload joiner
 * and the Python side share, and the one text rule the writers and the
 * joiner both apply.  The module exports each constant (module.c), and
 * spanpack's Python code and tests import them from there instead of
 * restating them. */
#ifndef SPANPACK_WIRE_H
#define SPANPACK_WIRE_H

#include "compat.h"

/* Strings longer than this (code points for str, bytes for bytes) are cut to
 * TRUNCATED_PREFIX_LEN units followed by TRUNCATION_SUFFIX, as ddtrace does. */
#define MAX_TEXT_LEN 25000
#define TRUNCATED_PREFIX_LEN 2486
#define TRUNCATION_SUFFIX "<truncated>..."

/* The reference tracer's cut of a str longer than MAX_TEXT_LEN: a new str
 * (spanwrite.c). */
PyObject *truncated_str(PyObject *str);

/* Meta keys the span writers add (the reference tracer's names): the trace's
 * origin, the high half of a 128-bit trace id, and links and events as JSON
 * text. */
#define ORIGIN_KEY "_dd.origin"
#define TRACE_ID_HIGH_KEY "_dd.p.tid"
#define SPAN_LINKS_KEY "_dd.span_links"
#define SPAN_EVENTS_KEY "events"

#endif /* SPANPACK_WIRE_H */
