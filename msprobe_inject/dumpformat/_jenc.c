/* A record body's JSON text in one C call (encoding.encode).
 *
 * The writer thread encodes every record once, and through the GIL that time is taken from training. The
 * standard library's C encoder builds a list of small str chunks (each key escaped into a new object, each
 * float's repr a new object) and joins them; a body of four tensor entries took ~11 us. This writes the same
 * bytes straight into one buffer: json.dumps(obj, check_circular=False) with its defaults (ensure_ascii,
 * ", " and ": ", NaN/Infinity tokens), floats and ints spelled by their exact-type repr as json does.
 *
 * encode(obj) returns the text, or None for anything it does not decide exactly as json would (a subclass,
 * a non-str key, another type, a tree deeper than 100): the caller then asks json.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* pyconfig.h defines _GNU_SOURCE: memmem */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "_entry.h"

#define NEW_REF(o) (Py_INCREF(o), (o)) /* Py_NewRef, which Python 3.9 lacks */
#define E_OTHER (-2)
#define E_NOMEM (-1)
#define E_DEPTH 100

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
    int scan;    /* encode_scan: watch for the text encoding.is_suspect looks for */
    int suspect; /* ... and it was written */
    char small[2048];
} B;

static int
b_grow(B *b, Py_ssize_t need)
{
    Py_ssize_t cap = b->cap * 2;
    while (cap < b->len + need)
        cap *= 2;
    char *nb;
    if (b->buf == b->small) {
        nb = PyMem_Malloc(cap);
        if (nb != NULL)
            memcpy(nb, b->buf, b->len);
    } else {
        nb = PyMem_Realloc(b->buf, cap);
    }
    if (nb == NULL)
        return E_NOMEM;
    b->buf = nb;
    b->cap = cap;
    return 0;
}

static inline int
b_put(B *b, const char *s, Py_ssize_t n)
{
    if (b->len + n > b->cap && b_grow(b, n) < 0)
        return E_NOMEM;
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    return 0;
}

static const char HEX[] = "0123456789abcdef";

/* the escape of a character that is not printable ASCII, or is '"' or '\\', at p (12 bytes at most); past it */
static inline char *
b_escape(char *p, Py_UCS4 c)
{
    *p++ = '\\';
    switch (c) {
    case '"': *p++ = '"'; return p;
    case '\\': *p++ = '\\'; return p;
    case '\n': *p++ = 'n'; return p;
    case '\r': *p++ = 'r'; return p;
    case '\t': *p++ = 't'; return p;
    case '\b': *p++ = 'b'; return p;
    case '\f': *p++ = 'f'; return p;
    }
    if (c >= 0x10000) {
        Py_UCS4 v = c - 0x10000;
        Py_UCS4 hi = 0xd800 | ((v >> 10) & 0x3ff), lo = 0xdc00 | (v & 0x3ff);
        *p++ = 'u';
        *p++ = HEX[(hi >> 12) & 0xf];
        *p++ = HEX[(hi >> 8) & 0xf];
        *p++ = HEX[(hi >> 4) & 0xf];
        *p++ = HEX[hi & 0xf];
        *p++ = '\\';
        c = lo;
    }
    *p++ = 'u';
    *p++ = HEX[(c >> 12) & 0xf];
    *p++ = HEX[(c >> 8) & 0xf];
    *p++ = HEX[(c >> 4) & 0xf];
    *p++ = HEX[c & 0xf];
    return p;
}

/* whether [p, end) holds "NaN", "Inf", "nan" or "inf": stepsummary.SUSPECT_TEXT. In a body's text these can only
 * be in a string's token (its escapes included) or in a non-finite float's (NaN, Infinity): numbers, null, true,
 * false and the punctuation between tokens hold none of their letters in a row, so the strings scanned as they
 * are written and the floats' tokens flagged give what a scan of the whole text gives. */
static inline int
has_suspect(const char *p, const char *end)
{
    for (; p + 3 <= end; p++) {
        char c = *p;
        if ((c == 'N' && p[1] == 'a' && p[2] == 'N') || (c == 'I' && p[1] == 'n' && p[2] == 'f') ||
            (c == 'n' && p[1] == 'a' && p[2] == 'n') || (c == 'i' && p[1] == 'n' && p[2] == 'f'))
            return 1;
    }
    return 0;
}

/* The text of short strings written before, by object: a body's keys and the values of its entries ("type",
 * "torch.Tensor", "dtype", "torch.float32", ...) are the same few objects in every record, and escaping one character
 * at a time, then scanning the token, cost more than the rest of a small body. A slot holds a reference to its
 * string, so that no other string can take its address while it is there; a str never changes. GIL only. */
#define STEXT_BITS 9
#define STEXT_MAX 64
static struct {
    PyObject *s;
    unsigned char len, suspect;
    char text[STEXT_MAX];
} stext[1 << STEXT_BITS];

static int b_str_escaped(B *b, PyObject *s);

static int
b_str(B *b, PyObject *s)
{
    unsigned slot = (unsigned)((((uintptr_t)s >> 4) * 0x9E3779B97F4A7C15ull) >> (64 - STEXT_BITS));
    if (stext[slot].s == s) {
        if (b->scan && stext[slot].suspect)
            b->suspect = 1;
        return b_put(b, stext[slot].text, stext[slot].len);
    }
    Py_ssize_t start = b->len;
    int scan = b->scan, suspect = b->suspect, rc;
    b->scan = 1; /* the slot keeps whether its text holds a suspect spelling, for callers that scan */
    b->suspect = 0;
    rc = b_str_escaped(b, s);
    int found = b->suspect;
    b->scan = scan;
    b->suspect = suspect || (scan && found);
    if (rc == 0 && b->len - start <= STEXT_MAX) {
        PyObject *old = stext[slot].s;
        stext[slot].s = NEW_REF(s);
        stext[slot].len = (unsigned char)(b->len - start);
        stext[slot].suspect = (unsigned char)found;
        memcpy(stext[slot].text, b->buf + start, b->len - start);
        Py_XDECREF(old);
    }
    return rc;
}

/* json.encoder.encode_basestring_ascii: printable ASCII but '"' and '\\' as is, the short escapes, the rest
 * as \uXXXX (lowercase hex; outside the BMP, a surrogate pair) */
static int
b_str_escaped(B *b, PyObject *s)
{
    if (PyUnicode_READY(s) < 0) {
        PyErr_Clear();
        return E_OTHER;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    /* at most 12 bytes per character (a surrogate pair), and the quotes */
    if (b->len + 12 * n + 2 > b->cap && b_grow(b, 12 * n + 2) < 0)
        return E_NOMEM;
    char *p = b->buf + b->len;
    char *start = p;
    *p++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= ' ' && c <= '~' && c != '"' && c != '\\')
            *p++ = (char)c;
        else
            p = b_escape(p, c);
    }
    *p++ = '"';
    if (b->scan && !b->suspect)
        b->suspect = has_suspect(start, p);
    b->len = p - b->buf;
    return 0;
}

/* The text float.__repr__ gave for a double's bits, in a slot picked by those bits. A tensor's statistics recur
 * in every record that takes the tensor (an output, then the next call's input, its view and its gradient are
 * the same figures from the statistics cache): over half of a step's floats are such repeats, and the repr of a
 * double (its shortest round-trip digits, ~0.4 us) is most of a record's encoding. What a slot holds is the
 * interpreter's own text for exactly those bits; len 0 is an empty slot (0.0's bits are zero too). Two slots per
 * set, the one used last first: a step's few hundred distinct figures in 2,048 single slots collided ~10 times a
 * step and each was formatted again. Used under the GIL only, as is the rest of this module. */
#define FTEXT_BITS 11
typedef struct {
    uint64_t bits;
    unsigned char len;
    char text[31];
} ftext_t;
static ftext_t ftext[1 << FTEXT_BITS][2];

static int
b_float(B *b, double v)
{
    if (v != v || v == Py_HUGE_VAL || v == -Py_HUGE_VAL)
        b->suspect = 1;
    if (v != v)
        return b_put(b, "NaN", 3);
    if (v == Py_HUGE_VAL)
        return b_put(b, "Infinity", 8);
    if (v == -Py_HUGE_VAL)
        return b_put(b, "-Infinity", 9);
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    ftext_t *set = ftext[(unsigned)((bits * 0x9E3779B97F4A7C15ull) >> (64 - FTEXT_BITS))];
    if (set[0].len && set[0].bits == bits)
        return b_put(b, set[0].text, set[0].len);
    if (set[1].len && set[1].bits == bits) {
        ftext_t hit = set[1];
        set[1] = set[0];
        set[0] = hit;
        return b_put(b, set[0].text, set[0].len);
    }
    /* float.__repr__ */
    char *s = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (s == NULL)
        return E_NOMEM;
    size_t n = strlen(s);
    if (n < sizeof set[0].text) {
        set[1] = set[0];
        set[0].bits = bits;
        memcpy(set[0].text, s, n);
        set[0].len = (unsigned char)n;
    }
    int rc = b_put(b, s, (Py_ssize_t)n);
    PyMem_Free(s);
    return rc;
}

/* an int64's digits ("%lld" without snprintf's format parsing); returns the first of them, which end at e */
static char *
digits_of(char *e, int64_t v)
{
    char *q = e;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        *--q = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--q = '-';
    return q;
}

static int
b_long(B *b, PyObject *o)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return E_OTHER;
    }
    if (!overflow) { /* an entry's shape is a few ints */
        char tmp[24], *q = digits_of(tmp + sizeof tmp, v);
        return b_put(b, q, tmp + sizeof tmp - q);
    }
    PyObject *r = PyLong_Type.tp_repr(o);
    if (r == NULL) {
        PyErr_Clear();
        return E_OTHER;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(r, &n);
    int rc = s == NULL ? E_OTHER : b_put(b, s, n);
    if (s == NULL)
        PyErr_Clear();
    Py_DECREF(r);
    return rc;
}

/* ---- a tensor's entry held as C values (_entry.h) ---- */
static PyTypeObject EntryType;
static PyObject *K_type, *K_dtype, *K_shape, *K_rg, *K_md5; /* and STAT_KEYS: Max, Min, Mean, Norm */
static PyObject *STAT_KEYS[4];
/* the md5 member's text in quotes */
static Py_ssize_t
entry_sum_quoted(const EntryObject *e, char *out)
{
    int n = entry_sum_text(e, out + 1);
    out[0] = out[n + 1] = '"';
    return n + 2;
}

/* json.dumps of the entry's dict */
static int
b_entry(B *b, EntryObject *e)
{
    int rc;
    char tmp[24];
    if ((rc = b_put(b, "{\"type\": ", 9)) < 0 || (rc = b_str(b, e->type)) < 0 ||
        (rc = b_put(b, ", \"dtype\": ", 11)) < 0 || (rc = b_str(b, e->dtype)) < 0 ||
        (rc = b_put(b, ", \"shape\": [", 12)) < 0)
        return rc;
    for (Py_ssize_t i = 0; i < Py_SIZE(e); i++) {
        char *q = digits_of(tmp + sizeof tmp, e->dims[i]);
        if ((i && (rc = b_put(b, ", ", 2)) < 0) || (rc = b_put(b, q, tmp + sizeof tmp - q)) < 0)
            return rc;
    }
    if ((rc = b_put(b, "]", 1)) < 0)
        return rc;
    static const char *const fig_key[4] = {", \"Max\": ", ", \"Min\": ", ", \"Mean\": ", ", \"Norm\": "};
    static const Py_ssize_t fig_len[4] = {9, 9, 10, 10};
    if (e->kind == ENTRY_NORM) {
        if ((rc = b_put(b, ", \"Max\": null, \"Min\": null, \"Mean\": null", 40)) < 0 ||
            (rc = b_put(b, fig_key[3], fig_len[3])) < 0 || (rc = b_float(b, e->fig[3])) < 0)
            return rc;
    } else if (e->kind != ENTRY_XOR) {
        for (int i = 0; i < 4; i++)
            if ((rc = b_put(b, fig_key[i], fig_len[i])) < 0 || (rc = b_float(b, e->fig[i])) < 0)
                return rc;
    } else {
        if ((rc = b_put(b, ", \"md5\": ", 9)) < 0)
            return rc;
        rc = e->scalar ? b_float(b, e->fig[0]) : b_put(b, tmp, entry_sum_quoted(e, tmp));
        if (rc < 0)
            return rc;
    }
    if ((rc = b_put(b, e->rg ? ", \"requires_grad\": true" : ", \"requires_grad\": false", e->rg ? 23 : 24)) < 0)
        return rc;
    if (e->kind == ENTRY_MD5 && ((rc = b_put(b, ", \"md5\": ", 9)) < 0 || (rc = b_put(b, tmp, entry_sum_quoted(e, tmp))) < 0))
        return rc;
    return b_put(b, "}", 1);
}

static PyObject *
entry_make(PyObject *type, PyObject *dtype, PyObject *size, const double *fig, int kind, uint64_t sum, int rg,
           int scalar)
{
    if (!PyUnicode_CheckExact(type) || !PyUnicode_CheckExact(dtype) || !PyTuple_Check(size) || kind < ENTRY_STATS ||
        kind > ENTRY_NORM) {
        PyErr_SetString(PyExc_TypeError, "entry(type: str, dtype: str, size: tuple of ints, ...)");
        return NULL;
    }
    Py_ssize_t nd = PyTuple_GET_SIZE(size);
    EntryObject *e = PyObject_NewVar(EntryObject, &EntryType, nd);
    if (e == NULL)
        return NULL;
    e->type = NEW_REF(type);
    e->dtype = NEW_REF(dtype);
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *d = PyTuple_GET_ITEM(size, i);
        int overflow = 0;
        e->dims[i] = PyLong_Check(d) ? PyLong_AsLongLongAndOverflow(d, &overflow) : -1;
        if (!PyLong_Check(d) || overflow || (e->dims[i] == -1 && PyErr_Occurred())) {
            Py_DECREF(e);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "entry: a size's items are int64");
            return NULL;
        }
    }
    memcpy(e->fig, fig, sizeof e->fig);
    e->sum = sum;
    e->kind = (unsigned char)kind;
    e->rg = rg != 0;
    e->scalar = scalar != 0;
    return (PyObject *)e;
}

static void
entry_dealloc(EntryObject *e)
{
    Py_XDECREF(e->type);
    Py_XDECREF(e->dtype);
    PyObject_Free(e);
}

/* the dict the entry stands for, its keys in the dicts' order */
static PyObject *
entry_dict(EntryObject *e)
{
    PyObject *d = PyDict_New(), *shape = PyList_New(Py_SIZE(e)), *v;
    if (d == NULL || shape == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < Py_SIZE(e); i++) {
        if ((v = PyLong_FromLongLong(e->dims[i])) == NULL)
            goto fail;
        PyList_SET_ITEM(shape, i, v);
    }
    if (PyDict_SetItem(d, K_type, e->type) < 0 || PyDict_SetItem(d, K_dtype, e->dtype) < 0 ||
        PyDict_SetItem(d, K_shape, shape) < 0)
        goto fail;
    Py_CLEAR(shape);
    PyObject *sum = NULL;
    if (e->kind == ENTRY_MD5 || e->kind == ENTRY_XOR) {
        char tmp[24];
        sum = e->scalar && e->kind == ENTRY_XOR ? PyFloat_FromDouble(e->fig[0])
                                                : PyUnicode_FromStringAndSize(tmp, entry_sum_text(e, tmp));
        if (sum == NULL)
            goto fail;
    }
    int rc = 0;
    if (e->kind == ENTRY_XOR) {
        rc = PyDict_SetItem(d, K_md5, sum);
    } else {
        for (int i = 0; i < 4 && rc == 0; i++) {
            if (e->kind == ENTRY_NORM && i < 3)
                rc = PyDict_SetItem(d, STAT_KEYS[i], Py_None);
            else if ((v = PyFloat_FromDouble(e->fig[i])) == NULL)
                rc = -1;
            else {
                rc = PyDict_SetItem(d, STAT_KEYS[i], v);
                Py_DECREF(v);
            }
        }
    }
    if (rc == 0)
        rc = PyDict_SetItem(d, K_rg, e->rg ? Py_True : Py_False);
    if (rc == 0 && e->kind == ENTRY_MD5)
        rc = PyDict_SetItem(d, K_md5, sum);
    Py_XDECREF(sum);
    if (rc == 0)
        return d;
fail:
    Py_XDECREF(shape);
    Py_XDECREF(d);
    return NULL;
}

static PyObject *
entry_as_dict(EntryObject *e, PyObject *unused)
{
    return entry_dict(e);
}

/* the dict's own method of that name, called on the entry's dict (Python's reads: rare, off the hot path) */
static PyObject *
entry_via_dict(EntryObject *e, const char *name, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *d = entry_dict(e);
    if (d == NULL)
        return NULL;
    PyObject *m = PyObject_GetAttrString(d, name), *r = NULL;
    if (m != NULL)
        r = PyObject_Vectorcall(m, args, nargs, NULL);
    Py_XDECREF(m);
    Py_DECREF(d);
    return r;
}

#define ENTRY_VIA(fn, name)                                                                                       \
    static PyObject *fn(EntryObject *e, PyObject *const *args, Py_ssize_t nargs)                                  \
    {                                                                                                              \
        return entry_via_dict(e, name, args, nargs);                                                              \
    }
ENTRY_VIA(entry_get_via, "get")
ENTRY_VIA(entry_keys, "keys")
ENTRY_VIA(entry_values, "values")
ENTRY_VIA(entry_items, "items")
ENTRY_VIA(entry_getitem_m, "__getitem__")
ENTRY_VIA(entry_iter_m, "__iter__")
ENTRY_VIA(entry_contains_m, "__contains__")

/* key's figure (Max, Min, Mean, Norm) as the dict holds it: the flight recorder's spike rule reads every followed
 * record's Norm on the writer thread, where the whole dict is made and freed for one float. 0: not a figure key of
 * this entry (the dict's own lookup answers). */
static int
entry_figure(EntryObject *e, PyObject *key, PyObject **out)
{
    if (e->kind == ENTRY_XOR || !PyUnicode_CheckExact(key))
        return 0;
    for (int i = 0; i < 4; i++) {
        if (key == STAT_KEYS[i] || PyUnicode_Compare(key, STAT_KEYS[i]) == 0) {
            *out = e->kind == ENTRY_NORM && i < 3 ? NEW_REF(Py_None) : PyFloat_FromDouble(e->fig[i]);
            return 1;
        }
    }
    return 0;
}

static PyObject *
entry_get(EntryObject *e, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *v;
    if (nargs >= 1 && nargs <= 2 && entry_figure(e, args[0], &v))
        return v;
    return entry_get_via(e, args, nargs);
}

static PyObject *
entry_getitem(EntryObject *e, PyObject *key)
{
    PyObject *v;
    if (entry_figure(e, key, &v))
        return v;
    return entry_getitem_m(e, &key, 1);
}

static PyObject *
entry_iter(EntryObject *e)
{
    return entry_iter_m(e, NULL, 0);
}

static int
entry_contains(EntryObject *e, PyObject *key)
{
    PyObject *r = entry_contains_m(e, &key, 1);
    int found = r == NULL ? -1 : r == Py_True;
    Py_XDECREF(r);
    return found;
}

static Py_ssize_t
entry_len(EntryObject *e)
{
    return e->kind == ENTRY_XOR ? 5 : e->kind == ENTRY_MD5 ? 9 : 8;
}

/* equal to its dict (and to another entry of the same dict) */
static PyObject *
entry_richcompare(PyObject *a, PyObject *b, int op)
{
    if (op != Py_EQ && op != Py_NE)
        Py_RETURN_NOTIMPLEMENTED;
    if (a == b)  /* as a dict is equal to itself whatever its figures (a NaN) */
        return PyBool_FromLong(op == Py_EQ);
    PyObject *da = Py_TYPE(a) == &EntryType ? entry_dict((EntryObject *)a) : NEW_REF(a);
    PyObject *db = Py_TYPE(b) == &EntryType ? entry_dict((EntryObject *)b) : NEW_REF(b);
    PyObject *r = da != NULL && db != NULL ? PyObject_RichCompare(da, db, op) : NULL;
    Py_XDECREF(da);
    Py_XDECREF(db);
    return r;
}

static PyObject *
entry_repr(EntryObject *e)
{
    PyObject *d = entry_dict(e);
    if (d == NULL)
        return NULL;
    PyObject *r = PyObject_Repr(d);
    Py_DECREF(d);
    return r;
}

/* pickled as its dict: loaded, it is that dict */
static PyObject *
entry_reduce(EntryObject *e, PyObject *unused)
{
    PyObject *d = entry_dict(e);
    return d == NULL ? NULL : Py_BuildValue("(O(N))", (PyObject *)&PyDict_Type, d);
}

static PyObject *
entry_deepcopy(EntryObject *e, PyObject *memo)
{
    return entry_dict(e);
}

static PyMethodDef entry_methods[] = {
    {"as_dict", (PyCFunction)entry_as_dict, METH_NOARGS, "as_dict() -> the dict this entry stands for"},
    {"copy", (PyCFunction)entry_as_dict, METH_NOARGS, "copy() -> the dict this entry stands for"},
    {"__copy__", (PyCFunction)entry_as_dict, METH_NOARGS, "copy.copy: the dict this entry stands for"},
    {"__deepcopy__", (PyCFunction)entry_deepcopy, METH_O, "copy.deepcopy: the dict this entry stands for"},
    {"__reduce__", (PyCFunction)entry_reduce, METH_NOARGS, "pickled as the dict this entry stands for"},
    {"get", (PyCFunction)(void (*)(void))entry_get, METH_FASTCALL, "as dict.get"},
    {"keys", (PyCFunction)(void (*)(void))entry_keys, METH_FASTCALL, "as dict.keys"},
    {"values", (PyCFunction)(void (*)(void))entry_values, METH_FASTCALL, "as dict.values"},
    {"items", (PyCFunction)(void (*)(void))entry_items, METH_FASTCALL, "as dict.items"},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods entry_mapping = {(lenfunc)entry_len, (binaryfunc)entry_getitem, NULL};
static PySequenceMethods entry_sequence = {.sq_contains = (objobjproc)entry_contains};

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "msprobe_inject.dumpformat._jenc.Entry",
    .tp_basicsize = offsetof(EntryObject, dims),
    .tp_itemsize = sizeof(int64_t),
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_repr = (reprfunc)entry_repr,
    .tp_as_sequence = &entry_sequence,
    .tp_as_mapping = &entry_mapping,
    .tp_hash = PyObject_HashNotImplemented,
#ifdef Py_TPFLAGS_MAPPING
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_MAPPING, /* a mapping to match statements too */
#else
    .tp_flags = Py_TPFLAGS_DEFAULT,
#endif
    .tp_doc = "A tensor's entry held as C values: a read-only mapping equal to its dict (see _entry.h).",
    .tp_richcompare = entry_richcompare,
    .tp_iter = (getiterfunc)entry_iter,
    .tp_methods = entry_methods,
};

static PyObject *
entry_dict_of(PyObject *e)
{
    return entry_dict((EntryObject *)e);
}

static EntryAPI entry_api = {&EntryType, entry_make, entry_dict_of};

/* entry(type, dtype, shape, (max, min, mean, norm), kind, sum, requires_grad, scalar): the C's entry from Python */
static PyObject *
jentry(PyObject *self, PyObject *args)
{
    PyObject *type, *dtype, *shape;
    double fig[4];
    int kind, rg, scalar;
    unsigned long long sum;
    if (!PyArg_ParseTuple(args, "UUO!(dddd)iKpp", &type, &dtype, &PyTuple_Type, &shape, &fig[0], &fig[1], &fig[2],
                          &fig[3], &kind, &sum, &rg, &scalar))
        return NULL;
    return entry_make(type, dtype, shape, fig, kind, (uint64_t)sum, rg, scalar);
}

static int b_obj(B *b, PyObject *o, int depth);
static int b_doc(B *b, PyObject *o, int level);

static int
b_seq(B *b, PyObject **items, Py_ssize_t n, int depth)
{
    int rc;
    if ((rc = b_put(b, "[", 1)) < 0)
        return rc;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i && (rc = b_put(b, ", ", 2)) < 0)
            return rc;
        if ((rc = b_obj(b, items[i], depth + 1)) < 0)
            return rc;
    }
    return b_put(b, "]", 1);
}

static int
b_obj(B *b, PyObject *o, int depth)
{
    int rc;
    if (depth > E_DEPTH)
        return E_OTHER;
    if (o == Py_None)
        return b_put(b, "null", 4);
    if (o == Py_True)
        return b_put(b, "true", 4);
    if (o == Py_False)
        return b_put(b, "false", 5);
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyUnicode_Type)
        return b_str(b, o);
    if (t == &PyFloat_Type)
        return b_float(b, PyFloat_AS_DOUBLE(o));
    if (t == &PyLong_Type)
        return b_long(b, o);
    if (t == &PyDict_Type) {
        if ((rc = b_put(b, "{", 1)) < 0)
            return rc;
        Py_ssize_t i = 0, n = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &i, &k, &v)) {
            if (Py_TYPE(k) != &PyUnicode_Type)
                return E_OTHER;  /* json spells int, float, bool and None keys its own way */
            if (n++ && (rc = b_put(b, ", ", 2)) < 0)
                return rc;
            if ((rc = b_str(b, k)) < 0 || (rc = b_put(b, ": ", 2)) < 0 || (rc = b_obj(b, v, depth + 1)) < 0)
                return rc;
        }
        return b_put(b, "}", 1);
    }
    if (t == &PyList_Type)
        return b_seq(b, ((PyListObject *)o)->ob_item, PyList_GET_SIZE(o), depth);
    if (t == &PyTuple_Type)
        return b_seq(b, ((PyTupleObject *)o)->ob_item, PyTuple_GET_SIZE(o), depth);
    if (t == &EntryType)
        return b_entry(b, (EntryObject *)o);
    return E_OTHER;
}

/* json.dumps(o, indent=1) (item separator ",", a newline and one space per level before each item, ": " after a
 * key; an empty list or dict as "[]" and "{}"): msprobe's spelling of stack.json and construct.json, which the
 * writer formats at every stop() while the training thread waits. Leaves as b_obj writes them. */
/* b_str for a document's strings (a stack's lines are long): an ASCII one's runs of characters that need no escape
 * copied at once. Kept apart from b_str, whose short strings (a record body's) this would slow. */
static int
b_str_runs(B *b, PyObject *s)
{
    if (PyUnicode_READY(s) < 0 || !PyUnicode_IS_ASCII(s)) {
        PyErr_Clear();
        return b_str(b, s);
    }
    const unsigned char *d = (const unsigned char *)PyUnicode_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (b->len + 6 * n + 2 > b->cap && b_grow(b, 6 * n + 2) < 0) /* \u00XX at most */
        return E_NOMEM;
    char *p = b->buf + b->len;
    *p++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = i;
        while (j < n && d[j] >= ' ' && d[j] <= '~' && d[j] != '"' && d[j] != '\\')
            j++;
        memcpy(p, d + i, (size_t)(j - i));
        p += j - i;
        if ((i = j) == n)
            break;
        p = b_escape(p, d[i]);
    }
    *p++ = '"';
    b->len = p - b->buf;
    return 0;
}

static int
b_newline(B *b, int level)
{
    if (b->len + level + 1 > b->cap && b_grow(b, level + 1) < 0)
        return E_NOMEM;
    b->buf[b->len++] = '\n';
    memset(b->buf + b->len, ' ', level);
    b->len += level;
    return 0;
}

static int
b_doc_seq(B *b, PyObject **items, Py_ssize_t n, int level)
{
    int rc;
    if (n == 0)
        return b_put(b, "[]", 2);
    if ((rc = b_put(b, "[", 1)) < 0)
        return rc;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((i && (rc = b_put(b, ",", 1)) < 0) || (rc = b_newline(b, level + 1)) < 0)
            return rc;
        if ((rc = b_doc(b, items[i], level + 1)) < 0)
            return rc;
    }
    if ((rc = b_newline(b, level)) < 0)
        return rc;
    return b_put(b, "]", 1);
}

static int
b_doc(B *b, PyObject *o, int level)
{
    int rc;
    if (level > E_DEPTH)
        return E_OTHER;
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyDict_Type) {
        if (PyDict_GET_SIZE(o) == 0)
            return b_put(b, "{}", 2);
        if ((rc = b_put(b, "{", 1)) < 0)
            return rc;
        Py_ssize_t i = 0, n = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &i, &k, &v)) {
            if (Py_TYPE(k) != &PyUnicode_Type)
                return E_OTHER;
            if ((n++ && (rc = b_put(b, ",", 1)) < 0) || (rc = b_newline(b, level + 1)) < 0)
                return rc;
            if ((rc = b_str_runs(b, k)) < 0 || (rc = b_put(b, ": ", 2)) < 0 || (rc = b_doc(b, v, level + 1)) < 0)
                return rc;
        }
        if ((rc = b_newline(b, level)) < 0)
            return rc;
        return b_put(b, "}", 1);
    }
    if (t == &PyList_Type)
        return b_doc_seq(b, ((PyListObject *)o)->ob_item, PyList_GET_SIZE(o), level);
    if (t == &PyTuple_Type)
        return b_doc_seq(b, ((PyTupleObject *)o)->ob_item, PyTuple_GET_SIZE(o), level);
    if (t == &PyUnicode_Type)
        return b_str_runs(b, o);
    return b_obj(b, o, level);
}

/* the text written (ASCII) as str, or as bytes; None for E_OTHER */
static inline PyObject *
b_result(B *b, int rc, int as_bytes)
{
    PyObject *out = NULL;
    if (rc == 0 && as_bytes) {
        out = PyBytes_FromStringAndSize(b->buf, b->len);
    } else if (rc == 0) {
        out = PyUnicode_New(b->len, 127);
        if (out != NULL)
            memcpy(PyUnicode_DATA(out), b->buf, b->len);
    } else if (rc == E_NOMEM) {
        PyErr_NoMemory();
    } else {
        out = Py_None;
        Py_INCREF(out);
    }
    if (b->buf != b->small)
        PyMem_Free(b->buf);
    return out;
}

/* o's text in a buffer on the stack while it fits: a record body (str), or a document (bytes) */
static inline PyObject *
b_run(PyObject *o, int doc, int *suspect)
{
    B b;
    b.buf = b.small;
    b.len = 0;
    b.cap = sizeof b.small;
    b.scan = suspect != NULL;
    b.suspect = 0;
    PyObject *out = b_result(&b, doc ? b_doc(&b, o, 0) : b_obj(&b, o, 0), doc);
    if (suspect != NULL)
        *suspect = b.suspect;
    return out;
}

static PyObject *
jdoc(PyObject *self, PyObject *o)
{
    return b_run(o, 1, NULL);
}

static PyObject *
jenc(PyObject *self, PyObject *o)
{
    return b_run(o, 0, NULL);
}

/* encode and encoding.is_suspect of its text in one pass: the writer asks both of every record, and the scan of
 * a body's whole text afterwards cost as much as its encoding (~1.2 us for a body of four tensor entries). */
static PyObject *
jenc_scan(PyObject *self, PyObject *o)
{
    int suspect = 0;
    PyObject *text = b_run(o, 0, &suspect);
    if (text == NULL || text == Py_None)
        return text;
    PyObject *out = PyTuple_New(2);
    if (out == NULL) {
        Py_DECREF(text);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, text);
    PyTuple_SET_ITEM(out, 1, PyBool_FromLong(suspect));
    return out;
}

/* an ASCII str's characters as they are (a record's text, which encode wrote); E_OTHER for any other object */
static inline int
b_ascii(B *b, PyObject *s)
{
    if (!PyUnicode_CheckExact(s) || PyUnicode_READY(s) < 0 || !PyUnicode_IS_ASCII(s)) {
        PyErr_Clear();
        return E_OTHER;
    }
    return b_put(b, (const char *)PyUnicode_DATA(s), PyUnicode_GET_LENGTH(s));
}

/* documents.StepRecords.main_bytes's "data" member, from ' "data": {' to the document's end, as bytes: each record on
 * its own line, a whole body's text as is and a merged one's members joined as encoding.join_members joins them. None
 * for anything else (a text that is not ASCII, a key that is not a str): the caller joins it in Python. At every
 * stop() the writer assembles the step's whole dump.json while the training thread waits. */
static PyObject *
jdata(PyObject *self, PyObject *bodies)
{
    if (!PyDict_CheckExact(bodies)) {
        PyErr_SetString(PyExc_TypeError, "data(bodies): a dict");
        return NULL;
    }
    B b;
    b.buf = b.small;
    b.len = 0;
    b.cap = sizeof b.small;
    b.scan = b.suspect = 0;
    int rc = b_put(&b, " \"data\": {", 10);
    Py_ssize_t i = 0, n = 0;
    PyObject *k, *v;
    while (rc == 0 && PyDict_Next(bodies, &i, &k, &v)) {
        if (!PyUnicode_CheckExact(k)) {
            rc = E_OTHER;
            break;
        }
        if ((n++ && (rc = b_put(&b, ",", 1)) < 0) || (rc = b_put(&b, "\n  ", 3)) < 0 || (rc = b_str(&b, k)) < 0 ||
            (rc = b_put(&b, ": ", 2)) < 0)
            break;
        if (PyDict_CheckExact(v)) {
            Py_ssize_t j = 0, m = 0;
            PyObject *mk, *mv;
            if ((rc = b_put(&b, "{", 1)) < 0)
                break;
            while (PyDict_Next(v, &j, &mk, &mv)) {
                if (!PyUnicode_CheckExact(mk)) {
                    rc = E_OTHER;
                    break;
                }
                if ((m++ && (rc = b_put(&b, ", ", 2)) < 0) || (rc = b_str(&b, mk)) < 0 ||
                    (rc = b_put(&b, ": ", 2)) < 0 || (rc = b_ascii(&b, mv)) < 0)
                    break;
            }
            if (rc == 0)
                rc = b_put(&b, "}", 1);
        }
        else
            rc = b_ascii(&b, v);
    }
    if (rc == 0)
        rc = n ? b_put(&b, "\n }\n}\n", 6) : b_put(&b, "}\n}\n", 4);
    return b_result(&b, rc, 1);
}

/* The writer thread's handlers of a run of events, in one call: events(batch, start, kinds, records) takes the events
 * batch[start:] while each is one it can take, and does to the step's documents (records, a
 * documents.StepRecords) what the writer's handlers do one event at a time:
 * - a whole record (kinds[0], a named tuple (key, body, pending)) with pending None: records.bodies[key] is set to its
 *   body's text, and key added to the writer's suspect set (kinds[4]) where that text may hold a non-finite statistic;
 * - members of a record (kinds[1], (key, members, pending, move)) with pending None: StepRecords.merge of the members'
 *   texts, and key added to the suspect set as above;
 * - a stack (kinds[2], (key, text)): StepRecords.add_stack (its text looked up once, in stack_pos);
 * - a module tree place (kinds[3], (key, parent)): StepRecords.add_construct.
 * It returns the index of the first event it did not take (another kind, statistics still to be read, a body encode
 * leaves to json, one whose handling failed: its handler does it again and logs the failure); what it did for the
 * events before that one stands. A recorded API call sends its stack and its record, at mix its place too: the Python around each
 * handler cost more than what the handler does. */
static PyObject *S_bodies, *S_stack_keys, *S_stack_pos, *S_stack_order, *S_construct;

/* StepRecords.merge of a Merge event (key, members, pending, move) whose members are each encoded here: 1 done, 0 left
 * to the handler (a member's key that is not a str, a value encode leaves to json, a record held as one text), -1 on
 * an error (nothing changed). */
static int
merge_one(PyObject *ev, PyObject *bodies, PyObject *suspect)
{
    PyObject *key = PyTuple_GET_ITEM(ev, 0), *members = PyTuple_GET_ITEM(ev, 1);
    int move = PyObject_IsTrue(PyTuple_GET_ITEM(ev, 3));
    if (!PyUnicode_CheckExact(key) || !PyDict_CheckExact(members) || move < 0) {
        PyErr_Clear();
        return 0;
    }
    PyObject *cur = PyDict_GetItemWithError(bodies, key);
    if (cur == NULL && PyErr_Occurred())
        return -1;
    if (cur != NULL && !PyDict_CheckExact(cur))
        return 0;
    PyObject *merged = cur != NULL ? PyDict_Copy(cur) : PyDict_New();
    if (merged == NULL)
        return -1;
    Py_ssize_t i = 0;
    PyObject *k, *v;
    int flagged = 0;
    while (PyDict_Next(members, &i, &k, &v)) {
        if (!PyUnicode_CheckExact(k)) {
            Py_DECREF(merged);
            return 0;
        }
        PyObject *text = b_run(v, 0, &flagged);
        if (text == NULL || text == Py_None) {
            Py_XDECREF(text);
            Py_DECREF(merged);
            return text == NULL ? -1 : 0;
        }
        int rc = PyDict_SetItem(merged, k, text);
        Py_DECREF(text);
        if (rc < 0) {
            Py_DECREF(merged);
            return -1;
        }
    }
    /* as the handler: a moved record goes to the end of the step (where its call completed) */
    int rc = 0;
    if (move && cur != NULL)
        rc = PyDict_DelItem(bodies, key);
    if (rc == 0)
        rc = PyDict_SetItem(bodies, key, merged);
    Py_DECREF(merged);
    if (rc == 0 && flagged)
        rc = PySet_Add(suspect, key);
    return rc < 0 ? -1 : 1;
}

static PyObject *
jevents(PyObject *self, PyObject *args)
{
    PyObject *batch, *rcls, *mcls, *scls, *ccls, *suspect, *records;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!n(OOOOO!)O", &PyList_Type, &batch, &start, &rcls, &mcls, &scls, &ccls,
                          &PySet_Type, &suspect, &records))
        return NULL;
    PyObject *bodies = PyObject_GetAttr(records, S_bodies), *keys_at = PyObject_GetAttr(records, S_stack_keys),
             *pos_of = PyObject_GetAttr(records, S_stack_pos), *order = PyObject_GetAttr(records, S_stack_order),
             *construct = PyObject_GetAttr(records, S_construct);
    Py_ssize_t k = start < 0 ? 0 : start;
    int failed = 0;
    if (bodies == NULL || keys_at == NULL || pos_of == NULL || order == NULL || construct == NULL) {
        failed = 1;
        goto done;
    }
    if (!PyDict_CheckExact(bodies) || !PyList_CheckExact(keys_at) || !PyDict_CheckExact(pos_of) ||
        !PyList_CheckExact(order) || !PyDict_CheckExact(construct))
        goto done; /* not the documents' own containers: the handlers take every event */
    for (; k < PyList_GET_SIZE(batch); k++) {
        PyObject *ev = PyList_GET_ITEM(batch, k), *t = (PyObject *)Py_TYPE(ev);
        if (t == rcls) {
            if (PyTuple_GET_SIZE(ev) != 3 || PyTuple_GET_ITEM(ev, 2) != Py_None)
                break;
            PyObject *key = PyTuple_GET_ITEM(ev, 0);
            if (!PyUnicode_CheckExact(key))
                break;
            int flagged = 0;
            PyObject *text = b_run(PyTuple_GET_ITEM(ev, 1), 0, &flagged);
            if (text == NULL) {
                PyErr_Clear(); /* this event is its handler's: it logs what fails */
                break;
            }
            if (text == Py_None) {
                Py_DECREF(text);
                break;
            }
            int rc = PyDict_SetItem(bodies, key, text);
            Py_DECREF(text);
            if (rc < 0 || (flagged && PySet_Add(suspect, key) < 0)) {
                PyErr_Clear(); /* this event is its handler's: it logs what fails */
                break;
            }
        }
        else if (t == mcls) {
            if (PyTuple_GET_SIZE(ev) != 4 || PyTuple_GET_ITEM(ev, 2) != Py_None)
                break;
            int r = merge_one(ev, bodies, suspect);
            if (r < 0)
                PyErr_Clear(); /* this event is its handler's: it logs what fails */
            if (r <= 0)
                break;
        }
        else if (t == scls) { /* add_stack: text -> its keys, in order of first use; its position */
            if (PyTuple_GET_SIZE(ev) != 2)
                break;
            PyObject *key = PyTuple_GET_ITEM(ev, 0), *text = PyTuple_GET_ITEM(ev, 1);
            PyObject *known = PyDict_GetItemWithError(pos_of, text);
            if (known == NULL && PyErr_Occurred()) {
                PyErr_Clear();
                break;
            }
            if (known != NULL) { /* its keys at its position */
                Py_ssize_t at = PyLong_Check(known) ? PyLong_AsSsize_t(known) : -1;
                PyObject *keys = at >= 0 && at < PyList_GET_SIZE(keys_at) ? PyList_GET_ITEM(keys_at, at) : NULL;
                if (keys == NULL || !PyList_CheckExact(keys)) {
                    PyErr_Clear();
                    break;
                }
                if (PyList_Append(keys, key) < 0) {
                    PyErr_Clear();
                    break;
                }
                continue;
            }
            PyObject *pos = PyLong_FromSsize_t(PyList_GET_SIZE(order)), *keys = PyList_New(1);
            if (pos == NULL || keys == NULL) {
                Py_XDECREF(pos);
                Py_XDECREF(keys);
                PyErr_Clear(); /* this event is its handler's: it logs what fails */
                break;
            }
            Py_INCREF(key);
            PyList_SET_ITEM(keys, 0, key);
            int rc = PyDict_SetItem(pos_of, text, pos);
            if (rc == 0 && (rc = PyList_Append(order, text)) < 0)
                PyDict_DelItem(pos_of, text);
            if (rc == 0 && (rc = PyList_Append(keys_at, keys)) < 0) {
                PyDict_DelItem(pos_of, text);
                PySequence_DelItem(order, PyList_GET_SIZE(order) - 1);
            }
            Py_DECREF(pos);
            Py_DECREF(keys);
            if (rc < 0) {
                PyErr_Clear(); /* this event is its handler's: it logs what fails */
                break;
            }
        }
        else if (t == ccls) {
            if (PyTuple_GET_SIZE(ev) != 2 || PyDict_SetItem(construct, PyTuple_GET_ITEM(ev, 0), PyTuple_GET_ITEM(ev, 1))
                                                 < 0) {
                PyErr_Clear();
                break;
            }
        }
        else
            break;
    }
done:
    Py_XDECREF(bodies);
    Py_XDECREF(keys_at);
    Py_XDECREF(pos_of);
    Py_XDECREF(order);
    Py_XDECREF(construct);
    if (failed) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return NULL;
    }
    return PyLong_FromSsize_t(k);
}

/* encoding.is_suspect for ASCII text (what encode returns): whether one of the four substrings occurs, with
 * glibc's memmem instead of four str.find passes. None for other text: the caller searches it. */
static PyObject *
jsuspect(PyObject *self, PyObject *s)
{
    if (!PyUnicode_Check(s) || PyUnicode_READY(s) < 0 || !PyUnicode_IS_ASCII(s)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    const char *d = (const char *)PyUnicode_DATA(s);
    size_t n = (size_t)PyUnicode_GET_LENGTH(s);
    static const char *const pats[] = {"NaN", "Inf", "nan", "inf"};
    for (int i = 0; i < 4; i++)
        if (memmem(d, n, pats[i], 3) != NULL)
            Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* nonfinite.has_nonfinite for the plain values of record bodies: whether a dict below obj holds a float Max, Min,
 * Mean or Norm that is a NaN or an infinity. The flight recorder's writer asks it of every record of a step it holds
 * without encoding it. Returns 1 or 0, or -1 for anything it does not decide as the Python walk would (a subclass
 * of dict or list, a statistic spelled as a string, a tree deeper than E_DEPTH): the caller walks it then. */
static int
nf_walk(PyObject *o, int depth)
{
    if (depth > E_DEPTH)
        return -1;
    if (Py_TYPE(o) == &EntryType) {
        EntryObject *e = (EntryObject *)o;
        if (e->kind == ENTRY_NORM)
            return !isfinite(e->fig[3]);
        return e->kind != ENTRY_XOR && !(isfinite(e->fig[0]) && isfinite(e->fig[1]) && isfinite(e->fig[2]) &&
                                         isfinite(e->fig[3]));
    }
    if (PyDict_CheckExact(o)) {
        for (int i = 0; i < 4; i++) {
            PyObject *v = PyDict_GetItemWithError(o, STAT_KEYS[i]);
            if (v == NULL) {
                if (PyErr_Occurred()) {
                    PyErr_Clear();
                    return -1;
                }
                continue;
            }
            if (PyFloat_Check(v)) {
                if (!isfinite(PyFloat_AS_DOUBLE(v)))
                    return 1;
            }
            else if (PyUnicode_Check(v))
                return -1;
        }
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v)) {
            if (PyDict_Check(v) || PyList_Check(v) || Py_TYPE(v) == &EntryType) {
                int r = nf_walk(v, depth + 1);
                if (r)
                    return r;
            }
        }
        return 0;
    }
    if (PyList_CheckExact(o)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(o); i++) {
            PyObject *v = PyList_GET_ITEM(o, i);
            if (PyDict_Check(v) || PyList_Check(v) || Py_TYPE(v) == &EntryType) {
                int r = nf_walk(v, depth + 1);
                if (r)
                    return r;
            }
        }
        return 0;
    }
    if (PyDict_Check(o) || PyList_Check(o))
        return -1;
    return 0;
}

static PyObject *
jnonfinite(PyObject *self, PyObject *o)
{
    int r = nf_walk(o, 0);
    if (r < 0)
        Py_RETURN_NONE;
    return PyBool_FromLong(r);
}

static PyMethodDef methods[] = {
    {"entry", (PyCFunction)jentry, METH_VARARGS,
     "entry(type, dtype, shape, (max, min, mean, norm), kind, sum, requires_grad, scalar) -> Entry: the entry the "
     "encoder's C makes (kind 0 statistics, 1 md5 (sum the CRC-32), 2 xor, 3 the Norm alone), for tests and "
     "benchmarks."},
    {"nonfinite", (PyCFunction)jnonfinite, METH_O,
     "nonfinite(obj) -> bool or None: nonfinite.has_nonfinite(obj) for plain dicts and lists with float statistics; "
     "None when the Python walk is to decide."},
    {"suspect", (PyCFunction)jsuspect, METH_O,
     "suspect(text) -> bool or None: whether ASCII text holds NaN, Inf, nan or inf; None for other text."},
    {"document", (PyCFunction)jdoc, METH_O,
     "document(obj) -> bytes or None: json.dumps(obj, indent=1) in ASCII for the same values as encode; None when "
     "json is to decide."},
    {"data", (PyCFunction)jdata, METH_O,
     "data(bodies) -> bytes or None: dump.json's \"data\" member to the document's end (see jdata); None when Python "
     "is to join it."},
    {"events", (PyCFunction)jevents, METH_VARARGS,
     "events(batch, start, (Record, Merge, Stack, Construct, suspect), step_records) -> int: the writer's handlers of the "
     "events batch[start:] (see jevents); the index of the first event not taken."},
    {"encode_scan", (PyCFunction)jenc_scan, METH_O,
     "encode_scan(obj) -> (str, bool) or None: encode(obj) and whether encoding.is_suspect holds of it."},
    {"encode", (PyCFunction)jenc, METH_O,
     "encode(obj) -> str or None: json.dumps(obj) for the plain values of record bodies (see the module's "
     "comment); None when json is to decide."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jenc", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__jenc(void)
{
    if ((S_bodies = PyUnicode_InternFromString("bodies")) == NULL ||
        (S_stack_keys = PyUnicode_InternFromString("stack_keys")) == NULL ||
        (S_stack_pos = PyUnicode_InternFromString("stack_pos")) == NULL ||
        (S_stack_order = PyUnicode_InternFromString("stack_order")) == NULL ||
        (S_construct = PyUnicode_InternFromString("construct")) == NULL)
        return NULL;
    static const char *const names[] = {"Max", "Min", "Mean", "Norm"};
    for (int i = 0; i < 4; i++)
        if ((STAT_KEYS[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return NULL;
    if ((K_type = PyUnicode_InternFromString("type")) == NULL ||
        (K_dtype = PyUnicode_InternFromString("dtype")) == NULL ||
        (K_shape = PyUnicode_InternFromString("shape")) == NULL ||
        (K_rg = PyUnicode_InternFromString("requires_grad")) == NULL ||
        (K_md5 = PyUnicode_InternFromString("md5")) == NULL || PyType_Ready(&EntryType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module), *cap;
    if (m == NULL)
        return NULL;
    Py_INCREF(&EntryType);
    if (PyModule_AddObject(m, "Entry", (PyObject *)&EntryType) < 0) {
        Py_DECREF(&EntryType);
        Py_DECREF(m);
        return NULL;
    }
    if ((cap = PyCapsule_New(&entry_api, ENTRY_CAPSULE, NULL)) == NULL || PyModule_AddObject(m, "entry_api", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
