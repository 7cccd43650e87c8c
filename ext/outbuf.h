/* A growable output buffer for msgpack bytes.
 *
 * Two kinds of backing memory:
 *  - a bytes object (outbuf_init_bytes): a result that fits is handed out by
 *    ending that object early, so a one-shot encode of a known size never
 *    copies its output;
 *  - plain heap memory (outbuf_init_raw): for long-lived writers (Packer,
 *    buffered trace encoder) and for any buffer that has grown.
 *
 * A failed growth or hand-over never loses what the buffer holds: a bytes
 * object cannot be resized without being freed on failure
 * (_PyBytes_Resize), so a bytes-backed buffer that must grow moves to heap
 * memory, which PyMem_Realloc grows in place or keeps on failure.
 *
 * Writers reserve space first (outbuf_reserve) and then store through `pos`
 * without further checks. */
#ifndef SPANPACK_OUTBUF_H
#define SPANPACK_OUTBUF_H

#include "compat.h" /* Python.h before any system header */

#include <stdint.h>
#include <string.h>

#include "compat.h"

typedef struct {
    char *start;
    char *pos;
    char *end;
    PyObject *bytes; /* the backing bytes object, or NULL for heap memory */
} OutBuf;

int outbuf_init_bytes(OutBuf *buf, Py_ssize_t capacity);
int outbuf_init_raw(OutBuf *buf, Py_ssize_t capacity);
/* Also safe on a zeroed buffer. */
void outbuf_free(OutBuf *buf);

/* Slow path of outbuf_reserve: make room for `extra` more bytes.  On failure
 * the buffer is unchanged. */
int outbuf_grow(OutBuf *buf, Py_ssize_t extra);

/* The written bytes as a bytes object (a new reference): the backing bytes
 * object itself when there is one, else a copy.  On success the buffer is
 * left empty and unusable; on failure (only possible for heap memory) it is
 * unchanged. */
PyObject *outbuf_finish_bytes(OutBuf *buf);

/* Give back memory beyond `keep` bytes of capacity (heap buffers only); the
 * buffer must be empty. */
int outbuf_shrink_capacity(OutBuf *buf, Py_ssize_t keep);

static inline Py_ssize_t
outbuf_len(const OutBuf *buf)
{
    return buf->pos - buf->start;
}

static inline Py_ssize_t
outbuf_capacity(const OutBuf *buf)
{
    return buf->end - buf->start;
}

static inline int
outbuf_reserve(OutBuf *buf, Py_ssize_t extra)
{
    if (SP_LIKELY(buf->end - buf->pos >= extra)) {
        return 0;
    }
    return outbuf_grow(buf, extra);
}

/* 32 bytes, as four 8-byte moves (the compiler pairs them into vector moves). */
static inline void
copy_32_bytes(char *dst, const char *src)
{
    uint64_t a, b, c, d;
    memcpy(&a, src, 8);
    memcpy(&b, src + 8, 8);
    memcpy(&c, src + 16, 8);
    memcpy(&d, src + 24, 8);
    memcpy(dst, &a, 8);
    memcpy(dst + 8, &b, 8);
    memcpy(dst + 16, &c, 8);
    memcpy(dst + 24, &d, 8);
}

/* Copy 32 to COPY_BLOCKS_MAX bytes in 32-byte blocks, the last one
 * overlapping the one before.  A memcpy whose size the compiler can bound
 * (a str of at most 255 bytes, a fixed-size cache entry) is expanded by gcc
 * 12 at -O3 into `rep movs`, whose start-up costs tens of cycles: measured
 * with perf as 59% of v04_write_str_uncached's samples and a third of
 * v04_write_span's on CPython 3.11 built with gcc 12 (docs/speed-3.11.md).
 * Reads and writes stay within [src, src + size) and [dst, dst + size). */
#define COPY_BLOCKS_MAX 256
static inline void
copy_blocks(char *dst, const char *src, Py_ssize_t size)
{
    for (Py_ssize_t done = 0; done < size - 32; done += 32) {
        copy_32_bytes(dst + done, src + done);
    }
    copy_32_bytes(dst + size - 32, src + size - 32);
}

/* memcpy for the short strings that dominate span payloads: two possibly
 * overlapping fixed-size moves the compiler inlines, instead of a libc call
 * (or an inlined `rep movs`: copy_blocks).  Reads and writes stay within
 * [src, src + size) and [dst, dst + size). */
static inline void
copy_bytes(char *dst, const char *src, Py_ssize_t size)
{
    if (size >= 8 && size <= 16) {
        uint64_t head, tail;
        memcpy(&head, src, 8);
        // cppcheck-suppress pointerOutOfBoundsCond ; size >= 8 here
        memcpy(&tail, src + size - 8, 8);
        memcpy(dst, &head, 8);
        memcpy(dst + size - 8, &tail, 8);
    }
    else if (size >= 4 && size < 8) {
        uint32_t head, tail;
        memcpy(&head, src, 4);
        // cppcheck-suppress pointerOutOfBoundsCond ; size >= 4 here
        memcpy(&tail, src + size - 4, 4);
        memcpy(dst, &head, 4);
        memcpy(dst + size - 4, &tail, 4);
    }
    else if (size > 16 && size <= 32) {
        uint64_t a, b, c, d;
        memcpy(&a, src, 8);
        memcpy(&b, src + 8, 8);
        memcpy(&c, src + size - 16, 8);
        memcpy(&d, src + size - 8, 8);
        memcpy(dst, &a, 8);
        memcpy(dst + 8, &b, 8);
        memcpy(dst + size - 16, &c, 8);
        memcpy(dst + size - 8, &d, 8);
    }
    else if (size < 4) {
        for (Py_ssize_t i = 0; i < size; i++) {
            dst[i] = src[i];
        }
    }
    else if (size <= COPY_BLOCKS_MAX) {
        copy_blocks(dst, src, size);
    }
    else {
        memcpy(dst, src, (size_t)size);
    }
}

static inline int
outbuf_write(OutBuf *buf, const void *data, Py_ssize_t size)
{
    if (outbuf_reserve(buf, size) < 0) {
        return -1;
    }
    copy_bytes(buf->pos, data, size);
    buf->pos += size;
    return 0;
}

/* Roll back to an earlier length (used to undo a failed, partial write). */
static inline void
outbuf_truncate(OutBuf *buf, Py_ssize_t length)
{
    buf->pos = buf->start + length;
}

#endif /* SPANPACK_OUTBUF_H */
