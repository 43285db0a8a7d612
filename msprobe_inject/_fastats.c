/* One pass over a contiguous float32 buffer: max, min, sum and sum of squares.
 *
 * torch needs three passes for these (aminmax, sum, dot), each with its own dispatch and, for a
 * tensor larger than the cache, its own trip through memory. Sixteen float lanes per block of 2048
 * elements vectorise without reassociation flags; block sums are carried in double, so the result
 * is at least as close to the exact value as torch's float reductions. NaN is not propagated by
 * the comparisons: the caller checks that sum and sum of squares are finite and otherwise falls
 * back to torch, which keeps torch's NaN/Inf semantics exactly.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#define LANES 16
#define BLOCK 2048
#define NOGIL_FROM 65536 /* elements; below this, releasing the GIL costs more than it frees */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx2", "default")))
#endif
static void
f32_pass(const float *x, Py_ssize_t n, double *out)
{
    float mx[LANES], mn[LANES], s[LANES], q[LANES];
    double S = 0.0, Q = 0.0;
    Py_ssize_t i = 0;
    for (int k = 0; k < LANES; k++) {
        mx[k] = -INFINITY;
        mn[k] = INFINITY;
    }
    while (i + LANES <= n) {
        Py_ssize_t end = i + BLOCK;
        if (end > n)
            end = n - (n - i) % LANES;
        for (int k = 0; k < LANES; k++)
            s[k] = q[k] = 0.0f;
        for (; i < end; i += LANES) {
            for (int k = 0; k < LANES; k++) {
                float v = x[i + k];
                mx[k] = v > mx[k] ? v : mx[k];
                mn[k] = v < mn[k] ? v : mn[k];
                s[k] += v;
                q[k] += v * v;
            }
        }
        for (int k = 0; k < LANES; k++) {
            S += s[k];
            Q += q[k];
        }
    }
    float MX = -INFINITY, MN = INFINITY;
    for (int k = 0; k < LANES; k++) {
        MX = mx[k] > MX ? mx[k] : MX;
        MN = mn[k] < MN ? mn[k] : MN;
    }
    for (; i < n; i++) {
        float v = x[i];
        MX = v > MX ? v : MX;
        MN = v < MN ? v : MN;
        S += v;
        Q += (double)v * v;
    }
    out[0] = MX;
    out[1] = MN;
    out[2] = S;
    out[3] = Q;
}

/* f32(address, count) -> (max, min, sum, sum of squares) */
static PyObject *
fastats_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "f32(address, count)");
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(args[0]);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "count must be >= 0");
        return NULL;
    }
    if (p == NULL && n > 0) {
        PyErr_SetString(PyExc_ValueError, "null address");
        return NULL;
    }
    double r[4];
    if (n >= NOGIL_FROM) {
        Py_BEGIN_ALLOW_THREADS
        f32_pass((const float *)p, n, r);
        Py_END_ALLOW_THREADS
    } else {
        f32_pass((const float *)p, n, r);
    }
    return Py_BuildValue("(dddd)", r[0], r[1], r[2], r[3]);
}

static PyMethodDef methods[] = {
    {"f32", (PyCFunction)(void (*)(void))fastats_f32, METH_FASTCALL,
     "f32(address, count) -> (max, min, sum, sum of squares) of a contiguous float32 buffer"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastats", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__fastats(void)
{
    return PyModule_Create(&module);
}
