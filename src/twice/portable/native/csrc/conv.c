/* Portable mode's convolution kernels (twice.portable.ops.conv):

   p_unfold            a convolution's input windows as integers on their rows' given grid
   p_fold_scale        integer columns folded back onto the input, scaled and rounded once
   p_conv_forward      a convolution's forward, columns unfolded and multiplied in cache
   p_conv_weight_grad  a convolution's weight gradient, exact integer sums in cache

   The input's windows are unfolded straight into integers on their grid, and an integer product
   folded back onto the input, scaled and rounded, each in one pass where torch's unfold,
   p_split, fold, the scaling and the rounding took five. The values are those of the Python
   steps (unfold's zeros where a window leaves the input, then p_split's integers; fold's sums of
   integers, exact in any order, then p_scale's product and rounding), so the two routes give the
   same bits and tests hold them together. */

#include "portable.h"

/* The geometry tuple (n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo): the input's shape,
   the kernel's, the stride, padding and dilation, the output's height and width. */
typedef struct {
    Py_ssize_t n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo;
} conv_geom;

/* PyArg "O&" converter of the geometry tuple. */
static int geometry(PyObject *t, void *out) {
    conv_geom *g = (conv_geom *)out;
    if (!PyTuple_Check(t)) {
        PyErr_SetString(PyExc_TypeError, "geometry: a tuple");
        return 0;
    }
    if (!PyArg_ParseTuple(t,
                          "nnnnnnnnnnnnnn;geometry: (n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, "
                          "ho, wo)",
                          &g->n, &g->c, &g->h, &g->w, &g->kh, &g->kw, &g->sh, &g->sw, &g->ph,
                          &g->pw, &g->dh, &g->dw, &g->ho, &g->wo))
        return 0;
    if (g->n < 0 || g->c < 0 || g->h < 0 || g->w < 0 || g->kh < 1 || g->kw < 1 || g->sh < 1 ||
        g->sw < 1 || g->ph < 0 || g->pw < 0 || g->dh < 1 || g->dw < 1 || g->ho < 0 || g->wo < 0) {
        PyErr_SetString(PyExc_ValueError, "convolution geometry out of range");
        return 0;
    }
    return 1;
}

/* The outputs [*lo, *hi) of `out` along one axis whose input index o * s - p + off lies in
   [0, size): the others read the padding's zeros. */
static inline void inside(Py_ssize_t out, Py_ssize_t s, Py_ssize_t p, Py_ssize_t off,
                          Py_ssize_t size, Py_ssize_t *lo, Py_ssize_t *hi) {
    const Py_ssize_t a = p - off, b = size - 1 + p - off;
    Py_ssize_t l = a <= 0 ? 0 : (a + s - 1) / s, h = b < 0 ? 0 : b / s + 1;
    if (h > out) h = out;
    if (l > h) l = h;
    *lo = l, *hi = h;
}

/* The matrix tile of the products: MR rows of one operand by PANEL columns of the other. */
#define PANEL 8
#define MR 4

/* A panel's run of PANEL values as one vector (GCC's vector extensions: the widest vectors of
   the function's target take them, AVX-512 one register), and round_even's operations on it:
   the same IEEE operations on each lane as on one double, so the same bits. */
typedef double run_d __attribute__((vector_size(PANEL * sizeof(double))));
typedef float run_f __attribute__((vector_size(PANEL * sizeof(float))));
typedef int64_t run_l __attribute__((vector_size(PANEL * sizeof(int64_t))));

STAGE void load8_float(const float *s, run_d *x) {
    run_f f;
    memcpy(&f, s, sizeof f);
    *x = __builtin_convertvector(f, run_d);
}
STAGE void load8_double(const double *s, run_d *x) { memcpy(x, s, sizeof *x); }

/* dst[q] = round_even(x[q] * iv[q]) for q < PANEL. */
STAGE void round_run(const run_d *x, const double *iv, double *dst) {
    run_d inv;
    memcpy(&inv, iv, sizeof inv);
    const double m = 6755399441055744.0;
    const run_d magic = {m, m, m, m, m, m, m, m}; /* PANEL lanes */
    const run_l bit = {INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN,
                       INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN};
    const run_d v = *x * inv, r = (v + magic) - magic;
    const run_d out = (run_d)(((run_l)r & ~bit) | ((run_l)v & bit)); /* copysign(r, v) */
    memcpy(dst, &out, sizeof out);
}

#define T float
#define U uint32_t
#define INF INF_F32
#define TYPED(name) name##_float
#include "conv_typed.h"
#undef T
#undef U
#undef INF
#undef TYPED

#define T double
#define U uint64_t
#define INF INF_F64
#define TYPED(name) name##_double
#include "conv_typed.h"
#undef T
#undef U
#undef INF
#undef TYPED

/* The input's elements, and whether a buffer holds them. */
static Py_ssize_t input_count(const conv_geom *g) { return g->n * g->c * g->h * g->w; }

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
    if (u->kind)
        unfold_top_double((const double *)u->x, &u->g, u->c0, u->cc, (uint64_t *)u->top, lo, hi);
    else
        unfold_top_float((const float *)u->x, &u->g, u->c0, u->cc, (uint32_t *)u->top, lo, hi);
}

static void unfold_units_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    unfold_ctx *u = (unfold_ctx *)p;
    const int bad = u->kind ? unfold_units_double((const uint64_t *)u->top, &u->g, u->beta,
                                                  u->units, u->inv, lo, hi) >= INF_F64
                            : unfold_units_float((const uint32_t *)u->top, &u->g, u->beta, u->units,
                                                 u->inv, lo, hi) >= INF_F32;
    if (bad) __atomic_fetch_or(&u->bad, 1, __ATOMIC_RELAXED);
}

static void unfold_rows_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    unfold_ctx *u = (unfold_ctx *)p;
    if (u->kind)
        unfold_rows_double((const double *)u->x, &u->g, u->c0, u->inv, u->ints, lo, hi);
    else
        unfold_rows_float((const float *)u->x, &u->g, u->c0, u->inv, u->ints, lo, hi);
}

/* p_unfold(src, geometry, ints, units): every channel's columns of the contiguous (n, c, h, w)
   input src, unfold's (c kh kw, n ho wo) matrix, as float64 integers in ints on each row's unit
   read from units (c kh kw of them), as p_split's given=1; the values are taken to be finite.
   (p_conv_forward cuts each column on its own unit itself, in cache.) */
static PyObject *p_unfold(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"src", "geometry", "ints", "units", NULL};
    buffer_t src, ints, units;
    unfold_ctx u;
    memset(&u, 0, sizeof u);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&O&O&", kw, buffer, &src, geometry, &u.g,
                                     buffer, &ints, buffer, &units))
        return NULL;
    const conv_geom *g = &u.g;
    const Py_ssize_t rows = g->c * g->kh * g->kw, cols = g->n * g->ho * g->wo;
    if (!buffer_holds("p_unfold", "src", &src, input_count(g), ANY_KIND) ||
        !buffer_holds("p_unfold", "ints", &ints, rows * cols, KIND_F64) ||
        !buffer_holds("p_unfold", "units", &units, rows, KIND_F64))
        return NULL;
    u.x = src.data, u.kind = src.kind, u.cc = g->c;
    u.units = F64(units), u.ints = F64(ints);
    u.inv = (double *)malloc(sizeof(double) * (size_t)(rows + 1));
    if (!u.inv) return PyErr_NoMemory();
    for (Py_ssize_t r = 0; r < rows; r++) u.inv[r] = 1.0 / u.units[r];
    Py_BEGIN_ALLOW_THREADS
    parallel_for(rows, rows * cols, unfold_rows_range, &u);
    Py_END_ALLOW_THREADS
    free(u.inv);
    Py_RETURN_NONE;
}

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
#pragma GCC ivdep
                    for (Py_ssize_t ox = 0; ox < g->wo; ox++) a[ox] += s[ox];
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
        const double ua = f->ua, ub = f->ub[n];
        for (Py_ssize_t y = 0; y < g->h; y++) {
            const double *a = acc + (y + g->ph) * wp + g->pw;
            const Py_ssize_t at = (plane * g->h + y) * g->w;
            const double s = ua * ub;
            const int band = in_band(ua, ub, ub); /* scale_by's first branch */
            if (f->ok) {
                double *o = (double *)f->out + at;
                for (Py_ssize_t v = 0; v < g->w; v++)
                    o[v] = band ? (a[v] + 0.0) * s : scale_by(a[v] + 0.0, ua, ub);
            } else {
                float *o = (float *)f->out + at;
                for (Py_ssize_t v = 0; v < g->w; v++)
                    o[v] = (float)(band ? (a[v] + 0.0) * s : scale_by(a[v] + 0.0, ua, ub));
            }
        }
    }
    free(acc);
}

/* p_fold_scale(cols, geometry, unit_a, unit_b, out): fold's sums of the integer columns cols
   (float64, (n, c kh kw, ho wo) contiguous) onto each (n, c) plane of the padded input, exact in
   any order, the padding cropped, each sum times unit_a * unit_b[n] rounded once into out
   ((n, c, h, w), float32 or float64). */
static PyObject *p_fold_scale(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"cols", "geometry", "unit_a", "unit_b", "out", NULL};
    buffer_t cols, ub, out;
    fold_ctx f;
    memset(&f, 0, sizeof f);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&dO&O&", kw, buffer, &cols, geometry, &f.g,
                                     &f.ua, buffer, &ub, buffer, &out))
        return NULL;
    const conv_geom *g = &f.g;
    if ((g->ho - 1) * g->sh + (g->kh - 1) * g->dh >= g->h + 2 * g->ph ||
        (g->wo - 1) * g->sw + (g->kw - 1) * g->dw >= g->w + 2 * g->pw) {
        PyErr_SetString(PyExc_ValueError, "p_fold_scale: the windows leave the padded input");
        return NULL;
    }
    const Py_ssize_t count = g->n * g->c * g->kh * g->kw * g->ho * g->wo;
    if (!buffer_holds("p_fold_scale", "cols", &cols, count, KIND_F64) ||
        !buffer_holds("p_fold_scale", "unit_b", &ub, g->n, KIND_F64) ||
        !buffer_holds("p_fold_scale", "out", &out, input_count(g), ANY_KIND))
        return NULL;
    f.cols = F64(cols), f.ub = F64(ub), f.out = out.data, f.ok = out.kind;
    Py_BEGIN_ALLOW_THREADS
    parallel_for(g->n * g->c, count, fold_range, &f);
    Py_END_ALLOW_THREADS
    if (f.bad) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* c[r][q] = the sum over k of a(k, r) b[k][q], for MR rows and PANEL columns, a(k, r) at
   a[k * as + r * ar]: exact integer arithmetic, so the order and the fused multiply-adds change
   no bit. */
static void micro_plain(const double *a, Py_ssize_t as, Py_ssize_t ar, const double *b,
                        Py_ssize_t K, double *c) {
    double acc[MR][PANEL] = {{0}};
    for (Py_ssize_t k = 0; k < K; k++)
        for (int r = 0; r < MR; r++)
            for (int q = 0; q < PANEL; q++) acc[r][q] += a[k * as + r * ar] * b[k * PANEL + q];
    memcpy(c, acc, sizeof acc);
}

/* micro_fma: the same sums with AVX2's fused multiply-adds, taken where the CPU has them (in a
   TWICE_NO_CLONES build, only where the compiler's target has them: the clone tests then hold
   micro_plain's bits to the dispatched build's). */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) &&                             \
    (!defined(TWICE_NO_CLONES) || (defined(__AVX2__) && defined(__FMA__)))
#include <immintrin.h>
__attribute__((target("avx2,fma"))) static void
micro_fma(const double *a, Py_ssize_t as, Py_ssize_t ar, const double *b, Py_ssize_t K, double *c) {
    __m256d c00 = _mm256_setzero_pd(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
            c30 = c00, c31 = c00;
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
static void micro_fma(const double *a, Py_ssize_t as, Py_ssize_t ar, const double *b, Py_ssize_t K,
                      double *c) {
    micro_plain(a, as, ar, b, K, c);
}
static int fma_ok(void) { return 0; }
#endif

/* c = the MR x PANEL tile's sums, by micro_fma where the CPU has it. */
static inline void micro(int fma, const double *a, Py_ssize_t as, Py_ssize_t ar, const double *b,
                         Py_ssize_t K, double *c) {
    if (fma)
        micro_fma(a, as, ar, b, K, c);
    else
        micro_plain(a, as, ar, b, K, c);
}

/* Two MR-row tiles at once (rows a0 and a1, both against the same PANEL columns), c0 and c1 as
   micro's: with AVX-512 (fma 2) each k is one 8-wide load and eight fused multiply-adds, the
   same exact integer sums; elsewhere micro twice. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) &&                             \
    (!defined(TWICE_NO_CLONES) || defined(__AVX512F__))
#include <immintrin.h>
__attribute__((target("avx512f"))) static void micro512(const double *a0, const double *a1,
                                                        Py_ssize_t as, Py_ssize_t ar,
                                                        const double *b, Py_ssize_t K, double *c0,
                                                        double *c1) {
    __m512d acc[2 * MR];
    for (int r = 0; r < 2 * MR; r++) acc[r] = _mm512_setzero_pd();
    for (Py_ssize_t k = 0; k < K; k++) {
        const __m512d bv = _mm512_loadu_pd(b + k * PANEL);
        const double *x0 = a0 + k * as, *x1 = a1 + k * as;
        for (int r = 0; r < MR; r++) {
            acc[r] = _mm512_fmadd_pd(_mm512_set1_pd(x0[r * ar]), bv, acc[r]);
            acc[MR + r] = _mm512_fmadd_pd(_mm512_set1_pd(x1[r * ar]), bv, acc[MR + r]);
        }
    }
    for (int r = 0; r < MR; r++)
        _mm512_storeu_pd(c0 + r * PANEL, acc[r]), _mm512_storeu_pd(c1 + r * PANEL, acc[MR + r]);
}
static int wide_ok(void) { return __builtin_cpu_supports("avx512f") ? 2 : fma_ok(); }
#else
static void micro512(const double *a0, const double *a1, Py_ssize_t as, Py_ssize_t ar,
                     const double *b, Py_ssize_t K, double *c0, double *c1) {
    micro_plain(a0, as, ar, b, K, c0), micro_plain(a1, as, ar, b, K, c1);
}
static int wide_ok(void) { return fma_ok(); }
#endif

/* WIDE rows by PANEL columns, the rows' integers packed WIDE to a k (a[k * WIDE + r]):
   c[q * WIDE + r] = the sum over k of a[k * WIDE + r] b[k * PANEL + q]. With AVX-512 (fma 2)
   each k is two 8-wide loads of the rows and sixteen fused multiply-adds by the columns'
   values broadcast, 1.6 times micro512's multiply-adds a load (elsewhere convf_range takes
   micro2's and micro's row tiles). The same exact integer sums either way. */
#define WIDE 16
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) &&                             \
    (!defined(TWICE_NO_CLONES) || defined(__AVX512F__))
#include <immintrin.h>
__attribute__((target("avx512f"))) static void micro_wide512(const double *a, const double *b,
                                                             Py_ssize_t K, double *c) {
    __m512d acc[2 * PANEL];
    for (int r = 0; r < 2 * PANEL; r++) acc[r] = _mm512_setzero_pd();
    for (Py_ssize_t k = 0; k < K; k++) {
        const __m512d lo = _mm512_loadu_pd(a + k * WIDE), hi = _mm512_loadu_pd(a + k * WIDE + 8);
        const double *bk = b + k * PANEL;
        for (int q = 0; q < PANEL; q++) {
            const __m512d v = _mm512_set1_pd(bk[q]);
            acc[2 * q] = _mm512_fmadd_pd(lo, v, acc[2 * q]);
            acc[2 * q + 1] = _mm512_fmadd_pd(hi, v, acc[2 * q + 1]);
        }
    }
    for (int q = 0; q < PANEL; q++)
        _mm512_storeu_pd(c + q * WIDE, acc[2 * q]),
            _mm512_storeu_pd(c + q * WIDE + 8, acc[2 * q + 1]);
}
#else
static void micro_wide512(const double *a, const double *b, Py_ssize_t K, double *c) {
    (void)a, (void)b, (void)K, (void)c;
}
#endif

/* micro2's two MR-row tiles against 2 PANEL columns (b[k * 2 PANEL + q]), c0 and c1 then
   MR x 2 PANEL each (c[r * 2 PANEL + q]): each k two 8-wide loads and sixteen fused
   multiply-adds, 1.6 times micro512's a load. AVX-512 only (fma 2): the caller takes PANEL
   columns elsewhere. The same exact integer sums. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) &&                             \
    (!defined(TWICE_NO_CLONES) || defined(__AVX512F__))
#include <immintrin.h>
__attribute__((target("avx512f"))) static void micro_cols512(const double *a0, const double *a1,
                                                             Py_ssize_t as, Py_ssize_t ar,
                                                             const double *b, Py_ssize_t K,
                                                             double *c0, double *c1) {
    __m512d acc[4 * MR];
    for (int r = 0; r < 4 * MR; r++) acc[r] = _mm512_setzero_pd();
    for (Py_ssize_t k = 0; k < K; k++) {
        const __m512d lo = _mm512_loadu_pd(b + k * 2 * PANEL);
        const __m512d hi = _mm512_loadu_pd(b + k * 2 * PANEL + 8);
        const double *x0 = a0 + k * as, *x1 = a1 + k * as;
        for (int r = 0; r < MR; r++) {
            const __m512d v0 = _mm512_set1_pd(x0[r * ar]), v1 = _mm512_set1_pd(x1[r * ar]);
            acc[2 * r] = _mm512_fmadd_pd(v0, lo, acc[2 * r]);
            acc[2 * r + 1] = _mm512_fmadd_pd(v0, hi, acc[2 * r + 1]);
            acc[2 * MR + 2 * r] = _mm512_fmadd_pd(v1, lo, acc[2 * MR + 2 * r]);
            acc[2 * MR + 2 * r + 1] = _mm512_fmadd_pd(v1, hi, acc[2 * MR + 2 * r + 1]);
        }
    }
    for (int r = 0; r < MR; r++) {
        _mm512_storeu_pd(c0 + r * 2 * PANEL, acc[2 * r]);
        _mm512_storeu_pd(c0 + r * 2 * PANEL + 8, acc[2 * r + 1]);
        _mm512_storeu_pd(c1 + r * 2 * PANEL, acc[2 * MR + 2 * r]);
        _mm512_storeu_pd(c1 + r * 2 * PANEL + 8, acc[2 * MR + 2 * r + 1]);
    }
}
#else
static void micro_cols512(const double *a0, const double *a1, Py_ssize_t as, Py_ssize_t ar,
                          const double *b, Py_ssize_t K, double *c0, double *c1) {
    (void)a0, (void)a1, (void)as, (void)ar, (void)b, (void)K, (void)c0, (void)c1;
}
#endif

/* micro for the tiles of rows a0 and a1 (the next MR rows), by micro512 where fma is 2. */
static inline void micro2(int fma, const double *a0, const double *a1, Py_ssize_t as, Py_ssize_t ar,
                          const double *b, Py_ssize_t K, double *c0, double *c1) {
    if (fma == 2) {
        micro512(a0, a1, as, ar, b, K, c0, c1);
    } else {
        micro(fma, a0, as, ar, b, K, c0);
        micro(fma, a1, as, ar, b, K, c1);
    }
}

typedef struct {
    const char *x;
    int kind, out_kind, fma;
    conv_geom g;
    Py_ssize_t c0, cc, m, out_c, co0, K;
    const double *apack, *wunits, *units, *inv;
    char *out;
    int bad;
} convf_ctx;

/* Panels [lo, hi): PANEL consecutive columns each (of n ho wo; a panel may run over rows). */
static void convf_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    convf_ctx *f = (convf_ctx *)p;
    const conv_geom *g = &f->g;
    const Py_ssize_t L = g->ho * g->wo, cols = g->n * L, blocks = (f->m + WIDE - 1) / WIDE;
    double *bp = (double *)malloc(sizeof(double) * (size_t)(f->K * PANEL + 1));
    double inv[PANEL], c[WIDE * PANEL];
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
        /* whole: PANEL columns of one sample, consecutive in out; their units' range */
        const int whole = count == PANEL && nq[PANEL - 1] == nq[0];
        double ub[PANEL], lo_u, hi_u;
        for (int q = 0; q < PANEL; q++) ub[q] = f->units[col + (q < count ? q : 0)];
        unit_bounds(ub, PANEL, &lo_u, &hi_u);
        if (f->kind)
            pack_panel_double((const double *)f->x, g, f->c0, f->cc, nq, oyq, oxq, count, row, inv,
                              bp);
        else
            pack_panel_float((const float *)f->x, g, f->c0, f->cc, nq, oyq, oxq, count, row, inv,
                             bp);
        for (Py_ssize_t b = 0; b < blocks; b++) {
            const double *a = f->apack + b * f->K * WIDE;
            const Py_ssize_t held = f->m - b * WIDE; /* rows of this block, WIDE but the last */
            /* with AVX-512 a WIDE tile (c[q][r]); else, or for a last block of at most 2 MR
               rows, micro2's and micro's MR-row tiles over the rows held (c[r][q]) */
            const int narrow = f->fma != 2 || held <= 2 * MR;
            if (!narrow) micro_wide512(a, bp, f->K, c);
            for (Py_ssize_t r0 = 0; narrow && r0 < held && r0 < WIDE; r0 += 2 * MR) {
                if (r0 + MR < held)
                    micro2(f->fma, a + r0, a + r0 + MR, WIDE, 1, bp, f->K, c + r0 * PANEL,
                           c + (r0 + MR) * PANEL);
                else
                    micro(f->fma, a + r0, WIDE, 1, bp, f->K, c + r0 * PANEL);
            }
            const Py_ssize_t rs = narrow ? PANEL : 1, qs = narrow ? 1 : WIDE;
            /* one run of a sample's columns, every scale in the band: scale_by's first branch
               without a test an element, stored as a run */
            int fast = whole;
            for (int r = 0; fast && r < WIDE && b * WIDE + r < f->m; r++)
                fast = in_band(f->wunits[b * WIDE + r], lo_u, hi_u);
            for (int r = 0; fast && r < WIDE && b * WIDE + r < f->m; r++) {
                const Py_ssize_t o = b * WIDE + r;
                const double unit = f->wunits[o];
                const Py_ssize_t at = (nq[0] * f->out_c + f->co0 + o) * L + lq[0];
                double v[PANEL];
                for (int q = 0; q < PANEL; q++) v[q] = (c[r * rs + q * qs] + 0.0) * (unit * ub[q]);
                if (f->out_kind)
                    memcpy((double *)f->out + at, v, sizeof v);
                else
                    for (int q = 0; q < PANEL; q++) ((float *)f->out)[at + q] = (float)v[q];
            }
            if (fast) continue;
            for (int r = 0; r < WIDE && b * WIDE + r < f->m; r++) {
                const Py_ssize_t o = b * WIDE + r;
                const double unit = f->wunits[o];
                for (Py_ssize_t q = 0; q < count; q++)
                    store(f->out, f->out_kind, (nq[q] * f->out_c + f->co0 + o) * L + lq[q],
                          scale_by(c[r * rs + q * qs] + 0.0, unit, f->units[col + q]));
            }
        }
    }
    free(bp);
}

/* p_conv_forward(src, geometry, c0, cc, beta, wints, wunits, m, out, out_c, co0, units=None,
   inv=None): a convolution's forward with no columns in memory. Each column's unit comes from
   its window's largest magnitude (or from units, with their inverses inv); then, PANEL
   consecutive columns at a time (a panel runs on into the next output row where rows are short),
   the panel's integers are unfolded into a buffer that stays in the first-level cache and
   multiplied there by the m rows of the weight's integers wints ((m, cc kh kw), float64, units
   wunits), each sum times (wunit * column unit) rounded once into out ((n, out_c, ho wo)),
   channels [co0, co0 + m). The integers are unfold's values cut as p_split cuts them, and the
   sums of integer products below 2**53 are exact in any order and with or without fused
   multiply-adds: the bits of torch.matmul of the columns followed by p_scale.
   Returns False where a window holds a value not finite (nothing written then). */
static PyObject *p_conv_forward(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"src", "geometry", "c0",    "cc",  "beta",  "wints", "wunits",
                         "m",   "out",      "out_c", "co0", "units", "inv",   NULL};
    buffer_t src, wints, wunits, out, given_units = {NULL, 0, -1}, given_inv = {NULL, 0, -1};
    int beta;
    Py_ssize_t c0, cc, m, out_c, co0;
    convf_ctx f;
    unfold_ctx u;
    memset(&f, 0, sizeof f), memset(&u, 0, sizeof u);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&nniO&O&nO&nn|O&O&", kw, buffer, &src,
                                     geometry, &u.g, &c0, &cc, &beta, buffer, &wints, buffer,
                                     &wunits, &m, buffer, &out, &out_c, &co0, optional_buffer,
                                     &given_units, optional_buffer, &given_inv))
        return NULL;
    if ((given_units.kind < 0) != (given_inv.kind < 0)) {
        PyErr_SetString(PyExc_ValueError, "p_conv_forward: units and inv go together");
        return NULL;
    }
    const conv_geom *g = &u.g;
    if (c0 < 0 || cc < 0 || c0 + cc > g->c || m < 0 || co0 < 0 || co0 + m > out_c) {
        PyErr_SetString(PyExc_ValueError, "p_conv_forward: channels out of range");
        return NULL;
    }
    const Py_ssize_t cols = g->n * g->ho * g->wo, K = cc * g->kh * g->kw;
    const Py_ssize_t blocks = (m + WIDE - 1) / WIDE;
    const char *k = "p_conv_forward";
    if (!buffer_holds(k, "src", &src, input_count(g), ANY_KIND) ||
        !buffer_holds(k, "wints", &wints, m * K, KIND_F64) ||
        !buffer_holds(k, "wunits", &wunits, m, KIND_F64) ||
        !buffer_holds(k, "out", &out, g->n * out_c * g->ho * g->wo, ANY_KIND) ||
        !buffer_holds(k, "units", &given_units, cols, KIND_F64) ||
        !buffer_holds(k, "inv", &given_inv, cols, KIND_F64))
        return NULL;
    const int kind = src.kind, given = given_units.kind >= 0;
    u.x = src.data, u.kind = kind, u.beta = beta, u.c0 = c0, u.cc = cc;
    const size_t column_bytes = sizeof(double) * (size_t)(cols + 1);
    u.units = given ? F64(given_units) : (double *)malloc(column_bytes);
    u.inv = given ? F64(given_inv) : (double *)malloc(column_bytes);
    u.top = given ? NULL : malloc((kind ? 8 : 4) * (size_t)(g->n * g->h * g->w + 1));
    double *apack = (double *)calloc((size_t)(blocks * K * WIDE + 1), sizeof(double));
    if (!u.units || !u.inv || (!given && !u.top) || !apack) {
        if (!given) free(u.units), free(u.inv), free(u.top);
        free(apack);
        return PyErr_NoMemory();
    }
    const double *w = F64(wints);
    for (Py_ssize_t o = 0; o < m; o++)
        for (Py_ssize_t i = 0; i < K; i++)
            apack[((o / WIDE) * K + i) * WIDE + o % WIDE] = w[o * K + i];
    f.x = u.x, f.kind = kind, f.out_kind = out.kind, f.fma = wide_ok(), f.g = *g, f.c0 = c0;
    f.cc = cc, f.m = m, f.out_c = out_c, f.co0 = co0, f.K = K;
    f.apack = apack, f.wunits = F64(wunits), f.units = u.units, f.inv = u.inv;
    f.out = out.data;
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

typedef struct {
    const char *x;
    int kind, fma;
    conv_geom g;
    Py_ssize_t m, K, kpad, mpad, rows_per, cw;
    const double *gints, *inv;
    double *total;
    int lock, bad;
} convw_ctx;

/* Chunks [lo, hi) of rows_per output rows: acc[k][o] (kpad x mpad, this thread's) += the sum
   over the chunk's positions of xq[k][q] gq[q][o], 2 MR rows of k by cw output channels a tile
   (micro2's PANEL, or micro_cols512's 2 PANEL); then acc is added into total under a lock
   (integer sums: any order). */
static void convw_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    convw_ctx *f = (convw_ctx *)p;
    const conv_geom *g = &f->g;
    const Py_ssize_t L = g->ho * g->wo, Pmax = f->rows_per * g->wo;
    const Py_ssize_t kb = f->kpad / MR, cw = f->cw, ob = f->mpad / cw;
    double *xq = (double *)calloc((size_t)(f->kpad * Pmax + 1), sizeof(double));
    double *gq = (double *)calloc((size_t)(f->mpad * Pmax + 1), sizeof(double));
    double *acc = (double *)calloc((size_t)(f->mpad * f->kpad + 1), sizeof(double));
    double c[2 * MR * 2 * PANEL];
    if (!xq || !gq || !acc) {
        free(xq), free(gq), free(acc);
        __atomic_store_n(&f->bad, 1, __ATOMIC_RELAXED);
        return;
    }
    for (Py_ssize_t chunk = lo; chunk < hi; chunk++) {
        const Py_ssize_t row0 = chunk * f->rows_per, total_rows = g->n * g->ho;
        const Py_ssize_t rows = total_rows - row0 < f->rows_per ? total_rows - row0 : f->rows_per;
        const Py_ssize_t P = rows * g->wo;
        if (f->kind)
            packw_double((const double *)f->x, g, f->K, row0, rows, P, f->inv, xq);
        else
            packw_float((const float *)f->x, g, f->K, row0, rows, P, f->inv, xq);
        for (Py_ssize_t o = 0; o < f->mpad; o++) { /* gq[o / cw][q][o % cw] */
            double *d = gq + (o / cw) * P * cw + o % cw;
            for (Py_ssize_t r = 0; r < rows; r++) {
                const Py_ssize_t n = (row0 + r) / g->ho, oy = (row0 + r) % g->ho;
                const double *s = o < f->m ? f->gints + o * g->n * L + n * L + oy * g->wo : NULL;
                for (Py_ssize_t ox = 0; ox < g->wo; ox++)
                    d[(r * g->wo + ox) * cw] = s ? s[ox] : 0.0;
            }
        }
        for (Py_ssize_t k = f->K; k < f->kpad; k++)
            for (Py_ssize_t q = 0; q < P; q++) xq[k * P + q] = 0.0;
        for (Py_ssize_t b = 0; b < kb; b += 2) {
            const int two = b + 1 < kb;
            for (Py_ssize_t a = 0; a < ob; a++) {
                const double *x0 = xq + b * MR * P, *x1 = xq + (two ? b + 1 : b) * MR * P;
                if (cw != PANEL)
                    micro_cols512(x0, x1, 1, P, gq + a * P * cw, P, c, c + MR * cw);
                else if (two)
                    micro2(f->fma, x0, x1, 1, P, gq + a * P * PANEL, P, c, c + MR * PANEL);
                else
                    micro(f->fma, x0, 1, P, gq + a * P * PANEL, P, c);
                for (int r = 0; r < (two ? 2 : 1) * MR; r++)
                    for (int q = 0; q < cw; q++)
                        acc[(b * MR + r) * f->mpad + a * cw + q] += c[r * cw + q];
            }
        }
    }
    while (__atomic_test_and_set(&f->lock, __ATOMIC_ACQUIRE)) {
    }
    for (Py_ssize_t o = 0; o < f->m; o++)
        for (Py_ssize_t k = 0; k < f->K; k++) f->total[o * f->K + k] += acc[k * f->mpad + o];
    __atomic_clear(&f->lock, __ATOMIC_RELEASE);
    free(xq), free(gq), free(acc);
}

/* p_conv_weight_grad(src, geometry, gints, m, units, total): a convolution's weight gradient as
   exact integer sums, with no columns in memory (groups of one). total[o, k] (m x c kh kw,
   float64) = the sum over every sample and position of gints[o, n ho wo + l] (the output
   gradient's integers, float64) times the input's window value at (k, n, l) on row k's unit
   (units, c kh kw of them): round(x / unit), as p_unfold's given=1 writes it. A few output rows
   of positions at a time, the window values and the gradient's integers are packed into buffers
   that stay in cache, multiplied there (micro_fma's tile, the positions as its sum), and added
   into each thread's own sums, which are then added together: every sum is of integers below
   2**53 (the caller's grid), exact in any order, so the bits are torch.matmul's of the whole
   columns. The values must be finite. */
static PyObject *p_conv_weight_grad(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"src", "geometry", "gints", "m", "units", "total", NULL};
    buffer_t src, gints, units, total;
    Py_ssize_t m;
    convw_ctx f;
    memset(&f, 0, sizeof f);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&O&nO&O&", kw, buffer, &src, geometry, &f.g,
                                     buffer, &gints, &m, buffer, &units, buffer, &total))
        return NULL;
    const conv_geom *g = &f.g;
    if (m < 0) {
        PyErr_SetString(PyExc_ValueError, "p_conv_weight_grad: m out of range");
        return NULL;
    }
    const Py_ssize_t K = g->c * g->kh * g->kw, positions = g->n * g->ho * g->wo;
    const char *k = "p_conv_weight_grad";
    if (!buffer_holds(k, "src", &src, input_count(g), ANY_KIND) ||
        !buffer_holds(k, "gints", &gints, m * positions, KIND_F64) ||
        !buffer_holds(k, "units", &units, K, KIND_F64) ||
        !buffer_holds(k, "total", &total, m * K, KIND_F64))
        return NULL;
    f.x = src.data, f.kind = src.kind, f.fma = wide_ok(), f.m = m;
    f.cw = f.fma == 2 && m > PANEL ? 2 * PANEL : PANEL; /* micro_cols512's width where it pays */
    f.K = K, f.kpad = (K + MR - 1) / MR * MR, f.mpad = (m + f.cw - 1) / f.cw * f.cw;
    const Py_ssize_t want = K > 512 ? (Py_ssize_t)(131072 / K) : 256; /* xq: about 1 MB */
    f.rows_per = g->wo >= want ? 1 : want / (g->wo ? g->wo : 1);
    f.gints = F64(gints), f.total = F64(total);
    const double *unit = F64(units);
    double *inv = (double *)malloc(sizeof(double) * (size_t)(K + 1));
    if (!inv) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < K; i++) inv[i] = 1.0 / unit[i];
    for (Py_ssize_t i = 0; i < m * K; i++) f.total[i] = 0.0;
    f.inv = inv;
    const Py_ssize_t chunks = (g->n * g->ho + f.rows_per - 1) / f.rows_per;
    Py_BEGIN_ALLOW_THREADS
    if (positions > 0) parallel_for(chunks, positions * K * (m + 1) / 8, convw_range, &f);
    Py_END_ALLOW_THREADS
    free(inv);
    if (f.bad) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"p_unfold", KEYWORDS(p_unfold),
     "Portable mode: a convolution's input windows as integers on their rows' given grid."},
    {"p_fold_scale", KEYWORDS(p_fold_scale),
     "Portable mode: integer columns folded onto the input, scaled, rounded once."},
    {"p_conv_forward", KEYWORDS(p_conv_forward),
     "Portable mode: a convolution's forward, columns unfolded panel by panel in cache."},
    {"p_conv_weight_grad", KEYWORDS(p_conv_weight_grad),
     "Portable mode: a convolution's weight gradient as exact integer sums, in cache."},
    {NULL, NULL, 0, NULL},
};

int bind_portable_conv(PyObject *module) { return PyModule_AddFunctions(module, methods); }
