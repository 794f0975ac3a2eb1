/* Portable mode's exact sums and products (twice.portable.arithmetic.exact):

   p_split     per row or column: the largest magnitude's power-of-two unit, and the values as
               integers on it
   p_rowsum    per row: the exact sum, from up to three integer slices, in float64
   p_colsum    per column: the exact sum at one slice
   p_scale     an integer product scaled by its units (plus a bias), rounded once
   p_slices    the second and third slices of a float64 operand, from its first
   p_split3    a float64 product operand's three slices, laid out for the product, in one pass
   p_combine3  a float64 product's six slice products scaled and added, rounded once
   p_compound  addcmul, addcdiv, add with alpha, lerp: one rounding per operation */

#include "portable.h"

#define T float
#define U uint32_t
#define INF INF_F32
#define TYPED(name) name##_float
#include "exact_typed.h"
#undef T
#undef U
#undef INF
#undef TYPED

#define T double
#define U uint64_t
#define INF INF_F64
#define TYPED(name) name##_double
#include "exact_typed.h"
#undef T
#undef U
#undef INF
#undef TYPED

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
        bad = !(c->kind ? split_block_double((const double *)x, hi - lo, c->cols, c->cols, c->beta,
                                             0, c->given, c->ints + off, c->units + lo, NULL)
                        : split_block_float((const float *)x, hi - lo, c->cols, c->cols, c->beta, 0,
                                            c->given, c->ints + off, c->units + lo, NULL));
    } else {
        const size_t width = (size_t)(hi - lo > 0 ? hi - lo : 1);
        double *scratch = (double *)malloc(sizeof(double) * 2 * width);
        if (!scratch) bad = 2;
        for (Py_ssize_t o = 0; o < c->outer && !bad; o++) {
            const Py_ssize_t off = o * c->rows * c->cols + lo;
            const char *x = c->base + (size_t)off * size;
            double *u = c->units + o * c->cols + lo;
            bad = !(c->kind ? split_block_double((const double *)x, c->rows, hi - lo, c->cols,
                                                 c->beta, 1, 0, c->ints + off, u, scratch)
                            : split_block_float((const float *)x, c->rows, hi - lo, c->cols,
                                                c->beta, 1, 0, c->ints + off, u, scratch));
        }
        free(scratch);
    }
    if (bad) __atomic_fetch_or(&c->bad, bad, __ATOMIC_RELAXED);
}

/* p_split(src, outer, rows, cols, beta, axis, ints, units, given=0): in each of `outer` row-major
   (rows x cols) blocks of src, every row (axis 0) or every column (axis 1) as split_block cuts
   it, the integers into ints (float64, the same layout) and the units into units (outer x rows
   for axis 0, outer x cols for axis 1). Returns False where a value is not finite (ints then
   unreliable). given=1 (axis 0 only): the rows' units are read from `units`, fixed over more
   values than these (a convolution's weight gradient, a few samples at a time); only the
   integers are computed, and the values are taken to be finite (the caller checked them). */
static PyObject *p_split(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"src",  "outer", "rows",  "cols",  "beta",
                         "axis", "ints",  "units", "given", NULL};
    buffer_t src, ints, units;
    int beta, axis, given = 0;
    Py_ssize_t outer, rows, cols;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&nnniiO&O&|i", kw, buffer, &src, &outer, &rows,
                                     &cols, &beta, &axis, buffer, &ints, buffer, &units, &given))
        return NULL;
    if (axis != 0 && axis != 1) {
        PyErr_SetString(PyExc_ValueError, "p_split: axis is 0 (rows) or 1 (columns)");
        return NULL;
    }
    if (given && axis != 0) {
        PyErr_SetString(PyExc_ValueError, "p_split: given units are per row (axis 0)");
        return NULL;
    }
    const Py_ssize_t n = outer * rows * cols;
    if (!size_ok("p_split", "outer", outer) || !size_ok("p_split", "rows", rows) ||
        !size_ok("p_split", "cols", cols) || !buffer_holds("p_split", "src", &src, n, ANY_KIND) ||
        !buffer_holds("p_split", "ints", &ints, n, KIND_F64) ||
        !buffer_holds("p_split", "units", &units, outer * (axis ? cols : rows), KIND_F64))
        return NULL;
    split_ctx ctx = {src.data, src.kind, beta, axis,      given,     0,
                     outer,    rows,     cols, F64(ints), F64(units)};
    Py_BEGIN_ALLOW_THREADS
    if (axis == 0)
        parallel_for(outer * rows, n, split_range, &ctx);
    else
        parallel_for(cols, n, split_range, &ctx);
    Py_END_ALLOW_THREADS
    if (ctx.bad & 2) return PyErr_NoMemory();
    return PyBool_FromLong(!ctx.bad);
}

/* A row's `count` slices' integer sums into acc, each slice's in 8 lanes (exact in any order);
   count a constant where called, so that each clone vectorises the lanes. */
STAGE void sliced_lanes(const char *x, int kind, Py_ssize_t at, Py_ssize_t cols, const double *inv,
                        const double *units, int count, double *acc) {
    double lane[3][8] = {{0}};
    Py_ssize_t j = 0;
    for (; j + 8 <= cols; j += 8)
        for (int l = 0; l < 8; l++) {
            double rest = load(x, kind, at + j + l);
            for (int c = 0; c < count; c++) {
                double q = round_even(rest * inv[c]);
                lane[c][l] += q;
                if (c + 1 < count) rest = rest - q * units[c];
            }
        }
    for (; j < cols; j++) {
        double rest = load(x, kind, at + j);
        for (int c = 0; c < count; c++) {
            double q = round_even(rest * inv[c]);
            lane[c][0] += q;
            if (c + 1 < count) rest = rest - q * units[c];
        }
    }
    for (int c = 0; c < count; c++)
        acc[c] = ((lane[c][0] + lane[c][1]) + (lane[c][2] + lane[c][3])) +
                 ((lane[c][4] + lane[c][5]) + (lane[c][6] + lane[c][7]));
}

/* torch.round: round_even where the trick holds, nearbyint beyond (inf, NaN, huge). */
static inline double torch_round(double v) {
    return fabs(v) < 2251799813685248.0 ? round_even(v) : nearbyint(v);
}

/* A slice's integers where its unit has no exact inverse (below DBL_MIN): r / u, rounded; a
   unit that underflowed to 0 (a grid below the smallest subnormal) holds nothing (exact.split's
   rule). */
static inline double slice_of(double r, double u) { return u > 0.0 ? torch_round(r / u) : 0.0; }

/* p_rowsum's rows for one element type (kind a constant where the wrappers below call it): each
   row's exact sum from `count` slices; returns 0 where a value is not finite (the rows after
   that one are left). */
STAGE int rowsum_rows(const char *x, int kind, Py_ssize_t rows, Py_ssize_t cols, int beta,
                      int count, double *out) {
    const double step = pow2(-beta);
    int finite = 1;
    for (Py_ssize_t r = 0; r < rows && finite; r++) {
        const Py_ssize_t at = r * cols;
        int bad = 0;
        double amax = row_max(x, kind, at, cols, &bad);
        if (bad) finite = 0;
        double units[3], inv[3], acc[3] = {0, 0, 0};
        units[0] = unit_of(amax, beta);
        for (int c = 1; c < count; c++) units[c] = units[c - 1] * step;
        for (int c = 0; c < count; c++) inv[c] = 1.0 / units[c];
        if (count == 1) { /* integers below 2**53 in total: exact in any order, so 8 lanes */
            double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            Py_ssize_t j = 0;
            for (; j + 8 <= cols; j += 8)
                for (int l = 0; l < 8; l++)
                    lane[l] += round_even(load(x, kind, at + j + l) * inv[0]);
            for (; j < cols; j++) lane[0] += round_even(load(x, kind, at + j) * inv[0]);
            acc[0] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                     ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        } else if (units[count - 1] < DBL_MIN) { /* a grid without an exact inverse */
            for (Py_ssize_t j = 0; j < cols; j++) {
                double rest = load(x, kind, at + j);
                for (int c = 0; c < count; c++) {
                    double q = c == 0 ? round_even(rest * inv[0]) : slice_of(rest, units[c]);
                    acc[c] += q;
                    if (c + 1 < count) rest = rest - q * units[c];
                }
            }
        } else if (count == 2) {
            sliced_lanes(x, kind, at, cols, inv, units, 2, acc);
        } else {
            sliced_lanes(x, kind, at, cols, inv, units, 3, acc);
        }
        double total = acc[0] * units[0];
        for (int c = 1; c < count; c++) total = total + acc[c] * units[c];
        out[r] = total;
    }
    return finite;
}

CLONED
static int rowsum_float(const char *x, Py_ssize_t rows, Py_ssize_t cols, int beta, int count,
                        double *out) {
    return rowsum_rows(x, KIND_F32, rows, cols, beta, count, out);
}

CLONED
static int rowsum_double(const char *x, Py_ssize_t rows, Py_ssize_t cols, int beta, int count,
                         double *out) {
    return rowsum_rows(x, KIND_F64, rows, cols, beta, count, out);
}

/* p_rowsum(src, rows, cols, beta, count, out): out[r] = the row's exact sum from `count` slices
   (exact.split), each slice's integers added exactly, the slices' terms in order. */
static PyObject *p_rowsum(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"src", "rows", "cols", "beta", "count", "out", NULL};
    buffer_t src, out;
    int beta, count, finite;
    Py_ssize_t rows, cols;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&nniiO&", kw, buffer, &src, &rows, &cols,
                                     &beta, &count, buffer, &out))
        return NULL;
    if (count < 1 || count > 3) {
        PyErr_SetString(PyExc_ValueError, "count");
        return NULL;
    }
    if (!size_ok("p_rowsum", "rows", rows) || !size_ok("p_rowsum", "cols", cols) ||
        !buffer_holds("p_rowsum", "src", &src, rows * cols, ANY_KIND) ||
        !buffer_holds("p_rowsum", "out", &out, rows, KIND_F64))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    finite = src.kind ? rowsum_double(src.data, rows, cols, beta, count, F64(out))
                      : rowsum_float(src.data, rows, cols, beta, count, F64(out));
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(finite);
}

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
    if (!scratch)
        bad = 2;
    else if (c->kind)
        bad = !colsum_block_double((const double *)c->base, c->rows, lo, hi, c->cols, c->beta,
                                   c->out, scratch);
    else
        bad = !colsum_block_float((const float *)c->base, c->rows, lo, hi, c->cols, c->beta, c->out,
                                  scratch);
    free(scratch);
    if (bad) __atomic_fetch_or(&c->bad, bad, __ATOMIC_RELAXED);
}

/* p_colsum(src, rows, cols, beta, out): out[j] = the exact sum of column j of a row-major
   (rows x cols) matrix at one slice (exact_sum over leading dimensions, with no copy). */
static PyObject *p_colsum(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"src", "rows", "cols", "beta", "out", NULL};
    buffer_t src, out;
    int beta;
    Py_ssize_t rows, cols;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&nniO&", kw, buffer, &src, &rows, &cols, &beta,
                                     buffer, &out))
        return NULL;
    if (!size_ok("p_colsum", "rows", rows) || !size_ok("p_colsum", "cols", cols) ||
        !buffer_holds("p_colsum", "src", &src, rows * cols, ANY_KIND) ||
        !buffer_holds("p_colsum", "out", &out, cols, KIND_F64))
        return NULL;
    colsum_ctx ctx = {src.data, src.kind, beta, 0, rows, cols, F64(out)};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(cols, rows * cols, colsum_range, &ctx);
    Py_END_ALLOW_THREADS
    if (ctx.bad & 2) return PyErr_NoMemory();
    return PyBool_FromLong(!ctx.bad);
}

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
    Py_ssize_t bounded = -1; /* the block whose column units' bounds blo, bhi hold */
    double blo = 1.0, bhi = 1.0;
    for (Py_ssize_t row = lo; row < hi; row++) {
        const Py_ssize_t k = row / rows, i = row % rows, at = row * cols;
        const double a = c->ua[row];
        const double *b = c->ub + k * cols, *pr = c->prod + at;
        if (k != bounded) unit_bounds(b, cols, &blo, &bhi), bounded = k;
        const int band = in_band(a, blo, bhi); /* then scale_by is t * (a * b[j]) */
        if (c->bias) {
            const Py_ssize_t from = k * c->bbs + i * c->brs;
            for (Py_ssize_t j = 0; j < cols; j++) {
                double v = scale_by(pr[j] + 0.0, a, b[j]);
                store(c->out, c->ok, at + j, v + load(c->bias, c->bk, from + j * c->bcs));
            }
        } else if (c->ok) {
            double *o = (double *)c->out + at;
            if (band)
                for (Py_ssize_t j = 0; j < cols; j++) o[j] = (pr[j] + 0.0) * (a * b[j]);
            else
                for (Py_ssize_t j = 0; j < cols; j++) o[j] = scale_by(pr[j] + 0.0, a, b[j]);
        } else {
            float *o = (float *)c->out + at;
            if (band)
                for (Py_ssize_t j = 0; j < cols; j++) o[j] = (float)((pr[j] + 0.0) * (a * b[j]));
            else
                for (Py_ssize_t j = 0; j < cols; j++) o[j] = (float)scale_by(pr[j] + 0.0, a, b[j]);
        }
    }
}

/* p_scale(product, blocks, rows, cols, unit_a, unit_b, out, bias=None, bias_block_stride=0,
   bias_row_stride=0, bias_col_stride=0): for each of `blocks` (rows x cols) blocks,
   out[i, j] = product[i, j] * (unit_a[i] * unit_b[j]) (+ bias[i, j]), the sum rounded once to
   out's dtype: exact_matmul's last steps. unit_a holds blocks x rows units, unit_b blocks x
   cols; the bias strides are in elements (0 broadcasts). */
static PyObject *p_scale(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"product",
                         "blocks",
                         "rows",
                         "cols",
                         "unit_a",
                         "unit_b",
                         "out",
                         "bias",
                         "bias_block_stride",
                         "bias_row_stride",
                         "bias_col_stride",
                         NULL};
    buffer_t prod, ua, ub, out, bias;
    Py_ssize_t blocks, rows, cols, bbs = 0, brs = 0, bcs = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&nnnO&O&O&|O&nnn", kw, buffer, &prod, &blocks,
                                     &rows, &cols, buffer, &ua, buffer, &ub, buffer, &out,
                                     optional_buffer, &bias, &bbs, &brs, &bcs))
        return NULL;
    const char *k = "p_scale";
    const Py_ssize_t n = blocks * rows * cols;
    if (!size_ok(k, "blocks", blocks) || !size_ok(k, "rows", rows) || !size_ok(k, "cols", cols) ||
        !size_ok(k, "bias_block_stride", bbs) || !size_ok(k, "bias_row_stride", brs) ||
        !size_ok(k, "bias_col_stride", bcs) || !buffer_holds(k, "product", &prod, n, KIND_F64) ||
        !buffer_holds(k, "unit_a", &ua, blocks * rows, KIND_F64) ||
        !buffer_holds(k, "unit_b", &ub, blocks * cols, KIND_F64) ||
        !buffer_holds(k, "out", &out, n, ANY_KIND))
        return NULL;
    if (n > 0) { /* the bias's last element read */
        const Py_ssize_t last = (blocks - 1) * bbs + (rows - 1) * brs + (cols - 1) * bcs;
        if (!buffer_holds(k, "bias", &bias, last + 1, ANY_KIND)) return NULL;
    }
    scale_ctx ctx = {F64(prod), F64(ua), F64(ub), bias.data, bias.kind, out.kind,
                     rows,      cols,    bbs,     brs,       bcs,       out.data};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(blocks * rows, n, scale_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

typedef struct {
    const double *x, *ints, *unit;
    Py_ssize_t rows, cols, ubs, urs, ucs;
    double step;
    double *o2, *o3;
    const double *cu; /* the same units in every row: u, u2, i2, u3, i3 (cols each) */
} slices_ctx;

/* 1 / u where that is exact (u a normal power of two: x / u == x * (1 / u), bit for bit, the
   same real number rounded once), else 0: divide. */
static inline double exact_inverse(double u) { return u >= DBL_MIN ? 1.0 / u : 0.0; }

/* One row's second and third slices on one unit u (its next units u2, u3, their inverses). */
CLONED
static void slices_one_unit(const double *x, const double *q, double u, double step, double *o2,
                            double *o3, Py_ssize_t n) {
    const double u2 = u * step, u3 = u2 * step, i2 = exact_inverse(u2), i3 = exact_inverse(u3);
    if (i2 != 0.0 && i3 != 0.0) {
        for (Py_ssize_t j = 0; j < n; j++) {
            const double r = x[j] - q[j] * u, a = round_even(r * i2);
            o2[j] = a, o3[j] = round_even((r - a * u2) * i3);
        }
        return;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        const double r = x[j] - q[j] * u, a = slice_of(r, u2);
        o2[j] = a, o3[j] = slice_of(r - a * u2, u3);
    }
}

/* One row's slices on per-column units (cu: u, u2, i2, u3, i3 of every column). */
CLONED
static void slices_col_units(const double *x, const double *q, const double *cu, double *o2,
                             double *o3, Py_ssize_t n) {
    const double *u = cu, *u2 = cu + n, *i2 = u2 + n, *u3 = i2 + n, *i3 = u3 + n;
    for (Py_ssize_t j = 0; j < n; j++) {
        const double r = x[j] - q[j] * u[j];
        const double a = i2[j] != 0.0 ? round_even(r * i2[j]) : slice_of(r, u2[j]);
        const double e = r - a * u2[j];
        o2[j] = a, o3[j] = i3[j] != 0.0 ? round_even(e * i3[j]) : slice_of(e, u3[j]);
    }
}

static void slices_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const slices_ctx *c = (const slices_ctx *)p;
    const Py_ssize_t n = c->cols;
    for (Py_ssize_t row = lo; row < hi; row++) {
        const Py_ssize_t k = row / c->rows, i = row % c->rows, at = row * n;
        const double *units = c->unit + k * c->ubs + i * c->urs;
        if (c->ucs == 0) {
            slices_one_unit(c->x + at, c->ints + at, units[0], c->step, c->o2 + at, c->o3 + at, n);
        } else if (c->cu) {
            slices_col_units(c->x + at, c->ints + at, c->cu, c->o2 + at, c->o3 + at, n);
        } else {
            for (Py_ssize_t j = 0; j < n; j++)
                slices_one_unit(c->x + at + j, c->ints + at + j, units[j * c->ucs], c->step,
                                c->o2 + at + j, c->o3 + at + j, 1);
        }
    }
}

/* p_slices(src, ints, blocks, rows, cols, unit, unit_block_stride, unit_row_stride,
   unit_col_stride, step, second, third): exact.split's second and third slices of float64
   `src` from its first (`ints` on `unit`, the strides in elements, 0 broadcasts), each step of
   the torch route in the same IEEE operations: rest = x - ints * unit, unit *= step (2**-beta),
   ints = round(rest / unit), twice. */
static PyObject *p_slices(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"src",
                         "ints",
                         "blocks",
                         "rows",
                         "cols",
                         "unit",
                         "unit_block_stride",
                         "unit_row_stride",
                         "unit_col_stride",
                         "step",
                         "second",
                         "third",
                         NULL};
    buffer_t src, ints, unit, o2, o3;
    Py_ssize_t blocks, rows, cols, ubs, urs, ucs;
    double step;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&nnnO&nnndO&O&", kw, buffer, &src, buffer,
                                     &ints, &blocks, &rows, &cols, buffer, &unit, &ubs, &urs, &ucs,
                                     &step, buffer, &o2, buffer, &o3))
        return NULL;
    const char *k = "p_slices";
    const Py_ssize_t n = blocks * rows * cols;
    if (!size_ok(k, "blocks", blocks) || !size_ok(k, "rows", rows) || !size_ok(k, "cols", cols) ||
        !size_ok(k, "unit_block_stride", ubs) || !size_ok(k, "unit_row_stride", urs) ||
        !size_ok(k, "unit_col_stride", ucs) || !buffer_holds(k, "src", &src, n, KIND_F64) ||
        !buffer_holds(k, "ints", &ints, n, KIND_F64) ||
        !buffer_holds(k, "second", &o2, n, KIND_F64) || !buffer_holds(k, "third", &o3, n, KIND_F64))
        return NULL;
    if (n > 0) {
        const Py_ssize_t last = (blocks - 1) * ubs + (rows - 1) * urs + (cols - 1) * ucs;
        if (!buffer_holds(k, "unit", &unit, last + 1, KIND_F64)) return NULL;
    }
    slices_ctx ctx = {F64(src), F64(ints), F64(unit), rows,    cols,    ubs,
                      urs,      ucs,       step,      F64(o2), F64(o3), NULL};
    double *cu = NULL;
    if (ucs && urs == 0 && ubs == 0 && cols > 0) { /* the same column units in every row */
        cu = (double *)malloc(sizeof(double) * 5 * (size_t)cols);
        if (!cu) return PyErr_NoMemory();
        for (Py_ssize_t j = 0; j < cols; j++) {
            const double u = F64(unit)[j * ucs], u2 = u * step, u3 = u2 * step;
            cu[j] = u, cu[cols + j] = u2, cu[2 * cols + j] = exact_inverse(u2);
            cu[3 * cols + j] = u3, cu[4 * cols + j] = exact_inverse(u3);
        }
        ctx.cu = cu;
    }
    Py_BEGIN_ALLOW_THREADS
    parallel_for(blocks * rows, n, slices_range, &ctx);
    Py_END_ALLOW_THREADS
    free(cu);
    Py_RETURN_NONE;
}

typedef struct {
    const double *x;
    Py_ssize_t outer, rows, cols;
    int beta, axis, bad; /* bad: 1 a value not finite, 2 no memory (any thread) */
    double step, *out, *units;
} split3_ctx;

/* Rows [lo, hi) of all blocks (axis 0), or columns [lo, hi) of every block (axis 1): the first
   slice by split_block, the next two from it as p_slices cuts them. */
static void split3_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    split3_ctx *c = (split3_ctx *)p;
    const Py_ssize_t m = c->rows, n = c->cols, plane = m * n;
    int bad = 0;
    if (c->axis == 0) { /* out: blocks x 3 x rows x cols, the slices of a block stacked */
        for (Py_ssize_t r = lo; r < hi && !bad; r++) {
            const Py_ssize_t o = r / m, i = r % m;
            const double *x = c->x + r * n;
            double *o1 = c->out + (o * 3 * m + i) * n;
            bad = !split_block_double(x, 1, n, n, c->beta, 0, 0, o1, c->units + r, NULL);
            slices_one_unit(x, o1, c->units[r], c->step, o1 + plane, o1 + 2 * plane, n);
        }
    } else { /* out: 3 x blocks x rows x cols, each slice a whole operand */
        const Py_ssize_t w = hi - lo, all = c->outer * plane;
        double *scratch = (double *)malloc(sizeof(double) * 5 * (size_t)(w > 0 ? w : 1));
        if (!scratch) bad = 2;
        for (Py_ssize_t o = 0; o < c->outer && !bad; o++) {
            const double *x = c->x + o * plane + lo;
            double *o1 = c->out + o * plane + lo, *u = c->units + o * n + lo;
            bad = !split_block_double(x, m, w, n, c->beta, 1, 0, o1, u, scratch);
            for (Py_ssize_t j = 0; j < w; j++) {
                const double u2 = u[j] * c->step, u3 = u2 * c->step;
                scratch[j] = u[j], scratch[w + j] = u2, scratch[2 * w + j] = exact_inverse(u2);
                scratch[3 * w + j] = u3, scratch[4 * w + j] = exact_inverse(u3);
            }
            for (Py_ssize_t i = 0; i < m && !bad; i++)
                slices_col_units(x + i * n, o1 + i * n, scratch, o1 + all + i * n,
                                 o1 + 2 * all + i * n, w);
        }
        free(scratch);
    }
    if (bad) __atomic_fetch_or(&c->bad, bad, __ATOMIC_RELAXED);
}

/* p_split3(src, outer, rows, cols, beta, axis, out, units): exact.split's three slices of
   float64 `src` (outer row-major rows x cols blocks), per row (axis 0: a product's left operand,
   each block's slices stacked, outer x 3 x rows x cols) or per column (axis 1: its right one,
   slice by slice, 3 x outer x rows x cols), in one pass: the integers of split_rows's first
   slice and p_slices's next two, the first slice's units into units (outer x rows, or outer x
   cols). Returns False where a value is not finite (out then unreliable). */
static PyObject *p_split3(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"src", "outer", "rows", "cols", "beta", "axis", "out", "units", NULL};
    buffer_t src, out, units;
    Py_ssize_t outer, rows, cols;
    int beta, axis;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&nnniiO&O&", kw, buffer, &src, &outer, &rows,
                                     &cols, &beta, &axis, buffer, &out, buffer, &units))
        return NULL;
    const char *k = "p_split3";
    if ((axis != 0 && axis != 1) || beta < 1 || beta > 50) {
        PyErr_SetString(PyExc_ValueError, "p_split3: axis is 0 or 1, beta 1 to 50");
        return NULL;
    }
    const Py_ssize_t n = outer * rows * cols;
    if (!size_ok(k, "outer", outer) || !size_ok(k, "rows", rows) || !size_ok(k, "cols", cols) ||
        !buffer_holds(k, "src", &src, n, KIND_F64) ||
        !buffer_holds(k, "out", &out, 3 * n, KIND_F64) ||
        !buffer_holds(k, "units", &units, outer * (axis ? cols : rows), KIND_F64))
        return NULL;
    split3_ctx ctx = {F64(src), outer, rows,        cols,     beta,
                      axis,     0,     pow2(-beta), F64(out), F64(units)};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(axis ? cols : outer * rows, 3 * n, split3_range, &ctx);
    Py_END_ALLOW_THREADS
    if (ctx.bad & 2) return PyErr_NoMemory();
    return PyBool_FromLong(!ctx.bad);
}

typedef struct {
    const double *p0, *p1, *p2, *ua, *ub;
    double step;
    Py_ssize_t rows, cols;
    int ok;
    char *out;
} combine_ctx;

CLONED
static void combine_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const combine_ctx *c = (const combine_ctx *)p;
    const Py_ssize_t m = c->rows, n = c->cols;
    const double s1 = c->step, s2 = c->step * c->step;
    double chunk[CHUNK];
    for (Py_ssize_t row = lo; row < hi; row++) {
        const Py_ssize_t k = row / m, i = row % m;
        const double a = c->ua[row];
        for (Py_ssize_t j0 = 0; j0 < n; j0 += CHUNK) { /* a float32 result through chunk */
            const Py_ssize_t len = n - j0 < CHUNK ? n - j0 : CHUNK;
            const double *b = c->ub + k * n + j0;
            const double *p0 = c->p0 + (k * 3 * m + i) * n + j0;
            const double *p1 = c->p1 + (k * 2 * m + i) * n + j0, *p2 = c->p2 + (k * m + i) * n + j0;
            double *total = c->ok ? (double *)c->out + row * n + j0 : chunk;
            for (Py_ssize_t j = 0; j < len; j++) {
                /* each level's integers added exactly (below 2**53), then the levels in
                   order: the sum of scaling.levels_added, the same whichever operand is left */
                const double l1 = (p1[j] + 0.0) + p0[m * n + j];
                const double l2 = ((p2[j] + 0.0) + p1[m * n + j]) + p0[2 * m * n + j];
                double t = p0[j] + 0.0; /* an integer's zero is +0 (ZERO_SIGN) */
                t = t + l1 * s1;
                t = t + l2 * s2;
                total[j] = t;
            }
            double blo, bhi; /* then the scale: scale_by's first branch a run where it holds */
            unit_bounds(b, len, &blo, &bhi);
            if (in_band(a, blo, bhi))
                for (Py_ssize_t j = 0; j < len; j++) total[j] = total[j] * (a * b[j]);
            else
                for (Py_ssize_t j = 0; j < len; j++) total[j] = scale_by(total[j], a, b[j]);
            if (!c->ok) store_run(c->out, 0, row * n + j0, len, chunk);
        }
    }
}

/* p_combine3(first, second, third, blocks, rows, cols, unit_a, unit_b, out, step):
   exact_bilinear's sum of a float64 product's six slice products, as exact._fast_matmul3 forms
   them: `first` holds the left slices 0, 1, 2 (stacked rows, blocks x 3 rows x cols) times the
   right slice 0, `second` slices 0, 1 times the right slice 1, `third` slice 0 times the right
   slice 2. Each level's products added exactly, then the levels, each times step**level
   (2**-beta), in the torch route's order (scaling.levels_added), the sum times unit_a[i] and
   unit_b[j] (the first slices' units, blocks x rows and blocks x cols: SCALE), rounded once to
   out's dtype. */
static PyObject *p_combine3(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"first",  "second", "third", "blocks", "rows", "cols",
                         "unit_a", "unit_b", "out",   "step",   NULL};
    buffer_t p0, p1, p2, ua, ub, out;
    Py_ssize_t blocks, rows, cols;
    double step;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&O&nnnO&O&O&d", kw, buffer, &p0, buffer, &p1,
                                     buffer, &p2, &blocks, &rows, &cols, buffer, &ua, buffer, &ub,
                                     buffer, &out, &step))
        return NULL;
    const char *k = "p_combine3";
    const Py_ssize_t n = blocks * rows * cols;
    if (!size_ok(k, "blocks", blocks) || !size_ok(k, "rows", rows) || !size_ok(k, "cols", cols) ||
        !buffer_holds(k, "first", &p0, 3 * n, KIND_F64) ||
        !buffer_holds(k, "second", &p1, 2 * n, KIND_F64) ||
        !buffer_holds(k, "third", &p2, n, KIND_F64) ||
        !buffer_holds(k, "unit_a", &ua, blocks * rows, KIND_F64) ||
        !buffer_holds(k, "unit_b", &ub, blocks * cols, KIND_F64) ||
        !buffer_holds(k, "out", &out, n, ANY_KIND))
        return NULL;
    if (!(step > 0.0 && step <= 0.5)) {
        PyErr_SetString(PyExc_ValueError, "p_combine3: step is 2**-beta");
        return NULL;
    }
    combine_ctx ctx = {F64(p0), F64(p1), F64(p2), F64(ua),  F64(ub),
                       step,    rows,    cols,    out.kind, out.data};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(blocks * rows, 6 * n, combine_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

typedef struct {
    int fn, kind;
    const char *sp, *ap, *bp;
    double value;
    char *op;
} compound_ctx;

static void compound_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const compound_ctx *c = (const compound_ctx *)p;
    const Py_ssize_t at = lo * (c->kind ? 8 : 4), n = hi - lo;
    if (c->kind)
        compound_loops_double(c->fn, n, (const double *)(c->sp + at), (const double *)(c->ap + at),
                              (const double *)(c->bp + at), c->value, (double *)(c->op + at));
    else
        compound_loops_float(c->fn, n, (const float *)(c->sp + at), (const float *)(c->ap + at),
                             (const float *)(c->bp + at), c->value, (float *)(c->op + at));
}

/* p_compound(op, self, a, b, value, out): one IEEE operation after another, in the dtype of the
   buffers (all of one dtype, out's count elements), as ops/math.py spells them:
   0 addcmul  self + (a * value) * b        1 addcdiv  self + (a * value) / b
   2 add      self + a * value              3 lerp     torch's two-sided formula, weight value */
static PyObject *p_compound(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"op", "self", "a", "b", "value", "out", NULL};
    int fn;
    buffer_t self, a, b, out;
    double value;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO&O&O&dO&", kw, &fn, buffer, &self, buffer, &a,
                                     buffer, &b, &value, buffer, &out))
        return NULL;
    if (fn < 0 || fn > 3) {
        PyErr_SetString(PyExc_ValueError, "p_compound: op is 0 to 3");
        return NULL;
    }
    const Py_ssize_t n = out.count;
    if (!buffer_holds("p_compound", "self", &self, n, out.kind) ||
        !buffer_holds("p_compound", "a", &a, n, out.kind) ||
        !buffer_holds("p_compound", "b", &b, n, out.kind))
        return NULL;
    compound_ctx ctx = {fn, out.kind, self.data, a.data, b.data, value, out.data};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(n, n, compound_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"p_split", KEYWORDS(p_split), "Portable mode: rows as integers on their power-of-two unit."},
    {"p_rowsum", KEYWORDS(p_rowsum), "Portable mode: exact row sums."},
    {"p_colsum", KEYWORDS(p_colsum), "Portable mode: exact column sums (one slice)."},
    {"p_scale", KEYWORDS(p_scale),
     "Portable mode: an integer product scaled, plus a bias, rounded once."},
    {"p_slices", KEYWORDS(p_slices), "Portable mode: a float64 operand's second and third slices."},
    {"p_split3", KEYWORDS(p_split3), "Portable mode: a float64 operand's three slices, one pass."},
    {"p_combine3", KEYWORDS(p_combine3),
     "Portable mode: a float64 product's six slice products, scaled, added, rounded once."},
    {"p_compound", KEYWORDS(p_compound),
     "Portable mode: addcmul/addcdiv/add-alpha/lerp, one rounding each."},
    {NULL, NULL, 0, NULL},
};

int bind_portable_exact(PyObject *module) { return PyModule_AddFunctions(module, methods); }
