/* Reading Python ints as 64-bit values quickly.
 *
 * Span ids are random 64-bit numbers, half of them above 2**63, where the C
 * API's unsigned conversion goes through a slow generic byte-array routine.
 * For exact ints we read the digits directly (the layout differs from 3.12
 * on); subclasses go through the C API. */
#ifndef SPANPACK_PYINT_H
#define SPANPACK_PYINT_H

#include "layout_probes.h"

#include <stdint.h>

/* Where the digit layout is known (3.9 through 3.15, lv_tag from 3.12), the
 * digits of an exact int are read directly once module exec has proven it
 * (layout_probes.c); other versions, like int subclasses, go through the C
 * API. */
#if PY_VERSION_HEX < 0x030B0000 || defined(SP_KNOWN_CPYTHON_LAYOUTS)
#define SP_INT_DIGITS_IN_PLACE 1
#endif

/* 1 and the little-endian digits, their count and the sign of `value` when
 * they can be read in place (`fast` proven), else 0. */
static inline int
pyint_digits(const SpFastPaths *fast, PyObject *value, const digit **digits, Py_ssize_t *count,
             int *negative)
{
#ifdef SP_INT_DIGITS_IN_PLACE
    if (Py_TYPE(value) != fast->exact_int) {
        return 0; /* a subclass, or the reader is off */
    }
    const PyLongObject *number = (const PyLongObject *)value;
#if PY_VERSION_HEX >= 0x030C0000
    uintptr_t tag = number->long_value.lv_tag;
    *count = (Py_ssize_t)(tag >> 3); /* _PyLong_NON_SIZE_BITS */
    *negative = (tag & 3) == 2;      /* _PyLong_SIGN_MASK: 2 is negative */
    *digits = number->long_value.ob_digit;
#else
    Py_ssize_t size = Py_SIZE(value);
    *negative = size < 0;
    *count = size < 0 ? -size : size;
    *digits = number->ob_digit;
#endif
    return 1;
#else
    (void)fast;
    (void)value;
    (void)digits;
    (void)count;
    (void)negative;
    return 0;
#endif
}

/* -1, 0 or 1 as `value` (an int) is negative, zero or positive. */
static inline int
pyint_sign(PyObject *value)
{
#if PY_VERSION_HEX >= 0x030E0000
    int sign = 0;
    (void)PyLong_GetSign(value, &sign); /* fails only for a non-int */
    return sign;
#else
    return _PyLong_Sign(value);
#endif
}

/* The sign and magnitude of `value` (an int) through the C API, for ints
 * whose digits are not read in place.  Returns 0, or 1 when the magnitude
 * needs more than 64 bits.  Never sets an exception. */
static inline int
pyint_magnitude64_api(PyObject *value, uint64_t *magnitude, int *negative)
{
    /* Sized first, so that no conversion can fail: an exception object is
     * Python code's chance to run (a collection's finalizers), which callers
     * holding borrowed values must not give it. */
    size_t bits = _PyLong_NumBits(value);
    if (bits == (size_t)-1 || bits > 64) {
        PyErr_Clear(); /* (size_t)-1: more bits than a size_t counts */
        return 1;
    }
    /* The low 64 bits of the two's complement, as an int's (a subclass's
     * methods are not called). */
    uint64_t low = (uint64_t)PyLong_AsUnsignedLongLongMask(value);
    *negative = pyint_sign(value) < 0;
    *magnitude = *negative ? (uint64_t)0 - low : low;
    return 0;
}

/* The sign and magnitude of `value` (an int).  Returns 0, or 1 when the
 * magnitude needs more than 64 bits.  Never sets an exception. */
static inline int
pyint_magnitude64(const SpFastPaths *fast, PyObject *value, uint64_t *magnitude, int *negative)
{
    const digit *digits;
    Py_ssize_t digit_count;
    if (!pyint_digits(fast, value, &digits, &digit_count, negative)) {
        return pyint_magnitude64_api(value, magnitude, negative);
    }
    /* Ints are normalised (no leading zero digit): 64 bits take at most
     * ceil(64 / PyLong_SHIFT) digits, the top one partly. */
#if PyLong_SHIFT == 30
    switch (digit_count) {
    case 0:
        *magnitude = 0;
        return 0;
    case 1:
        *magnitude = digits[0];
        return 0;
    case 2:
        *magnitude = (uint64_t)digits[0] | ((uint64_t)digits[1] << 30);
        return 0;
    case 3:
        if (digits[2] >> 4) {
            return 1;
        }
        *magnitude =
            (uint64_t)digits[0] | ((uint64_t)digits[1] << 30) | ((uint64_t)digits[2] << 60);
        return 0;
    default:
        return 1;
    }
#else
    uint64_t result = 0;
    for (Py_ssize_t i = digit_count - 1; i >= 0; i--) {
        if (result >> (64 - PyLong_SHIFT)) {
            return 1;
        }
        result = (result << PyLong_SHIFT) | digits[i];
    }
    *magnitude = result;
    return 0;
#endif
}

/* `value` (an int) as an unsigned 128-bit int in two halves.  Returns 0; 1
 * when negative or beyond 128 bits; -1 when its digits cannot be read in
 * place (use the C API).  Never sets an exception. */
static inline int
pyint_as_u128(const SpFastPaths *fast, PyObject *value, uint64_t *high, uint64_t *low)
{
    const digit *digits;
    Py_ssize_t digit_count;
    int negative;
    if (!pyint_digits(fast, value, &digits, &digit_count, &negative)) {
        return -1;
    }
    if (negative) {
        return 1;
    }
    uint64_t hi = 0, lo = 0;
    for (Py_ssize_t i = digit_count - 1; i >= 0; i--) {
        if (hi >> (64 - PyLong_SHIFT)) {
            return 1;
        }
        hi = (hi << PyLong_SHIFT) | (lo >> (64 - PyLong_SHIFT));
        lo = (lo << PyLong_SHIFT) | digits[i];
    }
    *high = hi;
    *low = lo;
    return 0;
}

/* `value` (an int) as an unsigned 128-bit int in two halves: in place
 * where pyint_as_u128 can, else through the C API (the high half by a
 * shift, as ids this wide are rare there).  Returns 0; 1 when negative or
 * beyond 128 bits; -1 with an error (the shift's). */
static inline int
pyint_u128(const SpFastPaths *fast, PyObject *value, uint64_t *high, uint64_t *low)
{
    int wide = pyint_as_u128(fast, value, high, low);
    if (wide >= 0) {
        return wide;
    }
    if (pyint_sign(value) < 0) {
        return 1;
    }
    int negative;
    if (pyint_magnitude64_api(value, low, &negative) == 0) {
        *high = 0;
        return 0;
    }
    PyObject *shift = PyLong_FromLong(64);
    PyObject *upper = shift != NULL ? PyNumber_Rshift(value, shift) : NULL;
    Py_XDECREF(shift);
    if (upper == NULL) {
        return -1;
    }
    wide = !PyLong_Check(upper) || pyint_magnitude64_api(upper, high, &negative) != 0 || negative;
    Py_DECREF(upper);
    if (wide) {
        return 1;
    }
    *low = (uint64_t)PyLong_AsUnsignedLongLongMask(value);
    return *low == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/* `value` as 16 lowercase hex digits (as "{:016x}" writes it) at `p`. */
static inline void
hex64_put(char *p, uint64_t value)
{
    for (int i = 15; i >= 0; i--, value >>= 4) {
        p[i] = "0123456789abcdef"[value & 0xf];
    }
}

/* `value` in decimal digits (as str() writes it), ending just before `end`,
 * written last digit first: returns where they start (at most 20 bytes
 * before `end`).  A fraction of snprintf's cost. */
static inline char *
decimal64_put(char *end, uint64_t value)
{
    char *p = end;
    do {
        *--p = (char)('0' + value % 10);
        value /= 10;
    } while (value != 0);
    return p;
}

/* An int's sign and 64-bit magnitude as str() writes it, ending just before
 * `end` (at most 21 bytes before it): returns where the text starts. */
static inline char *
signed_decimal64_put(char *end, uint64_t magnitude, int negative)
{
    char *p = decimal64_put(end, magnitude);
    if (negative) {
        *--p = '-';
    }
    return p;
}

/* `value` as an unsigned 64-bit int: 0, or 1 when negative or too large. */
static inline int
pyint_as_u64(const SpFastPaths *fast, PyObject *value, uint64_t *out)
{
    int negative;
    return pyint_magnitude64(fast, value, out, &negative) != 0 || (negative && *out != 0);
}

/* A sign and 64-bit magnitude as a signed 64-bit int: 0, or 1 when out of
 * range. */
static inline int
pyint_signed64(uint64_t magnitude, int negative, int64_t *out)
{
    if (negative) {
        if (magnitude > (uint64_t)INT64_MAX + 1) {
            return 1;
        }
        *out = magnitude == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)magnitude;
        return 0;
    }
    if (magnitude > (uint64_t)INT64_MAX) {
        return 1;
    }
    *out = (int64_t)magnitude;
    return 0;
}

/* `value` as a signed 64-bit int: 0, or 1 when out of range. */
static inline int
pyint_as_i64(const SpFastPaths *fast, PyObject *value, int64_t *out)
{
    uint64_t magnitude;
    int negative;
    return pyint_magnitude64(fast, value, &magnitude, &negative) != 0 ||
           pyint_signed64(magnitude, negative, out) != 0;
}

#endif /* SPANPACK_PYINT_H */
