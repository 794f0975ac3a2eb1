/* Portable mode's elementwise kernels: p_init (the functions' coefficients), p_kernels (their
   names, in code order), p_unary (a function of one float32/float64 buffer into another, element
   by element) and p_binary (a function of (gradient, input) for the backward of GELU and SiLU;
   softplus). The functions themselves are functions.h's. */

#include "functions.h"

poly_t EXP, ATANH, ERF, ERFCX, SIN, COS, EXPM1;
double LN2_HI, LN2_LO, INV_LN2, SQRT_HALF, TWO_OVER_SQRT_PI, HALF_PI, EXPM1_SMALL;
double GELU_K, GELU_C, GELU_3C, INV_SQRT_2PI;
static int ready = 0;

int check_ready(void) {
    if (!ready) PyErr_SetString(PyExc_RuntimeError, "twice._native: p_init was not called");
    return ready;
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
    for (Py_ssize_t i = 0; i < n; i++)
        out->c[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
    out->n = (int)n;
    Py_DECREF(fast);
    return PyErr_Occurred() ? -1 : 0;
}

/* p_init(polynomials, constants): coefficients.py's KERNEL_ARGS, taken as they come. */
static PyObject *p_init(PyObject *module, PyObject *args) {
    PyObject *polys[7];
    if (!PyArg_ParseTuple(args, "(OOOOOOO)(ddddddddddd)", &polys[0], &polys[1], &polys[2],
                          &polys[3], &polys[4], &polys[5], &polys[6], &LN2_HI, &LN2_LO, &INV_LN2,
                          &SQRT_HALF, &TWO_OVER_SQRT_PI, &HALF_PI, &EXPM1_SMALL, &GELU_K, &GELU_C,
                          &GELU_3C, &INV_SQRT_2PI))
        return NULL;
    poly_t *targets[7] = {&EXP, &ATANH, &ERF, &ERFCX, &SIN, &COS, &EXPM1};
    for (int i = 0; i < 7; i++)
        if (read_poly(polys[i], targets[i]) < 0) return NULL;
    ready = 1;
    Py_RETURN_NONE;
}

/* The kernels by code: p_unary's and p_binary's `kernel` is the index of its name here. These
   lists are the C spelling of portable/arithmetic/coefficients.py's UNARY_KERNELS and
   BINARY_KERNELS, the one table of the kernels: twice.portable.native uses this module only where
   p_kernels() returns exactly that table, and a test holds the two equal. */
static const char *const UNARY_NAMES[] = {"exp", "log",  "log1p", "expm1",     "tanh", "sigmoid",
                                          "erf", "silu", "gelu",  "gelu_tanh", "sqrt"};
static const char *const BINARY_NAMES[] = {"gelu_backward", "gelu_tanh_backward", "silu_backward",
                                           "softplus"};
#define UNARY_COUNT ((int)(sizeof UNARY_NAMES / sizeof *UNARY_NAMES))
#define BINARY_COUNT ((int)(sizeof BINARY_NAMES / sizeof *BINARY_NAMES))

static PyObject *names_tuple(const char *const *names, Py_ssize_t count) {
    PyObject *out = PyTuple_New(count);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyUnicode_FromString(names[i]);
        if (!name) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, name);
    }
    return out;
}

/* p_kernels(): (the unary kernels' names, the binary kernels' names), each in code order. */
static PyObject *p_kernels(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    PyObject *unary = names_tuple(UNARY_NAMES, UNARY_COUNT);
    PyObject *binary = unary ? names_tuple(BINARY_NAMES, BINARY_COUNT) : NULL;
    if (!binary) {
        Py_XDECREF(unary);
        return NULL;
    }
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

/* A float32 square root straight from float32: the IEEE instruction is correctly rounded, as
   is (float)sqrt((double)x), so the two agree; this one vectorises. */
static void sqrt_f32(const float *x, float *y, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) y[i] = (x[i] < 0 || x[i] != x[i]) ? (float)NAN : sqrtf(x[i]);
}

/* f_sqrt of float64 input or into float64 output, one kind of each a loop. */
static void sqrt_f64(const char *s, int sk, char *d, int dk, Py_ssize_t n) {
    if (sk && dk)
        for (Py_ssize_t i = 0; i < n; i++) ((double *)d)[i] = f_sqrt(((const double *)s)[i]);
    else if (sk)
        for (Py_ssize_t i = 0; i < n; i++) ((float *)d)[i] = (float)f_sqrt(((const double *)s)[i]);
    else
        for (Py_ssize_t i = 0; i < n; i++) ((double *)d)[i] = f_sqrt((double)((const float *)s)[i]);
}

CLONED
static void unary_loops(int fn, const char *s, int sk, char *d, int dk, Py_ssize_t n) {
    if (fn < 10)
        unary_chunked(fn, s, sk, d, dk, n);
    else if (!sk && !dk)
        sqrt_f32((const float *)s, (float *)d, n);
    else
        sqrt_f64(s, sk, d, dk, n);
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
    unary_loops(c->fn, c->s + lo * (c->sk ? 8 : 4), c->sk, c->d + lo * (c->dk ? 8 : 4), c->dk,
                hi - lo);
}

/* p_unary(kernel, src, dst): dst = the function of src, element by element (dst's count). */
static PyObject *p_unary(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"kernel", "src", "dst", NULL};
    int fn;
    buffer_t src, dst;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO&O&", kw, &fn, buffer, &src, buffer, &dst))
        return NULL;
    if (!check_ready()) return NULL;
    if (fn < 0 || fn >= UNARY_COUNT) {
        PyErr_SetString(PyExc_ValueError, "unknown function");
        return NULL;
    }
    const Py_ssize_t n = dst.count;
    if (!buffer_holds("p_unary", "src", &src, n, ANY_KIND)) return NULL;
    unary_ctx ctx = {fn, src.data, src.kind, dst.data, dst.kind};
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
        for (Py_ssize_t i = lo; i < hi; i++)
            store(c->d, c->dk, i, f_softplus(load(c->x, c->xk, i), c->a, c->b));
        return;
    }
    binary_chunked(c->fn, c->g + lo * gs, c->gk, c->x + lo * xs, c->xk, c->d + lo * ds, c->dk,
                   hi - lo);
}

/* p_binary(kernel, grad, x, dst, a, b): 0 GELU, 1 GELU (tanh), 2 SiLU backward of (grad, x);
   3 softplus of x (grad None; a, b = beta, threshold). dst's count elements. */
static PyObject *p_binary(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"kernel", "grad", "x", "dst", "a", "b", NULL};
    int fn;
    buffer_t grad, x, dst;
    double a = 0, b = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO&O&O&|dd", kw, &fn, optional_buffer, &grad,
                                     buffer, &x, buffer, &dst, &a, &b))
        return NULL;
    if (!check_ready()) return NULL;
    if (fn < 0 || fn >= BINARY_COUNT) {
        PyErr_SetString(PyExc_ValueError, "unknown function");
        return NULL;
    }
    if (fn != 3 && grad.kind < 0) {
        PyErr_SetString(PyExc_ValueError, "p_binary: a backward takes grad");
        return NULL;
    }
    const Py_ssize_t n = dst.count;
    if (!buffer_holds("p_binary", "grad", &grad, n, ANY_KIND) ||
        !buffer_holds("p_binary", "x", &x, n, ANY_KIND))
        return NULL;
    binary_ctx ctx = {fn, grad.data, grad.kind, x.data, x.kind, dst.data, dst.kind, a, b};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(n, n * 8, binary_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"p_init", p_init, METH_VARARGS,
     "Portable mode: the coefficients of the elementwise functions."},
    {"p_kernels", p_kernels, METH_NOARGS, "Portable mode: the kernels' names, in code order."},
    {"p_unary", KEYWORDS(p_unary), "Portable mode: an elementwise function of a buffer."},
    {"p_binary", KEYWORDS(p_binary), "Portable mode: a backward of GELU/SiLU, or softplus."},
    {NULL, NULL, 0, NULL},
};

int bind_portable_unary(PyObject *module) { return PyModule_AddFunctions(module, methods); }
