/* Growable output buffer: allocation, growth and hand-over of the result. */
#include "outbuf.h"

/* A block this large may live in its own mmap (glibc's smallest threshold). */
#define OUTBUF_LARGE (128 * 1024)

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
     * never much larger than the payload (growing a large block is a cheap
     * remap, not a copy, so appends stay amortised O(1)). */
    Py_ssize_t new_capacity = capacity < (1 << 20) ? capacity * 2 : capacity + (capacity >> 3);
    if (new_capacity < needed || new_capacity < capacity) {
        new_capacity = needed;
    }
    if (new_capacity < 64) {
        new_capacity = 64;
    }
    if (buf->bytes != NULL) {
        /* On failure _PyBytes_Resize frees the object and sets it to NULL. */
        if (_PyBytes_Resize(&buf->bytes, new_capacity) < 0) {
            buf->start = buf->pos = buf->end = NULL;
            return -1;
        }
        buf->start = PyBytes_AS_STRING(buf->bytes);
    }
    else {
        char *grown = PyMem_Realloc(buf->start, (size_t)new_capacity);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        buf->start = grown;
    }
    buf->pos = buf->start + used;
    buf->end = buf->start + new_capacity;
    return 0;
}

PyObject *
outbuf_finish_bytes(OutBuf *buf)
{
    PyObject *result = buf->bytes;
    Py_ssize_t used = outbuf_len(buf);
    buf->bytes = NULL;
    buf->start = buf->pos = buf->end = NULL;
    if (result == NULL) {
        PyErr_SetString(PyExc_SystemError, "spanpack: output buffer already finished");
        return NULL;
    }
    Py_ssize_t capacity = PyBytes_GET_SIZE(result);
    if (used == capacity) {
        return result;
    }
    if (capacity >= OUTBUF_LARGE && capacity - used <= capacity / 8) {
        /* Keep the little slack of a large block instead of reallocating it
         * smaller: glibc learns a freed block's size as its mmap threshold,
         * so after shrinking every payload of the usual size would come
         * from a fresh mmap again, all of its pages faulted in anew.  The
         * bytes object simply ends early (its allocation is freed whole). */
        Py_SET_SIZE(result, used);
        PyBytes_AS_STRING(result)[used] = '\0';
        return result;
    }
    if (_PyBytes_Resize(&result, used) < 0) {
        return NULL;
    }
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
