/* One pass over a contiguous float32 buffer: max, min and sum of squares; optionally the
 * CRC-32 (zlib's polynomial, the md5 summary mode) of the same bytes while they are in L1.
 *
 * torch needs three passes for the statistics (aminmax, sum, dot), each with its own dispatch and,
 * for a tensor larger than the cache, its own trip through memory. Sixteen float lanes per block of
 * 2048 elements vectorise without reassociation flags; block sums are carried in double, so the
 * result is at least as close to the exact value as torch's float reductions. NaN is not propagated
 * by the comparisons: the caller checks that the sum of squares is finite (a NaN or an infinity makes it
 * NaN or infinite) and otherwise falls back to torch, which keeps torch's NaN/Inf semantics exactly.
 * The Mean is torch's own sum, read with the same bytes (f32_mean below), so no plain sum is kept here.
 *
 * The CRC is ISA-L's when encode.py hands its address over (set_crc), else the carry-less-multiply
 * folding below; either way it hashes each 16 KiB piece right after the statistics read it, so a
 * tensor larger than the cache crosses the memory bus once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dumpformat/_entry.h"
#ifdef __linux__
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>
#define HAVE_POOL 1
#endif

/* The reading loops in one clone per instruction set, the best the CPU has picked when the library loads: sixteen
 * float lanes are one AVX-512 register (2.3-2.9x the AVX2 clone's rate from 65,536 elements on one core), two AVX2
 * ones. Each lane's additions are the same in every clone; what could change a bit is a fused multiply-add, which
 * AVX-512F has and the compiler would contract q + x * x into: the build turns contraction off (setup.py's
 * -ffp-contract=off), and the kernel's tests compare its bits with a reference that rounds the product first. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define KERNEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KERNEL_CLONES
#endif

#define LANES 16
#define BLOCK 2048
#define NOGIL_FROM 65536    /* elements; below this, releasing the GIL costs more than it frees */
#define SUB (2 * BLOCK)      /* elements hashed right after they are reduced: 16 KiB stays in L1 */

/* one block x[0:m) (m a multiple of LANES) into the lanes' running max and min and fresh lane sums of squares q:
 * the float operations every reader of the kernel makes, so that split reads give one read's bits. No plain sum:
 * the Mean is torch's (its own additions, read alongside), and a NaN or an infinity shows in q as in a sum. */
static inline __attribute__((always_inline)) void
f32_block(const float *x, Py_ssize_t m, float *mx, float *mn, float *q)
{
    for (int k = 0; k < LANES; k++)
        q[k] = 0.0f;
    for (Py_ssize_t i = 0; i < m; i += LANES) {
        for (int k = 0; k < LANES; k++) {
            float v = x[i + k];
            mx[k] = v > mx[k] ? v : mx[k];
            mn[k] = v < mn[k] ? v : mn[k];
            q[k] += v * v;
        }
    }
}

/* GROUP whole blocks x[0:GROUP * BLOCK) read at once, each into lanes of its own as f32_block reads one block: its
 * max and min then folded into the running lanes in block order, its sums of squares into q (LANES floats per
 * block). Each block's additions are f32_block's, and a block's first maximum (or minimum) folded into the lanes is
 * what the lanes would have kept reading it (the first of equal values: -0.0 and 0.0 alike): the figures are those of
 * one block after the other, bit for bit. Two blocks' additions are two independent chains: a core adds to a vector
 * of lanes only once its last addition is done, so one block at a time reads at what that latency allows (~46 GB/s
 * from a Xeon core's caches, AVX-512) and two at a time ~70; from memory both read at what memory gives. */
#define GROUP 2
static inline __attribute__((always_inline)) void
f32_group(const float *x, float *mx, float *mn, float *q)
{
    float bx[GROUP][LANES], bn[GROUP][LANES], bq[GROUP][LANES]; /* local: each a register through the loop */
    for (int b = 0; b < GROUP; b++)
        for (int k = 0; k < LANES; k++) {
            bx[b][k] = -INFINITY;
            bn[b][k] = INFINITY;
            bq[b][k] = 0.0f;
        }
    for (Py_ssize_t i = 0; i < BLOCK; i += LANES)
        for (int b = 0; b < GROUP; b++)
            for (int k = 0; k < LANES; k++) {
                float v = x[b * BLOCK + i + k];
                bx[b][k] = v > bx[b][k] ? v : bx[b][k];
                bn[b][k] = v < bn[b][k] ? v : bn[b][k];
                bq[b][k] += v * v;
            }
    for (int b = 0; b < GROUP; b++)
        for (int k = 0; k < LANES; k++) {
            mx[k] = bx[b][k] > mx[k] ? bx[b][k] : mx[k];
            mn[k] = bn[b][k] < mn[k] ? bn[b][k] : mn[k];
            q[b * LANES + k] = bq[b][k];
        }
}

/* f32_group's sums of squares alone (the Norm), its lanes spelled as vectors: written as f32_group's loops, the
 * compiler keeps the second block's sums in memory through the loop (slower than one block at a time). The same
 * float operations, lane by lane: each square rounded, then added (no contraction: setup.py). */
typedef float lanes_t __attribute__((vector_size(LANES * sizeof(float))));
#if GROUP != 2
#error "f32_group_q reads GROUP == 2 blocks"
#endif
static inline __attribute__((always_inline)) void
f32_group_q(const float *x, float *q)
{
    lanes_t a = {0}, b = {0};
    for (Py_ssize_t i = 0; i < BLOCK; i += LANES) {
        lanes_t u, v;
        memcpy(&u, x + i, sizeof u);
        memcpy(&v, x + BLOCK + i, sizeof v);
        a += u * u;
        b += v * v;
    }
    memcpy(q, &a, sizeof a);
    memcpy(q + LANES, &b, sizeof b);
}

KERNEL_CLONES
/* acc: max, min, sum of squares so far; continued over x[0:n] (the same result in pieces of
 * whole blocks as in one call) */
static void
f32_pass(const float *x, Py_ssize_t n, double *acc)
{
    float mx[LANES], mn[LANES], q[LANES];
    double Q = acc[2];
    Py_ssize_t i = 0;
    for (int k = 0; k < LANES; k++) {
        mx[k] = -INFINITY;
        mn[k] = INFINITY;
    }
    for (float gq[GROUP * LANES]; i + GROUP * BLOCK <= n; i += GROUP * BLOCK) {
        f32_group(x + i, mx, mn, gq);
        for (int k = 0; k < GROUP * LANES; k++) /* block by block, lane by lane: one f32_block after the other */
            Q += gq[k];
    }
    while (i + LANES <= n) {
        Py_ssize_t end = i + BLOCK;
        if (end > n)
            end = n - (n - i) % LANES;
        f32_block(x + i, end - i, mx, mn, q);
        i = end;
        for (int k = 0; k < LANES; k++)
            Q += q[k];
    }
    float MX = (float)acc[0], MN = (float)acc[1];
    for (int k = 0; k < LANES; k++) {
        MX = mx[k] > MX ? mx[k] : MX;
        MN = mn[k] < MN ? mn[k] : MN;
    }
    for (; i < n; i++) {
        float v = x[i];
        MX = v > MX ? v : MX;
        MN = v < MN ? v : MN;
        Q += (double)v * v;
    }
    acc[0] = MX;
    acc[1] = MN;
    acc[2] = Q;
}

KERNEL_CLONES
/* f32_pass over x[0:n] (n a multiple of LANES, from a block boundary) for another thread: each block's lane sums
 * of squares go to parts (LANES floats per block) for the caller to add into its double in order, the lanes' max
 * and min folded into *MX and *MN, so that the figures come out as one f32_pass's */
static void
f32_parts(const float *x, Py_ssize_t n, float *parts, float *MX, float *MN)
{
    float mx[LANES], mn[LANES], q[LANES];
    Py_ssize_t i = 0;
    for (int k = 0; k < LANES; k++) {
        mx[k] = -INFINITY;
        mn[k] = INFINITY;
    }
    for (; i + GROUP * BLOCK <= n; i += GROUP * BLOCK, parts += GROUP * LANES)
        f32_group(x + i, mx, mn, parts); /* its sums stay in registers through its read, then go to the parts */
    while (i < n) {
        Py_ssize_t end = i + BLOCK;
        if (end > n)
            end = n;
        f32_block(x + i, end - i, mx, mn, q);
        i = end;
        for (int k = 0; k < LANES; k++) /* not memcpy: that keeps q in memory through the loop */
            parts[k] = q[k];
        parts += LANES;
    }
    for (int k = 0; k < LANES; k++) {
        *MX = mx[k] > *MX ? mx[k] : *MX;
        *MN = mn[k] < *MN ? mn[k] : *MN;
    }
}

/* ---- CRC-32 (reflected 0xEDB88320, zlib's crc32) ---- */

#define POLY 0xedb88320u
/* f32_block's lane sums of squares alone over x[0:m) (m a multiple of LANES) */
static inline __attribute__((always_inline)) void
f32_block_q(const float *x, Py_ssize_t m, float *q)
{
    for (int k = 0; k < LANES; k++)
        q[k] = 0.0f;
    for (Py_ssize_t i = 0; i < m; i += LANES)
        for (int k = 0; k < LANES; k++) {
            float v = x[i + k];
            q[k] += v * v;
        }
}

KERNEL_CLONES
/* f32_pass's sum of squares alone, continued from Q over x[0:n] (from a block boundary), the same additions in the
 * same order (its bits): the monitor preset's Norm. Without the max and min lanes the read is bound by the lanes'
 * additions only. */
static double
f32_sumsq(const float *x, Py_ssize_t n, double Q)
{
    float q[LANES];
    Py_ssize_t i = 0;
    for (float gq[GROUP * LANES]; i + GROUP * BLOCK <= n; i += GROUP * BLOCK) {
        f32_group_q(x + i, gq);
        for (int k = 0; k < GROUP * LANES; k++)
            Q += gq[k];
    }
    while (i + LANES <= n) {
        Py_ssize_t end = i + BLOCK;
        if (end > n)
            end = n - (n - i) % LANES;
        f32_block_q(x + i, end - i, q);
        i = end;
        for (int k = 0; k < LANES; k++)
            Q += q[k];
    }
    for (; i < n; i++)
        Q += (double)x[i] * x[i];
    return Q;
}

KERNEL_CLONES
/* f32_sumsq's lane sums of whole blocks [0, nb) of x, LANES floats per block into parts, for another thread */
static void
f32_sumsq_parts(const float *x, Py_ssize_t nb, float *parts)
{
    Py_ssize_t b = 0;
    for (; b + GROUP <= nb; b += GROUP, x += GROUP * BLOCK, parts += GROUP * LANES)
        f32_group_q(x, parts);
    for (; b < nb; b++, x += BLOCK, parts += LANES) {
        float q[LANES];
        f32_block_q(x, BLOCK, q);
        for (int k = 0; k < LANES; k++)
            parts[k] = q[k];
    }
}

static uint32_t crc_table[256];
static int have_clmul;

static uint32_t
crc_bytes(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    while (n--)
        crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static uint32_t x2n_table[32]; /* x^(2^k) modulo the polynomial, reflected */

/* a(x) b(x) modulo the polynomial, reflected; a nonzero */
static uint32_t
multmodp(uint32_t a, uint32_t b)
{
    uint32_t m = (uint32_t)1 << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        crc_table[i] = c;
    }
    uint32_t p = (uint32_t)1 << 30; /* x^1 */
    x2n_table[0] = p;
    for (int n = 1; n < 32; n++)
        x2n_table[n] = p = multmodp(p, p);
}

/* the CRC of A then B from those of A and of B (len2: B's bytes): zlib's crc32_combine */
static uint32_t
crc_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
{
    uint32_t p = (uint32_t)1 << 31; /* x^(8 len2) mod p(x), from x^(2^k) */
    for (unsigned k = 3; len2; len2 >>= 1, k++)
        if (len2 & 1)
            p = multmodp(x2n_table[k & 31], p);
    return multmodp(p, crc1) ^ crc2;
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_CLMUL_CODE 1

/* Folding with carry-less multiplication: Gopal et al., "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ Instruction" (Intel, 2009); the constants for this polynomial are
 * the paper's, as in zlib's and Chromium's x86 code. len >= 64 and a multiple of 16; crc and the
 * result are the raw (not inverted) register. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t
crc_clmul(const unsigned char *buf, size_t len, uint32_t crc)
{
    static const uint64_t k1k2[2] __attribute__((aligned(16))) = {0x0154442bd4, 0x01c6e41596};
    static const uint64_t k3k4[2] __attribute__((aligned(16))) = {0x01751997d0, 0x00ccaa009e};
    static const uint64_t k5k0[2] __attribute__((aligned(16))) = {0x0163cd6124, 0x0000000000};
    static const uint64_t poly[2] __attribute__((aligned(16))) = {0x01db710641, 0x01f7011641};
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;

    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = _mm_load_si128((const __m128i *)k1k2);
    buf += 64;
    len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
        y6 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
        y7 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
        y8 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buf += 64;
        len -= 64;
    }
    x0 = _mm_load_si128((const __m128i *)k3k4);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    /* 128 -> 64 bits, then Barrett reduction to 32 */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_loadl_epi64((const __m128i *)k5k0);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_load_si128((const __m128i *)poly);
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

/* a faster CRC-32 of the same polynomial handed in by set_crc (ISA-L's crc32_gzip_refl) */
typedef uint32_t (*crc_fn_t)(uint32_t, const unsigned char *, uint64_t);
static crc_fn_t crc_fn;

/* crc32 continued over n bytes */
static uint32_t
crc_update(uint32_t crc, const unsigned char *p, size_t n)
{
    if (crc_fn != NULL)
        return crc_fn(crc, p, n);
#ifdef HAVE_CLMUL_CODE
    if (have_clmul && n >= 64) {
        size_t m = n & ~(size_t)15;
        crc = ~crc_clmul(p, m, ~crc);
        p += m;
        n -= m;
    }
#endif
    return n ? crc_bytes(crc, p, n) : crc;
}

/* ---- one buffer: statistics, CRC or both ---- */

enum { JOB_STATS = 1, JOB_CRC = 2 };

typedef struct {
    double mx, mn, q; /* max, min, sum of squares */
    uint32_t crc;
} result_t;

static void
run_job(const char *base, Py_ssize_t n, Py_ssize_t width, int what, result_t *r)
{
    double acc[3] = {-INFINITY, INFINITY, 0.0};
    r->crc = 0;
    if (what == JOB_CRC) {
        r->crc = crc_update(0, (const unsigned char *)base, (size_t)n * (size_t)width);
    } else if (!(what & JOB_CRC)) {
        f32_pass((const float *)base, n, acc);
    } else {
        for (Py_ssize_t i = 0; i < n; i += SUB) { /* hash each piece right after reducing it */
            Py_ssize_t m = n - i < SUB ? n - i : SUB;
            f32_pass((const float *)base + i, m, acc);
            r->crc = crc_update(r->crc, (const unsigned char *)((const float *)base + i), (size_t)m * 4);
        }
    }
    r->mx = acc[0], r->mn = acc[1], r->q = acc[2];
}

/* parse (address, count) and run the job, the GIL released for large buffers; -1 with an exception set */
static int
run_args(PyObject *const *args, Py_ssize_t nargs, const char *usage, Py_ssize_t width, int what, result_t *r)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    const char *p = PyLong_AsVoidPtr(args[0]);
    if (p == NULL && PyErr_Occurred())
        return -1;
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "count must be >= 0");
        return -1;
    }
    if (p == NULL && n > 0) {
        PyErr_SetString(PyExc_ValueError, "null address");
        return -1;
    }
    if (n >= NOGIL_FROM) {
        Py_BEGIN_ALLOW_THREADS
        run_job(p, n, width, what, r);
        Py_END_ALLOW_THREADS
    } else {
        run_job(p, n, width, what, r);
    }
    return 0;
}

/* f32(address, count) -> (max, min, sum of squares) */
static PyObject *
fastats_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    result_t r;
    if (run_args(args, nargs, "f32(address, count)", 4, JOB_STATS, &r) < 0)
        return NULL;
    return Py_BuildValue("(ddd)", r.mx, r.mn, r.q);
}

/* f32_crc(address, count) -> (max, min, sum of squares, crc32 of the 4 * count bytes) */
static PyObject *
fastats_f32_crc(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    result_t r;
    if (run_args(args, nargs, "f32_crc(address, count)", 4, JOB_STATS | JOB_CRC, &r) < 0)
        return NULL;
    return Py_BuildValue("(dddk)", r.mx, r.mn, r.q, (unsigned long)r.crc);
}

/* crc32(address, nbytes) -> zlib.crc32 of the bytes */
static PyObject *
fastats_crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    result_t r;
    if (run_args(args, nargs, "crc32(address, nbytes)", 1, JOB_CRC, &r) < 0)
        return NULL;
    return PyLong_FromUnsignedLong(r.crc);
}

/* set_crc(address): use the function at address, uint32_t f(uint32_t crc, const unsigned char *, uint64_t),
 * for the CRC; the caller has checked that it computes zlib.crc32. 0 restores the built-in one. */
static PyObject *
fastats_set_crc(PyObject *self, PyObject *arg)
{
    void *p = PyLong_AsVoidPtr(arg);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    crc_fn = (crc_fn_t)p;
    Py_RETURN_NONE;
}

/* ---- torch's float32 mean ----
 * msprobe's Mean is torch.mean: on the CPU, torch's float sum divided by the count in float. Where a mean is
 * near zero by cancellation, any other order of additions differs in every digit. ATen's CPU sum of a contiguous
 * float tensor (cascade_sum, run serially below its 32768-element grain) adds vectors of `lanes` floats (its
 * Vectorized<float> width) as rows of four, in level chunks of 16 rows carried up four levels, then the scalar
 * tail, then the lanes in order; under one vector, the same over scalars. The same float additions in the same
 * order give the same bits. encode.py switches this on only after it reproduced torch.mean bit for bit on sizes
 * reaching every branch, with the lane count found there, and keeps torch's mean from the grain up (its sum split
 * over threads). */
#define TS_MAXL 16
#define TS_LEVELS 4
#define TS_ROWS 4
#define TS_LANES_OK(l) ((l) == 4 || (l) == 8 || (l) == 16) /* the widths ts_feed is compiled for */

static void
ts_add(float *a, const float *b, int L)
{
    for (int l = 0; l < L; l++)
        a[l] += b[l];
}

/* ATen's utils::CeilLog2 */
static int64_t
ts_ceil_log2(int64_t x)
{
    if (x <= 2)
        return 1;
    int64_t r = 0;
    uint64_t v = (uint64_t)x - 1;
    while (v) {
        r++;
        v >>= 1;
    }
    return r;
}

/* ATen's row sum of `size` elements of L lanes each (element i at x + i * L), fed in order in pieces so that
 * another pass can read the same memory just before (ts_feed), then finished (ts_finish) */
typedef struct {
    const float *x;
    int64_t size, rows, i, power, step, mask;
    int L;
    float acc[TS_LEVELS][TS_ROWS][TS_MAXL];
} ts_rows_t;

static void
ts_init(ts_rows_t *st, const float *x, int64_t size, int L)
{
    memset(st->acc, 0, sizeof st->acc);
    st->x = x, st->size = size, st->L = L, st->i = 0;
    st->rows = size / TS_ROWS;
    st->power = ts_ceil_log2(st->rows) / TS_LEVELS;
    if (st->power < 4)
        st->power = 4;
    st->step = (int64_t)1 << st->power, st->mask = st->step - 1;
}

/* the rows that lie wholly in elements [0, upto) (of L lanes each): level 0 is held in four vectors of L floats,
 * named so that they stay in registers (st->acc could alias the rows, and an array of them is kept in memory);
 * the additions are torch's, lane by lane */
typedef float ts_v4 __attribute__((vector_size(16)));
typedef float ts_v8 __attribute__((vector_size(32)));
typedef float ts_v16 __attribute__((vector_size(64)));

#define TS_FLUSH(k, ak, L)                                                                              \
    do {                                                                                                \
        float t_[L];                                                                                    \
        memcpy(t_, &(ak), sizeof t_);                                                                   \
        ts_add(st->acc[1][k], t_, (L));                                                                 \
        ak = zero;                                                                                      \
    } while (0)

#define TS_FEED_BODY(L, VT)                                                                             \
    do {                                                                                                \
        const VT zero = {0};                                                                            \
        VT a0, a1, a2, a3;                                                                              \
        memcpy(&a0, st->acc[0][0], sizeof a0);                                                          \
        memcpy(&a1, st->acc[0][1], sizeof a1);                                                          \
        memcpy(&a2, st->acc[0][2], sizeof a2);                                                          \
        memcpy(&a3, st->acc[0][3], sizeof a3);                                                          \
        int64_t i = st->i;                                                                              \
        const float *row = st->x + i * TS_ROWS * (L);                                                   \
        while (i < end) {                                                                               \
            VT r0, r1, r2, r3;                                                                          \
            memcpy(&r0, row, sizeof r0);                                                                \
            memcpy(&r1, row + (L), sizeof r1);                                                          \
            memcpy(&r2, row + 2 * (L), sizeof r2);                                                      \
            memcpy(&r3, row + 3 * (L), sizeof r3);                                                      \
            a0 += r0, a1 += r1, a2 += r2, a3 += r3;                                                     \
            row += TS_ROWS * (L);                                                                       \
            i++;                                                                                        \
            if ((i & st->mask) == 0 && i <= carried) {                                                  \
                TS_FLUSH(0, a0, L);                                                                     \
                TS_FLUSH(1, a1, L);                                                                     \
                TS_FLUSH(2, a2, L);                                                                     \
                TS_FLUSH(3, a3, L);                                                                     \
                for (int j = 2; j < TS_LEVELS && (i & (st->mask << ((j - 1) * st->power))) == 0; j++)   \
                    for (int k = 0; k < TS_ROWS; k++) {                                                 \
                        ts_add(st->acc[j][k], st->acc[j - 1][k], (L));                                  \
                        memset(st->acc[j - 1][k], 0, sizeof st->acc[j - 1][k]);                         \
                    }                                                                                   \
            }                                                                                           \
        }                                                                                               \
        memcpy(st->acc[0][0], &a0, sizeof a0);                                                          \
        memcpy(st->acc[0][1], &a1, sizeof a1);                                                          \
        memcpy(st->acc[0][2], &a2, sizeof a2);                                                          \
        memcpy(st->acc[0][3], &a3, sizeof a3);                                                          \
        st->i = i;                                                                                      \
    } while (0)

KERNEL_CLONES
static void
ts_feed(ts_rows_t *st, int64_t upto)
{
    int64_t end = upto / TS_ROWS;
    if (end > st->rows)
        end = st->rows;
    /* rows of whole level chunks carry up after each chunk; the rows after the last whole chunk do not */
    const int64_t carried = st->rows - st->rows % st->step;
    if (st->L == 8)
        TS_FEED_BODY(8, ts_v8);
    else if (st->L == 16)
        TS_FEED_BODY(16, ts_v16);
    else if (st->L == 4)
        TS_FEED_BODY(4, ts_v4);
    else if (st->L == 1)
        TS_FEED_BODY(1, float);
}

static void
ts_finish(ts_rows_t *st, float *out)
{
    const int L = st->L;
    ts_feed(st, st->rows * TS_ROWS);
    for (int j = 1; j < TS_LEVELS; j++)
        for (int k = 0; k < TS_ROWS; k++)
            ts_add(st->acc[0][k], st->acc[j][k], L);
    for (int64_t m = st->rows * TS_ROWS; m < st->size; ++m)
        ts_add(st->acc[0][0], st->x + m * L, L);
    for (int k = 1; k < TS_ROWS; k++)
        ts_add(st->acc[0][0], st->acc[0][k], L);
    memcpy(out, st->acc[0][0], sizeof(float) * L);
}

/* ATen's sum of one contiguous run x[0:n] (one thread's share), fed by element count like ts_feed */
typedef struct {
    const float *x;
    int64_t n;
    int lanes, vec, few;
    ts_rows_t rows;
} ts_run_t;

/* few: fewer elements than one row of four (a tiny tensor's every sum): no row is fed, so ts_finish's levels and
 * rows are zeros and its sum is the elements added in order onto 0.0f. Adding +0.0f to a sum started at +0.0f
 * changes no bit (the sum is never -0.0f, a NaN stays itself), so the same floats come out without the
 * accumulators' kilobyte set to zero and added up. */
static void
ts_run_init(ts_run_t *r, const float *x, int64_t n, int lanes)
{
    r->x = x, r->n = n, r->lanes = lanes, r->vec = n >= lanes;
    const int64_t size = r->vec ? n / lanes : n;
    r->few = size < TS_ROWS;
    if (r->few) {
        r->rows.x = x, r->rows.size = size, r->rows.L = r->vec ? lanes : 1;
        return;
    }
    if (r->vec)
        ts_init(&r->rows, x, n / lanes, lanes);
    else
        ts_init(&r->rows, x, n, 1);
}

static void
ts_run_feed(ts_run_t *r, int64_t upto)
{
    if (!r->few)
        ts_feed(&r->rows, r->vec ? upto / r->lanes : upto);
}

static float
ts_run_finish(ts_run_t *r)
{
    float lane[TS_MAXL], total = 0.0f;
    if (r->few) {
        const int L = r->rows.L;
        for (int l = 0; l < L; l++)
            lane[l] = 0.0f;
        for (int64_t m = 0; m < r->rows.size; m++)
            ts_add(lane, r->x + m * L, L);
    } else {
        ts_finish(&r->rows, lane);
    }
    if (!r->vec)
        return 0.0f + lane[0];
    for (int64_t k = r->rows.size * r->lanes; k < r->n; ++k)
        total += r->x[k];
    for (int l = 0; l < r->lanes; l++)
        total += lane[l];
    return 0.0f + total; /* accumulated onto the zero-filled output */
}

static float
torch_sum_f32(const float *x, int64_t n, int lanes)
{
    ts_run_t r;
    ts_run_init(&r, x, n, lanes);
    return ts_run_finish(&r);
}

/* From the grain up, with more than one thread, ATen splits a whole-tensor sum (two_pass_reduction): the range
 * is cut into min(threads, ceil(n / grain)) runs of ceil(n / runs) elements, each summed as above into its
 * thread's zeroed slot of a buffer of `threads` floats, and the buffer summed the same way. */
#define TS_GRAIN 32768
#define TS_MAXTHREADS 256

typedef struct {
    const float *x;
    int64_t n, chunk;
    int lanes, threads, runs, cur, last; /* runs [cur, last) are this reader's */
    float part[TS_MAXTHREADS];
    ts_run_t run;
} ts_sum_t;

static void
ts_sum_init(ts_sum_t *s, const float *x, int64_t n, int lanes, int threads)
{
    s->x = x, s->n = n, s->lanes = lanes, s->threads = threads, s->cur = 0;
    int64_t runs = 1;
    if (n >= TS_GRAIN && threads > 1) {
        runs = (n + TS_GRAIN - 1) / TS_GRAIN;
        if (runs > threads)
            runs = threads;
    }
    s->runs = s->last = (int)runs;
    s->chunk = (n + runs - 1) / runs;
    /* the slots ts_sum_finish reads: part[0] below the grain or on one thread, `threads` of them from it */
    memset(s->part, 0, sizeof(float) * (threads < 1 ? 1 : threads < TS_MAXTHREADS ? threads : TS_MAXTHREADS));
    ts_run_init(&s->run, x, s->chunk < n ? s->chunk : n, lanes);
}

/* the elements where run k starts (k = runs: the end) */
static int64_t
ts_run_start(const ts_sum_t *s, int k)
{
    const int64_t b = k * s->chunk;
    return b < s->n ? b : s->n;
}

/* this reader sums runs [first, last) only (another thread sums the others) */
static void
ts_sum_seek(ts_sum_t *s, int first, int last)
{
    const int64_t b = ts_run_start(s, first);
    s->cur = first, s->last = last;
    ts_run_init(&s->run, s->x + b, ts_run_start(s, first + 1) - b, s->lanes);
}

/* elements [0, upto) have been read by the caller: sum the runs' rows inside them */
static void
ts_sum_feed(ts_sum_t *s, int64_t upto)
{
    for (;;) {
        const int64_t begin = s->cur * s->chunk;
        const int64_t end = begin + s->run.n;
        if (upto <= begin)
            return;
        ts_run_feed(&s->run, (upto < end ? upto : end) - begin);
        if (upto < end || s->cur + 1 >= s->last)
            return;
        s->part[s->cur] = ts_run_finish(&s->run);
        s->cur++;
        const int64_t next = s->cur * s->chunk;
        ts_run_init(&s->run, s->x + next, (s->n - next < s->chunk ? s->n - next : s->chunk), s->lanes);
    }
}

static float
ts_sum_finish(ts_sum_t *s)
{
    s->part[s->cur] = ts_run_finish(&s->run);
    if (s->n < TS_GRAIN || s->threads <= 1)
        return s->part[0];
    return torch_sum_f32(s->part, s->threads, s->lanes); /* even one run: its slot plus zeros, -0.0 becomes 0.0 */
}

/* parse the (address, count, lanes) that f32_mean and tmean start with: a non-empty float32 buffer and a lane
 * count ts_feed is compiled for; -1 with an exception set */
static int
mean_args(PyObject *const *args, const char *name, const float **p, Py_ssize_t *n, long *lanes)
{
    *p = PyLong_AsVoidPtr(args[0]);
    if (*p == NULL && PyErr_Occurred())
        return -1;
    *n = PyLong_AsSsize_t(args[1]);
    *lanes = PyLong_AsLong(args[2]);
    if (PyErr_Occurred())
        return -1;
    if (*n < 1 || *p == NULL || !TS_LANES_OK(*lanes)) {
        PyErr_Format(PyExc_ValueError, "%s: bad address, count or lanes", name);
        return -1;
    }
    return 0;
}

/* f32_pass and torch's sum in one read, and the CRC too if asked: each piece of SUB elements is summed torch's
 * way (and hashed) right after the kernel read it, from L1. The kernel's figures are those of f32_pass over the
 * whole buffer (it continues over whole blocks), the CRC that of the bytes in order, the mean torch.mean's bits. */
static void
run_stats_mean_serial(const float *x, Py_ssize_t n, int crc, ts_sum_t *s, result_t *r)
{
    double acc[3] = {-INFINITY, INFINITY, 0.0};
    r->crc = 0;
    for (Py_ssize_t i = 0; i < n; i += SUB) {
        Py_ssize_t m = n - i < SUB ? n - i : SUB;
        f32_pass(x + i, m, acc);
        ts_sum_feed(s, i + m);
        if (crc)
            r->crc = crc_update(r->crc, (const unsigned char *)(x + i), (size_t)m * 4);
    }
    r->mx = acc[0], r->mn = acc[1], r->q = acc[2];
}

/* ---- the same read shared with torch's intra-op threads ----
 * A tensor of more than PAR_FROM elements is read by up to `workers` threads of torch's own OpenMP team (libgomp's
 * GOMP_parallel, as at::parallel_for starts a region; use_omp hands over torch's copy of the library), as a torch
 * reduction of it would be: the training thread waits in the tool's hook, so that team is idle, and is still
 * spinning from the op before. Each thread reads whole runs of torch's split of its sum (each run's additions are
 * torch's) and the kernel's blocks from the start of the one thread's piece (SUB) at or before its first run. The
 * other threads hand back each block's lane sums and their CRC; the calling thread adds the sums into its doubles in
 * block order, as one f32_pass would, and combines the CRCs: the figures are those of f32_mean on one thread, bit for
 * bit, whatever the number of threads.
 * Above the grain, where torch's own elementwise ops split over the same team: an output they just wrote lies
 * half in each core's cache, and one thread reading all of it pulls half from the other core (a 65,536-element
 * output read at 17 GB/s alone, 36 GB/s shared). Up to a few hundred thousand elements, a tensor one thread wrote
 * reads slower shared (its data in that core's cache), but a step's tensors of those sizes are mostly torch's
 * outputs. */
#define POOL_MAX 8          /* threads reading one tensor */
#define PAR_FROM TS_GRAIN /* elements: above it (torch's parallel_for splits only more than its grain) */

typedef struct {
    ts_sum_t sum;            /* torch's runs [sum.cur, sum.last), then their sums in sum.part */
    const float *x;
    Py_ssize_t kb, ke;       /* the kernel's elements [kb, ke): whole blocks but a last one of whole lanes */
    float mx, mn;
    float *parts;            /* LANES floats per block */
    size_t cap;              /* floats allocated at parts */
    int crc;                 /* hash [kb, ke) too, into hash */
    uint32_t hash;
} share_t;

static void
share_run(share_t *w)
{
    float *parts = w->parts;
    w->mx = -INFINITY, w->mn = INFINITY;
    for (Py_ssize_t i = w->kb; i < w->ke; i += SUB) {
        Py_ssize_t m = w->ke - i < SUB ? w->ke - i : SUB;
        f32_parts(w->x + i, m, parts, &w->mx, &w->mn);
        parts += LANES * ((m + BLOCK - 1) / BLOCK);
        ts_sum_feed(&w->sum, i + m);
        if (w->crc)
            w->hash = crc_update(w->hash, (const unsigned char *)(w->x + i), (size_t)m * 4);
    }
    ts_sum_feed(&w->sum, ts_run_start(&w->sum, w->sum.last)); /* its last run's elements past its blocks */
    w->sum.part[w->sum.cur] = ts_run_finish(&w->sum.run);
}

/* share 0 is read as f32_pass reads it, into acc */
static void
share_first(share_t *w, double *acc)
{
    for (Py_ssize_t i = 0; i < w->ke; i += SUB) {
        Py_ssize_t m = w->ke - i < SUB ? w->ke - i : SUB;
        f32_pass(w->x + i, m, acc);
        ts_sum_feed(&w->sum, i + m);
        if (w->crc)
            w->hash = crc_update(w->hash, (const unsigned char *)(w->x + i), (size_t)m * 4);
    }
    ts_sum_feed(&w->sum, ts_run_start(&w->sum, w->sum.last));
    w->sum.part[w->sum.cur] = ts_run_finish(&w->sum.run);
}

#ifdef HAVE_POOL
typedef void (*gomp_parallel_t)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*omp_int_t)(void);
static gomp_parallel_t gomp_parallel;
static omp_int_t omp_thread_num, omp_num_threads;
static pid_t omp_pid; /* a forked child's OpenMP team is its parent's, which it does not have: libgomp would hang */
static pid_t own_pid; /* this process's pid, set by use_omp and in a fork child: no system call per tensor */

static void
own_pid_in_child(void)
{
    own_pid = getpid();
}

static share_t shares[POOL_MAX];
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER; /* one tensor at a time uses shares */

typedef struct {
    int ways;
    double acc[3];
} team_t;

static void
team_body(void *arg)
{
    team_t *t = arg;
    const int nt = omp_num_threads();
    for (int j = omp_thread_num(); j < t->ways; j += nt > 0 ? nt : t->ways) {
        if (j == 0)
            share_first(&shares[0], t->acc);
        else
            share_run(&shares[j]);
    }
}

/* share j: blocks [kb, ke) and runs [first, last); false if its buffer cannot grow */
static int
share_set(share_t *w, const ts_sum_t *s, Py_ssize_t kb, Py_ssize_t ke, int first, int last, int crc)
{
    const size_t need = (size_t)LANES * (size_t)((ke - kb + BLOCK - 1) / BLOCK);
    if (need > w->cap) {
        float *p = realloc(w->parts, need * sizeof(float));
        if (p == NULL)
            return 0;
        w->parts = p, w->cap = need;
    }
    w->sum = *s;
    ts_sum_seek(&w->sum, first, last);
    w->x = s->x, w->kb = kb, w->ke = ke, w->crc = crc, w->hash = 0;
    return 1;
}

/* the read of x[0:n) shared by `ways` threads (pool_mu held), its runs' sums into s->part; false before any
 * work if it cannot be */
static int
run_shared(const float *x, Py_ssize_t n, int ways, int crc, ts_sum_t *s, result_t *r)
{
    Py_ssize_t kb[POOL_MAX + 1];
    int rb[POOL_MAX + 1];
    for (int j = 0; j <= ways; j++) {
        rb[j] = (int)((int64_t)j * s->runs / ways);
        /* on the one thread's pieces (SUB), whose lanes it folds into the max and min in turn: a max or min of
         * zero keeps the one thread's zero (-0.0 or 0.0) */
        kb[j] = ts_run_start(s, rb[j]) / SUB * SUB;
    }
    const Py_ssize_t tail = n - (n - kb[ways - 1]) % LANES; /* the scalar tail [tail, n) is added last, here */
    kb[ways] = tail;
    for (int j = 0; j < ways; j++)
        if (!share_set(&shares[j], s, kb[j], kb[j + 1], rb[j], rb[j + 1], crc))
            return 0;
    team_t team = {ways, {-INFINITY, INFINITY, 0.0}};
    gomp_parallel(team_body, &team, (unsigned)ways, 0);
    float MX = (float)team.acc[0], MN = (float)team.acc[1];
    double Q = team.acc[2];
    uint32_t hash = shares[0].hash;
    for (int j = 0; j < ways; j++) {
        const share_t *w = &shares[j];
        for (int k = rb[j]; k < rb[j + 1]; k++)
            s->part[k] = w->sum.part[k];
        if (j == 0)
            continue;
        if (crc)
            hash = crc_combine(hash, w->hash, (uint64_t)(w->ke - w->kb) * 4);
        MX = w->mx > MX ? w->mx : MX;
        MN = w->mn < MN ? w->mn : MN;
        const float *p = w->parts, *end = p + LANES * ((w->ke - w->kb + BLOCK - 1) / BLOCK);
        for (; p < end; p += LANES)
            for (int k = 0; k < LANES; k++)
                Q += p[k];
    }
    for (Py_ssize_t i = tail; i < n; i++) {
        float v = x[i];
        MX = v > MX ? v : MX;
        MN = v < MN ? v : MN;
        Q += (double)v * v;
    }
    r->crc = crc && tail < n ? crc_update(hash, (const unsigned char *)(x + tail), (size_t)(n - tail) * 4) : hash;
    r->mx = MX, r->mn = MN, r->q = Q;
    return 1;
}
#endif

#ifdef HAVE_POOL
/* whether torch's team reads a tensor of n elements `ways` ways now; if so pool_mu is held, for the caller to release:
 * above PAR_FROM elements, in the process that loaded the team (a fork child has none), one tensor at a time */
static int
pool_take(Py_ssize_t n, int ways)
{
    return n > PAR_FROM && ways > 1 && gomp_parallel != NULL && own_pid == omp_pid
           && pthread_mutex_trylock(&pool_mu) == 0;
}
#endif

/* f32_mean's work: shared with up to `workers` threads where that pays (from the grain up, on torch's split) */
static void
run_stats_mean(const float *x, Py_ssize_t n, int lanes, int threads, int crc, int workers, result_t *r,
               float *mean)
{
    ts_sum_t s;
    ts_sum_init(&s, x, n, lanes, threads);
    int done = 0;
#ifdef HAVE_POOL
    int ways = workers < s.runs ? workers : s.runs;
    if (ways > POOL_MAX)
        ways = POOL_MAX;
    if (pool_take(n, ways)) {
        done = run_shared(x, n, ways, crc, &s, r);
        pthread_mutex_unlock(&pool_mu);
        if (!done)
            ts_sum_init(&s, x, n, lanes, threads);
    }
#endif
    if (done) { /* two runs or more: from the grain up, on more than one thread */
        *mean = torch_sum_f32(s.part, s.threads, lanes) / (float)n;
        return;
    }
    run_stats_mean_serial(x, n, crc, &s, r);
    *mean = ts_sum_finish(&s) / (float)n; /* sum().div_(n) */
}

/* run_stats_mean, the GIL released for large buffers (the caller holds a reference to their owner) */
static void
stats_mean(const float *x, Py_ssize_t n, int lanes, int threads, int crc, int workers, result_t *r, float *mean)
{
    if (n >= NOGIL_FROM) {
        Py_BEGIN_ALLOW_THREADS
        run_stats_mean(x, n, lanes, threads, crc, workers, r, mean);
        Py_END_ALLOW_THREADS
    } else {
        run_stats_mean(x, n, lanes, threads, crc, workers, r, mean);
    }
}

/* f32_sumsq over x[0:n), shared with up to `workers` threads of torch's team above PAR_FROM elements: each reads
 * whole blocks into their lane sums, which this thread adds in block order, so the bits are one thread's. The GIL
 * released for large buffers (the caller holds a reference to their owner). */
#ifdef HAVE_POOL
typedef struct {
    const float *x;
    Py_ssize_t nb;
    int ways;
    float *parts;
} norm_team_t;

static float *norm_parts; /* LANES floats per block, under pool_mu */
static size_t norm_cap;

static void
norm_body(void *arg)
{
    norm_team_t *t = arg;
    const int nt = omp_num_threads();
    for (int j = omp_thread_num(); j < t->ways; j += nt > 0 ? nt : t->ways) {
        Py_ssize_t b0 = t->nb * j / t->ways, b1 = t->nb * (j + 1) / t->ways;
        f32_sumsq_parts(t->x + b0 * BLOCK, b1 - b0, t->parts + b0 * LANES);
    }
}
#endif

static double
run_sumsq(const float *x, Py_ssize_t n, int workers)
{
#ifdef HAVE_POOL
    int ways = workers < POOL_MAX ? workers : POOL_MAX;
    Py_ssize_t nb = n / BLOCK;
    if (pool_take(n, ways)) {
        double Q = -1.0;
        size_t need = (size_t)nb * LANES;
        if (need > norm_cap) {
            float *p = realloc(norm_parts, need * sizeof(float));
            if (p != NULL)
                norm_parts = p, norm_cap = need;
        }
        if (need <= norm_cap) {
            norm_team_t team = {x, nb, ways, norm_parts};
            gomp_parallel(norm_body, &team, (unsigned)ways, 0);
            Q = 0.0;
            for (const float *p = norm_parts, *end = p + need; p < end; p += LANES)
                for (int k = 0; k < LANES; k++)
                    Q += p[k];
        }
        pthread_mutex_unlock(&pool_mu);
        if (Q >= 0.0)
            return f32_sumsq(x + nb * BLOCK, n - nb * BLOCK, Q);
    }
#endif
    return f32_sumsq(x, n, 0.0);
}

static double
sumsq(const float *x, Py_ssize_t n, int workers)
{
    double q;
    if (n >= NOGIL_FROM) {
        Py_BEGIN_ALLOW_THREADS
        q = run_sumsq(x, n, workers);
        Py_END_ALLOW_THREADS
    } else {
        q = run_sumsq(x, n, workers);
    }
    return q;
}

/* f32_mean(address, count, lanes, threads[, crc]) -> f32's three values and torch.mean of the buffer, as torch
 * computes it with `threads` intra-op threads and float vectors of `lanes`; with crc true, f32_crc's CRC-32 last */
static PyObject *
fastats_f32_mean(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 4 || nargs > 6) {
        PyErr_SetString(PyExc_TypeError, "f32_mean(address, count, lanes, threads[, crc[, workers]])");
        return NULL;
    }
    const float *p;
    Py_ssize_t n;
    long lanes;
    if (mean_args(args, "f32_mean", &p, &n, &lanes) < 0)
        return NULL;
    long threads = PyLong_AsLong(args[3]);
    int crc = nargs >= 5 ? PyObject_IsTrue(args[4]) : 0;
    long workers = nargs == 6 ? PyLong_AsLong(args[5]) : threads;
    if (PyErr_Occurred())
        return NULL;
    if (workers < 1) {
        PyErr_SetString(PyExc_ValueError, "f32_mean: bad workers");
        return NULL;
    }
    if (threads < 1 || threads > TS_MAXTHREADS) {
        PyErr_SetString(PyExc_ValueError, "f32_mean: bad threads");
        return NULL;
    }
    result_t r;
    float mean;
    stats_mean(p, n, (int)lanes, (int)threads, crc, (int)(workers < POOL_MAX ? workers : POOL_MAX), &r, &mean);
    if (crc)
        return Py_BuildValue("(ddddk)", r.mx, r.mn, r.q, (double)mean, (unsigned long)r.crc);
    return Py_BuildValue("(dddd)", r.mx, r.mn, r.q, (double)mean);
}

/* tmean(address, count, lanes) -> torch.mean of a contiguous float32 buffer, as a float (see above) */
static PyObject *
fastats_tmean(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "tmean(address, count, lanes)");
        return NULL;
    }
    const float *p;
    Py_ssize_t n;
    long lanes;
    if (mean_args(args, "tmean", &p, &n, &lanes) < 0)
        return NULL;
    return PyFloat_FromDouble((double)(torch_sum_f32(p, n, (int)lanes) / (float)n)); /* sum().div_(n) */
}

/* the XOR of the buffer's little-endian 64-bit words, the last one zero-padded */
static uint64_t
xor_bytes(const unsigned char *p, Py_ssize_t n)
{
    uint64_t acc[4] = {0, 0, 0, 0}, w;
    Py_ssize_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            memcpy(&w, p + i + 8 * k, 8);
            acc[k] ^= w;
        }
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        acc[0] ^= w;
    }
    if (i < n) {
        w = 0;
        memcpy(&w, p + i, (size_t)(n - i));
        acc[0] ^= w;
    }
    uint64_t x = acc[0] ^ acc[1] ^ acc[2] ^ acc[3];
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    x = __builtin_bswap64(x);
#endif
    return x;
}

/* xor64(address, nbytes) -> xor_bytes of the buffer (the xor summary mode: encode.xor_hex's numpy reduction, without
 * a numpy view, a padded copy and a ufunc per tensor) */
static PyObject *
fastats_xor64(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "xor64(address, nbytes)");
        return NULL;
    }
    const unsigned char *p = PyLong_AsVoidPtr(args[0]);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n < 0 || (p == NULL && n > 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "xor64: bad address or size");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(xor_bytes(p, n));
}

/* ---- entries: a recorded value's msprobe entries in one call (the PyTorch encoder's common case) ----
 * The items of a list, tuple or dict that are None, a bool, int, float or str, or a plain CPU float32 tensor of
 * 1..max elements with finite statistics, contiguous, a permutation of a dense block or a broadcast of one value, are
 * encoded here, through the same kernel (max, min, norm) and the same torch-ordered mean as encode.py's path, without
 * a Python frame per item; a checksum (md5, xor) of a non-contiguous one reads its elements gathered in its own order.
 * Given torch's thread count, larger tensors are too (statistics and md5; the checksum of a contiguous one only),
 * through f32_mean's read: encode.py passes it where it would read such a tensor itself rather than look it up in its
 * statistics cache. Every other item (another dtype, a slice dense in no order, a device tensor, a subclass, a nested
 * container, non-finite statistics) goes to encode.py's fallback.
 * encode.py's entries are the definition, which tests/inject/pytorch/test_encode_fast.py holds this path to.
 * entries_setup names the types and the lane count. */
static struct {
    PyObject *tensor, *param, *f32, *strided;
    int lanes;
    Py_ssize_t max_numel;
} E;
static PyObject *S_dtype, *S_layout, *S_is_cpu, *S_is_neg, *S_is_contiguous, *S_data_ptr, *S_numel, *S_shape,
    *S_requires_grad, *S_stride, *S_version, *S_device, *S_untyped_storage, *S_entries, *S_hits, *S_misses,
    *S_bytes_reduced, *K_md5, *K_type, *K_dtype, *K_shape, *K_max, *K_min, *K_mean, *K_norm, *K_requires_grad, *K_value,
    *K_device, *V_tensor, *V_float32, *V_bool, *V_int, *V_float, *V_str;
#define NOT_MINE ((PyObject *)&E) /* a leaf encode.py must do: no exception set */

/* A tensor's metadata from its TensorImpl, read by the C++ node hooks' build (msprobe_inject/pytorch/_nodehook.cpp,
 * compiled against the torch it runs with) where it is loaded: one call in place of the nine reads through torch's
 * Python getters, each with torch's error-handling frame and warning handler (~3,000 instructions per tensor). The
 * layout is that file's, versioned by the capsule's name; set_meta installs it. */
typedef struct {
    int64_t numel;
    const void *data;
    const int64_t *sizes;
    int64_t ndim;
    int f32, strided, cpu, neg, contiguous, requires_grad;
    const int64_t *strides; /* v2: a non-contiguous tensor's layout for gate, without the getter's ~250 instructions */
} tmeta_v2;
_Static_assert(sizeof(tmeta_v2) == 64 && offsetof(tmeta_v2, strides) == 56, "tmeta_v2 is _nodehook.cpp's");
typedef int (*tmeta_fn)(PyObject *, tmeta_v2 *);
#define TMETA_CAPSULE "msprobe_inject.tensor_meta.v2"
static tmeta_fn T_meta;
static PyObject *T_capsule;

static int
intern_names(void)
{
#define I(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return -1
    I(S_dtype, "dtype"); I(S_layout, "layout"); I(S_is_cpu, "is_cpu"); I(S_is_neg, "is_neg");
    I(S_is_contiguous, "is_contiguous"); I(S_data_ptr, "data_ptr"); I(S_numel, "numel"); I(S_shape, "shape");
    I(S_requires_grad, "requires_grad"); I(S_stride, "stride"); I(S_version, "_version"); I(S_device, "device");
    I(S_untyped_storage, "untyped_storage"); I(S_entries, "entries"); I(S_hits, "hits"); I(S_misses, "misses");
    I(S_bytes_reduced, "bytes_reduced"); I(K_md5, "md5"); I(K_type, "type"); I(K_dtype, "dtype"); I(K_shape, "shape");
    I(K_max, "Max"); I(K_min, "Min"); I(K_mean, "Mean"); I(K_norm, "Norm"); I(K_requires_grad, "requires_grad");
    I(K_value, "value"); I(K_device, "device"); I(V_tensor, "torch.Tensor"); I(V_float32, "torch.float32");
    I(V_bool, "bool"); I(V_int, "int"); I(V_float, "float"); I(V_str, "str");
#undef I
    return 0;
}

#define NEW_REF(o) (Py_INCREF(o), (o)) /* Py_NewRef, which Python 3.9 lacks */

/* A tensor's attribute or no-argument method, read through the descriptor torch.Tensor and nn.Parameter both find
 * (TensorBase's own getset or method descriptor), looked up once in entries_setup: PyObject_GetAttr and
 * PyObject_CallMethodNoArgs look it up through the type's MRO at every read, and a method's call builds a bound
 * method, together most of a small tensor's entry. Where the two classes do not share such a descriptor (a torch
 * whose Python class overrides the name), the generic read. Only exact Tensor and Parameter objects come here. */
enum { A_DTYPE, A_LAYOUT, A_IS_CPU, A_IS_NEG, A_IS_CONTIGUOUS, A_DATA_PTR, A_NUMEL, A_SHAPE, A_REQUIRES_GRAD, A_STRIDE,
       A_VERSION, A_DEVICE, A_UNTYPED_STORAGE, A_COUNT };
static struct {
    PyObject **name;
    int call;
    PyObject *descr; /* NULL: the generic read */
} ACC[A_COUNT] = {{&S_dtype, 0, NULL},         {&S_layout, 0, NULL},   {&S_is_cpu, 0, NULL},
                  {&S_is_neg, 1, NULL},        {&S_is_contiguous, 1, NULL}, {&S_data_ptr, 1, NULL},
                  {&S_numel, 1, NULL},         {&S_shape, 0, NULL},    {&S_requires_grad, 0, NULL},
                  {&S_stride, 1, NULL},        {&S_version, 0, NULL},  {&S_device, 0, NULL},
                  {&S_untyped_storage, 1, NULL}};

static PyObject *
tget(PyObject *t, int i)
{
    PyObject *d = ACC[i].descr;
    if (d != NULL)
        return ACC[i].call ? PyObject_Vectorcall(d, &t, 1, NULL) : Py_TYPE(d)->tp_descr_get(d, t, (PyObject *)Py_TYPE(t));
    return ACC[i].call ? PyObject_CallMethodNoArgs(t, *ACC[i].name) : PyObject_GetAttr(t, *ACC[i].name);
}

static void
find_descriptors(void)
{
    for (int i = 0; i < A_COUNT; i++) {
        Py_CLEAR(ACC[i].descr);
        PyObject *a = PyObject_GetAttr(E.tensor, *ACC[i].name), *b = PyObject_GetAttr(E.param, *ACC[i].name);
        if (a != NULL && a == b && Py_IS_TYPE(a, ACC[i].call ? &PyMethodDescr_Type : &PyGetSetDescr_Type)
            && PyObject_IsSubclass(E.tensor, (PyObject *)PyDescr_TYPE(a)) == 1)
            ACC[i].descr = NEW_REF(a);
        Py_XDECREF(a);
        Py_XDECREF(b);
        PyErr_Clear();
    }
}

/* 1: the attribute (or method result) is `want`; 0: it is not, or reading it raised (encode.py decides) */
static int
attr_is(PyObject *t, int i, PyObject *want)
{
    PyObject *v = tget(t, i);
    if (v == NULL) {
        PyErr_Clear();
        return 0;
    }
    int same = v == want;
    Py_DECREF(v);
    return same;
}

/* An entry's dict: a copy of a template holding its keys in order, then its values set over those.
 * A new dict grown key by key allocates its table, then again at the sixth key; a template's copy is one table
 * copied, and each value replaces one in place. A value that is one of a few shared objects (a tensor's type and
 * float32 dtype, a builtin's type name, None, True, False) is the template's own: its pair is not set again (three
 * of a statistics entry's eight). Templates are found by their keys' objects (this file's interned names) and those
 * values, a handful in all. */
#define TEMPLATES 24
static struct {
    int pairs;
    PyObject *keys[9];
    PyObject *fixed[9]; /* the template's value of a pair taken as it is, or NULL: set on each copy */
    PyObject *dict;
} tmpl[TEMPLATES];

static int
fixed_value(PyObject *v)
{
    return v == Py_None || v == Py_True || v == Py_False || v == V_tensor || v == V_float32 || v == V_bool
           || v == V_int || v == V_float || v == V_str;
}

static int
template_for(PyObject **kv, int pairs)
{
    if (pairs > 9)
        return -1;
    for (int j = 0; j < TEMPLATES; j++) {
        if (tmpl[j].dict == NULL) {
            PyObject *d = PyDict_New();
            if (d == NULL)
                return -1;
            for (int i = 0; i < pairs; i++) {
                PyObject *v = kv[2 * i + 1];
                if (PyDict_SetItem(d, kv[2 * i], fixed_value(v) ? v : Py_None) < 0) {
                    Py_DECREF(d);
                    return -1;
                }
            }
            if (PyDict_GET_SIZE(d) != pairs) { /* a key twice: no template */
                Py_DECREF(d);
                return -1;
            }
            for (int i = 0; i < pairs; i++) {
                PyObject *v = kv[2 * i + 1];
                tmpl[j].keys[i] = NEW_REF(kv[2 * i]);
                tmpl[j].fixed[i] = fixed_value(v) ? NEW_REF(v) : NULL;
            }
            tmpl[j].pairs = pairs;
            tmpl[j].dict = d;
            return j;
        }
        if (tmpl[j].pairs != pairs)
            continue;
        int i = 0;  /* a pair the template does not fix is set on the copy whatever its value */
        while (i < pairs && tmpl[j].keys[i] == kv[2 * i] && (tmpl[j].fixed[i] == NULL || tmpl[j].fixed[i] == kv[2 * i + 1]))
            i++;
        if (i == pairs)
            return j;
    }
    return -1;
}

static PyObject *
dict_of(PyObject **kv, int pairs)
{
    for (int i = 0; i < pairs; i++)
        if (kv[2 * i + 1] == NULL)
            return NULL;
    int j = template_for(kv, pairs);
    PyErr_Clear();
    PyObject *d = j >= 0 ? PyDict_Copy(tmpl[j].dict) : PyDict_New();
    if (d == NULL)
        return NULL;
    for (int i = 0; i < pairs; i++)
        if ((j < 0 || tmpl[j].fixed[i] == NULL) && PyDict_SetItem(d, kv[2 * i], kv[2 * i + 1]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    return d;
}

/* torch's is_contiguous over sizes and strides taken in the order of ix */
static int
contiguous_in(const int64_t *size, const int64_t *stride, const int *ix, int nd)
{
    int64_t expected = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t sz = size[ix[d]];
        if (sz == 1)
            continue;
        if (stride[ix[d]] != expected)
            return 0;
        expected *= sz;
    }
    return 1;
}

/* 1 when a non-contiguous t is a permutation of a dense tensor as encode._dense finds one (a 2-d tensor's
 * transpose; from 3 dimensions the order of decreasing stride, then size): its elements are then the dense block
 * at its data pointer, which encode.py reduces through that permutation's view (the same address) */
static int
permuted_dense_of(const int64_t *size, const int64_t *stride, int nd)
{
    int ix[8];
    if (nd < 2 || nd > 8)
        return 0;
    for (int d = 0; d < nd; d++) {
        if (stride[d] == 0) /* a broadcast, dense in no order */
            return 0;
        ix[d] = d;
    }
    if (nd == 2) {
        ix[0] = 1, ix[1] = 0;
    } else { /* Python's stable sort by (-stride, -size): an insertion sort keeps ties in index order */
        for (int i = 1; i < nd; i++) {
            int v = ix[i], j = i - 1;
            while (j >= 0 && (stride[ix[j]] < stride[v] || (stride[ix[j]] == stride[v] && size[ix[j]] < size[v]))) {
                ix[j + 1] = ix[j];
                j--;
            }
            ix[j + 1] = v;
        }
    }
    return contiguous_in(size, stride, ix, nd);
}

/* the same through torch's getters (shape, stride) */
static int
permuted_dense(PyObject *t)
{
    int64_t size[8], stride[8];
    int nd = 0;
    PyObject *sz = tget(t, A_SHAPE), *st = sz == NULL ? NULL : tget(t, A_STRIDE);
    int ok = sz != NULL && st != NULL && PyTuple_Check(sz) && PyTuple_Check(st)
             && (nd = (int)PyTuple_GET_SIZE(sz)) == PyTuple_GET_SIZE(st) && nd >= 2 && nd <= 8;
    for (int d = 0; ok && d < nd; d++) {
        size[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(sz, d));
        stride[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(st, d));
        ok = !PyErr_Occurred();
    }
    Py_XDECREF(sz);
    Py_XDECREF(st);
    if (!ok) {
        PyErr_Clear();
        return 0;
    }
    return permuted_dense_of(size, stride, nd);
}

/* the summary modes, as encode.py's _ENTRY_MODES; MODE_NORM: the Norm alone, Max, Min and Mean null (the monitor
 * preset's statistics), any size read here on the calling thread */
enum { MODE_STATISTICS = 0, MODE_MD5 = 1, MODE_XOR = 2, MODE_NORM = 3 };
/* or'ed into the mode: a tensor's entry held as C values (_entry.h) where this file would build a dict; the statistics
 * cache still keeps float objects and the CRC's text, which held_figures reads back for a hit */
#define MODE_COMPACT 16
static EntryAPI *EAPI; /* _jenc's entries, found at the first request */
static int eapi_tried;

/* ---- encode.StatCache, for the tensors above max elements read here: the same dict, keys and values as
 * encode.py's StatCache.key/get/put, so that a tensor read by either path is found by both ---- */
static PyObject *C_ready;    /* encode.READY: the kind of figures that are final */
static int C_storage_refs;   /* encode._STORAGE_REFS: a storage's Python object lives as long as the storage */
static PyObject *C_constants; /* encode._CONSTANTS: a broadcast float32 tensor's figures by its value and shape */

/* StatCache.key: (data_ptr, dtype, shape, stride(), _version, device), or for a contiguous tensor (here always of one
 * or more dimensions) (data_ptr, dtype, numel, None, _version, device); NULL (no error set) if a getter failed */
static PyObject *
cache_key(PyObject *t, const void *p, PyObject *size, int contiguous, Py_ssize_t n)
{
    PyObject *ptr = PyLong_FromVoidPtr((void *)p); /* made here: only a large tensor's key needs it */
    if (ptr == NULL) {
        PyErr_Clear();
        return NULL;
    }
    /* its third and fourth items, each a new reference: (numel, None) or (shape, stride()) */
    PyObject *third = contiguous ? PyLong_FromSsize_t(n) : NEW_REF(size),
             *fourth = contiguous ? NEW_REF(Py_None) : tget(t, A_STRIDE),
             *version = tget(t, A_VERSION), *device = tget(t, A_DEVICE), *key = NULL;
    if (third != NULL && fourth != NULL && version != NULL && device != NULL)
        key = PyTuple_Pack(6, ptr, E.f32, third, fourth, version, device);
    Py_DECREF(ptr);
    Py_XDECREF(third);
    Py_XDECREF(fourth);
    Py_XDECREF(version);
    Py_XDECREF(device);
    if (key == NULL)
        PyErr_Clear();
    return key;
}

static void
counter_add(PyObject *cache, PyObject *name, Py_ssize_t k)
{
    PyObject *v = PyObject_GetAttr(cache, name), *w = NULL, *kk = PyLong_FromSsize_t(k);
    if (v != NULL && kk != NULL && (w = PyNumber_Add(v, kk)) != NULL)
        PyObject_SetAttr(cache, name, w);
    Py_XDECREF(v);
    Py_XDECREF(w);
    Py_XDECREF(kk);
    PyErr_Clear();
}

/* StatCache.get for final figures: the (Max, Min, Mean, Norm) tuple (new reference) and, for md5, the CRC's hex
 * text in *crc (new reference); NULL, no error set, for no usable entry */
static PyObject *
cache_get(PyObject *cache, PyObject *entries, PyObject *key, int md5, PyObject **crc)
{
    PyObject *e = PyDict_GetItemWithError(entries, key); /* borrowed */
    if (e == NULL || !PyTuple_Check(e) || PyTuple_GET_SIZE(e) < 6) {
        PyErr_Clear();
        return NULL;
    }
    Py_INCREF(e); /* the owner's data_ptr() below runs Python code that may drop the dict's hold */
    PyObject *stat = NULL, *owner = PyObject_CallNoArgs(PyTuple_GET_ITEM(e, 0));
    PyObject *optr = owner == NULL || owner == Py_None ? NULL : PyObject_CallMethodNoArgs(owner, S_data_ptr);
    PyObject *figures = PyTuple_GET_ITEM(e, 1), *c = PyTuple_GET_ITEM(e, 3);
    if (optr != NULL && PyObject_RichCompareBool(optr, PyTuple_GET_ITEM(e, PyTuple_GET_SIZE(e) - 1), Py_EQ) == 1
        && PyTuple_GET_ITEM(e, 2) == C_ready && PyTuple_Check(figures) && PyTuple_GET_SIZE(figures) == 4
        && (!md5 || PyUnicode_Check(c))) {
        stat = NEW_REF(figures);
        *crc = md5 ? NEW_REF(c) : NULL;
        counter_add(cache, S_hits, 1);
    }
    Py_XDECREF(owner);
    Py_XDECREF(optr);
    Py_DECREF(e);
    PyErr_Clear();
    return stat;
}

/* StatCache.put: (weak reference to the owner, figures, READY, crc or None, no file, the owner's data_ptr()) */
static void
cache_put(PyObject *cache, PyObject *entries, PyObject *key, PyObject *t, PyObject *stat, PyObject *crc, Py_ssize_t n)
{
    counter_add(cache, S_misses, 1);
    counter_add(cache, S_bytes_reduced, 4 * n);
    PyObject *owner = C_storage_refs ? tget(t, A_UNTYPED_STORAGE) : NULL;
    if (owner == NULL) {
        PyErr_Clear();
        owner = NEW_REF(t);
    }
    PyObject *ref = PyWeakref_NewRef(owner, NULL), *optr = PyObject_CallMethodNoArgs(owner, S_data_ptr), *value;
    if (ref != NULL && optr != NULL
        && (value = PyTuple_Pack(6, ref, stat, C_ready, crc ? crc : Py_None, Py_None, optr)) != NULL) {
        /* a step's entries live until its end: not followed by the collector (see shape_list), they are not
         * promoted either. A weak reference without a callback refers to nothing strongly, and is cleared by its
         * referent's death whether tracked or not; the rest is atomic. */
        PyObject_GC_UnTrack(ref);
        if (PyTuple_CheckExact(stat))
            PyObject_GC_UnTrack(stat);
        PyObject_GC_UnTrack(value);
        if (PyDict_Size(entries) > 200000)
            PyDict_Clear(entries);
        PyDict_SetItem(entries, key, value);
        Py_DECREF(value);
    }
    Py_XDECREF(ref);
    Py_XDECREF(optr);
    Py_DECREF(owner);
    PyErr_Clear();
}

/* An entry's shape: a list of ints, which the garbage collector need not follow (no list of ints is in a cycle).
 * Untracked, it leaves its entry dict untracked too (a dict of atomic values and untracked containers stays so
 * until something tracked is put in it): a record's body then costs the collector nothing while it waits for the
 * writer thread, and is never promoted to the older generations, whose growth sets off full collections. */
static PyObject *
shape_list(PyObject *size)
{
    Py_ssize_t n = PyTuple_GET_SIZE(size); /* a torch.Size: a tuple of ints */
    PyObject *shape = PyList_New(n);
    if (shape == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(shape, i, NEW_REF(PyTuple_GET_ITEM(size, i)));
    PyObject_GC_UnTrack(shape);
    return shape;
}

/* 1: every stride of t is 0 (a broadcast of one value: the gradient a sum or a mean hands back) */
static int
zero_strides_of(const int64_t *stride, int64_t nd)
{
    for (int64_t d = 0; d < nd; d++)
        if (stride[d] != 0)
            return 0;
    return nd > 0;
}

/* the same through torch's getter (stride) */
static int
zero_strides(PyObject *t)
{
    PyObject *st = tget(t, A_STRIDE);
    int zero = st != NULL && PyTuple_Check(st) && PyTuple_GET_SIZE(st) > 0;
    for (Py_ssize_t d = 0; zero && d < PyTuple_GET_SIZE(st); d++) {
        PyObject *s = PyTuple_GET_ITEM(st, d);
        zero = PyLong_Check(s) && PyLong_AsLongLong(s) == 0;
    }
    Py_XDECREF(st);
    PyErr_Clear();
    return zero;
}

static void hex8(char *out, uint32_t v);

/* The entry of a broadcast tensor whose figures encode._constant_f32 found before, looked up as it looks them up:
 * (its value as the kernel reads one element, that value's sign, its shape, torch's thread count from the size
 * where torch's mean splits its sum, else 1). NOT_MINE where they are not there yet (encode.py computes and keeps
 * them) or the value is NaN. md5: the CRC of g, the broadcast's n elements as its contiguous copy holds them (the
 * figures do not depend on them, the checksum does). */
static PyObject *
constant_entry(const float *p, Py_ssize_t n, PyObject *size, PyObject *rg, int mode, int threads, const uint32_t *g,
               int compact)
{
    result_t r1;
    run_job((const char *)p, 1, 4, JOB_STATS, &r1);
    double v = r1.mx;
    if (v != v || C_constants == NULL || (n >= TS_GRAIN && threads < 1))
        return NOT_MINE;
    PyObject *key = Py_BuildValue("(ddOn)", v, copysign(1.0, v), size, n >= TS_GRAIN ? (Py_ssize_t)threads : 1);
    PyObject *got = key == NULL ? NULL : PyDict_GetItemWithError(C_constants, key);
    Py_XDECREF(key);
    if (got == NULL || !PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2 || PyTuple_GET_ITEM(got, 1) != C_ready
        || !PyTuple_Check(PyTuple_GET_ITEM(got, 0)) || PyTuple_GET_SIZE(PyTuple_GET_ITEM(got, 0)) != 4) {
        PyErr_Clear();
        return NOT_MINE;
    }
    /* held: the allocations below may run a collection, whose finalisers may let another thread clear the dict */
    Py_INCREF(got);
    PyObject *f = PyTuple_GET_ITEM(got, 0);
    double fig[4];
    for (int i = 0; i < 4 && compact; i++) {
        PyObject *x = PyTuple_GET_ITEM(f, i);
        compact = PyFloat_CheckExact(x);  /* a float's text is its double's, as an entry of C values writes it */
        fig[i] = compact ? PyFloat_AS_DOUBLE(x) : 0.0;
    }
    if (compact) {
        uint32_t crc = mode == MODE_MD5 ? crc_update(0, (const unsigned char *)g, (size_t)n * 4) : 0;
        int kind = mode == MODE_NORM ? ENTRY_NORM : mode == MODE_MD5 ? ENTRY_MD5 : ENTRY_STATS;
        PyObject *d = EAPI->make(V_tensor, V_float32, size, fig, kind, crc, rg == Py_True, PyTuple_GET_SIZE(size) == 0);
        Py_DECREF(got);
        return d;
    }
    PyObject *shape = shape_list(size);
    if (shape == NULL) {
        Py_DECREF(got);
        return NULL;
    }
    char hex[9];
    PyObject *kv[18] = {K_type, V_tensor, K_dtype, V_float32, K_shape, shape, K_max, PyTuple_GET_ITEM(f, 0),
                        K_min, PyTuple_GET_ITEM(f, 1), K_mean, PyTuple_GET_ITEM(f, 2), K_norm, PyTuple_GET_ITEM(f, 3),
                        K_requires_grad, rg, K_md5, NULL};
    if (mode == MODE_NORM) /* the Norm alone (Encoder.norm_only) */
        kv[7] = kv[9] = kv[11] = Py_None;
    if (mode == MODE_MD5) { /* the CRC of the broadcast's bytes in its order (g: gathered) */
        hex8(hex, crc_update(0, (const unsigned char *)g, (size_t)n * 4));
        kv[17] = PyUnicode_FromString(hex);
    }
    PyObject *d = dict_of(kv, mode == MODE_MD5 ? 9 : 8);
    Py_XDECREF(kv[17]);
    Py_DECREF(shape);
    Py_DECREF(got);
    return d;
}

/* "%08x" of a CRC-32, without snprintf's format parsing */
static void
hex8(char *out, uint32_t v)
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 7; i >= 0; i--, v >>= 4)
        out[i] = digits[v & 15];
    out[8] = '\0';
}

/* 1: the statistics cache's figures of a tensor (and its CRC's text at md5) as an entry of C values holds them: four
 * floats (a float's text is its double's), eight lowercase hex digits; 0 for anything else (the dict then) */
static int
held_figures(PyObject *stat, PyObject *crc, int mode, double *fig, uint32_t *sum)
{
    for (int i = 0; i < 4; i++) {
        PyObject *x = PyTuple_GET_ITEM(stat, i);
        if (!PyFloat_CheckExact(x))
            return 0;
        fig[i] = PyFloat_AS_DOUBLE(x);
    }
    *sum = 0;
    if (mode != MODE_MD5)
        return 1;
    if (crc == NULL || !PyUnicode_CheckExact(crc) || !PyUnicode_IS_ASCII(crc) || PyUnicode_GET_LENGTH(crc) != 8)
        return 0;
    const char *s = (const char *)PyUnicode_DATA(crc);
    for (int i = 0; i < 8; i++) {
        int v = s[i] >= '0' && s[i] <= '9' ? s[i] - '0' : s[i] >= 'a' && s[i] <= 'f' ? s[i] - 'a' + 10 : -1;
        if (v < 0)
            return 0;
        *sum = *sum << 4 | (uint32_t)v;
    }
    return 1;
}

/* 1: a tensor of n elements is this file's by its size (a large one given torch's thread count, and not for xor) */
static int
sized(Py_ssize_t n, int mode, int threads)
{
    return n >= 1 && (n <= E.max_numel || mode == MODE_NORM || (threads >= 1 && mode != MODE_XOR));
}

/* tensor_entry's decision on what its reads found, the same whichever read: 1 this file's tensor, 2 a broadcast of one
 * value (its figures constant_entry's; xor: its checksum alone), 0 encode.py's. */
static int
gate(PyObject *t, int mode, int threads, Py_ssize_t n, int f32, int strided, int cpu, int neg, int contiguous,
     const int64_t *sizes, const int64_t *strides, int64_t ndim)
{
    if (!sized(n, mode, threads) || !f32 || !strided || !cpu || neg)
        return 0;
    if (contiguous)
        return 1;
    /* a checksum reads the bytes in the tensor's order, not those at its data pointer: tensor_entry gathers them, for
     * a small tensor */
    if ((mode == MODE_MD5 || mode == MODE_XOR) && n > E.max_numel)
        return 0;
    if (strides != NULL) /* the TensorImpl's own (cxx_meta) */
        return zero_strides_of(strides, ndim) ? 2 : permuted_dense_of(sizes, strides, (int)ndim);
    if (zero_strides(t))
        return 2;
    return permuted_dense(t);
}

/* The elements of a non-contiguous tensor (a broadcast or a permutation of a dense block) in its own order: the bytes
 * of its contiguous copy, which the checksums read (encode.crc32_hex, xor_hex), row-major as torch copies them. Copied
 * as bits: a NaN's payload is part of the checksum. At most 8 dimensions, permuted_dense's limit (a broadcast of more
 * is encode.py's). NULL with an exception set where the strides cannot be read or memory is short. */
static uint32_t *
gathered(PyObject *t, const float *p, PyObject *size, Py_ssize_t n)
{
    int64_t sz[8], sd[8], ix[8];
    Py_ssize_t nd = PyTuple_GET_SIZE(size);
    PyObject *st = tget(t, A_STRIDE);
    if (st == NULL)
        return NULL;
    if (!PyTuple_Check(st) || PyTuple_GET_SIZE(st) != nd || nd < 1 || nd > 8) {
        Py_DECREF(st);
        PyErr_SetString(PyExc_ValueError, "gathered: unexpected strides");
        return NULL;
    }
    for (Py_ssize_t d = 0; d < nd; d++) {
        sz[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(size, d));
        sd[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(st, d));
        ix[d] = 0;
    }
    Py_DECREF(st);
    if (PyErr_Occurred())
        return NULL;
    uint32_t *g = PyMem_Malloc((size_t)n * 4);
    if (g == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    const uint32_t *src = (const uint32_t *)p;
    int64_t off = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        g[k] = src[off];
        for (Py_ssize_t d = nd - 1; d >= 0; d--) { /* an odometer: offsets added, not an index product per element */
            if (++ix[d] < sz[d]) {
                off += sd[d];
                break;
            }
            off -= (sz[d] - 1) * sd[d];
            ix[d] = 0;
        }
    }
    return g;
}

/* tensor_entry's reads through torch's Python getters: 1 with *p, *size (a tuple) and *rg (new references), 2 the
 * same for a broadcast of one value (see gate), 0 for a tensor encode.py encodes (no exception set) */
static int
py_meta(PyObject *t, int mode, int threads, Py_ssize_t *n_out, int *contig_out, const float **p_out,
        PyObject **size_out, PyObject **rg_out)
{
    PyObject *o = tget(t, A_NUMEL); /* first: a large tensor is encode.py's at once */
    if (o == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t n = PyLong_AsSsize_t(o);
    Py_DECREF(o);
    if (n == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (!sized(n, mode, threads))
        return 0; /* before the other reads: a large tensor is encode.py's at once */
    int contiguous = attr_is(t, A_IS_CONTIGUOUS, Py_True);
    int kind = gate(t, mode, threads, n, attr_is(t, A_DTYPE, E.f32), attr_is(t, A_LAYOUT, E.strided),
                    attr_is(t, A_IS_CPU, Py_True), !attr_is(t, A_IS_NEG, Py_False), contiguous, NULL, NULL, 0);
    if (!kind)
        return 0;
    PyObject *ptr = tget(t, A_DATA_PTR);
    const float *p = ptr == NULL ? NULL : PyLong_AsVoidPtr(ptr);
    Py_XDECREF(ptr);
    if (p == NULL) { /* no storage (a functorch or fake tensor) */
        PyErr_Clear();
        return 0;
    }
    PyObject *size = tget(t, A_SHAPE);
    if (size == NULL || !PyTuple_Check(size)) {
        Py_XDECREF(size);
        PyErr_Clear();
        return 0;
    }
    PyObject *rg = tget(t, A_REQUIRES_GRAD);
    if (rg == NULL || (rg != Py_True && rg != Py_False)) {
        Py_DECREF(size);
        Py_XDECREF(rg);
        PyErr_Clear();
        return 0;
    }
    *n_out = n, *contig_out = contiguous, *p_out = p, *size_out = size, *rg_out = rg;
    return kind;
}

/* The shape tuples cxx_meta made last, by their sizes: a step's calls see the same few shapes over and over, and a
 * shape tuple is immutable (the entries share it). Round robin; the GIL serialises it, as the rest of this file. */
#define SHAPES 16
#define SHAPE_DIMS 8
static struct {
    int64_t ndim;
    int64_t sizes[SHAPE_DIMS];
    PyObject *tuple; /* a strong reference, NULL while the slot is empty */
} shapes[SHAPES];
static int shapes_next;

/* the tuple of sizes[0..ndim), a new reference, or NULL with an error set */
static PyObject *
shape_of(const int64_t *sizes, int64_t ndim)
{
    if (ndim <= SHAPE_DIMS) {
        for (int i = 0; i < SHAPES; i++) {
            if (shapes[i].tuple != NULL && shapes[i].ndim == ndim
                && (ndim == 0 || memcmp(shapes[i].sizes, sizes, sizeof(int64_t) * (size_t)ndim) == 0))
                return NEW_REF(shapes[i].tuple);
        }
    }
    PyObject *size = PyTuple_New((Py_ssize_t)ndim);
    for (Py_ssize_t i = 0; size != NULL && i < (Py_ssize_t)ndim; i++) {
        PyObject *d = PyLong_FromLongLong(sizes[i]);
        if (d == NULL) {
            Py_CLEAR(size);
            break;
        }
        PyTuple_SET_ITEM(size, i, d);
    }
    if (size != NULL && ndim <= SHAPE_DIMS) {
        int i = shapes_next;
        shapes_next = (i + 1) % SHAPES;
        PyObject *old = shapes[i].tuple;
        shapes[i].ndim = ndim;
        if (ndim > 0)
            memcpy(shapes[i].sizes, sizes, sizeof(int64_t) * (size_t)ndim);
        shapes[i].tuple = NEW_REF(size);
        Py_XDECREF(old); /* last: a tuple's ints free no Python code, but the slot is whole before it */
    }
    return size;
}

/* The same from the TensorImpl (T_meta): 1 and 2 as py_meta, 0 for encode.py, -1 where the C++ read declined
 * (py_meta's turn). Both decide through gate. */
static int
cxx_meta(PyObject *t, int mode, int threads, Py_ssize_t *n_out, int *contig_out, const float **p_out,
         PyObject **size_out, PyObject **rg_out)
{
    tmeta_v2 m;
    if (T_meta(t, &m) != 0)
        return -1;
    Py_ssize_t n = (Py_ssize_t)m.numel;
    int kind = gate(t, mode, threads, n, m.f32, m.strided, m.cpu, m.neg, m.contiguous, m.sizes, m.strides, m.ndim);
    if (!kind)
        return 0;
    if (m.data == NULL)
        return 0;
    PyObject *size = shape_of(m.sizes, m.ndim);
    if (size == NULL) {
        PyErr_Clear();
        return -1;
    }
    *n_out = n, *contig_out = m.contiguous, *p_out = (const float *)m.data, *size_out = size;
    *rg_out = NEW_REF(m.requires_grad ? Py_True : Py_False);
    return kind;
}

/* entries' ctx form: torch's thread count asked only of a tensor whose statistics depend on it (from the grain on,
 * or above max elements: tensor_entry), through the function the ctx gives (a call per encoded value otherwise, for
 * a figure the tiny tensors of most calls never read); -1 where it fails, and the tensor is encode.py's */
#define THREADS_ASK (TS_MAXTHREADS + 1)
static PyObject *threads_fn;

static int
threads_now(void)
{
    PyObject *fn = threads_fn;
    if (fn == NULL)
        return -1;
    Py_INCREF(fn); /* a call that sets another function frees none it is running */
    PyObject *r = PyObject_CallNoArgs(fn);
    Py_DECREF(fn);
    long v = r != NULL ? PyLong_AsLong(r) : -1;
    Py_XDECREF(r);
    if (v < 1 || v > TS_MAXTHREADS) {
        PyErr_Clear();
        return -1;
    }
    return (int)v;
}

/* threads: torch's intra-op thread count for tensors above max elements, 0 to leave those to encode.py; cache:
 * encode.StatCache for those, or None */
/* a tensor's figures: from its TensorImpl where that reader is set up and takes it, else through its attributes */
static int
read_meta(PyObject *t, int mode, int threads, Py_ssize_t *n, int *contiguous, const float **p, PyObject **size,
          PyObject **rg)
{
    int got = T_meta != NULL ? cxx_meta(t, mode, threads, n, contiguous, p, size, rg) : -1;
    return got < 0 ? py_meta(t, mode, threads, n, contiguous, p, size, rg) : got;
}

static PyObject *
tensor_entry(PyObject *t, int mode, int threads, PyObject *cache)
{
    int compact = (mode & MODE_COMPACT) && EAPI != NULL;
    mode &= ~MODE_COMPACT;
    Py_ssize_t n;
    int contiguous;
    const float *p;
    PyObject *size, *rg;
    int got = read_meta(t, mode, threads, &n, &contiguous, &p, &size, &rg);
    if (!got)
        return NOT_MINE;
    if (threads == THREADS_ASK) {
        if (n < TS_GRAIN && n <= E.max_numel) {
            threads = 1; /* not read: below the grain and in one block */
        } else { /* the function may run Python code: the tensor's figures are read again after it */
            Py_DECREF(size);
            Py_DECREF(rg);
            if ((threads = threads_now()) < 1)
                return NOT_MINE;
            if (!(got = read_meta(t, mode, threads, &n, &contiguous, &p, &size, &rg)))
                return NOT_MINE;
        }
    }
    uint32_t *g = NULL; /* a non-contiguous tensor's bytes in its order, for a checksum (gate: a small tensor) */
    if (!contiguous && (mode == MODE_MD5 || mode == MODE_XOR) && (g = gathered(t, p, size, n)) == NULL) {
        PyErr_Clear();
        Py_DECREF(size);
        Py_DECREF(rg);
        return NOT_MINE;
    }
    if (got == 2 && mode != MODE_XOR) { /* xor: no figures, the checksum below */
        PyObject *d = constant_entry(p, n, size, rg, mode, threads, g, compact);
        PyMem_Free(g);
        Py_DECREF(size);
        Py_DECREF(rg);
        if (d != NULL && d != NOT_MINE && PyDict_CheckExact(d))
            PyObject_GC_UnTrack(d);
        return d;
    }
    const unsigned char *bytes = g != NULL ? (const unsigned char *)g : (const unsigned char *)p;
    int large = n > E.max_numel;
    PyObject *entries = NULL, *key = NULL, *stat = NULL, *crc = NULL;
    if (large && cache != Py_None && mode != MODE_NORM) { /* the cache holds all four figures */
        entries = PyObject_GetAttr(cache, S_entries);
        if (entries != NULL && PyDict_Check(entries) && (key = cache_key(t, p, size, contiguous, n)) != NULL)
            stat = cache_get(cache, entries, key, mode == MODE_MD5, &crc);
        PyErr_Clear();
    }
    int scalar = PyTuple_GET_SIZE(size) == 0;
    char hex[24];
    double fig[4];
    uint32_t sum = 0;
    PyObject *d = NOT_MINE;
    if (mode == MODE_XOR) { /* {type, dtype, shape, md5, requires_grad}: a 0-d tensor's "md5" is its value */
        PyObject *sum = NULL;
        if (compact) {
            double fig[4] = {scalar ? *p : 0.0, 0.0, 0.0, 0.0};
            d = EAPI->make(V_tensor, V_float32, size, fig, ENTRY_XOR, scalar ? 0 : xor_bytes(bytes, 4 * n),
                           rg == Py_True, scalar);
        } else if (scalar) {
            sum = PyFloat_FromDouble(*p);
        } else {
            snprintf(hex, sizeof hex, "0x%016llx", (unsigned long long)xor_bytes(bytes, 4 * n));
            sum = PyUnicode_FromString(hex);
        }
        if (!compact) {
            PyObject *shape = shape_list(size);
            PyObject *kv[10] = {K_type, V_tensor, K_dtype, V_float32, K_shape, shape, K_md5, sum, K_requires_grad, rg};
            d = dict_of(kv, 5);
            Py_XDECREF(shape);
            Py_XDECREF(sum);
        }
    } else if (mode == MODE_NORM) { /* {type, dtype, shape, Max, Min, Mean: null, Norm, requires_grad} */
        double q = 0.0, norm;
        if (scalar) {
            norm = *p; /* a 0-d tensor's figures are its value */
        } else {
            q = sumsq(p, n, threads);
            norm = sqrt(q);
        }
        if (isfinite(q) && compact) {
            double fig[4] = {0.0, 0.0, 0.0, norm};
            d = EAPI->make(V_tensor, V_float32, size, fig, ENTRY_NORM, 0, rg == Py_True, scalar);
        } else if (isfinite(q)) { /* NaN/Inf: encode.py's path, torch's reductions */
            PyObject *shape = shape_list(size), *nv = PyFloat_FromDouble(norm);
            PyObject *kv[16] = {K_type, V_tensor, K_dtype, V_float32, K_shape, shape, K_max, Py_None, K_min, Py_None,
                                K_mean, Py_None, K_norm, nv, K_requires_grad, rg};
            d = dict_of(kv, 8);
            Py_XDECREF(shape);
            Py_XDECREF(nv);
        }
    } else if (stat != NULL && compact && held_figures(stat, crc, mode, fig, &sum)) { /* a cached tensor's */
        d = EAPI->make(V_tensor, V_float32, size, fig, mode == MODE_MD5 ? ENTRY_MD5 : ENTRY_STATS, sum,
                       rg == Py_True, scalar);
    } else if (stat != NULL) { /* a cached tensor's figures */
        PyObject *shape = shape_list(size);
        PyObject *kv[18] = {K_type, V_tensor, K_dtype, V_float32, K_shape, shape, K_max, PyTuple_GET_ITEM(stat, 0),
                            K_min, PyTuple_GET_ITEM(stat, 1), K_mean, PyTuple_GET_ITEM(stat, 2),
                            K_norm, PyTuple_GET_ITEM(stat, 3), K_requires_grad, rg, K_md5, crc};
        d = dict_of(kv, mode == MODE_MD5 ? 9 : 8);
        Py_XDECREF(shape);
    } else {
        result_t r;
        double mean, norm;
        /* the CRC read with the figures where the bytes in memory are those in the tensor's order */
        int crc_with = mode == MODE_MD5 && g == NULL;
        if (scalar) { /* a 0-d tensor (a loss): its value is all four figures, as msprobe writes */
            r.mx = r.mn = mean = norm = *p;
            if (mode == MODE_MD5)
                r.crc = crc_update(0, bytes, 4);
        } else if (large) { /* encode._f32_kernel's f32_mean call, the GIL released as there */
            float m;
            stats_mean(p, n, E.lanes, threads, crc_with, threads < POOL_MAX ? threads : POOL_MAX, &r, &m);
            mean = (double)m;
            norm = sqrt(r.q);
        } else {
            run_job((const char *)p, n, 4, crc_with ? JOB_STATS | JOB_CRC : JOB_STATS, &r);
            mean = (double)(torch_sum_f32(p, n, E.lanes) / (float)n);
            norm = sqrt(r.q);
        }
        if (mode == MODE_MD5 && g != NULL)
            r.crc = crc_update(0, bytes, (size_t)n * 4);
        if (compact && (scalar || isfinite(r.q))) {
            double figs[4] = {r.mx, r.mn, mean, norm};
            d = EAPI->make(V_tensor, V_float32, size, figs, mode == MODE_MD5 ? ENTRY_MD5 : ENTRY_STATS,
                           mode == MODE_MD5 ? r.crc : 0, rg == Py_True, scalar);
            if (d != NULL && key != NULL) { /* the cache keeps the figures as the dict would hold them */
                PyObject *figures = Py_BuildValue("(dddd)", r.mx, r.mn, mean, norm), *text = NULL;
                if (mode == MODE_MD5) {
                    hex8(hex, r.crc);
                    text = PyUnicode_FromString(hex);
                }
                if (figures != NULL && (mode != MODE_MD5 || text != NULL))
                    cache_put(cache, entries, key, t, figures, text, n);
                Py_XDECREF(figures);
                Py_XDECREF(text);
                PyErr_Clear();
            }
        } else if (scalar || isfinite(r.q)) { /* NaN/Inf: torch's reductions, for their semantics */
            if (mode == MODE_MD5)
                hex8(hex, r.crc);
            PyObject *shape = shape_list(size);
            PyObject *kv[18] = {K_type, V_tensor, K_dtype, V_float32, K_shape, shape, K_max, PyFloat_FromDouble(r.mx),
                                K_min, PyFloat_FromDouble(r.mn), K_mean, PyFloat_FromDouble(mean),
                                K_norm, PyFloat_FromDouble(norm), K_requires_grad, rg,
                                K_md5, mode == MODE_MD5 ? PyUnicode_FromString(hex) : NULL};
            d = dict_of(kv, mode == MODE_MD5 ? 9 : 8);
            if (d != NULL && key != NULL) {
                PyObject *figures = PyTuple_Pack(4, kv[7], kv[9], kv[11], kv[13]);
                if (figures != NULL)
                    cache_put(cache, entries, key, t, figures, kv[17], n);
                Py_XDECREF(figures);
            }
            for (int i = 5; i < 14; i += 2)
                Py_XDECREF(kv[i]);
            Py_XDECREF(kv[17]);
        }
    }
    PyMem_Free(g);
    Py_DECREF(size);
    Py_DECREF(rg);
    Py_XDECREF(entries);
    Py_XDECREF(key);
    Py_XDECREF(stat);
    Py_XDECREF(crc);
    if (d != NULL && d != NOT_MINE && PyDict_CheckExact(d)) /* atomic values and an untracked shape (shape_list); a
                                                              * dict put anything tracked into is tracked again by the
                                                              * dict itself. An entry of C values is no collector's. */
        PyObject_GC_UnTrack(d);
    return d;
}

static PyObject *
leaf_entry(PyObject *v, int mode, int threads, PyObject *cache)
{
    PyTypeObject *tp = Py_TYPE(v);  /* exact types: encode.py's isinstance tests differ for subclasses */
    if ((PyObject *)tp == E.tensor || (PyObject *)tp == E.param)
        return tensor_entry(v, mode, threads, cache);
    if (v == Py_None)
        Py_RETURN_NONE;
    PyObject *name = tp == &PyBool_Type ? V_bool : tp == &PyLong_Type ? V_int : tp == &PyFloat_Type ? V_float
                   : tp == &PyUnicode_Type ? V_str : NULL;
    if (name == NULL)
        return NOT_MINE;
    PyObject *kv[4] = {K_type, name, K_value, v};
    return dict_of(kv, 2);
}

/* A list or dict of entries none of which the collector follows (see shape_list) need not be followed either (a
 * dict's own rule would follow it: it follows a dict as soon as a list or dict is put in it, tracked or not). */
static void
untrack_if_flat(PyObject *container)
{
    if (PyList_CheckExact(container)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(container); i++)
            if (PyObject_GC_IsTracked(PyList_GET_ITEM(container, i)))
                return;
    } else {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(container, &pos, &k, &v))
            if (PyObject_GC_IsTracked(v))
                return;
    }
    PyObject_GC_UnTrack(container);
}

/* What the tool keeps until the writer thread has it (a record's body, its members, the entries the Python encoder
 * builds for another dtype or a device tensor) left to the collector no more, as this file leaves what it builds:
 * its dicts and lists, deepest first, each untracked where nothing in it is tracked (untrack_if_flat; an entry's
 * shape is a list of ints), and a tuple without an instance dict (a writer event) whose items are all untracked.
 * A dict given something tracked later is followed again by its own rule; a list is not, and none of these lists
 * is added to once built. One already untracked was walked before. */
static void
untrack_deep(PyObject *o, int depth)
{
    if (depth > 64 || !PyObject_GC_IsTracked(o))
        return;
    if (PyDict_CheckExact(o)) {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(o, &pos, &k, &v))
            if (PyDict_CheckExact(v) || PyList_CheckExact(v))
                untrack_deep(v, depth + 1);
    } else if (PyList_CheckExact(o)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(o); i++) {
            PyObject *v = PyList_GET_ITEM(o, i);
            if (PyDict_CheckExact(v) || PyList_CheckExact(v))
                untrack_deep(v, depth + 1);
        }
    } else if (PyTuple_Check(o) && Py_TYPE(o)->tp_dictoffset == 0) {
        /* a writer event (a named tuple): the collector untracks only exact tuples of untracked items itself */
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); i++) {
            PyObject *v = PyTuple_GET_ITEM(o, i);
            if (PyDict_CheckExact(v) || PyList_CheckExact(v))
                untrack_deep(v, depth + 1);
            if (PyObject_GC_IsTracked(v))
                return;
        }
        PyObject_GC_UnTrack(o);
        return;
    } else
        return;
    untrack_if_flat(o);
}

static PyObject *
fastats_untrack(PyObject *self, PyObject *o)
{
    untrack_deep(o, 0);
    Py_INCREF(o);
    return o;
}

/* the entry of v, which is value[key]: here (unless mine is 0), or from fallback(v, key, pending, value) */
static PyObject *
item_entry(PyObject *v, int mode, int threads, PyObject *cache, int mine, PyObject *key, PyObject *fallback,
           PyObject *pending, PyObject *value)
{
    Py_INCREF(v); /* torch's getters may run Python code (a mode's handler) that drops the container's hold */
    PyObject *e = mine ? leaf_entry(v, mode, threads, cache) : NOT_MINE;
    if (e == NOT_MINE)
        e = PyObject_CallFunctionObjArgs(fallback, v, key, pending, value, NULL);
    Py_DECREF(v);
    return e;
}

/* entries(value, fallback, pending, mode[, threads[, cache]]) -> the encoded list, tuple or dict, or NotImplemented for
 * another value or a dict with a non-str key: encode.py's to encode. The items this does not encode go to fallback,
 * encode.py's, with their index or key, pending and value: the same call it would make for them. threads (torch's
 * intra-op thread count, default 0): tensors above entries_setup's max elements are encoded here too, looked up in
 * and added to cache (encode.StatCache) unless it is None (the default). entries(ctx, value, pending), ctx =
 * (fallback, mode, threads, cache), is the same call, threads there an int or a function (threads_now). */
static PyObject *
fastats_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *ctx[6];
    if (nargs == 3) { /* entries(ctx, value, pending), ctx = (fallback, mode, threads or a function giving them,
                       * cache): what an encoder gives every call, bound once (functools.partial) */
        PyObject *c = args[0];
        if (!PyTuple_CheckExact(c) || PyTuple_GET_SIZE(c) != 4) {
            PyErr_SetString(PyExc_TypeError, "entries(ctx, value, pending): ctx is (fallback, mode, threads, cache)");
            return NULL;
        }
        PyObject *th = PyTuple_GET_ITEM(c, 2);
        if (!PyLong_CheckExact(th)) {
            if (!PyCallable_Check(th)) {
                PyErr_SetString(PyExc_TypeError, "entries: ctx's threads is an int or a function");
                return NULL;
            }
            if (th != threads_fn)
                Py_XSETREF(threads_fn, NEW_REF(th));
            th = NULL;
        }
        ctx[0] = args[1], ctx[1] = PyTuple_GET_ITEM(c, 0), ctx[2] = args[2], ctx[3] = PyTuple_GET_ITEM(c, 1);
        ctx[4] = th, ctx[5] = PyTuple_GET_ITEM(c, 3);
        args = ctx;
        nargs = 6;
    }
    if (nargs < 4 || nargs > 6) {
        PyErr_SetString(PyExc_TypeError, "entries(value, fallback, pending, mode[, threads[, cache]])");
        return NULL;
    }
    PyObject *cache = nargs == 6 ? args[5] : Py_None;
    if (cache != Py_None && C_ready == NULL) {
        PyErr_SetString(PyExc_ValueError, "entries: a cache before cache_setup");
        return NULL;
    }
    PyObject *value = args[0], *fallback = args[1], *pending = args[2], *out, *e, *key;
    long mode = PyLong_AsLong(args[3]);
    if (mode < MODE_STATISTICS || (mode & ~MODE_COMPACT) > MODE_NORM) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "entries: mode is 0 (statistics), 1 (md5), 2 (xor) or 3 (norm), "
                                              "16 added for entries of C values");
        return NULL;
    }
    if ((mode & MODE_COMPACT) && !eapi_tried) {
        eapi_tried = 1;
        EAPI = entry_api_import(); /* none without _jenc: then the dicts */
    }
    long threads = nargs >= 5 ? (args[4] == NULL ? THREADS_ASK : PyLong_AsLong(args[4])) : 0;
    if (threads < 0 || (threads > TS_MAXTHREADS && threads != THREADS_ASK)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "entries: bad threads");
        return NULL;
    }
    if (E.tensor == NULL)
        Py_RETURN_NOTIMPLEMENTED;
    if (PyList_CheckExact(value) || PyTuple_CheckExact(value)) {
        if ((out = PyList_New(0)) == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(value); i++) { /* a list may change under fallback */
            if ((key = PyLong_FromSsize_t(i)) == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            e = item_entry(PySequence_Fast_GET_ITEM(value, i), (int)mode, (int)threads, cache, 1, key, fallback,
                           pending, value);
            Py_DECREF(key);
            if (e == NULL || PyList_Append(out, e) < 0) {
                Py_XDECREF(e);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(e);
        }
        untrack_if_flat(out);
        return out;
    }
    if (PyDict_CheckExact(value)) {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(value, &pos, &k, &v))
            if (!PyUnicode_CheckExact(k))
                Py_RETURN_NOTIMPLEMENTED;
        PyObject *items = PyDict_Items(value); /* a snapshot: fallback may run code that changes the dict */
        if (items == NULL || (out = PyDict_New()) == NULL) {
            Py_XDECREF(items);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
            PyObject *kv = PyList_GET_ITEM(items, i);
            k = PyTuple_GET_ITEM(kv, 0);
            /* a "device" key's int or str is a torch.device entry: encode.py's */
            e = item_entry(PyTuple_GET_ITEM(kv, 1), (int)mode, (int)threads, cache, PyUnicode_Compare(k, K_device) != 0,
                           k, fallback, pending, value);
            if (e == NULL || PyDict_SetItem(out, k, e) < 0) {
                Py_XDECREF(e);
                Py_DECREF(out);
                Py_DECREF(items);
                return NULL;
            }
            Py_DECREF(e);
        }
        Py_DECREF(items);
        untrack_if_flat(out);
        return out;
    }
    Py_RETURN_NOTIMPLEMENTED;
}

/* entries_setup(tensor type, parameter type, torch.float32, torch.strided, lanes, max elements), or () to switch
 * entries off */
static PyObject *
fastats_entries_setup(PyObject *self, PyObject *args)
{
    PyObject *tensor = NULL, *param = NULL, *f32 = NULL, *strided = NULL;
    int lanes = 0;
    Py_ssize_t max_numel = 0;
    if (!PyArg_ParseTuple(args, "|OOOOin", &tensor, &param, &f32, &strided, &lanes, &max_numel))
        return NULL;
    if (tensor != NULL && (!TS_LANES_OK(lanes) || max_numel < 1 || !PyType_Check(tensor)
                           || !PyType_Check(param))) {
        PyErr_SetString(PyExc_ValueError, "entries_setup: bad types, lanes or size");
        return NULL;
    }
    if (S_dtype == NULL && intern_names() < 0)
        return NULL;
    Py_XINCREF(tensor), Py_XINCREF(param), Py_XINCREF(f32), Py_XINCREF(strided);
    Py_XDECREF(E.tensor), Py_XDECREF(E.param), Py_XDECREF(E.f32), Py_XDECREF(E.strided);
    E.tensor = tensor, E.param = param, E.f32 = f32, E.strided = strided;
    E.lanes = lanes, E.max_numel = max_numel;
    if (tensor != NULL)
        find_descriptors();
    Py_RETURN_NONE;
}

/* set_meta(capsule or None): tensor_entry reads a tensor's metadata through the capsule's function (the C++ node
 * hooks' tensor_meta), or through torch's Python getters (None). True once installed. */
static PyObject *
fastats_set_meta(PyObject *self, PyObject *arg)
{
    if (arg == Py_None) {
        T_meta = NULL;
        Py_CLEAR(T_capsule);
        Py_RETURN_FALSE;
    }
    tmeta_fn fn = (tmeta_fn)PyCapsule_GetPointer(arg, TMETA_CAPSULE);
    if (fn == NULL)
        return NULL;
    Py_INCREF(arg);
    Py_XSETREF(T_capsule, arg);
    T_meta = fn;
    Py_RETURN_TRUE;
}

/* cache_setup(READY, storage_refs[, constants]): what encode.StatCache's entries hold, for entries' cache; constants:
 * encode._CONSTANTS, where constant_entry looks a broadcast tensor's figures up */
static PyObject *
fastats_cache_setup(PyObject *self, PyObject *args)
{
    PyObject *ready, *constants = NULL;
    int refs;
    if (!PyArg_ParseTuple(args, "Up|O!", &ready, &refs, &PyDict_Type, &constants))
        return NULL;
    Py_XINCREF(constants);
    Py_XSETREF(C_constants, constants);
    if (S_dtype == NULL && intern_names() < 0)
        return NULL;
    Py_INCREF(ready);
    Py_XDECREF(C_ready);
    C_ready = ready;
    C_storage_refs = refs;
    Py_RETURN_NONE;
}

/* use_omp(path): share large reads with the OpenMP team of the already loaded libgomp at path (torch's); None:
 * stop. True if its entry points were found. */
static PyObject *
fastats_use_omp(PyObject *self, PyObject *arg)
{
#ifdef HAVE_POOL
    if (arg == Py_None) {
        gomp_parallel = NULL;
        Py_RETURN_FALSE;
    }
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL)
        return NULL;
    void *h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD); /* loaded already, or nothing */
    if (h == NULL)
        Py_RETURN_FALSE;
    gomp_parallel_t par = (gomp_parallel_t)dlsym(h, "GOMP_parallel");
    omp_int_t num = (omp_int_t)dlsym(h, "omp_get_thread_num"), team = (omp_int_t)dlsym(h, "omp_get_num_threads");
    if (par == NULL || num == NULL || team == NULL)
        Py_RETURN_FALSE; /* the handle stays open: the library was loaded before and stays */
    static int handler;
    if (!handler && pthread_atfork(NULL, NULL, own_pid_in_child) != 0)
        Py_RETURN_FALSE;
    handler = 1;
    omp_thread_num = num, omp_num_threads = team, omp_pid = own_pid = getpid();
    gomp_parallel = par;
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"use_omp", fastats_use_omp, METH_O,
     "use_omp(path or None): f32_mean shares large reads with the OpenMP team of the loaded libgomp at path"},
    {"set_crc", fastats_set_crc, METH_O, "set_crc(address): the CRC-32 function to use (0: built-in)"},
    {"f32", (PyCFunction)(void (*)(void))fastats_f32, METH_FASTCALL,
     "f32(address, count) -> (max, min, sum of squares) of a contiguous float32 buffer"},
    {"f32_crc", (PyCFunction)(void (*)(void))fastats_f32_crc, METH_FASTCALL,
     "f32_crc(address, count) -> f32's three values and the buffer's CRC-32 (zlib.crc32)"},
    {"tmean", (PyCFunction)(void (*)(void))fastats_tmean, METH_FASTCALL,
     "tmean(address, count, lanes) -> torch.mean of a contiguous float32 buffer (its CPU kernel's order)"},
    {"f32_mean", (PyCFunction)(void (*)(void))fastats_f32_mean, METH_FASTCALL,
     "f32_mean(address, count, lanes, threads[, crc[, workers]]) -> f32's three values and torch.mean (its CPU "
     "kernel's order, split over threads as torch splits it), and with crc true the buffer's CRC-32; a large buffer "
     "is read by up to workers threads (default: threads), with the same results"},
    {"xor64", (PyCFunction)(void (*)(void))fastats_xor64, METH_FASTCALL,
     "xor64(address, nbytes) -> the XOR of the buffer's little-endian 64-bit words, zero-padded"},
    {"entries", (PyCFunction)(void (*)(void))fastats_entries, METH_FASTCALL,
     "entries(value, fallback, pending, mode[, threads[, cache]]) -> msprobe's entries of a list, tuple or dict in "
     "summary mode 0 (statistics), 1 (md5), 2 (xor) or 3 (the Norm alone), its small CPU float32 tensors (with "
     "threads, torch's thread count: its larger ones too, but for xor, through cache unless None; in mode 3 any size, "
     "uncached) and scalars encoded here, the rest by fallback; NotImplemented for another value. "
     "entries(ctx, value, pending) with ctx = (fallback, mode, threads, cache) is the same call, threads an int or "
     "a function giving torch's thread count, called only for a tensor whose figures depend on it"},
    {"cache_setup", fastats_cache_setup, METH_VARARGS,
     "cache_setup(READY, storage_refs[, constants]): the final kind and whether a storage's Python object lives as "
     "long as the storage, for the statistics cache entries looks up and fills; the figures of broadcast tensors by "
     "value and shape (encode._CONSTANTS)"},
    {"entries_setup", fastats_entries_setup, METH_VARARGS,
     "entries_setup(tensor, parameter, float32, strided, lanes, max elements): what entries encodes; () stops it"},
    {"set_meta", fastats_set_meta, METH_O,
     "set_meta(capsule or None): entries reads a tensor's metadata through the C++ node hooks' tensor_meta capsule, "
     "or through torch's Python getters (None); True once installed"},
    {"untrack", fastats_untrack, METH_O,
     "untrack(value) -> value: its dicts, lists and tuples, deepest first, no longer followed by the collector where "
     "nothing in them is followed (a writer event, a record body, an entry and its shape); another value as it is"},
    {"crc32", (PyCFunction)(void (*)(void))fastats_crc32, METH_FASTCALL,
     "crc32(address, nbytes) -> zlib.crc32 of the buffer"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastats", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__fastats(void)
{
    crc_init();
#ifdef HAVE_CLMUL_CODE
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    return PyModule_Create(&module);
}
