/* An object's attribute read (and set) where it is found, without the attribute protocol's walk each time.
 *
 * PyObject_GetAttr on a plain Python object looks the name up along its type's MRO, then in the instance's dict:
 * ~210 instructions, and a recorded call reads about 35 attributes of the recorder, its session, encoder and writer.
 * Where a read found that the type uses the generic protocol and has no attribute of that name (the value is the
 * instance dict's), or has a slot of that name (the value is at the slot's offset), a cache entry keeps that
 * finding with the type's version tag, which the interpreter changes whenever the type or one of its bases changes
 * (as its own attribute caches are kept). The next read of that name on an object of that type goes to the dict or
 * the offset directly; a missing value, any other type, a changed type or a cache miss goes through the protocol.
 * The answer is the protocol's in every case: no descriptor but a slot's is cached (a property never), and a class
 * attribute that appears later changes the version tag. A (type, name) pair's entry is one of a bucket of four, the
 * bucket picked by a multiplicative hash of both addresses: of the hundred-odd pairs the hooks read (at addresses that
 * change from run to run), two or three meeting in two entries evicted each other at every call in some runs. A set
 * (attrs_set) uses an entry a read filled: a slot's store at its offset where the type's __setattr__ is the generic
 * one and the slot has no flags, as the protocol's set would store there. */
#ifndef MSPROBE_ATTRS_H
#define MSPROBE_ATTRS_H

#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#define ATTRS_SIZE 1024 /* a power of two */
#define ATTRS_WAYS 4     /* entries per bucket */
#define ATTRS_BUCKET_BITS 8 /* log2(ATTRS_SIZE / ATTRS_WAYS) */
#define ATTRS_DICT (-1)
#define ATTRS_PROTOCOL (-2)

typedef struct {
    PyTypeObject *type; /* not a reference, never read: the tag says whether a type at that address is the one seen
                         * (tags are not reused; before 3.11 not before 2**32 of them) */
    unsigned int tag;
    PyObject *name;     /* interned, held by the including module */
    Py_ssize_t offset;  /* a slot's offset, ATTRS_DICT, or ATTRS_PROTOCOL (found where neither is known: asked as is) */
    int settable;       /* a slot the protocol's set stores at its offset (its member has no flags) */
} AttrsEntry;

static AttrsEntry attrs_cache[ATTRS_SIZE];
static Py_ssize_t attrs_misses; /* reads that went through the protocol: none per call once the process is warm */

static inline size_t
attrs_hash(PyTypeObject *tp, PyObject *name)
{
    /* the bucket's first entry: the product's top bits, which every bit of both addresses reaches (their low bits are
     * alignment, their high bits the same for most objects) */
    uint64_t x = ((uint64_t)(uintptr_t)tp ^ ((uint64_t)(uintptr_t)name << 1)) * UINT64_C(0x9E3779B97F4A7C15);
    return (size_t)(x >> (64 - ATTRS_BUCKET_BITS)) * ATTRS_WAYS;
}

/* the type's version tag where it is valid, else 0 */
static inline unsigned int
attrs_tag(PyTypeObject *tp)
{
#if PY_VERSION_HEX < 0x030B0000
    /* before 3.11 an invalidated type keeps its old tag with the flag cleared */
    if (!PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG))
        return 0;
#endif
    return tp->tp_version_tag;
}

/* the protocol's read, and where its answer's place can be kept, an entry of its bucket filled (an entry's type may be
 * gone: it is compared, never read) */
static PyObject *
attrs_slow(PyObject *o, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL || !PyUnicode_CheckExact(name))
        return v;
    PyTypeObject *tp = Py_TYPE(o); /* after the read, which may have changed o's class: the bucket is this type's */
    unsigned int tag = attrs_tag(tp);
    if (tp->tp_getattro != PyObject_GenericGetAttr || tag == 0)
        return v;
    size_t h = attrs_hash(tp, name);
    PyObject *d = _PyType_Lookup(tp, name); /* borrowed; the read above found the same */
    Py_ssize_t offset = ATTRS_PROTOCOL;
    int settable = 0;
    if (d == NULL) {
        /* a dict at a fixed offset alone: the interpreter's own (managed) dict of 3.11+, whose values it keeps
         * inline until asked for the dict, is read through the protocol (the dict made would slow every later read
         * of those objects' attributes from Python code) */
        if (tp->tp_dictoffset > 0)
            offset = ATTRS_DICT;
    } else if (Py_TYPE(d) == &PyMemberDescr_Type && PyType_IsSubtype(tp, PyDescr_TYPE(d))
               && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX) {
        offset = ((PyMemberDescrObject *)d)->d_member->offset;
        settable = ((PyMemberDescrObject *)d)->d_member->flags == 0;
    }
    if (attrs_tag(tp) != tag) /* the lookup itself may have run code that changed the type */
        return v;
    /* the pair's own entry, else a free one, else one in turn (a pair has one entry at most) */
    static unsigned int turn;
    AttrsEntry *e = NULL;
    for (int i = 0; i < ATTRS_WAYS && e == NULL; i++)
        if (attrs_cache[h + i].name == name && attrs_cache[h + i].type == tp)
            e = &attrs_cache[h + i];
    for (int i = 0; i < ATTRS_WAYS && e == NULL; i++)
        if (attrs_cache[h + i].name == NULL)
            e = &attrs_cache[h + i];
    if (e == NULL)
        e = &attrs_cache[h + (turn++ & (ATTRS_WAYS - 1))];
    e->type = tp;
    e->tag = tag;
    e->name = name;
    e->offset = offset;
    e->settable = settable;
    return v;
}

/* the entry of (tp, name), of the bucket at h, that still holds for the type (its version tag unchanged); else NULL */
static inline AttrsEntry *
attrs_find(PyTypeObject *tp, PyObject *name, size_t h)
{
    for (int i = 0; i < ATTRS_WAYS; i++) {
        AttrsEntry *e = &attrs_cache[h + i];
        if (e->name == name && e->type == tp)
            return e->tag == attrs_tag(tp) && e->tag != 0 ? e : NULL;
    }
    return NULL;
}

/* a new reference to o.name, or NULL with the protocol's error */
static inline PyObject *
attrs_get(PyObject *o, PyObject *name)
{
    PyTypeObject *tp = Py_TYPE(o);
    size_t h = attrs_hash(tp, name);
    AttrsEntry *e = attrs_find(tp, name, h);
    if (e != NULL) {
        PyObject *v = NULL;
        if (e->offset == ATTRS_PROTOCOL) {
            attrs_misses++;
            return PyObject_GetAttr(o, name);
        }
        if (e->offset >= 0) {
            v = *(PyObject **)((char *)o + e->offset);
        } else {
            PyObject **dp = _PyObject_GetDictPtr(o);
            if (dp != NULL && *dp != NULL && PyDict_CheckExact(*dp)) {
                v = PyDict_GetItemWithError(*dp, name);
                if (v == NULL && PyErr_Occurred())
                    return NULL;
            }
        }
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    attrs_misses++;
    return attrs_slow(o, name);
}

/* o.name = v: stored at the slot's offset where a read of that name on that type found a settable slot and the
 * type's __setattr__ is the generic one (what the protocol's set does there: the member descriptor's store), else
 * through the protocol (v NULL: a delete, the protocol's); 0, or -1 with its error. The value replaced is released
 * last: its finaliser may run code that reads the slot. */
static inline int
attrs_set(PyObject *o, PyObject *name, PyObject *v)
{
    if (v == NULL)
        return PyObject_SetAttr(o, name, NULL);
    PyTypeObject *tp = Py_TYPE(o);
    AttrsEntry *e = attrs_find(tp, name, attrs_hash(tp, name));
    if (e != NULL && e->offset >= 0 && e->settable && tp->tp_setattro == PyObject_GenericSetAttr) {
        PyObject **at = (PyObject **)((char *)o + e->offset);
        PyObject *old = *at;
        Py_INCREF(v);
        *at = v;
        Py_XDECREF(old);
        return 0;
    }
    return PyObject_SetAttr(o, name, v);
}

/* an attribute's truth: 1, 0, or -1 with an error */
static inline int
attrs_true(PyObject *o, PyObject *name)
{
    PyObject *v = attrs_get(o, name);
    if (v == NULL)
        return -1;
    int r = v == Py_True ? 1 : v == Py_False || v == Py_None ? 0 : PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

#endif
