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
#include <frameobject.h>
#include <marshal.h>
#include <math.h>
#include <string.h>
#include <stdint.h>

#include "_entry.h"
#include "../_attrs.h"
#include "../_stacksig.h"

static PyObject *s_mm, *s_pos, *s_busy, *V_one;
#define NEW_REF(o) (Py_INCREF(o), (o)) /* Py_NewRef, which Python 3.9 lacks */

/* The writer's and the journal's attributes (about a dozen read and set per C call) are read and set where a read
 * found them: at a slot's offset (../_attrs.h); any other place through the attribute protocol. */

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

/* ---- an entry held as C values (_entry.h), written as the marshal stream of its dict ---- */
static EntryAPI *EAPI; /* _jenc's entries, where it is built */
static PyTypeObject *Entry_type;

static int
w_key(W *w, const char *k, Py_ssize_t n)
{
    if (w->end - w->p < 2 + n)
        return W_FULL;
    *w->p++ = 'z';
    *w->p++ = (char)n;
    memcpy(w->p, k, n);
    w->p += n;
    return 0;
}

static int
w_double(W *w, double v)
{
    if (w->end - w->p < 9)
        return W_FULL;
    *w->p++ = 'g';
#if PY_VERSION_HEX >= 0x030B0000
    if (PyFloat_Pack8(v, w->p, 1) < 0)
#else
    if (_PyFloat_Pack8(v, (unsigned char *)w->p, 1) < 0)
#endif
    {
        PyErr_Clear();
        return W_OTHER;
    }
    w->p += 8;
    return 0;
}

/* an int64 as marshal writes an int: 'i' and 4 bytes where it fits, else 'l', the signed count of 15-bit digits and
 * the digits, least significant first, 2 bytes each */
static int
w_int64(W *w, int64_t v)
{
    if (v >= INT32_MIN && v <= INT32_MAX) {
        if (w->end - w->p < 5)
            return W_FULL;
        *w->p++ = 'i';
        put_len(w->p, (uint32_t)(int32_t)v);
        w->p += 4;
        return 0;
    }
    uint64_t u = v < 0 ? 0ull - (uint64_t)v : (uint64_t)v;
    unsigned char d[10];
    int nd = 0;
    for (; u; u >>= 15, nd++) {
        d[2 * nd] = (unsigned char)(u & 0xff);
        d[2 * nd + 1] = (unsigned char)((u >> 8) & 0x7f);
    }
    if (w->end - w->p < 5 + 2 * nd)
        return W_FULL;
    *w->p++ = 'l';
    put_len(w->p, (uint32_t)(int32_t)(v < 0 ? -nd : nd));
    w->p += 4;
    memcpy(w->p, d, 2 * nd);
    w->p += 2 * nd;
    return 0;
}

/* the md5 member's value (a 0-d tensor's xor: its value) */
static int
w_sum(W *w, const EntryObject *e)
{
    if (e->kind == ENTRY_XOR && e->scalar)
        return w_double(w, e->fig[0]);
    char t[18];
    return w_key(w, t, entry_sum_text(e, t));
}

/* '{', the type's and dtype's pairs and the shape's key: the start of an entry's stream */
static int
w_entry_head(W *w, EntryObject *e, int depth)
{
    int rc;
    if ((rc = w_bytes(w, "{", 1)) < 0 || (rc = w_key(w, "type", 4)) < 0 || (rc = w_obj(w, e->type, depth + 1)) < 0 ||
        (rc = w_key(w, "dtype", 5)) < 0 || (rc = w_obj(w, e->dtype, depth + 1)) < 0)
        return rc;
    return w_key(w, "shape", 5);
}

/* An entry's stream up to its shape is the same for every entry of the same names: kept for the last names seen
 * (nearly every entry has the same two interned names), then copied in one piece, and the rest written in place from
 * constant keys after one room check for the most it can take, where nine calls a key took ~500 instructions an
 * entry. An entry that may not fit is W_FULL (its writer then makes room, as for any frame that does not fit). Held
 * references: a name's pointer is compared. */
static struct {
    PyObject *type, *dtype;
    Py_ssize_t n;
    char b[192];
} head;

static int
w_entry(W *w, EntryObject *e, int depth)
{
    int rc;
    Py_ssize_t nd = Py_SIZE(e);
    if (nd > INT32_MAX)
        return W_OTHER;
    if (head.type != e->type || head.dtype != e->dtype) {
        char tmp[sizeof head.b];
        W t = {tmp, tmp + sizeof tmp};
        if (w_entry_head(&t, e, depth) == 0) {
            PyObject *old_type = head.type, *old_dtype = head.dtype;
            head.type = NEW_REF(e->type);
            head.dtype = NEW_REF(e->dtype);
            head.n = t.p - tmp;
            memcpy(head.b, tmp, head.n);
            Py_XDECREF(old_type); /* a str's deallocation runs no Python code */
            Py_XDECREF(old_dtype);
        } else if ((rc = w_entry_head(w, e, depth)) < 0) { /* names too long to keep: written as they are */
            return rc;
        }
    }
    int kept = head.type == e->type && head.dtype == e->dtype;
    /* the most the rest takes: the shape's count and items, four figures' pairs, requires_grad's, md5's, the end */
    if (w->end - w->p < (kept ? head.n : 0) + 5 + 15 * nd + 4 * 15 + 16 + 25 + 1)
        return W_FULL;
    static const char fig_key[4][7] = {"z\x03Maxg", "z\x03Ming", "z\x04Meang", "z\x04Normg"};
    char *p = w->p;
    if (kept) {
        memcpy(p, head.b, head.n);
        p += head.n;
    }
    *p++ = '[';
    put_len(p, (uint32_t)nd);
    p += 4;
    for (Py_ssize_t i = 0; i < nd; i++) {
        W t = {p, w->end};
        w_int64(&t, e->dims[i]); /* fits: checked above */
        p = t.p;
    }
    rc = 0;
    if (e->kind == ENTRY_XOR) {
        memcpy(p, "z\x03md5", 5);
        p += 5;
        W t = {p, w->end};
        rc = w_sum(&t, e);
        p = t.p;
    } else {
        for (int i = 0; i < 4 && rc == 0; i++) {
            int n = i < 2 ? 6 : 7; /* the key and the float's code */
            memcpy(p, fig_key[i], n);
            p += n;
            if (e->kind == ENTRY_NORM && i < 3) {
                p[-1] = 'N';
                continue;
            }
#if PY_VERSION_HEX >= 0x030B0000
            rc = PyFloat_Pack8(e->fig[i], p, 1);
#else
            rc = _PyFloat_Pack8(e->fig[i], (unsigned char *)p, 1);
#endif
            p += 8;
        }
    }
    if (rc < 0) {
        PyErr_Clear();
        w->p = p;
        return W_OTHER;
    }
    memcpy(p, "z\x0drequires_grad", 15);
    p += 15;
    *p++ = e->rg ? 'T' : 'F';
    if (e->kind == ENTRY_MD5) {
        memcpy(p, "z\x03md5", 5);
        p += 5;
        W t = {p, w->end};
        w_sum(&t, e);
        p = t.p;
    }
    *p++ = '0';
    w->p = p;
    return 0;
}

/* o with every entry of C values replaced by the dict it stands for (its containers copied), for marshal's own
 * writer, which takes no type of ours: a new reference, or NULL with an error set */
static PyObject *
plain_copy(PyObject *o, int depth)
{
    if (Entry_type != NULL && Py_TYPE(o) == Entry_type)
        return EAPI->as_dict(o);
    if (depth > W_DEPTH || !(PyDict_CheckExact(o) || PyList_CheckExact(o) || PyTuple_CheckExact(o)))
        return NEW_REF(o);
    if (PyDict_CheckExact(o)) {
        PyObject *out = PyDict_New(), *k, *v;
        Py_ssize_t i = 0;
        while (out != NULL && PyDict_Next(o, &i, &k, &v)) {
            PyObject *c = plain_copy(v, depth + 1);
            if (c == NULL || PyDict_SetItem(out, k, c) < 0)
                Py_CLEAR(out);
            Py_XDECREF(c);
        }
        return out;
    }
    Py_ssize_t n = PyList_CheckExact(o) ? PyList_GET_SIZE(o) : PyTuple_GET_SIZE(o);
    PyObject *out = PyList_CheckExact(o) ? PyList_New(n) : PyTuple_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *c = plain_copy(PyList_CheckExact(o) ? PyList_GET_ITEM(o, i) : PyTuple_GET_ITEM(o, i), depth + 1);
        if (c == NULL)
            Py_CLEAR(out);
        else if (PyList_CheckExact(out))
            PyList_SET_ITEM(out, i, c);
        else
            PyTuple_SET_ITEM(out, i, c);
    }
    return out;
}

/* marshal's own stream of op (see plain_copy) */
static PyObject *
marshal_plain(PyObject *op)
{
    PyObject *p = plain_copy(op, 0);
    if (p == NULL)
        return NULL;
    PyObject *m = PyMarshal_WriteObjectToString(p, 4);
    Py_DECREF(p);
    return m;
}

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
        if (PyUnicode_KIND(o) != PyUnicode_1BYTE_KIND) {  /* a lone surrogate: UTF-8 would raise (see put_frames) */
            int kind = PyUnicode_KIND(o);
            const void *data = PyUnicode_DATA(o);
            for (Py_ssize_t i = 0, len = PyUnicode_GET_LENGTH(o); i < len; i++) {
                Py_UCS4 c = PyUnicode_READ(kind, data, i);
                if (c >= 0xD800 && c <= 0xDFFF)
                    return W_OTHER;
            }
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
    if (t == Entry_type)
        return w_entry(w, (EntryObject *)o, depth);
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

/* put_frames: pre (npre frames already built, each at least its 4-byte length; the caller holds references to
 * them) and then op's frame (op NULL or None: none) appended to jf's mapping, the first frame's length written last.
 * 1: appended; 0: refused, nothing written, no error set (the frames do not fit, the mapping is gone, jf.busy: the
 * Python path decides); -1: an error set (ValueError: marshal does not take op), nothing written.
 *
 * While the mapping is written no Python code may run: a collection's callbacks, finalisers or a signal handler
 * could switch threads (the writer thread appends to or closes this journal) and a closed journal's truncated
 * mapping faults. w_obj calls nothing that can; what it leaves to marshal is marshalled with the mapping let go,
 * and the fit is checked again after. */
static int
put_frames(PyObject *jf, PyObject *const *pre, Py_ssize_t npre, PyObject *op)
{
    if (op == Py_None)
        op = NULL;
    Py_ssize_t np = 0;
    for (Py_ssize_t i = 0; i < npre; i++) {
        if (!PyBytes_CheckExact(pre[i]) || PyBytes_GET_SIZE(pre[i]) < 4)
            return 0;
        np += PyBytes_GET_SIZE(pre[i]);
    }
    PyObject *m = NULL;  /* op in marshal's own format, where w_obj left it to marshal */
    int result = 0;
again:;
    PyObject *busy = attrs_get(jf, s_busy);
    if (busy == NULL) {
        result = -1;
        goto out;
    }
    int is_busy = PyObject_IsTrue(busy);
    Py_DECREF(busy);
    if (is_busy != 0)
        goto out;  /* the Python path holds the journal (growing it): it decides */
    PyObject *mm = attrs_get(jf, s_mm);
    if (mm == NULL) {
        result = -1;
        goto out;
    }
    Py_buffer view;
    if (mm == Py_None || PyObject_GetBuffer(mm, &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(mm);
        goto out;  /* closed, or failed */
    }
    Py_DECREF(mm);
    PyObject *pos_o = attrs_get(jf, s_pos);
    Py_ssize_t pos = pos_o ? PyLong_AsSsize_t(pos_o) : -1;
    Py_XDECREF(pos_o);
    Py_ssize_t nm = m != NULL ? PyBytes_GET_SIZE(m) : 0;
    if (pos < 0 || pos + np + (op != NULL ? 4 + nm : 0) > view.len) {
        PyBuffer_Release(&view);
        goto out;
    }
    char *dst = (char *)view.buf + pos;
    char *body = dst + np + 4;
    Py_ssize_t nb = 0;
    if (op != NULL && m != NULL) {
        memcpy(body, PyBytes_AS_STRING(m), nm);
        nb = nm;
    } else if (op != NULL) {
        W w = {body, (char *)view.buf + view.len};
        int rc = w_obj(&w, op, 0);
        if (rc < 0)
            memset(body, 0, w.p - body);  /* past the journal's end stays zero: the replay stops there */
        if (rc == W_FULL) {
            PyBuffer_Release(&view);
            goto out;
        }
        if (rc == W_OTHER) {  /* marshal's own writer: raises, having written nothing, on what it does not take */
            PyBuffer_Release(&view);
            m = marshal_plain(op);
            if (m == NULL) {
                result = -1;
                goto out;
            }
            if (PyBytes_GET_SIZE(m) > (Py_ssize_t)UINT32_MAX)
                goto out;
            goto again;
        }
        nb = w.p - body;
    }
    Py_ssize_t total = np + (op != NULL ? 4 + nb : 0);
    if (total == 0) {
        PyBuffer_Release(&view);
        result = 1;
        goto out;
    }
    PyObject *end_o = PyLong_FromSsize_t(pos + total);
    if (end_o == NULL) {
        memset(dst + 4, 0, total - 4);
        PyBuffer_Release(&view);
        result = -1;
        goto out;
    }
    char first[4] = {0};
    char *at = dst;
    for (Py_ssize_t i = 0; i < npre; i++) {
        const char *src = PyBytes_AS_STRING(pre[i]);
        Py_ssize_t n = PyBytes_GET_SIZE(pre[i]);
        if (i == 0) {
            memcpy(first, src, 4);
            memcpy(at + 4, src + 4, n - 4);
        } else {
            memcpy(at, src, n);
        }
        at += n;
    }
    if (op != NULL) {
        if (npre)
            put_len(at, (uint32_t)nb);
        else
            put_len(first, (uint32_t)nb);
    }
    /* the stores above reach the mapping before the length that makes them visible to a replay */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(dst, first, 4);
    PyBuffer_Release(&view);
    /* an int attribute's store: fails only out of memory, the frames written (a crash then replays them) */
    result = attrs_set(jf, s_pos, end_o) < 0 ? -1 : 1;
    Py_DECREF(end_o);
out:
    Py_XDECREF(m);
    if (result == 0)
        PyErr_Clear();
    return result;
}

static PyObject *
jput(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "put(jf, pre, op)");
        return NULL;
    }
    PyObject *pre = args[1];
    if (!PyBytes_Check(pre)) {
        PyErr_SetString(PyExc_TypeError, "pre must be bytes");
        return NULL;
    }
    int rc = put_frames(args[0], &pre, PyBytes_GET_SIZE(pre) ? 1 : 0, args[2]);
    if (rc < 0)
        return NULL;
    return PyBool_FromLong(rc);
}

/* frame(op) -> bytes: op's frame (its 4-byte length, then op in marshal's format) as journal.frame builds it, for
 * the frames that wait for the next record's put (a call's stack and construct place): the writer above into a
 * buffer on the stack, marshal's own where that does not take op or it does not fit; ValueError as marshal's. */
#define FRAME_BUF 2048

#define FRAME_HEAP_MAX (64 << 20)

static PyObject *
jframe(PyObject *self, PyObject *op)
{
    char buf[FRAME_BUF], *b = buf;
    Py_ssize_t cap = FRAME_BUF;
    int rc;
    for (;;) { /* a larger frame (a record of many entries) in a buffer of the heap, as large as it needs */
        W w = {b + 4, b + cap};
        if ((rc = w_obj(&w, op, 0)) == 0) {
            put_len(b, (uint32_t)(w.p - b - 4));
            PyObject *out = PyBytes_FromStringAndSize(b, w.p - b);
            if (b != buf)
                PyMem_Free(b);
            return out;
        }
        if (rc != W_FULL || cap >= FRAME_HEAP_MAX)
            break;
        cap *= 8;
        char *nb = b == buf ? PyMem_Malloc(cap) : PyMem_Realloc(b, cap);
        if (nb == NULL)
            break;
        b = nb;
    }
    if (b != buf)
        PyMem_Free(b);
    PyErr_Clear();
    PyObject *m = marshal_plain(op);
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

/* send(writer, ev, push) -> bool: DumpWriter.send's common case in one call (the caller holds the writer's
 * hand-off lock): a Record or Merge with no statistics left to read, while the open step has a journal. Its
 * frame goes to the journal after the call's stack and construct frames waiting in writer._jbuf (put_frames:
 * copied from the list, not joined into one bytes first); then, unless the step is held by the flight recorder
 * and its triggers do not look at it (writer._triggers_see), it is untracked and queued as send() does. False,
 * having done nothing: any other case, or the journal refused the frames or marshal did not take a value (the
 * Python path decides, again from the start). A Construct (a record's place in the module tree) is its journal
 * frame, left in writer._jbuf for the next record's append, and, unless the step is held, an event handed off.
 * Bound to the writer's names by send_setup(Record, Merge, Construct, untrack, batch). */
static PyObject *T_record, *T_merge, *T_construct, *T_stack, *F_untrack, *s_jf, *s_held, *s_jbuf, *s_buf, *s_q, *s_sent,
    *s_see, *s_put, *s_stacks, *V_set, *V_merge, *V_move, *V_construct, *V_stack, *V_stackdef;
static Py_ssize_t batch_n;

/* a *_setup(fn) call: fn kept in *slot, or a TypeError saying what it takes */
static PyObject *
set_callable(PyObject **slot, PyObject *fn, const char *usage)
{
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    Py_XSETREF(*slot, NEW_REF(fn));
    Py_RETURN_NONE;
}

/* writer._triggers_see(ev, t) for a held step's record, in C where see_setup gave the C walk for a non-finite
 * statistic (_jenc.nonfinite): that walk over the body (or members), then the spike rule's answer for the key as
 * Flight.follows keeps it (flight._spike_match; flight.spike_re None: no record is followed). The Python method
 * decides where the walk declines (None) or the writer has no flight recorder, Flight.follows where the key has no
 * answer yet. 1, 0, or -1 with an exception set. */
static PyObject *F_nonfinite, *s_flight, *s_spike_re, *s_spike_match, *s_follows;

static PyObject *
jsee_setup(PyObject *self, PyObject *fn)
{
    return set_callable(&F_nonfinite, fn, "see_setup(nonfinite): a callable");
}

static int
triggers_see(PyObject *w, PyObject *ev, PyObject *t)
{
    PyObject *r;
    if (F_nonfinite == NULL || !PyTuple_Check(ev) || PyTuple_GET_SIZE(ev) < 2)
        goto python;
    PyObject *fl = attrs_get(w, s_flight);  /* at their slots (DumpWriter's flight, Flight's spike rule) */
    if (fl == NULL)
        return -1;
    if (fl == Py_None) {  /* no flight recorder to ask: the method knows what to do */
        Py_DECREF(fl);
        goto python;
    }
    r = PyObject_CallOneArg(F_nonfinite, PyTuple_GET_ITEM(ev, 1));  /* a Record's body, a Merge's members */
    if (r == NULL || r == Py_None) {  /* the walk declined: the method decides */
        Py_DECREF(fl);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
        goto python;
    }
    int found = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (found != 0) {
        Py_DECREF(fl);
        return found;
    }
    PyObject *re = attrs_get(fl, s_spike_re);
    if (re == NULL) {
        Py_DECREF(fl);
        return -1;
    }
    int follows = re == Py_None ? 0 : -2;
    Py_DECREF(re);
    if (follows == -2) {
        PyObject *known = attrs_get(fl, s_spike_match);
        if (known == NULL) {
            Py_DECREF(fl);
            return -1;
        }
        PyObject *m = PyDict_Check(known) ? PyDict_GetItemWithError(known, PyTuple_GET_ITEM(ev, 0)) : NULL;
        if (m != NULL)
            follows = PyObject_IsTrue(m);
        else if (!PyErr_Occurred()) {  /* not asked yet: Flight.follows answers and keeps the answer */
            PyObject *got = PyObject_CallMethodOneArg(fl, s_follows, PyTuple_GET_ITEM(ev, 0));
            follows = got == NULL ? -1 : PyObject_IsTrue(got);
            Py_XDECREF(got);
        } else
            follows = -1;
        Py_DECREF(known);
    }
    Py_DECREF(fl);
    return follows;
python:
    r = PyObject_CallMethodObjArgs(w, s_see, ev, t, NULL);
    if (r == NULL)
        return -1;
    int see = PyObject_IsTrue(r);
    Py_DECREF(r);
    return see;
}

static PyObject *
jsend_setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 5 || nargs > 6 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2])
        || !PyCallable_Check(args[3]) || (nargs == 6 && (!PyType_Check(args[5])
                                                          || !PyType_IsSubtype((PyTypeObject *)args[5], &PyTuple_Type)))) {
        PyErr_SetString(PyExc_TypeError, "send_setup(Record, Merge, Construct, untrack, batch[, Stack])");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[4]);
    if (n < 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "batch must be positive");
        return NULL;
    }
    Py_XSETREF(T_record, NEW_REF(args[0]));
    Py_XSETREF(T_merge, NEW_REF(args[1]));
    Py_XSETREF(T_construct, NEW_REF(args[2]));
    Py_XSETREF(F_untrack, NEW_REF(args[3]));
    if (nargs == 6)
        Py_XSETREF(T_stack, NEW_REF(args[5]));
    batch_n = n;
    Py_RETURN_NONE;
}

/* ev appended to writer._buf, and the batch handed to the writer thread's queue when full or pushed: -1 on error */
static int
hand_off(PyObject *w, PyObject *ev, PyObject *push)
{
    PyObject *buf = attrs_get(w, s_buf);
    if (buf == NULL)
        return -1;
    int rc = -1;
    if (!PyList_CheckExact(buf)) {
        PyErr_SetString(PyExc_TypeError, "writer._buf is not a list");
        goto out;
    }
    if (PyList_Append(buf, ev) < 0)
        goto out;
    int pushed = PyObject_IsTrue(push);
    if (pushed < 0)
        goto out;
    if (pushed || PyList_GET_SIZE(buf) >= batch_n) {
        /* The new list is made before the buffer is taken (DumpWriter._hand_buffer in Python): its allocation may run
         * a collection whose Python code (a finalizer, a gc callback, the SIGTERM handler's flush) hands the buffer
         * off itself. The buffer read after it is the one that code left, queued once, and only when it holds an
         * event: the list read before would be queued a second time, and the events added meanwhile dropped. */
        PyObject *fresh = PyList_New(0);
        if (fresh == NULL)
            goto out;
        Py_DECREF(buf);
        buf = attrs_get(w, s_buf);
        if (buf == NULL) {
            Py_DECREF(fresh);
            return -1;
        }
        int set = PyList_CheckExact(buf) ? attrs_set(w, s_buf, fresh) : -1;
        Py_DECREF(fresh);
        if (set < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "writer._buf is not a list");
            goto out;
        }
        if (PyList_GET_SIZE(buf)) {
            PyObject *q = attrs_get(w, s_q);
            if (q == NULL)
                goto out;
            PyObject *r = PyObject_CallMethodOneArg(q, s_put, buf);
            Py_DECREF(q);
            if (r == NULL)
                goto out;
            Py_DECREF(r);
        }
    }
    rc = 0;
out:
    Py_DECREF(buf);
    return rc;
}

static void
drop_items(PyObject **items, PyObject **local, Py_ssize_t n)
{
    if (items == NULL)
        return;
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(items[i]);
    if (items != local)
        PyMem_Free(items);
}

/* writer._held: 1, 0, or -1 on error */
static int
held_step(PyObject *w)
{
    PyObject *held = attrs_get(w, s_held);
    if (held == NULL)
        return -1;
    int is_held = PyObject_IsTrue(held);
    Py_DECREF(held);
    return is_held;
}

static PyObject *
jsend(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "send(writer, ev, push)");
        return NULL;
    }
    PyObject *w = args[0], *ev = args[1];
    PyObject *t = (PyObject *)Py_TYPE(ev);
    if (T_record == NULL)
        Py_RETURN_FALSE;
    int is_record = t == T_record, is_construct = t == T_construct;
    if (!is_record && !is_construct && t != T_merge)
        Py_RETURN_FALSE;
    if (PyTuple_GET_SIZE(ev) < (is_construct ? 2 : is_record ? 3 : 4)
        || (!is_construct && PyTuple_GET_ITEM(ev, 2) != Py_None))
        Py_RETURN_FALSE;
    PyObject *jf = NULL, *jbuf = NULL, *op = NULL, *fr = NULL, *out = NULL;
    PyObject *local[16], **items = NULL;
    Py_ssize_t npre = 0;
    int rc, swapped = 0;
    jf = attrs_get(w, s_jf);
    if (jf == NULL || jf == Py_None)
        goto decline;
    jbuf = attrs_get(w, s_jbuf);
    if (jbuf == NULL || !PyList_CheckExact(jbuf))
        goto decline;
    if (is_construct) {  /* goes with the next record: that of this module's call or of one inside it */
        op = PyTuple_Pack(3, V_construct, PyTuple_GET_ITEM(ev, 0), PyTuple_GET_ITEM(ev, 1));
        if (op == NULL || (fr = jframe(NULL, op)) == NULL)
            goto decline;  /* ValueError: marshal does not take the parent, which the Python path reports */
        if (PyList_Append(jbuf, fr) < 0)
            goto decline;
        Py_CLEAR(jf);
        Py_CLEAR(jbuf);
        Py_CLEAR(op);
        Py_CLEAR(fr);
        if ((rc = held_step(w)) < 0 || (!rc && hand_off(w, ev, args[2]) < 0))
            return NULL;
        Py_RETURN_TRUE;
    }
    PyObject *verb = V_set;
    if (!is_record) {
        int move = PyObject_IsTrue(PyTuple_GET_ITEM(ev, 3));
        if (move < 0)
            goto decline;
        verb = move ? V_move : V_merge;
    }
    op = PyTuple_Pack(3, verb, PyTuple_GET_ITEM(ev, 0), PyTuple_GET_ITEM(ev, 1));
    if (op == NULL)
        goto decline;
    /* The waiting frames taken from the writer, as send() joins and clears them: its list swapped for a new one (the
     * only allocation here, made before anything is read: a collection it runs may call Python code that changes the
     * list), their references held in an array of our own; put back in front of any added meanwhile where the
     * journal refuses them. A collection's callback or a signal handler (which may run where marshal allocates) then
     * finds the writer's list as send() in Python leaves it, and frees no frame this call still reads. */
    npre = PyList_GET_SIZE(jbuf);
    if (npre) {
        PyObject *fresh = PyList_New(0);
        if (fresh == NULL)
            goto decline;
        Py_DECREF(jbuf);
        jbuf = attrs_get(w, s_jbuf);  /* again: the allocation may have run Python code */
        if (jbuf == NULL || !PyList_CheckExact(jbuf) || attrs_set(w, s_jbuf, fresh) < 0) {
            Py_DECREF(fresh);
            goto decline;
        }
        Py_DECREF(fresh);
        swapped = 1;  /* jbuf is no longer the writer's: what it holds is this call's */
        npre = PyList_GET_SIZE(jbuf);
        items = npre <= 16 ? local : PyMem_Malloc(npre * sizeof(PyObject *));
        if (items == NULL) {
            npre = 0;
            goto put_back;
        }
        for (Py_ssize_t i = 0; i < npre; i++)
            items[i] = NEW_REF(PyList_GET_ITEM(jbuf, i));
    }
    rc = put_frames(jf, items, npre, op);
    if (rc <= 0)
        goto put_back;
    /* journaled: from here on the record is sent, and an error is the caller's */
    PyObject *sent = attrs_get(w, s_sent);
    if (sent == NULL)
        goto done;
    PyObject *more = PyNumber_Add(sent, V_one);
    Py_DECREF(sent);
    if (more == NULL)
        goto done;
    rc = attrs_set(w, s_sent, more);
    Py_DECREF(more);
    if (rc < 0)
        goto done;
    int is_held = held_step(w);
    if (is_held < 0)
        goto done;
    if (is_held) {  /* a held step's record is its journal's alone unless the triggers look at it */
        int see = triggers_see(w, ev, t);
        if (see < 0)
            goto done;
        if (!see) {
            out = NEW_REF(Py_True);
            goto done;
        }
    }
    PyObject *u = PyObject_CallOneArg(F_untrack, ev);
    if (u == NULL)
        goto done;
    Py_DECREF(u);
    if (hand_off(w, ev, args[2]) < 0)
        goto done;
    out = NEW_REF(Py_True);
done:
    drop_items(items, local, npre);
    Py_XDECREF(jf);
    Py_XDECREF(jbuf);
    Py_XDECREF(op);
    return out;
put_back:  /* declined after the swap: the taken frames go back in front of the writer's list */
    drop_items(items, local, npre);
    items = NULL;
    PyErr_Clear();
    if (swapped) {
        PyObject *now = attrs_get(w, s_jbuf);
        if (now == NULL || !PyList_CheckExact(now) || PyList_SetSlice(now, 0, 0, jbuf) < 0) {
            Py_XDECREF(now);
            PyErr_Clear();
            if (attrs_set(w, s_jbuf, jbuf) < 0)  /* the taken frames alone rather than none */
                PyErr_Clear();
        } else {
            Py_DECREF(now);
        }
    }
decline:
    PyErr_Clear();
    Py_XDECREF(jf);
    Py_XDECREF(jbuf);
    Py_XDECREF(op);
    Py_XDECREF(fr);
    Py_RETURN_FALSE;
}

/* an event as made(type, items) makes it: the named tuple's instance by the type's allocator, without its Python
 * __new__ (a frame) */
static PyObject *
made_event(PyTypeObject *tp, PyObject *const *items, Py_ssize_t n)
{
    PyObject *ev = tp->tp_alloc(tp, n);
    if (ev == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(ev, i, NEW_REF(items[i]));
    return ev;
}

/* stack(writer, key, known) -> bool: DumpWriter.stack's tail for a call whose stack is known (known: its (id, text,
 * frames)), the caller holding the hand-off lock. While the step has a journal, the stack's definition (once per
 * journal, jf.stacks) and the call's stack frame wait in writer._jbuf for the next record's put; unless the step is
 * held, a Stack event (key, text) is handed off as send() hands off an event. False, having changed nothing: no
 * Stack type given to send_setup, or a journal or frame the Python path handles (it raises where marshal does). */
static PyObject *
jstack(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "stack(writer, key, known)");
        return NULL;
    }
    PyObject *w = args[0], *key = args[1], *known = args[2];
    if (T_stack == NULL || !PyTuple_CheckExact(known) || PyTuple_GET_SIZE(known) < 2)
        Py_RETURN_FALSE;
    PyObject *sid = PyTuple_GET_ITEM(known, 0), *text = PyTuple_GET_ITEM(known, 1);
    PyObject *jf = attrs_get(w, s_jf);
    if (jf == NULL)
        return NULL;
    if (jf != Py_None) {
        PyObject *stacks = attrs_get(jf, s_stacks), *jbuf = attrs_get(w, s_jbuf);
        PyObject *op = NULL, *def = NULL, *use = NULL;
        int has = -1, rc = -1;
        Py_DECREF(jf);
        if (stacks == NULL || jbuf == NULL || !PySet_CheckExact(stacks) || !PyList_CheckExact(jbuf)
            || (has = PySet_Contains(stacks, sid)) < 0)
            goto no;
        if (!has && ((op = PyTuple_Pack(3, V_stackdef, sid, text)) == NULL || (def = jframe(NULL, op)) == NULL))
            goto no;
        Py_CLEAR(op);
        if ((op = PyTuple_Pack(3, V_stack, key, sid)) == NULL || (use = jframe(NULL, op)) == NULL)
            goto no;
        /* both frames built: from here the Python path's steps, an error the caller's */
        rc = (!has && (PySet_Add(stacks, sid) < 0 || PyList_Append(jbuf, def) < 0)) || PyList_Append(jbuf, use) < 0
            ? -2 : 0;
    no:
        Py_XDECREF(stacks);
        Py_XDECREF(jbuf);
        Py_XDECREF(op);
        Py_XDECREF(def);
        Py_XDECREF(use);
        if (rc == -2)
            return NULL;
        if (rc < 0) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        int is_held = held_step(w);
        if (is_held < 0)
            return NULL;
        if (is_held)  /* as send() does with a Stack: a held step's stacks are its journal's alone */
            Py_RETURN_TRUE;
    } else {
        Py_DECREF(jf);
    }
    PyObject *items[2] = {key, text};
    PyObject *ev = made_event((PyTypeObject *)T_stack, items, 2);
    if (ev == NULL)
        return NULL;
    int rc = hand_off(w, ev, Py_False);
    Py_DECREF(ev);
    if (rc < 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* stack_at(writer, key, skip) -> bool: DumpWriter.stack for a stack seen before, in one call from the recording
 * frame: the frame `skip` levels above the caller's (sys._getframe(skip) there), its signature's words by
 * _stacksig's walk (the words _stacksig.sig makes bytes of), and under the writer's hand-off lock (_blk) their lookup
 * in writer._stacks (a _stacksig.Table by the words, a dict by their bytes) and jstack's tail. False, having changed
 * nothing: no setup, a stack not seen before (DumpWriter.stack formats it), or a journal jstack leaves to the Python
 * path. An error is the caller's, the lock released. */
static PyObject *s_blk, *s_wstacks, *s_acquire, *s_release;
static StackSigAPI *SAPI; /* _stacksig's walk and table lookup, set by stack_setup given its sig */


/* ---- the hand-off lock (DumpWriter._blk): a reentrant lock the journal's C takes inline ----
 * threading.RLock's acquire parses its arguments at every call, empty or not (from C, with the method's lookup, ~700
 * instructions; a recorded call takes the lock three times, and Python's `with` pays the same). This one keeps RLock's
 * semantics for what the writer does with it: reentrant (a signal handler's flush on the thread inside a send),
 * owned by one thread, released by its owner only, its repr RLock's. Its state is read and changed with the GIL held
 * only; a blocking wait gives the GIL back (the holder needs it to finish). Unlike RLock's, that wait is not
 * interrupted by a signal. A holder keeps it for one hand-off, with one exception: SIGTERM's flush, run inside a send,
 * waits for the writer thread (up to its timeout) holding it; the writer thread's own wait is bounded for that. */
#include <pythread.h>

typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    unsigned long owner;
    unsigned long count;
} HLock;

static PyTypeObject HLock_type;

/* the lock taken: 1; not taken: 0 (us 0: a try that found it held; us > 0: a wait that timed out); us -1 waits as
 * long as it takes. A wait gives the GIL back. */
static int
hlock_take(HLock *h, PY_TIMEOUT_T us)
{
    unsigned long me = PyThread_get_thread_ident();
    if (h->count > 0 && h->owner == me) {
        h->count++;
        return 1;
    }
    if (!PyThread_acquire_lock(h->lock, NOWAIT_LOCK)) {
        if (us == 0)
            return 0;
        PyLockStatus got;
        Py_BEGIN_ALLOW_THREADS
        got = PyThread_acquire_lock_timed(h->lock, us, 0);
        Py_END_ALLOW_THREADS
        if (got != PY_LOCK_ACQUIRED)
            return 0;
    }
    h->owner = me;
    h->count = 1;
    return 1;
}

/* one level released by its owner: 0; -1, no error set, where this thread does not hold it */
static int
hlock_drop(HLock *h)
{
    if (h->count == 0 || h->owner != PyThread_get_thread_ident())
        return -1;
    if (--h->count == 0) {
        h->owner = 0;
        PyThread_release_lock(h->lock);
    }
    return 0;
}

static int
hlock_give(HLock *h)
{
    if (hlock_drop(h) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return -1;
    }
    return 0;
}

static PyObject *
hlock_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    HLock *h = (HLock *)tp->tp_alloc(tp, 0);
    if (h == NULL)
        return NULL;
    h->lock = PyThread_allocate_lock();
    if (h->lock == NULL) {
        Py_DECREF(h);
        return PyErr_NoMemory();
    }
    return (PyObject *)h;
}

static void
hlock_dealloc(HLock *h)
{
    if (h->lock != NULL) {
        if (h->count > 0)
            PyThread_release_lock(h->lock);
        PyThread_free_lock(h->lock);
    }
    Py_TYPE(h)->tp_free((PyObject *)h);
}

/* acquire(blocking=True, timeout=-1): RLock's */
static PyObject *
hlock_acquire(HLock *h, PyObject *const *a, Py_ssize_t n, PyObject *kwnames)
{
    PyObject *blocking_o = NULL, *timeout_o = NULL;
    Py_ssize_t nk = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    if (n > 2) {
        PyErr_SetString(PyExc_TypeError, "acquire(blocking=True, timeout=-1): two arguments at most");
        return NULL;
    }
    if (n > 0)
        blocking_o = a[0];
    if (n > 1)
        timeout_o = a[1];
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        PyObject **slot = PyUnicode_CompareWithASCIIString(k, "blocking") == 0 ? &blocking_o
                          : PyUnicode_CompareWithASCIIString(k, "timeout") == 0 ? &timeout_o : NULL;
        if (slot == NULL || *slot != NULL) {
            PyErr_Format(PyExc_TypeError, "acquire(): unexpected or repeated argument %R", k);
            return NULL;
        }
        *slot = a[n + i];
    }
    int blocking = 1;
    if (blocking_o != NULL && (blocking = PyObject_IsTrue(blocking_o)) < 0)
        return NULL;
    double timeout = -1;
    if (timeout_o != NULL && (timeout = PyFloat_AsDouble(timeout_o)) == -1 && PyErr_Occurred())
        return NULL;
    /* checked in RLock's order: the timeout's value first, then what the call asks of it */
    if (Py_IS_NAN(timeout)) {
        PyErr_SetString(PyExc_ValueError, "Invalid value NaN (not a number)");
        return NULL;
    }
    /* microseconds, rounded up as RLock's: a timeout short of one still waits one; too large either way (an infinite
     * one too) overflows as RLock's conversion does, before the value's sign is looked at */
    double want = ceil(timeout * 1e6);
    if (!(fabs(want) < (double)PY_TIMEOUT_MAX)) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return NULL;
    }
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    PY_TIMEOUT_T us = !blocking ? 0 : timeout < 0 ? -1 : (PY_TIMEOUT_T)want;
    return PyBool_FromLong(hlock_take(h, us));
}

static PyObject *
hlock_enter(HLock *h, PyObject *unused)
{
    hlock_take(h, -1);
    Py_RETURN_TRUE;
}

static PyObject *
hlock_release(HLock *h, PyObject *unused)
{
    if (hlock_give(h) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
hlock_exit(HLock *h, PyObject *const *a, Py_ssize_t n)
{
    return hlock_release(h, NULL);
}

static PyObject *
hlock_repr(HLock *h)
{
    /* as threading.RLock's */
    return PyUnicode_FromFormat("<%s %s object owner=%lu count=%lu at %p>", h->count ? "locked" : "unlocked",
                                Py_TYPE(h)->tp_name, h->owner, h->count, h);
}

static PyMethodDef hlock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))hlock_acquire, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"__enter__", (PyCFunction)hlock_enter, METH_NOARGS, NULL},
    {"release", (PyCFunction)hlock_release, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))hlock_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HLock_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_inject.dumpformat._jput.HandOffLock",
    .tp_basicsize = sizeof(HLock),
    .tp_dealloc = (destructor)hlock_dealloc,
    .tp_repr = (reprfunc)hlock_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = hlock_methods,
    .tp_new = hlock_new,
};

/* lock.release(), the error in flight kept; a release that fails: its error instead, and -1 */
static int
release_keeping(PyObject *lock)
{
    if (Py_IS_TYPE(lock, &HLock_type) && hlock_drop((HLock *)lock) == 0)
        return 0;
    /* another lock, or this one no longer held by this thread (a callback under it released it): its release()
     * and the error that raises */
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
#endif
    PyObject *got = PyObject_CallMethodNoArgs(lock, s_release);
    if (got == NULL) {
#if PY_VERSION_HEX >= 0x030C0000
        Py_XDECREF(exc);
#else
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(tb);
#endif
        return -1;
    }
    Py_DECREF(got);
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(et, ev, tb);
#endif
    return 0;
}

/* the writer's hand-off lock (w._blk) acquired: a new reference to it, for release_keeping; NULL with the error */
static PyObject *
acquire_blk(PyObject *w)
{
    PyObject *lock = attrs_get(w, s_blk);
    if (lock != NULL && Py_IS_TYPE(lock, &HLock_type)) {
        hlock_take((HLock *)lock, -1);
        return lock;
    }
    PyObject *got = lock == NULL ? NULL : PyObject_CallMethodNoArgs(lock, s_acquire);
    if (got == NULL) {
        Py_XDECREF(lock);
        return NULL;
    }
    Py_DECREF(got);
    return lock;
}

static PyObject *
jstack_at(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "stack_at(writer, key, skip)");
        return NULL;
    }
    PyObject *w = args[0], *key = args[1];
    if (SAPI == NULL || T_stack == NULL)
        Py_RETURN_FALSE;
    long skip = PyLong_AsLong(args[2]);
    if (skip < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "stack_at: skip >= 0");
        return NULL;
    }
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    for (long i = 0; i < skip && f != NULL; i++) {
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    if (f == NULL)
        Py_RETURN_FALSE;
    /* the signature's words on this C stack, looked up in the writer's _stacksig.Table as they are; its bytes made
     * only for a table of another type (a dict) */
    uint64_t local[2 * STACKSIG_LOCAL];
    size_t n = 0;
    uint64_t *words = SAPI->walk(f, local, &n);
    Py_DECREF(f);
    if (words == NULL)
        return NULL;
    PyObject *sig = NULL, *lock = acquire_blk(w), *stacks = NULL, *known = NULL, *res = NULL;
    if (lock == NULL)
        goto done;
    if ((stacks = attrs_get(w, s_wstacks)) != NULL) {
        if (Py_IS_TYPE(stacks, SAPI->table_type)) {
            known = SAPI->find(stacks, words, n);
        } else if (!PyDict_CheckExact(stacks)) {
            res = NEW_REF(Py_False);
        } else if ((sig = PyBytes_FromStringAndSize((const char *)words, (Py_ssize_t)(sizeof(uint64_t) * 2 * n)))
                   != NULL) {
            known = PyDict_GetItemWithError(stacks, sig);
        }
        if (known != NULL) {
            PyObject *a[3] = {w, key, known};
            Py_INCREF(known); /* held while jstack runs: it may hand off, and so run a queue's Python code */
            res = jstack(self, a, 3);
            Py_DECREF(known);
        } else if (res == NULL && !PyErr_Occurred()) {
            res = NEW_REF(Py_False);
        }
        Py_DECREF(stacks);
    }
    /* the lock is released whatever happened, the error kept */
    int released = release_keeping(lock);
    Py_DECREF(lock);
    if (released < 0)
        Py_CLEAR(res);
done:
    Py_XDECREF(sig);
    if (words != local)
        PyMem_Free(words);
    return res;
}

/* post(writer, type, *fields) -> None: writer.send(made(type, fields)) in one call, the recorders' form of sending a
 * Record, Merge or Construct. The event is made as tuple.__new__ makes a named tuple (the type's allocator, then the
 * fields); where the writer's class has DumpWriter's own send (post_setup; a send set on the writer object itself is
 * not looked for), its first step runs here (under the hand-off lock, the common record journaled and handed off:
 * jsend, whatever writer._csend is); what that declines, and a writer whose class has another send (a subclass's, a
 * diagnostic's), goes through writer.send, which takes the lock again. An error is the caller's, the lock released. */
static PyObject *F_wsend, *s_send;

static PyObject *
jpost(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 6 || !PyType_Check(args[1]) || !PyType_IsSubtype((PyTypeObject *)args[1], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "post(writer, type, *fields): type a tuple's subclass, 1 to 4 fields");
        return NULL;
    }
    PyObject *w = args[0];
    PyObject *ev = made_event((PyTypeObject *)args[1], args + 2, nargs - 2);
    if (ev == NULL)
        return NULL;
    int taken = 0;
    if (F_wsend != NULL && _PyType_Lookup(Py_TYPE(w), s_send) == F_wsend) {
        PyObject *lock = acquire_blk(w);
        if (lock == NULL) {
            Py_DECREF(ev);
            return NULL;
        }
        PyObject *a[3] = {w, ev, Py_False};
        PyObject *r = jsend(self, a, 3);
        taken = r == NULL ? -1 : r == Py_True;
        Py_XDECREF(r);
        /* the lock is released whatever happened, the error kept */
        if (release_keeping(lock) < 0)
            taken = -1;
        Py_DECREF(lock);
    }
    if (taken == 0) {
        PyObject *r = PyObject_CallMethodOneArg(w, s_send, ev);
        taken = r == NULL ? -1 : 1;
        Py_XDECREF(r);
    }
    Py_DECREF(ev);
    if (taken < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* post_setup(send): DumpWriter.send, whose first step post runs itself for a writer whose class has it */
static PyObject *
jpost_setup(PyObject *self, PyObject *send)
{
    return set_callable(&F_wsend, send, "post_setup(send)");
}

/* stack_setup(sig): the writer's stack signature; stack_at takes _stacksig's walk where sig is that module's own
 * (the same words), and declines any other (DumpWriter.stack calls it) */
static PyObject *
jstack_setup(PyObject *self, PyObject *sig)
{
    if (!PyCallable_Check(sig)) {
        PyErr_SetString(PyExc_TypeError, "stack_setup(sig)");
        return NULL;
    }
    StackSigAPI *api = stacksig_api_import();
    PyObject *m = api != NULL ? PyImport_ImportModule("msprobe_inject._stacksig") : NULL;
    PyObject *own = m != NULL ? PyObject_GetAttrString(m, "sig") : NULL;
    SAPI = own == sig ? api : NULL;
    Py_XDECREF(own);
    Py_XDECREF(m);
    PyErr_Clear();
    Py_RETURN_NONE;
}

/* attr_misses(): this module's reads that went through the attribute protocol (_attrs.h), for its tests */
static PyObject *
jattr_misses(PyObject *self, PyObject *unused)
{
    return PyLong_FromSsize_t(attrs_misses);
}

static PyMethodDef methods[] = {
    {"attr_misses", jattr_misses, METH_NOARGS,
     "attr_misses(): how many of this module's attribute reads went through the attribute protocol so far"},
    {"put", (PyCFunction)(void (*)(void))jput, METH_FASTCALL,
     "put(jf, pre, op) -> bool: append pre and op's frame to the journal jf (see the module's comment)."},
    {"frame", (PyCFunction)jframe, METH_O, "frame(op) -> bytes: op's journal frame (journal.frame)."},
    {"send", (PyCFunction)(void (*)(void))jsend, METH_FASTCALL,
     "send(writer, ev, push) -> bool: DumpWriter.send's common case (see the comment above jsend)."},
    {"send_setup", (PyCFunction)(void (*)(void))jsend_setup, METH_FASTCALL,
     "send_setup(Record, Merge, Construct, untrack, batch[, Stack]): the writer's event types, untrack and batch size "
     "for send and stack."},
    {"stack", (PyCFunction)(void (*)(void))jstack, METH_FASTCALL,
     "stack(writer, key, known) -> bool: DumpWriter.stack's tail for a known stack (see the comment above jstack)."},
    {"stack_at", (PyCFunction)(void (*)(void))jstack_at, METH_FASTCALL,
     "stack_at(writer, key, skip) -> bool: DumpWriter.stack for a stack seen before (see the comment above "
     "jstack_at)."},
    {"stack_setup", (PyCFunction)jstack_setup, METH_O, "stack_setup(sig): the stack signature stack_at takes."},
    {"post", (PyCFunction)(void (*)(void))jpost, METH_FASTCALL,
     "post(writer, type, *fields): writer.send(made(type, fields)) in one call (see the comment above jpost)."},
    {"post_setup", (PyCFunction)jpost_setup, METH_O, "post_setup(send): DumpWriter.send, which post runs itself."},
    {"see_setup", (PyCFunction)jsee_setup, METH_O,
     "see_setup(nonfinite): the C walk for a non-finite statistic (None where it declines) that send asks of a held "
     "step's records before writer._triggers_see."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jput", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__jput(void)
{
    if ((EAPI = entry_api_import()) != NULL) /* none without _jenc: then no entry is made either */
        Entry_type = EAPI->type;
    s_mm = PyUnicode_InternFromString("mm");
    s_pos = PyUnicode_InternFromString("pos");
    s_busy = PyUnicode_InternFromString("busy");
    s_jf = PyUnicode_InternFromString("_jf");
    s_held = PyUnicode_InternFromString("_held");
    s_jbuf = PyUnicode_InternFromString("_jbuf");
    s_buf = PyUnicode_InternFromString("_buf");
    s_q = PyUnicode_InternFromString("_q");
    s_sent = PyUnicode_InternFromString("records_sent");
    s_see = PyUnicode_InternFromString("_triggers_see");
    s_flight = PyUnicode_InternFromString("flight");
    s_spike_re = PyUnicode_InternFromString("spike_re");
    s_spike_match = PyUnicode_InternFromString("_spike_match");
    s_follows = PyUnicode_InternFromString("follows");
    if (!s_flight || !s_spike_re || !s_spike_match || !s_follows)
        return NULL;
    s_put = PyUnicode_InternFromString("put");
    V_set = PyUnicode_InternFromString("set");
    V_merge = PyUnicode_InternFromString("merge");
    V_move = PyUnicode_InternFromString("move");
    V_construct = PyUnicode_InternFromString("construct");
    V_stack = PyUnicode_InternFromString("stack");
    V_stackdef = PyUnicode_InternFromString("stackdef");
    s_stacks = PyUnicode_InternFromString("stacks");
    V_one = PyLong_FromLong(1);
    s_blk = PyUnicode_InternFromString("_blk");
    s_wstacks = PyUnicode_InternFromString("_stacks");
    s_acquire = PyUnicode_InternFromString("acquire");
    s_release = PyUnicode_InternFromString("release");
    s_send = PyUnicode_InternFromString("send");
    if (!s_blk || !s_wstacks || !s_acquire || !s_release || !s_send)
        return NULL;
    if (!s_mm || !s_pos || !s_busy || !s_jf || !s_held || !s_jbuf || !s_buf || !s_q || !s_sent || !s_see || !s_put
        || !V_set || !V_merge || !V_move || !V_construct || !V_stack || !V_stackdef || !s_stacks || !V_one)
        return NULL;
    if (PyType_Ready(&HLock_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
#ifndef Py_GIL_DISABLED
    /* its state is guarded by the GIL: without one the writer keeps threading.RLock */
    Py_INCREF(&HLock_type);
    if (PyModule_AddObject(m, "HandOffLock", (PyObject *)&HLock_type) < 0) {
        Py_DECREF(&HLock_type);
        Py_DECREF(m);
        return NULL;
    }
#endif
    return m;
}
