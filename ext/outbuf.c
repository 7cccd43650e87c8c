/* Growable output buffer: allocation, growth and hand-over of the result. */
#include "outbuf.h"

int
outbuf_init_bytes(OutBuf *buf, Py_ssize_t capacity)
{
    buf->bytes = PyBytes_FromStringAndSize(NULL, capacity);
    if (buf->bytes == NULL) {
        buf->start = buf->pos = buf->end = NULL;
        return -1;
    }
    buf->start = buf->pos = PyBytes_AS_STRING(buf->bytes);
    buf->end = buf->start + capacity;
    return 0;
}

int
outbuf_init_raw(OutBuf *buf, Py_ssize_t capacity)
{
    buf->bytes = NULL;
    if (capacity < 1) {
        capacity = 1;
    }
    buf->start = PyMem_Malloc((size_t)capacity);
    if (buf->start == NULL) {
        buf->pos = buf->end = NULL;
        PyErr_NoMemory();
        return -1;
    }
    buf->pos = buf->start;
    buf->end = buf->start + capacity;
    return 0;
}

void
outbuf_free(OutBuf *buf)
{
    if (buf->bytes != NULL) {
        Py_CLEAR(buf->bytes);
    }
    else {
        PyMem_Free(buf->start);
    }
    buf->start = buf->pos = buf->end = NULL;
}

int
outbuf_grow(OutBuf *buf, Py_ssize_t extra)
{
    Py_ssize_t used = outbuf_len(buf);
    Py_ssize_t capacity = outbuf_capacity(buf);
    if (extra > PY_SSIZE_T_MAX - used) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t needed = used + extra;
    /* Double small buffers; grow large ones by 1/8 so a payload's buffer is
     * never much larger than the payload (growing a large heap block is a
     * cheap remap, not a copy, so appends stay amortised O(1)). */
    Py_ssize_t new_capacity = capacity < (1 << 20) ? capacity * 2 : capacity + (capacity >> 3);
    if (new_capacity < needed || new_capacity < capacity) {
        new_capacity = needed;
    }
    if (new_capacity < 64) {
        new_capacity = 64;
    }
    char *grown;
    if (buf->bytes != NULL) {
        /* Move to heap memory: the bytes object stays intact until its
         * contents are safe in the new block. */
        grown = PyMem_Malloc((size_t)new_capacity);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(grown, buf->start, (size_t)used);
        Py_CLEAR(buf->bytes);
    }
    else {
        /* PyMem_Realloc keeps the old block when it fails. */
        grown = PyMem_Realloc(buf->start, (size_t)new_capacity);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    buf->start = grown;
    buf->pos = grown + used;
    buf->end = grown + new_capacity;
    return 0;
}

/* Hand over a bytes-backed buffer's own object, ended at the written length. */
static PyObject *
take_backing_bytes(OutBuf *buf)
{
    PyObject *result = buf->bytes;
    Py_ssize_t used = outbuf_len(buf);
    Py_ssize_t capacity = PyBytes_GET_SIZE(result);
    /* Keep a little slack (at most an eighth: what the size hint adds)
     * instead of copying to an exact size: the copy would cost as much as a
     * sizeable part of the encoding, and for large blocks glibc would learn
     * the freed block's size as its mmap threshold, so that every payload of
     * the usual size came from a fresh mmap again, all of its pages faulted
     * in anew.  The bytes object simply ends early (its allocation is freed
     * whole). */
    int keep_slack = capacity - used <= capacity / 8;
    if (used != capacity && !keep_slack) {
        /* A smaller copy rather than _PyBytes_Resize, which would free the
         * contents if it failed; without memory for the copy the slack is
         * kept instead. */
        PyObject *exact = PyBytes_FromStringAndSize(buf->start, used);
        if (exact != NULL) {
            Py_SETREF(result, exact);
        }
        else {
            PyErr_Clear();
        }
    }
    if (PyBytes_GET_SIZE(result) != used) {
        Py_SET_SIZE(result, used);
        PyBytes_AS_STRING(result)[used] = '\0';
    }
    return result;
}

PyObject *
outbuf_finish_bytes(OutBuf *buf)
{
    PyObject *result;
    if (buf->bytes != NULL) {
        result = take_backing_bytes(buf);
    }
    else {
        result = PyBytes_FromStringAndSize(buf->start, outbuf_len(buf));
        if (result == NULL) {
            return NULL;
        }
        PyMem_Free(buf->start);
    }
    buf->bytes = NULL;
    buf->start = buf->pos = buf->end = NULL;
    return result;
}

int
outbuf_shrink_capacity(OutBuf *buf, Py_ssize_t keep)
{
    if (buf->bytes != NULL || outbuf_len(buf) != 0 || outbuf_capacity(buf) <= keep) {
        return 0;
    }
    if (keep < 1) {
        keep = 1;
    }
    char *smaller = PyMem_Realloc(buf->start, (size_t)keep);
    if (smaller == NULL) {
        /* Keeping the larger block is harmless. */
        return 0;
    }
    buf->start = buf->pos = smaller;
    buf->end = smaller + keep;
    return 0;
}
