/* Per-thread state with fixed attributes, read and set in a few dozen instructions.
 *
 * The hooks read and set their thread's state (busy, in_api, the module stack, ...) about twenty times per recorded
 * call. threading.local costs ~440 instructions per read and ~570 per set (the thread's dict found in the thread
 * state's dict, then the generic attribute protocol over a subclass's MRO): over 5 % of an L1 call.
 *
 * Local(names, defaults) -> an object whose attributes are exactly `names`, each thread seeing its own values. A
 * thread's first access makes them from `defaults` (a value, or a zero-argument callable called for each thread:
 * `list` for a fresh list). They live in a list kept in the thread's state dict (PyThreadState_GetDict), so they go
 * with the thread, the collector follows them, and a forked child has its parent thread's, as with threading.local.
 * The last thread's list is kept by its thread id (never reused in a process), so the common case (one thread,
 * many accesses) is a comparison and an index. Any other attribute name raises AttributeError.
 *
 * Unlike threading.local: a dead thread's values live on while they are the cached ones (until another thread's
 * access), a freed Local's values stay in the dicts of the threads that used it (the adapters' are never freed),
 * greenlets share their thread's values, and the cache needs the GIL (a free-threaded build turns it on for this
 * module, which declares no Py_mod_gil). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define LOCAL_MAX 16

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    PyObject *names[LOCAL_MAX]; /* interned str */
    PyObject *defaults;         /* tuple: a value, or a callable making one per thread */
    PyObject *key;              /* this object's key in a thread's state dict */
    uint64_t cached_id;         /* the thread whose values `cached` holds (0: none) */
    PyObject *cached;           /* that thread's list (a reference: alive while cached) */
} LocalObject;

static PyTypeObject LocalType;

/* the calling thread's values (borrowed: the thread's dict or the cache holds them), NULL with an error set */
static PyObject *
values(LocalObject *self)
{
    PyThreadState *ts = PyThreadState_Get();
    uint64_t id = PyThreadState_GetID(ts);
    if (id == self->cached_id && self->cached != NULL)
        return self->cached;
    PyObject *tdict = PyThreadState_GetDict();
    if (tdict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Local: no thread state dict");
        return NULL;
    }
    PyObject *vals = PyDict_GetItemWithError(tdict, self->key);
    if (vals == NULL) {
        if (PyErr_Occurred())
            return NULL;
        if (self->defaults == NULL) { /* cleared by the collector */
            PyErr_SetString(PyExc_RuntimeError, "Local: cleared");
            return NULL;
        }
        PyObject *made = PyList_New(self->n);
        if (made == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < self->n; i++) {
            PyObject *d = PyTuple_GET_ITEM(self->defaults, i);
            PyObject *v = PyCallable_Check(d) ? PyObject_CallNoArgs(d) : (Py_INCREF(d), d);
            if (v == NULL) {
                Py_DECREF(made);
                return NULL;
            }
            PyList_SET_ITEM(made, i, v);
        }
        /* a default's factory may have run Python code that made this thread's values first: those stay */
        vals = PyDict_SetDefault(tdict, self->key, made);
        Py_DECREF(made);
        if (vals == NULL)
            return NULL;
    }
    if (!PyList_CheckExact(vals) || PyList_GET_SIZE(vals) != self->n) {
        PyErr_SetString(PyExc_RuntimeError, "Local: the thread's values were replaced");
        return NULL;
    }
    /* the pair set together before the old list goes: its finalisers may run Python code, another thread's access
     * among it, which then sets a pair of its own */
    PyObject *old = self->cached;
    Py_INCREF(vals);
    self->cached = vals;
    self->cached_id = id;
    Py_XDECREF(old);
    return vals; /* the thread's dict holds it whatever the cache holds by now */
}

static Py_ssize_t
index_of(LocalObject *self, PyObject *name)
{
    for (Py_ssize_t i = 0; i < self->n; i++)
        if (self->names[i] == name)
            return i;
    if (PyUnicode_Check(name))
        for (Py_ssize_t i = 0; i < self->n; i++)
            if (PyUnicode_Compare(self->names[i], name) == 0)
                return i;
    return -1;
}

static PyObject *
local_getattro(PyObject *op, PyObject *name)
{
    LocalObject *self = (LocalObject *)op;
    Py_ssize_t i = index_of(self, name);
    if (i < 0)
        return PyObject_GenericGetAttr(op, name);
    PyObject *vals = values(self);
    if (vals == NULL)
        return NULL;
    PyObject *v = PyList_GET_ITEM(vals, i);
    Py_INCREF(v);
    return v;
}

static int
local_setattro(PyObject *op, PyObject *name, PyObject *v)
{
    LocalObject *self = (LocalObject *)op;
    Py_ssize_t i = index_of(self, name);
    if (i < 0) {
        PyErr_Format(PyExc_AttributeError, "'Local' object has no attribute '%U'", name);
        return -1;
    }
    if (v == NULL) {
        PyErr_Format(PyExc_AttributeError, "'Local' attribute '%U' cannot be deleted", name);
        return -1;
    }
    PyObject *vals = values(self);
    if (vals == NULL)
        return -1;
    Py_INCREF(v);
    PyObject *old = PyList_GET_ITEM(vals, i);
    PyList_SET_ITEM(vals, i, v);
    Py_DECREF(old); /* last: its finaliser may run Python code, the new value already in place */
    return 0;
}

static PyObject *
local_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *names, *defaults;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Local(names, defaults)");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!O!:Local", &PyTuple_Type, &names, &PyTuple_Type, &defaults))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n > LOCAL_MAX || PyTuple_GET_SIZE(defaults) != n) {
        PyErr_SetString(PyExc_ValueError, "Local: up to 16 names, one default each");
        return NULL;
    }
    LocalObject *self = (LocalObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_CheckExact(name)) {
            PyErr_SetString(PyExc_TypeError, "Local: names are str");
            Py_DECREF(self);
            return NULL;
        }
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name);
        self->names[i] = name;
        self->n = i + 1;
    }
    Py_INCREF(defaults);
    self->defaults = defaults;
    /* a number never reused: a thread's values under a freed Local's key are never a new one's */
    static unsigned long long made;
    self->key = PyUnicode_FromFormat("msprobe_inject._tstate.Local.%llu", ++made);
    if (self->key == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
local_traverse(PyObject *op, visitproc visit, void *arg)
{
    LocalObject *self = (LocalObject *)op;
    Py_VISIT(self->defaults);
    Py_VISIT(self->cached);
    return 0;
}

static int
local_clear(PyObject *op)
{
    LocalObject *self = (LocalObject *)op;
    Py_CLEAR(self->defaults);
    Py_CLEAR(self->cached);
    self->cached_id = 0;
    return 0;
}

static void
local_dealloc(PyObject *op)
{
    LocalObject *self = (LocalObject *)op;
    PyObject_GC_UnTrack(op);
    local_clear(op);
    for (Py_ssize_t i = 0; i < self->n; i++)
        Py_CLEAR(self->names[i]);
    Py_CLEAR(self->key);
    Py_TYPE(op)->tp_free(op);
}

static PyTypeObject LocalType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_inject._tstate.Local",
    .tp_basicsize = sizeof(LocalObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Local(names, defaults): per-thread values of fixed attributes (see the module's comment).",
    .tp_new = local_new,
    .tp_dealloc = local_dealloc,
    .tp_traverse = local_traverse,
    .tp_clear = local_clear,
    .tp_getattro = local_getattro,
    .tp_setattro = local_setattro,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tstate", NULL, -1, NULL};

PyMODINIT_FUNC
PyInit__tstate(void)
{
    if (PyType_Ready(&LocalType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&LocalType);
    if (PyModule_AddObject(m, "Local", (PyObject *)&LocalType) < 0) {
        Py_DECREF(&LocalType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
