/* The index rows of a complete dump.json, column-wise (index.py's accelerator of row_tuples).
 *
 * Scanner(buffer) reads the bytes of a whole dump.json (an mmap of it). next(limit) walks the records of its
 * data object, from where the last call stopped, until at least limit rows are made (or the document ends),
 * and returns those rows as Arrow buffers (bytes): no Python object is made per JSON value, only one per
 * column and per placements / device_mesh list (their text is re-serialised by Python). header() gives the
 * (key, start, end) spans of the top-level members other than data, once next() has returned None.
 *
 * The rows are those of index.row_tuples over reading.iter_proc, which stays the definition: each record
 * value is parsed (as json's decoder would) into a tape of nodes, then walked as index._tensors walks the
 * decoded value (depth first in document order; a dict is a tensor entry when stats._is_tensor says so, and
 * its children are not walked; path components joined with "."; only dict and list children walked), and
 * each tensor entry's fields are read as row_tuples reads them (stats._num for the statistics).
 *
 * Whatever this code does not decide exactly as the Python path would raises Unhandled: a syntax error, a
 * truncated file, bytes that are not UTF-8, a control character in a string, a key twice in an object the walk
 * reads, a lone surrogate in a string it reads, an md5 that is not a string, a shape that is not a list of
 * int64, non-ASCII text in a statistic, a number token over MAX_NUMBER characters, a nesting deeper than
 * MAX_DEPTH, anything but whitespace after the document. The caller then reads the file with the Python
 * path, whose rows and errors are the answer.
 *
 * Two shortcuts keep the scan well under the cost of json.loads, both exact: float tokens are converted by the
 * Eisel-Lemire algorithm where it decides (PyOS_string_to_double, dtoa, elsewhere), and record names are
 * grouped so that index._kind runs once per group of names it answers alike (group_of).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 400   /* json's decoder recurses per level (RecursionError near 1000): well below */
#define MAX_NUMBER 350  /* longer number tokens are left to Python (int() limits, float() of huge ints) */

static PyObject *Unhandled;
static double NAN_VALUE;  /* float("nan"), as json's NaN and float("nan") give it */

/* ---- growable byte buffers ---- */

typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static int
buf_grow(Buf *b, size_t need)
{
    if (b->n + need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->n + need)
        cap *= 2;
    char *p = PyMem_Realloc(b->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int
buf_put(Buf *b, const void *s, size_t n)
{
    if (buf_grow(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static void
buf_free(Buf *b)
{
    PyMem_Free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- Arrow columns ---- */

static int
bit_put(Buf *valid, Py_ssize_t row, int ok)
{
    if ((row & 7) == 0) {
        char z = 0;
        if (buf_put(valid, &z, 1) < 0)
            return -1;
    }
    if (ok)
        valid->p[row >> 3] |= (char)(1 << (row & 7));
    return 0;
}

typedef struct {
    Buf data, off, valid;  /* off: int32 offsets; valid: the validity bitmap */
    Py_ssize_t len, nulls;
} StrCol;

typedef struct {
    Buf data, valid;
    Py_ssize_t len, nulls;
} F64Col;

typedef struct {
    Buf vals, off, valid;  /* int64 values, int32 offsets */
    Py_ssize_t len, nulls, nvals;
} ListCol;

typedef struct Scanner Scanner;
static int fail(Scanner *S, const char *why, Py_ssize_t at);

/* ---- the tape of one value ---- */

enum { N_OBJ, N_ARR, N_STR, N_INT, N_FLT, N_TRUE, N_FALSE, N_NULL, N_NAN, N_INF, N_NINF };

typedef struct {
    Py_ssize_t start, end;  /* strings: after the opening quote .. the closing quote; else the token / brackets */
    uint32_t next;          /* the node after this value and everything in it */
    uint8_t kind, esc;      /* esc: the string has a backslash */
} Node;

/* a member of an object being walked: its key's bytes (decoded when escaped: in the arena) and value node */
typedef struct {
    Py_ssize_t k, kl;
    uint32_t v;
    uint8_t arena;
} Mem;

typedef struct {
    uint64_t hash;
    size_t off, len;  /* the key in Scanner.gkeys; len 0: an empty slot */
    int32_t id;       /* the groups' numbers run in order of first sight */
} GEnt;

enum { ST_BEGIN, ST_KEY, ST_AFTER, ST_RECORD, ST_END, ST_DONE, ST_FAILED };

struct Scanner {
    PyObject_HEAD
    Py_buffer view;
    int held;
    const unsigned char *s;
    Py_ssize_t n, pos;
    int state;
    Py_ssize_t records;  /* records scanned: the next one's position */
    PyObject *header;    /* [(key, start, end)] */
    Node *tape;
    uint32_t nt, tcap;
    Mem *mem;
    size_t nmem, mcap;
    Buf arena, scratch, path;
    /* the chunk being filled */
    Py_ssize_t rows, recs, first;
    Buf position, recidx;
    /* record names grouped by what index._kind answers alike (see group_of): the groups of the whole file
     * (their keys in gkeys), each chunk's records' group in it (local), its groups' file-wide numbers (used),
     * and the first name of each group new in the chunk (fresh) */
    GEnt *gtab;
    size_t gcap, ngroups;
    Buf gkeys, gkey, local, used;
    int32_t *glocal;  /* group -> its index in the chunk, -1 when not in it */
    size_t glcap;
    PyObject *fresh;
    StrCol names, arg, dtype, md5, data_name, error;
    F64Col stat[4];
    ListCol shape;
    PyObject *placements, *mesh;  /* [(row, start, end)] */
    const char *why;
    Py_ssize_t at;
};

static int
fail(Scanner *S, const char *why, Py_ssize_t at)
{
    if (S->why == NULL) {
        S->why = why;
        S->at = at;
    }
    return -1;
}

static int
str_put(Scanner *S, StrCol *c, const char *s, size_t n)
{
    if (buf_put(&c->data, s, n) < 0)
        return -1;
    if (c->data.n > (size_t)INT32_MAX)
        return fail(S, "string column over 2 GiB", S->pos);
    int32_t o = (int32_t)c->data.n;
    if (buf_put(&c->off, &o, 4) < 0 || bit_put(&c->valid, c->len, 1) < 0)
        return -1;
    c->len++;
    return 0;
}

static int
str_null(StrCol *c)
{
    int32_t o = (int32_t)c->data.n;
    if (buf_put(&c->off, &o, 4) < 0 || bit_put(&c->valid, c->len, 0) < 0)
        return -1;
    c->len++;
    c->nulls++;
    return 0;
}

static int
f64_put(F64Col *c, int ok, double v)
{
    if (!ok)
        v = 0.0;
    if (buf_put(&c->data, &v, 8) < 0 || bit_put(&c->valid, c->len, ok) < 0)
        return -1;
    c->len++;
    c->nulls += !ok;
    return 0;
}

static int
col_reset_str(StrCol *c)
{
    c->data.n = c->off.n = c->valid.n = 0;
    c->len = c->nulls = 0;
    int32_t z = 0;
    return buf_put(&c->off, &z, 4);
}

/* ---- lexing ---- */

static inline void
skip_ws(Scanner *S)
{
    const unsigned char *s = S->s;
    Py_ssize_t i = S->pos, n = S->n;
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r'))
        i++;
    S->pos = i;
}

/* bytes that end the fast scan of a string: the quote, a backslash, control characters, non-ASCII */
static unsigned char STOP[256];

static inline int
hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* the length of the UTF-8 sequence at s[i] (i < n, s[i] >= 0x80) as Python's strict decoder takes it; 0 if
 * invalid (overlong, an encoded surrogate, over U+10FFFF, truncated) */
static inline int
utf8_len(const unsigned char *s, Py_ssize_t i, Py_ssize_t n)
{
    unsigned char c = s[i];
    if (c < 0xC2)
        return 0;
    if (c < 0xE0)
        return (i + 1 < n && (s[i + 1] & 0xC0) == 0x80) ? 2 : 0;
    if (c < 0xF0) {
        if (i + 2 >= n)
            return 0;
        unsigned char c1 = s[i + 1];
        unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return (c1 >= lo && c1 <= hi && (s[i + 2] & 0xC0) == 0x80) ? 3 : 0;
    }
    if (c < 0xF5) {
        if (i + 3 >= n)
            return 0;
        unsigned char c1 = s[i + 1];
        unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return (c1 >= lo && c1 <= hi && (s[i + 2] & 0xC0) == 0x80 && (s[i + 3] & 0xC0) == 0x80) ? 4 : 0;
    }
    return 0;
}

static int
push_node(Scanner *S, uint8_t kind, Py_ssize_t start)
{
    if (S->nt == S->tcap) {
        if (S->tcap >= (uint32_t)1 << 30)
            return fail(S, "record too large", start);
        uint32_t cap = S->tcap ? S->tcap * 2 : 256;
        Node *t = PyMem_Realloc(S->tape, (size_t)cap * sizeof(Node));
        if (t == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        S->tape = t;
        S->tcap = cap;
    }
    Node *nd = &S->tape[S->nt];
    nd->kind = kind;
    nd->esc = 0;
    nd->start = start;
    nd->end = start;
    nd->next = S->nt + 1;
    S->nt++;
    return 0;
}

/* a string at S->pos (its opening quote): one node; escapes are checked here, decoded when read */
static int
scan_string(Scanner *S)
{
    const unsigned char *s = S->s;
    Py_ssize_t n = S->n, i = S->pos + 1;
    uint8_t esc = 0;
    for (;;) {
        while (i < n && !STOP[s[i]])
            i++;
        if (i >= n)
            return fail(S, "unterminated string", S->pos);
        unsigned char c = s[i];
        if (c == '"')
            break;
        if (c == '\\') {
            if (i + 1 >= n)
                return fail(S, "unterminated string", S->pos);
            unsigned char e = s[i + 1];
            esc = 1;
            if (e == 'u') {
                if (i + 5 >= n || hexval(s[i + 2]) < 0 || hexval(s[i + 3]) < 0 || hexval(s[i + 4]) < 0 ||
                    hexval(s[i + 5]) < 0)
                    return fail(S, "invalid \\u escape", i);
                i += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                       e == 't') {
                i += 2;
            } else {
                return fail(S, "invalid escape", i);
            }
        } else if (c < 0x20) {
            return fail(S, "control character in a string", i);
        } else {
            int k = utf8_len(s, i, n);
            if (!k)
                return fail(S, "not UTF-8", i);
            i += k;
        }
    }
    if (push_node(S, N_STR, S->pos + 1) < 0)
        return -1;
    Node *nd = &S->tape[S->nt - 1];
    nd->end = i;
    nd->esc = esc;
    S->pos = i + 1;
    return 0;
}

static inline int
is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* json's number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)? */
static int
scan_number(Scanner *S)
{
    const unsigned char *s = S->s;
    Py_ssize_t n = S->n, i = S->pos, start = S->pos;
    uint8_t kind = N_INT;
    if (s[i] == '-')
        i++;
    if (i >= n)
        return fail(S, "invalid number", start);
    if (s[i] == '0')
        i++;
    else if (s[i] >= '1' && s[i] <= '9')
        while (i < n && is_digit(s[i]))
            i++;
    else
        return fail(S, "invalid number", start);
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || !is_digit(s[i]))
            return fail(S, "invalid number", start);
        while (i < n && is_digit(s[i]))
            i++;
        kind = N_FLT;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '-' || s[i] == '+'))
            i++;
        if (i >= n || !is_digit(s[i]))
            return fail(S, "invalid number", start);
        while (i < n && is_digit(s[i]))
            i++;
        kind = N_FLT;
    }
    if (i - start > MAX_NUMBER)
        return fail(S, "number too long", start);
    if (push_node(S, kind, start) < 0)
        return -1;
    S->tape[S->nt - 1].end = i;
    S->pos = i;
    return 0;
}

static int
scan_literal(Scanner *S, const char *word, uint8_t kind)
{
    size_t k = strlen(word);
    if ((size_t)(S->n - S->pos) < k || memcmp(S->s + S->pos, word, k) != 0)
        return fail(S, "invalid literal", S->pos);
    if (push_node(S, kind, S->pos) < 0)
        return -1;
    S->pos += (Py_ssize_t)k;
    S->tape[S->nt - 1].end = S->pos;
    return 0;
}

/* the value at S->pos (no whitespace before it) onto the tape, as json's decoder takes it */
static int
scan_value(Scanner *S, int depth)
{
    const unsigned char *s = S->s;
    Py_ssize_t n = S->n;
    if (S->pos >= n)
        return fail(S, "unexpected end of file", S->pos);
    unsigned char c = s[S->pos];
    if (c == '{' || c == '[') {
        if (depth > MAX_DEPTH)
            return fail(S, "nesting too deep", S->pos);
        uint32_t me = S->nt;
        unsigned char close = c == '{' ? '}' : ']';
        if (push_node(S, c == '{' ? N_OBJ : N_ARR, S->pos) < 0)
            return -1;
        S->pos++;
        skip_ws(S);
        if (S->pos < n && s[S->pos] == close) {
            S->pos++;
        } else {
            for (;;) {
                if (c == '{') {
                    if (S->pos >= n || s[S->pos] != '"')
                        return fail(S, "expected a key", S->pos);
                    if (scan_string(S) < 0)
                        return -1;
                    skip_ws(S);
                    if (S->pos >= n || s[S->pos] != ':')
                        return fail(S, "expected ':'", S->pos);
                    S->pos++;
                    skip_ws(S);
                }
                if (scan_value(S, depth + 1) < 0)
                    return -1;
                skip_ws(S);
                if (S->pos < n && s[S->pos] == ',') {
                    S->pos++;
                    skip_ws(S);
                    continue;
                }
                if (S->pos < n && s[S->pos] == close) {
                    S->pos++;
                    break;
                }
                return fail(S, "expected ',' or a closing bracket", S->pos);
            }
        }
        S->tape[me].end = S->pos;
        S->tape[me].next = S->nt;
        return 0;
    }
    switch (c) {
    case '"':
        return scan_string(S);
    case 't':
        return scan_literal(S, "true", N_TRUE);
    case 'f':
        return scan_literal(S, "false", N_FALSE);
    case 'n':
        return scan_literal(S, "null", N_NULL);
    case 'N':
        return scan_literal(S, "NaN", N_NAN);
    case 'I':
        return scan_literal(S, "Infinity", N_INF);
    case '-':
        if (S->pos + 1 < n && s[S->pos + 1] == 'I')
            return scan_literal(S, "-Infinity", N_NINF);
        return scan_number(S);
    default:
        if (is_digit(c))
            return scan_number(S);
        return fail(S, "unexpected character", S->pos);
    }
}

/* ---- strings as json.loads decodes them ---- */

static int
put_utf8(Buf *out, uint32_t cp)
{
    unsigned char b[4];
    size_t k;
    if (cp < 0x80) {
        b[0] = (unsigned char)cp;
        k = 1;
    } else if (cp < 0x800) {
        b[0] = (unsigned char)(0xC0 | (cp >> 6));
        b[1] = (unsigned char)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | (cp >> 12));
        b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        b[0] = (unsigned char)(0xF0 | (cp >> 18));
        b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (unsigned char)(0x80 | (cp & 0x3F));
        k = 4;
    }
    return buf_put(out, b, k);
}

static inline uint32_t
hex4(const unsigned char *p)
{
    return (uint32_t)(hexval(p[0]) << 12 | hexval(p[1]) << 8 | hexval(p[2]) << 4 | hexval(p[3]));
}

/* a string node's text appended to out, decoded (escapes checked by scan_string); a lone surrogate (which
 * Arrow cannot hold as UTF-8) is Unhandled */
static int
decode(Scanner *S, const Node *nd, Buf *out)
{
    const unsigned char *s = S->s;
    Py_ssize_t i = nd->start, end = nd->end;
    if (!nd->esc)
        return buf_put(out, s + i, (size_t)(end - i));
    while (i < end) {
        const unsigned char *bs = memchr(s + i, '\\', (size_t)(end - i));
        Py_ssize_t j = bs ? bs - s : end;
        if (buf_put(out, s + i, (size_t)(j - i)) < 0)
            return -1;
        if (j >= end)
            break;
        unsigned char e = s[j + 1], ch;
        i = j + 2;
        switch (e) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        default: {  /* 'u' */
            uint32_t cp = hex4(s + j + 2);
            i = j + 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (i + 6 <= end && s[i] == '\\' && s[i + 1] == 'u') {
                    uint32_t lo = hex4(s + i + 2);
                    if (lo >= 0xDC00 && lo <= 0xDFFF) {
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        i += 6;
                    }
                }
                if (cp < 0x10000)
                    return fail(S, "lone surrogate", j);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return fail(S, "lone surrogate", j);
            }
            if (put_utf8(out, cp) < 0)
                return -1;
            continue;
        }
        }
        if (buf_put(out, &ch, 1) < 0)
            return -1;
    }
    return 0;
}

/* a string node's decoded bytes: in the file when unescaped, else in S->scratch (overwritten by the next call) */
static int
text_of(Scanner *S, const Node *nd, const char **p, Py_ssize_t *len)
{
    if (!nd->esc) {
        *p = (const char *)S->s + nd->start;
        *len = nd->end - nd->start;
        return 0;
    }
    S->scratch.n = 0;
    if (decode(S, nd, &S->scratch) < 0)
        return -1;
    *p = S->scratch.p;
    *len = (Py_ssize_t)S->scratch.n;
    return 0;
}

/* ---- values of a tensor entry ---- */

#ifdef __SIZEOF_INT128__
#define POW5_MIN (-342)
#define POW5_MAX 308
static const uint64_t POW5[POW5_MAX - POW5_MIN + 1][2];  /* defined at the end of the file */

/* The Eisel-Lemire algorithm (D. Lemire, "Number Parsing at a Gigabyte per Second", 2021; as in fast_float and
 * Rust's core::num::dec2flt): the IEEE bits of w * 10^q (w != 0) correctly rounded, or 0 when it cannot decide
 * (the caller then asks dtoa). Correct rounding has one answer, so a decided result is bit for bit what
 * float() gives; it spares dtoa's big-integer correction, most of the scan's time otherwise. */
static int
eisel_lemire(int64_t q, uint64_t w, uint64_t *bits)
{
    if (q < POW5_MIN) {
        *bits = 0;
        return 1;
    }
    if (q > POW5_MAX) {
        *bits = (uint64_t)0x7FF << 52;
        return 1;
    }
    int lz = __builtin_clzll(w);
    w <<= lz;
    const uint64_t *p5 = POW5[q - POW5_MIN];
    unsigned __int128 first = (unsigned __int128)w * p5[0];
    uint64_t hi = (uint64_t)(first >> 64), lo = (uint64_t)first;
    const uint64_t mask = UINT64_MAX >> 55;  /* 52 explicit bits + 3 */
    if ((hi & mask) == mask) {
        uint64_t second_hi = (uint64_t)(((unsigned __int128)w * p5[1]) >> 64);
        lo += second_hi;
        if (second_hi > lo)
            hi++;
    }
    if (lo == UINT64_MAX && (q < -27 || q > 55))
        return 0;
    int upperbit = (int)(hi >> 63);
    int shift = upperbit + 64 - 52 - 3;
    uint64_t mantissa = hi >> shift;
    int32_t power2 = ((((int32_t)q) * (152170 + 65536)) >> 16) + 63 + upperbit - lz + 1023;
    if (power2 <= 0) {  /* subnormal */
        if (-power2 + 1 >= 64) {
            *bits = 0;
            return 1;
        }
        mantissa >>= -power2 + 1;
        mantissa += mantissa & 1;
        mantissa >>= 1;
        *bits = mantissa | ((uint64_t)(mantissa < ((uint64_t)1 << 52) ? 0 : 1) << 52);
        return 1;
    }
    if (lo <= 1 && q >= -4 && q <= 23 && (mantissa & 3) == 1 && (mantissa << shift) == hi)
        mantissa &= ~(uint64_t)1;  /* exactly halfway: to even */
    mantissa += mantissa & 1;
    mantissa >>= 1;
    if (mantissa >= ((uint64_t)2 << 52)) {
        mantissa = (uint64_t)1 << 52;
        power2++;
    }
    mantissa &= ~((uint64_t)1 << 52);
    if (power2 >= 0x7FF) {
        *bits = (uint64_t)0x7FF << 52;
        return 1;
    }
    *bits = mantissa | ((uint64_t)power2 << 52);
    return 1;
}

/* a JSON number token (scan_number's grammar) as w * 10^q: 0 when it has more than 19 significant digits */
static int
decimal_of(const unsigned char *p, const unsigned char *e, int *neg, uint64_t *w, int64_t *q)
{
    uint64_t v = 0;
    int64_t exp10 = 0;
    int digits = 0;
    *neg = *p == '-';
    if (*neg)
        p++;
    for (; p < e && is_digit(*p); p++) {
        if (v || *p != '0') {
            if (++digits > 19)
                return 0;
            v = v * 10 + (uint64_t)(*p - '0');
        }
    }
    if (p < e && *p == '.') {
        for (p++; p < e && is_digit(*p); p++) {
            exp10--;
            if (v || *p != '0') {
                if (++digits > 19)
                    return 0;
                v = v * 10 + (uint64_t)(*p - '0');
            }
        }
    }
    if (p < e) {  /* e or E */
        p++;
        int eneg = *p == '-';
        if (*p == '-' || *p == '+')
            p++;
        int64_t x = 0;
        for (; p < e; p++)
            if (x < 100000)
                x = x * 10 + (*p - '0');
        exp10 += eneg ? -x : x;
    }
    *w = v;
    *q = exp10;
    return 1;
}
#endif

/* float() of a number token */
static int
parse_double(Scanner *S, const Node *nd, double *out)
{
    Py_ssize_t k = nd->end - nd->start;
#ifdef __SIZEOF_INT128__
    int neg;
    uint64_t w, bits;
    int64_t q;
    if (decimal_of(S->s + nd->start, S->s + nd->end, &neg, &w, &q)) {
        if (w == 0) {
            *out = neg ? -0.0 : 0.0;
            return 0;
        }
        if (eisel_lemire(q, w, &bits)) {
            bits |= (uint64_t)neg << 63;
            memcpy(out, &bits, 8);
            return 0;
        }
    }
#endif
    char tok[MAX_NUMBER + 1];
    memcpy(tok, S->s + nd->start, (size_t)k);
    tok[k] = '\0';
    char *end = NULL;
    double v = PyOS_string_to_double(tok, &end, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return fail(S, "number", nd->start);
    }
    if (end != tok + k)
        return fail(S, "number", nd->start);
    *out = v;
    return 0;
}

static inline int
strip_char(unsigned char c)
{  /* the ASCII characters str.strip() strips */
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

/* stats._num: 1 and *out for a number, 0 for None, -1 Unhandled */
static int
num(Scanner *S, const Node *nd, double *out)
{
    switch (nd->kind) {
    case N_TRUE:
        *out = 1.0;
        return 1;
    case N_FALSE:
        *out = 0.0;
        return 1;
    case N_NAN:
        *out = NAN_VALUE;
        return 1;
    case N_INF:
        *out = Py_HUGE_VAL;
        return 1;
    case N_NINF:
        *out = -Py_HUGE_VAL;
        return 1;
    case N_FLT:
        return parse_double(S, nd, out) < 0 ? -1 : 1;
    case N_INT:
        /* float(int): correctly rounded as strtod is; an int has no sign of zero; too big raises there */
        if (parse_double(S, nd, out) < 0)
            return -1;
        if (*out == 0.0)
            *out = 0.0;
        else if (*out == Py_HUGE_VAL || *out == -Py_HUGE_VAL)
            return fail(S, "integer statistic too large", nd->start);
        return 1;
    case N_STR: {  /* is_nonfinite(value) -> float(value.strip()) */
        const char *p;
        Py_ssize_t len;
        if (text_of(S, nd, &p, &len) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < len; i++)
            if ((unsigned char)p[i] >= 0x80)
                return fail(S, "non-ASCII statistic text", nd->start);
        while (len && strip_char((unsigned char)p[0])) {
            p++;
            len--;
        }
        while (len && strip_char((unsigned char)p[len - 1]))
            len--;
        /* is_nonfinite: the stripped text, lowered, one of nan, [+-]inf, [+-]infinity */
        char low[9];
        if (len == 0 || len > 9)
            return 0;
        for (Py_ssize_t i = 0; i < len; i++)
            low[i] = (char)(p[i] >= 'A' && p[i] <= 'Z' ? p[i] + 32 : p[i]);
        const char *w = low;
        Py_ssize_t wl = len;
        int sign = 0;
        if (w[0] == '-' || w[0] == '+') {
            sign = w[0] == '-' ? -1 : 1;
            w++;
            wl--;
        }
        if (!sign && wl == 3 && memcmp(w, "nan", 3) == 0) {
            *out = NAN_VALUE;
            return 1;
        }
        if ((wl == 3 && memcmp(w, "inf", 3) == 0) || (wl == 8 && memcmp(w, "infinity", 8) == 0)) {
            *out = sign < 0 ? -Py_HUGE_VAL : Py_HUGE_VAL;
            return 1;
        }
        return 0;
    }
    default:
        return 0;
    }
}

static int
parse_int64(Scanner *S, const Node *nd, int64_t *out)
{
    const unsigned char *s = S->s;
    Py_ssize_t i = nd->start, end = nd->end;
    int neg = s[i] == '-';
    if (neg)
        i++;
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; i < end; i++) {
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (lim - d) / 10)
            return fail(S, "shape out of int64", nd->start);
        v = v * 10 + d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

/* ---- the walk ---- */

static inline const char *
key_ptr(Scanner *S, const Mem *m)
{
    return m->arena ? S->arena.p + m->k : (const char *)S->s + m->k;
}

static inline int
key_is(Scanner *S, const Mem *m, const char *word, Py_ssize_t len)
{
    return m->kl == len && memcmp(key_ptr(S, m), word, (size_t)len) == 0;
}

#define KEY_IS(S, m, lit) key_is((S), (m), lit, (Py_ssize_t)sizeof(lit) - 1)

static uint64_t
hash_bytes(const char *p, Py_ssize_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h;
}

/* whether two members of the object being walked have the same key (json.loads: the last wins) */
static int
has_duplicate(Scanner *S, size_t base, size_t count)
{
    Mem *m = S->mem + base;
    if (count <= 16) {
        for (size_t a = 1; a < count; a++)
            for (size_t b = 0; b < a; b++)
                if (m[a].kl == m[b].kl && memcmp(key_ptr(S, &m[a]), key_ptr(S, &m[b]), (size_t)m[a].kl) == 0)
                    return 1;
        return 0;
    }
    size_t size = 32;
    while (size < 2 * count)
        size *= 2;
    size_t *slot = PyMem_Calloc(size, sizeof(size_t));  /* member index + 1; 0 empty */
    if (slot == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int found = 0;
    for (size_t a = 0; a < count && !found; a++) {
        const char *ka = key_ptr(S, &m[a]);
        size_t h = (size_t)hash_bytes(ka, m[a].kl) & (size - 1);
        while (slot[h]) {
            Mem *o = &m[slot[h] - 1];
            if (o->kl == m[a].kl && memcmp(key_ptr(S, o), ka, (size_t)o->kl) == 0) {
                found = 1;
                break;
            }
            h = (h + 1) & (size - 1);
        }
        slot[h] = a + 1;
    }
    PyMem_Free(slot);
    return found;
}

enum { F_DTYPE, F_SHAPE, F_MAX, F_MIN, F_MEAN, F_NORM, F_MD5, F_DATA_NAME, F_PLACEMENTS, F_MESH, F_ERROR, NF };

static int
span_put(PyObject *list, Py_ssize_t row, const Node *nd)
{
    PyObject *t = Py_BuildValue("(nnn)", row, nd->start, nd->end);
    if (t == NULL)
        return -1;
    int rc = PyList_Append(list, t);
    Py_DECREF(t);
    return rc;
}

static int
put_str_field(Scanner *S, StrCol *c, int64_t at)
{
    if (at < 0 || S->tape[at].kind != N_STR)
        return str_null(c);
    /* decoded straight into the column's data, then its offset */
    if (decode(S, &S->tape[at], &c->data) < 0)
        return -1;
    return str_put(S, c, NULL, 0);
}

static int
row_begin(Scanner *S)
{
    int32_t pos = (int32_t)S->records, rec = (int32_t)S->recs;
    if (S->records > INT32_MAX)
        return fail(S, "too many records", S->pos);
    if (buf_put(&S->position, &pos, 4) < 0 || buf_put(&S->recidx, &rec, 4) < 0)
        return -1;
    return 0;
}

/* one row for the tensor entry whose members are S->mem[base:base + count], at S->path */
static int
emit_tensor(Scanner *S, size_t base, size_t count)
{
    int64_t f[NF];
    for (int k = 0; k < NF; k++)
        f[k] = -1;
    for (size_t a = 0; a < count; a++) {
        Mem *m = &S->mem[base + a];
        int k = -1;
        switch (m->kl) {
        case 3:
            k = KEY_IS(S, m, "Max") ? F_MAX : KEY_IS(S, m, "Min") ? F_MIN : KEY_IS(S, m, "md5") ? F_MD5 : -1;
            break;
        case 4:
            k = KEY_IS(S, m, "Mean") ? F_MEAN : KEY_IS(S, m, "Norm") ? F_NORM : -1;
            break;
        case 5:
            k = KEY_IS(S, m, "dtype") ? F_DTYPE : KEY_IS(S, m, "shape") ? F_SHAPE : KEY_IS(S, m, "error") ? F_ERROR : -1;
            break;
        case 9:
            k = KEY_IS(S, m, "data_name") ? F_DATA_NAME : -1;
            break;
        case 10:
            k = KEY_IS(S, m, "placements") ? F_PLACEMENTS : -1;
            break;
        case 11:
            k = KEY_IS(S, m, "device_mesh") ? F_MESH : -1;
            break;
        }
        if (k >= 0)
            f[k] = m->v;
    }
    Py_ssize_t row = S->rows;
    if (row_begin(S) < 0 || str_put(S, &S->arg, S->path.p, S->path.n) < 0 ||
        put_str_field(S, &S->dtype, f[F_DTYPE]) < 0)
        return -1;
    /* shape: a list of int64, else null */
    ListCol *sh = &S->shape;
    if (f[F_SHAPE] >= 0 && S->tape[f[F_SHAPE]].kind == N_ARR) {
        const Node *arr = &S->tape[f[F_SHAPE]];
        for (uint32_t j = (uint32_t)f[F_SHAPE] + 1; j < arr->next; j = S->tape[j].next) {
            int64_t v;
            if (S->tape[j].kind != N_INT)
                return fail(S, "shape holds a value other than an integer", S->tape[j].start);
            if (parse_int64(S, &S->tape[j], &v) < 0 || buf_put(&sh->vals, &v, 8) < 0)
                return -1;
            sh->nvals++;
        }
        if (sh->nvals > INT32_MAX)
            return fail(S, "shape column too large", S->pos);
        if (bit_put(&sh->valid, sh->len, 1) < 0)
            return -1;
    } else {
        if (bit_put(&sh->valid, sh->len, 0) < 0)
            return -1;
        sh->nulls++;
    }
    int32_t o = (int32_t)sh->nvals;
    if (buf_put(&sh->off, &o, 4) < 0)
        return -1;
    sh->len++;
    for (int k = 0; k < 4; k++) {
        double v = 0.0;
        int ok = 0;
        if (f[F_MAX + k] >= 0 && (ok = num(S, &S->tape[f[F_MAX + k]], &v)) < 0)
            return -1;
        if (f64_put(&S->stat[k], ok, v) < 0)
            return -1;
    }
    if (f[F_MD5] >= 0 && S->tape[f[F_MD5]].kind != N_STR && S->tape[f[F_MD5]].kind != N_NULL)
        return fail(S, "md5 is not a string", S->tape[f[F_MD5]].start);
    if (put_str_field(S, &S->md5, f[F_MD5]) < 0 || put_str_field(S, &S->data_name, f[F_DATA_NAME]) < 0 ||
        put_str_field(S, &S->error, f[F_ERROR]) < 0)
        return -1;
    if (f[F_PLACEMENTS] >= 0 && S->tape[f[F_PLACEMENTS]].kind == N_ARR &&
        span_put(S->placements, row, &S->tape[f[F_PLACEMENTS]]) < 0)
        return -1;
    if (f[F_MESH] >= 0 && S->tape[f[F_MESH]].kind == N_ARR && span_put(S->mesh, row, &S->tape[f[F_MESH]]) < 0)
        return -1;
    S->rows++;
    return 0;
}

/* the row of a record without a tensor entry */
static int
emit_empty(Scanner *S)
{
    if (row_begin(S) < 0 || str_null(&S->arg) < 0 || str_null(&S->dtype) < 0 || str_null(&S->md5) < 0 ||
        str_null(&S->data_name) < 0 || str_null(&S->error) < 0)
        return -1;
    for (int k = 0; k < 4; k++)
        if (f64_put(&S->stat[k], 0, 0.0) < 0)
            return -1;
    ListCol *sh = &S->shape;
    int32_t o = (int32_t)sh->nvals;
    if (bit_put(&sh->valid, sh->len, 0) < 0 || buf_put(&sh->off, &o, 4) < 0)
        return -1;
    sh->len++;
    sh->nulls++;
    S->rows++;
    return 0;
}

static int
path_push(Scanner *S, const char *p, size_t n)
{
    if (S->path.n) {
        char dot = '.';
        if (buf_put(&S->path, &dot, 1) < 0)
            return -1;
    }
    return buf_put(&S->path, p, n);
}

static int
ends_with(const char *p, Py_ssize_t n, const char *word)
{
    Py_ssize_t k = (Py_ssize_t)strlen(word);
    return n >= k && memcmp(p + n - k, word, (size_t)k) == 0;
}

/* index._tensors from node i, at S->path */
static int
walk(Scanner *S, uint32_t i)
{
    const Node *nd = &S->tape[i];
    uint32_t stop = nd->next;
    size_t saved = S->path.n;
    if (nd->kind == N_ARR) {
        Py_ssize_t index = 0;
        for (uint32_t j = i + 1; j < stop; j = S->tape[j].next, index++) {
            uint8_t kind = S->tape[j].kind;
            if (kind != N_OBJ && kind != N_ARR)
                continue;
            char digits[24], *d = digits + sizeof digits;
            Py_ssize_t x = index;
            do {
                *--d = (char)('0' + x % 10);
                x /= 10;
            } while (x);
            if (path_push(S, d, (size_t)(digits + sizeof digits - d)) < 0 || walk(S, j) < 0)
                return -1;
            S->path.n = saved;
        }
        return 0;
    }
    if (nd->kind != N_OBJ)
        return 0;
    size_t base = S->nmem, arena = S->arena.n;
    int tensor = 0;
    int64_t type_at = -1;
    for (uint32_t j = i + 1; j < stop; j = S->tape[j + 1].next) {
        if (S->nmem == S->mcap) {
            size_t cap = S->mcap ? S->mcap * 2 : 64;
            Mem *m = PyMem_Realloc(S->mem, cap * sizeof(Mem));
            if (m == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            S->mem = m;
            S->mcap = cap;
        }
        const Node *key = &S->tape[j];
        Mem *m = &S->mem[S->nmem++];
        m->v = j + 1;
        if (key->esc) {
            size_t at = S->arena.n;
            if (decode(S, key, &S->arena) < 0)
                return -1;
            m = &S->mem[S->nmem - 1];
            m->k = (Py_ssize_t)at;
            m->kl = (Py_ssize_t)(S->arena.n - at);
            m->arena = 1;
        } else {
            m->k = key->start;
            m->kl = key->end - key->start;
            m->arena = 0;
        }
        switch (m->kl) {
        case 3:
            tensor |= KEY_IS(S, m, "Max") || KEY_IS(S, m, "Min") || KEY_IS(S, m, "md5");
            break;
        case 4:
            tensor |= KEY_IS(S, m, "Norm") || KEY_IS(S, m, "Mean");
            if (KEY_IS(S, m, "type"))
                type_at = m->v;
            break;
        }
    }
    size_t count = S->nmem - base;
    int dup = has_duplicate(S, base, count);
    if (dup < 0)
        return -1;
    if (dup)
        return fail(S, "a key twice in an object", nd->start);
    if (!tensor && type_at >= 0 && S->tape[type_at].kind == N_STR) {
        /* str(value.get("type", "")).endswith(("Tensor", "ndarray")): only a str can end so */
        const char *p;
        Py_ssize_t len;
        if (text_of(S, &S->tape[type_at], &p, &len) < 0)
            return -1;
        tensor = ends_with(p, len, "Tensor") || ends_with(p, len, "ndarray");
    }
    if (tensor) {
        if (emit_tensor(S, base, count) < 0)
            return -1;
    } else {
        for (size_t a = 0; a < count; a++) {
            const Mem *m = &S->mem[base + a];
            uint8_t kind = S->tape[m->v].kind;
            if (kind != N_OBJ && kind != N_ARR)
                continue;
            uint32_t v = m->v;
            /* the key's bytes may sit in the arena, which path_push does not move */
            if (path_push(S, key_ptr(S, m), (size_t)m->kl) < 0 || walk(S, v) < 0)
                return -1;
            S->path.n = saved;
        }
    }
    S->nmem = base;
    S->arena.n = arena;
    return 0;
}

/* ---- record names grouped for index._kind ----
 * names.parse answers (kind, direction) from the name's "."-separated parts: how many there are, whether a
 * part is all digits (and then int() of it), and whether a part is one of the words of the format (Module,
 * Cell, forward, backward, parameters_grad, debug: none with a digit). Writing each run of ASCII digits as
 * "0" changes none of these for an ASCII name (int() takes any ASCII digit string of at most 640 digits), so
 * names equal once so written (Functional.linear.0.forward, Functional.linear.17.forward) get one answer,
 * which index.py asks of the group's first name only: one names.parse per group, not per record. Other
 * names form a group with their exact copies only (index._kind's own cache). test_index_jrows checks the
 * premise against names.parse. */
#define GROUP_NAME_MAX 600

static int
group_of(Scanner *S, const char *name, size_t len, int32_t *out)
{
    Buf *k = &S->gkey;
    k->n = 0;
    int ascii = len <= GROUP_NAME_MAX;
    for (size_t i = 0; ascii && i < len; i++)
        ascii = (unsigned char)name[i] < 0x80;
    char tag = ascii ? 1 : 0;
    if (buf_put(k, &tag, 1) < 0)
        return -1;
    if (!ascii) {
        if (buf_put(k, name, len) < 0)
            return -1;
    } else {
        if (buf_grow(k, len) < 0)
            return -1;
        for (size_t i = 0; i < len; i++) {
            char c = name[i];
            if (c >= '0' && c <= '9') {
                while (i + 1 < len && name[i + 1] >= '0' && name[i + 1] <= '9')
                    i++;
                c = '0';
            }
            k->p[k->n++] = c;
        }
    }
    uint64_t h = hash_bytes(k->p, (Py_ssize_t)k->n);
    if (2 * (S->ngroups + 1) > S->gcap) {  /* grow the table, rehashing */
        size_t cap = S->gcap ? S->gcap * 2 : 1024;
        GEnt *t = PyMem_Calloc(cap, sizeof(GEnt));
        if (t == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < S->gcap; i++) {
            if (!S->gtab[i].len)
                continue;
            size_t j = (size_t)S->gtab[i].hash & (cap - 1);
            while (t[j].len)
                j = (j + 1) & (cap - 1);
            t[j] = S->gtab[i];
        }
        PyMem_Free(S->gtab);
        S->gtab = t;
        S->gcap = cap;
    }
    size_t j = (size_t)h & (S->gcap - 1);
    for (; S->gtab[j].len; j = (j + 1) & (S->gcap - 1)) {
        GEnt *e = &S->gtab[j];
        if (e->hash == h && e->len == k->n && memcmp(S->gkeys.p + e->off, k->p, k->n) == 0)
            break;
    }
    GEnt *e = &S->gtab[j];
    if (!e->len) {  /* a new group: its first name goes to Python */
        if (S->ngroups >= (size_t)INT32_MAX)
            return fail(S, "too many record names", S->pos);
        e->hash = h;
        e->off = S->gkeys.n;
        e->len = k->n;  /* never 0: the tag */
        e->id = (int32_t)S->ngroups;
        if (buf_put(&S->gkeys, k->p, k->n) < 0)
            return -1;
        PyObject *first = PyUnicode_DecodeUTF8(name, (Py_ssize_t)len, "strict");
        if (first == NULL)
            return -1;
        int rc = PyList_Append(S->fresh, first);
        Py_DECREF(first);
        if (rc < 0)
            return -1;
        S->ngroups++;
    }
    int32_t g = e->id;
    /* its index among the chunk's groups */
    if ((size_t)g >= S->glcap) {
        size_t cap = S->glcap ? S->glcap : 1024;
        while (cap <= (size_t)g)
            cap *= 2;
        int32_t *t = PyMem_Realloc(S->glocal, cap * sizeof(int32_t));
        if (t == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = S->glcap; i < cap; i++)
            t[i] = -1;
        S->glocal = t;
        S->glcap = cap;
    }
    if (S->glocal[g] < 0) {
        S->glocal[g] = (int32_t)(S->used.n / 4);
        if (buf_put(&S->used, &g, 4) < 0)
            return -1;
    }
    *out = S->glocal[g];
    return 0;
}

/* ---- the Scanner type ---- */

static void
chunk_reset(Scanner *S)
{
    S->rows = S->recs = 0;
    S->first = S->records;
    S->position.n = S->recidx.n = 0;
    for (size_t i = 0; i < S->used.n / 4; i++)
        S->glocal[((int32_t *)S->used.p)[i]] = -1;
    S->local.n = S->used.n = 0;
}

static int
chunk_init(Scanner *S)
{
    chunk_reset(S);
    StrCol *cols[] = {&S->names, &S->arg, &S->dtype, &S->md5, &S->data_name, &S->error};
    for (size_t k = 0; k < sizeof cols / sizeof cols[0]; k++)
        if (col_reset_str(cols[k]) < 0)
            return -1;
    for (int k = 0; k < 4; k++) {
        S->stat[k].data.n = S->stat[k].valid.n = 0;
        S->stat[k].len = S->stat[k].nulls = 0;
    }
    ListCol *sh = &S->shape;
    sh->vals.n = sh->off.n = sh->valid.n = 0;
    sh->len = sh->nulls = sh->nvals = 0;
    int32_t z = 0;
    if (buf_put(&sh->off, &z, 4) < 0)
        return -1;
    Py_XDECREF(S->placements);
    Py_XDECREF(S->mesh);
    Py_XDECREF(S->fresh);
    S->placements = PyList_New(0);
    S->mesh = PyList_New(0);
    S->fresh = PyList_New(0);
    return S->placements && S->mesh && S->fresh ? 0 : -1;
}

static void
free_all(Scanner *S)
{
    StrCol *cols[] = {&S->names, &S->arg, &S->dtype, &S->md5, &S->data_name, &S->error};
    for (size_t k = 0; k < sizeof cols / sizeof cols[0]; k++) {
        buf_free(&cols[k]->data);
        buf_free(&cols[k]->off);
        buf_free(&cols[k]->valid);
    }
    for (int k = 0; k < 4; k++) {
        buf_free(&S->stat[k].data);
        buf_free(&S->stat[k].valid);
    }
    buf_free(&S->shape.vals);
    buf_free(&S->shape.off);
    buf_free(&S->shape.valid);
    buf_free(&S->position);
    buf_free(&S->recidx);
    buf_free(&S->gkeys);
    buf_free(&S->gkey);
    buf_free(&S->local);
    buf_free(&S->used);
    PyMem_Free(S->gtab);
    S->gtab = NULL;
    S->gcap = S->ngroups = 0;
    PyMem_Free(S->glocal);
    S->glocal = NULL;
    S->glcap = 0;
    buf_free(&S->arena);
    buf_free(&S->scratch);
    buf_free(&S->path);
    PyMem_Free(S->tape);
    S->tape = NULL;
    S->nt = S->tcap = 0;
    PyMem_Free(S->mem);
    S->mem = NULL;
    S->nmem = S->mcap = 0;
}

static void
release(Scanner *S)
{
    if (S->held) {
        PyBuffer_Release(&S->view);
        S->held = 0;
    }
    S->s = NULL;
    S->n = 0;
}

static void
Scanner_dealloc(Scanner *S)
{
    release(S);
    free_all(S);
    Py_XDECREF(S->header);
    Py_XDECREF(S->placements);
    Py_XDECREF(S->mesh);
    Py_XDECREF(S->fresh);
    Py_TYPE(S)->tp_free((PyObject *)S);
}

static int
Scanner_init(Scanner *S, PyObject *args, PyObject *kwds)
{
    PyObject *obj;
    static char *kwlist[] = {"buffer", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:Scanner", kwlist, &obj))
        return -1;
    release(S);
    free_all(S);
    if (PyObject_GetBuffer(obj, &S->view, PyBUF_SIMPLE) < 0)
        return -1;
    S->held = 1;
    S->s = (const unsigned char *)S->view.buf;
    S->n = S->view.len;
    S->pos = 0;
    S->state = ST_BEGIN;
    S->records = 0;
    S->why = NULL;
    Py_XDECREF(S->header);
    S->header = PyList_New(0);
    if (S->header == NULL)
        return -1;
    return chunk_init(S);
}

static PyObject *
bytes_of(const Buf *b)
{
    return PyBytes_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)b->n);
}

static PyObject *
str_tuple(const StrCol *c)
{
    return Py_BuildValue("(NNNn)", bytes_of(&c->valid), bytes_of(&c->off), bytes_of(&c->data), c->nulls);
}

static PyObject *
f64_tuple(const F64Col *c)
{
    return Py_BuildValue("(NNn)", bytes_of(&c->valid), bytes_of(&c->data), c->nulls);
}

/* the chunk's columns as a dict of bytes (index.py wraps them as Arrow arrays) */
static PyObject *
chunk_dict(Scanner *S)
{
    /* N: a new reference, handed over; O: the scanner's own, shared */
    return Py_BuildValue(
        "{s:n,s:n,s:n,s:n,s:N,s:N,s:O,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:(NNNnn),s:O,s:O}",
        "rows", S->rows, "records", S->recs, "first", S->first, "end", S->pos,
        "group", bytes_of(&S->local), "groups", bytes_of(&S->used), "new_groups", S->fresh,
        "names", str_tuple(&S->names), "position", bytes_of(&S->position), "record", bytes_of(&S->recidx),
        "arg", str_tuple(&S->arg), "dtype", str_tuple(&S->dtype), "md5", str_tuple(&S->md5),
        "data_name", str_tuple(&S->data_name), "error", str_tuple(&S->error),
        "max", f64_tuple(&S->stat[0]), "min", f64_tuple(&S->stat[1]), "mean", f64_tuple(&S->stat[2]),
        "norm", f64_tuple(&S->stat[3]),
        "shape", bytes_of(&S->shape.valid), bytes_of(&S->shape.off), bytes_of(&S->shape.vals), S->shape.nulls,
        S->shape.nvals,
        "placements", S->placements, "device_mesh", S->mesh);
}

/* a top-level key at S->pos: decoded into S->scratch, and its colon */
static int
top_key(Scanner *S)
{
    if (S->pos >= S->n || S->s[S->pos] != '"')
        return fail(S, "expected a key", S->pos);
    S->nt = 0;
    if (scan_string(S) < 0)
        return -1;
    S->scratch.n = 0;
    if (decode(S, &S->tape[0], &S->scratch) < 0)
        return -1;
    skip_ws(S);
    if (S->pos >= S->n || S->s[S->pos] != ':')
        return fail(S, "expected ':'", S->pos);
    S->pos++;
    skip_ws(S);
    return 0;
}

/* past an object's '{': '}' at once (next state `empty`) or its first member (next state `members`) */
static void
open_object(Scanner *S, int empty, int members)
{
    S->pos++;
    skip_ws(S);
    if (S->pos < S->n && S->s[S->pos] == '}') {
        S->pos++;
        S->state = empty;
    } else {
        S->state = members;
    }
}

/* after a member of an object: ',' (next state `more`) or '}' (next state `done`) */
static int
separator(Scanner *S, int more, int done)
{
    skip_ws(S);
    if (S->pos < S->n && S->s[S->pos] == ',') {
        S->pos++;
        skip_ws(S);
        S->state = more;
        return 0;
    }
    if (S->pos < S->n && S->s[S->pos] == '}') {
        S->pos++;
        S->state = done;
        return 0;
    }
    return fail(S, "expected ',' or '}'", S->pos);
}

static int
step(Scanner *S)
{
    switch (S->state) {
    case ST_BEGIN:
        skip_ws(S);
        if (S->pos >= S->n || S->s[S->pos] != '{')
            return fail(S, "expected '{'", S->pos);
        open_object(S, ST_END, ST_KEY);
        return 0;
    case ST_KEY: {
        if (top_key(S) < 0)
            return -1;
        int data = S->scratch.n == 4 && memcmp(S->scratch.p, "data", 4) == 0;
        if (data && S->pos < S->n && S->s[S->pos] == '{') {
            open_object(S, ST_AFTER, ST_RECORD);
            return 0;
        }
        PyObject *key = data ? NULL : PyUnicode_DecodeUTF8(S->scratch.p, (Py_ssize_t)S->scratch.n, "strict");
        if (!data && key == NULL)
            return -1;
        Py_ssize_t start = S->pos;
        S->nt = 0;
        if (scan_value(S, 1) < 0) {
            Py_XDECREF(key);
            return -1;
        }
        if (!data) {
            PyObject *t = Py_BuildValue("(Nnn)", key, start, S->pos);
            if (t == NULL || PyList_Append(S->header, t) < 0) {
                Py_XDECREF(t);
                return -1;
            }
            Py_DECREF(t);
        }
        S->state = ST_AFTER;
        return 0;
    }
    case ST_AFTER:
        return separator(S, ST_KEY, ST_END);
    case ST_RECORD: {
        if (S->pos >= S->n || S->s[S->pos] != '"')
            return fail(S, "expected a record name", S->pos);
        S->nt = 0;
        if (scan_string(S) < 0)
            return -1;
        skip_ws(S);
        if (S->pos >= S->n || S->s[S->pos] != ':')
            return fail(S, "expected ':'", S->pos);
        S->pos++;
        skip_ws(S);
        if (scan_value(S, 1) < 0)
            return -1;
        S->scratch.n = 0;
        int32_t group;
        if (decode(S, &S->tape[0], &S->scratch) < 0 || str_put(S, &S->names, S->scratch.p, S->scratch.n) < 0 ||
            group_of(S, S->scratch.p, S->scratch.n, &group) < 0 || buf_put(&S->local, &group, 4) < 0)
            return -1;
        Py_ssize_t before = S->rows;
        S->path.n = 0;
        S->nmem = 0;
        S->arena.n = 0;
        if (walk(S, 1) < 0)
            return -1;
        if (S->rows == before && emit_empty(S) < 0)
            return -1;
        S->records++;
        S->recs++;
        return separator(S, ST_RECORD, ST_AFTER);
    }
    case ST_END:
        skip_ws(S);
        if (S->pos != S->n)
            return fail(S, "data after the document", S->pos);
        S->state = ST_DONE;
        return 0;
    }
    return fail(S, "scanner state", S->pos);
}

static PyObject *
Scanner_next(Scanner *S, PyObject *arg)
{
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    if (S->state == ST_FAILED) {
        PyErr_SetString(Unhandled, "the scanner failed before");
        return NULL;
    }
    if (S->s == NULL) {
        PyErr_SetString(PyExc_ValueError, "the scanner is closed");
        return NULL;
    }
    if (chunk_init(S) < 0)
        return NULL;
    while (S->state != ST_DONE && S->rows < limit) {
        if (step(S) < 0) {
            S->state = ST_FAILED;
            if (!PyErr_Occurred())
                PyErr_Format(Unhandled, "%s at byte %zd", S->why ? S->why : "unhandled", S->at);
            return NULL;
        }
    }
    if (S->rows == 0)
        Py_RETURN_NONE;
    return chunk_dict(S);
}

static PyObject *
Scanner_header(Scanner *S, PyObject *Py_UNUSED(ignored))
{
    Py_INCREF(S->header);
    return S->header;
}

static PyObject *
Scanner_close(Scanner *S, PyObject *Py_UNUSED(ignored))
{
    release(S);
    Py_RETURN_NONE;
}

static PyMethodDef Scanner_methods[] = {
    {"next", (PyCFunction)Scanner_next, METH_O,
     "next(limit) -> dict | None: the columns of the next records' rows (at least limit rows unless the "
     "document ends first); None when there are no more. Raises Unhandled on what the Python path decides."},
    {"header", (PyCFunction)Scanner_header, METH_NOARGS,
     "header() -> [(key, start, end)]: the top-level members other than data scanned so far, as byte spans."},
    {"close", (PyCFunction)Scanner_close, METH_NOARGS, "close(): release the buffer."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe_readers._jrows.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(buffer): the index rows of a whole dump.json, column-wise (see the module's comment).",
    .tp_methods = Scanner_methods,
    .tp_init = (initproc)Scanner_init,
    .tp_new = PyType_GenericNew,
};

/* _pow5(q) -> (high, low): the table's entry for 5^q (for the tests); None without the fast path */
static PyObject *
pow5(PyObject *self, PyObject *arg)
{
    long q = PyLong_AsLong(arg);
    if (q == -1 && PyErr_Occurred())
        return NULL;
#ifdef __SIZEOF_INT128__
    if (q < POW5_MIN || q > POW5_MAX) {
        PyErr_SetString(PyExc_ValueError, "q out of the table");
        return NULL;
    }
    return Py_BuildValue("(KK)", (unsigned long long)POW5[q - POW5_MIN][0],
                         (unsigned long long)POW5[q - POW5_MIN][1]);
#else
    Py_RETURN_NONE;
#endif
}

static PyMethodDef module_methods[] = {
    {"_pow5", pow5, METH_O, "_pow5(q) -> (high, low): the fast float path's 128-bit 5**q (for the tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jrows", NULL, -1, module_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC
PyInit__jrows(void)
{
    for (int c = 0; c < 256; c++)
        STOP[c] = (unsigned char)(c == '"' || c == '\\' || c < 0x20 || c >= 0x80);
    NAN_VALUE = PyOS_string_to_double("nan", NULL, NULL);
    if (PyErr_Occurred())
        return NULL;
    if (PyType_Ready(&ScannerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Unhandled = PyErr_NewException("msprobe_readers._jrows.Unhandled", PyExc_ValueError, NULL);
    if (Unhandled == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(Unhandled);
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Unhandled", Unhandled) < 0 ||
        PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

#ifdef __SIZEOF_INT128__
/* fast_float's 128-bit approximations of 5^q, q from POW5_MIN to POW5_MAX, as (high, low) 64-bit words: made by
 * _pow5_128(q) of tests/readers/test_index_jrows.py (split into its high and low words), which checks them against
 * it through _pow5 */
static const uint64_t POW5[POW5_MAX - POW5_MIN + 1][2] = {
    {0xeef453d6923bd65aULL, 0x113faa2906a13b3fULL},
    {0x9558b4661b6565f8ULL, 0x4ac7ca59a424c507ULL},
    {0xbaaee17fa23ebf76ULL, 0x5d79bcf00d2df649ULL},
    {0xe95a99df8ace6f53ULL, 0xf4d82c2c107973dcULL},
    {0x91d8a02bb6c10594ULL, 0x79071b9b8a4be869ULL},
    {0xb64ec836a47146f9ULL, 0x9748e2826cdee284ULL},
    {0xe3e27a444d8d98b7ULL, 0xfd1b1b2308169b25ULL},
    {0x8e6d8c6ab0787f72ULL, 0xfe30f0f5e50e20f7ULL},
    {0xb208ef855c969f4fULL, 0xbdbd2d335e51a935ULL},
    {0xde8b2b66b3bc4723ULL, 0xad2c788035e61382ULL},
    {0x8b16fb203055ac76ULL, 0x4c3bcb5021afcc31ULL},
    {0xaddcb9e83c6b1793ULL, 0xdf4abe242a1bbf3dULL},
    {0xd953e8624b85dd78ULL, 0xd71d6dad34a2af0dULL},
    {0x87d4713d6f33aa6bULL, 0x8672648c40e5ad68ULL},
    {0xa9c98d8ccb009506ULL, 0x680efdaf511f18c2ULL},
    {0xd43bf0effdc0ba48ULL, 0x0212bd1b2566def2ULL},
    {0x84a57695fe98746dULL, 0x014bb630f7604b57ULL},
    {0xa5ced43b7e3e9188ULL, 0x419ea3bd35385e2dULL},
    {0xcf42894a5dce35eaULL, 0x52064cac828675b9ULL},
    {0x818995ce7aa0e1b2ULL, 0x7343efebd1940993ULL},
    {0xa1ebfb4219491a1fULL, 0x1014ebe6c5f90bf8ULL},
    {0xca66fa129f9b60a6ULL, 0xd41a26e077774ef6ULL},
    {0xfd00b897478238d0ULL, 0x8920b098955522b4ULL},
    {0x9e20735e8cb16382ULL, 0x55b46e5f5d5535b0ULL},
    {0xc5a890362fddbc62ULL, 0xeb2189f734aa831dULL},
    {0xf712b443bbd52b7bULL, 0xa5e9ec7501d523e4ULL},
    {0x9a6bb0aa55653b2dULL, 0x47b233c92125366eULL},
    {0xc1069cd4eabe89f8ULL, 0x999ec0bb696e840aULL},
    {0xf148440a256e2c76ULL, 0xc00670ea43ca250dULL},
    {0x96cd2a865764dbcaULL, 0x380406926a5e5728ULL},
    {0xbc807527ed3e12bcULL, 0xc605083704f5ecf2ULL},
    {0xeba09271e88d976bULL, 0xf7864a44c633682eULL},
    {0x93445b8731587ea3ULL, 0x7ab3ee6afbe0211dULL},
    {0xb8157268fdae9e4cULL, 0x5960ea05bad82964ULL},
    {0xe61acf033d1a45dfULL, 0x6fb92487298e33bdULL},
    {0x8fd0c16206306babULL, 0xa5d3b6d479f8e056ULL},
    {0xb3c4f1ba87bc8696ULL, 0x8f48a4899877186cULL},
    {0xe0b62e2929aba83cULL, 0x331acdabfe94de87ULL},
    {0x8c71dcd9ba0b4925ULL, 0x9ff0c08b7f1d0b14ULL},
    {0xaf8e5410288e1b6fULL, 0x07ecf0ae5ee44dd9ULL},
    {0xdb71e91432b1a24aULL, 0xc9e82cd9f69d6150ULL},
    {0x892731ac9faf056eULL, 0xbe311c083a225cd2ULL},
    {0xab70fe17c79ac6caULL, 0x6dbd630a48aaf406ULL},
    {0xd64d3d9db981787dULL, 0x092cbbccdad5b108ULL},
    {0x85f0468293f0eb4eULL, 0x25bbf56008c58ea5ULL},
    {0xa76c582338ed2621ULL, 0xaf2af2b80af6f24eULL},
    {0xd1476e2c07286faaULL, 0x1af5af660db4aee1ULL},
    {0x82cca4db847945caULL, 0x50d98d9fc890ed4dULL},
    {0xa37fce126597973cULL, 0xe50ff107bab528a0ULL},
    {0xcc5fc196fefd7d0cULL, 0x1e53ed49a96272c8ULL},
    {0xff77b1fcbebcdc4fULL, 0x25e8e89c13bb0f7aULL},
    {0x9faacf3df73609b1ULL, 0x77b191618c54e9acULL},
    {0xc795830d75038c1dULL, 0xd59df5b9ef6a2417ULL},
    {0xf97ae3d0d2446f25ULL, 0x4b0573286b44ad1dULL},
    {0x9becce62836ac577ULL, 0x4ee367f9430aec32ULL},
    {0xc2e801fb244576d5ULL, 0x229c41f793cda73fULL},
    {0xf3a20279ed56d48aULL, 0x6b43527578c1110fULL},
    {0x9845418c345644d6ULL, 0x830a13896b78aaa9ULL},
    {0xbe5691ef416bd60cULL, 0x23cc986bc656d553ULL},
    {0xedec366b11c6cb8fULL, 0x2cbfbe86b7ec8aa8ULL},
    {0x94b3a202eb1c3f39ULL, 0x7bf7d71432f3d6a9ULL},
    {0xb9e08a83a5e34f07ULL, 0xdaf5ccd93fb0cc53ULL},
    {0xe858ad248f5c22c9ULL, 0xd1b3400f8f9cff68ULL},
    {0x91376c36d99995beULL, 0x23100809b9c21fa1ULL},
    {0xb58547448ffffb2dULL, 0xabd40a0c2832a78aULL},
    {0xe2e69915b3fff9f9ULL, 0x16c90c8f323f516cULL},
    {0x8dd01fad907ffc3bULL, 0xae3da7d97f6792e3ULL},
    {0xb1442798f49ffb4aULL, 0x99cd11cfdf41779cULL},
    {0xdd95317f31c7fa1dULL, 0x40405643d711d583ULL},
    {0x8a7d3eef7f1cfc52ULL, 0x482835ea666b2572ULL},
    {0xad1c8eab5ee43b66ULL, 0xda3243650005eecfULL},
    {0xd863b256369d4a40ULL, 0x90bed43e40076a82ULL},
    {0x873e4f75e2224e68ULL, 0x5a7744a6e804a291ULL},
    {0xa90de3535aaae202ULL, 0x711515d0a205cb36ULL},
    {0xd3515c2831559a83ULL, 0x0d5a5b44ca873e03ULL},
    {0x8412d9991ed58091ULL, 0xe858790afe9486c2ULL},
    {0xa5178fff668ae0b6ULL, 0x626e974dbe39a872ULL},
    {0xce5d73ff402d98e3ULL, 0xfb0a3d212dc8128fULL},
    {0x80fa687f881c7f8eULL, 0x7ce66634bc9d0b99ULL},
    {0xa139029f6a239f72ULL, 0x1c1fffc1ebc44e80ULL},
    {0xc987434744ac874eULL, 0xa327ffb266b56220ULL},
    {0xfbe9141915d7a922ULL, 0x4bf1ff9f0062baa8ULL},
    {0x9d71ac8fada6c9b5ULL, 0x6f773fc3603db4a9ULL},
    {0xc4ce17b399107c22ULL, 0xcb550fb4384d21d3ULL},
    {0xf6019da07f549b2bULL, 0x7e2a53a146606a48ULL},
    {0x99c102844f94e0fbULL, 0x2eda7444cbfc426dULL},
    {0xc0314325637a1939ULL, 0xfa911155fefb5308ULL},
    {0xf03d93eebc589f88ULL, 0x793555ab7eba27caULL},
    {0x96267c7535b763b5ULL, 0x4bc1558b2f3458deULL},
    {0xbbb01b9283253ca2ULL, 0x9eb1aaedfb016f16ULL},
    {0xea9c227723ee8bcbULL, 0x465e15a979c1cadcULL},
    {0x92a1958a7675175fULL, 0x0bfacd89ec191ec9ULL},
    {0xb749faed14125d36ULL, 0xcef980ec671f667bULL},
    {0xe51c79a85916f484ULL, 0x82b7e12780e7401aULL},
    {0x8f31cc0937ae58d2ULL, 0xd1b2ecb8b0908810ULL},
    {0xb2fe3f0b8599ef07ULL, 0x861fa7e6dcb4aa15ULL},
    {0xdfbdcece67006ac9ULL, 0x67a791e093e1d49aULL},
    {0x8bd6a141006042bdULL, 0xe0c8bb2c5c6d24e0ULL},
    {0xaecc49914078536dULL, 0x58fae9f773886e18ULL},
    {0xda7f5bf590966848ULL, 0xaf39a475506a899eULL},
    {0x888f99797a5e012dULL, 0x6d8406c952429603ULL},
    {0xaab37fd7d8f58178ULL, 0xc8e5087ba6d33b83ULL},
    {0xd5605fcdcf32e1d6ULL, 0xfb1e4a9a90880a64ULL},
    {0x855c3be0a17fcd26ULL, 0x5cf2eea09a55067fULL},
    {0xa6b34ad8c9dfc06fULL, 0xf42faa48c0ea481eULL},
    {0xd0601d8efc57b08bULL, 0xf13b94daf124da26ULL},
    {0x823c12795db6ce57ULL, 0x76c53d08d6b70858ULL},
    {0xa2cb1717b52481edULL, 0x54768c4b0c64ca6eULL},
    {0xcb7ddcdda26da268ULL, 0xa9942f5dcf7dfd09ULL},
    {0xfe5d54150b090b02ULL, 0xd3f93b35435d7c4cULL},
    {0x9efa548d26e5a6e1ULL, 0xc47bc5014a1a6dafULL},
    {0xc6b8e9b0709f109aULL, 0x359ab6419ca1091bULL},
    {0xf867241c8cc6d4c0ULL, 0xc30163d203c94b62ULL},
    {0x9b407691d7fc44f8ULL, 0x79e0de63425dcf1dULL},
    {0xc21094364dfb5636ULL, 0x985915fc12f542e4ULL},
    {0xf294b943e17a2bc4ULL, 0x3e6f5b7b17b2939dULL},
    {0x979cf3ca6cec5b5aULL, 0xa705992ceecf9c42ULL},
    {0xbd8430bd08277231ULL, 0x50c6ff782a838353ULL},
    {0xece53cec4a314ebdULL, 0xa4f8bf5635246428ULL},
    {0x940f4613ae5ed136ULL, 0x871b7795e136be99ULL},
    {0xb913179899f68584ULL, 0x28e2557b59846e3fULL},
    {0xe757dd7ec07426e5ULL, 0x331aeada2fe589cfULL},
    {0x9096ea6f3848984fULL, 0x3ff0d2c85def7621ULL},
    {0xb4bca50b065abe63ULL, 0x0fed077a756b53a9ULL},
    {0xe1ebce4dc7f16dfbULL, 0xd3e8495912c62894ULL},
    {0x8d3360f09cf6e4bdULL, 0x64712dd7abbbd95cULL},
    {0xb080392cc4349decULL, 0xbd8d794d96aacfb3ULL},
    {0xdca04777f541c567ULL, 0xecf0d7a0fc5583a0ULL},
    {0x89e42caaf9491b60ULL, 0xf41686c49db57244ULL},
    {0xac5d37d5b79b6239ULL, 0x311c2875c522ced5ULL},
    {0xd77485cb25823ac7ULL, 0x7d633293366b828bULL},
    {0x86a8d39ef77164bcULL, 0xae5dff9c02033197ULL},
    {0xa8530886b54dbdebULL, 0xd9f57f830283fdfcULL},
    {0xd267caa862a12d66ULL, 0xd072df63c324fd7bULL},
    {0x8380dea93da4bc60ULL, 0x4247cb9e59f71e6dULL},
    {0xa46116538d0deb78ULL, 0x52d9be85f074e608ULL},
    {0xcd795be870516656ULL, 0x67902e276c921f8bULL},
    {0x806bd9714632dff6ULL, 0x00ba1cd8a3db53b6ULL},
    {0xa086cfcd97bf97f3ULL, 0x80e8a40eccd228a4ULL},
    {0xc8a883c0fdaf7df0ULL, 0x6122cd128006b2cdULL},
    {0xfad2a4b13d1b5d6cULL, 0x796b805720085f81ULL},
    {0x9cc3a6eec6311a63ULL, 0xcbe3303674053bb0ULL},
    {0xc3f490aa77bd60fcULL, 0xbedbfc4411068a9cULL},
    {0xf4f1b4d515acb93bULL, 0xee92fb5515482d44ULL},
    {0x991711052d8bf3c5ULL, 0x751bdd152d4d1c4aULL},
    {0xbf5cd54678eef0b6ULL, 0xd262d45a78a0635dULL},
    {0xef340a98172aace4ULL, 0x86fb897116c87c34ULL},
    {0x9580869f0e7aac0eULL, 0xd45d35e6ae3d4da0ULL},
    {0xbae0a846d2195712ULL, 0x8974836059cca109ULL},
    {0xe998d258869facd7ULL, 0x2bd1a438703fc94bULL},
    {0x91ff83775423cc06ULL, 0x7b6306a34627ddcfULL},
    {0xb67f6455292cbf08ULL, 0x1a3bc84c17b1d542ULL},
    {0xe41f3d6a7377eecaULL, 0x20caba5f1d9e4a93ULL},
    {0x8e938662882af53eULL, 0x547eb47b7282ee9cULL},
    {0xb23867fb2a35b28dULL, 0xe99e619a4f23aa43ULL},
    {0xdec681f9f4c31f31ULL, 0x6405fa00e2ec94d4ULL},
    {0x8b3c113c38f9f37eULL, 0xde83bc408dd3dd04ULL},
    {0xae0b158b4738705eULL, 0x9624ab50b148d445ULL},
    {0xd98ddaee19068c76ULL, 0x3badd624dd9b0957ULL},
    {0x87f8a8d4cfa417c9ULL, 0xe54ca5d70a80e5d6ULL},
    {0xa9f6d30a038d1dbcULL, 0x5e9fcf4ccd211f4cULL},
    {0xd47487cc8470652bULL, 0x7647c3200069671fULL},
    {0x84c8d4dfd2c63f3bULL, 0x29ecd9f40041e073ULL},
    {0xa5fb0a17c777cf09ULL, 0xf468107100525890ULL},
    {0xcf79cc9db955c2ccULL, 0x7182148d4066eeb4ULL},
    {0x81ac1fe293d599bfULL, 0xc6f14cd848405530ULL},
    {0xa21727db38cb002fULL, 0xb8ada00e5a506a7cULL},
    {0xca9cf1d206fdc03bULL, 0xa6d90811f0e4851cULL},
    {0xfd442e4688bd304aULL, 0x908f4a166d1da663ULL},
    {0x9e4a9cec15763e2eULL, 0x9a598e4e043287feULL},
    {0xc5dd44271ad3cdbaULL, 0x40eff1e1853f29fdULL},
    {0xf7549530e188c128ULL, 0xd12bee59e68ef47cULL},
    {0x9a94dd3e8cf578b9ULL, 0x82bb74f8301958ceULL},
    {0xc13a148e3032d6e7ULL, 0xe36a52363c1faf01ULL},
    {0xf18899b1bc3f8ca1ULL, 0xdc44e6c3cb279ac1ULL},
    {0x96f5600f15a7b7e5ULL, 0x29ab103a5ef8c0b9ULL},
    {0xbcb2b812db11a5deULL, 0x7415d448f6b6f0e7ULL},
    {0xebdf661791d60f56ULL, 0x111b495b3464ad21ULL},
    {0x936b9fcebb25c995ULL, 0xcab10dd900beec34ULL},
    {0xb84687c269ef3bfbULL, 0x3d5d514f40eea742ULL},
    {0xe65829b3046b0afaULL, 0x0cb4a5a3112a5112ULL},
    {0x8ff71a0fe2c2e6dcULL, 0x47f0e785eaba72abULL},
    {0xb3f4e093db73a093ULL, 0x59ed216765690f56ULL},
    {0xe0f218b8d25088b8ULL, 0x306869c13ec3532cULL},
    {0x8c974f7383725573ULL, 0x1e414218c73a13fbULL},
    {0xafbd2350644eeacfULL, 0xe5d1929ef90898faULL},
    {0xdbac6c247d62a583ULL, 0xdf45f746b74abf39ULL},
    {0x894bc396ce5da772ULL, 0x6b8bba8c328eb783ULL},
    {0xab9eb47c81f5114fULL, 0x066ea92f3f326564ULL},
    {0xd686619ba27255a2ULL, 0xc80a537b0efefebdULL},
    {0x8613fd0145877585ULL, 0xbd06742ce95f5f36ULL},
    {0xa798fc4196e952e7ULL, 0x2c48113823b73704ULL},
    {0xd17f3b51fca3a7a0ULL, 0xf75a15862ca504c5ULL},
    {0x82ef85133de648c4ULL, 0x9a984d73dbe722fbULL},
    {0xa3ab66580d5fdaf5ULL, 0xc13e60d0d2e0ebbaULL},
    {0xcc963fee10b7d1b3ULL, 0x318df905079926a8ULL},
    {0xffbbcfe994e5c61fULL, 0xfdf17746497f7052ULL},
    {0x9fd561f1fd0f9bd3ULL, 0xfeb6ea8bedefa633ULL},
    {0xc7caba6e7c5382c8ULL, 0xfe64a52ee96b8fc0ULL},
    {0xf9bd690a1b68637bULL, 0x3dfdce7aa3c673b0ULL},
    {0x9c1661a651213e2dULL, 0x06bea10ca65c084eULL},
    {0xc31bfa0fe5698db8ULL, 0x486e494fcff30a62ULL},
    {0xf3e2f893dec3f126ULL, 0x5a89dba3c3efccfaULL},
    {0x986ddb5c6b3a76b7ULL, 0xf89629465a75e01cULL},
    {0xbe89523386091465ULL, 0xf6bbb397f1135823ULL},
    {0xee2ba6c0678b597fULL, 0x746aa07ded582e2cULL},
    {0x94db483840b717efULL, 0xa8c2a44eb4571cdcULL},
    {0xba121a4650e4ddebULL, 0x92f34d62616ce413ULL},
    {0xe896a0d7e51e1566ULL, 0x77b020baf9c81d17ULL},
    {0x915e2486ef32cd60ULL, 0x0ace1474dc1d122eULL},
    {0xb5b5ada8aaff80b8ULL, 0x0d819992132456baULL},
    {0xe3231912d5bf60e6ULL, 0x10e1fff697ed6c69ULL},
    {0x8df5efabc5979c8fULL, 0xca8d3ffa1ef463c1ULL},
    {0xb1736b96b6fd83b3ULL, 0xbd308ff8a6b17cb2ULL},
    {0xddd0467c64bce4a0ULL, 0xac7cb3f6d05ddbdeULL},
    {0x8aa22c0dbef60ee4ULL, 0x6bcdf07a423aa96bULL},
    {0xad4ab7112eb3929dULL, 0x86c16c98d2c953c6ULL},
    {0xd89d64d57a607744ULL, 0xe871c7bf077ba8b7ULL},
    {0x87625f056c7c4a8bULL, 0x11471cd764ad4972ULL},
    {0xa93af6c6c79b5d2dULL, 0xd598e40d3dd89bcfULL},
    {0xd389b47879823479ULL, 0x4aff1d108d4ec2c3ULL},
    {0x843610cb4bf160cbULL, 0xcedf722a585139baULL},
    {0xa54394fe1eedb8feULL, 0xc2974eb4ee658828ULL},
    {0xce947a3da6a9273eULL, 0x733d226229feea32ULL},
    {0x811ccc668829b887ULL, 0x0806357d5a3f525fULL},
    {0xa163ff802a3426a8ULL, 0xca07c2dcb0cf26f7ULL},
    {0xc9bcff6034c13052ULL, 0xfc89b393dd02f0b5ULL},
    {0xfc2c3f3841f17c67ULL, 0xbbac2078d443ace2ULL},
    {0x9d9ba7832936edc0ULL, 0xd54b944b84aa4c0dULL},
    {0xc5029163f384a931ULL, 0x0a9e795e65d4df11ULL},
    {0xf64335bcf065d37dULL, 0x4d4617b5ff4a16d5ULL},
    {0x99ea0196163fa42eULL, 0x504bced1bf8e4e45ULL},
    {0xc06481fb9bcf8d39ULL, 0xe45ec2862f71e1d6ULL},
    {0xf07da27a82c37088ULL, 0x5d767327bb4e5a4cULL},
    {0x964e858c91ba2655ULL, 0x3a6a07f8d510f86fULL},
    {0xbbe226efb628afeaULL, 0x890489f70a55368bULL},
    {0xeadab0aba3b2dbe5ULL, 0x2b45ac74ccea842eULL},
    {0x92c8ae6b464fc96fULL, 0x3b0b8bc90012929dULL},
    {0xb77ada0617e3bbcbULL, 0x09ce6ebb40173744ULL},
    {0xe55990879ddcaabdULL, 0xcc420a6a101d0515ULL},
    {0x8f57fa54c2a9eab6ULL, 0x9fa946824a12232dULL},
    {0xb32df8e9f3546564ULL, 0x47939822dc96abf9ULL},
    {0xdff9772470297ebdULL, 0x59787e2b93bc56f7ULL},
    {0x8bfbea76c619ef36ULL, 0x57eb4edb3c55b65aULL},
    {0xaefae51477a06b03ULL, 0xede622920b6b23f1ULL},
    {0xdab99e59958885c4ULL, 0xe95fab368e45ecedULL},
    {0x88b402f7fd75539bULL, 0x11dbcb0218ebb414ULL},
    {0xaae103b5fcd2a881ULL, 0xd652bdc29f26a119ULL},
    {0xd59944a37c0752a2ULL, 0x4be76d3346f0495fULL},
    {0x857fcae62d8493a5ULL, 0x6f70a4400c562ddbULL},
    {0xa6dfbd9fb8e5b88eULL, 0xcb4ccd500f6bb952ULL},
    {0xd097ad07a71f26b2ULL, 0x7e2000a41346a7a7ULL},
    {0x825ecc24c873782fULL, 0x8ed400668c0c28c8ULL},
    {0xa2f67f2dfa90563bULL, 0x728900802f0f32faULL},
    {0xcbb41ef979346bcaULL, 0x4f2b40a03ad2ffb9ULL},
    {0xfea126b7d78186bcULL, 0xe2f610c84987bfa8ULL},
    {0x9f24b832e6b0f436ULL, 0x0dd9ca7d2df4d7c9ULL},
    {0xc6ede63fa05d3143ULL, 0x91503d1c79720dbbULL},
    {0xf8a95fcf88747d94ULL, 0x75a44c6397ce912aULL},
    {0x9b69dbe1b548ce7cULL, 0xc986afbe3ee11abaULL},
    {0xc24452da229b021bULL, 0xfbe85badce996168ULL},
    {0xf2d56790ab41c2a2ULL, 0xfae27299423fb9c3ULL},
    {0x97c560ba6b0919a5ULL, 0xdccd879fc967d41aULL},
    {0xbdb6b8e905cb600fULL, 0x5400e987bbc1c920ULL},
    {0xed246723473e3813ULL, 0x290123e9aab23b68ULL},
    {0x9436c0760c86e30bULL, 0xf9a0b6720aaf6521ULL},
    {0xb94470938fa89bceULL, 0xf808e40e8d5b3e69ULL},
    {0xe7958cb87392c2c2ULL, 0xb60b1d1230b20e04ULL},
    {0x90bd77f3483bb9b9ULL, 0xb1c6f22b5e6f48c2ULL},
    {0xb4ecd5f01a4aa828ULL, 0x1e38aeb6360b1af3ULL},
    {0xe2280b6c20dd5232ULL, 0x25c6da63c38de1b0ULL},
    {0x8d590723948a535fULL, 0x579c487e5a38ad0eULL},
    {0xb0af48ec79ace837ULL, 0x2d835a9df0c6d851ULL},
    {0xdcdb1b2798182244ULL, 0xf8e431456cf88e65ULL},
    {0x8a08f0f8bf0f156bULL, 0x1b8e9ecb641b58ffULL},
    {0xac8b2d36eed2dac5ULL, 0xe272467e3d222f3fULL},
    {0xd7adf884aa879177ULL, 0x5b0ed81dcc6abb0fULL},
    {0x86ccbb52ea94baeaULL, 0x98e947129fc2b4e9ULL},
    {0xa87fea27a539e9a5ULL, 0x3f2398d747b36224ULL},
    {0xd29fe4b18e88640eULL, 0x8eec7f0d19a03aadULL},
    {0x83a3eeeef9153e89ULL, 0x1953cf68300424acULL},
    {0xa48ceaaab75a8e2bULL, 0x5fa8c3423c052dd7ULL},
    {0xcdb02555653131b6ULL, 0x3792f412cb06794dULL},
    {0x808e17555f3ebf11ULL, 0xe2bbd88bbee40bd0ULL},
    {0xa0b19d2ab70e6ed6ULL, 0x5b6aceaeae9d0ec4ULL},
    {0xc8de047564d20a8bULL, 0xf245825a5a445275ULL},
    {0xfb158592be068d2eULL, 0xeed6e2f0f0d56712ULL},
    {0x9ced737bb6c4183dULL, 0x55464dd69685606bULL},
    {0xc428d05aa4751e4cULL, 0xaa97e14c3c26b886ULL},
    {0xf53304714d9265dfULL, 0xd53dd99f4b3066a8ULL},
    {0x993fe2c6d07b7fabULL, 0xe546a8038efe4029ULL},
    {0xbf8fdb78849a5f96ULL, 0xde98520472bdd033ULL},
    {0xef73d256a5c0f77cULL, 0x963e66858f6d4440ULL},
    {0x95a8637627989aadULL, 0xdde7001379a44aa8ULL},
    {0xbb127c53b17ec159ULL, 0x5560c018580d5d52ULL},
    {0xe9d71b689dde71afULL, 0xaab8f01e6e10b4a6ULL},
    {0x9226712162ab070dULL, 0xcab3961304ca70e8ULL},
    {0xb6b00d69bb55c8d1ULL, 0x3d607b97c5fd0d22ULL},
    {0xe45c10c42a2b3b05ULL, 0x8cb89a7db77c506aULL},
    {0x8eb98a7a9a5b04e3ULL, 0x77f3608e92adb242ULL},
    {0xb267ed1940f1c61cULL, 0x55f038b237591ed3ULL},
    {0xdf01e85f912e37a3ULL, 0x6b6c46dec52f6688ULL},
    {0x8b61313bbabce2c6ULL, 0x2323ac4b3b3da015ULL},
    {0xae397d8aa96c1b77ULL, 0xabec975e0a0d081aULL},
    {0xd9c7dced53c72255ULL, 0x96e7bd358c904a21ULL},
    {0x881cea14545c7575ULL, 0x7e50d64177da2e54ULL},
    {0xaa242499697392d2ULL, 0xdde50bd1d5d0b9e9ULL},
    {0xd4ad2dbfc3d07787ULL, 0x955e4ec64b44e864ULL},
    {0x84ec3c97da624ab4ULL, 0xbd5af13bef0b113eULL},
    {0xa6274bbdd0fadd61ULL, 0xecb1ad8aeacdd58eULL},
    {0xcfb11ead453994baULL, 0x67de18eda5814af2ULL},
    {0x81ceb32c4b43fcf4ULL, 0x80eacf948770ced7ULL},
    {0xa2425ff75e14fc31ULL, 0xa1258379a94d028dULL},
    {0xcad2f7f5359a3b3eULL, 0x096ee45813a04330ULL},
    {0xfd87b5f28300ca0dULL, 0x8bca9d6e188853fcULL},
    {0x9e74d1b791e07e48ULL, 0x775ea264cf55347eULL},
    {0xc612062576589ddaULL, 0x95364afe032a819eULL},
    {0xf79687aed3eec551ULL, 0x3a83ddbd83f52205ULL},
    {0x9abe14cd44753b52ULL, 0xc4926a9672793543ULL},
    {0xc16d9a0095928a27ULL, 0x75b7053c0f178294ULL},
    {0xf1c90080baf72cb1ULL, 0x5324c68b12dd6339ULL},
    {0x971da05074da7beeULL, 0xd3f6fc16ebca5e04ULL},
    {0xbce5086492111aeaULL, 0x88f4bb1ca6bcf585ULL},
    {0xec1e4a7db69561a5ULL, 0x2b31e9e3d06c32e6ULL},
    {0x9392ee8e921d5d07ULL, 0x3aff322e62439fd0ULL},
    {0xb877aa3236a4b449ULL, 0x09befeb9fad487c3ULL},
    {0xe69594bec44de15bULL, 0x4c2ebe687989a9b4ULL},
    {0x901d7cf73ab0acd9ULL, 0x0f9d37014bf60a11ULL},
    {0xb424dc35095cd80fULL, 0x538484c19ef38c95ULL},
    {0xe12e13424bb40e13ULL, 0x2865a5f206b06fbaULL},
    {0x8cbccc096f5088cbULL, 0xf93f87b7442e45d4ULL},
    {0xafebff0bcb24aafeULL, 0xf78f69a51539d749ULL},
    {0xdbe6fecebdedd5beULL, 0xb573440e5a884d1cULL},
    {0x89705f4136b4a597ULL, 0x31680a88f8953031ULL},
    {0xabcc77118461cefcULL, 0xfdc20d2b36ba7c3eULL},
    {0xd6bf94d5e57a42bcULL, 0x3d32907604691b4dULL},
    {0x8637bd05af6c69b5ULL, 0xa63f9a49c2c1b110ULL},
    {0xa7c5ac471b478423ULL, 0x0fcf80dc33721d54ULL},
    {0xd1b71758e219652bULL, 0xd3c36113404ea4a9ULL},
    {0x83126e978d4fdf3bULL, 0x645a1cac083126eaULL},
    {0xa3d70a3d70a3d70aULL, 0x3d70a3d70a3d70a4ULL},
    {0xccccccccccccccccULL, 0xcccccccccccccccdULL},
    {0x8000000000000000ULL, 0x0000000000000000ULL},
    {0xa000000000000000ULL, 0x0000000000000000ULL},
    {0xc800000000000000ULL, 0x0000000000000000ULL},
    {0xfa00000000000000ULL, 0x0000000000000000ULL},
    {0x9c40000000000000ULL, 0x0000000000000000ULL},
    {0xc350000000000000ULL, 0x0000000000000000ULL},
    {0xf424000000000000ULL, 0x0000000000000000ULL},
    {0x9896800000000000ULL, 0x0000000000000000ULL},
    {0xbebc200000000000ULL, 0x0000000000000000ULL},
    {0xee6b280000000000ULL, 0x0000000000000000ULL},
    {0x9502f90000000000ULL, 0x0000000000000000ULL},
    {0xba43b74000000000ULL, 0x0000000000000000ULL},
    {0xe8d4a51000000000ULL, 0x0000000000000000ULL},
    {0x9184e72a00000000ULL, 0x0000000000000000ULL},
    {0xb5e620f480000000ULL, 0x0000000000000000ULL},
    {0xe35fa931a0000000ULL, 0x0000000000000000ULL},
    {0x8e1bc9bf04000000ULL, 0x0000000000000000ULL},
    {0xb1a2bc2ec5000000ULL, 0x0000000000000000ULL},
    {0xde0b6b3a76400000ULL, 0x0000000000000000ULL},
    {0x8ac7230489e80000ULL, 0x0000000000000000ULL},
    {0xad78ebc5ac620000ULL, 0x0000000000000000ULL},
    {0xd8d726b7177a8000ULL, 0x0000000000000000ULL},
    {0x878678326eac9000ULL, 0x0000000000000000ULL},
    {0xa968163f0a57b400ULL, 0x0000000000000000ULL},
    {0xd3c21bcecceda100ULL, 0x0000000000000000ULL},
    {0x84595161401484a0ULL, 0x0000000000000000ULL},
    {0xa56fa5b99019a5c8ULL, 0x0000000000000000ULL},
    {0xcecb8f27f4200f3aULL, 0x0000000000000000ULL},
    {0x813f3978f8940984ULL, 0x4000000000000000ULL},
    {0xa18f07d736b90be5ULL, 0x5000000000000000ULL},
    {0xc9f2c9cd04674edeULL, 0xa400000000000000ULL},
    {0xfc6f7c4045812296ULL, 0x4d00000000000000ULL},
    {0x9dc5ada82b70b59dULL, 0xf020000000000000ULL},
    {0xc5371912364ce305ULL, 0x6c28000000000000ULL},
    {0xf684df56c3e01bc6ULL, 0xc732000000000000ULL},
    {0x9a130b963a6c115cULL, 0x3c7f400000000000ULL},
    {0xc097ce7bc90715b3ULL, 0x4b9f100000000000ULL},
    {0xf0bdc21abb48db20ULL, 0x1e86d40000000000ULL},
    {0x96769950b50d88f4ULL, 0x1314448000000000ULL},
    {0xbc143fa4e250eb31ULL, 0x17d955a000000000ULL},
    {0xeb194f8e1ae525fdULL, 0x5dcfab0800000000ULL},
    {0x92efd1b8d0cf37beULL, 0x5aa1cae500000000ULL},
    {0xb7abc627050305adULL, 0xf14a3d9e40000000ULL},
    {0xe596b7b0c643c719ULL, 0x6d9ccd05d0000000ULL},
    {0x8f7e32ce7bea5c6fULL, 0xe4820023a2000000ULL},
    {0xb35dbf821ae4f38bULL, 0xdda2802c8a800000ULL},
    {0xe0352f62a19e306eULL, 0xd50b2037ad200000ULL},
    {0x8c213d9da502de45ULL, 0x4526f422cc340000ULL},
    {0xaf298d050e4395d6ULL, 0x9670b12b7f410000ULL},
    {0xdaf3f04651d47b4cULL, 0x3c0cdd765f114000ULL},
    {0x88d8762bf324cd0fULL, 0xa5880a69fb6ac800ULL},
    {0xab0e93b6efee0053ULL, 0x8eea0d047a457a00ULL},
    {0xd5d238a4abe98068ULL, 0x72a4904598d6d880ULL},
    {0x85a36366eb71f041ULL, 0x47a6da2b7f864750ULL},
    {0xa70c3c40a64e6c51ULL, 0x999090b65f67d924ULL},
    {0xd0cf4b50cfe20765ULL, 0xfff4b4e3f741cf6dULL},
    {0x82818f1281ed449fULL, 0xbff8f10e7a8921a4ULL},
    {0xa321f2d7226895c7ULL, 0xaff72d52192b6a0dULL},
    {0xcbea6f8ceb02bb39ULL, 0x9bf4f8a69f764490ULL},
    {0xfee50b7025c36a08ULL, 0x02f236d04753d5b4ULL},
    {0x9f4f2726179a2245ULL, 0x01d762422c946590ULL},
    {0xc722f0ef9d80aad6ULL, 0x424d3ad2b7b97ef5ULL},
    {0xf8ebad2b84e0d58bULL, 0xd2e0898765a7deb2ULL},
    {0x9b934c3b330c8577ULL, 0x63cc55f49f88eb2fULL},
    {0xc2781f49ffcfa6d5ULL, 0x3cbf6b71c76b25fbULL},
    {0xf316271c7fc3908aULL, 0x8bef464e3945ef7aULL},
    {0x97edd871cfda3a56ULL, 0x97758bf0e3cbb5acULL},
    {0xbde94e8e43d0c8ecULL, 0x3d52eeed1cbea317ULL},
    {0xed63a231d4c4fb27ULL, 0x4ca7aaa863ee4bddULL},
    {0x945e455f24fb1cf8ULL, 0x8fe8caa93e74ef6aULL},
    {0xb975d6b6ee39e436ULL, 0xb3e2fd538e122b44ULL},
    {0xe7d34c64a9c85d44ULL, 0x60dbbca87196b616ULL},
    {0x90e40fbeea1d3a4aULL, 0xbc8955e946fe31cdULL},
    {0xb51d13aea4a488ddULL, 0x6babab6398bdbe41ULL},
    {0xe264589a4dcdab14ULL, 0xc696963c7eed2dd1ULL},
    {0x8d7eb76070a08aecULL, 0xfc1e1de5cf543ca2ULL},
    {0xb0de65388cc8ada8ULL, 0x3b25a55f43294bcbULL},
    {0xdd15fe86affad912ULL, 0x49ef0eb713f39ebeULL},
    {0x8a2dbf142dfcc7abULL, 0x6e3569326c784337ULL},
    {0xacb92ed9397bf996ULL, 0x49c2c37f07965404ULL},
    {0xd7e77a8f87daf7fbULL, 0xdc33745ec97be906ULL},
    {0x86f0ac99b4e8dafdULL, 0x69a028bb3ded71a3ULL},
    {0xa8acd7c0222311bcULL, 0xc40832ea0d68ce0cULL},
    {0xd2d80db02aabd62bULL, 0xf50a3fa490c30190ULL},
    {0x83c7088e1aab65dbULL, 0x792667c6da79e0faULL},
    {0xa4b8cab1a1563f52ULL, 0x577001b891185938ULL},
    {0xcde6fd5e09abcf26ULL, 0xed4c0226b55e6f86ULL},
    {0x80b05e5ac60b6178ULL, 0x544f8158315b05b4ULL},
    {0xa0dc75f1778e39d6ULL, 0x696361ae3db1c721ULL},
    {0xc913936dd571c84cULL, 0x03bc3a19cd1e38e9ULL},
    {0xfb5878494ace3a5fULL, 0x04ab48a04065c723ULL},
    {0x9d174b2dcec0e47bULL, 0x62eb0d64283f9c76ULL},
    {0xc45d1df942711d9aULL, 0x3ba5d0bd324f8394ULL},
    {0xf5746577930d6500ULL, 0xca8f44ec7ee36479ULL},
    {0x9968bf6abbe85f20ULL, 0x7e998b13cf4e1ecbULL},
    {0xbfc2ef456ae276e8ULL, 0x9e3fedd8c321a67eULL},
    {0xefb3ab16c59b14a2ULL, 0xc5cfe94ef3ea101eULL},
    {0x95d04aee3b80ece5ULL, 0xbba1f1d158724a12ULL},
    {0xbb445da9ca61281fULL, 0x2a8a6e45ae8edc97ULL},
    {0xea1575143cf97226ULL, 0xf52d09d71a3293bdULL},
    {0x924d692ca61be758ULL, 0x593c2626705f9c56ULL},
    {0xb6e0c377cfa2e12eULL, 0x6f8b2fb00c77836cULL},
    {0xe498f455c38b997aULL, 0x0b6dfb9c0f956447ULL},
    {0x8edf98b59a373fecULL, 0x4724bd4189bd5eacULL},
    {0xb2977ee300c50fe7ULL, 0x58edec91ec2cb657ULL},
    {0xdf3d5e9bc0f653e1ULL, 0x2f2967b66737e3edULL},
    {0x8b865b215899f46cULL, 0xbd79e0d20082ee74ULL},
    {0xae67f1e9aec07187ULL, 0xecd8590680a3aa11ULL},
    {0xda01ee641a708de9ULL, 0xe80e6f4820cc9495ULL},
    {0x884134fe908658b2ULL, 0x3109058d147fdcddULL},
    {0xaa51823e34a7eedeULL, 0xbd4b46f0599fd415ULL},
    {0xd4e5e2cdc1d1ea96ULL, 0x6c9e18ac7007c91aULL},
    {0x850fadc09923329eULL, 0x03e2cf6bc604ddb0ULL},
    {0xa6539930bf6bff45ULL, 0x84db8346b786151cULL},
    {0xcfe87f7cef46ff16ULL, 0xe612641865679a63ULL},
    {0x81f14fae158c5f6eULL, 0x4fcb7e8f3f60c07eULL},
    {0xa26da3999aef7749ULL, 0xe3be5e330f38f09dULL},
    {0xcb090c8001ab551cULL, 0x5cadf5bfd3072cc5ULL},
    {0xfdcb4fa002162a63ULL, 0x73d9732fc7c8f7f6ULL},
    {0x9e9f11c4014dda7eULL, 0x2867e7fddcdd9afaULL},
    {0xc646d63501a1511dULL, 0xb281e1fd541501b8ULL},
    {0xf7d88bc24209a565ULL, 0x1f225a7ca91a4226ULL},
    {0x9ae757596946075fULL, 0x3375788de9b06958ULL},
    {0xc1a12d2fc3978937ULL, 0x0052d6b1641c83aeULL},
    {0xf209787bb47d6b84ULL, 0xc0678c5dbd23a49aULL},
    {0x9745eb4d50ce6332ULL, 0xf840b7ba963646e0ULL},
    {0xbd176620a501fbffULL, 0xb650e5a93bc3d898ULL},
    {0xec5d3fa8ce427affULL, 0xa3e51f138ab4cebeULL},
    {0x93ba47c980e98cdfULL, 0xc66f336c36b10137ULL},
    {0xb8a8d9bbe123f017ULL, 0xb80b0047445d4184ULL},
    {0xe6d3102ad96cec1dULL, 0xa60dc059157491e5ULL},
    {0x9043ea1ac7e41392ULL, 0x87c89837ad68db2fULL},
    {0xb454e4a179dd1877ULL, 0x29babe4598c311fbULL},
    {0xe16a1dc9d8545e94ULL, 0xf4296dd6fef3d67aULL},
    {0x8ce2529e2734bb1dULL, 0x1899e4a65f58660cULL},
    {0xb01ae745b101e9e4ULL, 0x5ec05dcff72e7f8fULL},
    {0xdc21a1171d42645dULL, 0x76707543f4fa1f73ULL},
    {0x899504ae72497ebaULL, 0x6a06494a791c53a8ULL},
    {0xabfa45da0edbde69ULL, 0x0487db9d17636892ULL},
    {0xd6f8d7509292d603ULL, 0x45a9d2845d3c42b6ULL},
    {0x865b86925b9bc5c2ULL, 0x0b8a2392ba45a9b2ULL},
    {0xa7f26836f282b732ULL, 0x8e6cac7768d7141eULL},
    {0xd1ef0244af2364ffULL, 0x3207d795430cd926ULL},
    {0x8335616aed761f1fULL, 0x7f44e6bd49e807b8ULL},
    {0xa402b9c5a8d3a6e7ULL, 0x5f16206c9c6209a6ULL},
    {0xcd036837130890a1ULL, 0x36dba887c37a8c0fULL},
    {0x802221226be55a64ULL, 0xc2494954da2c9789ULL},
    {0xa02aa96b06deb0fdULL, 0xf2db9baa10b7bd6cULL},
    {0xc83553c5c8965d3dULL, 0x6f92829494e5acc7ULL},
    {0xfa42a8b73abbf48cULL, 0xcb772339ba1f17f9ULL},
    {0x9c69a97284b578d7ULL, 0xff2a760414536efbULL},
    {0xc38413cf25e2d70dULL, 0xfef5138519684abaULL},
    {0xf46518c2ef5b8cd1ULL, 0x7eb258665fc25d69ULL},
    {0x98bf2f79d5993802ULL, 0xef2f773ffbd97a61ULL},
    {0xbeeefb584aff8603ULL, 0xaafb550ffacfd8faULL},
    {0xeeaaba2e5dbf6784ULL, 0x95ba2a53f983cf38ULL},
    {0x952ab45cfa97a0b2ULL, 0xdd945a747bf26183ULL},
    {0xba756174393d88dfULL, 0x94f971119aeef9e4ULL},
    {0xe912b9d1478ceb17ULL, 0x7a37cd5601aab85dULL},
    {0x91abb422ccb812eeULL, 0xac62e055c10ab33aULL},
    {0xb616a12b7fe617aaULL, 0x577b986b314d6009ULL},
    {0xe39c49765fdf9d94ULL, 0xed5a7e85fda0b80bULL},
    {0x8e41ade9fbebc27dULL, 0x14588f13be847307ULL},
    {0xb1d219647ae6b31cULL, 0x596eb2d8ae258fc8ULL},
    {0xde469fbd99a05fe3ULL, 0x6fca5f8ed9aef3bbULL},
    {0x8aec23d680043beeULL, 0x25de7bb9480d5854ULL},
    {0xada72ccc20054ae9ULL, 0xaf561aa79a10ae6aULL},
    {0xd910f7ff28069da4ULL, 0x1b2ba1518094da04ULL},
    {0x87aa9aff79042286ULL, 0x90fb44d2f05d0842ULL},
    {0xa99541bf57452b28ULL, 0x353a1607ac744a53ULL},
    {0xd3fa922f2d1675f2ULL, 0x42889b8997915ce8ULL},
    {0x847c9b5d7c2e09b7ULL, 0x69956135febada11ULL},
    {0xa59bc234db398c25ULL, 0x43fab9837e699095ULL},
    {0xcf02b2c21207ef2eULL, 0x94f967e45e03f4bbULL},
    {0x8161afb94b44f57dULL, 0x1d1be0eebac278f5ULL},
    {0xa1ba1ba79e1632dcULL, 0x6462d92a69731732ULL},
    {0xca28a291859bbf93ULL, 0x7d7b8f7503cfdcfeULL},
    {0xfcb2cb35e702af78ULL, 0x5cda735244c3d43eULL},
    {0x9defbf01b061adabULL, 0x3a0888136afa64a7ULL},
    {0xc56baec21c7a1916ULL, 0x088aaa1845b8fdd0ULL},
    {0xf6c69a72a3989f5bULL, 0x8aad549e57273d45ULL},
    {0x9a3c2087a63f6399ULL, 0x36ac54e2f678864bULL},
    {0xc0cb28a98fcf3c7fULL, 0x84576a1bb416a7ddULL},
    {0xf0fdf2d3f3c30b9fULL, 0x656d44a2a11c51d5ULL},
    {0x969eb7c47859e743ULL, 0x9f644ae5a4b1b325ULL},
    {0xbc4665b596706114ULL, 0x873d5d9f0dde1feeULL},
    {0xeb57ff22fc0c7959ULL, 0xa90cb506d155a7eaULL},
    {0x9316ff75dd87cbd8ULL, 0x09a7f12442d588f2ULL},
    {0xb7dcbf5354e9beceULL, 0x0c11ed6d538aeb2fULL},
    {0xe5d3ef282a242e81ULL, 0x8f1668c8a86da5faULL},
    {0x8fa475791a569d10ULL, 0xf96e017d694487bcULL},
    {0xb38d92d760ec4455ULL, 0x37c981dcc395a9acULL},
    {0xe070f78d3927556aULL, 0x85bbe253f47b1417ULL},
    {0x8c469ab843b89562ULL, 0x93956d7478ccec8eULL},
    {0xaf58416654a6babbULL, 0x387ac8d1970027b2ULL},
    {0xdb2e51bfe9d0696aULL, 0x06997b05fcc0319eULL},
    {0x88fcf317f22241e2ULL, 0x441fece3bdf81f03ULL},
    {0xab3c2fddeeaad25aULL, 0xd527e81cad7626c3ULL},
    {0xd60b3bd56a5586f1ULL, 0x8a71e223d8d3b074ULL},
    {0x85c7056562757456ULL, 0xf6872d5667844e49ULL},
    {0xa738c6bebb12d16cULL, 0xb428f8ac016561dbULL},
    {0xd106f86e69d785c7ULL, 0xe13336d701beba52ULL},
    {0x82a45b450226b39cULL, 0xecc0024661173473ULL},
    {0xa34d721642b06084ULL, 0x27f002d7f95d0190ULL},
    {0xcc20ce9bd35c78a5ULL, 0x31ec038df7b441f4ULL},
    {0xff290242c83396ceULL, 0x7e67047175a15271ULL},
    {0x9f79a169bd203e41ULL, 0x0f0062c6e984d386ULL},
    {0xc75809c42c684dd1ULL, 0x52c07b78a3e60868ULL},
    {0xf92e0c3537826145ULL, 0xa7709a56ccdf8a82ULL},
    {0x9bbcc7a142b17ccbULL, 0x88a66076400bb691ULL},
    {0xc2abf989935ddbfeULL, 0x6acff893d00ea435ULL},
    {0xf356f7ebf83552feULL, 0x0583f6b8c4124d43ULL},
    {0x98165af37b2153deULL, 0xc3727a337a8b704aULL},
    {0xbe1bf1b059e9a8d6ULL, 0x744f18c0592e4c5cULL},
    {0xeda2ee1c7064130cULL, 0x1162def06f79df73ULL},
    {0x9485d4d1c63e8be7ULL, 0x8addcb5645ac2ba8ULL},
    {0xb9a74a0637ce2ee1ULL, 0x6d953e2bd7173692ULL},
    {0xe8111c87c5c1ba99ULL, 0xc8fa8db6ccdd0437ULL},
    {0x910ab1d4db9914a0ULL, 0x1d9c9892400a22a2ULL},
    {0xb54d5e4a127f59c8ULL, 0x2503beb6d00cab4bULL},
    {0xe2a0b5dc971f303aULL, 0x2e44ae64840fd61dULL},
    {0x8da471a9de737e24ULL, 0x5ceaecfed289e5d2ULL},
    {0xb10d8e1456105dadULL, 0x7425a83e872c5f47ULL},
    {0xdd50f1996b947518ULL, 0xd12f124e28f77719ULL},
    {0x8a5296ffe33cc92fULL, 0x82bd6b70d99aaa6fULL},
    {0xace73cbfdc0bfb7bULL, 0x636cc64d1001550bULL},
    {0xd8210befd30efa5aULL, 0x3c47f7e05401aa4eULL},
    {0x8714a775e3e95c78ULL, 0x65acfaec34810a71ULL},
    {0xa8d9d1535ce3b396ULL, 0x7f1839a741a14d0dULL},
    {0xd31045a8341ca07cULL, 0x1ede48111209a050ULL},
    {0x83ea2b892091e44dULL, 0x934aed0aab460432ULL},
    {0xa4e4b66b68b65d60ULL, 0xf81da84d5617853fULL},
    {0xce1de40642e3f4b9ULL, 0x36251260ab9d668eULL},
    {0x80d2ae83e9ce78f3ULL, 0xc1d72b7c6b426019ULL},
    {0xa1075a24e4421730ULL, 0xb24cf65b8612f81fULL},
    {0xc94930ae1d529cfcULL, 0xdee033f26797b627ULL},
    {0xfb9b7cd9a4a7443cULL, 0x169840ef017da3b1ULL},
    {0x9d412e0806e88aa5ULL, 0x8e1f289560ee864eULL},
    {0xc491798a08a2ad4eULL, 0xf1a6f2bab92a27e2ULL},
    {0xf5b5d7ec8acb58a2ULL, 0xae10af696774b1dbULL},
    {0x9991a6f3d6bf1765ULL, 0xacca6da1e0a8ef29ULL},
    {0xbff610b0cc6edd3fULL, 0x17fd090a58d32af3ULL},
    {0xeff394dcff8a948eULL, 0xddfc4b4cef07f5b0ULL},
    {0x95f83d0a1fb69cd9ULL, 0x4abdaf101564f98eULL},
    {0xbb764c4ca7a4440fULL, 0x9d6d1ad41abe37f1ULL},
    {0xea53df5fd18d5513ULL, 0x84c86189216dc5edULL},
    {0x92746b9be2f8552cULL, 0x32fd3cf5b4e49bb4ULL},
    {0xb7118682dbb66a77ULL, 0x3fbc8c33221dc2a1ULL},
    {0xe4d5e82392a40515ULL, 0x0fabaf3feaa5334aULL},
    {0x8f05b1163ba6832dULL, 0x29cb4d87f2a7400eULL},
    {0xb2c71d5bca9023f8ULL, 0x743e20e9ef511012ULL},
    {0xdf78e4b2bd342cf6ULL, 0x914da9246b255416ULL},
    {0x8bab8eefb6409c1aULL, 0x1ad089b6c2f7548eULL},
    {0xae9672aba3d0c320ULL, 0xa184ac2473b529b1ULL},
    {0xda3c0f568cc4f3e8ULL, 0xc9e5d72d90a2741eULL},
    {0x8865899617fb1871ULL, 0x7e2fa67c7a658892ULL},
    {0xaa7eebfb9df9de8dULL, 0xddbb901b98feeab7ULL},
    {0xd51ea6fa85785631ULL, 0x552a74227f3ea565ULL},
    {0x8533285c936b35deULL, 0xd53a88958f87275fULL},
    {0xa67ff273b8460356ULL, 0x8a892abaf368f137ULL},
    {0xd01fef10a657842cULL, 0x2d2b7569b0432d85ULL},
    {0x8213f56a67f6b29bULL, 0x9c3b29620e29fc73ULL},
    {0xa298f2c501f45f42ULL, 0x8349f3ba91b47b8fULL},
    {0xcb3f2f7642717713ULL, 0x241c70a936219a73ULL},
    {0xfe0efb53d30dd4d7ULL, 0xed238cd383aa0110ULL},
    {0x9ec95d1463e8a506ULL, 0xf4363804324a40aaULL},
    {0xc67bb4597ce2ce48ULL, 0xb143c6053edcd0d5ULL},
    {0xf81aa16fdc1b81daULL, 0xdd94b7868e94050aULL},
    {0x9b10a4e5e9913128ULL, 0xca7cf2b4191c8326ULL},
    {0xc1d4ce1f63f57d72ULL, 0xfd1c2f611f63a3f0ULL},
    {0xf24a01a73cf2dccfULL, 0xbc633b39673c8cecULL},
    {0x976e41088617ca01ULL, 0xd5be0503e085d813ULL},
    {0xbd49d14aa79dbc82ULL, 0x4b2d8644d8a74e18ULL},
    {0xec9c459d51852ba2ULL, 0xddf8e7d60ed1219eULL},
    {0x93e1ab8252f33b45ULL, 0xcabb90e5c942b503ULL},
    {0xb8da1662e7b00a17ULL, 0x3d6a751f3b936243ULL},
    {0xe7109bfba19c0c9dULL, 0x0cc512670a783ad4ULL},
    {0x906a617d450187e2ULL, 0x27fb2b80668b24c5ULL},
    {0xb484f9dc9641e9daULL, 0xb1f9f660802dedf6ULL},
    {0xe1a63853bbd26451ULL, 0x5e7873f8a0396973ULL},
    {0x8d07e33455637eb2ULL, 0xdb0b487b6423e1e8ULL},
    {0xb049dc016abc5e5fULL, 0x91ce1a9a3d2cda62ULL},
    {0xdc5c5301c56b75f7ULL, 0x7641a140cc7810fbULL},
    {0x89b9b3e11b6329baULL, 0xa9e904c87fcb0a9dULL},
    {0xac2820d9623bf429ULL, 0x546345fa9fbdcd44ULL},
    {0xd732290fbacaf133ULL, 0xa97c177947ad4095ULL},
    {0x867f59a9d4bed6c0ULL, 0x49ed8eabcccc485dULL},
    {0xa81f301449ee8c70ULL, 0x5c68f256bfff5a74ULL},
    {0xd226fc195c6a2f8cULL, 0x73832eec6fff3111ULL},
    {0x83585d8fd9c25db7ULL, 0xc831fd53c5ff7eabULL},
    {0xa42e74f3d032f525ULL, 0xba3e7ca8b77f5e55ULL},
    {0xcd3a1230c43fb26fULL, 0x28ce1bd2e55f35ebULL},
    {0x80444b5e7aa7cf85ULL, 0x7980d163cf5b81b3ULL},
    {0xa0555e361951c366ULL, 0xd7e105bcc332621fULL},
    {0xc86ab5c39fa63440ULL, 0x8dd9472bf3fefaa7ULL},
    {0xfa856334878fc150ULL, 0xb14f98f6f0feb951ULL},
    {0x9c935e00d4b9d8d2ULL, 0x6ed1bf9a569f33d3ULL},
    {0xc3b8358109e84f07ULL, 0x0a862f80ec4700c8ULL},
    {0xf4a642e14c6262c8ULL, 0xcd27bb612758c0faULL},
    {0x98e7e9cccfbd7dbdULL, 0x8038d51cb897789cULL},
    {0xbf21e44003acdd2cULL, 0xe0470a63e6bd56c3ULL},
    {0xeeea5d5004981478ULL, 0x1858ccfce06cac74ULL},
    {0x95527a5202df0ccbULL, 0x0f37801e0c43ebc8ULL},
    {0xbaa718e68396cffdULL, 0xd30560258f54e6baULL},
    {0xe950df20247c83fdULL, 0x47c6b82ef32a2069ULL},
    {0x91d28b7416cdd27eULL, 0x4cdc331d57fa5441ULL},
    {0xb6472e511c81471dULL, 0xe0133fe4adf8e952ULL},
    {0xe3d8f9e563a198e5ULL, 0x58180fddd97723a6ULL},
    {0x8e679c2f5e44ff8fULL, 0x570f09eaa7ea7648ULL},
};
#endif
