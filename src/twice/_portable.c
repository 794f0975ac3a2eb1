/* Portable mode's compiled kernels (twice.portable.native), part of the optional twice._native.

   Each kernel computes exactly what its Python fallback computes with torch operations
   (twice.portable.arithmetic.elementwise, exact.split, philox), one IEEE operation for each torch one, in
   the same order: so the two give the same bits, and tests hold them together. The build has no
   contraction (setup.py: -ffp-contract=off), so a multiply and the add after it are two
   roundings here as there. The polynomial coefficients and constants are not spelled here:
   p_init receives them from elementwise.py, the one place they are written.

   p_unary     a function of one float32/float64 buffer into another, element by element
   p_binary    a function of (gradient, input) for the backward of GELU and SiLU
   p_split     per row or column: the largest magnitude's power-of-two unit, and the values as
               integers on it
   p_rowsum    per row: the exact sum, from up to three integer slices, in float64
   p_scale     an integer product scaled by its units (plus a bias), rounded once
   p_compound  addcmul, addcdiv, add with alpha, lerp: one rounding per operation
   p_lstm_cell, p_lstm_cell_backward  one LSTM time step (recurrent.py's cell)
   p_lstm_step, p_lstm_step_backward  the same from the step's integer product, scaled, and
               the next product's operand cut
   p_unfold    a convolution's input windows as integers on their rows' given grid (p_split's)
   p_conv_forward  a convolution's forward, columns unfolded and multiplied in cache
   p_conv_weight_grad  a convolution's weight gradient, exact integer sums in cache
   p_fold_scale  integer columns folded back onto the input, scaled and rounded once
   p_uniform   Philox-4x32-10 uniforms in [0, 1) (float64), element i from counter i / 2
   p_normal    Box-Muller normals (float64) from those uniforms
   p_keep_memory  glibc's malloc keeps freed memory for reuse (no kernel's bits depend on it)
   All take buffer addresses and sizes (the caller keeps the tensors alive and contiguous) and
   release the GIL while they run. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#define MAXC 40

/* The loops are cloned per instruction set (AVX-512, AVX2, the baseline; the CPU picks at run
   time) for speed alone: every operation is IEEE and rounded on its own (no contraction), so
   each clone gives the same bits. TWICE_NO_CLONES builds one version, for the compiler's
   target: tests/e2e/test_portable_clones.py builds the baseline and AVX2 that way and holds their
   bits to the dispatched build's. */
#ifdef TWICE_NO_CLONES
#define CLONED
#else
#define CLONED __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

/* Work split across threads, only ever across independent outputs (rows, columns, channels,
   element ranges): each output is computed by one thread with the operations it would have on
   one, so the thread count changes no bit. The threads are torch's own OpenMP workers: a
   second pool beside them would wait for cores their spinning holds. The OpenMP runtime torch
   loaded (libgomp, or Intel's, which exports the same entry points) is found at run time with
   RTLD_NOLOAD, so the extension links no OpenMP of its own; where none is loaded the kernels
   run on the calling thread. p_threads sets how many (the Python side passes torch's count); a
   call with less than GRAIN elements per thread uses fewer. */
#include <dlfcn.h>
#define MAX_THREADS 256
#define GRAIN 32768
static int n_threads = 1;
static void (*gomp_parallel)(void (*)(void *), void *, unsigned, unsigned) = NULL;
static int (*omp_thread_num)(void) = NULL;
static int (*omp_team_size)(void) = NULL;

typedef void (*range_fn)(void *ctx, Py_ssize_t lo, Py_ssize_t hi);
typedef struct {
    range_fn fn;
    void *ctx;
    Py_ssize_t n;
} team_job;

static void team_body(void *p) {
    const team_job *job = (const team_job *)p;
    const Py_ssize_t team = omp_team_size(), t = omp_thread_num();
    const Py_ssize_t size = (job->n + team - 1) / team, lo = t * size;
    const Py_ssize_t hi = lo + size < job->n ? lo + size : job->n;
    if (lo < hi) job->fn(job->ctx, lo, hi);
}

/* fn over [0, n) in contiguous ranges, one per thread; `work` is the elements the whole call
   touches (it decides how many threads are worth waking). */
static void parallel_for(Py_ssize_t n, Py_ssize_t work, range_fn fn, void *ctx) {
    Py_ssize_t threads = n_threads;
    if (threads > work / GRAIN) threads = work / GRAIN;
    if (threads > n) threads = n;
    if (threads <= 1 || !gomp_parallel) {
        fn(ctx, 0, n);
        return;
    }
    team_job job = {fn, ctx, n};
    gomp_parallel(team_body, &job, (unsigned)threads, 0);
}

/* p_threads(n): the threads the kernels may use from now on; returns whether an OpenMP
   runtime was found to run them. */
static char *p_threads_kw[] = {"threads", NULL};
PyObject *p_threads(PyObject *module, PyObject *args, PyObject *kwargs) {
    int n;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i", p_threads_kw, &n)) return NULL;
    if (!gomp_parallel) {
        const char *names[] = {"libgomp.so.1", "libiomp5.so", "libomp.so", NULL};
        for (int i = 0; names[i] && !gomp_parallel; i++) {
            void *h = dlopen(names[i], RTLD_NOLOAD | RTLD_LAZY);
            if (!h) continue;
            void *par = dlsym(h, "GOMP_parallel"), *num = dlsym(h, "omp_get_thread_num"),
                 *team = dlsym(h, "omp_get_num_threads");
            if (par && num && team) {
                omp_thread_num = (int (*)(void))num;
                omp_team_size = (int (*)(void))team;
                gomp_parallel = (void (*)(void (*)(void *), void *, unsigned, unsigned))par;
            }
        }
    }
    n_threads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
    return PyBool_FromLong(gomp_parallel != NULL);
}

typedef struct {
    double c[MAXC];
    int n;
} poly_t;

static poly_t EXP, ATANH, ERF, ERFCX, SIN, COS, EXPM1;
static double LN2_HI, LN2_LO, INV_LN2, SQRT_HALF, TWO_OVER_SQRT_PI, HALF_PI, EXPM1_SMALL;
static double GELU_K, GELU_C, GELU_3C, INV_SQRT_2PI;
static int ready = 0;

static inline double horner(const poly_t *p, double t) {
    double acc = p->c[p->n - 1];
    for (int i = p->n - 2; i >= 0; i--) {
        acc = acc * t;
        acc = acc + p->c[i];
    }
    return acc;
}

static inline double pow2(int64_t k) {
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double out;
    memcpy(&out, &bits, 8);
    return out;
}

/* nearbyint for |v| < 2**51 in round-to-nearest-even, without a libm call: adding and taking
   away 1.5 * 2**52 leaves v rounded to an integer (the same as torch.round). */
static inline double round_even(double v) {
    const double magic = 6755399441055744.0;
    return (v + magic) - magic;
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
    if (biased == 0) {  /* subnormal: scale by 2**54 first */
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

static inline int64_t floor_half(int64_t k) { return k >= 0 ? k / 2 : -((-k + 1) / 2); }

static inline double f_exp(double x) {
    if (x < -746.0) x = -746.0;
    else if (x > 710.0) x = 710.0;
    double k = round_even(x * INV_LN2);  /* |x * INV_LN2| < 1077 */
    if (isnan(k)) k = 0.0;
    double r = (x - k * LN2_HI) - k * LN2_LO;
    double p = horner(&EXP, r);
    int64_t ki = (int64_t)k, half = floor_half(ki);
    return (p * pow2(half)) * pow2(ki - half);
}

static inline double f_log(double x) {
    int e;
    double m = bits_frexp(x, &e);
    int low = m < SQRT_HALF;
    if (low) m = m * 2.0;
    double ed = (double)(e - low);
    double f = m - 1.0;
    double s = f / (f + 2.0);
    double z = s * s;
    double log_m = (s * 2.0) * horner(&ATANH, z);
    double out = ed * LN2_HI + (log_m + ed * LN2_LO);
    if (x == 0) out = -INFINITY;
    if (x == INFINITY) out = INFINITY;
    if (x < 0 || isnan(x)) out = NAN;
    return out;
}

static inline double f_log1p(double x) {
    double u = x + 1.0;
    double d = u - 1.0;
    int exact = d == 0;
    double ratio = x / (exact ? 1.0 : d);
    double out = exact ? x : f_log(u) * ratio;
    return u == INFINITY ? INFINITY : out;
}

static inline double f_sqrt(double x) { return (x < 0 || isnan(x)) ? NAN : sqrt(x); }  /* IEEE: correctly rounded */

static inline double f_softplus(double x, double beta, double threshold) {
    double bx = x * beta;
    return bx > threshold ? x : f_log1p(f_exp(bx)) / beta;
}

static int read_poly(PyObject *seq, poly_t *out) {
    PyObject *fast = PySequence_Fast(seq, "a sequence of floats");
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n < 1 || n > MAXC) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "polynomial size");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) out->c[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
    out->n = (int)n;
    Py_DECREF(fast);
    return PyErr_Occurred() ? -1 : 0;
}

PyObject *p_init(PyObject *module, PyObject *args) {
    PyObject *polys[7];
    if (!PyArg_ParseTuple(args, "(OOOOOOO)(ddddddddddd)", &polys[0], &polys[1], &polys[2], &polys[3],
                          &polys[4], &polys[5], &polys[6], &LN2_HI, &LN2_LO, &INV_LN2, &SQRT_HALF,
                          &TWO_OVER_SQRT_PI, &HALF_PI, &EXPM1_SMALL, &GELU_K, &GELU_C, &GELU_3C,
                          &INV_SQRT_2PI))
        return NULL;
    poly_t *targets[7] = {&EXP, &ATANH, &ERF, &ERFCX, &SIN, &COS, &EXPM1};
    for (int i = 0; i < 7; i++)
        if (read_poly(polys[i], targets[i]) < 0) return NULL;
    ready = 1;
    Py_RETURN_NONE;
}

static inline double load(const char *base, int kind, Py_ssize_t i) {
    return kind ? ((const double *)base)[i] : (double)((const float *)base)[i];
}

static inline void store(char *base, int kind, Py_ssize_t i, double v) {
    if (kind) ((double *)base)[i] = v;
    else ((float *)base)[i] = (float)v;
}

/* Kernels over long runs of values go chunk by chunk through float64 arrays (see CHUNK), with
   each stage of a function one plain loop the compiler vectorises: every element still gets
   exactly the scalar function's operations, in its order. */
#define CHUNK 256
/* The stages are inlined into each cloned caller, so that every clone vectorises them for its
   own instruction set (a function the compiler keeps apart is built for the baseline only). */
#define STAGE static inline __attribute__((always_inline))
#define LANES 8

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

/* 2**e for an integer-valued double e in [-1022, 1023], from bits without a conversion to an
   integer type (which only AVX-512 vectorises): the same value pow2 gives. */
STAGE double pow2_of(double e) {
    double t = (e + 1023.0) + 4503599627370496.0; /* 2**52: e + 1023 lands in the low bits */
    uint64_t b;
    memcpy(&b, &t, 8);
    b = (b - 0x4330000000000000ull) << 52;
    double out;
    memcpy(&out, &b, 8);
    return out;
}

/* p(t) by Horner's rule for a chunk, each step one loop across it (horner()'s operations). */
STAGE void horner_run(const poly_t *restrict p, const double *restrict t, double *restrict out,
                      Py_ssize_t len) {
    const double top = p->c[p->n - 1];
    for (Py_ssize_t j = 0; j < len; j++) out[j] = top;
    for (int i = p->n - 2; i >= 0; i--) {
        const double ci = p->c[i];
        for (Py_ssize_t j = 0; j < len; j++) {
            double a = out[j] * t[j];
            out[j] = a + ci;
        }
    }
}

/* f_exp over len <= CHUNK values (y may be x), stage by stage. floor(k / 2) is
   round(k / 2 - 1/4), exact for the integers k here. */
STAGE void exp_chunk(const double *x, double *y, Py_ssize_t len) {
    double k[CHUNK], r[CHUNK], p[CHUNK];
    for (Py_ssize_t j = 0; j < len; j++) {
        double v = x[j];
        v = v < -746.0 ? -746.0 : v;
        v = v > 710.0 ? 710.0 : v;
        double kk = round_even(v * INV_LN2);
        kk = kk != kk ? 0.0 : kk;
        k[j] = kk;
        double hi = kk * LN2_HI, lo = kk * LN2_LO;
        r[j] = (v - hi) - lo;
    }
    horner_run(&EXP, r, p, len);
    for (Py_ssize_t j = 0; j < len; j++) {
        double half = round_even(k[j] * 0.5 - 0.25);
        double a = p[j] * pow2_of(half);
        y[j] = a * pow2_of(k[j] - half);
    }
}

/* An integer 0 <= i < 2**52 as a double, from bits (no int64 conversion instruction needed). */
STAGE double small_int(uint64_t i) {
    uint64_t b = i | 0x4330000000000000ull;
    double d;
    memcpy(&d, &b, 8);
    return d - 4503599627370496.0;
}

/* The other functions in stages, each the scalar f_* function's operations in its order (the
   input x and the output y are distinct buffers). Where the scalar function branches, both
   sides are computed for the whole chunk and each element takes its own: the same value. */
STAGE void log_chunk(const double *x, double *y, Py_ssize_t len) {
    double sv[CHUNK], ed[CHUNK], z[CHUNK];
    for (Py_ssize_t j = 0; j < len; j++) { /* bits_frexp, then f_log's first steps */
        const double xv = x[j];
        uint64_t b;
        memcpy(&b, &xv, 8);
        const uint64_t biased = (b >> 52) & 0x7FF;
        const int special = biased == 0x7FF || (b << 1) == 0, sub = biased == 0;
        const double xs = sub ? xv * 18014398509481984.0 : xv;
        uint64_t bs;
        memcpy(&bs, &xs, 8);
        double e = small_int((bs >> 52) & 0x7FF) - 1022.0 - (sub ? 54.0 : 0.0);
        const uint64_t mb = (bs & 0x800FFFFFFFFFFFFFull) | (1022ull << 52);
        double m;
        memcpy(&m, &mb, 8);
        m = special ? xv : m;
        e = special ? 0.0 : e;
        const int low = m < SQRT_HALF;
        m = low ? m * 2.0 : m;
        ed[j] = e - (low ? 1.0 : 0.0);
        const double f = m - 1.0, den = f + 2.0;
        sv[j] = f / den;
        z[j] = sv[j] * sv[j];
    }
    horner_run(&ATANH, z, y, len);
    for (Py_ssize_t j = 0; j < len; j++) {
        const double xv = x[j], log_m = (sv[j] * 2.0) * y[j];
        const double hi = ed[j] * LN2_HI, lo = ed[j] * LN2_LO;
        double out = hi + (log_m + lo);
        out = xv == 0 ? -INFINITY : out;
        out = xv == INFINITY ? INFINITY : out;
        y[j] = (xv < 0 || xv != xv) ? NAN : out;
    }
}

STAGE void log1p_chunk(const double *x, double *y, Py_ssize_t len) {
    double u[CHUNK];
    for (Py_ssize_t j = 0; j < len; j++) u[j] = x[j] + 1.0;
    log_chunk(u, y, len);
    for (Py_ssize_t j = 0; j < len; j++) {
        const double d = u[j] - 1.0;
        const int exact = d == 0;
        const double ratio = x[j] / (exact ? 1.0 : d);
        const double out = exact ? x[j] : y[j] * ratio;
        y[j] = u[j] == INFINITY ? INFINITY : out;
    }
}

STAGE void expm1_chunk(const double *x, double *y, Py_ssize_t len) {
    double p[CHUNK];
    exp_chunk(x, y, len);
    horner_run(&EXPM1, x, p, len);
    for (Py_ssize_t j = 0; j < len; j++)
        y[j] = fabs(x[j]) < EXPM1_SMALL ? x[j] * p[j] : y[j] - 1.0;
}

STAGE void tanh_chunk(const double *x, double *y, Py_ssize_t len) {
    double a[CHUNK];
    for (Py_ssize_t j = 0; j < len; j++) a[j] = fabs(x[j]) * -2.0;
    expm1_chunk(a, y, len);
    for (Py_ssize_t j = 0; j < len; j++) {
        const double t = y[j], magnitude = -t / (t + 2.0);
        y[j] = x[j] < 0 ? -magnitude : magnitude;
    }
}

STAGE void erf_chunk(const double *x, double *y, Py_ssize_t len) {
    double a[CHUNK], z[CHUNK], t[CHUNK], p[CHUNK], ex[CHUNK];
    for (Py_ssize_t j = 0; j < len; j++) {
        a[j] = fabs(x[j]);
        z[j] = a[j] * a[j];
        t[j] = (a[j] - 3.5) / 2.5;
        ex[j] = -z[j];
    }
    horner_run(&ERF, z, p, len);
    horner_run(&ERFCX, t, y, len);
    exp_chunk(ex, ex, len);
    for (Py_ssize_t j = 0; j < len; j++) {
        const double near = (a[j] * TWO_OVER_SQRT_PI) * p[j], erfc = ex[j] * y[j];
        double magnitude = a[j] < 1.0 ? near : (a[j] < 6.0 ? 1.0 - erfc : 1.0);
        magnitude = x[j] != x[j] ? x[j] : magnitude;
        y[j] = x[j] < 0 ? -magnitude : magnitude;
    }
}

/* 1 / (exp(-x) + 1) */
STAGE void sigmoid_chunk(const double *x, double *y, Py_ssize_t len) {
    for (Py_ssize_t j = 0; j < len; j++) y[j] = -x[j];
    exp_chunk(y, y, len);
    for (Py_ssize_t j = 0; j < len; j++) y[j] = 1.0 / (y[j] + 1.0);
}

/* The kernels by code: p_unary's and p_binary's `function` is the index of its name here. These
   lists are the C spelling of portable/arithmetic/coefficients.py's UNARY_KERNELS and BINARY_KERNELS, the
   one table of the kernels: twice.portable.native uses this module only where p_kernels() returns
   exactly that table, and a test holds the two equal. */
static const char *const UNARY_NAMES[] = {"exp", "log", "log1p", "expm1", "tanh", "sigmoid",
                                          "erf", "silu", "gelu", "gelu_tanh", "sqrt"};
static const char *const BINARY_NAMES[] = {"gelu_backward", "gelu_tanh_backward",
                                           "silu_backward", "softplus"};

static PyObject *names_tuple(const char *const *names, Py_ssize_t count) {
    PyObject *out = PyTuple_New(count);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyUnicode_FromString(names[i]);
        if (!name) { Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, i, name);
    }
    return out;
}

/* p_kernels(): (the unary kernels' names, the binary kernels' names), each in code order. */
PyObject *p_kernels(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    PyObject *unary = names_tuple(UNARY_NAMES, sizeof UNARY_NAMES / sizeof *UNARY_NAMES);
    PyObject *binary =
        unary ? names_tuple(BINARY_NAMES, sizeof BINARY_NAMES / sizeof *BINARY_NAMES) : NULL;
    if (!binary) { Py_XDECREF(unary); return NULL; }
    return Py_BuildValue("(NN)", unary, binary);
}

/* unary_loops' functions 0 to 9 (not sqrt) on a chunk. */
STAGE void unary_chunk(int fn, const double *x, double *y, Py_ssize_t len) {
    double u[CHUNK];
    switch (fn) {
    case 0: exp_chunk(x, y, len); break;
    case 1: log_chunk(x, y, len); break;
    case 2: log1p_chunk(x, y, len); break;
    case 3: expm1_chunk(x, y, len); break;
    case 4: tanh_chunk(x, y, len); break;
    case 5: sigmoid_chunk(x, y, len); break;
    case 6: erf_chunk(x, y, len); break;
    case 7: /* silu: x / (exp(-x) + 1) */
        for (Py_ssize_t j = 0; j < len; j++) u[j] = -x[j];
        exp_chunk(u, y, len);
        for (Py_ssize_t j = 0; j < len; j++) y[j] = x[j] / (y[j] + 1.0);
        break;
    case 8: /* gelu: (x / 2) (erf(x / sqrt 2) + 1) */
        for (Py_ssize_t j = 0; j < len; j++) u[j] = x[j] * SQRT_HALF;
        erf_chunk(u, y, len);
        for (Py_ssize_t j = 0; j < len; j++) y[j] = (x[j] * 0.5) * (y[j] + 1.0);
        break;
    default: /* gelu, tanh form */
        for (Py_ssize_t j = 0; j < len; j++) {
            const double cube = (x[j] * x[j]) * x[j];
            u[j] = (x[j] + cube * GELU_C) * GELU_K;
        }
        tanh_chunk(u, y, len);
        for (Py_ssize_t j = 0; j < len; j++) y[j] = (x[j] * 0.5) * (y[j] + 1.0);
    }
}

/* unary_loops' functions 0 to 9 over a buffer, chunk by chunk (cloned per instruction set). */
CLONED
static void unary_chunked(int fn, const char *s, int sk, char *d, int dk, Py_ssize_t n) {
    double v[CHUNK], w[CHUNK];
    for (Py_ssize_t j0 = 0; j0 < n; j0 += CHUNK) {
        const Py_ssize_t len = n - j0 < CHUNK ? n - j0 : CHUNK;
        load_run(s, sk, j0, len, v);
        unary_chunk(fn, v, w, len);
        store_run(d, dk, j0, len, w);
    }
}

/* p_binary's backward functions (0 GELU, 1 GELU tanh form, 2 SiLU) over buffers, by chunks. */
CLONED
static void binary_chunked(int fn, const char *gp, int gk, const char *xp, int xk, char *d, int dk,
                           Py_ssize_t n) {
    double g[CHUNK], x[CHUNK], u[CHUNK], v[CHUNK], w[CHUNK];
    for (Py_ssize_t j0 = 0; j0 < n; j0 += CHUNK) {
        const Py_ssize_t len = n - j0 < CHUNK ? n - j0 : CHUNK;
        load_run(gp, gk, j0, len, g);
        load_run(xp, xk, j0, len, x);
        if (fn == 0) { /* g (cdf + x pdf) */
            for (Py_ssize_t j = 0; j < len; j++) {
                u[j] = x[j] * SQRT_HALF;
                v[j] = (x[j] * x[j]) * -0.5;
            }
            erf_chunk(u, w, len);
            exp_chunk(v, v, len);
            for (Py_ssize_t j = 0; j < len; j++) {
                const double cdf = (w[j] + 1.0) * 0.5, pdf = v[j] * INV_SQRT_2PI;
                w[j] = g[j] * (cdf + x[j] * pdf);
            }
        } else if (fn == 1) { /* f_gelu_tanh_backward */
            for (Py_ssize_t j = 0; j < len; j++) {
                const double x2 = x[j] * x[j];
                u[j] = (x[j] + (x2 * x[j]) * GELU_C) * GELU_K;
            }
            tanh_chunk(u, v, len);
            for (Py_ssize_t j = 0; j < len; j++) {
                const double x2 = x[j] * x[j], t = v[j];
                const double left = (t + 1.0) * 0.5, d_inner = ((x2 * GELU_3C) + 1.0) * GELU_K;
                const double right = ((x[j] * 0.5) * (1.0 - t * t)) * d_inner;
                w[j] = g[j] * (left + right);
            }
        } else { /* g (s ((x (1 - s)) + 1)), s the sigmoid */
            sigmoid_chunk(x, v, len);
            for (Py_ssize_t j = 0; j < len; j++) {
                const double sg = v[j];
                w[j] = g[j] * (sg * ((x[j] * (1.0 - sg)) + 1.0));
            }
        }
        store_run(d, dk, j0, len, w);
    }
}

static int check_ready(void) {
    if (!ready) PyErr_SetString(PyExc_RuntimeError, "twice._native: p_init was not called");
    return ready;
}

#define UNARY_LOOP(F, S, D)                                          \
    {                                                                \
        const S *x = (const S *)s;                                   \
        D *y = (D *)d;                                               \
        for (Py_ssize_t i = 0; i < n; i++) y[i] = (D)F((double)x[i]); \
    }
#define UNARY_KINDS(F)                                         \
    if (sk && dk) UNARY_LOOP(F, double, double)                \
    else if (sk) UNARY_LOOP(F, double, float)                  \
    else if (dk) UNARY_LOOP(F, float, double)                  \
    else UNARY_LOOP(F, float, float)

/* A float32 square root straight from float32: the IEEE instruction is correctly rounded, as
   is (float)sqrt((double)x), so the two agree; this one vectorises. */
static void sqrt_f32(const float *x, float *y, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) y[i] = (x[i] < 0 || x[i] != x[i]) ? (float)NAN : sqrtf(x[i]);
}

CLONED
static void unary_loops(int fn, const char *s, int sk, char *d, int dk, Py_ssize_t n) {
    if (fn < 10) unary_chunked(fn, s, sk, d, dk, n);
    else if (!sk && !dk) sqrt_f32((const float *)s, (float *)d, n);
    else UNARY_KINDS(f_sqrt)
}

typedef struct {
    int fn;
    const char *s;
    int sk;
    char *d;
    int dk;
} unary_ctx;

static void unary_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const unary_ctx *c = (const unary_ctx *)p;
    unary_loops(c->fn, c->s + lo * (c->sk ? 8 : 4), c->sk, c->d + lo * (c->dk ? 8 : 4), c->dk, hi - lo);
}

/* p_unary(function, src, src_kind, dst, dst_kind, n, a, b): kinds 0 float32, 1 float64. */
static char *p_unary_kw[] = {"kernel", "src", "src_kind", "dst", "dst_kind", "n", "a", "b", NULL};
PyObject *p_unary(PyObject *module, PyObject *args, PyObject *kwargs) {
    int fn, sk, dk;
    unsigned long long src, dst;
    Py_ssize_t n;
    double a = 0, b = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iKiKin|dd", p_unary_kw, &fn, &src, &sk, &dst, &dk, &n, &a, &b)) return NULL;
    if (!check_ready()) return NULL;
    const char *s = (const char *)(uintptr_t)src;
    char *d = (char *)(uintptr_t)dst;
    if (fn < 0 || fn > 10) {
        PyErr_SetString(PyExc_ValueError, "unknown function");
        return NULL;
    }
    unary_ctx ctx = {fn, s, sk, d, dk};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(n, n * 4, unary_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

typedef struct {
    int fn;
    const char *g;
    int gk;
    const char *x;
    int xk;
    char *d;
    int dk;
    double a, b;
} binary_ctx;

static void binary_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const binary_ctx *c = (const binary_ctx *)p;
    const size_t gs = c->gk ? 8 : 4, xs = c->xk ? 8 : 4, ds = c->dk ? 8 : 4;
    if (c->fn == 3) { /* softplus, x only */
        for (Py_ssize_t i = lo; i < hi; i++) store(c->d, c->dk, i, f_softplus(load(c->x, c->xk, i), c->a, c->b));
        return;
    }
    binary_chunked(c->fn, c->g + lo * gs, c->gk, c->x + lo * xs, c->xk, c->d + lo * ds, c->dk, hi - lo);
}

/* p_binary(function, grad, grad_kind, x, x_kind, dst, dst_kind, n): 0 GELU, 1 GELU (tanh), 2 SiLU
   backward; 3 softplus (x only; a, b = beta, threshold). */
static char *p_binary_kw[] = {"kernel", "grad", "grad_kind", "x", "x_kind", "dst", "dst_kind", "n", "a", "b", NULL};
PyObject *p_binary(PyObject *module, PyObject *args, PyObject *kwargs) {
    int fn, gk, xk, dk;
    unsigned long long gp, xp, dp;
    Py_ssize_t n;
    double a = 0, b = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iKiKiKin|dd", p_binary_kw, &fn, &gp, &gk, &xp, &xk, &dp, &dk, &n, &a, &b))
        return NULL;
    if (!check_ready()) return NULL;
    const char *g = (const char *)(uintptr_t)gp, *x = (const char *)(uintptr_t)xp;
    char *d = (char *)(uintptr_t)dp;
    binary_ctx ctx = {fn, g, gk, x, xk, d, dk, a, b};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(n, n * 8, binary_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static inline double unit_of(double amax, int beta) {
    int e;
    bits_frexp(amax, &e);
    int64_t k = (int64_t)e - beta;
    if (k < -1022) k = -1022;
    return pow2(k);
}

/* The largest magnitude of n values (0 for none), in four lanes (a maximum is exact in any
   order); *bad is set where one is infinite or NaN (an integer flag: no serial dependence). */
#define ROW_MAX(T)                                                                    \
    static double row_max_##T(const T *x, Py_ssize_t n, int *bad) {                   \
        double m[4] = {0, 0, 0, 0};                                                   \
        int b = 0;                                                                    \
        Py_ssize_t j = 0;                                                             \
        for (; j + 4 <= n; j += 4)                                                    \
            for (int l = 0; l < 4; l++) {                                             \
                double v = fabs((double)x[j + l]);                                    \
                b |= !(v <= DBL_MAX);                                                 \
                m[l] = v > m[l] ? v : m[l];                                           \
            }                                                                         \
        for (; j < n; j++) {                                                          \
            double v = fabs((double)x[j]);                                            \
            b |= !(v <= DBL_MAX);                                                     \
            m[0] = v > m[0] ? v : m[0];                                               \
        }                                                                             \
        *bad |= b;                                                                    \
        double a = m[0] > m[1] ? m[0] : m[1], c = m[2] > m[3] ? m[2] : m[3];          \
        return a > c ? a : c;                                                         \
    }
ROW_MAX(float)
ROW_MAX(double)
#define ROW_MAX_OF(x, n, bad) _Generic((x), const float *: row_max_float, const double *: row_max_double)(x, n, bad)

#define FOR_KIND(kind, base, T, ...)                  \
    if (kind) {                                       \
        const double *T = (const double *)(base);     \
        __VA_ARGS__                                   \
    } else {                                          \
        const float *T = (const float *)(base);       \
        __VA_ARGS__                                   \
    }

/* p_split(src, kind, outer, rows, cols, beta, axis, ints, units): in each of `outer` row-major
   (rows x cols) blocks, every row (axis 0) or every column (axis 1) gets the unit
   2**(e - beta), 2**e bounding its largest magnitude, and its values become the integers
   round(x / unit) (x times the unit's inverse: the same, as the unit is a power of two), in
   ints (float64, the same layout); units holds outer x rows (axis 0) or outer x cols (axis 1)
   units. Returns False where a value is not finite (ints then unreliable). */
/* One (rows x cols) block of p_split, by element type. The largest magnitude is taken on the
   bit patterns with the sign cleared (for IEEE numbers their integer order is their order of
   magnitude, infinities and NaN above every finite value), so the loops are integer maxima and
   a scaling by a power of two: exact in any order, so the bits do not depend on the vector
   lanes; cloned per instruction set for speed alone. Returns 0 where a value is not finite. */
#define SPLIT_BLOCK(T, U, ABS, INF)                                                            \
    static inline U bits_##T(T v) {                                                            \
        U b;                                                                                   \
        memcpy(&b, &v, sizeof b);                                                              \
        return b & ABS;                                                                        \
    }                                                                                          \
    static inline double magnitude_##T(U b) {                                                  \
        T v;                                                                                   \
        memcpy(&v, &b, sizeof v);                                                              \
        return (double)v;                                                                      \
    }                                                                                          \
    /* The columns' units (u) from their largest magnitudes over `rows` rows of stride ld; top  \
       is scratch for `cols` bit patterns. Returns the largest pattern seen (INF or above: a     \
       value not finite). */                                                                   \
    STAGE U column_units_##T(const T *x, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t ld,       \
                             int beta, U *top, double *u) {                                    \
        U worst = 0;                                                                           \
        for (Py_ssize_t j = 0; j < cols; j++) top[j] = 0;                                      \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                \
            const T *xr = x + r * ld;                                                          \
            _Pragma("GCC ivdep") for (Py_ssize_t j = 0; j < cols; j++) {                       \
                U b = bits_##T(xr[j]);                                                         \
                top[j] = b > top[j] ? b : top[j];                                              \
            }                                                                                  \
        }                                                                                      \
        for (Py_ssize_t j = 0; j < cols; j++) {                                                \
            worst = top[j] > worst ? top[j] : worst;                                           \
            u[j] = unit_of(top[j] >= INF ? 0.0 : magnitude_##T(top[j]), beta);                 \
        }                                                                                      \
        return worst;                                                                          \
    }                                                                                          \
    CLONED                                                                                     \
    static int split_block_##T(const T *x, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t ld,     \
                               int beta, int axis, int given, double *out, double *u,          \
                               void *scratch) {                                                \
        U worst = 0, *top = (U *)scratch;                                                      \
        double *inv = (double *)scratch + cols;                                                \
        if (axis == 0) {                                                                       \
            for (Py_ssize_t r = 0; r < rows; r++) {                                            \
                const T *xr = x + r * ld;                                                    \
                double *orow = out + r * ld;                                                 \
                if (!given) {                                                                  \
                    U m = 0;                                                                   \
                    for (Py_ssize_t j = 0; j < cols; j++) {                                    \
                        U b = bits_##T(xr[j]);                                                 \
                        m = b > m ? b : m;                                                     \
                    }                                                                          \
                    worst = m > worst ? m : worst;                                             \
                    u[r] = unit_of(m >= INF ? 0.0 : magnitude_##T(m), beta);                   \
                }                                                                              \
                const double s = 1.0 / u[r];                                                   \
                _Pragma("GCC ivdep") for (Py_ssize_t j = 0; j < cols; j++)                     \
                    orow[j] = round_even((double)xr[j] * s);                                   \
            }                                                                                  \
            return worst < INF;                                                                \
        }                                                                                      \
        worst = column_units_##T(x, rows, cols, ld, beta, top, u);                             \
        for (Py_ssize_t j = 0; j < cols; j++) inv[j] = 1.0 / u[j];                             \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                \
            const T *xr = x + r * ld;                                                        \
            double *orow = out + r * ld;                                                     \
            _Pragma("GCC ivdep") for (Py_ssize_t j = 0; j < cols; j++)                         \
                orow[j] = round_even((double)xr[j] * inv[j]);                                  \
        }                                                                                      \
        return worst < INF;                                                                    \
    }
SPLIT_BLOCK(float, uint32_t, 0x7FFFFFFFu, 0x7F800000u)
SPLIT_BLOCK(double, uint64_t, 0x7FFFFFFFFFFFFFFFull, 0x7FF0000000000000ull)

typedef struct {
    const char *base;
    int kind, beta, axis, given, bad; /* bad: 1 a value not finite, 2 no memory (any thread) */
    Py_ssize_t outer, rows, cols;
    double *ints, *units;
} split_ctx;

/* Rows [lo, hi) of all blocks (axis 0: the blocks' rows follow one another), or columns
   [lo, hi) of every block (axis 1). */
static void split_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    split_ctx *c = (split_ctx *)p;
    const size_t size = c->kind ? 8 : 4;
    int bad = 0;
    if (c->axis == 0) {
        const Py_ssize_t off = lo * c->cols;
        const char *x = c->base + (size_t)off * size;
        bad = !(c->kind ? split_block_double((const double *)x, hi - lo, c->cols, c->cols, c->beta, 0, c->given, c->ints + off, c->units + lo, NULL)
                        : split_block_float((const float *)x, hi - lo, c->cols, c->cols, c->beta, 0, c->given, c->ints + off, c->units + lo, NULL));
    } else {
        double *scratch = (double *)malloc(sizeof(double) * 2 * (size_t)(hi - lo > 0 ? hi - lo : 1));
        if (!scratch) bad = 2;
        for (Py_ssize_t o = 0; o < c->outer && !bad; o++) {
            const Py_ssize_t off = o * c->rows * c->cols + lo;
            const char *x = c->base + (size_t)off * size;
            double *u = c->units + o * c->cols + lo;
            bad = !(c->kind ? split_block_double((const double *)x, c->rows, hi - lo, c->cols, c->beta, 1, 0, c->ints + off, u, scratch)
                            : split_block_float((const float *)x, c->rows, hi - lo, c->cols, c->beta, 1, 0, c->ints + off, u, scratch));
        }
        free(scratch);
    }
    if (bad) __atomic_fetch_or(&c->bad, bad, __ATOMIC_RELAXED);
}

/* given=1 (axis 0 only): the rows' units are read from `units`, fixed over more values than
   these (a convolution's weight gradient, a few samples at a time); only the integers are
   computed, and the values are taken to be finite (the caller checked them). */
static char *p_split_kw[] = {"src", "kind", "outer", "rows", "cols", "beta", "axis", "ints", "units", "given", NULL};
PyObject *p_split(PyObject *module, PyObject *args, PyObject *kwargs) {
    unsigned long long src, ip, up;
    int kind, beta, axis, given = 0;
    Py_ssize_t outer, rows, cols;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KinnniiKK|i", p_split_kw, &src, &kind, &outer, &rows, &cols, &beta, &axis, &ip, &up, &given))
        return NULL;
    if (given && axis != 0) {
        PyErr_SetString(PyExc_ValueError, "p_split: given units are per row (axis 0)");
        return NULL;
    }
    split_ctx ctx = {(const char *)(uintptr_t)src, kind, beta, axis, given, 0, outer, rows, cols,
                     (double *)(uintptr_t)ip, (double *)(uintptr_t)up};
    Py_BEGIN_ALLOW_THREADS
    if (axis == 0) parallel_for(outer * rows, outer * rows * cols, split_range, &ctx);
    else parallel_for(cols, outer * rows * cols, split_range, &ctx);
    Py_END_ALLOW_THREADS
    if (ctx.bad & 2) return PyErr_NoMemory();
    return PyBool_FromLong(!ctx.bad);
}

/* p_rowsum(src, kind, rows, cols, beta, count, out): out[r] = the row's exact sum from `count`
   slices (exact.split), each slice's integers added exactly, the slices' terms in order. */
static char *p_rowsum_kw[] = {"src", "kind", "rows", "cols", "beta", "count", "out", NULL};
PyObject *p_rowsum(PyObject *module, PyObject *args, PyObject *kwargs) {
    unsigned long long src, op;
    int kind, beta, count, finite = 1;
    Py_ssize_t rows, cols;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KinniiK", p_rowsum_kw, &src, &kind, &rows, &cols, &beta, &count, &op)) return NULL;
    if (count < 1 || count > 3) {
        PyErr_SetString(PyExc_ValueError, "count");
        return NULL;
    }
    const char *base = (const char *)(uintptr_t)src;
    double *out = (double *)(uintptr_t)op;
    const double step = pow2(-beta);
    Py_BEGIN_ALLOW_THREADS
    FOR_KIND(kind, base, x, {
        for (Py_ssize_t r = 0; r < rows && finite; r++) {
            const Py_ssize_t at = r * cols;
            int bad = 0;
            double amax = ROW_MAX_OF(x + at, cols, &bad);
            if (bad) finite = 0;
            double units[3], inv[3], acc[3] = {0, 0, 0};
            units[0] = unit_of(amax, beta);
            for (int c = 1; c < count; c++) units[c] = units[c - 1] * step;
            for (int c = 0; c < count; c++) inv[c] = 1.0 / units[c];
            if (count == 1) {  /* integers below 2**53 in total: exact in any order, so 8 lanes */
                double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                Py_ssize_t j = 0;
                for (; j + 8 <= cols; j += 8)
                    for (int l = 0; l < 8; l++) lane[l] += round_even((double)x[at + j + l] * inv[0]);
                for (; j < cols; j++) lane[0] += round_even((double)x[at + j] * inv[0]);
                acc[0] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
            } else {
                for (Py_ssize_t j = 0; j < cols; j++) {
                    double rest = (double)x[at + j];
                    for (int c = 0; c < count; c++) {
                        double q = round_even(rest * inv[c]);
                        acc[c] += q;
                        if (c + 1 < count) rest = rest - q * units[c];
                    }
                }
            }
            double total = acc[0] * units[0];
            for (int c = 1; c < count; c++) total = total + acc[c] * units[c];
            out[r] = total;
        }
    })
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(finite);
}

/* p_scale(prod, blocks, rows, cols, ua, ub, bias, bias_kind, bias_bs, bias_rs, bias_cs, out,
   out_kind): for each of `blocks` (rows x cols) blocks, out[i, j] = prod[i, j] * (ua[i] * ub[j])
   (+ bias[i, j] where bias is not 0), the sum rounded once to out's dtype: exact_matmul's last
   steps. ua holds blocks x rows units, ub blocks x cols; bias strides are in elements (0
   broadcasts). */
typedef struct {
    const double *prod, *ua, *ub;
    const char *bias;
    int bk, ok;
    Py_ssize_t rows, cols, bbs, brs, bcs;
    char *out;
} scale_ctx;

/* Rows [lo, hi) of all blocks, the blocks' rows taken one after another. */
static void scale_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const scale_ctx *c = (const scale_ctx *)p;
    const Py_ssize_t rows = c->rows, cols = c->cols;
    for (Py_ssize_t row = lo; row < hi; row++) {
        const Py_ssize_t k = row / rows, i = row % rows, at = row * cols;
        const double a = c->ua[row];
        const double *b = c->ub + k * cols, *pr = c->prod + at;
        if (c->bias) {
            for (Py_ssize_t j = 0; j < cols; j++) {
                double v = pr[j] * (a * b[j]);
                store(c->out, c->ok, at + j, v + load(c->bias, c->bk, k * c->bbs + i * c->brs + j * c->bcs));
            }
        } else if (c->ok) {
            double *o = (double *)c->out + at;
            for (Py_ssize_t j = 0; j < cols; j++) o[j] = pr[j] * (a * b[j]);
        } else {
            float *o = (float *)c->out + at;
            for (Py_ssize_t j = 0; j < cols; j++) o[j] = (float)(pr[j] * (a * b[j]));
        }
    }
}

static char *p_scale_kw[] = {"product", "blocks", "rows", "cols", "unit_a", "unit_b", "bias", "bias_kind", "bias_block_stride", "bias_row_stride", "bias_col_stride", "out", "out_kind", NULL};
PyObject *p_scale(PyObject *module, PyObject *args, PyObject *kwargs) {
    unsigned long long pp, ap, bp, biasp, op;
    Py_ssize_t blocks, rows, cols, bbs, brs, bcs;
    int bk, ok;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KnnnKKKinnnKi", p_scale_kw, &pp, &blocks, &rows, &cols, &ap, &bp, &biasp, &bk, &bbs, &brs, &bcs, &op, &ok))
        return NULL;
    scale_ctx ctx = {(const double *)(uintptr_t)pp, (const double *)(uintptr_t)ap, (const double *)(uintptr_t)bp,
                     (const char *)(uintptr_t)biasp, bk, ok, rows, cols, bbs, brs, bcs, (char *)(uintptr_t)op};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(blocks * rows, blocks * rows * cols, scale_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* p_compound(op, kind, n, self, a, b, value, out): one IEEE operation after another, in the
   dtype of the tensors (all contiguous, of one dtype and size), as ops_math spells them:
   0 addcmul  self + (a * value) * b        1 addcdiv  self + (a * value) / b
   2 add      self + a * value              3 lerp     torch's two-sided formula, weight value */
#define COMPOUND(T)                                                                           \
    {                                                                                         \
        const T *x = (const T *)sp, *y = (const T *)ap, *z = (const T *)bp;                  \
        T *o = (T *)op;                                                                       \
        const T v = (T)value, w1 = (T)(1.0 - value);                                          \
        switch (fn) {                                                                         \
        case 0: _Pragma("GCC ivdep") for (Py_ssize_t i = 0; i < n; i++) { T t = y[i] * v; t = t * z[i]; o[i] = x[i] + t; } break; \
        case 1: _Pragma("GCC ivdep") for (Py_ssize_t i = 0; i < n; i++) { T t = y[i] * v; t = t / z[i]; o[i] = x[i] + t; } break; \
        case 2: _Pragma("GCC ivdep") for (Py_ssize_t i = 0; i < n; i++) { T t = y[i] * v; o[i] = x[i] + t; } break;             \
        default:                                                                              \
            if (fabs(value) < 0.5) _Pragma("GCC ivdep") for (Py_ssize_t i = 0; i < n; i++) { T d = y[i] - x[i]; d = d * v; o[i] = x[i] + d; } \
            else _Pragma("GCC ivdep") for (Py_ssize_t i = 0; i < n; i++) { T d = y[i] - x[i]; d = d * w1; o[i] = y[i] - d; }           \
        }                                                                                     \
    }

/* ivdep: no element depends on another (an output may be its own first operand, in place). */
CLONED
static void compound_loops(int fn, int kind, Py_ssize_t n, const char *sp, const char *ap,
                           const char *bp, double value, char *op) {
    if (kind) COMPOUND(double) else COMPOUND(float)
}

typedef struct {
    int fn, kind;
    const char *sp, *ap, *bp;
    double value;
    char *op;
} compound_ctx;

static void compound_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const compound_ctx *c = (const compound_ctx *)p;
    const Py_ssize_t at = lo * (c->kind ? 8 : 4);
    compound_loops(c->fn, c->kind, hi - lo, c->sp + at, c->ap + at, c->bp + at, c->value, c->op + at);
}

static char *p_compound_kw[] = {"op", "kind", "n", "self", "a", "b", "value", "out", NULL};
PyObject *p_compound(PyObject *module, PyObject *args, PyObject *kwargs) {
    int fn, kind;
    Py_ssize_t n;
    unsigned long long sp_, ap_, bp_, op_;
    double value;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iinKKKdK", p_compound_kw, &fn, &kind, &n, &sp_, &ap_, &bp_, &value, &op_)) return NULL;
    const char *sp = (const char *)(uintptr_t)sp_, *ap = (const char *)(uintptr_t)ap_, *bp = (const char *)(uintptr_t)bp_;
    char *op = (char *)(uintptr_t)op_;
    compound_ctx ctx = {fn, kind, sp, ap, bp, value, op};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(n, n, compound_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

#define M0 0xD2511F53u
#define M1 0xCD9E8D57u
#define W0 0x9E3779B9u
#define W1 0xBB67AE85u

static inline void philox(uint64_t counter, uint64_t key, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)c0 * M0, p1 = (uint64_t)c2 * M1;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += W0;
        k1 += W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

static void uniforms(uint64_t key, Py_ssize_t count, double *out) {
    const double scale = pow2(-53);
    for (Py_ssize_t g = 0; 2 * g < count; g++) {
        uint32_t w[4];
        philox((uint64_t)g, key, w);
        uint64_t first = ((uint64_t)w[0] << 21) ^ (w[1] >> 11), second = ((uint64_t)w[2] << 21) ^ (w[3] >> 11);
        out[2 * g] = (double)first * scale;
        if (2 * g + 1 < count) out[2 * g + 1] = (double)second * scale;
    }
}

/* p_uniform(key, count, out): float64 uniforms, as philox.uniform. */
static char *p_uniform_kw[] = {"key", "count", "out", NULL};
PyObject *p_uniform(PyObject *module, PyObject *args, PyObject *kwargs) {
    unsigned long long key, op;
    Py_ssize_t count;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KnK", p_uniform_kw, &key, &count, &op)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    uniforms(key, count, (double *)(uintptr_t)op);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* p_normal(key, count, out, scratch): float64 normals, as philox.normal; scratch holds
   2 * ceil(count / 2) doubles. */
static char *p_normal_kw[] = {"key", "count", "out", "scratch", NULL};
PyObject *p_normal(PyObject *module, PyObject *args, PyObject *kwargs) {
    unsigned long long key, op, sp;
    Py_ssize_t count;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KnKK", p_normal_kw, &key, &count, &op, &sp)) return NULL;
    if (!check_ready()) return NULL;
    double *out = (double *)(uintptr_t)op, *u = (double *)(uintptr_t)sp;
    Py_ssize_t pairs = (count + 1) / 2;
    Py_BEGIN_ALLOW_THREADS
    uniforms(key, 2 * pairs, u);
    for (Py_ssize_t i = 0; i < pairs; i++) {
        double radius = sqrt(f_log(1.0 - u[2 * i]) * -2.0);
        double v = u[2 * i + 1] * 4.0;
        double quarter = floor(v);
        double angle = (v - quarter) * HALF_PI;
        double z = angle * angle;
        double s = angle * horner(&SIN, z), c = horner(&COS, z);
        int64_t q = ((int64_t)quarter) % 4;
        double sin_v = q == 0 ? s : q == 1 ? c : q == 2 ? -s : -c;
        double cos_v = q == 0 ? c : q == 1 ? -s : q == 2 ? -c : s;
        out[2 * i] = radius * cos_v;
        if (2 * i + 1 < count) out[2 * i + 1] = radius * sin_v;
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* Batch norm over (N, C, S) tensors, per channel c, with no copies (norms.py holds the same
   expressions in torch operations; m, s, w, b, p1, p2 are float64 arrays of C values, 0 when
   absent). */
static inline double chan_value(int expr, double x, double y, double m, double s, double w) {
    switch (expr) {
    case 0: return x;
    case 1: { double d = x - m; return d * d; }
    case 2: return y * ((x - m) * s);
    case 3: return y * w;
    default: return (y * w) * ((x - m) * s);
    }
}


/* Batch norm's kernels walk each channel's N runs of S contiguous values in chunks: a chunk's
   values are loaded into float64 arrays and each expression is one plain loop over them, so the
   compiler vectorises it; maxima and sums of integers go into LANES independent accumulators
   (a maximum, and a sum of integers below 2**53, are exact in any order, so the lanes change
   no bit). Each computes exactly chan_value's operations. */
/* v = chan_value(expr, x, y, m, s, w) for a chunk, x's values already in v and y's in yv. */
static inline void chan_values(int expr, double *v, const double *yv, Py_ssize_t len, double m, double s, double w) {
    switch (expr) {
    case 0: break;
    case 1: for (Py_ssize_t j = 0; j < len; j++) { double d = v[j] - m; v[j] = d * d; } break;
    case 2: for (Py_ssize_t j = 0; j < len; j++) { double d = v[j] - m; d = d * s; v[j] = yv[j] * d; } break;
    case 3: for (Py_ssize_t j = 0; j < len; j++) v[j] = yv[j] * w; break;
    default:
        for (Py_ssize_t j = 0; j < len; j++) { double d = v[j] - m; d = d * s; double g = yv[j] * w; v[j] = g * d; }
    }
}

/* lane[l] = the largest of lane[l] and |v|'s bit patterns (sign cleared: their integer order
   is the order of magnitude, infinities and NaN above every finite value): integer maxima. */
static inline void lanes_max(const double *v, Py_ssize_t len, uint64_t *lane) {
    Py_ssize_t j = 0;
    for (; j + LANES <= len; j += LANES)
        for (int l = 0; l < LANES; l++) {
            uint64_t b;
            memcpy(&b, v + j + l, 8);
            b &= 0x7FFFFFFFFFFFFFFFull;
            lane[l] = b > lane[l] ? b : lane[l];
        }
    for (; j < len; j++) {
        uint64_t b;
        memcpy(&b, v + j, 8);
        b &= 0x7FFFFFFFFFFFFFFFull;
        lane[0] = b > lane[0] ? b : lane[0];
    }
}

/* The largest magnitude the lanes saw; *bad set where one was infinite or NaN. */
static inline double lanes_top(const uint64_t *lane, int *bad) {
    uint64_t a = 0;
    for (int l = 0; l < LANES; l++) a = lane[l] > a ? lane[l] : a;
    if (a >= 0x7FF0000000000000ull) {
        *bad = 1;
        return 0.0;
    }
    double out;
    memcpy(&out, &a, 8);
    return out;
}

/* lane[l] += round(v * inv), the integers of one slice. */
static inline void lanes_sum(const double *v, Py_ssize_t len, double inv, double *lane) {
    Py_ssize_t j = 0;
    for (; j + LANES <= len; j += LANES)
        for (int l = 0; l < LANES; l++) lane[l] += round_even(v[j + l] * inv);
    for (; j < len; j++) lane[0] += round_even(v[j] * inv);
}

static inline double lanes_total(const double *lane) {
    double a = 0.0;
    for (int l = 0; l < LANES; l++) a += lane[l];
    return a;
}

/* p_chansum's channel c at one slice (count 1); returns 0 where a value is not finite. */
CLONED
static int chansum_one(int expr, Py_ssize_t N, Py_ssize_t C, Py_ssize_t S, Py_ssize_t c, int beta,
                       const char *x, int xk, const char *y, int yk, double mc, double scc, double wc,
                       double *out) {
    double v[CHUNK], yv[CHUNK], lane[LANES] = {0};
    uint64_t top[LANES] = {0};
    int bad = 0;
    for (Py_ssize_t n = 0; n < N; n++)
        for (Py_ssize_t j0 = 0; j0 < S; j0 += CHUNK) {
            const Py_ssize_t at = (n * C + c) * S + j0, len = S - j0 < CHUNK ? S - j0 : CHUNK;
            load_run(x, xk, at, len, v);
            if (y) load_run(y, yk, at, len, yv);
            chan_values(expr, v, yv, len, mc, scc, wc);
            lanes_max(v, len, top);
        }
    const double unit = unit_of(lanes_top(top, &bad), beta), inv = 1.0 / unit;
    for (Py_ssize_t n = 0; n < N; n++)
        for (Py_ssize_t j0 = 0; j0 < S; j0 += CHUNK) {
            const Py_ssize_t at = (n * C + c) * S + j0, len = S - j0 < CHUNK ? S - j0 : CHUNK;
            load_run(x, xk, at, len, v);
            if (y) load_run(y, yk, at, len, yv);
            chan_values(expr, v, yv, len, mc, scc, wc);
            lanes_sum(v, len, inv, lane);
        }
    *out = lanes_total(lane) * unit;
    return !bad;
}

typedef struct {
    int expr; /* -1: p_bnsums */
    Py_ssize_t N, C, S;
    int beta;
    const char *x;
    int xk;
    const char *y;
    int yk;
    const double *m, *sc, *w;
    double *out;
    int bad; /* set to 1 by any thread that meets a value not finite */
} chan_ctx;

static void chan_range(void *p, Py_ssize_t lo, Py_ssize_t hi);

/* p_chansum(expr, N, C, S, beta, count, x, xk, y, yk, m, s, w, out): out[c] = the exact sum over
   n and s of the expression (0: x; 1: (x - m)^2; 2: y (x - m) s; 3: y w; 4: (y w)((x - m) s)),
   as exact_sum computes it from `count` slices. Returns False where a value is not finite. */
static char *p_chansum_kw[] = {"expr", "n", "c", "s", "beta", "count", "x", "x_kind", "y", "y_kind", "mean", "scale", "weight", "out", NULL};
PyObject *p_chansum(PyObject *module, PyObject *args, PyObject *kwargs) {
    int expr, beta, count, xk, yk, finite = 1;
    Py_ssize_t N, C, S;
    unsigned long long xp, yp, mp, sp, wp, op;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "innniiKiKiKKKK", p_chansum_kw, &expr, &N, &C, &S, &beta, &count, &xp, &xk, &yp, &yk, &mp, &sp, &wp, &op))
        return NULL;
    if (count < 1 || count > 3) {
        PyErr_SetString(PyExc_ValueError, "count");
        return NULL;
    }
    const char *x = (const char *)(uintptr_t)xp, *y = (const char *)(uintptr_t)yp;
    const double *m = (const double *)(uintptr_t)mp, *sc = (const double *)(uintptr_t)sp, *w = (const double *)(uintptr_t)wp;
    double *out = (double *)(uintptr_t)op;
    const double step = pow2(-beta);
    if (count == 1) {
        chan_ctx ctx = {expr, N, C, S, beta, x, xk, y, yk, m, sc, w, out, 0};
        Py_BEGIN_ALLOW_THREADS
        parallel_for(C, N * C * S * 2, chan_range, &ctx);
        Py_END_ALLOW_THREADS
        return PyBool_FromLong(!ctx.bad);
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t c = 0; c < C && finite; c++) {
        double mc = m ? m[c] : 0.0, scc = sc ? sc[c] : 1.0, wc = w ? w[c] : 1.0;
        double amax = 0.0;
        int bad = 0;
        for (Py_ssize_t n = 0; n < N; n++) {
            Py_ssize_t at = (n * C + c) * S;
            for (Py_ssize_t j = 0; j < S; j++) {
                double v = fabs(chan_value(expr, load(x, xk, at + j), y ? load(y, yk, at + j) : 0.0, mc, scc, wc));
                bad |= !(v <= DBL_MAX);
                amax = v > amax ? v : amax;
            }
        }
        if (bad) finite = 0;
        double units[3], inv[3], acc[3] = {0, 0, 0};
        units[0] = unit_of(amax, beta);
        for (int k = 1; k < count; k++) units[k] = units[k - 1] * step;
        for (int k = 0; k < count; k++) inv[k] = 1.0 / units[k];
        for (Py_ssize_t n = 0; n < N; n++) {
            Py_ssize_t at = (n * C + c) * S;
            for (Py_ssize_t j = 0; j < S; j++) {
                double rest = chan_value(expr, load(x, xk, at + j), y ? load(y, yk, at + j) : 0.0, mc, scc, wc);
                for (int k = 0; k < count; k++) {
                    double q = round_even(rest * inv[k]);
                    acc[k] += q;
                    if (k + 1 < count) rest = rest - q * units[k];
                }
            }
        }
        double total = acc[0] * units[0];
        for (int k = 1; k < count; k++) total = total + acc[k] * units[k];
        out[c] = total;
    }
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(finite);
}

/* p_chanmap(expr, N, C, S, x, xk, y, yk, m, s, w, b, p1, p2, out, ok), per element, rounded once:
   0 the forward  ((x - m) s) w + b (w, b where given)
   1 the training backward  ((y w - p1) - ((x - m) s) p2) s
   2 the evaluation backward  (y w) s */
/* p_chanmap's loops, by chunks (see CHUNK), each formula one plain loop. */
CLONED
static void chanmap_loops(int expr, Py_ssize_t N, Py_ssize_t C, Py_ssize_t S, Py_ssize_t c0,
                          Py_ssize_t c1, const char *x, int xk, const char *y, int yk,
                          const double *m, const double *sc, const double *w, const double *b,
                          const double *p1, const double *p2, char *out, int ok) {
    double v[CHUNK], yv[CHUNK];
    for (Py_ssize_t n = 0; n < N; n++)
        for (Py_ssize_t c = c0; c < c1; c++) {
            const double mc = m ? m[c] : 0.0, scc = sc[c], wc = w ? w[c] : 1.0;
            for (Py_ssize_t j0 = 0; j0 < S; j0 += CHUNK) {
                const Py_ssize_t at = (n * C + c) * S + j0, len = S - j0 < CHUNK ? S - j0 : CHUNK;
                if (expr != 2) load_run(x, xk, at, len, v);
                if (expr != 0) load_run(y, yk, at, len, yv);
                if (expr == 0) {
                    for (Py_ssize_t j = 0; j < len; j++) { double d = v[j] - mc; v[j] = d * scc; }
                    if (w) for (Py_ssize_t j = 0; j < len; j++) v[j] = v[j] * wc;
                    if (b) { const double bc = b[c]; for (Py_ssize_t j = 0; j < len; j++) v[j] = v[j] + bc; }
                } else if (expr == 1) {
                    const double q1 = p1[c], q2 = p2[c];
                    for (Py_ssize_t j = 0; j < len; j++) {
                        double g = yv[j] * wc, d = v[j] - mc;
                        double xhat = d * scc, t = g - q1, u = xhat * q2;
                        t = t - u;
                        v[j] = t * scc;
                    }
                } else {
                    for (Py_ssize_t j = 0; j < len; j++) { double g = yv[j] * wc; v[j] = g * scc; }
                }
                store_run(out, ok, at, len, v);
            }
        }
}

typedef struct {
    int expr;
    Py_ssize_t N, C, S;
    const char *x;
    int xk;
    const char *y;
    int yk;
    const double *m, *sc, *w, *b, *p1, *p2;
    char *out;
    int ok;
} chanmap_ctx;

static void chanmap_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const chanmap_ctx *c = (const chanmap_ctx *)p;
    chanmap_loops(c->expr, c->N, c->C, c->S, lo, hi, c->x, c->xk, c->y, c->yk, c->m, c->sc, c->w,
                  c->b, c->p1, c->p2, c->out, c->ok);
}

static char *p_chanmap_kw[] = {"expr", "n", "c", "s", "x", "x_kind", "y", "y_kind", "mean", "scale", "weight", "bias", "p1", "p2", "out", "out_kind", NULL};
PyObject *p_chanmap(PyObject *module, PyObject *args, PyObject *kwargs) {
    int expr, xk, yk, ok;
    Py_ssize_t N, C, S;
    unsigned long long xp, yp, mp, sp, wp, bp, p1p, p2p, op;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "innnKiKiKKKKKKKi", p_chanmap_kw, &expr, &N, &C, &S, &xp, &xk, &yp, &yk, &mp, &sp, &wp, &bp, &p1p, &p2p, &op, &ok))
        return NULL;
    const char *x = (const char *)(uintptr_t)xp, *y = (const char *)(uintptr_t)yp;
    const double *m = (const double *)(uintptr_t)mp, *sc = (const double *)(uintptr_t)sp, *w = (const double *)(uintptr_t)wp;
    const double *b = (const double *)(uintptr_t)bp, *p1 = (const double *)(uintptr_t)p1p, *p2 = (const double *)(uintptr_t)p2p;
    char *out = (char *)(uintptr_t)op;
    chanmap_ctx ctx = {expr, N, C, S, x, xk, y, yk, m, sc, w, b, p1, p2, out, ok};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(C, N * C * S, chanmap_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* p_bnsums(N, C, S, beta, x, xk, y, yk, m, s, w, out): batch norm's four backward sums per channel
   in two passes (p_chansum's expressions 0, 2, 3 and 4 of y = the incoming gradient), one slice
   each: out[4c + i] is what p_chansum(expr i...) gives, bit for bit. */
/* p_bnsums' channel c: its four values per element (y, y xhat, g, g xhat with g = y w, xhat =
   (x - m) s, as chan_value spells them), by chunks; returns 0 where one is not finite. */
CLONED
static int bnsums_channel(Py_ssize_t N, Py_ssize_t C, Py_ssize_t S, Py_ssize_t c, int beta,
                          const char *x, int xk, const char *y, int yk, double mc, double scc,
                          double wc, double *out) {
    double xv[CHUNK], yv[CHUNK], v[4][CHUNK], lane[4][LANES] = {{0}}, units[4], inv[4];
    uint64_t top[4][LANES] = {{0}};
    int bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (Py_ssize_t n = 0; n < N; n++)
            for (Py_ssize_t j0 = 0; j0 < S; j0 += CHUNK) {
                const Py_ssize_t at = (n * C + c) * S + j0, len = S - j0 < CHUNK ? S - j0 : CHUNK;
                load_run(x, xk, at, len, xv);
                load_run(y, yk, at, len, yv);
                for (Py_ssize_t j = 0; j < len; j++) {
                    double d = xv[j] - mc, xhat = d * scc, g = yv[j] * wc;
                    v[0][j] = yv[j];
                    v[1][j] = yv[j] * xhat;
                    v[2][j] = g;
                    v[3][j] = g * xhat;
                }
                for (int i = 0; i < 4; i++) {
                    if (pass == 0) lanes_max(v[i], len, top[i]);
                    else lanes_sum(v[i], len, inv[i], lane[i]);
                }
            }
        if (pass == 0)
            for (int i = 0; i < 4; i++) {
                units[i] = unit_of(lanes_top(top[i], &bad), beta);
                inv[i] = 1.0 / units[i];
            }
    }
    for (int i = 0; i < 4; i++) out[4 * c + i] = lanes_total(lane[i]) * units[i];
    return !bad;
}

/* Channels [lo, hi) of p_chansum (one slice) or p_bnsums. */
static void chan_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    chan_ctx *c = (chan_ctx *)p;
    int ok = 1;
    for (Py_ssize_t k = lo; k < hi; k++) {
        if (c->expr < 0)
            ok &= bnsums_channel(c->N, c->C, c->S, k, c->beta, c->x, c->xk, c->y, c->yk, c->m[k], c->sc[k], c->w[k], c->out);
        else
            ok &= chansum_one(c->expr, c->N, c->C, c->S, k, c->beta, c->x, c->xk, c->y, c->yk,
                              c->m ? c->m[k] : 0.0, c->sc ? c->sc[k] : 1.0, c->w ? c->w[k] : 1.0, c->out + k);
    }
    if (!ok) __atomic_store_n(&c->bad, 1, __ATOMIC_RELAXED);
}

static char *p_bnsums_kw[] = {"n", "c", "s", "beta", "x", "x_kind", "y", "y_kind", "mean", "scale", "weight", "out", NULL};
PyObject *p_bnsums(PyObject *module, PyObject *args, PyObject *kwargs) {
    int beta, xk, yk, finite = 1;
    Py_ssize_t N, C, S;
    unsigned long long xp, yp, mp, sp, wp, op;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nnniKiKiKKKK", p_bnsums_kw, &N, &C, &S, &beta, &xp, &xk, &yp, &yk, &mp, &sp, &wp, &op))
        return NULL;
    const char *x = (const char *)(uintptr_t)xp, *y = (const char *)(uintptr_t)yp;
    const double *m = (const double *)(uintptr_t)mp, *sc = (const double *)(uintptr_t)sp, *w = (const double *)(uintptr_t)wp;
    double *out = (double *)(uintptr_t)op;
    chan_ctx ctx = {-1, N, C, S, beta, x, xk, y, yk, m, sc, w, out, 0};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(C, N * C * S * 2, chan_range, &ctx);
    Py_END_ALLOW_THREADS
    finite = !ctx.bad;
    return PyBool_FromLong(finite);
}

/* The exact sum of n float64 values at one slice (p_rowsum's count 1), from their largest
   magnitude; *bad set where one is infinite or NaN. */
static double exact_one(const double *v, Py_ssize_t n, int beta, int *bad) {
    double amax = ROW_MAX_OF(v, n, bad);
    double unit = unit_of(amax, beta), inv = 1.0 / unit;
    double lane[4] = {0, 0, 0, 0};
    Py_ssize_t j = 0;
    for (; j + 4 <= n; j += 4)
        for (int l = 0; l < 4; l++) lane[l] += round_even(v[j + l] * inv);
    for (; j < n; j++) lane[0] += round_even(v[j] * inv);
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) * unit;
}

/* p_lnfwd(rows, cols, beta, x, xk, w, b, eps, out, ok, mean, rstd): layer norm over each row,
   float32 precision (norms.layer_norm's expressions; w, b float64 or 0). */
static char *p_lnfwd_kw[] = {"rows", "cols", "beta", "x", "x_kind", "weight", "bias", "eps", "out", "out_kind", "mean", "rstd", NULL};
PyObject *p_lnfwd(PyObject *module, PyObject *args, PyObject *kwargs) {
    Py_ssize_t rows, cols;
    int beta, xk, ok, bad = 0;
    unsigned long long xp, wp, bp, op, mp, rp;
    double eps;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nniKiKKdKiKK", p_lnfwd_kw, &rows, &cols, &beta, &xp, &xk, &wp, &bp, &eps, &op, &ok, &mp, &rp))
        return NULL;
    const char *x = (const char *)(uintptr_t)xp;
    const double *w = (const double *)(uintptr_t)wp, *b = (const double *)(uintptr_t)bp;
    double *mean = (double *)(uintptr_t)mp, *rstd = (double *)(uintptr_t)rp;
    char *out = (char *)(uintptr_t)op;
    double *v = (double *)malloc(sizeof(double) * (cols > 0 ? cols : 1));
    if (!v) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows && !bad; r++) {
        const Py_ssize_t at = r * cols;
        for (Py_ssize_t j = 0; j < cols; j++) v[j] = load(x, xk, at + j);
        const double m = exact_one(v, cols, beta, &bad) / (double)cols;
        for (Py_ssize_t j = 0; j < cols; j++) {
            double d = v[j] - m;
            v[j] = d * d;
        }
        const double s = 1.0 / sqrt(exact_one(v, cols, beta, &bad) / (double)cols + eps);
        mean[r] = m, rstd[r] = s;
        for (Py_ssize_t j = 0; j < cols; j++) {
            double o = (load(x, xk, at + j) - m) * s;
            if (w) o = o * w[j];
            if (b) o = o + b[j];
            store(out, ok, at + j, o);
        }
    }
    Py_END_ALLOW_THREADS
    free(v);
    return PyBool_FromLong(!bad);
}

/* p_lnbwd(rows, cols, beta_row, beta_col, x, xk, go, gk, mean, rstd, w, gi, ok, gw, gb): layer
   norm's backward at float32 precision (norms.layer_norm_backward's expressions): per row the
   input gradient, per column the exact sums of go * x-hat and go into gw and gb (float64, 0 to
   skip). mean and rstd are the saved statistics as float64; w float64 or 0. */
static char *p_lnbwd_kw[] = {"rows", "cols", "beta_row", "beta_col", "x", "x_kind", "grad", "grad_kind", "mean", "rstd", "weight", "grad_input", "out_kind", "grad_weight", "grad_bias", NULL};
PyObject *p_lnbwd(PyObject *module, PyObject *args, PyObject *kwargs) {
    Py_ssize_t rows, cols;
    int br, bc, xk, gk, ok, bad = 0;
    unsigned long long xp, gp, mp, rp, wp, ip, gwp, gbp;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nniiKiKiKKKKiKK", p_lnbwd_kw, &rows, &cols, &br, &bc, &xp, &xk, &gp, &gk, &mp, &rp, &wp, &ip, &ok, &gwp, &gbp))
        return NULL;
    const char *x = (const char *)(uintptr_t)xp, *go = (const char *)(uintptr_t)gp;
    const double *mean = (const double *)(uintptr_t)mp, *rstd = (const double *)(uintptr_t)rp, *w = (const double *)(uintptr_t)wp;
    char *gi = (char *)(uintptr_t)ip;
    double *gw = (double *)(uintptr_t)gwp, *gb = (double *)(uintptr_t)gbp;
    double *g = (double *)malloc(sizeof(double) * (cols > 0 ? cols : 1) * 2);
    double *cmax = (double *)calloc((size_t)(cols > 0 ? cols : 1) * 2, sizeof(double));
    double *cacc = (double *)calloc((size_t)(cols > 0 ? cols : 1) * 2, sizeof(double));
    if (!g || !cmax || !cacc) {
        free(g), free(cmax), free(cacc);
        return PyErr_NoMemory();
    }
    double *gx = g + cols, *inv = cmax + cols;  /* inv reuses cmax's second half after pass 1 */
    Py_BEGIN_ALLOW_THREADS
    if (gi) {
        for (Py_ssize_t r = 0; r < rows && !bad; r++) {
            const Py_ssize_t at = r * cols;
            const double m = mean[r], s = rstd[r], n = (double)cols;
            for (Py_ssize_t j = 0; j < cols; j++) {
                double xhat = (load(x, xk, at + j) - m) * s;
                g[j] = w ? load(go, gk, at + j) * w[j] : load(go, gk, at + j);
                gx[j] = g[j] * xhat;
            }
            const double p1 = exact_one(g, cols, br, &bad) / n, p2 = exact_one(gx, cols, br, &bad) / n;
            for (Py_ssize_t j = 0; j < cols; j++) {
                double xhat = (load(x, xk, at + j) - m) * s;
                store(gi, ok, at + j, ((g[j] - p1) - xhat * p2) * s);
            }
        }
    }
    if ((gw || gb) && !bad) {  /* columns: one pass for the maxima, one for the sums */
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 1)
                for (Py_ssize_t j = 0; j < 2 * cols; j++) {
                    double unit = unit_of(cmax[j], bc);
                    cmax[j] = unit;  /* now the unit */
                }
            for (Py_ssize_t r = 0; r < rows; r++) {
                const Py_ssize_t at = r * cols;
                const double m = mean[r], s = rstd[r];
                for (Py_ssize_t j = 0; j < cols; j++) {
                    double gv = load(go, gk, at + j);
                    double prod = gv * ((load(x, xk, at + j) - m) * s);
                    if (pass == 0) {
                        double a = fabs(prod), c = fabs(gv);
                        bad |= !(a <= DBL_MAX) | !(c <= DBL_MAX);
                        cmax[j] = a > cmax[j] ? a : cmax[j];
                        cmax[cols + j] = c > cmax[cols + j] ? c : cmax[cols + j];
                    } else {
                        cacc[j] += round_even(prod * (1.0 / cmax[j]));
                        cacc[cols + j] += round_even(gv * (1.0 / cmax[cols + j]));
                    }
                }
            }
        }
        for (Py_ssize_t j = 0; j < cols; j++) {
            if (gw) gw[j] = cacc[j] * cmax[j];
            if (gb) gb[j] = cacc[cols + j] * cmax[cols + j];
        }
    }
    (void)inv;
    Py_END_ALLOW_THREADS
    free(g), free(cmax), free(cacc);
    return PyBool_FromLong(!bad);
}

/* Columns [lo, hi) of p_colsum for one element type: the columns' largest magnitudes as integer
   maxima of sign-cleared bit patterns (see SPLIT_BLOCK), then each row's integers added onto
   the columns' accumulators, a loop across the columns the compiler vectorises (each column's
   sum is of integers below 2**53, exact in any order). Returns 0 where a value is not finite. */
#define COLSUM_BLOCK(T, U, INF)                                                                \
    CLONED                                                                                     \
    static int colsum_block_##T(const T *x, Py_ssize_t rows, Py_ssize_t lo, Py_ssize_t hi,    \
                                Py_ssize_t ld, int beta, double *out, void *scratch) {         \
        const Py_ssize_t n = hi - lo;                                                          \
        double *inv = (double *)scratch + n, *acc = inv + n, *unit = acc + n;                  \
        const U worst = column_units_##T(x + lo, rows, n, ld, beta, (U *)scratch, unit);       \
        for (Py_ssize_t j = 0; j < n; j++) {                                                   \
            inv[j] = 1.0 / unit[j];                                                            \
            acc[j] = 0.0;                                                                      \
        }                                                                                      \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                \
            const T *xr = x + r * ld + lo;                                                     \
            _Pragma("GCC ivdep") for (Py_ssize_t j = 0; j < n; j++)                            \
                acc[j] += round_even((double)xr[j] * inv[j]);                                  \
        }                                                                                      \
        for (Py_ssize_t j = 0; j < n; j++) out[lo + j] = acc[j] * unit[j];                     \
        return worst < INF;                                                                    \
    }
COLSUM_BLOCK(float, uint32_t, 0x7F800000u)
COLSUM_BLOCK(double, uint64_t, 0x7FF0000000000000ull)

typedef struct {
    const char *base;
    int kind, beta, bad; /* bad: 1 a value not finite, 2 no memory (any thread sets it) */
    Py_ssize_t rows, cols;
    double *out;
} colsum_ctx;

static void colsum_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    colsum_ctx *c = (colsum_ctx *)p;
    int bad;
    double *scratch = (double *)malloc(sizeof(double) * 4 * (size_t)(hi - lo > 0 ? hi - lo : 1));
    if (!scratch) bad = 2;
    else if (c->kind) bad = !colsum_block_double((const double *)c->base, c->rows, lo, hi, c->cols, c->beta, c->out, scratch);
    else bad = !colsum_block_float((const float *)c->base, c->rows, lo, hi, c->cols, c->beta, c->out, scratch);
    free(scratch);
    if (bad) __atomic_fetch_or(&c->bad, bad, __ATOMIC_RELAXED);
}

/* p_colsum(src, kind, rows, cols, beta, out): out[j] = the exact sum of column j of a row-major
   (rows x cols) matrix at one slice (exact_sum over leading dimensions, with no copy). */
static char *p_colsum_kw[] = {"src", "kind", "rows", "cols", "beta", "out", NULL};
PyObject *p_colsum(PyObject *module, PyObject *args, PyObject *kwargs) {
    unsigned long long src, op;
    int kind, beta;
    Py_ssize_t rows, cols;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KinniK", p_colsum_kw, &src, &kind, &rows, &cols, &beta, &op)) return NULL;
    colsum_ctx ctx = {(const char *)(uintptr_t)src, kind, beta, 0, rows, cols, (double *)(uintptr_t)op};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(cols, rows * cols, colsum_range, &ctx);
    Py_END_ALLOW_THREADS
    if (ctx.bad & 2) return PyErr_NoMemory();
    return PyBool_FromLong(!ctx.bad);
}

/* p_keep_memory(): glibc's malloc gives each large block (above a threshold that it raises
   only after a free) fresh pages from the system and returns freed memory at the heap's top;
   portable mode's float64 temporaries, several megabytes each on every call, then spend more
   time in page faults than in arithmetic. This keeps blocks up to 32 MiB on the heap and freed
   memory there for reuse, as a caching allocator does. Returns whether it applied (glibc only). */
PyObject *p_keep_memory(PyObject *module, PyObject *args) {
#ifdef __GLIBC__
    int ok = mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) && mallopt(M_TRIM_THRESHOLD, 512 * 1024 * 1024);
    return PyBool_FromLong(ok);
#else
    Py_RETURN_FALSE;
#endif
}

/* ---- The LSTM cell (twice/portable/ops/recurrent.py), forward and backward: one time step of
   torch's CPU cell for `rows` samples of `hidden` units, the gates' functions twice's own
   (sigmoid_chunk, tanh_chunk: p_unary's), every other operation one IEEE operation in the
   layer's dtype (float32 or float64) in the order recurrent.py's torch fallback spells it, so
   the two give the same bits. ---- */

/* Forward: gates = (hg + bias) + gx (bias may be absent); act = sigmoid, sigmoid, tanh, sigmoid
   of the four blocks of the gates; c_out = f c + i g; tanh_c = tanh(c_out); h = o tanh_c. */
#define LSTM_FORWARD(T)                                                                          \
    CLONED static void lstm_forward_##T(Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t H,              \
                                        const T *hg, const T *bias, const T *gx, const T *c,     \
                                        T *act, T *c_out, T *tanh_c, T *h) {                     \
        double v[CHUNK], w[CHUNK];                                                               \
        for (Py_ssize_t r = lo; r < hi; r++) {                                                   \
            const T *hr = hg + r * 4 * H, *gr = gx + r * 4 * H, *cr = c + r * H;                 \
            T *ar = act + r * 4 * H;                                                             \
            for (int block = 0; block < 4; block++)                                              \
                for (Py_ssize_t j0 = 0; j0 < H; j0 += CHUNK) {                                   \
                    const Py_ssize_t len = H - j0 < CHUNK ? H - j0 : CHUNK, at = block * H + j0; \
                    if (bias)                                                                    \
                        for (Py_ssize_t j = 0; j < len; j++) {                                   \
                            T g = hr[at + j] + bias[at + j];                                     \
                            g = g + gr[at + j];                                                  \
                            v[j] = (double)g;                                                    \
                        }                                                                        \
                    else                                                                         \
                        for (Py_ssize_t j = 0; j < len; j++) {                                   \
                            T g = hr[at + j] + gr[at + j];                                       \
                            v[j] = (double)g;                                                    \
                        }                                                                        \
                    if (block == 2) tanh_chunk(v, w, len);                                       \
                    else sigmoid_chunk(v, w, len);                                               \
                    for (Py_ssize_t j = 0; j < len; j++) ar[at + j] = (T)w[j];                   \
                }                                                                                \
            const T *i = ar, *f = ar + H, *g = ar + 2 * H, *o = ar + 3 * H;                      \
            T *cn = c_out + r * H, *tc = tanh_c + r * H, *hn = h + r * H;                        \
            for (Py_ssize_t j0 = 0; j0 < H; j0 += CHUNK) {                                       \
                const Py_ssize_t len = H - j0 < CHUNK ? H - j0 : CHUNK;                          \
                for (Py_ssize_t j = 0; j < len; j++) {                                           \
                    const T kept = f[j0 + j] * cr[j0 + j], added = i[j0 + j] * g[j0 + j];        \
                    const T cell = kept + added;                                                 \
                    cn[j0 + j] = cell;                                                           \
                    v[j] = (double)cell;                                                         \
                }                                                                                \
                tanh_chunk(v, w, len);                                                           \
                for (Py_ssize_t j = 0; j < len; j++) {                                           \
                    const T t = (T)w[j];                                                         \
                    tc[j0 + j] = t;                                                              \
                    hn[j0 + j] = o[j0 + j] * t;                                                  \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }
LSTM_FORWARD(float)
LSTM_FORWARD(double)

/* Backward: dh = dy + dh_in (either may be absent: 0 when both are); the gates' gradients
   (autograd's formulas: sigmoid's grad (1 - y) y and tanh's grad (1 - y y) in float64, rounded
   once) into dgates, and the previous cell's gradient, f dc, into dc_out. */
#define LSTM_BACKWARD(T)                                                                         \
    CLONED static void lstm_backward_##T(Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t H,             \
                                         const T *dy, const T *dh_in, const T *dc_in,            \
                                         const T *act, const T *tanh_c, const T *c_prev,         \
                                         T *dgates, T *dc_out) {                                 \
        for (Py_ssize_t r = lo; r < hi; r++) {                                                   \
            const T *ar = act + r * 4 * H, *tc = tanh_c + r * H, *cp = c_prev + r * H;           \
            const T *i = ar, *f = ar + H, *g = ar + 2 * H, *o = ar + 3 * H;                      \
            T *dg = dgates + r * 4 * H, *dco = dc_out + r * H;                                   \
            for (Py_ssize_t j = 0; j < H; j++) {                                                 \
                const Py_ssize_t at = r * H + j;                                                 \
                T dh = dy ? dy[at] : (T)0;                                                       \
                if (dh_in) dh = dy ? dh + dh_in[at] : dh_in[at];                                 \
                const T d_o = dh * tc[j], d_tc = dh * o[j];                                      \
                const double t64 = (double)tc[j];                                                \
                T dc = (T)((double)d_tc * (1.0 - t64 * t64));                                    \
                if (dc_in) dc = dc + dc_in[at];                                                  \
                const T d_f = dc * cp[j], d_i = dc * g[j], d_g = dc * i[j];                      \
                dco[j] = dc * f[j];                                                              \
                const double i64 = (double)i[j], f64 = (double)f[j], g64 = (double)g[j];         \
                const double o64 = (double)o[j];                                                 \
                dg[j] = (T)((double)d_i * ((1.0 - i64) * i64));                                  \
                dg[H + j] = (T)((double)d_f * ((1.0 - f64) * f64));                              \
                dg[2 * H + j] = (T)((double)d_g * (1.0 - g64 * g64));                            \
                dg[3 * H + j] = (T)((double)d_o * ((1.0 - o64) * o64));                          \
            }                                                                                    \
        }                                                                                        \
    }
LSTM_BACKWARD(float)
LSTM_BACKWARD(double)

typedef struct {
    int kind, backward;
    Py_ssize_t hidden;
    const void *a, *b, *c, *d, *e, *f;
    void *g, *h, *i, *j;
} lstm_ctx;

static void lstm_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const lstm_ctx *x = (const lstm_ctx *)p;
    if (!x->backward) {
        if (x->kind) lstm_forward_double(lo, hi, x->hidden, x->a, x->b, x->c, x->d, x->g, x->h, x->i, x->j);
        else lstm_forward_float(lo, hi, x->hidden, x->a, x->b, x->c, x->d, x->g, x->h, x->i, x->j);
    } else {
        if (x->kind) lstm_backward_double(lo, hi, x->hidden, x->a, x->b, x->c, x->d, x->e, x->f, x->g, x->h);
        else lstm_backward_float(lo, hi, x->hidden, x->a, x->b, x->c, x->d, x->e, x->f, x->g, x->h);
    }
}

#define PTR(v) ((void *)(uintptr_t)(v))

/* p_lstm_cell(kind, rows, hidden, hg, bias, gx, c, act, c_out, tanh_c, h): the forward above;
   every buffer contiguous, of the kind's dtype, bias 0 where there is none. */
static char *p_lstm_cell_kw[] = {"kind", "rows", "hidden", "hg", "bias", "gx", "c", "act", "c_out", "tanh_c", "h", NULL};
PyObject *p_lstm_cell(PyObject *module, PyObject *args, PyObject *kwargs) {
    int kind;
    Py_ssize_t rows, hidden;
    unsigned long long hg, bias, gx, c, act, c_out, tanh_c, h;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "innKKKKKKKK", p_lstm_cell_kw, &kind, &rows, &hidden, &hg, &bias, &gx, &c, &act, &c_out, &tanh_c, &h))
        return NULL;
    if (!check_ready()) return NULL;
    lstm_ctx ctx = {kind, 0, hidden, PTR(hg), PTR(bias), PTR(gx), PTR(c), NULL, NULL, PTR(act), PTR(c_out), PTR(tanh_c), PTR(h)};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(rows, rows * hidden * 16, lstm_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* p_lstm_cell_backward(kind, rows, hidden, dy, dh, dc, act, tanh_c, c_prev, dgates, dc_out):
   the backward above; dy, dh and dc may be 0 (absent). */
static char *p_lstm_back_kw[] = {"kind", "rows", "hidden", "dy", "dh", "dc", "act", "tanh_c", "c_prev", "dgates", "dc_out", NULL};
PyObject *p_lstm_cell_backward(PyObject *module, PyObject *args, PyObject *kwargs) {
    int kind;
    Py_ssize_t rows, hidden;
    unsigned long long dy, dh, dc, act, tanh_c, c_prev, dgates, dc_out;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "innKKKKKKKK", p_lstm_back_kw, &kind, &rows, &hidden, &dy, &dh, &dc, &act, &tanh_c, &c_prev, &dgates, &dc_out))
        return NULL;
    if (!check_ready()) return NULL;
    lstm_ctx ctx = {kind, 1, hidden, PTR(dy), PTR(dh), PTR(dc), PTR(act), PTR(tanh_c), PTR(c_prev), PTR(dgates), PTR(dc_out), NULL, NULL};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(rows, rows * hidden * 4, lstm_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* Convolutions (portable/ops/conv.py): the input's windows unfolded straight into integers on
   their grid, and an integer product folded back onto the input, scaled and rounded, each in
   one pass where torch's unfold, p_split, fold, the scaling and the rounding took five. The
   values are those of the Python steps (unfold's zeros where a window leaves the input, then
   p_split's integers; fold's sums of integers, exact in any order, then p_scale's product and
   rounding), so the two routes give the same bits and tests hold them together. */
typedef struct {
    Py_ssize_t n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo;
} conv_geom;

static int read_geom(PyObject *t, conv_geom *g) {
    if (!PyArg_ParseTuple(t, "nnnnnnnnnnnnnn;geometry: (n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo)",
                          &g->n, &g->c, &g->h, &g->w, &g->kh, &g->kw, &g->sh, &g->sw, &g->ph, &g->pw, &g->dh, &g->dw, &g->ho, &g->wo))
        return 0;
    if (g->n < 0 || g->c < 0 || g->h < 0 || g->w < 0 || g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 ||
        g->ph < 0 || g->pw < 0 || g->dh < 1 || g->dw < 1 || g->ho < 0 || g->wo < 0) {
        PyErr_SetString(PyExc_ValueError, "convolution geometry out of range");
        return 0;
    }
    return 1;
}

/* The outputs [*lo, *hi) of `out` along one axis whose input index o * s - p + off lies in
   [0, size): the others read the padding's zeros. */
static inline void inside(Py_ssize_t out, Py_ssize_t s, Py_ssize_t p, Py_ssize_t off, Py_ssize_t size,
                          Py_ssize_t *lo, Py_ssize_t *hi) {
    const Py_ssize_t a = p - off, b = size - 1 + p - off;
    Py_ssize_t l = a <= 0 ? 0 : (a + s - 1) / s, h = b < 0 ? 0 : b / s + 1;
    if (h > out) h = out;
    if (l > h) l = h;
    *lo = l, *hi = h;
}

/* unfold_top: for input rows [lo, hi) of (n, h), each position's largest magnitude over the
   channels [c0, c0 + cc) as a sign-cleared bit pattern (integer maxima, as in SPLIT_BLOCK).
   unfold_units: for output rows [lo, hi) of (n, ho), each column's unit from the largest
   pattern over its window (padding reads 0), and its inverse; returns the largest pattern.
   unfold_rows: unfold's rows [lo, hi) (channel c0 + r / (kh kw), offset i, j) as the integers
   round(x / unit) on the row's unit (inv per row). */
#define UNFOLD(T, U, INF)                                                                         \
    static void unfold_top_##T(const T *x, const conv_geom *g, Py_ssize_t c0, Py_ssize_t cc,       \
                               U *top, Py_ssize_t lo, Py_ssize_t hi) {                            \
        for (Py_ssize_t r = lo; r < hi; r++) {                                                    \
            const Py_ssize_t n = r / g->h, y = r % g->h;                                          \
            U *t = top + r * g->w;                                                                \
            for (Py_ssize_t v = 0; v < g->w; v++) t[v] = 0;                                       \
            for (Py_ssize_t c = c0; c < c0 + cc; c++) {                                           \
                const T *row = x + ((n * g->c + c) * g->h + y) * g->w;                            \
                for (Py_ssize_t v = 0; v < g->w; v++) {                                           \
                    U b = bits_##T(row[v]);                                                       \
                    t[v] = b > t[v] ? b : t[v];                                                   \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    static U unfold_units_##T(const U *top, const conv_geom *g, int beta, double *u, double *inv, \
                              Py_ssize_t lo, Py_ssize_t hi) {                                     \
        U worst = 0;                                                                              \
        for (Py_ssize_t r = lo; r < hi; r++) {                                                    \
            const Py_ssize_t n = r / g->ho, oy = r % g->ho;                                       \
            for (Py_ssize_t ox = 0; ox < g->wo; ox++) {                                           \
                U m = 0;                                                                          \
                for (Py_ssize_t i = 0; i < g->kh; i++) {                                          \
                    const Py_ssize_t iy = oy * g->sh - g->ph + i * g->dh;                         \
                    if (iy < 0 || iy >= g->h) continue;                                           \
                    const U *t = top + (n * g->h + iy) * g->w;                                    \
                    for (Py_ssize_t j = 0; j < g->kw; j++) {                                      \
                        const Py_ssize_t ix = ox * g->sw - g->pw + j * g->dw;                     \
                        if (ix >= 0 && ix < g->w && t[ix] > m) m = t[ix];                         \
                    }                                                                             \
                }                                                                                 \
                worst = m > worst ? m : worst;                                                    \
                const double unit = unit_of(m >= INF ? 0.0 : magnitude_##T(m), beta);             \
                u[r * g->wo + ox] = unit, inv[r * g->wo + ox] = 1.0 / unit;                       \
            }                                                                                     \
        }                                                                                         \
        return worst;                                                                             \
    }                                                                                             \
    /* One output row (sample n, row oy) of unfold's row for channel c, offset (i, j), the   \
       columns [xlo, xhi) inside the input (`inside`), as the integers round(x * rinv). */    \
    STAGE void window_row_##T(const T *x, const conv_geom *g, Py_ssize_t n, Py_ssize_t c,        \
                              Py_ssize_t i, Py_ssize_t j, Py_ssize_t oy, Py_ssize_t xlo,          \
                              Py_ssize_t xhi, double rinv, double *o) {                           \
        const Py_ssize_t iy = oy * g->sh - g->ph + i * g->dh;                                     \
        if (iy < 0 || iy >= g->h) {                                                               \
            for (Py_ssize_t ox = 0; ox < g->wo; ox++) o[ox] = 0.0;                                \
            return;                                                                               \
        }                                                                                         \
        const T *src = x + ((n * g->c + c) * g->h + iy) * g->w + j * g->dw - g->pw;               \
        for (Py_ssize_t ox = 0; ox < xlo; ox++) o[ox] = 0.0;                                      \
        for (Py_ssize_t ox = xhi; ox < g->wo; ox++) o[ox] = 0.0;                                  \
        if (g->sw == 1) {                                                                         \
            _Pragma("GCC ivdep") for (Py_ssize_t ox = xlo; ox < xhi; ox++)                        \
                o[ox] = round_even((double)src[ox] * rinv);                                       \
        } else {                                                                                  \
            for (Py_ssize_t ox = xlo; ox < xhi; ox++)                                             \
                o[ox] = round_even((double)src[ox * g->sw] * rinv);                               \
        }                                                                                         \
    }                                                                                             \
    CLONED                                                                                        \
    static void unfold_rows_##T(const T *x, const conv_geom *g, Py_ssize_t c0, const double *inv, \
                                double *ints, Py_ssize_t lo, Py_ssize_t hi) {                     \
        const Py_ssize_t kk = g->kh * g->kw, cols = g->n * g->ho * g->wo;                         \
        for (Py_ssize_t r = lo; r < hi; r++) {                                                    \
            const Py_ssize_t c = c0 + r / kk, i = (r % kk) / g->kw, j = r % g->kw;                \
            Py_ssize_t xlo, xhi;                                                                  \
            inside(g->wo, g->sw, g->pw, j * g->dw, g->w, &xlo, &xhi);                             \
            for (Py_ssize_t n = 0; n < g->n; n++)                                                 \
                for (Py_ssize_t oy = 0; oy < g->ho; oy++)                                         \
                    window_row_##T(x, g, n, c, i, j, oy, xlo, xhi, inv[r],                        \
                                   ints + r * cols + (n * g->ho + oy) * g->wo);                   \
        }                                                                                         \
    }
UNFOLD(float, uint32_t, 0x7F800000u)
UNFOLD(double, uint64_t, 0x7FF0000000000000ull)

typedef struct {
    const char *x;
    int kind, beta;
    conv_geom g;
    Py_ssize_t c0, cc;
    void *top;
    double *units, *inv, *ints;
    int bad;
} unfold_ctx;

static void unfold_top_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    unfold_ctx *u = (unfold_ctx *)p;
    if (u->kind) unfold_top_double((const double *)u->x, &u->g, u->c0, u->cc, (uint64_t *)u->top, lo, hi);
    else unfold_top_float((const float *)u->x, &u->g, u->c0, u->cc, (uint32_t *)u->top, lo, hi);
}

static void unfold_units_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    unfold_ctx *u = (unfold_ctx *)p;
    const int bad = u->kind
        ? unfold_units_double((const uint64_t *)u->top, &u->g, u->beta, u->units, u->inv, lo, hi) >= 0x7FF0000000000000ull
        : unfold_units_float((const uint32_t *)u->top, &u->g, u->beta, u->units, u->inv, lo, hi) >= 0x7F800000u;
    if (bad) __atomic_fetch_or(&u->bad, 1, __ATOMIC_RELAXED);
}

static void unfold_rows_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    unfold_ctx *u = (unfold_ctx *)p;
    if (u->kind) unfold_rows_double((const double *)u->x, &u->g, u->c0, u->inv, u->ints, lo, hi);
    else unfold_rows_float((const float *)u->x, &u->g, u->c0, u->inv, u->ints, lo, hi);
}

/* p_unfold(src, kind, geometry, ints, units): every channel's columns of the contiguous (n, c,
   h, w) input src, unfold's (c kh kw, n ho wo) matrix, as float64 integers in ints on each row's
   unit read from units (c kh kw of them), as p_split's given=1; the values are taken to be
   finite. (p_conv_forward cuts each column on its own unit itself, in cache.) */
static char *p_unfold_kw[] = {"src", "kind", "geometry", "ints", "units", NULL};
PyObject *p_unfold(PyObject *module, PyObject *args, PyObject *kwargs) {
    unsigned long long src, ip, up;
    int kind;
    PyObject *geometry;
    unfold_ctx u;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KiO!KK", p_unfold_kw, &src, &kind, &PyTuple_Type, &geometry, &ip, &up))
        return NULL;
    memset(&u, 0, sizeof u);
    if (!read_geom(geometry, &u.g)) return NULL;
    const conv_geom *g = &u.g;
    const Py_ssize_t rows = g->c * g->kh * g->kw, cols = g->n * g->ho * g->wo;
    u.x = (const char *)(uintptr_t)src, u.kind = kind, u.cc = g->c;
    u.units = (double *)(uintptr_t)up, u.ints = (double *)(uintptr_t)ip;
    u.inv = (double *)malloc(sizeof(double) * (size_t)(rows + 1));
    if (!u.inv) return PyErr_NoMemory();
    for (Py_ssize_t r = 0; r < rows; r++) u.inv[r] = 1.0 / u.units[r];
    Py_BEGIN_ALLOW_THREADS
    parallel_for(rows, rows * cols, unfold_rows_range, &u);
    Py_END_ALLOW_THREADS
    free(u.inv);
    Py_RETURN_NONE;
}

/* p_fold_scale(cols, geometry, unit_a, unit_b, out, out_kind): fold's sums of the integer
   columns cols (float64, (n, c kh kw, ho wo) contiguous) onto each (n, c) plane of the padded
   input, exact in any order, the padding cropped, each sum times unit_a * unit_b[n] rounded
   once into out ((n, c, h, w), float32 or float64 by out_kind). */
typedef struct {
    const double *cols, *ub;
    double ua;
    conv_geom g;
    char *out;
    int ok, bad;
} fold_ctx;

CLONED
static void fold_plane(const double *cols, const conv_geom *g, double *acc, Py_ssize_t wp) {
    const Py_ssize_t L = g->ho * g->wo;
    for (Py_ssize_t i = 0; i < g->kh; i++)
        for (Py_ssize_t j = 0; j < g->kw; j++) {
            const double *col = cols + (i * g->kw + j) * L;
            for (Py_ssize_t oy = 0; oy < g->ho; oy++) {
                double *a = acc + (oy * g->sh + i * g->dh) * wp + j * g->dw;
                const double *s = col + oy * g->wo;
                if (g->sw == 1) {
                    _Pragma("GCC ivdep") for (Py_ssize_t ox = 0; ox < g->wo; ox++) a[ox] += s[ox];
                } else {
                    for (Py_ssize_t ox = 0; ox < g->wo; ox++) a[ox * g->sw] += s[ox];
                }
            }
        }
}

static void fold_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    fold_ctx *f = (fold_ctx *)p;
    const conv_geom *g = &f->g;
    const Py_ssize_t hp = g->h + 2 * g->ph, wp = g->w + 2 * g->pw, kk = g->kh * g->kw;
    double *acc = (double *)malloc(sizeof(double) * (size_t)(hp * wp + 1));
    if (!acc) {
        __atomic_fetch_or(&f->bad, 1, __ATOMIC_RELAXED);
        return;
    }
    for (Py_ssize_t plane = lo; plane < hi; plane++) {
        const Py_ssize_t n = plane / g->c;
        memset(acc, 0, sizeof(double) * (size_t)(hp * wp));
        fold_plane(f->cols + plane * kk * g->ho * g->wo, g, acc, wp);
        const double s = f->ua * f->ub[n];
        for (Py_ssize_t y = 0; y < g->h; y++) {
            const double *a = acc + (y + g->ph) * wp + g->pw;
            const Py_ssize_t at = (plane * g->h + y) * g->w;
            if (f->ok) {
                double *o = (double *)f->out + at;
                for (Py_ssize_t v = 0; v < g->w; v++) o[v] = a[v] * s;
            } else {
                float *o = (float *)f->out + at;
                for (Py_ssize_t v = 0; v < g->w; v++) o[v] = (float)(a[v] * s);
            }
        }
    }
    free(acc);
}

static char *p_fold_scale_kw[] = {"cols", "geometry", "unit_a", "unit_b", "out", "out_kind", NULL};
PyObject *p_fold_scale(PyObject *module, PyObject *args, PyObject *kwargs) {
    unsigned long long cp, bp, op;
    PyObject *geometry;
    fold_ctx f;
    memset(&f, 0, sizeof f);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KO!dKKi", p_fold_scale_kw, &cp, &PyTuple_Type, &geometry, &f.ua, &bp, &op, &f.ok))
        return NULL;
    if (!read_geom(geometry, &f.g)) return NULL;
    const conv_geom *g = &f.g;
    if ((g->ho - 1) * g->sh + (g->kh - 1) * g->dh >= g->h + 2 * g->ph ||
        (g->wo - 1) * g->sw + (g->kw - 1) * g->dw >= g->w + 2 * g->pw) {
        PyErr_SetString(PyExc_ValueError, "p_fold_scale: the windows leave the padded input");
        return NULL;
    }
    f.cols = (const double *)(uintptr_t)cp, f.ub = (const double *)(uintptr_t)bp, f.out = (char *)(uintptr_t)op;
    Py_BEGIN_ALLOW_THREADS
    parallel_for(g->n * g->c, g->n * g->c * g->kh * g->kw * g->ho * g->wo, fold_range, &f);
    Py_END_ALLOW_THREADS
    if (f.bad) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* p_conv_forward(src, kind, geometry, c0, cc, beta, wints, wunits, m, out, out_kind, out_c, co0):
   a convolution's forward with no columns in memory. Each column's unit comes from its window's
   largest magnitude; then, PANEL consecutive columns at a time (a panel runs on into the next
   output row where rows are short), the panel's integers are unfolded into a buffer that stays
   in the first-level cache and multiplied there by the m rows of the weight's integers wints
   ((m, cc kh kw), float64, units wunits), each sum times (wunit * column unit) rounded once
   into out ((n, out_c, ho wo), out_kind), channels [co0, co0 + m). The integers are unfold's
   values cut as p_split cuts them, and the sums of integer products below 2**53 are exact in
   any order and with or without fused multiply-adds: the bits of torch.matmul of the columns
   followed by p_scale.
   Returns False where a window holds a value not finite (nothing written then). */
#define PANEL 8
#define MR 4

/* c[r][q] = the sum over k of a(k, r) b[k][q], for MR rows and PANEL columns, a(k, r) at
   a[k * as + r * ar]: exact integer arithmetic, so the order and the fused multiply-adds change
   no bit. */
static void micro_plain(const double *a, Py_ssize_t as, Py_ssize_t ar, const double *b, Py_ssize_t K,
                        double *c) {
    double acc[MR][PANEL] = {{0}};
    for (Py_ssize_t k = 0; k < K; k++)
        for (int r = 0; r < MR; r++)
            for (int q = 0; q < PANEL; q++) acc[r][q] += a[k * as + r * ar] * b[k * PANEL + q];
    memcpy(c, acc, sizeof acc);
}

/* micro_fma: the same sums with AVX2's fused multiply-adds, taken where the CPU has them (in a
   TWICE_NO_CLONES build, only where the compiler's target has them: the clone tests then hold
   micro_plain's bits to the dispatched build's). */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && \
    (!defined(TWICE_NO_CLONES) || (defined(__AVX2__) && defined(__FMA__)))
#include <immintrin.h>
__attribute__((target("avx2,fma"))) static void micro_fma(const double *a, Py_ssize_t as, Py_ssize_t ar,
                                                          const double *b, Py_ssize_t K, double *c) {
    __m256d c00 = _mm256_setzero_pd(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00;
    for (Py_ssize_t k = 0; k < K; k++) {
        const __m256d b0 = _mm256_loadu_pd(b + k * PANEL), b1 = _mm256_loadu_pd(b + k * PANEL + 4);
        const double *ak = a + k * as;
        __m256d av = _mm256_broadcast_sd(ak);
        c00 = _mm256_fmadd_pd(av, b0, c00), c01 = _mm256_fmadd_pd(av, b1, c01);
        av = _mm256_broadcast_sd(ak + ar);
        c10 = _mm256_fmadd_pd(av, b0, c10), c11 = _mm256_fmadd_pd(av, b1, c11);
        av = _mm256_broadcast_sd(ak + 2 * ar);
        c20 = _mm256_fmadd_pd(av, b0, c20), c21 = _mm256_fmadd_pd(av, b1, c21);
        av = _mm256_broadcast_sd(ak + 3 * ar);
        c30 = _mm256_fmadd_pd(av, b0, c30), c31 = _mm256_fmadd_pd(av, b1, c31);
    }
    _mm256_storeu_pd(c, c00), _mm256_storeu_pd(c + 4, c01), _mm256_storeu_pd(c + 8, c10);
    _mm256_storeu_pd(c + 12, c11), _mm256_storeu_pd(c + 16, c20), _mm256_storeu_pd(c + 20, c21);
    _mm256_storeu_pd(c + 24, c30), _mm256_storeu_pd(c + 28, c31);
}
static int fma_ok(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
static void micro_fma(const double *a, Py_ssize_t as, Py_ssize_t ar, const double *b, Py_ssize_t K, double *c) {
    micro_plain(a, as, ar, b, K, c);
}
static int fma_ok(void) { return 0; }
#endif

typedef struct {
    const char *x;
    int kind, out_kind, fma;
    conv_geom g;
    Py_ssize_t c0, cc, m, out_c, co0, K;
    const double *apack, *wunits, *units, *inv;
    char *out;
    int bad;
} convf_ctx;

/* The panel's integers, k-major: bp[k * PANEL + q] for its column q (sample nq[q], output row
   oyq[q], column oxq[q]; count columns, the rest zero), zero where the window reads padding:
   unfold's values cut as p_split cuts them. `row`: the columns are one run of an output row. */
#define PACK(T)                                                                                   \
    static void pack_panel_##T(const T *x, const conv_geom *g, Py_ssize_t c0, Py_ssize_t cc,       \
                               const Py_ssize_t *nq, const Py_ssize_t *oyq, const Py_ssize_t *oxq, \
                               Py_ssize_t count, int row, const double *inv, double *bp) {        \
        for (Py_ssize_t c = 0; c < cc; c++)                                                       \
            for (Py_ssize_t i = 0; i < g->kh; i++)                                                \
                for (Py_ssize_t j = 0; j < g->kw; j++) {                                          \
                    double *dst = bp + ((c * g->kh + i) * g->kw + j) * PANEL;                     \
                    const Py_ssize_t iy = oyq[0] * g->sh - g->ph + i * g->dh;                     \
                    const Py_ssize_t ix0 = oxq[0] * g->sw - g->pw + j * g->dw;                    \
                    const Py_ssize_t last = ix0 + (PANEL - 1) * g->sw;                            \
                    if (row && (iy < 0 || iy >= g->h)) {                                          \
                        for (int q = 0; q < PANEL; q++) dst[q] = 0.0;                             \
                    } else if (row && count == PANEL && ix0 >= 0 && last < g->w) {                \
                        const T *src = x + ((nq[0] * g->c + c0 + c) * g->h + iy) * g->w + ix0;    \
                        if (g->sw == 1)                                                           \
                            for (int q = 0; q < PANEL; q++)                                       \
                                dst[q] = round_even((double)src[q] * inv[q]);                     \
                        else                                                                      \
                            for (int q = 0; q < PANEL; q++)                                       \
                                dst[q] = round_even((double)src[q * g->sw] * inv[q]);             \
                    } else {                                                                      \
                        for (int q = 0; q < PANEL; q++) {                                         \
                            const Py_ssize_t y = oyq[q] * g->sh - g->ph + i * g->dh;              \
                            const Py_ssize_t v = oxq[q] * g->sw - g->pw + j * g->dw;              \
                            dst[q] = q < count && y >= 0 && y < g->h && v >= 0 && v < g->w        \
                                         ? round_even((double)x[((nq[q] * g->c + c0 + c) * g->h + \
                                                                 y) * g->w + v] * inv[q])         \
                                         : 0.0;                                                   \
                        }                                                                         \
                    }                                                                             \
                }                                                                                 \
    }
CLONED PACK(float)
CLONED PACK(double)

/* Panels [lo, hi): PANEL consecutive columns each (of n ho wo; a panel may run over rows). */
static void convf_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    convf_ctx *f = (convf_ctx *)p;
    const conv_geom *g = &f->g;
    const Py_ssize_t L = g->ho * g->wo, cols = g->n * L, blocks = (f->m + MR - 1) / MR;
    double *bp = (double *)malloc(sizeof(double) * (size_t)(f->K * PANEL + 1)), inv[PANEL], c[MR * PANEL];
    Py_ssize_t nq[PANEL], oyq[PANEL], oxq[PANEL], lq[PANEL];
    if (!bp) {
        __atomic_store_n(&f->bad, 2, __ATOMIC_RELAXED);
        return;
    }
    for (Py_ssize_t panel = lo; panel < hi; panel++) {
        const Py_ssize_t col = panel * PANEL, count = cols - col < PANEL ? cols - col : PANEL;
        for (int q = 0; q < PANEL; q++) {
            const Py_ssize_t at = q < count ? col + q : col;
            nq[q] = at / L, lq[q] = at % L, oyq[q] = lq[q] / g->wo, oxq[q] = lq[q] % g->wo;
            inv[q] = q < count ? f->inv[at] : 0.0;
        }
        const int row = nq[count - 1] == nq[0] && oyq[count - 1] == oyq[0];
        if (f->kind) pack_panel_double((const double *)f->x, g, f->c0, f->cc, nq, oyq, oxq, count, row, inv, bp);
        else pack_panel_float((const float *)f->x, g, f->c0, f->cc, nq, oyq, oxq, count, row, inv, bp);
        for (Py_ssize_t b = 0; b < blocks; b++) {
            if (f->fma) micro_fma(f->apack + b * f->K * MR, MR, 1, bp, f->K, c);
            else micro_plain(f->apack + b * f->K * MR, MR, 1, bp, f->K, c);
            for (int r = 0; r < MR && b * MR + r < f->m; r++) {
                const Py_ssize_t o = b * MR + r;
                const double a = f->wunits[o];
                for (Py_ssize_t q = 0; q < count; q++)
                    store(f->out, f->out_kind, (nq[q] * f->out_c + f->co0 + o) * L + lq[q],
                          c[r * PANEL + q] * (a * f->units[col + q]));
            }
        }
    }
    free(bp);
}

static char *p_conv_forward_kw[] = {"src", "kind", "geometry", "c0", "cc", "beta", "wints", "wunits", "m", "out", "out_kind", "out_c", "co0", "units", "inv", NULL};
PyObject *p_conv_forward(PyObject *module, PyObject *args, PyObject *kwargs) {
    unsigned long long src, wp, wup, op, given_units = 0, given_inv = 0;
    int kind, beta, out_kind;
    Py_ssize_t c0, cc, m, out_c, co0;
    PyObject *geometry;
    convf_ctx f;
    unfold_ctx u;
    memset(&f, 0, sizeof f), memset(&u, 0, sizeof u);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KiO!nniKKnKinn|KK", p_conv_forward_kw, &src, &kind, &PyTuple_Type, &geometry, &c0, &cc, &beta, &wp, &wup, &m, &op, &out_kind, &out_c, &co0, &given_units, &given_inv))
        return NULL;
    if (!given_units != !given_inv) {
        PyErr_SetString(PyExc_ValueError, "p_conv_forward: units and inv go together");
        return NULL;
    }
    if (!read_geom(geometry, &u.g)) return NULL;
    const conv_geom *g = &u.g;
    if (c0 < 0 || cc < 0 || c0 + cc > g->c || m < 0 || co0 < 0 || co0 + m > out_c) {
        PyErr_SetString(PyExc_ValueError, "p_conv_forward: channels out of range");
        return NULL;
    }
    const Py_ssize_t cols = g->n * g->ho * g->wo, K = cc * g->kh * g->kw, blocks = (m + MR - 1) / MR;
    u.x = (const char *)(uintptr_t)src, u.kind = kind, u.beta = beta, u.c0 = c0, u.cc = cc;
    const int given = given_units != 0;
    u.units = given ? (double *)(uintptr_t)given_units : (double *)malloc(sizeof(double) * (size_t)(cols + 1));
    u.inv = given ? (double *)(uintptr_t)given_inv : (double *)malloc(sizeof(double) * (size_t)(cols + 1));
    u.top = given ? NULL : malloc((kind ? 8 : 4) * (size_t)(g->n * g->h * g->w + 1));
    double *apack = (double *)calloc((size_t)(blocks * K * MR + 1), sizeof(double));
    if (!u.units || !u.inv || (!given && !u.top) || !apack) {
        if (!given) free(u.units), free(u.inv), free(u.top);
        free(apack);
        return PyErr_NoMemory();
    }
    const double *w = (const double *)(uintptr_t)wp;
    for (Py_ssize_t o = 0; o < m; o++)
        for (Py_ssize_t k = 0; k < K; k++) apack[((o / MR) * K + k) * MR + o % MR] = w[o * K + k];
    f.x = u.x, f.kind = kind, f.out_kind = out_kind, f.fma = fma_ok(), f.g = *g, f.c0 = c0, f.cc = cc;
    f.m = m, f.out_c = out_c, f.co0 = co0, f.K = K;
    f.apack = apack, f.wunits = (const double *)(uintptr_t)wup, f.units = u.units, f.inv = u.inv;
    f.out = (char *)(uintptr_t)op;
    Py_BEGIN_ALLOW_THREADS
    if (!given) {
        parallel_for(g->n * g->h, g->n * g->h * g->w * (cc + 1), unfold_top_range, &u);
        parallel_for(g->n * g->ho, cols * g->kh * g->kw, unfold_units_range, &u);
    }
    if (!u.bad) {
        const Py_ssize_t panels = (cols + PANEL - 1) / PANEL;
        parallel_for(panels, panels * PANEL * K * (m + 1), convf_range, &f);
    }
    Py_END_ALLOW_THREADS
    if (!given) free(u.units), free(u.inv), free(u.top);
    free(apack);
    if (f.bad) return PyErr_NoMemory();
    return PyBool_FromLong(!u.bad);
}

/* p_conv_weight_grad(src, kind, geometry, gints, m, units, total): a convolution's weight
   gradient as exact integer sums, with no columns in memory (groups of one). total[o, k] (m x
   c kh kw, float64) = the sum over every sample and position of gints[o, n ho wo + l] (the
   output gradient's integers, float64) times the input's window value at (k, n, l) on row k's
   unit (units, c kh kw of them): round(x / unit), as p_unfold's given=1 writes it. A few output
   rows of positions at a time, the window values and the gradient's integers are packed into
   buffers that stay in cache, multiplied there (micro_fma's tile, the positions as its sum),
   and added into each thread's own sums, which are then added together: every sum is of
   integers below 2**53 (the caller's grid), exact in any order, so the bits are torch.matmul's
   of the whole columns. The values must be finite. */
typedef struct {
    const char *x;
    int kind, fma;
    conv_geom g;
    Py_ssize_t m, K, kpad, mpad, rows_per;
    const double *gints, *inv;
    double *total;
    int lock, bad;
} convw_ctx;

/* xq[k][q]: the window value of row k at position q of the rows [row0, row0 + rows), on row k's
   unit (zero where the window reads padding): p_unfold's integers, position-major. */
#define PACKW(T)                                                                                  \
    static void packw_##T(const T *x, const conv_geom *g, Py_ssize_t K, Py_ssize_t row0,           \
                          Py_ssize_t rows, Py_ssize_t P, const double *inv, double *xq) {         \
        for (Py_ssize_t k = 0; k < K; k++) {                                                      \
            const Py_ssize_t c = k / (g->kh * g->kw), i = (k / g->kw) % g->kh, j = k % g->kw;       \
            Py_ssize_t xlo, xhi;                                                                  \
            inside(g->wo, g->sw, g->pw, j * g->dw, g->w, &xlo, &xhi);                             \
            for (Py_ssize_t r = 0; r < rows; r++)                                                 \
                window_row_##T(x, g, (row0 + r) / g->ho, c, i, j, (row0 + r) % g->ho, xlo, xhi,   \
                               inv[k], xq + k * P + r * g->wo);                                   \
        }                                                                                         \
    }
CLONED PACKW(float)
CLONED PACKW(double)

/* Chunks [lo, hi) of rows_per output rows: acc[k][o] (kpad x mpad, this thread's) += the sum
   over the chunk's positions of xq[k][q] gq[q][o], MR rows of k by PANEL output channels a
   tile; then acc is added into total under a lock (integer sums: any order). */
static void convw_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    convw_ctx *f = (convw_ctx *)p;
    const conv_geom *g = &f->g;
    const Py_ssize_t L = g->ho * g->wo, Pmax = f->rows_per * g->wo;
    const Py_ssize_t kb = f->kpad / MR, ob = f->mpad / PANEL;
    double *xq = (double *)calloc((size_t)(f->kpad * Pmax + 1), sizeof(double));
    double *gq = (double *)calloc((size_t)(f->mpad * Pmax + 1), sizeof(double));
    double *acc = (double *)calloc((size_t)(f->mpad * f->kpad + 1), sizeof(double));
    double c[MR * PANEL];
    if (!xq || !gq || !acc) {
        free(xq), free(gq), free(acc);
        __atomic_store_n(&f->bad, 1, __ATOMIC_RELAXED);
        return;
    }
    for (Py_ssize_t chunk = lo; chunk < hi; chunk++) {
        const Py_ssize_t row0 = chunk * f->rows_per, total_rows = g->n * g->ho;
        const Py_ssize_t rows = total_rows - row0 < f->rows_per ? total_rows - row0 : f->rows_per;
        const Py_ssize_t P = rows * g->wo;
        if (f->kind) packw_double((const double *)f->x, g, f->K, row0, rows, P, f->inv, xq);
        else packw_float((const float *)f->x, g, f->K, row0, rows, P, f->inv, xq);
        for (Py_ssize_t o = 0; o < f->mpad; o++) { /* gq[o / PANEL][q][o % PANEL] */
            double *d = gq + (o / PANEL) * P * PANEL + o % PANEL;
            for (Py_ssize_t r = 0; r < rows; r++) {
                const Py_ssize_t n = (row0 + r) / g->ho, oy = (row0 + r) % g->ho;
                const double *s = f->gints + o * g->n * L + n * L + oy * g->wo;
                for (Py_ssize_t ox = 0; ox < g->wo; ox++) d[(r * g->wo + ox) * PANEL] = o < f->m ? s[ox] : 0.0;
            }
        }
        for (Py_ssize_t k = f->K; k < f->kpad; k++)
            for (Py_ssize_t q = 0; q < P; q++) xq[k * P + q] = 0.0;
        for (Py_ssize_t b = 0; b < kb; b++)
            for (Py_ssize_t a = 0; a < ob; a++) {
                if (f->fma) micro_fma(xq + b * MR * P, 1, P, gq + a * P * PANEL, P, c);
                else micro_plain(xq + b * MR * P, 1, P, gq + a * P * PANEL, P, c);
                for (int r = 0; r < MR; r++)
                    for (int q = 0; q < PANEL; q++) acc[(b * MR + r) * f->mpad + a * PANEL + q] += c[r * PANEL + q];
            }
    }
    while (__atomic_test_and_set(&f->lock, __ATOMIC_ACQUIRE)) {
    }
    for (Py_ssize_t o = 0; o < f->m; o++)
        for (Py_ssize_t k = 0; k < f->K; k++) f->total[o * f->K + k] += acc[k * f->mpad + o];
    __atomic_clear(&f->lock, __ATOMIC_RELEASE);
    free(xq), free(gq), free(acc);
}

static char *p_conv_weight_grad_kw[] = {"src", "kind", "geometry", "gints", "m", "units", "total", NULL};
PyObject *p_conv_weight_grad(PyObject *module, PyObject *args, PyObject *kwargs) {
    unsigned long long src, gp, up, tp;
    int kind;
    Py_ssize_t m;
    PyObject *geometry;
    convw_ctx f;
    memset(&f, 0, sizeof f);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KiO!KnKK", p_conv_weight_grad_kw, &src, &kind, &PyTuple_Type, &geometry, &gp, &m, &up, &tp))
        return NULL;
    if (!read_geom(geometry, &f.g)) return NULL;
    const conv_geom *g = &f.g;
    if (m < 0) {
        PyErr_SetString(PyExc_ValueError, "p_conv_weight_grad: m out of range");
        return NULL;
    }
    f.x = (const char *)(uintptr_t)src, f.kind = kind, f.fma = fma_ok(), f.m = m;
    f.K = g->c * g->kh * g->kw, f.kpad = (f.K + MR - 1) / MR * MR, f.mpad = (m + PANEL - 1) / PANEL * PANEL;
    const Py_ssize_t want = f.K > 512 ? (Py_ssize_t)(131072 / f.K) : 256; /* xq: about 1 MB */
    f.rows_per = g->wo >= want ? 1 : want / (g->wo ? g->wo : 1);
    f.gints = (const double *)(uintptr_t)gp, f.total = (double *)(uintptr_t)tp;
    const double *units = (const double *)(uintptr_t)up;
    double *inv = (double *)malloc(sizeof(double) * (size_t)(f.K + 1));
    if (!inv) return PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < f.K; k++) inv[k] = 1.0 / units[k];
    for (Py_ssize_t i = 0; i < m * f.K; i++) f.total[i] = 0.0;
    f.inv = inv;
    const Py_ssize_t chunks = (g->n * g->ho + f.rows_per - 1) / f.rows_per;
    Py_BEGIN_ALLOW_THREADS
    if (g->n * g->ho * g->wo > 0) parallel_for(chunks, g->n * g->ho * g->wo * f.K * (m + 1) / 8, convw_range, &f);
    Py_END_ALLOW_THREADS
    free(inv);
    if (f.bad) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* p_lstm_step and p_lstm_step_backward: one LSTM time step whole but for the recurrent product,
   for recurrent.py's loop (cells.py). The step takes the product of the integers (float64, rows
   x columns) with its units (ua per row, ub per column) and scales and rounds it as p_scale
   does, runs p_lstm_cell (p_lstm_cell_backward) on it, and cuts the result the next product
   takes (the hidden state forward, the gates' gradients backward) into integers on each row's
   unit, as p_split's axis 0 does: the same operations as the separate kernels, in one call.
   Each returns False where the cut met a value not finite (the caller then cuts it its own
   way). */
typedef struct {
    int kind, beta, bad;
    Py_ssize_t H;
    const double *prod, *ua, *ub;
    const char *bias, *gx, *c, *dy, *dh, *dc, *act, *tanh_c, *c_prev;
    char *act_out, *c_out, *tanh_out, *h_out, *dgates, *dc_out;
    double *ints, *units;
} lstm_step_ctx;

#define LSTM_STEP(T)                                                                                        \
    static int lstm_step_##T(const lstm_step_ctx *s, Py_ssize_t lo, Py_ssize_t hi, T *buf) {               \
        const Py_ssize_t H = s->H, G = 4 * H, n = hi - lo;                                                 \
        int ok = 1;                                                                                         \
        for (Py_ssize_t r = 0; r < n; r++) {                                                                \
            const double a = s->ua[lo + r], *pr = s->prod + (lo + r) * G;                                   \
            for (Py_ssize_t j = 0; j < G; j++) buf[r * G + j] = (T)(pr[j] * (a * s->ub[j]));               \
        }                                                                                                   \
        lstm_forward_##T(0, n, H, buf, (const T *)s->bias, (const T *)s->gx + lo * G,                      \
                         (const T *)s->c + lo * H, (T *)s->act_out + lo * G, (T *)s->c_out + lo * H,      \
                         (T *)s->tanh_out + lo * H, (T *)s->h_out + lo * H);                              \
        for (Py_ssize_t r = lo; r < hi; r++)                                                               \
            ok &= split_block_##T((const T *)s->h_out + r * H, 1, H, H, s->beta, 0, 0, s->ints + r * H,   \
                                  s->units + r, buf);                                                      \
        return ok;                                                                                          \
    }                                                                                                       \
    static int lstm_step_back_##T(const lstm_step_ctx *s, Py_ssize_t lo, Py_ssize_t hi, T *buf) {          \
        const Py_ssize_t H = s->H, G = 4 * H, n = hi - lo;                                                 \
        const T *dh = s->dh ? (const T *)s->dh + lo * H : NULL;                                            \
        int ok = 1;                                                                                         \
        if (s->prod) {                                                                                      \
            for (Py_ssize_t r = 0; r < n; r++) {                                                            \
                const double a = s->ua[lo + r], *pr = s->prod + (lo + r) * H;                               \
                for (Py_ssize_t j = 0; j < H; j++) buf[r * H + j] = (T)(pr[j] * (a * s->ub[j]));           \
            }                                                                                               \
            dh = buf;                                                                                       \
        }                                                                                                   \
        lstm_backward_##T(0, n, H, s->dy ? (const T *)s->dy + lo * H : NULL, dh,                           \
                          s->dc ? (const T *)s->dc + lo * H : NULL, (const T *)s->act + lo * G,            \
                          (const T *)s->tanh_c + lo * H, (const T *)s->c_prev + lo * H,                    \
                          (T *)s->dgates + lo * G, (T *)s->dc_out + lo * H);                               \
        for (Py_ssize_t r = lo; r < hi; r++)                                                               \
            ok &= split_block_##T((const T *)s->dgates + r * G, 1, G, G, s->beta, 0, 0, s->ints + r * G,  \
                                  s->units + r, buf);                                                      \
        return ok;                                                                                          \
    }
LSTM_STEP(float)
LSTM_STEP(double)

static void lstm_step_range(void *p, Py_ssize_t lo, Py_ssize_t hi, int backward) {
    lstm_step_ctx *s = (lstm_step_ctx *)p;
    const size_t size = s->kind ? 8 : 4;
    void *buf = malloc(size * (size_t)((hi - lo) * 4 * s->H + 1));
    int ok;
    if (!buf) {
        __atomic_store_n(&s->bad, 2, __ATOMIC_RELAXED);
        return;
    }
    if (backward) ok = s->kind ? lstm_step_back_double(s, lo, hi, buf) : lstm_step_back_float(s, lo, hi, buf);
    else ok = s->kind ? lstm_step_double(s, lo, hi, buf) : lstm_step_float(s, lo, hi, buf);
    free(buf);
    if (!ok) __atomic_fetch_or(&s->bad, 1, __ATOMIC_RELAXED);
}
static void lstm_step_fwd_range(void *p, Py_ssize_t lo, Py_ssize_t hi) { lstm_step_range(p, lo, hi, 0); }
static void lstm_step_back_range(void *p, Py_ssize_t lo, Py_ssize_t hi) { lstm_step_range(p, lo, hi, 1); }

static PyObject *step_done(const lstm_step_ctx *s) {
    if (s->bad & 2) return PyErr_NoMemory();
    return PyBool_FromLong(!s->bad);
}

/* p_lstm_step(kind, rows, hidden, beta, prod, ua, ub, bias, gx, c, act, c_out, tanh_c, h, ints,
   units), positional: prod (rows x 4 hidden), ua (rows), ub (4 hidden) float64; bias 0 where
   there is none; ints (rows x hidden) and units (rows) receive h's cut. */
PyObject *p_lstm_step(PyObject *module, PyObject *args) {
    lstm_step_ctx s;
    unsigned long long prod, ua, ub, bias, gx, c, act, c_out, tanh_c, h, ints, units;
    Py_ssize_t rows;
    memset(&s, 0, sizeof s);
    if (!PyArg_ParseTuple(args, "innKKKKKKKKKKKKK", &s.kind, &rows, &s.H, &s.beta, &prod, &ua, &ub, &bias, &gx, &c, &act, &c_out, &tanh_c, &h, &ints, &units))
        return NULL;
    if (!check_ready()) return NULL;
    s.prod = PTR(prod), s.ua = PTR(ua), s.ub = PTR(ub), s.bias = PTR(bias), s.gx = PTR(gx), s.c = PTR(c);
    s.act_out = PTR(act), s.c_out = PTR(c_out), s.tanh_out = PTR(tanh_c), s.h_out = PTR(h);
    s.ints = PTR(ints), s.units = PTR(units);
    Py_BEGIN_ALLOW_THREADS
    parallel_for(rows, rows * s.H * 16, lstm_step_fwd_range, &s);
    Py_END_ALLOW_THREADS
    return step_done(&s);
}

/* p_lstm_step_backward(kind, rows, hidden, beta, prod, ua, ub, dh, dy, dc, act, tanh_c, c_prev,
   dgates, dc_out, ints, units), positional: the incoming hidden gradient is prod (rows x
   hidden, float64) scaled by ua (rows) and ub (hidden) where prod is not 0, else dh (0: none);
   dy and dc may be 0; ints (rows x 4 hidden) and units (rows) receive the gates' gradients' cut. */
PyObject *p_lstm_step_backward(PyObject *module, PyObject *args) {
    lstm_step_ctx s;
    unsigned long long prod, ua, ub, dh, dy, dc, act, tanh_c, c_prev, dgates, dc_out, ints, units;
    Py_ssize_t rows;
    memset(&s, 0, sizeof s);
    if (!PyArg_ParseTuple(args, "innKKKKKKKKKKKKKK", &s.kind, &rows, &s.H, &s.beta, &prod, &ua, &ub, &dh, &dy, &dc, &act, &tanh_c, &c_prev, &dgates, &dc_out, &ints, &units))
        return NULL;
    if (!check_ready()) return NULL;
    s.prod = PTR(prod), s.ua = PTR(ua), s.ub = PTR(ub), s.dh = PTR(dh), s.dy = PTR(dy), s.dc = PTR(dc);
    s.act = PTR(act), s.tanh_c = PTR(tanh_c), s.c_prev = PTR(c_prev), s.dgates = PTR(dgates);
    s.dc_out = PTR(dc_out), s.ints = PTR(ints), s.units = PTR(units);
    Py_BEGIN_ALLOW_THREADS
    parallel_for(rows, rows * s.H * 8, lstm_step_back_range, &s);
    Py_END_ALLOW_THREADS
    return step_done(&s);
}
