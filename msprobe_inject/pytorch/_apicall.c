/* A recorded call's common case in one C call: DumpMode.__torch_function__'s body and ApiHooks.call_api's steps
 * without their interpreter frames (about 330 bytecode instructions per recorded call); below them, a module call's
 * at the monitor preset and a parameter gradient's (module_pre, module_post, param_grad).
 *
 * call(mode, func, args, kwargs) -> the call's output, or the module's SLOW sentinel before the user's call has run
 * and before anything is recorded (a Python function's respelled arguments may have been asked of apinames.respell,
 * which only keeps a plan): the Python body then runs the call as it always did (apis.py stays the owner of what a
 * recorded call is; this is the same steps, spelled in C for the case most calls are). The case taken here: a
 * callable resolve() has already named (DumpMode.known, or an operator's calling instruction in ApiHooks._sites),
 * listed, not Distributed or NPU, no out= buffer, the session running in this process, no filters, no tensor files,
 * inputs, outputs and the forward direction recorded, the encoder's C entries on. A callable known as no API, and a
 * call inside the tool or inside a recorded API, is called through here too.
 *
 * backward(hooks, bkey, record, grad_inputs, grad_outputs): the node post-hook that call registers on a plain tensor
 * output (hooks._backward_c, the first argument bound): ApiHooks._on_backward's steps and Recorder.backward_record's
 * common case (the encoder's C entries, no tensor files; any other case the method's), the same record.
 *
 * What is asked of the recorder, session, encoder and writer is asked as the Python does (their attributes, each
 * call): a setting that changes between calls is seen by the next one. The functions given to setup() are used as
 * given: rebinding apis.py's names later changes the Python path alone. The frames: this runs in
 * __torch_function__'s frame, so a stack skips one frame fewer than call_api's. Errors in the capture are the
 * Python's: an Exception logged through ApiHooks._capture_failed with the record's key, anything else raised; the
 * user's call runs once, outside every quiet section, and its exception is the caller's. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

#include "../_attrs.h"
#include "../_tstate.h"

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *
Py_NewRef(PyObject *o)
{
    Py_INCREF(o);
    return o;
}
#endif

/* 1 where o has the attribute, 0 where not, -1 with an error */
static int
has_attr(PyObject *o, PyObject *name)
{
    PyObject *v;
#if PY_VERSION_HEX >= 0x030D0000
    int r = PyObject_GetOptionalAttr(o, name, &v);
#else
    int r = _PyObject_LookupAttr(o, name, &v);
#endif
    Py_XDECREF(v);
    return r;
}

static PyObject *SLOW, *T_function, *T_tensor, *T_record, *T_construct, *F_hook_after, *F_stack_at,
    *F_grad, *F_enter, *F_leave, *TLS, *F_respell, *M_writer, *V_one, *V_zero;
/* the module hooks are out (ApiHooks.recompute_by_frames): a call inside a backward pass goes to the Python */
static int BY_FRAMES;
static PyObject *F_graph_task;
static PyObject *s_known, *s_hooks, *s_rec, *s_busy, *s_in_api, *s_api_on, *s_session, *s_running, *s_forked,
    *s_api_counts, *s_filters, *s_active, *s_encoder, *s_some_files, *s_entries, *s_ctx, *s_devices, *s_finish,
    *s_fwd, *s_inp, *s_outp, *s_extra, *s_writer, *s_stack, *s_ready_kind, *s_dump, *s_stopped, *s_ensure_open,
    *s_post, *s_construct, *s_bwd, *s_backward_c, *s_register_backward, *s_ended, *s_place, *s_keep,
    *s_backward_record, *s_backward,
    *s_requires_grad, *s_capture_failed, *s_out, *s_distributed, *s_npu, *s_input, *s_output, *s_fields,
    *s_input_args, *s_input_kwargs, *s_encode, *s_dropout, *s_operators, *s_sites, *s_co_name,
    *s_f_lasti, *s_get, *s_parent;

/* an attribute's truth, 1, 0 or -1 with an error, through the protocol: for the objects the attribute cache does not
 * serve (the thread state, a tensor); the recorder's, session's, encoder's and writer's are read with attrs_true */
static int
plain_true(PyObject *o, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static PyObject *
call_through(PyObject *func, PyObject *args, PyObject *kwargs)
{
    return PyObject_Call(func, args, kwargs);
}

/* v's decimal digits written to end at e (room for 21 characters before it); where they begin. "%lld" by hand:
 * snprintf through glibc's positional printf was ~1,200 instructions a key */
static char *
decimal(char *e, long long v)
{
    char *q = e;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        *--q = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--q = '-';
    return q;
}

/* the ASCII parts part[0..n), of lengths len[0..n), joined into one str; a new reference, or NULL with an error */
static PyObject *
ascii_join(const char *const *part, const Py_ssize_t *len, int n)
{
    Py_ssize_t total = 0;
    for (int i = 0; i < n; i++)
        total += len[i];
    PyObject *key = PyUnicode_New(total, 127);
    if (key == NULL)
        return NULL;
    char *dst = (char *)PyUnicode_1BYTE_DATA(key);
    for (int i = 0; i < n; i++) {
        memcpy(dst, part[i], (size_t)len[i]);
        dst += len[i];
    }
    return key;
}

/* names.api_key(base, idx, direction): "{base}{idx}.{direction}", the common case (an ASCII base, an int) joined
 * by hand: PyUnicode_FromFormat parses its format at every call */
static PyObject *
api_key(PyObject *base, PyObject *idx, const char *direction)
{
    if (!PyUnicode_IS_ASCII(base) || !PyLong_CheckExact(idx))
        return PyUnicode_FromFormat("%U%S.%s", base, idx, direction);
    long long v = PyLong_AsLongLong(idx);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    char num[24], *e = num + sizeof num, *q = decimal(e, v);
    const char *part[4] = {(const char *)PyUnicode_1BYTE_DATA(base), q, ".", direction};
    Py_ssize_t len[4] = {PyUnicode_GET_LENGTH(base), e - q, 1, (Py_ssize_t)strlen(direction)};
    return ascii_join(part, len, 4);
}

/* the held error put back after the cleanup call, or the cleanup's error kept if there was none before */
typedef struct {
    PyObject *t, *v, *tb;
} Held;

static void
hold(Held *h)
{
    PyErr_Fetch(&h->t, &h->v, &h->tb);
}

/* 0: no error was held and none raised; -1: an error is set. The held one, unless the cleanup raised what is not an
 * Exception (KeyboardInterrupt, SystemExit): that one, as a Python finally block's would replace the error in flight;
 * a cleanup's Exception gives way to the held error (a quiet section's or a lock's way out failing after the work
 * failed says less than the work's own error). */
static int
restore(Held *h, int cleanup_ok)
{
    if (h->t != NULL) {
        if (!cleanup_ok && !PyErr_ExceptionMatches(PyExc_Exception)) {
            Py_XDECREF(h->t);
            Py_XDECREF(h->v);
            Py_XDECREF(h->tb);
            return -1;
        }
        if (!cleanup_ok)
            PyErr_Clear();
        PyErr_Restore(h->t, h->v, h->tb);
        return -1;
    }
    return cleanup_ok ? 0 : -1;
}

/* enc.encode(value, pending, None) with the encoder's C entries: its fallback (NotImplemented) the Python encode */
static PyObject *
encode(PyObject *enc, PyObject *value, PyObject *pending)
{
    PyObject *ctx = attrs_get(enc, s_ctx), *entries = ctx == NULL ? NULL : attrs_get(enc, s_entries);
    if (entries == NULL) {
        Py_XDECREF(ctx);
        return NULL;
    }
    Py_ssize_t start = PyList_GET_SIZE(pending);
    PyObject *a[3] = {ctx, value, pending};
    PyObject *got = PyObject_Vectorcall(entries, a, 3, NULL);
    Py_DECREF(entries);
    Py_DECREF(ctx);
    /* as encode() does whatever the call did: the device items it queued get their norms */
    Held h;
    hold(&h);
    int ok = 1, dev = attrs_true(enc, s_devices);
    if (dev < 0) {
        ok = 0;
    } else if (dev && PyList_GET_SIZE(pending) > start) {
        PyObject *st = PyLong_FromSsize_t(start);
        PyObject *r = st == NULL ? NULL : PyObject_CallMethodObjArgs(enc, s_finish, pending, st, NULL);
        Py_XDECREF(st);
        ok = r != NULL;
        Py_XDECREF(r);
    }
    if (restore(&h, ok) < 0) {
        Py_XDECREF(got);
        return NULL;
    }
    if (got == Py_NotImplemented) {
        Py_DECREF(got);
        return PyObject_CallMethodObjArgs(enc, s_encode, value, pending, Py_None, NULL);
    }
    return got;
}

/* body[key] = e, a body whose values the collector does not follow left untracked: a dict becomes tracked on the
 * insertion of any list or dict, tracked or not (_fastats leaves those it builds untracked where nothing in them is),
 * and the writer's untrack (_fastats.untrack, per record sent) would walk it again to find that out */
static int
set_flat(PyObject *body, PyObject *key, PyObject *e)
{
    int flat = !PyObject_GC_IsTracked(body) && !PyObject_GC_IsTracked(e);
    int r = PyDict_SetItem(body, key, e);
    if (r == 0 && flat && PyObject_GC_IsTracked(body))
        PyObject_GC_UnTrack(body);
    return r;
}

/* body[key] = the value's entries (encode above) */
static int
put_entries(PyObject *enc, PyObject *body, PyObject *key, PyObject *value, PyObject *pending)
{
    PyObject *e = encode(enc, value, pending);
    if (e == NULL)
        return -1;
    int r = set_flat(body, key, e);
    Py_DECREF(e);
    return r;
}

/* a capture's Exception logged (hooks._capture_failed(stage, exc, key)); a BaseException that is not one stays set */
static int
capture_failed(PyObject *hooks, PyObject *stage, PyObject *key)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL && v != NULL)
        PyException_SetTraceback(v, tb);
    PyObject *r = PyObject_CallMethodObjArgs(hooks, s_capture_failed, stage, v != NULL ? v : Py_None, key, NULL);
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* the steps of one quiet section: enter, body(), leave (the flag and guard put back whatever body did). Where the
 * quiet sections are _tstate's C ones, through its quiet_api on a frame of the caller's (Q_API: no section object,
 * no call through Python); else through the enter and leave given to setup. */
static const quiet_api_v1 *Q_API;
static PyObject *Q_OBJ; /* the Quiet whose sections Q_API enters */

typedef struct {
    quiet_frame f;
    PyObject *sec; /* the section enter() returned, without Q_API */
} Section;

/* 0, or -1 with an error set (nothing entered) */
static int
quiet_enter(Section *q)
{
    if (Q_API != NULL) {
        q->sec = NULL;
        return Q_API->enter(Q_OBJ, &q->f);
    }
    q->sec = PyObject_CallNoArgs(F_enter);
    return q->sec == NULL ? -1 : 0;
}

static int
quiet_leave(Section *q)
{
    Held h;
    hold(&h);
    int ok;
    if (Q_API != NULL)
        ok = Q_API->leave(Q_OBJ, &q->f) == 0;
    else {
        PyObject *r = PyObject_CallOneArg(F_leave, q->sec);
        Py_CLEAR(q->sec);
        ok = r != NULL;
        Py_XDECREF(r);
    }
    return restore(&h, ok);
}

/* the record's inputs: body["input_args"], body["input_kwargs"], and the stack when extra */
static int
capture_inputs(PyObject *rec, PyObject *enc, PyObject *body, PyObject *pending, PyObject *args, PyObject *kwargs,
               PyObject *fkey)
{
    PyObject *lst = PySequence_List(args);
    int r = lst == NULL ? -1 : put_entries(enc, body, s_input_args, lst, pending);
    Py_XDECREF(lst);
    if (r < 0)
        return -1;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyObject *kw = PyDict_Copy(kwargs);
        r = kw == NULL ? -1 : put_entries(enc, body, s_input_kwargs, kw, pending);
        Py_XDECREF(kw);
    } else {
        PyObject *empty = PyDict_New();
        r = empty == NULL ? -1 : set_flat(body, s_input_kwargs, empty);
        Py_XDECREF(empty);
    }
    if (r < 0)
        return -1;
    int extra = attrs_true(rec, s_extra);
    if (extra <= 0)
        return extra;
    PyObject *w = attrs_get(rec, s_writer);
    if (w == NULL)
        return -1;
    int seen = 0;
    if (F_stack_at != Py_None) {
        PyObject *a[3] = {w, fkey, V_one};
        PyObject *got = PyObject_Vectorcall(F_stack_at, a, 3, NULL);
        if (got == NULL) {
            Py_DECREF(w);
            return -1;
        }
        seen = PyObject_IsTrue(got);
        Py_DECREF(got);
        if (seen < 0) {
            Py_DECREF(w);
            return -1;
        }
    }
    if (!seen) {
        PyObject *got = PyObject_CallMethodObjArgs(w, s_stack, fkey, V_one, NULL);
        Py_XDECREF(got);
        if (got == NULL) {
            Py_DECREF(w);
            return -1;
        }
    }
    Py_DECREF(w);
    return 0;
}

/* writer.post(w, type, a0, a1[, a2]): the event made and sent as the recorders send theirs (the writer module's
 * post, read each call: the journal's C where it is built, DumpWriter.send's first step under the hand-off lock) */
static int
send_n(PyObject *const *pa, size_t n)
{
    PyObject *post = PyObject_GetAttr(M_writer, s_post);
    if (post == NULL)
        return -1;
    PyObject *r = PyObject_Vectorcall(post, pa, n, NULL);
    Py_DECREF(post);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static int
send(PyObject *w, PyObject *type, PyObject *a0, PyObject *a1, PyObject *a2)
{
    PyObject *pa[5] = {w, type, a0, a1, a2};
    return send_n(pa, a2 != NULL ? 5 : 4);
}

/* Session.ensure_open's test, as call_api spells it: the step's directory opened where it is not ready for a record */
static int
ensure_open(PyObject *s, PyObject *w)
{
    PyObject *kind = attrs_get(s, s_ready_kind);
    int open = kind == NULL ? -1 : PyObject_RichCompareBool(kind, s_dump, Py_EQ);
    Py_XDECREF(kind);
    if (open == 1) {
        int stopped = attrs_true(w, s_stopped);
        open = stopped < 0 ? -1 : !stopped;
    }
    if (open == 0) {
        PyObject *got = PyObject_CallMethodNoArgs(s, s_ensure_open);
        Py_XDECREF(got);
        open = got == NULL ? -1 : 1;
    }
    return open < 0 ? -1 : 0;
}

/* the values a record's "output" lists: a list's or tuple's items (not a named tuple's), else the value alone; a new
 * list, or NULL with an error */
static PyObject *
output_list(PyObject *out)
{
    int seq = !Py_IS_TYPE(out, (PyTypeObject *)T_tensor) && (PyList_Check(out) || PyTuple_Check(out));
    if (seq) {
        int named = has_attr(out, s_fields);
        if (named < 0)
            return NULL;
        seq = !named;
    }
    if (seq)
        return PySequence_List(out);
    PyObject *value = PyList_New(1);
    if (value == NULL)
        return NULL;
    Py_INCREF(out);
    PyList_SET_ITEM(value, 0, out);
    return value;
}

/* the record's output, the record sent, its tree place, its backward hook */
static int
capture_outputs(PyObject *hooks, PyObject *rec, PyObject *s, PyObject *enc, PyObject *body, PyObject *pending,
                PyObject *out, PyObject *fkey, PyObject *info, PyObject *idx, PyObject *args, PyObject *kwargs)
{
    PyObject *value = output_list(out);
    if (value == NULL)
        return -1;
    int r = put_entries(enc, body, s_output, value, pending);
    Py_DECREF(value);
    if (r < 0)
        return -1;
    PyObject *w = attrs_get(rec, s_writer);
    if (w == NULL)
        return -1;
    if (ensure_open(s, w) < 0 || send(w, T_record, fkey, body, PyList_GET_SIZE(pending) ? pending : Py_None) < 0) {
        Py_DECREF(w);
        return -1;
    }
    int cons = attrs_true(rec, s_construct);
    if (cons > 0) {
        /* the tree place is ApiHooks._parent's rule (asked at the construct levels alone: mix, L0) */
        PyObject *stack = PyObject_GetAttr(TLS, s_stack);
        PyObject *parent = stack == NULL ? NULL : PyObject_CallMethodOneArg(hooks, s_parent, stack);
        Py_XDECREF(stack);
        if (parent == NULL || send(w, T_construct, fkey, parent, NULL) < 0) {
            Py_XDECREF(parent);
            Py_DECREF(w);
            return -1;
        }
        Py_DECREF(parent);
    }
    Py_DECREF(w);
    if (cons < 0)
        return -1;
    /* under no_grad no output has a node to hook */
    int bwd = attrs_true(rec, s_bwd);
    if (bwd <= 0)
        return bwd;
    PyObject *g = PyObject_CallNoArgs(F_grad);
    if (g == NULL)
        return -1;
    int on = PyObject_IsTrue(g);
    Py_DECREF(g);
    if (on <= 0)
        return on;
    PyObject *base = PyTuple_GET_ITEM(info, 0);
    Py_ssize_t drop = PyUnicode_Find(PyTuple_GET_ITEM(info, 3), s_dropout, 0, PY_SSIZE_T_MAX, 1);
    if (drop == -2)
        return -1;
    if (F_hook_after != Py_None && Py_IS_TYPE(out, (PyTypeObject *)T_tensor) && drop < 0) {
        /* _register_backward's common case: a plain tensor, no dropout (whose p the Python asks); the backward
         * record's key made only for an output that has a node to hook */
        int rg = plain_true(out, s_requires_grad);
        if (rg <= 0)
            return rg;
        PyObject *bkey = api_key(base, idx, "backward");
        PyObject *body_fn = bkey == NULL ? NULL : attrs_get(hooks, s_backward_c);
        if (body_fn == NULL) {
            Py_XDECREF(bkey);
            return -1;
        }
        /* the node hook holds the body's arguments itself: no partial made and freed per call */
        PyObject *ha[4] = {out, body_fn, bkey, Py_True};
        PyObject *got = PyObject_Vectorcall(F_hook_after, ha, 4, NULL);
        Py_DECREF(body_fn);
        Py_DECREF(bkey);
        Py_XDECREF(got);
        return got == NULL ? -1 : 0;
    }
    PyObject *bkey = api_key(base, idx, "backward");
    PyObject *kw = bkey == NULL ? NULL : kwargs != NULL ? Py_NewRef(kwargs) : PyDict_New();
    if (kw == NULL) {
        Py_XDECREF(bkey);
        return -1;
    }
    PyObject *got = PyObject_CallMethodObjArgs(hooks, s_register_backward, out, bkey, PyTuple_GET_ITEM(info, 2),
                                               PyTuple_GET_ITEM(info, 3), args, kw, Py_True, NULL);
    Py_DECREF(kw);
    Py_DECREF(bkey);
    Py_XDECREF(got);
    return got == NULL ? -1 : 0;
}

/* the call, in_api set around it (nested APIs pass through), put back whatever the call did */
static PyObject *
run_in_api(PyObject *func, PyObject *args, PyObject *kwargs)
{
    if (PyObject_SetAttr(TLS, s_in_api, Py_True) < 0)
        return NULL;
    PyObject *out = PyObject_Call(func, args, kwargs);
    Held h;
    hold(&h);
    int ok = PyObject_SetAttr(TLS, s_in_api, Py_False) == 0;
    if (restore(&h, ok) < 0) {
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

/* An operator method's info where resolve() has kept it for this calling instruction (ApiHooks._sites, keyed as
 * resolve keys it: the method, the calling code's id, its instruction, whether the second argument is a tensor); NULL
 * without an error where it has not (or the caller is a wrapper whose site resolve() looks further for). */
static PyObject *
operator_site(PyObject *mode, PyObject *func, PyObject *args)
{
    PyObject *hooks = attrs_get(mode, s_hooks), *ops = NULL, *sites = NULL, *code = NULL, *name = NULL,
             *lasti = NULL, *id = NULL, *site = NULL, *info = NULL;
    PyFrameObject *frame = NULL;
    if (hooks == NULL || (ops = attrs_get(hooks, s_operators)) == NULL
        || (sites = attrs_get(hooks, s_sites)) == NULL)
        goto done;
    if (!PyDict_CheckExact(ops) || !PyDict_CheckExact(sites))
        goto done;
    PyObject *op = PyDict_GetItemWithError(ops, func);
    if (op == NULL) {
        if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_TypeError))
            PyErr_Clear();
        goto done;
    }
    /* the frame that called the operator: __torch_function__'s (this call runs in it) caller */
    PyFrameObject *here = PyEval_GetFrame();
    if (here == NULL || (frame = PyFrame_GetBack(here)) == NULL)
        goto done;
    code = (PyObject *)PyFrame_GetCode(frame);
    if ((name = PyObject_GetAttr(code, s_co_name)) == NULL)
        goto done;
    int r = PyUnicode_Check(name) ? PyUnicode_CompareWithASCIIString(name, "wrapped") : 1;
    if (r == 0 || (lasti = PyObject_GetAttr((PyObject *)frame, s_f_lasti)) == NULL
        || (id = PyLong_FromVoidPtr(code)) == NULL)
        goto done;
    int tensor2 = 0;
    if (PyTuple_GET_SIZE(args) > 1 && (tensor2 = PyObject_IsInstance(PyTuple_GET_ITEM(args, 1), T_tensor)) < 0)
        goto done;
    if ((site = PyTuple_Pack(4, func, id, lasti, tensor2 ? Py_True : Py_False)) == NULL)
        goto done;
    PyObject *got = PyDict_GetItemWithError(sites, site);
    if (got != NULL && PyTuple_Check(got) && PyTuple_GET_SIZE(got) > 0)
        info = Py_NewRef(PyTuple_GET_ITEM(got, 0));
done:
    Py_XDECREF(site);
    Py_XDECREF(id);
    Py_XDECREF(lasti);
    Py_XDECREF(name);
    Py_XDECREF(code);
    Py_XDECREF(frame);
    Py_XDECREF(sites);
    Py_XDECREF(ops);
    Py_XDECREF(hooks);
    return info;
}

/* the session's filters in force: 1, 0, or -1 with an error */
static int
filters_active(PyObject *s)
{
    PyObject *filters = attrs_get(s, s_filters);
    if (filters == NULL)
        return -1;
    int r = attrs_true(filters, s_active);
    Py_DECREF(filters);
    return r;
}

/* 1: the common case this module records; 0: the Python's (SLOW); -1: an error */
static int
common(PyObject *func, PyObject *info, PyObject *kwargs, PyObject *rec, PyObject *s, PyObject *enc)
{
    if (!PyTuple_CheckExact(info) || PyTuple_GET_SIZE(info) != 4 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(info, 0))
        || !PyUnicode_Check(PyTuple_GET_ITEM(info, 2)) || !PyUnicode_Check(PyTuple_GET_ITEM(info, 3)))
        return 0;
    int r = PyObject_IsTrue(PyTuple_GET_ITEM(info, 1)); /* listed */
    if (r <= 0)
        return r;
    PyObject *prefix = PyTuple_GET_ITEM(info, 2);
    if ((r = PyObject_RichCompareBool(prefix, s_distributed, Py_EQ)) != 0
        || (r = PyObject_RichCompareBool(prefix, s_npu, Py_EQ)) != 0)
        return r < 0 ? -1 : 0;
    if ((r = attrs_true(s, s_running)) <= 0)
        return r;
    if (kwargs != NULL && (r = PyDict_Contains(kwargs, s_out)) != 0)
        return r < 0 ? -1 : 0;
    if ((r = attrs_true(rec, s_forked)) != 0 || (r = filters_active(s)) != 0)
        return r < 0 ? -1 : 0;
    if ((r = attrs_true(enc, s_some_files)) != 0)
        return r < 0 ? -1 : 0;
    PyObject *entries = attrs_get(enc, s_entries);
    if (entries == NULL)
        return -1;
    r = entries != Py_None;
    Py_DECREF(entries);
    if (r == 0)
        return 0;
    if ((r = attrs_true(rec, s_fwd)) <= 0 || (r = attrs_true(rec, s_inp)) <= 0 || (r = attrs_true(rec, s_outp)) <= 0)
        return r;
    return 1;
}

/* call(mode, func, args, kwargs): see the top of this file */
static PyObject *
apicall_call(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "call(mode, func, args, kwargs)");
        return NULL;
    }
    if (SLOW == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_apicall.call before _apicall.setup");
        return NULL;
    }
    PyObject *mode = a[0], *func = a[1], *args = a[2], *kwargs = a[3];
    if (!PyTuple_Check(args) || (kwargs != Py_None && !PyDict_Check(kwargs)))
        return Py_NewRef(SLOW);
    if (kwargs == Py_None)
        kwargs = NULL;
    PyObject *known = attrs_get(mode, s_known);
    if (known == NULL)
        return NULL;
    if (!PyDict_CheckExact(known)) {
        Py_DECREF(known);
        return Py_NewRef(SLOW);
    }
    PyObject *info = PyDict_GetItemWithError(known, func);
    Py_XINCREF(info);
    Py_DECREF(known);
    if (info == NULL) {
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError))
                return NULL;
            PyErr_Clear(); /* an unhashable callable: resolve() says what it is */
            return Py_NewRef(SLOW);
        }
        if ((info = operator_site(mode, func, args)) == NULL)
            return PyErr_Occurred() ? NULL : Py_NewRef(SLOW);
    }
    if (info == Py_None) {
        Py_DECREF(info);
        return call_through(func, args, kwargs);
    }
    PyObject *hooks = NULL, *rec = NULL, *s = NULL, *enc = NULL, *body = NULL, *pending = NULL, *fkey = NULL,
             *idx = NULL, *out = NULL, *res = NULL, *in_args = NULL, *in_kwargs = NULL;
    int r = plain_true(TLS, s_busy);
    if (r == 0)
        r = plain_true(TLS, s_in_api);
    if (r != 0)
        goto through;
    if (BY_FRAMES) { /* the module hooks are out: a call inside a backward pass may be a recomputation, the Python's */
        PyObject *g = F_graph_task != NULL ? PyObject_CallNoArgs(F_graph_task) : NULL;
        long task = g != NULL ? PyLong_AsLong(g) : -2;
        Py_XDECREF(g);
        if (task != -1) {
            PyErr_Clear();
            res = Py_NewRef(SLOW);
            goto done;
        }
    }
    if ((hooks = attrs_get(mode, s_hooks)) == NULL || (rec = attrs_get(hooks, s_rec)) == NULL)
        goto done;
    if ((r = attrs_true(rec, s_api_on)) <= 0)
        goto through;
    if ((s = attrs_get(rec, s_session)) == NULL || (enc = attrs_get(rec, s_encoder)) == NULL)
        goto done;
    if ((r = common(func, info, kwargs, rec, s, enc)) <= 0) {
        if (r == 0)
            res = Py_NewRef(SLOW);
        goto done;
    }
    /* a Python function called with keywords (torch's handle_torch_function passes its own split): the caller's
     * positional and keyword arguments for the record (apinames.respell, which __torch_function__'s caller is given) */
    in_args = Py_NewRef(args);
    in_kwargs = kwargs != NULL ? Py_NewRef(kwargs) : NULL;
    if (Py_IS_TYPE(func, (PyTypeObject *)T_function) && kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyFrameObject *here = PyEval_GetFrame();
        PyObject *caller = here != NULL ? (PyObject *)PyFrame_GetBack(here) : NULL;
        PyObject *ra[4] = {func, args, kwargs, caller != NULL ? caller : Py_None};
        PyObject *sp = PyObject_Vectorcall(F_respell, ra, 4, NULL);
        Py_XDECREF(caller);
        if (sp == NULL)
            goto done;
        if (!PyTuple_CheckExact(sp) || PyTuple_GET_SIZE(sp) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(sp, 0))
            || !PyDict_Check(PyTuple_GET_ITEM(sp, 1))) {
            Py_DECREF(sp);
            res = Py_NewRef(SLOW);
            goto done;
        }
        Py_SETREF(in_args, Py_NewRef(PyTuple_GET_ITEM(sp, 0)));
        Py_XSETREF(in_kwargs, Py_NewRef(PyTuple_GET_ITEM(sp, 1)));
        Py_DECREF(sp);
        if ((r = PyDict_Contains(in_kwargs, s_out)) != 0) { /* an out= buffer the Python leaves out of the inputs */
            if (r > 0)
                res = Py_NewRef(SLOW);
            goto done;
        }
    }
    /* the record's name: Session.api_counts holds the calls of each base so far */
    PyObject *base = PyTuple_GET_ITEM(info, 0);
    PyObject *counts = attrs_get(s, s_api_counts);
    if (counts == NULL)
        goto done;
    if (!PyDict_CheckExact(counts)) {
        Py_DECREF(counts);
        res = Py_NewRef(SLOW);
        goto done;
    }
    idx = PyDict_GetItemWithError(counts, base);
    Py_XINCREF(idx);
    Py_DECREF(counts);
    if (idx == NULL) {
        if (PyErr_Occurred())
            goto done;
        idx = PyLong_FromLong(0);
    }
    if (idx == NULL || (fkey = api_key(base, idx, "forward")) == NULL || (body = PyDict_New()) == NULL
        || (pending = PyList_New(0)) == NULL)
        goto done;
    Section sec;
    int in = quiet_enter(&sec) == 0;
    r = !in ? -1 : capture_inputs(rec, enc, body, pending, in_args, in_kwargs, fkey);
    if (in && quiet_leave(&sec) < 0)
        r = -1;
    if (r < 0 && capture_failed(hooks, s_input, fkey) < 0)
        goto done;
    if ((out = run_in_api(func, args, kwargs)) == NULL)
        goto done;
    /* Session.finish_api: the count read again (the session's dict, whatever the call did) */
    counts = attrs_get(s, s_api_counts);
    if (counts == NULL)
        goto done;
    PyObject *cur;
    if (PyDict_CheckExact(counts)) {
        cur = PyDict_GetItemWithError(counts, base);
        Py_XINCREF(cur);
        if (cur == NULL && !PyErr_Occurred())
            cur = PyLong_FromLong(0);
    } else { /* whatever the session holds now: its get, as the Python asks it */
        cur = PyObject_CallMethodObjArgs(counts, s_get, base, V_zero, NULL);
    }
    PyObject *next = cur != NULL ? PyNumber_Add(cur, V_one) : NULL;
    Py_XDECREF(cur);
    r = next == NULL ? -1 : PyObject_SetItem(counts, base, next);
    Py_XDECREF(next);
    Py_DECREF(counts);
    if (r < 0)
        goto done;
    in = quiet_enter(&sec) == 0;
    r = !in ? -1 : capture_outputs(hooks, rec, s, enc, body, pending, out, fkey, info, idx, args, kwargs);
    if (in && quiet_leave(&sec) < 0)
        r = -1;
    if (r < 0 && capture_failed(hooks, s_output, fkey) < 0)
        goto done;
    res = Py_NewRef(out);
    goto done;
through:
    if (r >= 0)
        res = call_through(func, args, kwargs);
done:
    Py_XDECREF(in_kwargs);
    Py_XDECREF(in_args);
    Py_XDECREF(out);
    Py_XDECREF(pending);
    Py_XDECREF(body);
    Py_XDECREF(fkey);
    Py_XDECREF(idx);
    Py_XDECREF(enc);
    Py_XDECREF(s);
    Py_XDECREF(rec);
    Py_XDECREF(hooks);
    Py_DECREF(info);
    return res;
}

/* Recorder.backward_record's common case (the encoder's C entries, no tensor files); any other, the method */
static int
backward_record(PyObject *rec, PyObject *s, PyObject *bkey, PyObject *grad_out, PyObject *grad_in)
{
    PyObject *enc = attrs_get(rec, s_encoder);
    if (enc == NULL)
        return -1;
    int r = attrs_true(enc, s_some_files);
    if (r == 0) {
        PyObject *entries = attrs_get(enc, s_entries);
        r = entries == NULL ? -1 : entries == Py_None;
        Py_XDECREF(entries);
    }
    if (r != 0) {
        Py_DECREF(enc);
        if (r < 0)
            return -1;
        PyObject *got = PyObject_CallMethodObjArgs(rec, s_backward_record, bkey, grad_out, grad_in, NULL);
        Py_XDECREF(got);
        return got == NULL ? -1 : 0;
    }
    PyObject *pending = PyList_New(0), *body = PyDict_New(), *w = NULL;
    r = pending == NULL || body == NULL ? -1 : 0;
    /* "input" holds the gradients arriving (of the outputs), "output" those leaving (of the inputs) */
    PyObject *keys[2] = {s_input, s_output}, *grads[2] = {grad_out, grad_in}, *flags[2] = {s_inp, s_outp};
    for (int i = 0; r == 0 && i < 2; i++) {
        int on = attrs_true(rec, flags[i]);
        if (on <= 0) {
            r = on;
            continue;
        }
        int some = grads[i] == Py_None ? 0 : PyObject_IsTrue(grads[i]);
        PyObject *lst = some < 0 ? NULL : some ? PySequence_List(grads[i]) : PyList_New(0);
        r = lst == NULL ? -1 : put_entries(enc, body, keys[i], lst, pending);
        Py_XDECREF(lst);
    }
    if (r == 0 && ((w = attrs_get(rec, s_writer)) == NULL || ensure_open(s, w) < 0
                   || send(w, T_record, bkey, body, PyList_GET_SIZE(pending) ? pending : Py_None) < 0))
        r = -1;
    Py_XDECREF(w);
    Py_XDECREF(body);
    Py_XDECREF(pending);
    Py_DECREF(enc);
    return r;
}

/* ApiHooks._on_backward's steps in its quiet section: the tree place, the record where the filters keep it */
static int
backward_body(PyObject *rec, PyObject *s, PyObject *bkey, PyObject *record, PyObject *grad_in, PyObject *grad_out)
{
    int r = attrs_true(rec, s_construct);
    if (r > 0) {
        PyObject *stack = PyObject_GetAttr(TLS, s_stack), *got = NULL;
        int some = stack == NULL ? -1 : PyObject_IsTrue(stack);
        PyObject *parent = some < 0 ? NULL : some ? PySequence_GetItem(stack, -1) : Py_NewRef(Py_None);
        if (parent != NULL)
            got = PyObject_CallMethodObjArgs(rec, s_place, bkey, parent, NULL);
        Py_XDECREF(parent);
        Py_XDECREF(stack);
        Py_XDECREF(got);
        r = got == NULL ? -1 : 0;
    }
    if (r < 0 || (r = PyObject_IsTrue(record)) <= 0)
        return r;
    r = filters_active(s);
    if (r > 0) {
        PyObject *enclosing = PyList_New(0);
        PyObject *got = enclosing == NULL ? NULL : PyObject_CallMethodObjArgs(rec, s_keep, bkey, enclosing, NULL);
        Py_XDECREF(enclosing);
        r = got == NULL ? -1 : PyObject_IsTrue(got);
        Py_XDECREF(got);
        if (r <= 0)
            return r;
    }
    if (r < 0)
        return -1;
    return backward_record(rec, s, bkey, grad_out, grad_in);
}

/* backward(hooks, bkey, record, grad_inputs, grad_outputs): ApiHooks._on_backward, the node post-hook of a call
 * this module recorded (hooks._backward_c binds the first argument), spelled in C with Recorder.backward_record's
 * common case. Returns None (the gradients unchanged); a capture's Exception is logged with the record's key. */
static PyObject *
apicall_backward(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "backward(hooks, bkey, record, grad_inputs, grad_outputs)");
        return NULL;
    }
    if (SLOW == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_apicall.backward before _apicall.setup");
        return NULL;
    }
    PyObject *hooks = a[0], *bkey = a[1];
    PyObject *rec = attrs_get(hooks, s_rec), *s = NULL;
    int r = rec == NULL ? -1 : plain_true(TLS, s_busy);
    if (r == 0)
        r = attrs_true(rec, s_forked);
    if (r == 0 && (s = attrs_get(rec, s_session)) == NULL)
        r = -1;
    if (r == 0)
        r = attrs_true(s, s_ended);
    if (r == 0) {
        Section sec;
        int in = quiet_enter(&sec) == 0;
        r = !in ? -1 : backward_body(rec, s, bkey, a[2], a[3], a[4]);
        if (in && quiet_leave(&sec) < 0)
            r = -1;
        if (r < 0)
            r = capture_failed(hooks, s_backward, bkey);
    }
    Py_XDECREF(s);
    Py_XDECREF(rec);
    if (r < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- a module call that records its outputs alone ----
 * module_pre(hooks, module, args) and module_post(hooks, module, kwargs, output): ModuleHooks._pre and _post's steps
 * with Recorder.module_enter's and module_exit's, for the case of the monitor preset (a named module, the session
 * running at a module level, no filters, no tensor files, the outputs recorded and nothing else: no inputs, stacks,
 * tree places, parameters or backward capture; not a compiled module); and for a call the tool does not record (an
 * API level's, the session not running, a step outside the range) the depth and frame count _pre and _post keep. None
 * when done; SLOW where the case is another or anything could not be asked, before anything has changed: the Python
 * body then runs the hook as it always did (modules.py and recorder.py stay the owners of what a module record is;
 * the parity tests in tests/inject/pytorch/test_apicall.py compare the two). A failure once the hook has begun to
 * change things is logged as the Python logs it (ModuleHooks._c_failed) and never raised into the user's forward. */
static PyObject *T_frame, *T_merge, *RAISED;
static PyObject *s_named, *s_module_level, *s_api_suspended, *s_module_counts, *s_depth, *s_mframes, *s_module_bwd,
    *s_pgrads, *s_params_on, *s_acc, *s_param_grad_hooks, *s_parameters, *s_fkey, *s_prefix, *s_c_failed,
    *s_pre_failed, *s_hook_failed, *s_token_range;

/* prefix + middle + idx: a forward record's key (names.module_key, middle "forward.") or a parameter gradient's
 * (names.param_grad_key, middle "parameters_grad.") */
static PyObject *
module_key(PyObject *prefix, const char *middle, long long idx)
{
    if (!PyUnicode_IS_ASCII(prefix))
        return PyUnicode_FromFormat("%U%s%lld", prefix, middle, idx);
    char num[24], *e = num + sizeof num, *q = decimal(e, idx);
    const char *part[3] = {(const char *)PyUnicode_1BYTE_DATA(prefix), middle, q};
    Py_ssize_t len[3] = {PyUnicode_GET_LENGTH(prefix), (Py_ssize_t)strlen(middle), e - q};
    return ascii_join(part, len, 3);
}

/* the error set logged through hooks._c_failed(what, exc, key) (key NULL: None), then cleared; a BaseException that
 * is not an Exception (KeyboardInterrupt) stays set: -1 */
static int
module_failed(PyObject *hooks, PyObject *what, PyObject *key)
{
    if (!PyErr_Occurred())
        return 0; /* nothing failed that could be said */
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    PyObject *r = PyObject_CallMethodObjArgs(hooks, s_c_failed, what, v != NULL ? v : Py_None,
                                             key != NULL ? key : Py_None, NULL);
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear(); /* the log itself failed: nothing more can be said, and nothing reaches the forward */
    }
    Py_XDECREF(r);
    return 0;
}

/* the recorder's side of both hooks, once the thread is not busy, the process not a fork's and the session running at
 * a module level: 1 where the case is this module's, 0 where not, -1 with an error */
static int
module_case(PyObject *rec, PyObject *s)
{
    int r;
    if ((r = attrs_true(rec, s_api_suspended)) != 0 || (r = attrs_true(rec, s_construct)) != 0
        || (r = attrs_true(rec, s_extra)) != 0 || (r = attrs_true(rec, s_inp)) != 0
        || (r = attrs_true(rec, s_module_bwd)) != 0 || (r = attrs_true(rec, s_params_on)) != 0
        || (r = attrs_true(rec, s_fwd)) <= 0 || (r = attrs_true(rec, s_outp)) <= 0 || (r = filters_active(s)) != 0)
        return r < 0 ? -1 : 0;
    return 1;
}

/* both hooks' opening: the recorder and session read (new references in *rec and *s, NULL where not read) and whether
 * the session records at a module level (*recording). 1 to go on; 0 where the call is passed through (the tool's own
 * tensor work, a forked child's hooks); -1 where it is the Python's (recorded in another case than this file's: inputs,
 * stacks, backward capture, filters...), asked before anything else, or with an error */
static int
module_opening(PyObject *hooks, PyObject **rec, PyObject **s, int *recording)
{
    int r;
    if ((*rec = attrs_get(hooks, s_rec)) == NULL || (*s = attrs_get(*rec, s_session)) == NULL
        || (r = plain_true(TLS, s_busy)) < 0 || (!r && (r = attrs_true(*rec, s_forked)) < 0))
        return -1;
    if (r)
        return 0;
    if ((r = attrs_true(*s, s_running)) > 0)
        r = attrs_true(*rec, s_module_level);
    if ((*recording = r) < 0 || (r && module_case(*rec, *s) <= 0))
        return -1;
    return 1;
}

/* SLOW for an error while the case is asked (nothing has changed: the Python body asks again and fails, or not, in
 * its own way); a BaseException that is not an Exception is raised */
static PyObject *
module_slow(void)
{
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
    }
    return Py_NewRef(SLOW);
}

/* torch.compile's wrapper (modules._compiled's first test): its hooks are the Python's */
static int
compiled(PyObject *module)
{
    return strcmp(Py_TYPE(module)->tp_name, "OptimizedModule") == 0;
}

/* the pre-hook's count of a call it does not record: tls.depth one deeper and a None frame pushed, which the forward
 * hook pops (a failed push is an out-of-memory the Python would raise into the forward: nothing pushed) */
static PyObject *
module_pass(PyObject *frames, PyObject *d1)
{
    if (PyObject_SetAttr(TLS, s_depth, d1) < 0)
        return module_slow(); /* nothing changed */
    if (PyList_Append(frames, Py_None) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
    }
    return Py_NewRef(Py_None);
}

/* module_pre(hooks, module, args): see above. A call the tool does not record (an API level's, the session not
 * running, a step outside the range) is counted here too, as _pre counts it; a top-level call, a token range, a
 * compiled module or a recomputed forward are the Python's. */
static PyObject *
modcall_pre(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (nargs != 3 || T_frame == NULL || SLOW == NULL)
        return Py_NewRef(SLOW == NULL ? Py_None : SLOW);
    PyObject *hooks = a[0], *module = a[1];
    PyObject *rec = NULL, *s = NULL, *named = NULL, *ref = NULL, *prefix = NULL, *counts = NULL, *stack = NULL,
             *frames = NULL, *depth = NULL, *g = NULL, *d1 = NULL, *idx_o = NULL, *fkey = NULL, *frame = NULL,
             *tr = NULL;
    PyObject *result = NULL;
    int r;
    int recording = 0;
    if ((r = module_opening(hooks, &rec, &s, &recording)) <= 0) {
        result = r < 0 ? module_slow() : Py_NewRef(Py_None);
        goto done;
    }
    /* a module forward inside a backward pass (activation checkpointing's recomputation) is the Python's */
    if ((g = PyObject_CallNoArgs(F_graph_task)) == NULL)
        goto slow;
    long task = PyLong_AsLong(g);
    if (task != -1 || PyErr_Occurred())
        goto slow;
    if ((named = attrs_get(hooks, s_named)) == NULL || !PyDict_CheckExact(named)
        || (ref = PyWeakref_NewRef(module, NULL)) == NULL)
        goto slow;
    prefix = PyDict_GetItemWithError(named, ref); /* borrowed until the next line */
    if (prefix == NULL && PyErr_Occurred())
        goto slow;
    Py_XINCREF(prefix);
    if ((frames = PyObject_GetAttr(TLS, s_mframes)) == NULL || !PyList_CheckExact(frames)
        || (depth = PyObject_GetAttr(TLS, s_depth)) == NULL || !PyLong_CheckExact(depth)
        || (d1 = PyNumber_Add(depth, V_one)) == NULL)
        goto slow;
    if (prefix == NULL) { /* a module not named: a model's top-level call, a token count, a compiled one: Python */
        if ((r = PyObject_RichCompareBool(depth, V_zero, Py_EQ)) != 0 || (tr = attrs_get(rec, s_token_range)) == NULL
            || tr != Py_None || compiled(module))
            goto slow;
        result = module_pass(frames, d1);
        goto done;
    }
    if (!PyUnicode_CheckExact(prefix))
        goto slow;
    if (!recording) {
        result = module_pass(frames, d1);
        goto done;
    }
    if ((counts = attrs_get(s, s_module_counts)) == NULL || !PyDict_CheckExact(counts)
        || (stack = PyObject_GetAttr(TLS, s_stack)) == NULL || !PyList_CheckExact(stack))
        goto slow;
    PyObject *prev = PyDict_GetItemWithError(counts, prefix); /* borrowed: an int's read runs no Python */
    if (prev == NULL && PyErr_Occurred())
        goto slow;
    long long idx = 0;
    if (prev != NULL) {
        int over = 0;
        if (!PyLong_CheckExact(prev))
            goto slow;
        idx = PyLong_AsLongLongAndOverflow(prev, &over);
        if (over || idx == LLONG_MAX || (idx == -1 && PyErr_Occurred()))
            goto slow;
        idx += 1;
    }
    if ((idx_o = PyLong_FromLongLong(idx)) == NULL || (fkey = module_key(prefix, "forward.", idx)) == NULL
        || PyObject_SetAttr(TLS, s_depth, d1) < 0)
        goto slow;
    /* from here on the hook's: module_enter's body, its failure logged with the key and the frame None */
    if (PyDict_SetItem(counts, prefix, idx_o) < 0 || PyList_Append(stack, fkey) < 0)
        goto failed;
    PyObject *fa[4] = {fkey, idx_o, prefix, Py_True};
    if ((frame = PyObject_Vectorcall(T_frame, fa, 4, NULL)) == NULL)
        goto failed;
    /* pushed whatever happens next: the forward hook pops one frame per call */
    if (PyList_Append(frames, frame) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            goto done;
        PyErr_Clear(); /* out of memory: nothing pushed (the Python would raise into the forward here) */
    }
    result = Py_NewRef(Py_None);
    goto done;
failed:
    if (module_failed(hooks, s_pre_failed, fkey) < 0)
        goto done;
    if (PyList_Append(frames, Py_None) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            goto done;
        PyErr_Clear();
    }
    result = Py_NewRef(Py_None);
    goto done;
slow:
    result = module_slow();
done:
    Py_XDECREF(tr);
    Py_XDECREF(frame);
    Py_XDECREF(fkey);
    Py_XDECREF(idx_o);
    Py_XDECREF(d1);
    Py_XDECREF(g);
    Py_XDECREF(depth);
    Py_XDECREF(frames);
    Py_XDECREF(stack);
    Py_XDECREF(counts);
    Py_XDECREF(prefix);
    Py_XDECREF(ref);
    Py_XDECREF(named);
    Py_XDECREF(s);
    Py_XDECREF(rec);
    return result;
}

/* module_exit's record: the outputs' entries merged into the forward record, in one quiet section */
static int
module_record(PyObject *rec, PyObject *s, PyObject *fkey, PyObject *output)
{
    Section sec;
    if (quiet_enter(&sec) < 0)
        return -1;
    PyObject *stack = NULL, *enc = NULL, *value = NULL, *pending = NULL, *members = NULL, *w = NULL;
    int ok = 0;
    if ((stack = PyObject_GetAttr(TLS, s_stack)) == NULL)
        goto done;
    if (!PyList_Check(stack)) {
        PyErr_SetString(PyExc_TypeError, "the module stack is not a list");
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(stack);
    int top = 0;
    if (n > 0) {
        PyObject *last = Py_NewRef(PyList_GET_ITEM(stack, n - 1));
        top = PyObject_RichCompareBool(last, fkey, Py_EQ);
        Py_DECREF(last);
    }
    if (top < 0)
        goto done;
    if (top && PyList_GET_SIZE(stack) == n) {
        if (PyList_SetSlice(stack, n - 1, n, NULL) < 0)
            goto done;
    } else {
        int in = PySequence_Contains(stack, fkey);
        if (in < 0)
            goto done;
        if (in) {
            PyObject *r = PyObject_CallMethod(stack, "remove", "O", fkey);
            if (r == NULL)
                goto done;
            Py_DECREF(r);
        }
    }
    if ((enc = attrs_get(rec, s_encoder)) == NULL || (value = output_list(output)) == NULL
        || (pending = PyList_New(0)) == NULL || (members = PyDict_New()) == NULL
        || put_entries(enc, members, s_output, value, pending) < 0 || (w = attrs_get(rec, s_writer)) == NULL
        || ensure_open(s, w) < 0)
        goto done;
    PyObject *pa[6] = {w, T_merge, fkey, members, PyList_GET_SIZE(pending) ? pending : Py_None, Py_True};
    ok = send_n(pa, 6) == 0;
done:
    Py_XDECREF(w);
    Py_XDECREF(members);
    Py_XDECREF(pending);
    Py_XDECREF(value);
    Py_XDECREF(enc);
    Py_XDECREF(stack);
    return quiet_leave(&sec) < 0 || !ok ? -1 : 0;
}

/* _post's parameter check: the module's own parameters that require a gradient and are not the ones hooked under its
 * prefix (ModuleHooks._acc) get their hooks (ModuleHooks._param_grad_hooks) */
static int
module_params(PyObject *hooks, PyObject *module, PyObject *prefix)
{
    PyObject *acc = attrs_get(hooks, s_acc), *params = acc == NULL ? NULL : PyObject_GetAttr(module, s_parameters);
    int r = params == NULL ? -1 : 0;
    if (r == 0 && (!PyDict_Check(params) || !PyDict_Check(acc))) {
        PyErr_SetString(PyExc_TypeError, "_parameters or _acc is not a dict");
        r = -1;
    }
    Py_ssize_t pos = 0;
    PyObject *name, *p;
    while (r == 0 && PyDict_Next(params, &pos, &name, &p)) {
        if (p == Py_None)
            continue;
        Py_INCREF(p);
        Py_INCREF(name);
        int rg = plain_true(p, s_requires_grad), missing = 0;
        if (rg > 0) {
            PyObject *slot = PyTuple_Pack(2, prefix, name);
            PyObject *prev = slot == NULL ? NULL : PyDict_GetItemWithError(acc, slot); /* borrowed */
            if (prev == NULL) {
                missing = PyErr_Occurred() ? -1 : 1;
            } else if (!PyTuple_Check(prev) || PyTuple_GET_SIZE(prev) < 3) {
                missing = 1;
            } else {
                PyObject *pref = Py_NewRef(PyTuple_GET_ITEM(prev, 2));
                PyObject *held = PyObject_CallNoArgs(pref);
                Py_DECREF(pref);
                missing = held == NULL ? -1 : held != p;
                Py_XDECREF(held);
            }
            Py_XDECREF(slot);
        }
        Py_DECREF(name);
        Py_DECREF(p);
        if (rg < 0 || missing < 0) {
            r = -1;
        } else if (missing) {
            PyObject *got = PyObject_CallMethodObjArgs(hooks, s_param_grad_hooks, module, prefix, NULL);
            r = got == NULL ? -1 : 0;
            Py_XDECREF(got);
            break;
        }
    }
    Py_XDECREF(params);
    Py_XDECREF(acc);
    return r;
}

/* module_post(hooks, module, kwargs, output): see above */
static PyObject *
modcall_post(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (nargs != 4 || T_frame == NULL || SLOW == NULL)
        return Py_NewRef(SLOW == NULL ? Py_None : SLOW);
    PyObject *hooks = a[0], *module = a[1], *output = a[3];
    if (output == RAISED)
        return Py_NewRef(SLOW);
    PyObject *rec = NULL, *s = NULL, *enc = NULL, *frames = NULL, *frame = NULL, *depth = NULL, *fkey = NULL,
             *prefix = NULL, *stack = NULL;
    PyObject *result = NULL;
    int r;
    int recording = 0;
    if ((r = module_opening(hooks, &rec, &s, &recording)) <= 0) {
        result = r < 0 ? module_slow() : Py_NewRef(Py_None);
        goto done;
    }
    if ((frames = PyObject_GetAttr(TLS, s_mframes)) == NULL || !PyList_CheckExact(frames)
        || PyList_GET_SIZE(frames) == 0 || (depth = PyObject_GetAttr(TLS, s_depth)) == NULL
        || !PyLong_CheckExact(depth))
        goto slow;
    if (PyList_GET_ITEM(frames, PyList_GET_SIZE(frames) - 1) == Py_None) {
        /* a call the pre-hook did not record: one level up and its frame popped; where that ends a top-level
         * forward (a step boundary, zero-code's), the Python's */
        PyObject *d1 = PyNumber_Subtract(depth, V_one);
        int above = d1 == NULL ? -1 : PyObject_RichCompareBool(d1, V_zero, Py_GT);
        if (above <= 0 || PyObject_SetAttr(TLS, s_depth, d1) < 0) {
            Py_XDECREF(d1);
            goto slow; /* nothing changed */
        }
        Py_DECREF(d1);
        Py_ssize_t n = PyList_GET_SIZE(frames);
        if (PyList_SetSlice(frames, n - 1, n, NULL) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                goto done;
            PyErr_Clear();
        }
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (!recording) /* a frame of a call recorded while the session stopped under it */
        goto slow;
    if ((enc = attrs_get(rec, s_encoder)) == NULL || (r = attrs_true(enc, s_some_files)) != 0)
        goto slow;
    PyObject *entries = attrs_get(enc, s_entries);
    if (entries == NULL)
        goto slow;
    r = entries != Py_None;
    Py_DECREF(entries);
    if (!r)
        goto slow;
    int pgrads = attrs_true(rec, s_pgrads);
    if (pgrads < 0 || (pgrads && compiled(module)))
        goto slow;
    if ((stack = PyObject_GetAttr(TLS, s_stack)) == NULL || !PyList_CheckExact(stack))
        goto slow;
    frame = Py_NewRef(PyList_GET_ITEM(frames, PyList_GET_SIZE(frames) - 1));
    if (!Py_IS_TYPE(frame, (PyTypeObject *)T_frame))
        goto slow;
    PyObject *bw = attrs_get(frame, s_backward);
    if (bw == NULL)
        goto slow;
    r = bw == Py_None;
    Py_DECREF(bw);
    if (!r || (r = attrs_true(frame, s_keep)) <= 0 || (fkey = attrs_get(frame, s_fkey)) == NULL
        || (prefix = attrs_get(frame, s_prefix)) == NULL || !PyUnicode_CheckExact(prefix))
        goto slow;
    /* from here on the hook's: tls.depth, the frame popped, module_exit's body (its failure logged with the key) */
    PyObject *d1 = PyNumber_Subtract(depth, V_one);
    int neg = d1 == NULL ? -1 : PyObject_RichCompareBool(d1, V_zero, Py_LT);
    if (neg < 0 || PyObject_SetAttr(TLS, s_depth, neg ? V_zero : d1) < 0) {
        Py_XDECREF(d1);
        goto slow; /* nothing changed yet */
    }
    Py_DECREF(d1);
    Py_ssize_t n = PyList_GET_SIZE(frames);
    if (n == 0 || PyList_GET_ITEM(frames, n - 1) != frame) {
        PyErr_SetString(PyExc_RuntimeError, "the module frames changed under the forward hook");
        if (module_failed(hooks, s_hook_failed, fkey) < 0)
            goto done;
    } else if (PyList_SetSlice(frames, n - 1, n, NULL) < 0 || module_record(rec, s, fkey, output) < 0) {
        if (module_failed(hooks, s_hook_failed, fkey) < 0)
            goto done;
    }
    /* the outer guard of _post: logged without a record */
    if (pgrads && module_params(hooks, module, prefix) < 0 && module_failed(hooks, s_hook_failed, NULL) < 0)
        goto done;
    result = Py_NewRef(Py_None);
    goto done;
slow:
    result = module_slow();
done:
    Py_XDECREF(stack);
    Py_XDECREF(prefix);
    Py_XDECREF(fkey);
    Py_XDECREF(depth);
    Py_XDECREF(frame);
    Py_XDECREF(frames);
    Py_XDECREF(enc);
    Py_XDECREF(s);
    Py_XDECREF(rec);
    return result;
}

/* param_grad(hooks, prefix, pname, pref, *torch's arguments): the hook on a parameter's AccumulateGrad node, bound
 * with partial (ModuleHooks._param_grad_hook): Recorder.param_grad's steps for its common case (the session running in
 * this process, no filters, no tensor files, the encoder's C entries; the gradient a plain tensor, not Megatron's
 * main_grad), the same record member; any other case hooks._param_grad_slow(prefix, pname, pref), the Python's. A
 * failure is logged as the Python logs it and never raised into the backward pass. */
static PyObject *s_pgrad_counts, *s_ctx_one, *s_grad, *s_main_grad, *s_tensor_entry, *s_param_grad_slow,
    *s_capture_failed_txt;

/* the member's entry as Encoder.tensor makes it: the C call's first item, its Python where that call raised */
static PyObject *
grad_entry(PyObject *enc, PyObject *entries, PyObject *grad, PyObject *pending)
{
    PyObject *ctx = attrs_get(enc, s_ctx_one), *one = ctx == NULL ? NULL : PyTuple_Pack(1, grad), *got = NULL;
    if (one != NULL) {
        PyObject *a[3] = {ctx, one, pending};
        got = PyObject_Vectorcall(entries, a, 3, NULL);
    }
    Py_XDECREF(one);
    Py_XDECREF(ctx);
    PyObject *e = got == NULL ? NULL : PySequence_GetItem(got, 0);
    Py_XDECREF(got);
    if (e != NULL)
        return e;
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return NULL;
    PyErr_Clear();
    return PyObject_CallMethodObjArgs(enc, s_tensor_entry, grad, pending, Py_None, NULL);
}

static PyObject *
modcall_param_grad(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (nargs < 4 || T_merge == NULL) {
        PyErr_SetString(PyExc_TypeError, "param_grad(hooks, prefix, pname, pref, ...) after module_setup");
        return NULL;
    }
    PyObject *hooks = a[0], *prefix = a[1], *pname = a[2], *pref = a[3];
    PyObject *p = NULL, *rec = NULL, *s = NULL, *enc = NULL, *entries = NULL, *grad = NULL,
             *counts = NULL, *idx_o = NULL, *key = NULL, *pending = NULL, *entry = NULL, *members = NULL, *w = NULL;
    PyObject *result = NULL;
    Section sec;
    int r;
    if ((p = PyObject_CallNoArgs(pref)) == NULL)
        goto failed;
    if (p == Py_None)
        goto none;
    if ((rec = attrs_get(hooks, s_rec)) == NULL || (s = attrs_get(rec, s_session)) == NULL)
        goto failed;
    if ((r = attrs_true(s, s_running)) <= 0 || (r = plain_true(TLS, s_busy)) != 0 || (r = attrs_true(rec, s_forked)) != 0)
        goto none_or_failed;
    if (!PyUnicode_CheckExact(prefix) || PyUnicode_GET_LENGTH(prefix) == 0)
        goto slow;
    if ((r = filters_active(s)) != 0)
        goto slow_or_failed;
    if ((enc = attrs_get(rec, s_encoder)) == NULL)
        goto failed;
    if ((r = attrs_true(enc, s_some_files)) != 0)
        goto slow_or_failed;
    if ((entries = attrs_get(enc, s_entries)) == NULL)
        goto failed;
    if (entries == Py_None || (r = has_attr(p, s_main_grad)) != 0)
        goto slow_or_failed;
    if ((grad = PyObject_GetAttr(p, s_grad)) == NULL)
        goto failed;
    if (!Py_IS_TYPE(grad, (PyTypeObject *)T_tensor))
        goto slow;
    if ((counts = attrs_get(s, s_pgrad_counts)) == NULL)
        goto failed;
    if (!PyDict_CheckExact(counts))
        goto slow;
    /* from here on the record's, in one quiet section */
    if (quiet_enter(&sec) < 0)
        goto failed;
    long long idx = 0;
    PyObject *cur = PyDict_GetItemWithError(counts, prefix); /* borrowed */
    if (cur == NULL) {
        if (PyErr_Occurred())
            goto leave;
        PyObject *fresh = Py_BuildValue("[iO]", 0, pname);
        r = fresh == NULL ? -1 : PyDict_SetItem(counts, prefix, fresh);
        Py_XDECREF(fresh);
        if (r < 0)
            goto leave;
    } else {
        if (!PyList_Check(cur) || PyList_GET_SIZE(cur) < 2) {
            PyErr_SetString(PyExc_TypeError, "a parameter-gradient count is not [index, name]");
            goto leave;
        }
        Py_INCREF(cur); /* held: the compare may run Python that changes the counts */
        PyObject *name = Py_NewRef(PyList_GET_ITEM(cur, 1));
        r = PyObject_RichCompareBool(name, pname, Py_EQ);
        Py_DECREF(name);
        if (r < 0 || PyList_GET_SIZE(cur) < 2) {
            Py_DECREF(cur);
            if (r >= 0)
                PyErr_SetString(PyExc_TypeError, "a parameter-gradient count is not [index, name]");
            goto leave;
        }
        if (r) {
            PyObject *next = PyNumber_Add(PyList_GET_ITEM(cur, 0), V_one);
            if (next == NULL || PyList_SetItem(cur, 0, next) < 0) { /* steals next */
                Py_DECREF(cur);
                goto leave;
            }
        }
        idx = PyLong_AsLongLong(PyList_GET_ITEM(cur, 0));
        Py_DECREF(cur);
        if (idx == -1 && PyErr_Occurred())
            goto leave;
    }
    if ((key = module_key(prefix, "parameters_grad.", idx)) == NULL || (pending = PyList_New(0)) == NULL
        || (entry = grad_entry(enc, entries, grad, pending)) == NULL)
        goto leave;
    PyObject *lst = PyList_New(1);
    if (lst == NULL)
        goto leave;
    PyList_SET_ITEM(lst, 0, Py_NewRef(entry));
    members = PyDict_New();
    r = members == NULL ? -1 : PyDict_SetItem(members, pname, lst);
    Py_DECREF(lst);
    if (r < 0 || (w = attrs_get(rec, s_writer)) == NULL || ensure_open(s, w) < 0)
        goto leave;
    PyObject *pa[6] = {w, T_merge, key, members, PyList_GET_SIZE(pending) ? pending : Py_None, Py_False};
    r = send_n(pa, 6);
leave:
    if (quiet_leave(&sec) < 0 || PyErr_Occurred())
        goto failed;
    goto none;
slow_or_failed:
    if (r < 0)
        goto failed;
slow:
    result = PyObject_CallMethodObjArgs(hooks, s_param_grad_slow, prefix, pname, pref, NULL);
    if (result == NULL)
        goto failed; /* what the recorder's own guard does not cover (its first reads): logged, not raised */
    goto done;
none_or_failed:
    if (r < 0)
        goto failed;
none:
    result = Py_NewRef(Py_None);
    goto done;
failed:
    /* Recorder.param_grad's except, and its record's name; nothing reaches autograd but what is no Exception */
    if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_Exception)) {
        Held h;
        hold(&h); /* the failure, put back once its record's name is made (f"{prefix[:-1]}.parameters_grad") */
        PyObject *rname = NULL, *head = PyUnicode_Check(prefix)
            ? PyUnicode_Substring(prefix, 0, PyUnicode_GET_LENGTH(prefix) > 0 ? PyUnicode_GET_LENGTH(prefix) - 1 : 0)
            : NULL;
        if (head != NULL)
            rname = PyUnicode_FromFormat("%U.parameters_grad", head);
        Py_XDECREF(head);
        PyErr_Clear(); /* a name that could not be made: logged without one */
        PyErr_Restore(h.t, h.v, h.tb);
        if (module_failed(hooks, s_capture_failed_txt, rname) == 0)
            result = Py_NewRef(Py_None);
        Py_XDECREF(rname);
    }
done:
    Py_XDECREF(w);
    Py_XDECREF(members);
    Py_XDECREF(entry);
    Py_XDECREF(pending);
    Py_XDECREF(key);
    Py_XDECREF(idx_o);
    Py_XDECREF(counts);
    Py_XDECREF(grad);
    Py_XDECREF(entries);
    Py_XDECREF(enc);
    Py_XDECREF(s);
    Py_XDECREF(rec);
    Py_XDECREF(p);
    return result;
}

/* module_setup(graph_task, frame_type, merge_type, raised): the objects the module hooks use */
static PyObject *
modcall_setup(PyObject *self, PyObject *args)
{
    PyObject *o[4];
    if (!PyArg_ParseTuple(args, "OOOO", &o[0], &o[1], &o[2], &o[3]))
        return NULL;
    if (!PyType_Check(o[1]) || !PyType_Check(o[2])) {
        PyErr_SetString(PyExc_TypeError, "module_setup: the frame and merge types");
        return NULL;
    }
    PyObject **dst[4] = {&F_graph_task, &T_frame, &T_merge, &RAISED};
    for (int i = 0; i < 4; i++) {
        Py_INCREF(o[i]);
        Py_XSETREF(*dst[i], o[i]);
    }
    Py_RETURN_NONE;
}

/* setup(slow, function type, tensor type, Record, Construct, hook_after or None, stack_at or None,
 * is_grad_enabled, quiet enter, quiet leave, thread state, respell, the writer module): what every call uses, given
 * once */
static PyObject *
apicall_setup(PyObject *self, PyObject *args)
{
    PyObject *o[13];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                          &o[9], &o[10], &o[11], &o[12]))
        return NULL;
    if (!PyType_Check(o[1]) || !PyType_Check(o[2])) {
        PyErr_SetString(PyExc_TypeError, "setup: the function and tensor types");
        return NULL;
    }
    PyObject **dst[13] = {&SLOW, &T_function, &T_tensor, &T_record, &T_construct, &F_hook_after, &F_stack_at,
                          &F_grad, &F_enter, &F_leave, &TLS, &F_respell, &M_writer};
    for (int i = 0; i < 13; i++) {
        Py_INCREF(o[i]);
        Py_XSETREF(*dst[i], o[i]);
    }
    /* the enter given, bound to one of _tstate's C Quiets: its sections through quiet_api */
    Q_API = NULL;
    Py_CLEAR(Q_OBJ);
    PyObject *tstate = PyImport_ImportModule("msprobe_inject._tstate");
    PyObject *cap = tstate != NULL ? PyObject_GetAttrString(tstate, "quiet_api") : NULL;
    Py_XDECREF(tstate);
    const quiet_api_v1 *api = cap != NULL ? PyCapsule_GetPointer(cap, QUIET_API_CAPSULE) : NULL;
    Py_XDECREF(cap);
    if (api == NULL)
        PyErr_Clear(); /* not built, or another layout: the enter and leave given */
    else if (PyCFunction_Check(F_enter) && PyCFunction_GET_SELF(F_enter) != NULL
             && Py_IS_TYPE(PyCFunction_GET_SELF(F_enter), api->quiet_type)
             && PyCFunction_Check(F_leave) && PyCFunction_GET_SELF(F_leave) == PyCFunction_GET_SELF(F_enter)) {
        Q_OBJ = Py_NewRef(PyCFunction_GET_SELF(F_enter));
        Q_API = api;
    }
    Py_RETURN_NONE;
}

/* name interned and kept for the process: a cache entry points to its name (a freed name's address reused by another
 * would find the entry); a new reference, or NULL with an error */
static PyObject *
held_name(PyObject *name)
{
    static PyObject *held;
    if (held == NULL && (held = PySet_New(NULL)) == NULL)
        return NULL;
    Py_INCREF(name);
    PyUnicode_InternInPlace(&name);
    if (PySet_Add(held, name) < 0) {
        Py_DECREF(name);
        return NULL;
    }
    return name;
}

/* attr(o, name): o.name as the calls above read the recorder's attributes (_attrs.h), for its tests */
static PyObject *
apicall_attr(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_CheckExact(a[1])) {
        PyErr_SetString(PyExc_TypeError, "attr(o, name: str)");
        return NULL;
    }
    PyObject *name = held_name(a[1]);
    if (name == NULL)
        return NULL;
    PyObject *v = attrs_get(a[0], name);
    Py_DECREF(name);
    return v;
}

/* quiet_in_c(): whether setup's quiet sections are entered through _tstate's quiet_api, for its tests */
static PyObject *
apicall_quiet_in_c(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(Q_API != NULL);
}

/* attr_misses(): this module's reads that went through the attribute protocol (_attrs.h), for its tests */
static PyObject *
apicall_attr_misses(PyObject *self, PyObject *unused)
{
    return PyLong_FromSsize_t(attrs_misses);
}

/* attr_set(o, name, v): o.name = v as the journal's C calls set the writer's attributes (_attrs.h), for its tests */
static PyObject *
apicall_attr_set(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyUnicode_CheckExact(a[1])) {
        PyErr_SetString(PyExc_TypeError, "attr_set(o, name: str, v)");
        return NULL;
    }
    PyObject *name = held_name(a[1]);
    if (name == NULL)
        return NULL;
    int r = attrs_set(a[0], name, a[2]);
    Py_DECREF(name);
    if (r < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
apicall_recompute_by_frames(PyObject *self, PyObject *on)
{
    int r = PyObject_IsTrue(on);
    if (r < 0)
        return NULL;
    BY_FRAMES = r;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))apicall_call, METH_FASTCALL,
     "call(mode, func, args, kwargs): a recorded API call's common case, or the SLOW sentinel"},
    {"backward", (PyCFunction)(void (*)(void))apicall_backward, METH_FASTCALL,
     "backward(hooks, bkey, record, grad_inputs, grad_outputs): a recorded call's backward record"},
    {"setup", apicall_setup, METH_VARARGS, "setup(...): the objects every call uses"},
    {"module_pre", (PyCFunction)(void (*)(void))modcall_pre, METH_FASTCALL,
     "module_pre(hooks, module, args): a module forward pre-hook's common case, or the SLOW sentinel"},
    {"module_post", (PyCFunction)(void (*)(void))modcall_post, METH_FASTCALL,
     "module_post(hooks, module, kwargs, output): a module forward hook's common case, or the SLOW sentinel"},
    {"param_grad", (PyCFunction)(void (*)(void))modcall_param_grad, METH_FASTCALL,
     "param_grad(hooks, prefix, pname, pref, ...): a parameter gradient's hook"},
    {"module_setup", modcall_setup, METH_VARARGS, "module_setup(...): the objects the module hooks use"},
    {"recompute_by_frames", apicall_recompute_by_frames, METH_O,
     "recompute_by_frames(on): whether a call inside a backward pass is left to the Python (the module hooks out)"},
    {"attr", (PyCFunction)(void (*)(void))apicall_attr, METH_FASTCALL, "attr(o, name): o.name as the calls read it"},
    {"attr_misses", apicall_attr_misses, METH_NOARGS,
     "attr_misses(): how many of this module's attribute reads went through the attribute protocol so far"},
    {"attr_set", (PyCFunction)(void (*)(void))apicall_attr_set, METH_FASTCALL,
     "attr_set(o, name, v): o.name = v as the journal's calls set it"},
    {"quiet_in_c", apicall_quiet_in_c, METH_NOARGS,
     "quiet_in_c(): whether the quiet sections are entered through _tstate's quiet_api (no section object)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_apicall", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC
PyInit__apicall(void)
{
#define I(v, text)                                                                                                   \
    if ((v = PyUnicode_InternFromString(text)) == NULL)                                                              \
        return NULL;
    I(s_known, "known"); I(s_hooks, "hooks"); I(s_rec, "rec"); I(s_busy, "busy"); I(s_in_api, "in_api");
    I(s_api_on, "api_on"); I(s_session, "session"); I(s_running, "running"); I(s_forked, "forked");
    I(s_api_counts, "api_counts"); I(s_filters, "filters"); I(s_active, "active"); I(s_encoder, "encoder");
    I(s_some_files, "some_files"); I(s_entries, "_entries"); I(s_ctx, "_ctx"); I(s_devices, "_devices");
    I(s_finish, "_finish"); I(s_fwd, "fwd"); I(s_inp, "inp"); I(s_outp, "outp"); I(s_extra, "extra");
    I(s_writer, "writer"); I(s_stack, "stack"); I(s_ready_kind, "ready_kind"); I(s_dump, "dump");
    I(s_stopped, "stopped"); I(s_ensure_open, "ensure_open"); I(s_post, "post"); I(s_construct, "construct");
    I(s_bwd, "bwd"); I(s_backward_c, "_backward_c"); I(s_ended, "ended"); I(s_place, "place"); I(s_keep, "keep");
    I(s_backward_record, "backward_record"); I(s_backward, "backward"); I(s_register_backward, "_register_backward");
    I(s_requires_grad, "requires_grad"); I(s_capture_failed, "_capture_failed"); I(s_out, "out");
    I(s_distributed, "Distributed"); I(s_npu, "NPU"); I(s_input, "input"); I(s_output, "output");
    I(s_fields, "_fields"); I(s_input_args, "input_args"); I(s_input_kwargs, "input_kwargs");
    I(s_encode, "encode"); I(s_dropout, "dropout");
    I(s_operators, "_operators"); I(s_sites, "_sites"); I(s_co_name, "co_name"); I(s_f_lasti, "f_lasti");
    I(s_get, "get");
    I(s_parent, "_parent");
    I(s_named, "_named"); I(s_module_level, "module_level"); I(s_api_suspended, "api_suspended");
    I(s_module_counts, "module_counts"); I(s_depth, "depth"); I(s_mframes, "mframes"); I(s_module_bwd, "module_bwd");
    I(s_pgrads, "pgrads"); I(s_params_on, "params_on"); I(s_acc, "_acc"); I(s_param_grad_hooks, "_param_grad_hooks");
    I(s_parameters, "_parameters"); I(s_fkey, "fkey"); I(s_prefix, "prefix"); I(s_c_failed, "_c_failed");
    I(s_token_range, "token_range"); I(s_pre_failed, "module pre-hook failed"); I(s_hook_failed, "module hook failed");
    I(s_pgrad_counts, "pgrad_counts"); I(s_ctx_one, "_ctx_one"); I(s_grad, "grad"); I(s_main_grad, "main_grad");
    I(s_tensor_entry, "_tensor_entry"); I(s_param_grad_slow, "_param_grad_slow"); I(s_capture_failed_txt, "capture failed");
#undef I
    if ((V_one = PyLong_FromLong(1)) == NULL || (V_zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
