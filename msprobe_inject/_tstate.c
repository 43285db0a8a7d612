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
 * module, which declares no Py_mod_gil).
 *
 * Quiet(local, name, guard) -> a callable whose call makes one quiet section: a context manager that sets the
 * calling thread's `name` (the busy flag) to True and enters a fresh guard() (torch's DisableTorchFunction; None:
 * none), and on leaving exits the guard and puts the flag back to what it was. quiet.enter() returns a section
 * entered, quiet.leave(section) leaves it: the per-record bodies' form, without the with statement's two bound
 * methods and its call (0.19 against 0.30 us a section). The recorder's bodies enter one per record: a Python
 * context manager there is two interpreter frames per record, and spelling it out in each body was the same eleven
 * lines three times. A guard whose entry fails leaves the flag as it was and raises (the section was not entered,
 * so nothing leaves it); a guard whose exit fails still has the flag put back.
 *
 * The guard may instead be a TF_GUARD_CAPSULE (_tstate.h): the framework's guard as two C functions over its own
 * thread-local state (torch's, from the C++ node hooks' module), entered with no object made, looked up or called
 * through Python (~800 instructions a section less than DisableTorchFunction's object, __enter__ and __exit__). And
 * the capsule `quiet_api` (QUIET_API_CAPSULE) gives C callers enter and leave over a frame on their own stack: a
 * record's C body enters its section without a section object or a call through Python. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <structmember.h>

#include "_tstate.h"

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

/* the calling thread's value i replaced by v (a reference taken); the old value returned (a new reference: the
 * caller drops it last, its finaliser may run Python code), NULL with an error set */
static PyObject *
swap(LocalObject *self, Py_ssize_t i, PyObject *v)
{
    PyObject *vals = values(self);
    if (vals == NULL)
        return NULL;
    Py_INCREF(v);
    PyObject *old = PyList_GET_ITEM(vals, i);
    PyList_SET_ITEM(vals, i, v);
    return old;
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
    PyObject *old = swap(self, i, v);
    if (old == NULL)
        return -1;
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

/* ---- quiet sections ---- */

typedef struct QuietObject QuietObject;

typedef struct {
    PyObject_HEAD
    QuietObject *quiet;
    quiet_frame f; /* f.prev NULL outside the section */
} SectionObject;

struct QuietObject {
    PyObject_HEAD
    LocalObject *local;
    Py_ssize_t index; /* the flag's place among the local's names */
    PyObject *guard;  /* a callable making a context manager, a TF_GUARD_CAPSULE, or NULL */
    PyObject *enter, *exit; /* a type guard's own __enter__ and __exit__ (its instances' type), or NULL */
    const tfguard_v1 *cguard; /* the capsule's functions, or NULL */
};


static PyTypeObject QuietType, SectionType;
static PyObject *str_enter, *str_exit; /* interned at import */

/* the error set, taken out and put back (the flag is set back in between) */
typedef struct {
    PyObject *type, *value, *tb;
} SavedError;

static void
save_error(SavedError *e)
{
#if PY_VERSION_HEX >= 0x030C0000
    e->type = e->tb = NULL;
    e->value = PyErr_GetRaisedException();
#else
    PyErr_Fetch(&e->type, &e->value, &e->tb);
#endif
}

static void
restore_error(SavedError *e)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(e->value);
#else
    PyErr_Restore(e->type, e->value, e->tb);
#endif
}

/* the calling thread's flag set back to v; -1 with an error set */
static int
put_back(QuietObject *q, PyObject *v)
{
    PyObject *old = swap(q->local, q->index, v);
    if (old == NULL)
        return -1;
    Py_DECREF(old);
    return 0;
}

/* one section entered into f: the flag set, then the guard; 0, or -1 with an error set and the flag as it was */
static int
frame_enter(PyObject *op, quiet_frame *f)
{
    QuietObject *q = (QuietObject *)op;
    f->entered = NULL;
    f->cg = NULL;
    f->cg_old = 0;
    PyObject *prev = swap(q->local, q->index, Py_True);
    if (prev == NULL) {
        f->prev = NULL;
        return -1;
    }
    if (q->cguard != NULL) { /* the guard's own thread-local state, no object */
        f->cg = q->cguard;
        f->cg_old = q->cguard->enter();
    } else if (q->guard != NULL) {
        PyObject *g = PyObject_CallNoArgs(q->guard);
        PyObject *r = NULL;
        if (g != NULL)
            r = q->enter != NULL && (PyObject *)Py_TYPE(g) == q->guard ? PyObject_Vectorcall(q->enter, &g, 1, NULL)
                                                                      : PyObject_CallMethodNoArgs(g, str_enter);
        if (r == NULL) {
            SavedError err;
            save_error(&err); /* first: the guard's finaliser may run Python code */
            Py_XDECREF(g);
            if (put_back(q, prev) < 0) /* the section was not entered: the flag as it was */
                PyErr_Clear();
            Py_DECREF(prev);
            restore_error(&err);
            f->prev = NULL;
            return -1;
        }
        Py_DECREF(r);
        f->entered = g;
    }
    f->prev = prev;
    return 0;
}

/* the section in f left: the guard exited, then the flag put back whatever the exit did; 0, or -1 with an error
 * set (the guard's, before a failed write of the flag's) */
static int
frame_leave(PyObject *op, quiet_frame *f)
{
    QuietObject *q = (QuietObject *)op;
    PyObject *prev = f->prev;
    if (prev == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a quiet section left without being entered");
        return -1;
    }
    PyObject *g = f->entered, *r = Py_None;
    f->entered = NULL;
    f->prev = NULL;
    SavedError err = {NULL, NULL, NULL};
    if (f->cg != NULL) {
        f->cg->leave(f->cg_old);
        f->cg = NULL;
        Py_INCREF(r);
    } else if (g != NULL) {
        PyObject *call[4] = {g, Py_None, Py_None, Py_None};
        r = q->exit != NULL && (PyObject *)Py_TYPE(g) == q->guard ? PyObject_Vectorcall(q->exit, call, 4, NULL)
                                                                  : PyObject_VectorcallMethod(str_exit, call, 4, NULL);
        if (r == NULL)
            save_error(&err); /* the guard's error: raised once the flag is back */
        Py_DECREF(g);
    } else
        Py_INCREF(r);
    int bad = put_back(q, prev); /* whatever the guard's exit did */
    Py_DECREF(prev);
    if (r == NULL) {
        if (bad < 0)
            PyErr_Clear();
        restore_error(&err);
        return -1;
    }
    Py_DECREF(r);
    return bad;
}

static PyObject *
section_enter(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    SectionObject *self = (SectionObject *)op;
    if (self->f.prev != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a quiet section is entered once");
        return NULL;
    }
    if (frame_enter((PyObject *)self->quiet, &self->f) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
section_exit(PyObject *op, PyObject *const *args, Py_ssize_t nargs)
{
    SectionObject *self = (SectionObject *)op;
    if (frame_leave((PyObject *)self->quiet, &self->f) < 0)
        return NULL;
    Py_RETURN_FALSE; /* an exception inside the section goes on */
}

static void
section_dealloc(PyObject *op)
{
    SectionObject *self = (SectionObject *)op;
    Py_XDECREF(self->quiet);
    Py_XDECREF(self->f.prev);
    Py_XDECREF(self->f.entered);
    Py_TYPE(op)->tp_free(op);
}

static PyMethodDef section_methods[] = {
    {"__enter__", section_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))section_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SectionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_inject._tstate.QuietSection",
    .tp_basicsize = sizeof(SectionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One quiet section (see Quiet).",
    .tp_dealloc = section_dealloc,
    .tp_methods = section_methods,
};

static PyObject *
new_section(PyObject *quiet)
{
    SectionObject *s = PyObject_New(SectionObject, &SectionType);
    if (s == NULL)
        return NULL;
    Py_INCREF(quiet);
    s->quiet = (QuietObject *)quiet;
    s->f.prev = NULL;
    s->f.entered = NULL;
    s->f.cg = NULL;
    s->f.cg_old = 0;
    return (PyObject *)s;
}

static PyObject *
quiet_call(PyObject *op, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "a quiet section takes no arguments");
        return NULL;
    }
    return new_section(op);
}

static PyObject *
quiet_enter(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    PyObject *sec = new_section(op);
    if (sec == NULL)
        return NULL;
    PyObject *r = section_enter(sec, NULL);
    if (r == NULL) {
        Py_DECREF(sec);
        return NULL;
    }
    Py_DECREF(r);
    return sec;
}

static PyObject *
quiet_leave(PyObject *op, PyObject *sec)
{
    if (Py_TYPE(sec) != &SectionType) {
        PyErr_SetString(PyExc_TypeError, "leave(section): a section enter() returned");
        return NULL;
    }
    PyObject *r = section_exit(sec, NULL, 0);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

static PyMethodDef quiet_methods[] = {
    {"enter", quiet_enter, METH_NOARGS, NULL},
    {"leave", quiet_leave, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyObject *
quiet_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *local, *name, *guard;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Quiet(local, name, guard)");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!UO:Quiet", &LocalType, &local, &name, &guard))
        return NULL;
    int cguard = PyCapsule_IsValid(guard, TF_GUARD_CAPSULE);
    if (guard != Py_None && !cguard && !PyCallable_Check(guard)) {
        PyErr_SetString(PyExc_TypeError, "Quiet: guard is a callable, a " TF_GUARD_CAPSULE " capsule or None");
        return NULL;
    }
    Py_ssize_t i = index_of((LocalObject *)local, name);
    if (i < 0) {
        PyErr_Format(PyExc_ValueError, "Quiet: the local has no attribute '%U'", name);
        return NULL;
    }
    QuietObject *self = (QuietObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(local);
    self->local = (LocalObject *)local;
    self->index = i;
    if (guard != Py_None) {
        Py_INCREF(guard);
        self->guard = guard;
        if (cguard) { /* the capsule keeps its functions' module loaded */
            self->cguard = (const tfguard_v1 *)PyCapsule_GetPointer(guard, TF_GUARD_CAPSULE);
            if (self->cguard == NULL || self->cguard->enter == NULL || self->cguard->leave == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "Quiet: a guard capsule without its functions");
                Py_DECREF(self);
                return NULL;
            }
        } else if (PyType_Check(guard)) { /* its instances' methods, looked up once */
            self->enter = PyObject_GetAttr(guard, str_enter);
            self->exit = self->enter != NULL ? PyObject_GetAttr(guard, str_exit) : NULL;
            if (self->exit == NULL) {
                Py_DECREF(self);
                return NULL;
            }
        }
    }
    return (PyObject *)self;
}

static int
quiet_traverse(PyObject *op, visitproc visit, void *arg)
{
    QuietObject *self = (QuietObject *)op;
    Py_VISIT(self->local);
    Py_VISIT(self->guard);
    Py_VISIT(self->enter);
    Py_VISIT(self->exit);
    return 0;
}

static int
quiet_clear(PyObject *op)
{
    QuietObject *self = (QuietObject *)op;
    self->cguard = NULL; /* a section entered keeps its own pointer to the functions */
    Py_CLEAR(self->guard);
    Py_CLEAR(self->enter);
    Py_CLEAR(self->exit);
    return 0; /* the local stays: a section being left still needs it */
}

static void
quiet_dealloc(PyObject *op)
{
    QuietObject *self = (QuietObject *)op;
    PyObject_GC_UnTrack(op);
    quiet_clear(op);
    Py_CLEAR(self->local);
    Py_TYPE(op)->tp_free(op);
}

static PyMemberDef quiet_members[] = {
    {"guard", T_OBJECT, offsetof(QuietObject, guard), READONLY, "the guard its sections enter (None: none)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject QuietType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_inject._tstate.Quiet",
    .tp_basicsize = sizeof(QuietObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Quiet(local, name, guard): calling it makes a quiet section (see the module's comment).",
    .tp_new = quiet_new,
    .tp_call = quiet_call,
    .tp_methods = quiet_methods,
    .tp_members = quiet_members,
    .tp_dealloc = quiet_dealloc,
    .tp_traverse = quiet_traverse,
    .tp_clear = quiet_clear,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tstate", NULL, -1, NULL};

PyMODINIT_FUNC
PyInit__tstate(void)
{
    if (PyType_Ready(&LocalType) < 0 || PyType_Ready(&QuietType) < 0 || PyType_Ready(&SectionType) < 0)
        return NULL;
    str_enter = PyUnicode_InternFromString("__enter__");
    str_exit = PyUnicode_InternFromString("__exit__");
    if (str_enter == NULL || str_exit == NULL)
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
    Py_INCREF(&QuietType);
    if (PyModule_AddObject(m, "Quiet", (PyObject *)&QuietType) < 0) {
        Py_DECREF(&QuietType);
        Py_DECREF(m);
        return NULL;
    }
    static quiet_api_v1 api = {&QuietType, frame_enter, frame_leave};
    PyObject *cap = PyCapsule_New(&api, QUIET_API_CAPSULE, NULL);
    if (cap == NULL || PyModule_AddObject(m, "quiet_api", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
