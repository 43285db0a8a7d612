/* The stack signature's C interface (_stacksig.c), for the journal's stack_at (_jput.c): the walk into a buffer and
 * the table's lookup by the words it wrote, so a call whose stack was seen before is found without a bytes object,
 * a Python call or a SipHash of its signature (~480 bytes at 30 frames). */
#ifndef MSPROBE_STACKSIG_H
#define MSPROBE_STACKSIG_H

#include <Python.h>
#include <frameobject.h>
#include <stdint.h>

#define STACKSIG_CAPSULE "msprobe_inject._stacksig.api"
#define STACKSIG_LOCAL 128 /* frames a walk holds without an allocation */

typedef struct {
    /* the signature's words (code address, f_lasti) of frame and each frame below it into local (2 * STACKSIG_LOCAL
     * words) or, deeper, a PyMem buffer the caller frees (the return value differs from local); *n its frames.
     * NULL with the error set */
    uint64_t *(*walk)(PyFrameObject *frame, uint64_t *local, size_t *n);
    /* table's value for the signature of n frames: borrowed, NULL where it has none (no error is set) */
    PyObject *(*find)(PyObject *table, const uint64_t *words, size_t n);
    PyTypeObject *table_type;
} StackSigAPI;

static inline StackSigAPI *
stacksig_api_import(void)
{
    PyObject *m = PyImport_ImportModule("msprobe_inject._stacksig");
    StackSigAPI *api = m != NULL ? (StackSigAPI *)PyCapsule_Import(STACKSIG_CAPSULE, 0) : NULL;
    Py_XDECREF(m);
    PyErr_Clear();
    return api;
}

#endif
