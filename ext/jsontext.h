/* JSON text as Python's json.dumps writes it with its default options, for
 * the plain data that span links and events carry (v0.5 sends them as JSON in
 * meta, and so does v0.4 for events unless they are native). */
#ifndef SPANPACK_JSONTEXT_H
#define SPANPACK_JSONTEXT_H

#include "outbuf.h"

/* Nesting beyond this is left to json.dumps (which also finds cycles). */
#define JSON_TEXT_MAX_DEPTH 32

/* Append the JSON text of `value` to `out`, byte for byte what
 * json.dumps(value) returns (ensure_ascii, ", " and ": " separators, NaN and
 * Infinity as json writes them).  Written here: None, True, False, str and
 * its subclasses, int in [-2**63, 2**64) and float and their subclasses
 * (json reads their values without calling a method), exact list, tuple and dict with str
 * keys.  1: written; 0: declined, nothing raised, because `value` holds
 * something whose text only json.dumps can say (a dict subclass, a key it
 * would convert or refuse, an object it would refuse, a larger int, deeper
 * nesting than JSON_TEXT_MAX_DEPTH); the caller discards what was appended and asks
 * json.dumps.  -1: an error raised (memory). */
int json_text_write(OutBuf *out, PyObject *value, int depth);

/* The text appended to `out` since `start` (ASCII, as ensure_ascii makes
 * it) as a new str. */
PyObject *json_text_str(const OutBuf *out, Py_ssize_t start);

#endif /* SPANPACK_JSONTEXT_H */
