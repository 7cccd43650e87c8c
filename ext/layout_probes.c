/* Import-time proof of the in-place readers (see layout_probes.h).
 *
 * Each reader runs, switched on, over probe objects of every layout it will
 * meet: dicts (empty, str keys, other keys, with deleted entries, 1- and
 * 2-byte index tables, a subclass, instances' split and combined __dict__),
 * instances (plain classes, dataclasses, `__slots__` with `__dict__`, a subclass with a
 * dict of a slotted class: the 3.14 case whose values sit past the slots;
 * each fresh, partly set, with its __dict__ asked for, with attributes
 * deleted, past the shared keys, with a non-str key) and ints (zero, both
 * signs, one to five digits, around 2**63, 2**64 and 2**128).  What it reads
 * is compared with the public C API's answer; a reader whose answer differs
 * even once, or that declines the plain forms it exists for, stays off.
 *
 * A layout so changed that reading it would fault is not what this guards
 * against: that needs a new CPython the build has not been told about, and
 * SP_KNOWN_CPYTHON_LAYOUTS (layout_probes.h) keeps the readers compiled out
 * there.  The probes catch the quieter changes (a field moved, a flag whose
 * meaning shifted, a vendor patch) that would otherwise mean wrong bytes. */
#include "layout_probes.h"
#include "pydict.h"
#include "pyinstance.h"
#include "pyint.h"

#include <string.h>

static const SpFastPaths all_on = {1, 1, 1, &PyLong_Type};
static const SpFastPaths all_off = {0, 0, 0, NULL};

/* The probe dicts and instances, made by Python code as users make them.
 * Instance attributes are never class attributes too, so an attribute
 * lookup gives exactly the instance's own value. */
static const char probe_source[] =
    "NAMES = ('service', 'name', 'span_id', 'extra', 'missing')\n"
    "class Plain:\n"
    "    def __init__(self):\n"
    "        self.service = 'web'\n"
    "        self.name = 'request'\n"
    "        self.span_id = 2 ** 63 + 1\n"
    /* What @dataclasses.dataclass(frozen=True) generates (the same storage
     * as a plain class; dataclasses itself is not imported for it). */
    "class Data:\n"
    "    def __init__(self, service, name, span_id):\n"
    "        object.__setattr__(self, 'service', service)\n"
    "        object.__setattr__(self, 'name', name)\n"
    "        object.__setattr__(self, 'span_id', span_id)\n"
    "class SlotsThenDict:\n"
    "    __slots__ = ('slot_x', '__dict__')\n"
    "    def __init__(self):\n"
    "        self.slot_x = 1\n"
    "        self.service = 'web'\n"
    "        self.name = 'request'\n"
    "        self.span_id = 7\n"
    "class SlottedBase:\n"
    "    __slots__ = ('slot_x', 'slot_y')\n"
    "class DictOfSlotted(SlottedBase):\n"
    "    def __init__(self):\n"
    "        self.slot_x = 1\n"
    "        self.service = 'web'\n"
    "        self.name = 'request'\n"
    "        self.span_id = 7\n"
    "class PlainChild(Plain):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.extra = 'child'\n"
    "def make(cls):\n"
    "    return Data('web', 'request', 5) if cls is Data else cls()\n"
    "INSTANCES = []\n"
    "for cls in (Plain, Data, SlotsThenDict, DictOfSlotted, PlainChild):\n"
    "    fresh = make(cls)\n"
    "    partial = make(cls)\n"
    "    del partial.name\n"
    "    extended = make(cls)\n"
    "    extended.extra = [1]\n"
    "    asked = make(cls)\n"
    "    asked.__dict__\n"
    "    asked_then_set = make(cls)\n"
    "    asked_then_set.__dict__['extra'] = 'set'\n"
    "    many = make(cls)\n"
    "    for i in range(40):\n"
    "        setattr(many, 'attribute_%d' % i, i)\n"
    "    non_str_key = make(cls)\n"
    "    non_str_key.__dict__[1] = 'one'\n"
    "    cleared = make(cls)\n"
    "    cleared.__dict__.clear()\n"
    "    replaced = make(cls)\n"
    "    replaced.__dict__ = {'service': 'other', 'extra': 3}\n"
    "    INSTANCES += [fresh, partial, extended, asked, asked_then_set, many, non_str_key,\n"
    "                  cleared, replaced]\n"
    "class DictChild(dict):\n"
    "    pass\n"
    "deleted = {'service': 'web', 'name': 'request', 'resource': '/'}\n"
    "del deleted['name']\n"
    "mixed_deleted = {1: 'one', 'two': 2, (3,): 3}\n"
    "del mixed_deleted['two']\n"
    "DICTS = [\n"
    "    {}, {'service': 'web'}, {'service': 'web', 'name': 'request', 'meta': {}},\n"
    "    {1: 'one', 'two': 2}, {1.5: None}, deleted, mixed_deleted,\n"
    "    {str(i): i for i in range(300)}, {i: str(i) for i in range(300)},\n"
    "    DictChild(service='web'), dict.fromkeys('abcdefgh'),\n"
    "]\n"
    "for cls in (Plain, Data, SlotsThenDict, DictOfSlotted, PlainChild):\n"
    "    fresh = make(cls)\n"
    "    non_str_key = make(cls)\n"
    "    non_str_key.__dict__[1] = 'one'\n"
    "    many = make(cls)\n"
    "    for i in range(40):\n"
    "        setattr(many, 'attribute_%d' % i, i)\n"
    "    DICTS += [fresh.__dict__, non_str_key.__dict__, many.__dict__]\n";

/* The dict readers. */

#ifdef SP_DICT_ENTRIES_IN_PLACE
/* 1 when `entries` of `dict` hold exactly what PyDict_Next gives, in its
 * order (a NULL value is a deleted entry). */
static int
entries_agree(PyObject *dict, const DictEntries *entries)
{
    const SpDictKeys *keys = (const SpDictKeys *)((PyDictObject *)dict)->ma_keys;
    if (entries->count < 0 || entries->count > ((Py_ssize_t)1 << keys->dk_log2_size) ||
        (entries->stride != 2 && entries->stride != 3)) {
        return 0;
    }
    Py_ssize_t pos = 0, seen = 0;
    PyObject *key, *value;
    PyObject *const *entry = entries->keys;
    for (Py_ssize_t i = 0; i < entries->count; i++, entry += entries->stride) {
        if (entry[1] == NULL) {
            continue;
        }
        if (!PyDict_Next(dict, &pos, &key, &value) || key != entry[0] || value != entry[1]) {
            return 0;
        }
        seen++;
    }
    return seen == PyDict_GET_SIZE(dict) && !PyDict_Next(dict, &pos, &key, &value);
}

#endif

/* 1 when reading the entries of every dict in `dicts` in place agrees with
 * PyDict_Next, and plain dicts are read so. */
static int
dict_entries_proven(PyObject *dicts)
{
#ifdef SP_DICT_ENTRIES_IN_PLACE
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(dicts); i++) {
        PyObject *dict = PyList_GET_ITEM(dicts, i);
        DictEntries entries;
        if (!PyDict_Check(dict)) {
            return 0;
        }
        const SpDictKeys *keys = (const SpDictKeys *)((PyDictObject *)dict)->ma_keys;
        if (keys->dk_log2_size > 40 || keys->dk_log2_index_bytes < keys->dk_log2_size ||
            keys->dk_log2_index_bytes > keys->dk_log2_size + 3) {
            return 0; /* not the header pydict.h mirrors */
        }
        if (pydict_entries(&all_on, dict, &entries)) {
            if (!entries_agree(dict, &entries)) {
                return 0;
            }
        }
        else if (i >= 1 && i <= 3) {
            return 0; /* the plain str-key and mixed-key dicts it exists for */
        }
    }
    return 1;
#else
    (void)dicts;
    return 0;
#endif
}

/* The instance reader. */

/* 1 when what the values array of `obj` holds for each of `names` is what
 * attribute lookup finds (no value: AttributeError); also when the
 * instance's array is gone (then the generic lookup is used).  -1 with an
 * exception when a lookup fails otherwise. */
static int
instance_agrees(PyObject *obj, PyObject *names, int must_read)
{
#ifdef SP_INSTANCE_VALUES_IN_PLACE
    const SpDictKeys *keys = pyinstance_shared_keys(&all_on, Py_TYPE(obj));
    Py_ssize_t capacity;
    PyObject *const *values;
    if (keys == NULL || keys->dk_log2_size > 30 ||
        keys->dk_nentries > ((Py_ssize_t)1 << keys->dk_log2_size)) {
        return keys == NULL && !must_read;
    }
    if ((values = pyinstance_values(obj, keys, &capacity)) == NULL) {
        return !must_read;
    }
    if (capacity < 0 || capacity > 1024) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        Py_ssize_t position = pyinstance_position(keys, name);
        PyObject *own = position >= 0 && position < capacity ? values[position] : NULL;
        PyObject *found = PyObject_GetAttr(obj, name);
        if (found == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                return -1;
            }
            PyErr_Clear();
        }
        Py_XDECREF(found); /* compared by address only */
        if (own != found) {
            return 0;
        }
    }
    return 1;
#else
    (void)obj;
    (void)names;
    (void)must_read;
    return 0;
#endif
}

/* 1 when every probe instance agrees (fresh plain instances must be read in
 * place: the first of each class's forms), 0 when one does not, -1 with an
 * exception. */
static int
instance_values_proven(PyObject *instances, PyObject *names, Py_ssize_t forms_per_class)
{
    if (!PyTuple_Check(names) || forms_per_class <= 0) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(instances); i++) {
        int agrees = instance_agrees(PyList_GET_ITEM(instances, i), names,
                                     i == 0 || i == forms_per_class); /* Plain, Data */
        if (agrees <= 0) {
            return agrees;
        }
    }
    return 1;
}

/* The int reader. */

/* 1 when the digits of `value` read in place give what the C API gives. */
static int
int_agrees(PyObject *value)
{
    uint64_t fast_magnitude = 0, api_magnitude = 0;
    int fast_negative = 0, api_negative = 0;
    int fast = pyint_magnitude64(&all_on, value, &fast_magnitude, &fast_negative);
    int api = pyint_magnitude64(&all_off, value, &api_magnitude, &api_negative);
    if (fast != api ||
        (api == 0 && (fast_magnitude != api_magnitude || fast_negative != api_negative))) {
        return 0;
    }
    /* 128 bits: the C API's answer is the low 64 bits of value and of
     * value >> 64, for 0 <= value < 2**128. */
    uint64_t high = 0, low = 0;
    int wide = pyint_as_u128(&all_on, value, &high, &low);
    size_t bits = _PyLong_NumBits(value);
    if (bits == (size_t)-1) {
        PyErr_Clear();
    }
    if (pyint_sign(value) < 0 || bits > 128) {
        return wide == 1;
    }
    PyObject *shift = PyLong_FromLong(64);
    PyObject *upper = shift != NULL ? PyNumber_Rshift(value, shift) : NULL;
    Py_XDECREF(shift);
    if (upper == NULL) {
        return -1;
    }
    uint64_t api_high = (uint64_t)PyLong_AsUnsignedLongLongMask(upper);
    uint64_t api_low = (uint64_t)PyLong_AsUnsignedLongLongMask(value);
    Py_DECREF(upper);
    if (PyErr_Occurred()) {
        return -1;
    }
    return wide == 0 && high == api_high && low == api_low;
}

/* Decimal texts of the probe ints, positive and negative. */
static const char *const probe_ints[] = {
    "0",
    "1",
    "1073741823",                              /* 2**30 - 1: the last one-digit int */
    "1073741824",                              /* 2**30 */
    "4294967296",                              /* 2**32 */
    "1152921504606846975",                     /* 2**60 - 1: the last two-digit int */
    "1152921504606846976",                     /* 2**60 */
    "9223372036854775807",                     /* 2**63 - 1 */
    "9223372036854775808",                     /* 2**63 */
    "18446744073709551615",                    /* 2**64 - 1 */
    "18446744073709551616",                    /* 2**64 */
    "170141183460469231731687303715884105733", /* 2**127 + 5 */
    "340282366920938463463374607431768211455", /* 2**128 - 1 */
    "340282366920938463463374607431768211456", /* 2**128 */
    "1267650600228229401496703205376",         /* 2**100 */
};

/* 1 when every probe int agrees and an exact int is read in place, 0 when
 * not, -1 with an exception. */
static int
int_digits_proven(void)
{
#ifdef SP_INT_DIGITS_IN_PLACE
    const digit *digits;
    Py_ssize_t count;
    int negative;
    if (pyint_digits(&all_on, Py_True, &digits, &count, &negative)) {
        return 0; /* a bool is an int subclass: its methods are its own */
    }
    for (size_t i = 0; i < sizeof probe_ints / sizeof probe_ints[0]; i++) {
        for (int sign = 0; sign < 2; sign++) {
            char text[64];
            PyOS_snprintf(text, sizeof text, "%s%s", sign ? "-" : "", probe_ints[i]);
            PyObject *value = PyLong_FromString(text, NULL, 10);
            if (value == NULL) {
                return -1;
            }
            int agrees = int_agrees(value);
            if (agrees > 0 && !pyint_digits(&all_on, value, &digits, &count, &negative)) {
                agrees = 0;
            }
            Py_DECREF(value);
            if (agrees <= 0) {
                return agrees;
            }
        }
    }
    return 1;
#else
    return 0;
#endif
}

/* Which readers `disabled` names (see layout_probes.h).  0, or -1 with
 * ValueError. */
static int
parse_disabled(const char *disabled, SpFastPaths *off)
{
    *off = all_off;
    while (disabled != NULL && *disabled != '\0') {
        const char *end = strchr(disabled, ',');
        size_t length = end != NULL ? (size_t)(end - disabled) : strlen(disabled);
        if (length == 3 && memcmp(disabled, "all", 3) == 0) {
            *off = all_on;
        }
        else if (length == 4 && memcmp(disabled, "dict", 4) == 0) {
            off->dict_entries = 1;
        }
        else if (length == 8 && memcmp(disabled, "instance", 8) == 0) {
            off->instance_values = 1;
        }
        else if (length == 3 && memcmp(disabled, "int", 3) == 0) {
            off->int_digits = 1;
        }
        else if (length != 0) {
            char name[41];
            PyOS_snprintf(name, sizeof name, "%.*s", (int)(length > 40 ? 40 : length), disabled);
            PyErr_Format(PyExc_ValueError,
                         "SPANPACK_DISABLE_FAST_PATHS: unknown fast path '%s' (expected dict, "
                         "instance, int or all)",
                         name);
            return -1;
        }
        disabled = end != NULL ? end + 1 : disabled + length;
    }
    return 0;
}

int
layout_probes_run(SpFastPaths *fast_paths, const char *disabled)
{
    PyObject *globals = NULL, *name = NULL, *result = NULL;
    SpFastPaths off;
    int status = -1;
    *fast_paths = all_off;
    if (parse_disabled(disabled, &off) < 0) {
        goto done;
    }
    if ((globals = PyDict_New()) == NULL ||
        (name = PyUnicode_FromString("spanpack._layout_probes")) == NULL ||
        PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins()) < 0 ||
        PyDict_SetItemString(globals, "__name__", name) < 0 ||
        (result = PyRun_String(probe_source, Py_file_input, globals, globals)) == NULL) {
        goto done;
    }
    PyObject *dicts = PyDict_GetItemString(globals, "DICTS");         /* borrowed */
    PyObject *instances = PyDict_GetItemString(globals, "INSTANCES"); /* borrowed */
    PyObject *names = PyDict_GetItemString(globals, "NAMES");         /* borrowed */
    if (dicts == NULL || !PyList_Check(dicts) || instances == NULL || !PyList_Check(instances) ||
        names == NULL) {
        PyErr_SetString(PyExc_SystemError, "spanpack: the layout probes were not made");
        goto done;
    }
    int dicts_ok = dict_entries_proven(dicts);
    int instances_ok = instance_values_proven(instances, names, PyList_GET_SIZE(instances) / 5);
    int ints_ok = int_digits_proven();
    if (instances_ok < 0 || ints_ok < 0) {
        goto done;
    }
    fast_paths->dict_entries = (unsigned char)(dicts_ok && !off.dict_entries);
    /* Reading an instance's values array also reads its class's shared keys
     * the way pydict.h reads a dict's. */
    fast_paths->instance_values = (unsigned char)(instances_ok && dicts_ok && !off.instance_values);
    fast_paths->int_digits = (unsigned char)(ints_ok && !off.int_digits);
    fast_paths->exact_int = fast_paths->int_digits ? &PyLong_Type : NULL;
    status = 0;
done:
    Py_XDECREF(result);
    Py_XDECREF(name);
    if (globals != NULL) {
        PyDict_Clear(globals); /* the classes refer back to it */
        Py_DECREF(globals);
    }
    return status;
}

PyObject *
layout_probes_names(const SpFastPaths *fast_paths)
{
    const char *names[3];
    int count = 0;
    if (fast_paths->dict_entries) {
        names[count++] = "dict";
    }
    if (fast_paths->instance_values) {
        names[count++] = "instance";
    }
    if (fast_paths->int_digits) {
        names[count++] = "int";
    }
    PyObject *tuple = PyTuple_New(count);
    for (int i = 0; tuple != NULL && i < count; i++) {
        PyObject *name = PyUnicode_FromString(names[i]);
        if (name == NULL) {
            Py_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(tuple, i, name);
    }
    return tuple;
}
