/* Quiet sections from C, without a section object: the shapes _tstate.c shares with the extensions that enter them.
 *
 * A framework's dispatch guard given as C functions (the capsule TF_GUARD_CAPSULE: torch's DisableTorchFunction as
 * its two thread-local reads and writes, from the C++ node hooks' module) and the quiet-section API of _tstate
 * (the capsule QUIET_API_CAPSULE: enter and leave over a frame on the caller's stack). The capsules' names carry the
 * structs' versions: a change of layout is a new name. */

#ifndef MSPROBE_TSTATE_H
#define MSPROBE_TSTATE_H

#include <Python.h>

#define TF_GUARD_CAPSULE "msprobe_inject.tf_guard.v1"
#define QUIET_API_CAPSULE "msprobe_inject._tstate.quiet_api.v1"

/* enter() sets the thread's guard and returns what was there; leave(that) puts it back. Neither fails. */
typedef struct {
    int (*enter)(void);
    void (*leave)(int);
} tfguard_v1;

/* one section's state between enter and leave (the caller's; zeroed or not, enter sets every field) */
typedef struct {
    PyObject *prev;          /* the flag before the section, NULL outside it */
    PyObject *entered;       /* a Python guard entered, or NULL */
    const tfguard_v1 *cg;    /* the C guard entered, or NULL */
    int cg_old;              /* what cg->enter() returned */
} quiet_frame;

typedef struct {
    PyTypeObject *quiet_type; /* _tstate.Quiet: what `quiet` must be */
    /* 0, or -1 with an error set (a guard whose entry failed: the flag as it was, the section not entered) */
    int (*enter)(PyObject *quiet, quiet_frame *f);
    /* 0, or -1 with an error set (the guard's exit or the flag's write); the flag is put back either way */
    int (*leave)(PyObject *quiet, quiet_frame *f);
} quiet_api_v1;

#endif
