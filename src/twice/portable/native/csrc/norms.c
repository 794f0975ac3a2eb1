/* Portable mode's batch norm and layer norm kernels (twice.portable.ops.norms holds the same
   expressions in torch operations):

   p_chansum  batch norm's exact per-channel sums of one expression
   p_chanmap  batch norm's per-element formulas, rounded once
   p_bnsums   batch norm's four backward sums at once
   p_lnfwd    layer norm over rows (float32 precision)
   p_lnbwd    layer norm's backward (float32 precision)

   Batch norm works on (N, C, S) tensors, per channel c, with no copies; the mean, scale, weight,
   bias, p1 and p2 are float64 arrays of C values, or None. */

#include "portable.h"

static inline double chan_value(int expr, double x, double y, double m, double s, double w) {
    switch (expr) {
    case 0: return x;
    case 1: {
        double d = x - m;
        return d * d;
    }
    case 2: return y * ((x - m) * s);
    case 3: return y * w;
    default: return (y * w) * ((x - m) * s);
    }
}

/* Batch norm's kernels walk each channel's N runs of S contiguous values in chunks: a chunk's
   values are loaded into float64 arrays and each expression is one plain loop over them, so the
   compiler vectorises it; maxima and sums of integers go into LANES independent accumulators.
   Each computes exactly chan_value's operations. */
/* v = chan_value(expr, x, y, m, s, w) for a chunk, x's values already in v and y's in yv. */
static inline void chan_values(int expr, double *v, const double *yv, Py_ssize_t len, double m,
                               double s, double w) {
    switch (expr) {
    case 0: break;
    case 1:
        for (Py_ssize_t j = 0; j < len; j++) {
            double d = v[j] - m;
            v[j] = d * d;
        }
        break;
    case 2:
        for (Py_ssize_t j = 0; j < len; j++) {
            double d = v[j] - m;
            d = d * s;
            v[j] = yv[j] * d;
        }
        break;
    case 3:
        for (Py_ssize_t j = 0; j < len; j++) v[j] = yv[j] * w;
        break;
    default:
        for (Py_ssize_t j = 0; j < len; j++) {
            double d = v[j] - m;
            d = d * s;
            double g = yv[j] * w;
            v[j] = g * d;
        }
    }
}

/* lane[l] = the largest of lane[l] and |v|'s bit patterns (bits_double): integer maxima. */
static inline void lanes_max(const double *v, Py_ssize_t len, uint64_t *lane) {
    Py_ssize_t j = 0;
    for (; j + LANES <= len; j += LANES)
        for (int l = 0; l < LANES; l++) {
            uint64_t b = bits_double(v[j + l]);
            lane[l] = b > lane[l] ? b : lane[l];
        }
    for (; j < len; j++) {
        uint64_t b = bits_double(v[j]);
        lane[0] = b > lane[0] ? b : lane[0];
    }
}

/* The largest magnitude the lanes saw; *bad set where one was infinite or NaN. */
static inline double lanes_top(const uint64_t *lane, int *bad) {
    uint64_t a = 0;
    for (int l = 0; l < LANES; l++) a = lane[l] > a ? lane[l] : a;
    if (a >= INF_F64) {
        *bad = 1;
        return 0.0;
    }
    return magnitude_double(a);
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

/* One batch norm call's buffers and sizes. */
typedef struct {
    int expr; /* -1: p_bnsums */
    Py_ssize_t N, C, S;
    int beta;
    const char *x;
    int xk;
    const char *y; /* NULL where absent */
    int yk;
    const double *m, *sc, *w, *b, *p1, *p2; /* NULL where absent */
    char *out;
    int ok;  /* out's kind (p_chanmap) */
    int bad; /* set to 1 by any thread that meets a value not finite */
} chan_ctx;

/* p_chansum's channel c at one slice (count 1); returns 0 where a value is not finite. */
CLONED
static int chansum_one(const chan_ctx *k, Py_ssize_t c, double mc, double scc, double wc,
                       double *out) {
    double v[CHUNK], yv[CHUNK], lane[LANES] = {0};
    uint64_t top[LANES] = {0};
    int bad = 0;
    const Py_ssize_t N = k->N, C = k->C, S = k->S;
    for (Py_ssize_t n = 0; n < N; n++)
        for (Py_ssize_t j0 = 0; j0 < S; j0 += CHUNK) {
            const Py_ssize_t at = (n * C + c) * S + j0, len = S - j0 < CHUNK ? S - j0 : CHUNK;
            load_run(k->x, k->xk, at, len, v);
            if (k->y) load_run(k->y, k->yk, at, len, yv);
            chan_values(k->expr, v, yv, len, mc, scc, wc);
            lanes_max(v, len, top);
        }
    const double unit = unit_of(lanes_top(top, &bad), k->beta), inv = 1.0 / unit;
    for (Py_ssize_t n = 0; n < N; n++)
        for (Py_ssize_t j0 = 0; j0 < S; j0 += CHUNK) {
            const Py_ssize_t at = (n * C + c) * S + j0, len = S - j0 < CHUNK ? S - j0 : CHUNK;
            load_run(k->x, k->xk, at, len, v);
            if (k->y) load_run(k->y, k->yk, at, len, yv);
            chan_values(k->expr, v, yv, len, mc, scc, wc);
            lanes_sum(v, len, inv, lane);
        }
    *out = lanes_total(lane) * unit;
    return !bad;
}

/* p_chansum's channels one after another, from `count` slices (2 or 3); returns 0 where a value
   is not finite (the channels after that one are left). */
static int chansum_slices(const chan_ctx *k, int count) {
    const Py_ssize_t N = k->N, C = k->C, S = k->S;
    const double step = pow2(-k->beta);
    int finite = 1;
    for (Py_ssize_t c = 0; c < C && finite; c++) {
        double mc = k->m ? k->m[c] : 0.0, scc = k->sc ? k->sc[c] : 1.0, wc = k->w ? k->w[c] : 1.0;
        double amax = 0.0;
        int bad = 0;
        for (Py_ssize_t n = 0; n < N; n++) {
            Py_ssize_t at = (n * C + c) * S;
            for (Py_ssize_t j = 0; j < S; j++) {
                const double y = k->y ? load(k->y, k->yk, at + j) : 0.0;
                double v = fabs(chan_value(k->expr, load(k->x, k->xk, at + j), y, mc, scc, wc));
                bad |= !(v <= DBL_MAX);
                amax = v > amax ? v : amax;
            }
        }
        if (bad) finite = 0;
        double units[3], inv[3], acc[3] = {0, 0, 0};
        units[0] = unit_of(amax, k->beta);
        for (int i = 1; i < count; i++) units[i] = units[i - 1] * step;
        for (int i = 0; i < count; i++) inv[i] = 1.0 / units[i];
        for (Py_ssize_t n = 0; n < N; n++) {
            Py_ssize_t at = (n * C + c) * S;
            for (Py_ssize_t j = 0; j < S; j++) {
                const double y = k->y ? load(k->y, k->yk, at + j) : 0.0;
                double rest = chan_value(k->expr, load(k->x, k->xk, at + j), y, mc, scc, wc);
                for (int i = 0; i < count; i++) {
                    double q = round_even(rest * inv[i]);
                    acc[i] += q;
                    if (i + 1 < count) rest = rest - q * units[i];
                }
            }
        }
        double total = acc[0] * units[0];
        for (int i = 1; i < count; i++) total = total + acc[i] * units[i];
        ((double *)k->out)[c] = total;
    }
    return finite;
}

/* p_bnsums' channel c: its four values per element (y, y xhat, g, g xhat with g = y w, xhat =
   (x - m) s, as chan_value spells them), by chunks, in two passes (the maxima, then the sums);
   returns 0 where one is not finite. */
CLONED
static int bnsums_channel(const chan_ctx *k, Py_ssize_t c) {
    double xv[CHUNK], yv[CHUNK], v[4][CHUNK], lane[4][LANES] = {{0}}, units[4], inv[4];
    uint64_t top[4][LANES] = {{0}};
    int bad = 0;
    const Py_ssize_t N = k->N, C = k->C, S = k->S;
    const double mc = k->m[c], scc = k->sc[c], wc = k->w[c];
    for (int pass = 0; pass < 2; pass++) {
        for (Py_ssize_t n = 0; n < N; n++)
            for (Py_ssize_t j0 = 0; j0 < S; j0 += CHUNK) {
                const Py_ssize_t at = (n * C + c) * S + j0, len = S - j0 < CHUNK ? S - j0 : CHUNK;
                load_run(k->x, k->xk, at, len, xv);
                load_run(k->y, k->yk, at, len, yv);
                for (Py_ssize_t j = 0; j < len; j++) {
                    double d = xv[j] - mc, xhat = d * scc, g = yv[j] * wc;
                    v[0][j] = yv[j];
                    v[1][j] = yv[j] * xhat;
                    v[2][j] = g;
                    v[3][j] = g * xhat;
                }
                for (int i = 0; i < 4; i++) {
                    if (pass == 0)
                        lanes_max(v[i], len, top[i]);
                    else
                        lanes_sum(v[i], len, inv[i], lane[i]);
                }
            }
        if (pass == 0)
            for (int i = 0; i < 4; i++) {
                units[i] = unit_of(lanes_top(top[i], &bad), k->beta);
                inv[i] = 1.0 / units[i];
            }
    }
    for (int i = 0; i < 4; i++) ((double *)k->out)[4 * c + i] = lanes_total(lane[i]) * units[i];
    return !bad;
}

/* Channels [lo, hi) of p_chansum (one slice) or p_bnsums. */
static void chan_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    chan_ctx *k = (chan_ctx *)p;
    int ok = 1;
    for (Py_ssize_t c = lo; c < hi; c++) {
        if (k->expr < 0)
            ok &= bnsums_channel(k, c);
        else
            ok &= chansum_one(k, c, k->m ? k->m[c] : 0.0, k->sc ? k->sc[c] : 1.0,
                              k->w ? k->w[c] : 1.0, (double *)k->out + c);
    }
    if (!ok) __atomic_store_n(&k->bad, 1, __ATOMIC_RELAXED);
}

/* The sizes and buffers every batch norm kernel takes: (N, C, S) x and y (y may be None), C
   values in each per-channel buffer present; out the `out_count` elements it writes. */
static int chan_args(const char *k, chan_ctx *c, const buffer_t *x, const buffer_t *y,
                     const buffer_t *per_channel[], int channels, const buffer_t *out,
                     Py_ssize_t out_count, int out_kind) {
    const Py_ssize_t n = c->N * c->C * c->S;
    if (!size_ok(k, "n", c->N) || !size_ok(k, "c", c->C) || !size_ok(k, "s", c->S) ||
        !buffer_holds(k, "x", x, n, ANY_KIND) || !buffer_holds(k, "y", y, n, ANY_KIND) ||
        !buffer_holds(k, "out", out, out_count, out_kind))
        return 0;
    for (int i = 0; i < channels; i++)
        if (!buffer_holds(k, "a per-channel buffer", per_channel[i], c->C, KIND_F64)) return 0;
    c->x = x->data, c->xk = x->kind, c->y = y->data, c->yk = y->kind, c->out = out->data;
    c->ok = out->kind;
    return 1;
}

/* p_chansum(expr, n, c, s, beta, count, x, y, mean, scale, weight, out): out[c] = the exact sum
   over n and s of the expression (0: x; 1: (x - m)^2; 2: y (x - m) s; 3: y w;
   4: (y w)((x - m) s)), as exact_sum computes it from `count` slices (y, mean, scale and weight
   may be None: 0, 1, 1). Returns False where a value is not finite. */
static PyObject *p_chansum(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"expr", "n",    "c",     "s",      "beta", "count", "x",
                         "y",    "mean", "scale", "weight", "out",  NULL};
    chan_ctx k;
    int count;
    buffer_t x, y, m, s, w, out;
    memset(&k, 0, sizeof k);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "innniiO&O&O&O&O&O&", kw, &k.expr, &k.N, &k.C,
                                     &k.S, &k.beta, &count, buffer, &x, optional_buffer, &y,
                                     optional_buffer, &m, optional_buffer, &s, optional_buffer, &w,
                                     buffer, &out))
        return NULL;
    if (count < 1 || count > 3) {
        PyErr_SetString(PyExc_ValueError, "count");
        return NULL;
    }
    if (k.expr < 0 || k.expr > 4 || (k.expr >= 2 && y.kind < 0)) {
        PyErr_SetString(PyExc_ValueError, "p_chansum: expr is 0 to 4, and 2 to 4 take y");
        return NULL;
    }
    const buffer_t *channels[] = {&m, &s, &w};
    if (!chan_args("p_chansum", &k, &x, &y, channels, 3, &out, k.C, KIND_F64)) return NULL;
    k.m = F64_OR_NULL(m), k.sc = F64_OR_NULL(s), k.w = F64_OR_NULL(w);
    int finite;
    Py_BEGIN_ALLOW_THREADS
    if (count == 1) {
        parallel_for(k.C, k.N * k.C * k.S * 2, chan_range, &k);
        finite = !k.bad;
    } else {
        finite = chansum_slices(&k, count);
    }
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(finite);
}

/* p_chanmap's loops over channels [c0, c1), by chunks (see CHUNK), each formula one plain loop. */
CLONED
static void chanmap_loops(const chan_ctx *k, Py_ssize_t c0, Py_ssize_t c1) {
    double v[CHUNK], yv[CHUNK];
    const Py_ssize_t N = k->N, C = k->C, S = k->S;
    const int expr = k->expr;
    for (Py_ssize_t n = 0; n < N; n++)
        for (Py_ssize_t c = c0; c < c1; c++) {
            const double mc = k->m ? k->m[c] : 0.0, scc = k->sc[c], wc = k->w ? k->w[c] : 1.0;
            for (Py_ssize_t j0 = 0; j0 < S; j0 += CHUNK) {
                const Py_ssize_t at = (n * C + c) * S + j0, len = S - j0 < CHUNK ? S - j0 : CHUNK;
                if (expr != 2) load_run(k->x, k->xk, at, len, v);
                if (expr != 0) load_run(k->y, k->yk, at, len, yv);
                if (expr == 0) {
                    for (Py_ssize_t j = 0; j < len; j++) {
                        double d = v[j] - mc;
                        v[j] = d * scc;
                    }
                    if (k->w)
                        for (Py_ssize_t j = 0; j < len; j++) v[j] = v[j] * wc;
                    if (k->b) {
                        const double bc = k->b[c];
                        for (Py_ssize_t j = 0; j < len; j++) v[j] = v[j] + bc;
                    }
                } else if (expr == 1) {
                    const double q1 = k->p1[c], q2 = k->p2[c];
                    for (Py_ssize_t j = 0; j < len; j++) {
                        double g = yv[j] * wc, d = v[j] - mc;
                        double xhat = d * scc, t = g - q1, u = xhat * q2;
                        t = t - u;
                        v[j] = t * scc;
                    }
                } else {
                    for (Py_ssize_t j = 0; j < len; j++) {
                        double g = yv[j] * wc;
                        v[j] = g * scc;
                    }
                }
                store_run(k->out, k->ok, at, len, v);
            }
        }
}

static void chanmap_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    chanmap_loops((const chan_ctx *)p, lo, hi);
}

/* p_chanmap(expr, n, c, s, x, y, mean, scale, weight, bias, p1, p2, out), per element, rounded
   once into out (float32 or float64):
   0 the forward  ((x - m) s) w + b (w, b where given)
   1 the training backward  ((y w - p1) - ((x - m) s) p2) s
   2 the evaluation backward  (y w) s */
static PyObject *p_chanmap(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"expr",  "n",      "c",    "s",  "x",  "y",   "mean",
                         "scale", "weight", "bias", "p1", "p2", "out", NULL};
    chan_ctx k;
    buffer_t x, y, m, s, w, b, p1, p2, out;
    memset(&k, 0, sizeof k);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "innnO&O&O&O&O&O&O&O&O&", kw, &k.expr, &k.N,
                                     &k.C, &k.S, buffer, &x, optional_buffer, &y, optional_buffer,
                                     &m, buffer, &s, optional_buffer, &w, optional_buffer, &b,
                                     optional_buffer, &p1, optional_buffer, &p2, buffer, &out))
        return NULL;
    if (k.expr < 0 || k.expr > 2 || (k.expr != 0 && y.kind < 0) ||
        (k.expr == 1 && (p1.kind < 0 || p2.kind < 0))) {
        PyErr_SetString(PyExc_ValueError,
                        "p_chanmap: expr is 0 to 2; 1 and 2 take y, 1 takes p1 and p2");
        return NULL;
    }
    const buffer_t *channels[] = {&m, &s, &w, &b, &p1, &p2};
    if (!chan_args("p_chanmap", &k, &x, &y, channels, 6, &out, k.N * k.C * k.S, ANY_KIND))
        return NULL;
    k.m = F64_OR_NULL(m), k.sc = F64(s), k.w = F64_OR_NULL(w), k.b = F64_OR_NULL(b);
    k.p1 = F64_OR_NULL(p1), k.p2 = F64_OR_NULL(p2);
    Py_BEGIN_ALLOW_THREADS
    parallel_for(k.C, k.N * k.C * k.S, chanmap_range, &k);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* p_bnsums(n, c, s, beta, x, y, mean, scale, weight, out): batch norm's four backward sums per
   channel in two passes (p_chansum's expressions 0, 2, 3 and 4 of y = the incoming gradient),
   one slice each: out[4c + i] is what p_chansum(expr i...) gives, bit for bit. */
static PyObject *p_bnsums(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"n", "c", "s", "beta", "x", "y", "mean", "scale", "weight", "out", NULL};
    chan_ctx k;
    buffer_t x, y, m, s, w, out;
    memset(&k, 0, sizeof k);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nnniO&O&O&O&O&O&", kw, &k.N, &k.C, &k.S,
                                     &k.beta, buffer, &x, buffer, &y, buffer, &m, buffer, &s,
                                     buffer, &w, buffer, &out))
        return NULL;
    const buffer_t *channels[] = {&m, &s, &w};
    if (!chan_args("p_bnsums", &k, &x, &y, channels, 3, &out, 4 * k.C, KIND_F64)) return NULL;
    k.expr = -1, k.m = F64(m), k.sc = F64(s), k.w = F64(w);
    Py_BEGIN_ALLOW_THREADS
    parallel_for(k.C, k.N * k.C * k.S * 2, chan_range, &k);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(!k.bad);
}

/* The exact sum of n float64 values at one slice (p_rowsum's count 1), from their largest
   magnitude; *bad set where one is infinite or NaN. */
static double exact_one(const double *v, Py_ssize_t n, int beta, int *bad) {
    double amax = row_max((const char *)v, KIND_F64, 0, n, bad);
    double unit = unit_of(amax, beta), inv = 1.0 / unit;
    double lane[4] = {0, 0, 0, 0};
    Py_ssize_t j = 0;
    for (; j + 4 <= n; j += 4)
        for (int l = 0; l < 4; l++) lane[l] += round_even(v[j + l] * inv);
    for (; j < n; j++) lane[0] += round_even(v[j] * inv);
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) * unit;
}

/* p_lnfwd(rows, cols, beta, x, weight, bias, eps, out, mean, rstd): layer norm over each row,
   float32 precision (norms.layer_norm's expressions; weight, bias float64 or None). */
static PyObject *p_lnfwd(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"rows", "cols", "beta", "x",    "weight", "bias",
                         "eps",  "out",  "mean", "rstd", NULL};
    Py_ssize_t rows, cols;
    int beta, bad = 0;
    buffer_t xb, wb, bb, ob, mb, rb;
    double eps;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nniO&O&O&dO&O&O&", kw, &rows, &cols, &beta,
                                     buffer, &xb, optional_buffer, &wb, optional_buffer, &bb, &eps,
                                     buffer, &ob, buffer, &mb, buffer, &rb))
        return NULL;
    const char *k = "p_lnfwd";
    if (!size_ok(k, "rows", rows) || !size_ok(k, "cols", cols) ||
        !buffer_holds(k, "x", &xb, rows * cols, ANY_KIND) ||
        !buffer_holds(k, "weight", &wb, cols, KIND_F64) ||
        !buffer_holds(k, "bias", &bb, cols, KIND_F64) ||
        !buffer_holds(k, "out", &ob, rows * cols, ANY_KIND) ||
        !buffer_holds(k, "mean", &mb, rows, KIND_F64) ||
        !buffer_holds(k, "rstd", &rb, rows, KIND_F64))
        return NULL;
    const char *x = xb.data;
    const int xk = xb.kind, ok = ob.kind;
    const double *w = F64_OR_NULL(wb), *b = F64_OR_NULL(bb);
    double *mean = F64(mb), *rstd = F64(rb);
    char *out = ob.data;
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

/* p_lnbwd(rows, cols, beta_row, beta_col, x, grad, mean, rstd, weight, grad_input, grad_weight,
   grad_bias): layer norm's backward at float32 precision (norms.layer_norm_backward's
   expressions): per row the input gradient (into grad_input, None to skip), per column the exact
   sums of grad * x-hat and grad into grad_weight and grad_bias (float64, None to skip). mean and
   rstd are the saved statistics as float64; weight float64 or None. */
static PyObject *p_lnbwd(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"rows", "cols",   "beta_row",   "beta_col",    "x",         "grad", "mean",
                         "rstd", "weight", "grad_input", "grad_weight", "grad_bias", NULL};
    Py_ssize_t rows, cols;
    int br, bc, bad = 0;
    buffer_t xb, gb_, mb, rb, wb, ib, gwb, gbb;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nniiO&O&O&O&O&O&O&O&", kw, &rows, &cols, &br,
                                     &bc, buffer, &xb, buffer, &gb_, buffer, &mb, buffer, &rb,
                                     optional_buffer, &wb, optional_buffer, &ib, optional_buffer,
                                     &gwb, optional_buffer, &gbb))
        return NULL;
    const char *k = "p_lnbwd";
    const Py_ssize_t n = rows * cols;
    if (!size_ok(k, "rows", rows) || !size_ok(k, "cols", cols) ||
        !buffer_holds(k, "x", &xb, n, ANY_KIND) || !buffer_holds(k, "grad", &gb_, n, ANY_KIND) ||
        !buffer_holds(k, "mean", &mb, rows, KIND_F64) ||
        !buffer_holds(k, "rstd", &rb, rows, KIND_F64) ||
        !buffer_holds(k, "weight", &wb, cols, KIND_F64) ||
        !buffer_holds(k, "grad_input", &ib, n, ANY_KIND) ||
        !buffer_holds(k, "grad_weight", &gwb, cols, KIND_F64) ||
        !buffer_holds(k, "grad_bias", &gbb, cols, KIND_F64))
        return NULL;
    const char *x = xb.data, *go = gb_.data;
    const int xk = xb.kind, gk = gb_.kind, ok = ib.kind;
    const double *mean = F64(mb), *rstd = F64(rb), *w = F64_OR_NULL(wb);
    char *gi = ib.kind < 0 ? NULL : ib.data;
    double *gw = F64_OR_NULL(gwb), *gb = F64_OR_NULL(gbb);
    double *g = (double *)malloc(sizeof(double) * (cols > 0 ? cols : 1) * 2);
    double *cmax = (double *)calloc((size_t)(cols > 0 ? cols : 1) * 2, sizeof(double));
    double *cacc = (double *)calloc((size_t)(cols > 0 ? cols : 1) * 2, sizeof(double));
    if (!g || !cmax || !cacc) {
        free(g), free(cmax), free(cacc);
        return PyErr_NoMemory();
    }
    double *gx = g + cols;
    Py_BEGIN_ALLOW_THREADS
    if (gi) {
        for (Py_ssize_t r = 0; r < rows && !bad; r++) {
            const Py_ssize_t at = r * cols;
            const double m = mean[r], s = rstd[r], nc = (double)cols;
            for (Py_ssize_t j = 0; j < cols; j++) {
                double xhat = (load(x, xk, at + j) - m) * s;
                g[j] = w ? load(go, gk, at + j) * w[j] : load(go, gk, at + j);
                gx[j] = g[j] * xhat;
            }
            const double p1 = exact_one(g, cols, br, &bad) / nc;
            const double p2 = exact_one(gx, cols, br, &bad) / nc;
            for (Py_ssize_t j = 0; j < cols; j++) {
                double xhat = (load(x, xk, at + j) - m) * s;
                store(gi, ok, at + j, ((g[j] - p1) - xhat * p2) * s);
            }
        }
    }
    if ((gw || gb) && !bad) { /* columns: one pass for the maxima, one for the sums */
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 1)
                for (Py_ssize_t j = 0; j < 2 * cols; j++) cmax[j] = unit_of(cmax[j], bc);
            for (Py_ssize_t r = 0; r < rows; r++) {
                const Py_ssize_t at = r * cols;
                const double m = mean[r], s = rstd[r];
                for (Py_ssize_t j = 0; j < cols; j++) {
                    double gv = load(go, gk, at + j);
                    double prod = gv * ((load(x, xk, at + j) - m) * s);
                    if (pass == 0) { /* cmax: the largest magnitudes, then (pass 1) the units */
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
    Py_END_ALLOW_THREADS
    free(g), free(cmax), free(cacc);
    return PyBool_FromLong(!bad);
}

static PyMethodDef methods[] = {
    {"p_chansum", KEYWORDS(p_chansum), "Portable mode: batch norm's exact per-channel sums."},
    {"p_chanmap", KEYWORDS(p_chanmap), "Portable mode: batch norm's per-element formulas."},
    {"p_bnsums", KEYWORDS(p_bnsums), "Portable mode: batch norm's four backward sums at once."},
    {"p_lnfwd", KEYWORDS(p_lnfwd), "Portable mode: layer norm over rows (float32 precision)."},
    {"p_lnbwd", KEYWORDS(p_lnbwd), "Portable mode: layer norm's backward (float32 precision)."},
    {NULL, NULL, 0, NULL},
};

int bind_portable_norms(PyObject *module) { return PyModule_AddFunctions(module, methods); }
