/* msgpack wire primitives.
 *
 * mp_put_* store at buf->pos without a bounds check: the caller has reserved
 * at least MP_MAX_HEADER bytes (or the documented size), and has passed any
 * length or count they write through mp_check_length.  mp_write_* check and
 * reserve first and return 0 or -1 with an exception set.  Integers always
 * take the smallest encoding, as msgpack-python and the reference tracer do. */
#ifndef SPANPACK_MPWRITE_H
#define SPANPACK_MPWRITE_H

#include "compat.h" /* Python.h before any system header */

#include <stdint.h>
#include <string.h>

#include "outbuf.h"

/* The msgpack format bytes this code writes, by the spec's names.  A "fix"
 * form carries its small count or length in the byte itself (base | n);
 * the others are followed by a big-endian count, length or value of the
 * size in their name (ext: then the type code). */
enum {
    MP_POSITIVE_FIXINT = 0x00, /* 0..127: the byte is the value */
    MP_FIXMAP = 0x80,          /* map of 0..15 entries: MP_FIXMAP | count */
    MP_FIXARRAY = 0x90,        /* array of 0..15 items: MP_FIXARRAY | count */
    MP_FIXSTR = 0xa0,          /* str of 0..31 bytes: MP_FIXSTR | length */
    MP_NIL = 0xc0,             /* None */
    MP_FALSE = 0xc2,
    MP_TRUE = 0xc3,
    MP_BIN8 = 0xc4, /* bin: 1-, 2- or 4-byte length, then the bytes */
    MP_BIN16 = 0xc5,
    MP_BIN32 = 0xc6,
    MP_EXT8 = 0xc7, /* ext: 1-, 2- or 4-byte length, type code, data */
    MP_EXT16 = 0xc8,
    MP_EXT32 = 0xc9,
    MP_FLOAT32 = 0xca, /* IEEE 754 single, big-endian */
    MP_FLOAT64 = 0xcb, /* IEEE 754 double, big-endian */
    MP_UINT8 = 0xcc,   /* unsigned ints of 1, 2, 4, 8 bytes */
    MP_UINT16 = 0xcd,
    MP_UINT32 = 0xce,
    MP_UINT64 = 0xcf,
    MP_INT8 = 0xd0, /* two's-complement ints of 1, 2, 4, 8 bytes */
    MP_INT16 = 0xd1,
    MP_INT32 = 0xd2,
    MP_INT64 = 0xd3,
    MP_FIXEXT1 = 0xd4, /* ext of 1, 2, 4, 8, 16 data bytes: type code, data */
    MP_FIXEXT2 = 0xd5,
    MP_FIXEXT4 = 0xd6,
    MP_FIXEXT8 = 0xd7,
    MP_FIXEXT16 = 0xd8,
    MP_STR8 = 0xd9, /* str: 1-, 2- or 4-byte length, then UTF-8 */
    MP_STR16 = 0xda,
    MP_STR32 = 0xdb,
    MP_ARRAY16 = 0xdc, /* array: 2- or 4-byte count, then the items */
    MP_ARRAY32 = 0xdd,
    MP_MAP16 = 0xde, /* map: 2- or 4-byte count, then keys and values */
    MP_MAP32 = 0xdf,
    MP_NEGATIVE_FIXINT = 0xe0, /* -32..-1: the byte is the value */
};
/* The fix forms hold counts and lengths below these. */
#define MP_FIXMAP_LIMIT 16
#define MP_FIXARRAY_LIMIT 16
#define MP_FIXSTR_LIMIT 32

/* The fixstr header byte for a text of n bytes (MP_FIXSTR | n) as a string
 * literal, to join in front of a compile-time key: a whole literal is copied
 * with immediate moves, a byte computed apart costs a store of its own.  As a
 * separate literal it also cannot swallow the text's first characters into
 * its escape ("\xa5" "error", not "\xa5error"). */
#define MP_FIXSTR_HEADER(n) MP_FIXSTR_HEADER_(n)
#define MP_FIXSTR_HEADER_(n) MP_FIXSTR_HEADER_##n
/* clang-format off */
#define MP_FIXSTR_HEADER_0 "\xa0"
#define MP_FIXSTR_HEADER_1 "\xa1"
#define MP_FIXSTR_HEADER_2 "\xa2"
#define MP_FIXSTR_HEADER_3 "\xa3"
#define MP_FIXSTR_HEADER_4 "\xa4"
#define MP_FIXSTR_HEADER_5 "\xa5"
#define MP_FIXSTR_HEADER_6 "\xa6"
#define MP_FIXSTR_HEADER_7 "\xa7"
#define MP_FIXSTR_HEADER_8 "\xa8"
#define MP_FIXSTR_HEADER_9 "\xa9"
#define MP_FIXSTR_HEADER_10 "\xaa"
#define MP_FIXSTR_HEADER_11 "\xab"
#define MP_FIXSTR_HEADER_12 "\xac"
#define MP_FIXSTR_HEADER_13 "\xad"
#define MP_FIXSTR_HEADER_14 "\xae"
#define MP_FIXSTR_HEADER_15 "\xaf"
#define MP_FIXSTR_HEADER_16 "\xb0"
#define MP_FIXSTR_HEADER_17 "\xb1"
#define MP_FIXSTR_HEADER_18 "\xb2"
#define MP_FIXSTR_HEADER_19 "\xb3"
#define MP_FIXSTR_HEADER_20 "\xb4"
#define MP_FIXSTR_HEADER_21 "\xb5"
#define MP_FIXSTR_HEADER_22 "\xb6"
#define MP_FIXSTR_HEADER_23 "\xb7"
#define MP_FIXSTR_HEADER_24 "\xb8"
#define MP_FIXSTR_HEADER_25 "\xb9"
#define MP_FIXSTR_HEADER_26 "\xba"
#define MP_FIXSTR_HEADER_27 "\xbb"
#define MP_FIXSTR_HEADER_28 "\xbc"
#define MP_FIXSTR_HEADER_29 "\xbd"
#define MP_FIXSTR_HEADER_30 "\xbe"
#define MP_FIXSTR_HEADER_31 "\xbf"
/* clang-format on */

/* The largest header or scalar (uint64 / int64 / float64): 1 + 8 bytes. */
#define MP_MAX_HEADER 9
/* Item counts and lengths above this do not fit in a 32-bit header. */
#define MP_ITEM_LIMIT 0xFFFFFFFFLL
#define MP_TIMESTAMP_EXT_CODE (-1)

/* The one check of every str/bin/ext length and array/map count before it
 * is written into a header: 0 when it fits in 32 bits, else ValueError naming
 * `what`.  Casting to uint32_t without it would write the length modulo 2**32,
 * a corrupt document. */
static inline int
mp_check_length(long long n, const char *what)
{
    if (SP_LIKELY(n >= 0 && n <= MP_ITEM_LIMIT)) {
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s is too large (%lld; msgpack allows at most 2**32-1)", what,
                 n);
    return -1;
}

static inline void
mp_store16(char *p, uint16_t v)
{
    p[0] = (char)(v >> 8);
    p[1] = (char)v;
}

static inline void
mp_store32(char *p, uint32_t v)
{
    p[0] = (char)(v >> 24);
    p[1] = (char)(v >> 16);
    p[2] = (char)(v >> 8);
    p[3] = (char)v;
}

static inline void
mp_store64(char *p, uint64_t v)
{
    mp_store32(p, (uint32_t)(v >> 32));
    mp_store32(p + 4, (uint32_t)v);
}

static inline void
mp_put_byte(OutBuf *buf, unsigned char b)
{
    *buf->pos++ = (char)b;
}

static inline void
mp_put_uint(OutBuf *buf, uint64_t v)
{
    char *p = buf->pos;
    if (v < 128) {
        p[0] = (char)v;
        buf->pos = p + 1;
    }
    else if (v < 256) {
        p[0] = (char)MP_UINT8;
        p[1] = (char)v;
        buf->pos = p + 2;
    }
    else if (v < 65536) {
        p[0] = (char)MP_UINT16;
        mp_store16(p + 1, (uint16_t)v);
        buf->pos = p + 3;
    }
    else if (v <= 0xFFFFFFFFULL) {
        p[0] = (char)MP_UINT32;
        mp_store32(p + 1, (uint32_t)v);
        buf->pos = p + 5;
    }
    else {
        p[0] = (char)MP_UINT64;
        mp_store64(p + 1, v);
        buf->pos = p + 9;
    }
}

static inline void
mp_put_int(OutBuf *buf, int64_t v)
{
    if (v >= 0) {
        mp_put_uint(buf, (uint64_t)v);
        return;
    }
    char *p = buf->pos;
    if (v >= -32) {
        p[0] = (char)(uint8_t)(int8_t)v;
        buf->pos = p + 1;
    }
    else if (v >= INT8_MIN) {
        p[0] = (char)MP_INT8;
        p[1] = (char)(uint8_t)(int8_t)v;
        buf->pos = p + 2;
    }
    else if (v >= INT16_MIN) {
        p[0] = (char)MP_INT16;
        mp_store16(p + 1, (uint16_t)(int16_t)v);
        buf->pos = p + 3;
    }
    else if (v >= INT32_MIN) {
        p[0] = (char)MP_INT32;
        mp_store32(p + 1, (uint32_t)(int32_t)v);
        buf->pos = p + 5;
    }
    else {
        p[0] = (char)MP_INT64;
        mp_store64(p + 1, (uint64_t)v);
        buf->pos = p + 9;
    }
}

static inline void
mp_put_double(OutBuf *buf, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    buf->pos[0] = (char)MP_FLOAT64;
    mp_store64(buf->pos + 1, bits);
    buf->pos += 9;
}

static inline void
mp_put_float(OutBuf *buf, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    buf->pos[0] = (char)MP_FLOAT32;
    mp_store32(buf->pos + 1, bits);
    buf->pos += 5;
}

/* A header whose form depends only on the count: fix / 16-bit / 32-bit. */
static inline void
mp_put_sized_header(OutBuf *buf, uint32_t n, unsigned char fix_tag, uint32_t fix_limit,
                    unsigned char tag16, unsigned char tag32)
{
    char *p = buf->pos;
    if (n < fix_limit) {
        p[0] = (char)(fix_tag | n);
        buf->pos = p + 1;
    }
    else if (n < 65536) {
        p[0] = (char)tag16;
        mp_store16(p + 1, (uint16_t)n);
        buf->pos = p + 3;
    }
    else {
        p[0] = (char)tag32;
        mp_store32(p + 1, n);
        buf->pos = p + 5;
    }
}

static inline void
mp_put_array_header(OutBuf *buf, uint32_t n)
{
    mp_put_sized_header(buf, n, MP_FIXARRAY, MP_FIXARRAY_LIMIT, MP_ARRAY16, MP_ARRAY32);
}

static inline void
mp_put_map_header(OutBuf *buf, uint32_t n)
{
    mp_put_sized_header(buf, n, MP_FIXMAP, MP_FIXMAP_LIMIT, MP_MAP16, MP_MAP32);
}

/* str header; str8 only exists in the spec revision that added bin, so
 * msgpack-python leaves it out when use_bin_type is off. */
static inline void
mp_put_str_header(OutBuf *buf, uint32_t n, int allow_str8)
{
    char *p = buf->pos;
    if (n < MP_FIXSTR_LIMIT) {
        p[0] = (char)(MP_FIXSTR | n);
        buf->pos = p + 1;
    }
    else if (n < 256 && allow_str8) {
        p[0] = (char)MP_STR8;
        p[1] = (char)n;
        buf->pos = p + 2;
    }
    else if (n < 65536) {
        p[0] = (char)MP_STR16;
        mp_store16(p + 1, (uint16_t)n);
        buf->pos = p + 3;
    }
    else {
        p[0] = (char)MP_STR32;
        mp_store32(p + 1, n);
        buf->pos = p + 5;
    }
}

static inline void
mp_put_bin_header(OutBuf *buf, uint32_t n)
{
    char *p = buf->pos;
    if (n < 256) {
        p[0] = (char)MP_BIN8;
        p[1] = (char)n;
        buf->pos = p + 2;
    }
    else if (n < 65536) {
        p[0] = (char)MP_BIN16;
        mp_store16(p + 1, (uint16_t)n);
        buf->pos = p + 3;
    }
    else {
        p[0] = (char)MP_BIN32;
        mp_store32(p + 1, n);
        buf->pos = p + 5;
    }
}

/* ext header: fixext for 1/2/4/8/16 bytes, else ext8/16/32.  Needs 6 bytes. */
static inline void
mp_put_ext_header(OutBuf *buf, int8_t code, uint32_t n)
{
    char *p = buf->pos;
    switch (n) {
    case 1:
        p[0] = (char)MP_FIXEXT1;
        break;
    case 2:
        p[0] = (char)MP_FIXEXT2;
        break;
    case 4:
        p[0] = (char)MP_FIXEXT4;
        break;
    case 8:
        p[0] = (char)MP_FIXEXT8;
        break;
    case 16:
        p[0] = (char)MP_FIXEXT16;
        break;
    default:
        if (n < 256) {
            p[0] = (char)MP_EXT8;
            p[1] = (char)n;
            p += 2;
        }
        else if (n < 65536) {
            p[0] = (char)MP_EXT16;
            mp_store16(p + 1, (uint16_t)n);
            p += 3;
        }
        else {
            p[0] = (char)MP_EXT32;
            mp_store32(p + 1, n);
            p += 5;
        }
        p[0] = (char)code;
        buf->pos = p + 1;
        return;
    }
    p[1] = (char)code;
    buf->pos = p + 2;
}

/* The timestamp extension (type -1) in its smallest form: 32-bit when there
 * are no nanoseconds and the seconds fit in 32 unsigned bits, 64-bit when the
 * seconds fit in 34 unsigned bits, else 96-bit.  Needs 15 bytes. */
static inline void
mp_put_timestamp(OutBuf *buf, int64_t seconds, uint32_t nanoseconds)
{
    if ((seconds >> 34) == 0) {
        uint64_t data64 = ((uint64_t)nanoseconds << 34) | (uint64_t)seconds;
        if ((data64 & 0xFFFFFFFF00000000ULL) == 0) {
            mp_put_ext_header(buf, MP_TIMESTAMP_EXT_CODE, 4);
            mp_store32(buf->pos, (uint32_t)data64);
            buf->pos += 4;
        }
        else {
            mp_put_ext_header(buf, MP_TIMESTAMP_EXT_CODE, 8);
            mp_store64(buf->pos, data64);
            buf->pos += 8;
        }
    }
    else {
        mp_put_ext_header(buf, MP_TIMESTAMP_EXT_CODE, 12);
        mp_store32(buf->pos, nanoseconds);
        mp_store64(buf->pos + 4, (uint64_t)seconds);
        buf->pos += 12;
    }
}

/* Checked writers. */

static inline int
mp_write_uint(OutBuf *buf, uint64_t v)
{
    if (outbuf_reserve(buf, MP_MAX_HEADER) < 0) {
        return -1;
    }
    mp_put_uint(buf, v);
    return 0;
}

static inline int
mp_write_int(OutBuf *buf, int64_t v)
{
    if (outbuf_reserve(buf, MP_MAX_HEADER) < 0) {
        return -1;
    }
    mp_put_int(buf, v);
    return 0;
}

static inline int
mp_write_double(OutBuf *buf, double v)
{
    if (outbuf_reserve(buf, MP_MAX_HEADER) < 0) {
        return -1;
    }
    mp_put_double(buf, v);
    return 0;
}

static inline int
mp_write_byte(OutBuf *buf, unsigned char b)
{
    if (outbuf_reserve(buf, 1) < 0) {
        return -1;
    }
    mp_put_byte(buf, b);
    return 0;
}

static inline int
mp_write_array_header(OutBuf *buf, long long n)
{
    if (mp_check_length(n, "array") < 0 || outbuf_reserve(buf, MP_MAX_HEADER) < 0) {
        return -1;
    }
    mp_put_array_header(buf, (uint32_t)n);
    return 0;
}

static inline int
mp_write_map_header(OutBuf *buf, long long n)
{
    if (mp_check_length(n, "map") < 0 || outbuf_reserve(buf, MP_MAX_HEADER) < 0) {
        return -1;
    }
    mp_put_map_header(buf, (uint32_t)n);
    return 0;
}

/* A whole str: header and UTF-8 body in one reservation. */
static inline int
mp_write_str(OutBuf *buf, const char *data, Py_ssize_t size, int allow_str8)
{
    if (mp_check_length(size, "str") < 0 || outbuf_reserve(buf, size + 5) < 0) {
        return -1;
    }
    mp_put_str_header(buf, (uint32_t)size, allow_str8);
    copy_bytes(buf->pos, data, size);
    buf->pos += size;
    return 0;
}

static inline int
mp_write_bin(OutBuf *buf, const char *data, Py_ssize_t size)
{
    if (mp_check_length(size, "bin") < 0 || outbuf_reserve(buf, size + 5) < 0) {
        return -1;
    }
    mp_put_bin_header(buf, (uint32_t)size);
    memcpy(buf->pos, data, (size_t)size);
    buf->pos += size;
    return 0;
}

static inline int
mp_write_ext(OutBuf *buf, int8_t code, const char *data, Py_ssize_t size)
{
    if (mp_check_length(size, "ext data") < 0 || outbuf_reserve(buf, size + 6) < 0) {
        return -1;
    }
    mp_put_ext_header(buf, code, (uint32_t)size);
    memcpy(buf->pos, data, (size_t)size);
    buf->pos += size;
    return 0;
}

#endif /* SPANPACK_MPWRITE_H */
