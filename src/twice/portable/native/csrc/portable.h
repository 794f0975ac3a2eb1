/* What portable mode's compiled kernels share (twice.portable.native; one family a file in this
   folder, each binding its own entry points): the buffer description every entry point takes,
   the work split across torch's threads, the instruction-set clones, and the few exact helpers
   (power-of-two units, rounding to an integer) that several families use.

   Each kernel computes exactly what its Python fallback computes with torch operations
   (twice.portable.arithmetic: elementwise, exact, philox), one IEEE operation for each torch
   one, in the same order: so the two give the same bits, and tests hold them together. The
   build has no contraction (setup.py: -ffp-contract=off), so a multiply and the add after it
   are two roundings here as there. Every entry point releases the GIL while it runs. */

#ifndef TWICE_PORTABLE_H
#define TWICE_PORTABLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- Binding: each family adds its entry points to twice._native (PyInit__native calls these;
   each returns 0, or -1 with an exception set). ---- */
int bind_portable_threads(PyObject *module);   /* threads.c: threads, memory */
int bind_portable_unary(PyObject *module);     /* unary.c: elementwise functions */
int bind_portable_exact(PyObject *module);     /* exact.c: exact sums and products */
int bind_portable_norms(PyObject *module);     /* norms.c: batch norm, layer norm */
int bind_portable_conv(PyObject *module);      /* conv.c: convolutions */
int bind_portable_recurrent(PyObject *module); /* recurrent.c: the LSTM cell and step */
int bind_portable_random(PyObject *module);    /* random.c: Philox */
int bind_portable_ordered(PyObject *module);   /* ordered.c: float64 products in k order */
int bind_portable_optim(PyObject *module);     /* optim.c: an optimizer's step in one pass */

/* A METH_VARARGS | METH_KEYWORDS function in a PyMethodDef. */
#define KEYWORDS(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

/* ---- The buffer description: the Python side passes each buffer as a tuple (address, elements,
   dtype code), twice.portable.native.buffer(tensor), or None where a buffer is optional. The
   caller keeps the tensor alive and laid out as the kernel reads it (contiguous, unless strides
   are passed beside it) for the call. buffer.c converts and checks it. ---- */
typedef struct {
    char *data;       /* NULL for None (or an empty tensor's address) */
    Py_ssize_t count; /* the elements the buffer holds */
    int kind;         /* 0 float32, 1 float64; -1 absent (None) */
} buffer_t;

#define KIND_F32 0
#define KIND_F64 1
#define ANY_KIND -1

/* PyArg "O&" converters: a buffer description, or (optional_buffer) also None. */
int buffer(PyObject *arg, void *out);
int optional_buffer(PyObject *arg, void *out);
/* Whether b (when present) holds at least `count` elements of `kind` (ANY_KIND: either); else
   a ValueError naming the kernel and the argument, and 0. */
int buffer_holds(const char *kernel, const char *name, const buffer_t *b, Py_ssize_t count,
                 int kind);
/* Whether a size is not negative; else a ValueError, and 0. */
int size_ok(const char *kernel, const char *name, Py_ssize_t value);

#define F64(b) ((double *)(b).data)
#define F64_OR_NULL(b) ((b).kind < 0 ? NULL : (double *)(b).data)

/* ---- Instruction sets. The loops are cloned per instruction set (AVX-512, AVX2, the baseline;
   the CPU picks at run time) for speed alone: every operation is IEEE and rounded on its own (no
   contraction), so each clone gives the same bits. TWICE_NO_CLONES builds one version, for the
   compiler's target: tests/e2e/test_portable_clones.py builds the baseline and AVX2 that way and
   holds their bits to the dispatched build's. ---- */
#ifdef TWICE_NO_CLONES
#define CLONED
#else
#define CLONED __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

/* Kernels over long runs of values go chunk by chunk through float64 arrays, with each stage of
   a function one plain loop the compiler vectorises: every element still gets exactly the
   scalar function's operations, in its order. The stages are inlined into each cloned caller, so
   that every clone vectorises them for its own instruction set (a function the compiler keeps
   apart is built for the baseline only). Sums of integers and maxima go into LANES independent
   accumulators: exact in any order, so the lanes change no bit. */
#define CHUNK 256
#define LANES 8
#define STAGE static inline __attribute__((always_inline))

/* ---- Threads (threads.c). Work is split only across independent outputs (rows, columns,
   channels, element ranges): each output is computed by one thread with the operations it would
   have on one, so the thread count changes no bit. ---- */
typedef void (*range_fn)(void *ctx, Py_ssize_t lo, Py_ssize_t hi);
/* fn over [0, n) in contiguous ranges, one per thread; `work` is the elements the whole call
   touches (it decides how many threads are worth waking). */
void parallel_for(Py_ssize_t n, Py_ssize_t work, range_fn fn, void *ctx);

/* ---- Exact helpers. ---- */
static inline double pow2(int64_t k) {
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double out;
    memcpy(&out, &bits, 8);
    return out;
}

/* nearbyint for |v| < 2**51 in round-to-nearest-even, without a libm call: adding and taking
   away 1.5 * 2**52 leaves v rounded to an integer; its sign is v's, so -0.4 gives -0, as
   torch.round does (the compiled and the torch routes must agree to the sign of zero). */
static inline double round_even(double v) {
    const double magic = 6755399441055744.0;
    return copysign((v + magic) - magic, v);
}

/* frexp from the bits (C's frexp is a library call): the same mantissa and exponent for every
   double, subnormals included; zeros, infinities and NaN come back as they are, exponent 0. */
static inline double bits_frexp(double x, int *e) {
    uint64_t b;
    memcpy(&b, &x, 8);
    int biased = (int)((b >> 52) & 0x7FF);
    if (biased == 0x7FF || (b << 1) == 0) {
        *e = 0;
        return x;
    }
    int shift = 0;
    if (biased == 0) { /* subnormal: scale by 2**54 first */
        x = x * 18014398509481984.0;
        memcpy(&b, &x, 8);
        biased = (int)((b >> 52) & 0x7FF);
        shift = 54;
    }
    *e = biased - 1022 - shift;
    b = (b & 0x800FFFFFFFFFFFFFULL) | (1022ULL << 52);
    memcpy(&x, &b, 8);
    return x;
}

/* The unit 2**(e - beta) of values whose largest magnitude is amax < 2**e (exact.split's). */
static inline double unit_of(double amax, int beta) {
    int e;
    bits_frexp(amax, &e);
    int64_t k = (int64_t)e - beta;
    if (k < -1022) k = -1022;
    return pow2(k);
}

/* SCALE (arithmetic/scaling.py): an exact product's integers' sum t times its operands' units ua
   and ub (powers of two in [2**-1022, 2**1023]), rounded once. Where ua * ub lies in [2**-900,
   2**900] that is one multiplication; outside it the exponents are added and applied in two
   steps, the first exact, the second rounding once (never 0 * inf, never a double rounding
   into the subnormal range): the same value, so the band's edge changes no bit. */
#define SCALE_SAFE_LO 0x1p-900
#define SCALE_SAFE_HI 0x1p+900
static double scale_wide(double t, double ua, double ub) {
    int et, ea, eb;
    const double m = bits_frexp(t, &et);      /* t = m * 2**et; zeros come back as they are */
    bits_frexp(ua, &ea), bits_frexp(ub, &eb); /* a unit 2**k gives 0.5 and k + 1 */
    int64_t total = (int64_t)et + ea - 1 + eb - 1;
    total = total < -1100 ? -1100 : total > 1100 ? 1100 : total;
    const int64_t first = total < -1021 ? -1021 : total > 1023 ? 1023 : total;
    return (m * pow2(first)) * pow2(total - first);
}
static inline double scale_by(double t, double ua, double ub) {
    const double s = ua * ub;
    return s >= SCALE_SAFE_LO && s <= SCALE_SAFE_HI ? t * s : scale_wide(t, ua, ub);
}
/* Whether every product of unit a with the units u[0..n) lies in the band (units are positive:
   their smallest and largest decide), so a loop may take t * (a * u[j]), scale_by's own first
   branch, without a test an element (and vectorise). lo, hi: u's smallest and largest. */
static inline void unit_bounds(const double *u, Py_ssize_t n, double *lo, double *hi) {
    double l = n ? u[0] : 1.0, h = l;
    for (Py_ssize_t j = 1; j < n; j++) l = u[j] < l ? u[j] : l, h = u[j] > h ? u[j] : h;
    *lo = l, *hi = h;
}
static inline int in_band(double a, double lo, double hi) {
    return a * lo >= SCALE_SAFE_LO && a * hi <= SCALE_SAFE_HI;
}

/* The bit patterns of magnitudes, the sign cleared: for IEEE numbers their integer order is
   their order of magnitude, infinities and NaN above every finite value (INF_* and up), so a
   largest magnitude is an integer maximum, exact in any order. */
#define INF_F32 0x7F800000u
#define INF_F64 0x7FF0000000000000ull
static inline uint32_t bits_float(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b & 0x7FFFFFFFu;
}
static inline uint64_t bits_double(double v) {
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b & 0x7FFFFFFFFFFFFFFFull;
}
static inline double magnitude_float(uint32_t b) {
    float v;
    memcpy(&v, &b, sizeof v);
    return (double)v;
}
static inline double magnitude_double(uint64_t b) {
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* One value of a float32 (kind 0) or float64 (kind 1) buffer, as a double, and back. */
static inline double load(const char *base, int kind, Py_ssize_t i) {
    return kind ? ((const double *)base)[i] : (double)((const float *)base)[i];
}
static inline void store(char *base, int kind, Py_ssize_t i, double v) {
    if (kind)
        ((double *)base)[i] = v;
    else
        ((float *)base)[i] = (float)v;
}

/* len values from `at` of a float32/float64 buffer into doubles, and back. */
STAGE void load_run(const char *base, int kind, Py_ssize_t at, Py_ssize_t len, double *v) {
    if (kind) {
        memcpy(v, (const double *)base + at, (size_t)len * sizeof(double));
    } else {
        const float *f = (const float *)base + at;
        for (Py_ssize_t j = 0; j < len; j++) v[j] = (double)f[j];
    }
}
STAGE void store_run(char *base, int kind, Py_ssize_t at, Py_ssize_t len, const double *v) {
    if (kind) {
        memcpy((double *)base + at, v, (size_t)len * sizeof(double));
    } else {
        float *f = (float *)base + at;
        for (Py_ssize_t j = 0; j < len; j++) f[j] = (float)v[j];
    }
}

/* The largest magnitude of n values from `at` of a float32/float64 buffer (0 for none), in four
   lanes (a maximum is exact in any order); *bad is set where one is infinite or NaN (an integer
   flag: no serial dependence). */
STAGE double row_max(const char *x, int kind, Py_ssize_t at, Py_ssize_t n, int *bad) {
    double m[4] = {0, 0, 0, 0};
    int b = 0;
    Py_ssize_t j = 0;
    for (; j + 4 <= n; j += 4)
        for (int l = 0; l < 4; l++) {
            double v = fabs(load(x, kind, at + j + l));
            b |= !(v <= DBL_MAX);
            m[l] = v > m[l] ? v : m[l];
        }
    for (; j < n; j++) {
        double v = fabs(load(x, kind, at + j));
        b |= !(v <= DBL_MAX);
        m[0] = v > m[0] ? v : m[0];
    }
    *bad |= b;
    double a = m[0] > m[1] ? m[0] : m[1], c = m[2] > m[3] ? m[2] : m[3];
    return a > c ? a : c;
}

/* ---- Shared between families: exact.c's split of one block (a row-major (rows x cols) block of
   row stride ld, each row (axis 0) or column (axis 1) as integers on its own unit; given: the
   rows' units read from u), which recurrent.c's step uses to cut its result; 0 where a value is
   not finite. scratch: 2 cols doubles (axis 1). ---- */
int split_block_float(const float *x, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t ld, int beta,
                      int axis, int given, double *out, double *u, void *scratch);
int split_block_double(const double *x, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t ld, int beta,
                       int axis, int given, double *out, double *u, void *scratch);

#endif
