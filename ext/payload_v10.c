/* v1.0 payloads: the preamble in front of the chunks, and joining encoded
 * traces into a payload's string stream. */
#include "v10.h"

#include "mpwrite.h"

/* Local tables up to this many strings map them to payload ids on the stack. */
#define V10_STACK_IDS 256

/* No payload id yet: the string's first use in this payload writes it. */
#define V10_UNSEEN UINT32_MAX

int
v10_check_preamble(PyObject *preamble)
{
    if (!PyTuple_CheckExact(preamble) || PyTuple_GET_SIZE(preamble) != 3 ||
        !PyBytes_CheckExact(PyTuple_GET_ITEM(preamble, 0)) ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(preamble, 1)) ||
        !PyTuple_CheckExact(PyTuple_GET_ITEM(preamble, 2))) {
        PyErr_SetString(PyExc_TypeError,
                        "the v1.0 preamble must be a tuple (bytes, int, tuple of str)");
        return -1;
    }
    long fields = PyLong_AsLong(PyTuple_GET_ITEM(preamble, 1));
    if (fields == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (fields < 0 || fields > 9) {
        PyErr_SetString(PyExc_ValueError, "the v1.0 preamble holds 0 to 9 payload fields");
        return -1;
    }
    PyObject *strings = PyTuple_GET_ITEM(preamble, 2);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(strings); i++) {
        PyObject *str = PyTuple_GET_ITEM(strings, i);
        if (!PyUnicode_CheckExact(str) || PyUnicode_GET_LENGTH(str) == 0) {
            PyErr_SetString(PyExc_TypeError, "the v1.0 preamble strings must be non-empty str");
            return -1;
        }
    }
    return 0;
}

int
v10_payload_start(PayloadBuilder *payload, PyObject *preamble)
{
    if (preamble == NULL) {
        return 0;
    }
    PyObject *strings = PyTuple_GET_ITEM(preamble, 2);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(strings); i++) {
        uint32_t index;
        if (strtable_index(&payload->table, PyTuple_GET_ITEM(strings, i), NULL, NULL, &index) < 0) {
            return -1;
        }
        if (index != (uint32_t)i + 1) {
            PyErr_SetString(PyExc_ValueError, "the v1.0 preamble strings must be distinct");
            return -1;
        }
    }
    Py_XSETREF(payload->preamble, Py_NewRef(preamble));
    return 0;
}

Py_ssize_t
v10_prefix_size(PyObject *preamble, Py_ssize_t trace_count)
{
    Py_ssize_t size = preamble != NULL ? PyBytes_GET_SIZE(PyTuple_GET_ITEM(preamble, 0)) : 0;
    /* fixmap header, preamble, chunks key, chunks array header. */
    return 1 + size + 1 + array_header_size(trace_count);
}

void
v10_put_prefix(const PayloadBuilder *payload, OutBuf *head)
{
    long fields = 0;
    if (payload->preamble != NULL) {
        PyObject *encoded = PyTuple_GET_ITEM(payload->preamble, 0);
        /* Checked to be in [0, 9] by v10_check_preamble. */
        fields = PyLong_AsLong(PyTuple_GET_ITEM(payload->preamble, 1));
        mp_put_byte(head, (unsigned char)(0x80 | (fields + 1)));
        memcpy(head->pos, PyBytes_AS_STRING(encoded), (size_t)PyBytes_GET_SIZE(encoded));
        head->pos += PyBytes_GET_SIZE(encoded);
    }
    else {
        mp_put_byte(head, 0x81);
    }
    mp_put_byte(head, V10_PAYLOAD_CHUNKS);
    mp_put_array_header(head, (uint32_t)payload->trace_count);
}

/* The UTF-8 of a string in an encoded part's table: an ASCII str is its own
 * (read in place, no call); any other was encoded, and its UTF-8 cached, when
 * it entered the table. */
static inline const char *
v10_table_utf8(PyObject *str, Py_ssize_t *size)
{
    if (PyUnicode_IS_ASCII(str)) {
        *size = PyUnicode_GET_LENGTH(str);
        return (const char *)PyUnicode_DATA(str);
    }
    return PyUnicode_AsUTF8AndSize(str, size);
}

/* Copy `size` bytes between holes, or a new string: mostly a few bytes (a
 * type byte, a span's fixed fields, short text), moved in pieces of a
 * constant size (the last one overlapping) instead of a memcpy call each. */
static inline void
v10_copy_run(char *to, const char *from, size_t size)
{
    if (size < 4) {
        for (size_t i = 0; i < size; i++) {
            to[i] = from[i];
        }
    }
    else if (size < 8) {
        memcpy(to, from, 4);
        memcpy(to + size - 4, from + size - 4, 4);
    }
    else if (size <= 16) {
        memcpy(to, from, 8);
        memcpy(to + size - 8, from + size - 8, 8);
    }
    else if (size <= 64) {
        for (size_t i = 0; i + 16 < size; i += 16) {
            memcpy(to + i, from + i, 16);
        }
        memcpy(to + size - 16, from + size - 16, 16);
    }
    else {
        memcpy(to, from, size);
    }
}

int
v10_append_part(PayloadBuilder *payload, EncodedPart *part)
{
    StringTable *local = &part->strings;
    StringTable *table = &payload->table;
    /* Each local string's payload id: on the stack for the usual trace (an
     * allocation would cost as much as joining a one-span trace). */
    uint32_t stack_ids[V10_STACK_IDS];
    uint32_t *ids = local->count <= V10_STACK_IDS
                        ? stack_ids
                        : PyMem_Malloc((size_t)local->count * sizeof(uint32_t));
    if (ids == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int result = -1;
    /* Room for the body, each hole as an id, and each string new to the
     * payload as a str (header included). */
    Py_ssize_t room = outbuf_len(&part->body) + part->holes.count * MP_MAX_HEADER;
    for (uint32_t i = 0; i < local->count; i++) {
        if (strtable_find(table, local->strings[i], local->hashes[i], &ids[i])) {
            continue;
        }
        ids[i] = V10_UNSEEN;
        Py_ssize_t size;
        if (v10_table_utf8(local->strings[i], &size) == NULL) {
            goto error;
        }
        room += MP_MAX_HEADER + size;
    }
    if (outbuf_reserve(&payload->body, room) < 0) {
        goto error;
    }
    const char *body = part->body.start;
    Py_ssize_t copied = 0, body_len = outbuf_len(&part->body);
    for (Py_ssize_t h = 0; h < part->holes.count; h++) {
        const StringHole *hole = &part->holes.items[h];
        v10_copy_run(payload->body.pos, body + copied, (size_t)(hole->offset - copied));
        payload->body.pos += hole->offset - copied;
        copied = hole->offset;
        uint32_t local_index = hole->local_index;
        if (ids[local_index] != V10_UNSEEN) {
            mp_put_uint(&payload->body, ids[local_index]);
            continue;
        }
        /* First use in this payload: the str, which takes the next id. */
        PyObject *str = local->strings[local_index];
        Py_ssize_t size;
        const char *utf8 = v10_table_utf8(str, &size);
        if (utf8 == NULL ||
            strtable_append_from(table, local, local_index, &ids[local_index]) < 0) {
            goto error;
        }
        mp_put_str_header(&payload->body, (uint32_t)size, 1);
        v10_copy_run(payload->body.pos, utf8, (size_t)size);
        payload->body.pos += size;
    }
    memcpy(payload->body.pos, body + copied, (size_t)(body_len - copied));
    payload->body.pos += body_len - copied;
    result = 0;
error:
    if (ids != stack_ids) {
        PyMem_Free(ids);
    }
    return result;
}
