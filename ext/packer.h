/* Packing any supported Python object the way msgpack-python's Packer does. */
#ifndef SPANPACK_PACKER_H
#define SPANPACK_PACKER_H

#include "outbuf.h"
#include "state.h"

/* msgpack-python 1.2's nesting limit: an object nested deeper raises ValueError. */
#define PACK_NEST_LIMIT 1024

typedef struct {
    SpanpackState *state;
    PyObject *default_fn;       /* borrowed; NULL when none */
    const char *unicode_errors; /* NULL: strict UTF-8 straight from the str */
    int use_single_float;
    int use_bin_type;
    int strict_types;
    int datetime;
} PackOptions;

/* Append the msgpack form of `obj`.  Returns 0, or -1 with an exception set
 * (the buffer then holds a partial write that the caller must roll back). */
int pack_object(const PackOptions *options, OutBuf *buf, PyObject *obj, int nest_limit);

PyObject *spanpack_packb(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames);

#endif /* SPANPACK_PACKER_H */
