/* Small shims so one source builds on CPython 3.9 through 3.15.  Every file
 * includes this (Python.h) before any system header. */
#ifndef SPANPACK_COMPAT_H
#define SPANPACK_COMPAT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *
Py_NewRef(PyObject *o)
{
    Py_INCREF(o);
    return o;
}
static inline PyObject *
Py_XNewRef(PyObject *o)
{
    Py_XINCREF(o);
    return o;
}
static inline int
PyModule_AddObjectRef(PyObject *module, const char *name, PyObject *value)
{
    Py_INCREF(value);
    if (PyModule_AddObject(module, name, value) < 0) {
        Py_DECREF(value);
        return -1;
    }
    return 0;
}
#endif

/* Critical sections only exist (and only matter) from 3.13; under the GIL the
 * GIL itself serialises our C code, which never releases it mid-write. */
#if PY_VERSION_HEX >= 0x030D0000
#define SP_BEGIN_CRITICAL_SECTION(o) Py_BEGIN_CRITICAL_SECTION(o)
#define SP_END_CRITICAL_SECTION() Py_END_CRITICAL_SECTION()
#else
#define SP_BEGIN_CRITICAL_SECTION(o) {
#define SP_END_CRITICAL_SECTION() }
#endif

#if defined(__GNUC__)
#define SP_LIKELY(x) __builtin_expect(!!(x), 1)
#define SP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define SP_NOINLINE __attribute__((noinline))
#define SP_ALWAYS_INLINE inline __attribute__((always_inline))
#define SP_PREFETCH(address) __builtin_prefetch(address)
#else
#define SP_PREFETCH(address) ((void)(address))
#define SP_LIKELY(x) (x)
#define SP_UNLIKELY(x) (x)
#define SP_NOINLINE
#define SP_ALWAYS_INLINE inline
#endif

/* Prefetch the byte `offset` bytes from `address`, the address computed as
 * an integer: it may lie outside the object (its pre-header, a line past a
 * short array), where pointer arithmetic would be undefined. */
static inline void
sp_prefetch_at(const void *address, Py_ssize_t offset)
{
    SP_PREFETCH((const void *)((uintptr_t)address + (uintptr_t)offset));
}

/* A str made by a legacy API (CPython 3.11 and older) has no length or
 * text in place until something makes it ready. */
#if PY_VERSION_HEX < 0x030C0000
#define SP_UNICODE_IS_READY(op) PyUnicode_IS_READY(op)
#define SP_UNICODE_READY(op) PyUnicode_READY(op)
#else
#define SP_UNICODE_IS_READY(op) 1
#define SP_UNICODE_READY(op) 0
#endif

/* Do two str, both ready, hold the same text?  Compared in place, as ==
 * compares them: no code runs, and no ordering work (PyUnicode_Compare's). */
static inline int
sp_same_str_text(PyObject *a, PyObject *b)
{
    Py_ssize_t length = PyUnicode_GET_LENGTH(a);
    int kind = PyUnicode_KIND(a);
    return a == b ||
           (PyUnicode_GET_LENGTH(b) == length && PyUnicode_KIND(b) == kind &&
            memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)length * (size_t)kind) == 0);
}

/* Mixed bits of an object's address (Fibonacci hashing; objects are 16-byte
 * aligned, so the low bits carry nothing): take the high bits wanted. */
static inline uint64_t
sp_hash_address(const void *address)
{
    return (uint64_t)((uintptr_t)address >> 4) * 0x9E3779B97F4A7C15ULL;
}

/* A class's version tag while it is valid, else 0.  Up to CPython 3.12,
 * modifying a class clears Py_TPFLAGS_VALID_VERSION_TAG, and 3.9 leaves the
 * old tp_version_tag in place until the class's next attribute lookup gives
 * it a new one (a layout cached for the class before the change was taken
 * as current there); from 3.13 the flag is not kept, and modifying a class
 * resets its tag. */
static inline unsigned int
sp_type_version_tag(const PyTypeObject *type)
{
#if PY_VERSION_HEX < 0x030D0000
    if (!(type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
        return 0;
    }
#endif
    return type->tp_version_tag;
}

#endif /* SPANPACK_COMPAT_H */
