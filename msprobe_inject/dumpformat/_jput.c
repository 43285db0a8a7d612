/* The journal's append in one C call (journal.JournalFile.put).
 *
 * A record's frame is encoded straight into the journal's file mapping without returning to the interpreter
 * in between. The GIL is held from start to end: no other thread runs, and no Python signal handler can
 * interrupt it (they run between bytecodes), so the append needs neither the journal's lock nor its busy
 * flag. That is most of the training thread's cost of journaling a record: in Python the same work is
 * marshal.dumps (a bytes object, a reference table), five calls, a lock and two slice assignments.
 *
 * put(jf, pre, op) copies pre (frames already built, may be empty) and then op's frame (a 4-byte
 * little-endian length and op in marshal's format; op None: none) to jf.mm at jf.pos, writing the first
 * frame's length last (until it is there, the replay sees zeros and stops), and advances jf.pos. It returns
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


/* ---- a marshal writer for the values records hold, straight into the mapping ----
 * marshal.dumps builds a bytes object and looks every shared object up in a reference table (format 3+);
 * a record is a tree of dicts, lists, tuples, str, float, small int, bool and None, written here with the
 * same type codes (no references: marshal.loads reads such a stream as it reads its own), in about a third
 * of the time. Anything else (a big int, a str with surrogates, another type, a deep tree) is left to
 * marshal. */
#define W_FULL (-1)
#define W_OTHER (-2)
#define W_DEPTH 100

typedef struct {
    char *p, *end;
} W;

static int
w_bytes(W *w, const void *b, Py_ssize_t n)
{
    if (w->end - w->p < n)
        return W_FULL;
    memcpy(w->p, b, n);
    w->p += n;
    return 0;
}

static int
w_u32(W *w, char code, Py_ssize_t n)
{
    if (n > (Py_ssize_t)INT32_MAX)
        return W_OTHER;
    if (w->end - w->p < 5)
        return W_FULL;
    *w->p++ = code;
    put_len(w->p, (uint32_t)n);
    w->p += 4;
    return 0;
}

static int w_obj(W *w, PyObject *o, int depth);

/* the items of a list or a tuple, after their type code and count */
static int
w_items(W *w, PyObject **items, Py_ssize_t n, int depth)
{
    int rc;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((rc = w_obj(w, items[i], depth)) < 0)
            return rc;
    return 0;
}

static int
w_obj(W *w, PyObject *o, int depth)
{
    int rc;
    if (depth > W_DEPTH)
        return W_OTHER;
    if (o == Py_None || o == Py_True || o == Py_False) {
        char c = o == Py_None ? 'N' : o == Py_True ? 'T' : 'F';
        return w_bytes(w, &c, 1);
    }
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyFloat_Type) {
        if (w->end - w->p < 9)
            return W_FULL;
        *w->p++ = 'g';
#if PY_VERSION_HEX >= 0x030B0000
        if (PyFloat_Pack8(PyFloat_AS_DOUBLE(o), w->p, 1) < 0)
#else
        if (_PyFloat_Pack8(PyFloat_AS_DOUBLE(o), (unsigned char *)w->p, 1) < 0)
#endif
        {
            PyErr_Clear();
            return W_OTHER;
        }
        w->p += 8;
        return 0;
    }
    if (t == &PyUnicode_Type) {
        if (PyUnicode_READY(o) < 0) {
            PyErr_Clear();
            return W_OTHER;
        }
        Py_ssize_t n;
        const char *s;
        if (PyUnicode_IS_ASCII(o)) {
            n = PyUnicode_GET_LENGTH(o);
            s = (const char *)PyUnicode_DATA(o);
            if (n < 256) {
                if (w->end - w->p < 2 + n)
                    return W_FULL;
                *w->p++ = 'z';
                *w->p++ = (char)n;
                memcpy(w->p, s, n);
                w->p += n;
                return 0;
            }
            if ((rc = w_u32(w, 'a', n)) < 0)
                return rc;
            return w_bytes(w, s, n);
        }
        s = PyUnicode_AsUTF8AndSize(o, &n);
        if (s == NULL) {
            PyErr_Clear();
            return W_OTHER;
        }
        if ((rc = w_u32(w, 'u', n)) < 0)
            return rc;
        return w_bytes(w, s, n);
    }
    if (t == &PyDict_Type) {
        if (w->end - w->p < 1)
            return W_FULL;
        *w->p++ = '{';
        Py_ssize_t i = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &i, &k, &v)) {
            if ((rc = w_obj(w, k, depth + 1)) < 0 || (rc = w_obj(w, v, depth + 1)) < 0)
                return rc;
        }
        return w_bytes(w, "0", 1);
    }
    if (t == &PyList_Type) {
        Py_ssize_t n = PyList_GET_SIZE(o);
        if ((rc = w_u32(w, '[', n)) < 0)
            return rc;
        return w_items(w, ((PyListObject *)o)->ob_item, n, depth + 1);
    }
    if (t == &PyTuple_Type) {
        Py_ssize_t n = PyTuple_GET_SIZE(o);
        if (n < 256) {
            if (w->end - w->p < 2)
                return W_FULL;
            *w->p++ = ')';
            *w->p++ = (char)n;
        } else if ((rc = w_u32(w, '(', n)) < 0) {
            return rc;
        }
        return w_items(w, ((PyTupleObject *)o)->ob_item, n, depth + 1);
    }
    if (t == &PyLong_Type) {
        int overflow = 0;
        long v = PyLong_AsLongAndOverflow(o, &overflow);
        if (overflow || v > INT32_MAX || v < INT32_MIN) {
            PyErr_Clear();
            return W_OTHER;
        }
        if (w->end - w->p < 5)
            return W_FULL;
        *w->p++ = 'i';
        put_len(w->p, (uint32_t)(int32_t)v);
        w->p += 4;
        return 0;
    }
    return W_OTHER;
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
    PyObject *busy = PyObject_GetAttr(jf, s_busy);
    if (busy == NULL)
        return NULL;
    int is_busy = PyObject_IsTrue(busy);
    Py_DECREF(busy);
    if (is_busy != 0)
        goto refuse;  /* the Python path holds the journal (growing it): it decides */
    PyObject *mm = PyObject_GetAttr(jf, s_mm);
    if (mm == NULL)
        return NULL;
    Py_buffer view;
    if (mm == Py_None || PyObject_GetBuffer(mm, &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(mm);
        goto refuse;  /* closed, or failed */
    }
    Py_DECREF(mm);
    PyObject *pos_o = PyObject_GetAttr(jf, s_pos);
    Py_ssize_t pos = pos_o ? PyLong_AsSsize_t(pos_o) : -1;
    Py_XDECREF(pos_o);
    Py_ssize_t np = PyBytes_GET_SIZE(pre);
    if (pos < 0 || (np && np < 4) || pos + np + (op != Py_None ? 4 : 0) > view.len) {
        PyBuffer_Release(&view);
        goto refuse;
    }
    char *dst = (char *)view.buf + pos;
    char *body = dst + np + 4;
    Py_ssize_t nb = 0;
    if (op != Py_None) {
        W w = {body, (char *)view.buf + view.len};
        int rc = w_obj(&w, op, 0);
        if (rc < 0)
            memset(body, 0, w.p - body);  /* past the journal's end stays zero: the replay stops there */
        if (rc == W_FULL) {
            PyBuffer_Release(&view);
            goto refuse;
        }
        if (rc == W_OTHER) {  /* marshal's own writer: raises, having written nothing, on what it does not take */
            PyObject *m = PyMarshal_WriteObjectToString(op, 4);
            if (m == NULL) {
                PyBuffer_Release(&view);
                return NULL;
            }
            nb = PyBytes_GET_SIZE(m);
            if (nb > (Py_ssize_t)UINT32_MAX || nb > (char *)view.buf + view.len - body) {
                Py_DECREF(m);
                PyBuffer_Release(&view);
                goto refuse;
            }
            memcpy(body, PyBytes_AS_STRING(m), nb);
            Py_DECREF(m);
        } else {
            nb = w.p - body;
        }
    }
    Py_ssize_t total = np + (op != Py_None ? 4 + nb : 0);
    if (total == 0) {
        PyBuffer_Release(&view);
        Py_RETURN_TRUE;
    }
    PyObject *end_o = PyLong_FromSsize_t(pos + total);
    if (end_o == NULL) {
        memset(dst + 4, 0, total - 4);
        PyBuffer_Release(&view);
        return NULL;
    }
    char first[4] = {0};
    if (np) {
        memcpy(first, PyBytes_AS_STRING(pre), 4);
        memcpy(dst + 4, PyBytes_AS_STRING(pre) + 4, np - 4);
        if (op != Py_None)
            put_len(dst + np, (uint32_t)nb);
    } else {
        put_len(first, (uint32_t)nb);
    }
    /* the stores above reach the mapping before the length that makes them visible to a replay */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(dst, first, 4);
    PyBuffer_Release(&view);
    int rc = PyObject_SetAttr(jf, s_pos, end_o);
    Py_DECREF(end_o);
    if (rc < 0)
        return NULL;
    Py_RETURN_TRUE;
refuse:
    PyErr_Clear();
    Py_RETURN_FALSE;
}

/* frame(op) -> bytes: op's frame (its 4-byte length, then op in marshal's format) as journal.frame builds it, for
 * the frames that wait for the next record's put (a call's stack and construct place): the writer above into a
 * buffer on the stack, marshal's own where that does not take op or it does not fit; ValueError as marshal's. */
#define FRAME_BUF 2048

static PyObject *
jframe(PyObject *self, PyObject *op)
{
    char buf[FRAME_BUF];
    W w = {buf + 4, buf + FRAME_BUF};
    if (w_obj(&w, op, 0) == 0) {
        put_len(buf, (uint32_t)(w.p - buf - 4));
        return PyBytes_FromStringAndSize(buf, w.p - buf);
    }
    PyObject *m = PyMarshal_WriteObjectToString(op, 4);
    if (m == NULL)
        return NULL;
    Py_ssize_t nb = PyBytes_GET_SIZE(m);
    if (nb > (Py_ssize_t)UINT32_MAX) {
        Py_DECREF(m);
        PyErr_SetString(PyExc_ValueError, "journal frame too large");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, nb + 4);
    if (out != NULL) {
        put_len(PyBytes_AS_STRING(out), (uint32_t)nb);
        memcpy(PyBytes_AS_STRING(out) + 4, PyBytes_AS_STRING(m), nb);
    }
    Py_DECREF(m);
    return out;
}

static PyMethodDef methods[] = {
    {"put", (PyCFunction)(void (*)(void))jput, METH_FASTCALL,
     "put(jf, pre, op) -> bool: append pre and op's frame to the journal jf (see the module's comment)."},
    {"frame", (PyCFunction)jframe, METH_O, "frame(op) -> bytes: op's journal frame (journal.frame)."},
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
