/* The journal's append in one C call (journal.JournalFile.put).
 *
 * A record's frame is marshalled and copied into the journal's file mapping without returning to the
 * interpreter in between. The GIL is held from start to end: no other thread runs, and no Python signal
 * handler can interrupt it (they run between bytecodes), so the append needs neither the journal's lock
 * nor its busy flag. That is most of the training thread's cost of journaling a record: in Python the
 * same work is five calls, a lock and two slice assignments.
 *
 * put(jf, pre, op) copies pre (frames already built, may be empty) and then op's frame (a 4-byte
 * little-endian length and marshal format 4; op None: none) to jf.mm at jf.pos, writing the first frame's
 * length last (until it is there, the replay sees zeros and stops), and advances jf.pos. It returns
 * False, having written nothing, when the frames do not fit, the mapping is gone or jf.busy is set (the
 * Python path then grows the file under the lock), and raises ValueError, having written nothing, when
 * marshal does not take op.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <marshal.h>
#include <string.h>
#include <stdint.h>

static PyObject *s_mm, *s_pos, *s_busy;

static void
put_len(char *dst, uint32_t n)
{
    unsigned char b[4] = {n & 0xff, (n >> 8) & 0xff, (n >> 16) & 0xff, (n >> 24) & 0xff};
    memcpy(dst, b, 4);
}

static PyObject *
jput(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "put(jf, pre, op)");
        return NULL;
    }
    PyObject *jf = args[0], *pre = args[1], *op = args[2];
    if (!PyBytes_Check(pre)) {
        PyErr_SetString(PyExc_TypeError, "pre must be bytes");
        return NULL;
    }
    PyObject *body = NULL;
    if (op != Py_None) {
        body = PyMarshal_WriteObjectToString(op, 4);
        if (body == NULL)
            return NULL;
        if (PyBytes_GET_SIZE(body) > (Py_ssize_t)UINT32_MAX) {
            Py_DECREF(body);
            PyErr_SetString(PyExc_ValueError, "frame too large");
            return NULL;
        }
    }
    PyObject *busy = PyObject_GetAttr(jf, s_busy);
    if (busy == NULL)
        goto fail;
    int is_busy = PyObject_IsTrue(busy);
    Py_DECREF(busy);
    if (is_busy != 0)
        goto refuse;  /* the Python path holds the journal (growing it): it decides */
    PyObject *mm = PyObject_GetAttr(jf, s_mm);
    if (mm == NULL)
        goto fail;
    Py_buffer view;
    if (mm == Py_None || PyObject_GetBuffer(mm, &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(mm);
        goto refuse;  /* closed, or failed */
    }
    Py_DECREF(mm);
    PyObject *pos_o = PyObject_GetAttr(jf, s_pos);
    Py_ssize_t pos = pos_o ? PyLong_AsSsize_t(pos_o) : -1;
    Py_XDECREF(pos_o);
    if (pos < 0) {
        PyBuffer_Release(&view);
        goto refuse;
    }
    Py_ssize_t np = PyBytes_GET_SIZE(pre), nb = body ? PyBytes_GET_SIZE(body) : 0;
    Py_ssize_t total = np + (body ? 4 + nb : 0);
    if (total == 0) {
        PyBuffer_Release(&view);
        Py_XDECREF(body);
        Py_RETURN_TRUE;
    }
    if (total < 4 || pos + total > view.len) {
        PyBuffer_Release(&view);
        goto refuse;
    }
    PyObject *end_o = PyLong_FromSsize_t(pos + total);
    if (end_o == NULL) {
        PyBuffer_Release(&view);
        goto fail;
    }
    char *dst = (char *)view.buf + pos;
    char first[4] = {0};
    if (np) {
        memcpy(first, PyBytes_AS_STRING(pre), 4);
        memcpy(dst + 4, PyBytes_AS_STRING(pre) + 4, np - 4);
    }
    if (body) {
        if (np) {
            put_len(dst + np, (uint32_t)nb);
        } else {
            put_len(first, (uint32_t)nb);
        }
        memcpy(dst + np + 4, PyBytes_AS_STRING(body), nb);
    }
    /* the stores above reach the mapping before the length that makes them visible to a replay */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(dst, first, 4);
    PyBuffer_Release(&view);
    Py_XDECREF(body);
    int rc = PyObject_SetAttr(jf, s_pos, end_o);
    Py_DECREF(end_o);
    if (rc < 0)
        return NULL;
    Py_RETURN_TRUE;
refuse:
    Py_XDECREF(body);
    PyErr_Clear();
    Py_RETURN_FALSE;
fail:
    Py_XDECREF(body);
    return NULL;
}

static PyMethodDef methods[] = {
    {"put", (PyCFunction)(void (*)(void))jput, METH_FASTCALL,
     "put(jf, pre, op) -> bool: append pre and op's frame to the journal jf (see the module's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jput", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__jput(void)
{
    s_mm = PyUnicode_InternFromString("mm");
    s_pos = PyUnicode_InternFromString("pos");
    s_busy = PyUnicode_InternFromString("busy");
    if (!s_mm || !s_pos || !s_busy)
        return NULL;
    return PyModule_Create(&module);
}
