/* Portable mode's float64 matrix product in a fixed order (arithmetic/ordered.py's rule):
   out[i][j] = a[i][0] b[0][j], then + a[i][k] b[k][j] for k = 1, 2, ... in that order, each
   product and each sum one IEEE rounding in float64 (no fused multiply-add: setup.py builds
   with -ffp-contract=off, and the vector loops below spell the multiply and the add apart).

   Every output element is one running sum computed by one thread; the threads, the vector width
   and the blocking only decide which elements are computed together and when, never the
   operations on one element or their order. So every instruction set (AVX-512, AVX2, SSE2, plain
   C) and every thread count gives the bits of ordered.py's torch loop, which tests hold them to.

   The work is blocked as BLAS kernels block it: the right operand packed in panels of NR
   columns, the left in panels of MR rows, KB values of k at a time; a block's running sums wait
   in `out` between blocks of k, which changes no bit.

   p_integer_mm is the same product for operands of integers whose every partial sum is exact
   (arithmetic/exact.py's slices): its sums have one value in any order, so its tiles may fuse
   the multiply and the add, and it gives the bits of torch.matmul, faster than the BLAS torch
   links on some CPUs (docs/performance.md). */

#include "portable.h"

#define MR 6
#define NR 16
#define KB 256

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define X86 1
#endif

/* The MR x NR tile c (row r at c + r * ldc) += the packed panels' products over K values of k:
   ap[k * MR + r] times bp[k * NR + q]. first: the tile starts as the first products (no add). */
static void micro_plain(const double *ap, const double *bp, Py_ssize_t K, int first, double *c,
                        Py_ssize_t ldc) {
    Py_ssize_t k = 0;
    if (first) {
        for (int r = 0; r < MR; r++)
            for (int q = 0; q < NR; q++) c[r * ldc + q] = ap[r] * bp[q];
        k = 1;
    }
    for (; k < K; k++)
        for (int r = 0; r < MR; r++)
            for (int q = 0; q < NR; q++)
                c[r * ldc + q] = c[r * ldc + q] + ap[k * MR + r] * bp[k * NR + q];
}

/* The same tile with one instruction set's vectors of `lanes` doubles: a strip of 2 * lanes
   columns at a time, two vectors a row (AVX-512 the whole tile in one strip). Each vector lane
   is one output's running sum, a multiply and an add apart, as in micro_plain. */
#define MICRO_STRIPS(name, target, vec, lanes, load, store, set1, mul, madd)                       \
    target static void name(const double *ap, const double *bp, Py_ssize_t K, int first,           \
                            double *c, Py_ssize_t ldc) {                                           \
        for (int h = 0; h < NR; h += 2 * (lanes)) {                                                \
            vec acc[MR][2];                                                                        \
            Py_ssize_t k = 0;                                                                      \
            if (first) {                                                                           \
                const vec b0 = load(bp + h), b1 = load(bp + h + (lanes));                          \
                for (int r = 0; r < MR; r++) {                                                     \
                    const vec x = set1(ap[r]);                                                     \
                    acc[r][0] = mul(x, b0), acc[r][1] = mul(x, b1);                                \
                }                                                                                  \
                k = 1;                                                                             \
            } else {                                                                               \
                for (int r = 0; r < MR; r++)                                                       \
                    acc[r][0] = load(c + r * ldc + h),                                             \
                    acc[r][1] = load(c + r * ldc + h + (lanes));                                   \
            }                                                                                      \
            for (; k < K; k++) {                                                                   \
                const vec b0 = load(bp + k * NR + h), b1 = load(bp + k * NR + h + (lanes));        \
                for (int r = 0; r < MR; r++) {                                                     \
                    const vec x = set1(ap[k * MR + r]);                                            \
                    acc[r][0] = madd(acc[r][0], x, b0);                                            \
                    acc[r][1] = madd(acc[r][1], x, b1);                                            \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < MR; r++)                                                           \
                store(c + r * ldc + h, acc[r][0]), store(c + r * ldc + h + (lanes), acc[r][1]);    \
        }                                                                                          \
    }

/* A running sum's step: the multiply and the add apart (ordered), or fused (integers). */
#define SSE2_STEP(acc, x, b) _mm_add_pd(acc, _mm_mul_pd(x, b))
#define AVX2_STEP(acc, x, b) _mm256_add_pd(acc, _mm256_mul_pd(x, b))
#define AVX2_FUSED(acc, x, b) _mm256_fmadd_pd(x, b, acc)
#define AVX512_STEP(acc, x, b) _mm512_add_pd(acc, _mm512_mul_pd(x, b))
#define AVX512_FUSED(acc, x, b) _mm512_fmadd_pd(x, b, acc)

#ifdef X86 /* SSE2: every x86-64 CPU */
MICRO_STRIPS(micro_sse2, , __m128d, 2, _mm_loadu_pd, _mm_storeu_pd, _mm_set1_pd, _mm_mul_pd,
             SSE2_STEP)
#endif

#if defined(X86) && (!defined(TWICE_NO_CLONES) || defined(__AVX2__))
MICRO_STRIPS(micro_avx2, __attribute__((target("avx2"))), __m256d, 4, _mm256_loadu_pd,
             _mm256_storeu_pd, _mm256_set1_pd, _mm256_mul_pd, AVX2_STEP)
MICRO_STRIPS(fused_avx2, __attribute__((target("avx2,fma"))), __m256d, 4, _mm256_loadu_pd,
             _mm256_storeu_pd, _mm256_set1_pd, _mm256_mul_pd, AVX2_FUSED)
#define HAS_AVX2 1
#endif

#if defined(X86) && (!defined(TWICE_NO_CLONES) || defined(__AVX512F__))
MICRO_STRIPS(micro_avx512, __attribute__((target("avx512f"))), __m512d, 8, _mm512_loadu_pd,
             _mm512_storeu_pd, _mm512_set1_pd, _mm512_mul_pd, AVX512_STEP)
MICRO_STRIPS(fused_avx512, __attribute__((target("avx512f"))), __m512d, 8, _mm512_loadu_pd,
             _mm512_storeu_pd, _mm512_set1_pd, _mm512_mul_pd, AVX512_FUSED)
#define HAS_AVX512 1
#endif

/* Whether the CPU fuses multiply-adds (the AVX2 tiles of p_integer_mm). */
static int has_fma(void) {
#if defined(X86) && defined(HAS_AVX2)
    return __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* The widest loop this CPU runs: 3 AVX-512, 2 AVX2, 1 SSE2, 0 plain C. */
static int isa_level(void) {
    static int level = -1;
    if (level < 0) {
        int found = 0;
#ifdef X86
        found = 1;
#ifdef HAS_AVX2
        if (__builtin_cpu_supports("avx2")) found = 2;
#endif
#ifdef HAS_AVX512
        if (__builtin_cpu_supports("avx512f")) found = 3;
#endif
#endif
        level = found;
    }
    return level;
}

/* fused: integer operands (p_integer_mm), whose tiles may fuse the multiply and the add (with
   AVX2, only where the CPU has FMA: product() checks once). */
static void micro(int isa, int fused, const double *ap, const double *bp, Py_ssize_t K, int first,
                  double *c, Py_ssize_t ldc) {
#ifdef HAS_AVX512
    if (isa == 3) {
        (fused ? fused_avx512 : micro_avx512)(ap, bp, K, first, c, ldc);
        return;
    }
#endif
#ifdef HAS_AVX2
    if (isa == 2) {
        (fused ? fused_avx2 : micro_avx2)(ap, bp, K, first, c, ldc);
        return;
    }
#endif
#ifdef X86
    if (isa == 1) {
        micro_sse2(ap, bp, K, first, c, ldc);
        return;
    }
#endif
    micro_plain(ap, bp, K, first, c, ldc);
}

/* A NaN's bits follow the hardware (x86 makes a negative one, ARM and CUDA a positive one):
   every NaN of a product is written as the one quiet NaN torch's `nan` is, as ordered.py's
   loop writes it. */
static void canonical_nans(double *c, Py_ssize_t ldc, Py_ssize_t rows, Py_ssize_t width) {
    for (Py_ssize_t r = 0; r < rows; r++)
        for (Py_ssize_t q = 0; q < width; q++)
            if (c[r * ldc + q] != c[r * ldc + q]) c[r * ldc + q] = NAN;
}

/* One row times a matrix (m = 1: a vector-matrix product, a dot product; a matrix-vector
   product comes here transposed, which changes no operation): columns [j0, j1) of out, each
   its running sum in k's order. Rows of b in place (b_col 1): every k adds its row's products
   into all the columns, a loop each instruction set vectorises over the columns; otherwise
   each column its own running sum, eight at a time. */
CLONED static void row_sums(const double *a, Py_ssize_t a_col, const double *b, Py_ssize_t b_row,
                            Py_ssize_t b_col, Py_ssize_t k, Py_ssize_t j0, Py_ssize_t j1,
                            double *restrict out) {
    if (b_col == 1) {
        const double x0 = a[0];
        for (Py_ssize_t j = j0; j < j1; j++) out[j] = x0 * b[j];
        for (Py_ssize_t kk = 1; kk < k; kk++) {
            const double x = a[kk * a_col], *row = b + kk * b_row;
            for (Py_ssize_t j = j0; j < j1; j++) out[j] = out[j] + x * row[j];
        }
        return;
    }
    for (Py_ssize_t j = j0; j < j1; j += 8) {
        const int w = j1 - j < 8 ? (int)(j1 - j) : 8;
        double acc[8];
        for (int q = 0; q < w; q++) acc[q] = a[0] * b[(j + q) * b_col];
        for (Py_ssize_t kk = 1; kk < k; kk++) {
            const double x = a[kk * a_col];
            for (int q = 0; q < w; q++) acc[q] = acc[q] + x * b[kk * b_row + (j + q) * b_col];
        }
        for (int q = 0; q < w; q++) out[j + q] = acc[q];
    }
}

typedef struct {
    const double *a, *b;
    double *out;
    Py_ssize_t k, n, a_col, b_row, b_col;
} row_ctx;

#define ROW_CHUNK 512

static void row_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const row_ctx *c = (const row_ctx *)p;
    const Py_ssize_t j0 = lo * ROW_CHUNK, j1 = hi * ROW_CHUNK < c->n ? hi * ROW_CHUNK : c->n;
    row_sums(c->a, c->a_col, c->b, c->b_row, c->b_col, c->k, j0, j1, c->out);
    canonical_nans(c->out + j0, 0, 1, j1 - j0);
}

typedef struct {
    const double *a, *b;
    double *out, *packed; /* packed: the right operand's panels of this call (see pack_range) */
    Py_ssize_t m, k, n, mp, np;
    Py_ssize_t a_batch, a_row, a_col, b_batch, b_row, b_col;
    Py_ssize_t z0, k0, kw; /* the call's first batch index, and its block of k: [k0, k0 + kw) */
    Py_ssize_t per_call, group; /* batch entries per call; column panels a task computes */
    int isa, fused, failed;
} mm_ctx;

/* Panels t in [lo, hi) of the right operand (batch z0 + t / np, columns (t % np) * NR on),
   rows k0 .. k0 + kw: packed[t][k][q], zero past the last column. */
static void pack_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const mm_ctx *c = (const mm_ctx *)p;
    for (Py_ssize_t t = lo; t < hi; t++) {
        const Py_ssize_t z = c->b_batch ? c->z0 + t / c->np : 0, j0 = (t % c->np) * NR;
        const Py_ssize_t width = c->n - j0 < NR ? c->n - j0 : NR;
        const double *src = c->b + z * c->b_batch + c->k0 * c->b_row + j0 * c->b_col;
        double *dst = c->packed + t * c->kw * NR;
        for (Py_ssize_t k = 0; k < c->kw; k++) {
            int q = 0;
            for (; q < width; q++) dst[k * NR + q] = src[k * c->b_row + q * c->b_col];
            for (; q < NR; q++) dst[k * NR + q] = 0.0;
        }
    }
}

/* Tasks t in [lo, hi): row panel r = t % (rows' panels of the call) (batch z0 + r / mp, rows
   (r % mp) * MR on) against column panels [g * group, (g + 1) * group), g = t / (row panels):
   the running sums over this call's block of k. Consecutive tasks share their column panels
   (in cache), and a narrow product still makes enough tasks for every thread. */
static void mm_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    mm_ctx *c = (mm_ctx *)p;
    double *ap = (double *)malloc(sizeof(double) * MR * (size_t)c->kw);
    if (!ap) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    double tile[MR * NR];
    const int first = c->k0 == 0, last = c->k0 + c->kw == c->k;
    const Py_ssize_t panels = c->per_call * c->mp;
    Py_ssize_t packed_row = -1;
    for (Py_ssize_t t = lo; t < hi; t++) {
        const Py_ssize_t row = t % panels, g = t / panels;
        const Py_ssize_t zi = row / c->mp, z = c->z0 + zi, i0 = (row % c->mp) * MR;
        const Py_ssize_t rows = c->m - i0 < MR ? c->m - i0 : MR;
        if (row != packed_row) {
            const double *src = c->a + z * c->a_batch + i0 * c->a_row + c->k0 * c->a_col;
            for (Py_ssize_t k = 0; k < c->kw; k++) {
                int r = 0;
                for (; r < rows; r++) ap[k * MR + r] = src[r * c->a_row + k * c->a_col];
                for (; r < MR; r++) ap[k * MR + r] = 0.0;
            }
            packed_row = row;
        }
        double *out = c->out + z * c->m * c->n + i0 * c->n;
        const Py_ssize_t j_end = (g + 1) * c->group < c->np ? (g + 1) * c->group : c->np;
        for (Py_ssize_t j = g * c->group; j < j_end; j++) {
            const Py_ssize_t j0 = j * NR, width = c->n - j0 < NR ? c->n - j0 : NR;
            const double *bp = c->packed + ((c->b_batch ? zi : 0) * c->np + j) * c->kw * NR;
            if (rows == MR && width == NR) { /* a whole tile: its running sums in out itself */
                micro(c->isa, c->fused, ap, bp, c->kw, first, out + j0, c->n);
                if (last) canonical_nans(out + j0, c->n, rows, width);
                continue;
            }
            if (!first) /* an edge tile: through a full-size tile, the valid part copied */
                for (Py_ssize_t r = 0; r < rows; r++)
                    memcpy(tile + r * NR, out + r * c->n + j0, sizeof(double) * width);
            micro(c->isa, c->fused, ap, bp, c->kw, first, tile, NR);
            for (Py_ssize_t r = 0; r < rows; r++)
                memcpy(out + r * c->n + j0, tile + r * NR, sizeof(double) * width);
            if (last) canonical_nans(out + j0, c->n, rows, width);
        }
    }
    free(ap);
}

/* Column panels per task: up to 8 (their packed panels stay in cache while the row panels
   pass), fewer where that would leave less than TASKS tasks to share between the threads. */
#define TASKS 16

static Py_ssize_t column_group(Py_ssize_t row_panels, Py_ssize_t np) {
    Py_ssize_t group = row_panels * np / TASKS;
    return group < 1 ? 1 : group > 8 ? 8 : group;
}

/* out (contiguous float64, batch x m x n) = a @ b for float64 a (batch x m x k) and b (batch x
   k x n) read through their element strides (batch, row, column; a batch stride 0 repeats one
   matrix). k >= 1. fused: integer operands, p_integer_mm. */
static PyObject *product(PyObject *args, PyObject *kwargs, int fused, const char *name) {
    static char *kw[] = {"a", "b", "out", "batch", "m", "k", "n", "a_strides", "b_strides", NULL};
    buffer_t a, b, out;
    Py_ssize_t batch, m, k, n, as[3], bs[3];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&O&nnnn(nnn)(nnn)", kw, buffer, &a, buffer,
                                     &b, buffer, &out, &batch, &m, &k, &n, &as[0], &as[1], &as[2],
                                     &bs[0], &bs[1], &bs[2]))
        return NULL;
    if (!size_ok(name, "batch", batch) || !size_ok(name, "m", m) || !size_ok(name, "n", n))
        return NULL;
    if (k < 1) {
        PyErr_Format(PyExc_ValueError, "%s: k is at least 1", name);
        return NULL;
    }
    for (int i = 0; i < 3; i++)
        if (!size_ok(name, "a_strides", as[i]) || !size_ok(name, "b_strides", bs[i])) return NULL;
    if (batch == 0 || m == 0 || n == 0) Py_RETURN_NONE;
    const Py_ssize_t a_span = 1 + (batch - 1) * as[0] + (m - 1) * as[1] + (k - 1) * as[2];
    const Py_ssize_t b_span = 1 + (batch - 1) * bs[0] + (k - 1) * bs[1] + (n - 1) * bs[2];
    if (!buffer_holds(name, "a", &a, a_span, KIND_F64) ||
        !buffer_holds(name, "b", &b, b_span, KIND_F64) ||
        !buffer_holds(name, "out", &out, batch * m * n, KIND_F64))
        return NULL;
    const double *ap = F64(a), *bp = F64(b);
    if (n == 1 && m > 1) { /* a matrix times a vector: its transpose, the same operations */
        const double *t = ap;
        const Py_ssize_t s0 = as[0], s1 = as[1], s2 = as[2];
        ap = bp, bp = t;
        as[0] = bs[0], as[1] = bs[2], as[2] = bs[1];
        bs[0] = s0, bs[1] = s2, bs[2] = s1;
        n = m, m = 1;
    }
    if (m == 1) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t z = 0; z < batch; z++) {
            row_ctx rc = {ap + z * as[0], bp + z * bs[0], F64(out) + z * n, k, n, as[2],
                          bs[1],          bs[2]};
            parallel_for((n + ROW_CHUNK - 1) / ROW_CHUNK, k * n / 4, row_range, &rc);
        }
        Py_END_ALLOW_THREADS
        Py_RETURN_NONE;
    }
    mm_ctx c = {.a = ap,
                .b = bp,
                .out = F64(out),
                .m = m,
                .k = k,
                .n = n,
                .mp = (m + MR - 1) / MR,
                .np = (n + NR - 1) / NR,
                .a_batch = as[0],
                .a_row = as[1],
                .a_col = as[2],
                .b_batch = bs[0],
                .b_row = bs[1],
                .b_col = bs[2],
                .per_call = k <= KB ? batch : 1,
                .isa = isa_level(),
                .fused = fused && (isa_level() != 2 || has_fma())};
    const Py_ssize_t packs = bs[0] ? c.per_call : 1; /* a right operand shared by the batch: once */
    c.group = column_group(c.per_call * c.mp, c.np);
    c.packed =
        (double *)PyMem_RawMalloc(sizeof(double) * packs * c.np * NR * (size_t)(k < KB ? k : KB));
    if (!c.packed) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t z0 = 0; z0 < batch && !c.failed; z0 += c.per_call) {
        for (Py_ssize_t k0 = 0; k0 < k && !c.failed; k0 += KB) {
            c.z0 = z0, c.k0 = k0, c.kw = k - k0 < KB ? k - k0 : KB;
            const Py_ssize_t tasks = c.per_call * c.mp * ((c.np + c.group - 1) / c.group);
            parallel_for(packs * c.np, packs * c.kw * n, pack_range, &c);
            parallel_for(tasks, c.per_call * c.kw * m * n / 4, mm_range, &c);
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(c.packed);
    if (c.failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* p_ordered_mm(a, b, out, batch, m, k, n, a_strides, b_strides): product()'s, each element's
   sum in the fixed order above. */
static PyObject *p_ordered_mm(PyObject *module, PyObject *args, PyObject *kwargs) {
    return product(args, kwargs, 0, "p_ordered_mm");
}

/* p_integer_mm(...): p_ordered_mm's arguments, for operands of integers whose every partial
   sum is exact (so its value, the exact sum, has one set of bits in any order). */
static PyObject *p_integer_mm(PyObject *module, PyObject *args, PyObject *kwargs) {
    return product(args, kwargs, 1, "p_integer_mm");
}

static PyMethodDef methods[] = {
    {"p_ordered_mm", KEYWORDS(p_ordered_mm),
     "Portable mode: a float64 matrix product, each sum in k's order."},
    {"p_integer_mm", KEYWORDS(p_integer_mm),
     "Portable mode: a float64 product of integers whose partial sums are exact."},
    {NULL, NULL, 0, NULL},
};

int bind_portable_ordered(PyObject *module) { return PyModule_AddFunctions(module, methods); }
