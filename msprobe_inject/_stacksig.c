/* The signature of a call stack: what the writer looks a record's stack up by (stack.json holds each distinct
 * stack once). The Python walk costs ~0.23 us per frame (13.7 us at 60 frames, a module call inside a
 * transformer); this one takes 0.31 us at 30 frames.
 *
 * sig(frame) -> bytes: for the frame and each frame below it, its code object's address and its last
 * instruction's offset (f_lasti), 16 bytes per frame. Two calls from the same place of the same code, through the
 * same callers' places, have the same signature; the code objects are kept alive by the writer's table, so an
 * address is not reused while its signature is held.
 *
 * Table: the writer's table of known stacks, signature (bytes from sig) -> value. A dict would do, but its lookup
 * needs the bytes object made and its SipHash taken at every recorded call (the bytes are new each time), a cost
 * that grows with the depth: ~800 instructions per call in benchmarks/percall.py's shallow loop. The journal's
 * stack_at walks into a buffer on its C stack and looks the words up here (_stacksig.h), hashed by a multiply-xor
 * pass of a few cycles a frame; Python reads and fills it as a mapping. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>
#include <string.h>

#include "_stacksig.h"

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *o) { Py_INCREF(o); return o; }
static inline PyObject *Py_XNewRef(PyObject *o) { Py_XINCREF(o); return o; }
#endif

static inline int64_t
frame_lasti(PyFrameObject *f)
{
#if PY_VERSION_HEX >= 0x030B0000
    return (int64_t)PyFrame_GetLasti(f);
#else
    return (int64_t)f->f_lasti;
#endif
}

static uint64_t *
walk(PyFrameObject *f, uint64_t *local, size_t *n_out)
{
    uint64_t *buf = local;
    size_t cap = STACKSIG_LOCAL, n = 0;
    Py_INCREF(f);
    while (f != NULL) {
        if (n == cap) {
            uint64_t *grown = PyMem_Malloc(sizeof(uint64_t) * 2 * cap * 2);
            if (grown == NULL) {
                Py_DECREF(f);
                if (buf != local)
                    PyMem_Free(buf);
                PyErr_NoMemory();
                return NULL;
            }
            memcpy(grown, buf, sizeof(uint64_t) * 2 * n);
            if (buf != local)
                PyMem_Free(buf);
            buf = grown;
            cap *= 2;
        }
        PyCodeObject *code = PyFrame_GetCode(f);
        buf[2 * n] = (uint64_t)(uintptr_t)code;
        buf[2 * n + 1] = (uint64_t)frame_lasti(f);
        Py_DECREF(code);
        n++;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    *n_out = n;
    return buf;
}

/* walk for a Python caller: a TypeError naming usage for an argument that is not a frame */
static uint64_t *
walk_arg(PyObject *arg, const char *usage, uint64_t *local, size_t *n)
{
    if (!PyFrame_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    return walk((PyFrameObject *)arg, local, n);
}

static PyObject *
stacksig_sig(PyObject *self, PyObject *arg)
{
    (void)self;
    uint64_t local[2 * STACKSIG_LOCAL];
    size_t n = 0;
    uint64_t *buf = walk_arg(arg, "sig() takes a frame", local, &n);
    if (buf == NULL)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)(sizeof(uint64_t) * 2 * n));
    if (buf != local)
        PyMem_Free(buf);
    return out;
}

/* ---- the table: open addressing, linear probing, at most half full ---- */

typedef struct {
    uint64_t hash;
    PyObject *key; /* bytes, its length a multiple of 16; NULL: an empty slot */
    PyObject *value;
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t mask; /* slots - 1; 0 with no slots */
    size_t used;
} Table;

static PyTypeObject Table_type;

static inline size_t
table_size(const Table *t)
{
    return t->mask ? t->mask + 1 : 0;
}

static inline uint64_t
words_hash(const uint64_t *w, size_t nwords)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)nwords;
    for (size_t i = 0; i < nwords; i++) {
        h = (h ^ w[i]) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 29;
    }
    return h;
}

static Slot *
slot_for(const Table *t, uint64_t hash, const void *words, size_t nbytes)
{
    for (size_t i = (size_t)hash & t->mask;; i = (i + 1) & t->mask) {
        Slot *s = &t->slots[i];
        if (s->key == NULL
            || (s->hash == hash && (size_t)PyBytes_GET_SIZE(s->key) == nbytes
                && memcmp(PyBytes_AS_STRING(s->key), words, nbytes) == 0))
            return s;
    }
}

/* the value of the signature whose hash and words are given: borrowed, NULL where the table has none */
static PyObject *
value_of(const Table *t, uint64_t hash, const void *words, size_t nbytes)
{
    if (t->used == 0)
        return NULL;
    Slot *s = slot_for(t, hash, words, nbytes);
    return s->key != NULL ? s->value : NULL;
}

static PyObject *
find(PyObject *table, const uint64_t *words, size_t n)
{
    return value_of((const Table *)table, words_hash(words, 2 * n), words, sizeof(uint64_t) * 2 * n);
}

/* a signature given from Python: bytes whose length is a multiple of 16, hashed as find hashes a walk's words */
static int
key_words(PyObject *key, const uint64_t **words, size_t *nbytes, uint64_t *hash)
{
    if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) % 16 != 0) {
        PyErr_SetString(PyExc_TypeError, "a stack table's key is a signature: bytes from sig()");
        return -1;
    }
    *words = (const uint64_t *)PyBytes_AS_STRING(key); /* ob_sval is 8-aligned in a bytes object */
    *nbytes = (size_t)PyBytes_GET_SIZE(key);
    *hash = words_hash(*words, *nbytes / 8);
    return 0;
}

static int
grow(Table *t)
{
    size_t oldsize = table_size(t), size = oldsize ? 2 * oldsize : 64;
    Slot *slots = PyMem_Calloc(size, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Slot *old = t->slots;
    t->slots = slots;
    t->mask = size - 1;
    for (size_t i = 0; i < oldsize; i++) {
        if (old[i].key != NULL) {
            size_t j = (size_t)old[i].hash & t->mask;
            while (slots[j].key != NULL)
                j = (j + 1) & t->mask;
            slots[j] = old[i];
        }
    }
    PyMem_Free(old);
    return 0;
}

static int
table_set(Table *t, PyObject *key, PyObject *value)
{
    const uint64_t *words;
    size_t nbytes;
    uint64_t hash;
    if (key_words(key, &words, &nbytes, &hash) < 0)
        return -1;
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "a stack table's entries are not deleted one by one: clear() it");
        return -1;
    }
    if (2 * (t->used + 1) > table_size(t) && grow(t) < 0)
        return -1;
    Slot *s = slot_for(t, hash, words, nbytes);
    PyObject *old = s->value;
    if (s->key == NULL) {
        s->key = Py_NewRef(key);
        s->hash = hash;
        t->used++;
    }
    s->value = Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
}

static void
table_empty(Table *t)
{
    Slot *slots = t->slots;
    size_t size = table_size(t);
    t->slots = NULL;
    t->mask = 0;
    t->used = 0;
    for (size_t i = 0; i < size; i++) {
        Py_XDECREF(slots[i].key);
        Py_XDECREF(slots[i].value);
    }
    PyMem_Free(slots);
}

static PyObject *
table_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "Table() takes no arguments");
        return NULL;
    }
    return tp->tp_alloc(tp, 0); /* zeroed: no slots */
}

static int
table_traverse(Table *t, visitproc visit, void *arg)
{
    for (size_t i = 0; i < table_size(t); i++) {
        Py_VISIT(t->slots[i].key);
        Py_VISIT(t->slots[i].value);
    }
    return 0;
}

static int
table_clear_refs(Table *t)
{
    table_empty(t);
    return 0;
}

static void
table_dealloc(Table *t)
{
    PyObject_GC_UnTrack(t);
    table_empty(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t
table_len(Table *t)
{
    return (Py_ssize_t)t->used;
}

static PyObject *
table_lookup(Table *t, PyObject *key)
{
    const uint64_t *words;
    size_t nbytes;
    uint64_t hash;
    if (key_words(key, &words, &nbytes, &hash) < 0)
        return NULL;
    return value_of(t, hash, words, nbytes);
}

static PyObject *
table_subscript(Table *t, PyObject *key)
{
    PyObject *v = table_lookup(t, key);
    if (v == NULL && !PyErr_Occurred())
        PyErr_SetObject(PyExc_KeyError, key);
    return Py_XNewRef(v);
}

static int
table_ass_subscript(Table *t, PyObject *key, PyObject *value)
{
    return table_set(t, key, value);
}

static PyObject *
table_get(Table *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(sig[, default])");
        return NULL;
    }
    PyObject *v = table_lookup(t, args[0]);
    if (v == NULL && PyErr_Occurred())
        return NULL;
    return Py_NewRef(v != NULL ? v : nargs == 2 ? args[1] : Py_None);
}

static PyObject *
table_at(Table *t, PyObject *frame)
{
    uint64_t local[2 * STACKSIG_LOCAL];
    size_t n = 0;
    uint64_t *buf = walk_arg(frame, "at() takes a frame", local, &n);
    if (buf == NULL)
        return NULL;
    PyObject *v = find((PyObject *)t, buf, n);
    if (buf != local)
        PyMem_Free(buf);
    return Py_NewRef(v != NULL ? v : Py_None);
}

static PyObject *
table_clear(Table *t, PyObject *unused)
{
    table_empty(t);
    Py_RETURN_NONE;
}

static PyMethodDef table_methods[] = {
    {"get", (PyCFunction)(void (*)(void))table_get, METH_FASTCALL, "get(sig[, default]): sig's value, as dict.get"},
    {"at", (PyCFunction)table_at, METH_O, "at(frame): the value for sig(frame), or None (what stack_at looks up)"},
    {"clear", (PyCFunction)table_clear, METH_NOARGS, "clear(): every entry dropped"},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods table_mapping = {
    .mp_length = (lenfunc)table_len,
    .mp_subscript = (binaryfunc)table_subscript,
    .mp_ass_subscript = (objobjargproc)table_ass_subscript,
};

static PyTypeObject Table_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_inject._stacksig.Table",
    .tp_doc = "Table(): stack signatures (bytes from sig) -> values, looked up by a walk's words without bytes",
    .tp_basicsize = sizeof(Table),
    .tp_dealloc = (destructor)table_dealloc,
    .tp_as_mapping = &table_mapping,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)table_traverse,
    .tp_clear = (inquiry)table_clear_refs,
    .tp_methods = table_methods,
    .tp_new = table_new,
};

static StackSigAPI api = {walk, find, &Table_type};

static PyMethodDef methods[] = {
    {"sig", stacksig_sig, METH_O, "sig(frame) -> bytes: code address and f_lasti of the frame and each one below"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_stacksig", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__stacksig(void)
{
    if (PyType_Ready(&Table_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *cap = PyCapsule_New(&api, STACKSIG_CAPSULE, NULL);
    if (cap == NULL || PyModule_AddObject(m, "api", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&Table_type);
    if (PyModule_AddObject(m, "Table", (PyObject *)&Table_type) < 0) {
        Py_DECREF(&Table_type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
