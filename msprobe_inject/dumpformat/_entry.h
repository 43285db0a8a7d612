/* A tensor's entry as a record holds it on its way to the journal and the writer thread, where the encoder's C
 * makes it (_fastats.c): its figures as C values instead of a dict of eight keys with four float objects and a shape
 * list, built, walked twice (the journal's marshal on the training thread, the writer's JSON) and freed per tensor.
 * The journal's C writer (_jput.c) writes it as the marshal stream of that dict and the JSON encoder (_jenc.c) as
 * that dict's text, byte for byte: a replay reads dicts, and dump.json cannot tell. _jenc.c owns the type; the
 * others reach it through the capsule below. Python sees a read-only mapping equal to the dict (as_dict() gives it;
 * json.dumps takes it through dumpformat.entry.plain).
 *
 * The keys, in the order the dicts have them:
 *   ENTRY_STATS  type, dtype, shape, Max, Min, Mean, Norm, requires_grad
 *   ENTRY_MD5    the same, then md5: the CRC-32's eight lowercase hex digits
 *   ENTRY_XOR    type, dtype, shape, md5, requires_grad; md5 "0x" and 16 hex digits of the xor, a 0-d tensor's
 *                its value (fig[0], a float)
 *   ENTRY_NORM   as ENTRY_STATS with Max, Min and Mean None (the monitor preset's entries: the Norm alone)
 */
#ifndef MSPROBE_ENTRY_H
#define MSPROBE_ENTRY_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#define ENTRY_STATS 0
#define ENTRY_MD5 1
#define ENTRY_XOR 2
#define ENTRY_NORM 3

typedef struct {
    PyObject_VAR_HEAD        /* Py_SIZE: the shape's length */
    PyObject *type, *dtype;  /* exact str */
    double fig[4];           /* Max, Min, Mean, Norm */
    uint64_t sum;            /* ENTRY_MD5: the CRC-32; ENTRY_XOR: the xor */
    unsigned char kind, rg, scalar;
    int64_t dims[1];
} EntryObject;

typedef struct {
    PyTypeObject *type;
    /* a new entry, or NULL with an error set; size a tuple of ints (a torch.Size) */
    PyObject *(*make)(PyObject *type, PyObject *dtype, PyObject *size, const double *fig, int kind, uint64_t sum,
                      int rg, int scalar);
    /* the dict an entry stands for, or NULL with an error set */
    PyObject *(*as_dict)(PyObject *entry);
} EntryAPI;

#define ENTRY_CAPSULE "msprobe_inject.dumpformat._jenc.entry_api"

/* _jenc's entries, or NULL (no error set) where it is not built. The module is imported first: the capsule's import
 * only looks it up as its package's attribute, which it is once imported. */
static inline EntryAPI *
entry_api_import(void)
{
    PyObject *m = PyImport_ImportModule("msprobe_inject.dumpformat._jenc");
    EntryAPI *api = m != NULL ? (EntryAPI *)PyCapsule_Import(ENTRY_CAPSULE, 0) : NULL;
    Py_XDECREF(m);
    PyErr_Clear();
    return api;
}

/* the md5 member's text of an ENTRY_MD5 or (not scalar) ENTRY_XOR entry, without quotes: the CRC-32's "%08x" or the
 * xor's "0x%016llx"; out holds 18 characters; returns their count */
static inline int
entry_sum_text(const EntryObject *e, char *out)
{
    static const char hexd[] = "0123456789abcdef";
    int n = e->kind == ENTRY_MD5 ? 8 : 16, at = e->kind == ENTRY_MD5 ? 0 : 2;
    uint64_t v = e->kind == ENTRY_MD5 ? (uint32_t)e->sum : e->sum;
    out[0] = '0', out[1] = 'x';
    for (int i = n - 1; i >= 0; i--, v >>= 4)
        out[at + i] = hexd[v & 15];
    return at + n;
}

#endif
