/* Which in-place reads of CPython internals this interpreter may use.
 *
 * pydict.h, pyinstance.h and pyint.h read CPython's internal structures
 * directly where their layout is known (3.11 through 3.15, GIL builds).  A
 * known version is not proof: module exec runs each reader on probe objects
 * of every layout it can meet and compares what it reads with the public C
 * API's answer (layout_probes_run); a reader is switched on only when every
 * probe agrees, so an interpreter whose layout changed is slower, never
 * wrong.  The result lives in the module state and reaches the readers with
 * the encoder (SpanWriter.state, SpanFieldReader.fast_paths). */
#ifndef SPANPACK_LAYOUT_PROBES_H
#define SPANPACK_LAYOUT_PROBES_H

#include "compat.h"

/* The layouts mirrored in pydict.h / pyinstance.h / pyint.h. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x03100000 && !defined(Py_GIL_DISABLED)
#define SP_KNOWN_CPYTHON_LAYOUTS 1
#endif

/* 1: the reader is proven on this interpreter; 0: use the public C API. */
typedef struct {
    unsigned char dict_entries;    /* a dict's entry array (pydict.h) */
    unsigned char instance_values; /* an instance's values array (pyinstance.h) */
    unsigned char int_digits;      /* an exact int's digits (pyint.h) */
    /* &PyLong_Type when int_digits is on, else NULL: pyint.h tests a value's
     * type against it, one comparison for both questions. */
    PyTypeObject *exact_int;
} SpFastPaths;

/* Fill `fast_paths`: each reader on when its probes agree with the public C
 * API, off when they do not, when this build does not know the layouts, or
 * when `disabled` (the SPANPACK_DISABLE_FAST_PATHS text: comma-separated
 * "dict", "instance", "int" or "all"; NULL for none) names it.  Returns 0,
 * or -1 with an exception (no memory for the probe objects, an unknown name
 * in `disabled`). */
int layout_probes_run(SpFastPaths *fast_paths, const char *disabled);

/* The names of the readers switched on, as a tuple of str (for tests and
 * benchmarks: spanpack._spanpack._fast_paths). */
PyObject *layout_probes_names(const SpFastPaths *fast_paths);

#endif /* SPANPACK_LAYOUT_PROBES_H */
