/* Portable mode's exact sums and products (twice.portable.arithmetic.exact):

   p_split     per row or column: the largest magnitude's power-of-two unit, and the values as
               integers on it
   p_rowsum    per row: the exact sum, from up to three integer slices, in float64
   p_colsum    per column: the exact sum at one slice
   p_scale     an integer product scaled by its units (plus a bias), rounded once
   p_compound  addcmul, addcdiv, add with alpha, lerp: one rounding per operation

   (A float64 product is not exact but ordered: ordered.c.) */

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
    {"p_compound", KEYWORDS(p_compound),
     "Portable mode: addcmul/addcdiv/add-alpha/lerp, one rounding each."},
    {NULL, NULL, 0, NULL},
};

int bind_portable_exact(PyObject *module) { return PyModule_AddFunctions(module, methods); }
