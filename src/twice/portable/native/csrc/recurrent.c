/* Portable mode's LSTM kernels (twice/portable/ops/recurrent.py and cells.py): one time step of
   torch's CPU cell for `rows` samples of `hidden` units, the gates' functions twice's own
   (sigmoid_chunk, tanh_chunk: p_unary's), every other operation one IEEE operation in the
   layer's dtype (float32 or float64) in the order recurrent.py's torch fallback spells it, so
   the two give the same bits.

   p_lstm_cell, p_lstm_cell_backward  one LSTM time step, forward and backward
   p_lstm_step, p_lstm_step_backward  the same from the step's integer product, scaled, and the
               next product's operand cut */

#include "functions.h"

/* p_lstm_step's buffers: the product of the integers (float64, rows x columns) with its units
   (ua per row, ub per column), the cell's, and the cut's (ints, units). */
typedef struct {
    int kind, beta, bad;
    Py_ssize_t H;
    const double *prod, *ua, *ub;
    const char *bias, *gx, *c, *dy, *dh, *dc, *act, *tanh_c, *c_prev;
    char *act_out, *c_out, *tanh_out, *h_out, *dgates, *dc_out;
    double *ints, *units;
} lstm_step_ctx;

#define T float
#define TYPED(name) name##_float
#include "recurrent_typed.h"
#undef T
#undef TYPED

#define T double
#define TYPED(name) name##_double
#include "recurrent_typed.h"
#undef T
#undef TYPED

/* Whether each buffer (the absent ones aside) holds its count of elements of `kind`. */
static int buffers_hold(const char *kernel, int n, const char *const names[],
                        const buffer_t *const bufs[], const Py_ssize_t counts[], int kind) {
    for (int i = 0; i < n; i++)
        if (!buffer_holds(kernel, names[i], bufs[i], counts[i], kind)) return 0;
    return 1;
}

/* The sizes a kernel takes, not negative. */
static int sizes_ok(const char *kernel, Py_ssize_t rows, Py_ssize_t hidden) {
    return size_ok(kernel, "rows", rows) && size_ok(kernel, "hidden", hidden);
}

typedef struct {
    int kind, backward;
    Py_ssize_t hidden;
    const void *a, *b, *c, *d, *e, *f;
    void *g, *h, *i, *j;
} lstm_ctx;

static void lstm_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const lstm_ctx *x = (const lstm_ctx *)p;
    const Py_ssize_t H = x->hidden;
    if (!x->backward) {
        if (x->kind)
            lstm_forward_double(lo, hi, H, x->a, x->b, x->c, x->d, x->g, x->h, x->i, x->j);
        else
            lstm_forward_float(lo, hi, H, x->a, x->b, x->c, x->d, x->g, x->h, x->i, x->j);
    } else {
        if (x->kind)
            lstm_backward_double(lo, hi, H, x->a, x->b, x->c, x->d, x->e, x->f, x->g, x->h);
        else
            lstm_backward_float(lo, hi, H, x->a, x->b, x->c, x->d, x->e, x->f, x->g, x->h);
    }
}

/* p_lstm_cell(rows, hidden, hg, bias, gx, c, act, c_out, tanh_c, h): the forward (see
   lstm_forward); every buffer contiguous, of hg's dtype; bias None where there is none. */
static PyObject *p_lstm_cell(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"rows", "hidden", "hg",     "bias", "gx", "c",
                         "act",  "c_out",  "tanh_c", "h",    NULL};
    Py_ssize_t rows, H;
    buffer_t hg, bias, gx, c, act, c_out, tanh_c, h;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nnO&O&O&O&O&O&O&O&", kw, &rows, &H, buffer, &hg,
                                     optional_buffer, &bias, buffer, &gx, buffer, &c, buffer, &act,
                                     buffer, &c_out, buffer, &tanh_c, buffer, &h))
        return NULL;
    if (!check_ready() || !sizes_ok("p_lstm_cell", rows, H)) return NULL;
    const char *const names[] = {"hg", "bias", "gx", "c", "act", "c_out", "tanh_c", "h"};
    const buffer_t *const bufs[] = {&hg, &bias, &gx, &c, &act, &c_out, &tanh_c, &h};
    const Py_ssize_t G = 4 * rows * H, R = rows * H;
    const Py_ssize_t counts[] = {G, 4 * H, G, R, G, R, R, R};
    if (!buffers_hold("p_lstm_cell", 8, names, bufs, counts, hg.kind)) return NULL;
    lstm_ctx ctx = {hg.kind, 0,    H,        hg.data,    bias.data,   gx.data, c.data,
                    NULL,    NULL, act.data, c_out.data, tanh_c.data, h.data};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(rows, rows * H * 16, lstm_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* p_lstm_cell_backward(rows, hidden, dy, dh, dc, act, tanh_c, c_prev, dgates, dc_out): the
   backward (see lstm_backward); dy, dh and dc may be None (absent); of act's dtype. */
static PyObject *p_lstm_cell_backward(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"rows",   "hidden", "dy",     "dh",     "dc", "act",
                         "tanh_c", "c_prev", "dgates", "dc_out", NULL};
    Py_ssize_t rows, H;
    buffer_t dy, dh, dc, act, tanh_c, c_prev, dgates, dc_out;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nnO&O&O&O&O&O&O&O&", kw, &rows, &H,
                                     optional_buffer, &dy, optional_buffer, &dh, optional_buffer,
                                     &dc, buffer, &act, buffer, &tanh_c, buffer, &c_prev, buffer,
                                     &dgates, buffer, &dc_out))
        return NULL;
    if (!check_ready() || !sizes_ok("p_lstm_cell_backward", rows, H)) return NULL;
    const char *const names[] = {"dy", "dh", "dc", "act", "tanh_c", "c_prev", "dgates", "dc_out"};
    const buffer_t *const bufs[] = {&dy, &dh, &dc, &act, &tanh_c, &c_prev, &dgates, &dc_out};
    const Py_ssize_t G = 4 * rows * H, R = rows * H;
    const Py_ssize_t counts[] = {R, R, R, G, R, R, G, R};
    if (!buffers_hold("p_lstm_cell_backward", 8, names, bufs, counts, act.kind)) return NULL;
    lstm_ctx ctx = {act.kind,    1,           H,           dy.data,     dh.data, dc.data, act.data,
                    tanh_c.data, c_prev.data, dgates.data, dc_out.data, NULL,    NULL};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(rows, rows * H * 4, lstm_range, &ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static void lstm_step_range(void *p, Py_ssize_t lo, Py_ssize_t hi, int backward) {
    lstm_step_ctx *s = (lstm_step_ctx *)p;
    const size_t size = s->kind ? 8 : 4;
    void *buf = malloc(size * (size_t)((hi - lo) * 4 * s->H + 1));
    int ok;
    if (!buf) {
        __atomic_store_n(&s->bad, 2, __ATOMIC_RELAXED);
        return;
    }
    if (backward)
        ok = s->kind ? lstm_step_back_double(s, lo, hi, buf) : lstm_step_back_float(s, lo, hi, buf);
    else
        ok = s->kind ? lstm_step_double(s, lo, hi, buf) : lstm_step_float(s, lo, hi, buf);
    free(buf);
    if (!ok) __atomic_fetch_or(&s->bad, 1, __ATOMIC_RELAXED);
}

static void lstm_step_fwd_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    lstm_step_range(p, lo, hi, 0);
}

static void lstm_step_back_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    lstm_step_range(p, lo, hi, 1);
}

static PyObject *step_done(const lstm_step_ctx *s) {
    if (s->bad & 2) return PyErr_NoMemory();
    return PyBool_FromLong(!s->bad);
}

/* p_lstm_step and p_lstm_step_backward: one LSTM time step whole but for the recurrent product,
   for recurrent.py's loop (cells.py). The step takes the product of the integers with its units
   and scales and rounds it as p_scale does, runs p_lstm_cell (p_lstm_cell_backward) on it, and
   cuts the result the next product takes (the hidden state forward, the gates' gradients
   backward) into integers on each row's unit, as p_split's axis 0 does: the same operations as
   the separate kernels, in one call. Each returns False where the cut met a value not finite
   (the caller then cuts it its own way). Positional, as they run once a time step. */

/* p_lstm_step(rows, hidden, beta, prod, ua, ub, bias, gx, c, act, c_out, tanh_c, h, ints, units):
   prod (rows x 4 hidden), ua (rows), ub (4 hidden) float64; bias None where there is none; ints
   (rows x hidden) and units (rows) receive h's cut; the rest of gx's dtype. */
static PyObject *p_lstm_step(PyObject *module, PyObject *args) {
    lstm_step_ctx s;
    buffer_t prod, ua, ub, bias, gx, c, act, c_out, tanh_c, h, ints, units;
    Py_ssize_t rows;
    memset(&s, 0, sizeof s);
    if (!PyArg_ParseTuple(args, "nniO&O&O&O&O&O&O&O&O&O&O&O&", &rows, &s.H, &s.beta, buffer, &prod,
                          buffer, &ua, buffer, &ub, optional_buffer, &bias, buffer, &gx, buffer, &c,
                          buffer, &act, buffer, &c_out, buffer, &tanh_c, buffer, &h, buffer, &ints,
                          buffer, &units))
        return NULL;
    if (!check_ready() || !sizes_ok("p_lstm_step", rows, s.H)) return NULL;
    const Py_ssize_t G = 4 * rows * s.H, R = rows * s.H;
    const char *const names[] = {"bias", "gx",   "c",  "act", "c_out", "tanh_c",
                                 "h",    "prod", "ua", "ub",  "ints",  "units"};
    const buffer_t *const bufs[] = {&bias, &gx,   &c,  &act, &c_out, &tanh_c,
                                    &h,    &prod, &ua, &ub,  &ints,  &units};
    const Py_ssize_t counts[] = {4 * s.H, G, R, G, R, R, R, G, rows, 4 * s.H, R, rows};
    if (!buffers_hold("p_lstm_step", 7, names, bufs, counts, gx.kind) ||
        !buffers_hold("p_lstm_step", 5, names + 7, bufs + 7, counts + 7, KIND_F64))
        return NULL;
    s.kind = gx.kind, s.prod = F64(prod), s.ua = F64(ua), s.ub = F64(ub), s.bias = bias.data;
    s.gx = gx.data, s.c = c.data, s.act_out = act.data, s.c_out = c_out.data;
    s.tanh_out = tanh_c.data, s.h_out = h.data, s.ints = F64(ints), s.units = F64(units);
    Py_BEGIN_ALLOW_THREADS
    parallel_for(rows, rows * s.H * 16, lstm_step_fwd_range, &s);
    Py_END_ALLOW_THREADS
    return step_done(&s);
}

/* p_lstm_step_backward(rows, hidden, beta, prod, ua, ub, dh, dy, dc, act, tanh_c, c_prev,
   dgates, dc_out, ints, units): the incoming hidden gradient is prod (rows x hidden, float64)
   scaled by ua (rows) and ub (hidden) where prod is not None, else dh (None: none); dy and dc may
   be None; ints (rows x 4 hidden) and units (rows) receive the gates' gradients' cut; the rest
   of act's dtype. */
static PyObject *p_lstm_step_backward(PyObject *module, PyObject *args) {
    lstm_step_ctx s;
    buffer_t prod, ua, ub, dh, dy, dc, act, tanh_c, c_prev, dgates, dc_out, ints, units;
    Py_ssize_t rows;
    memset(&s, 0, sizeof s);
    if (!PyArg_ParseTuple(args, "nniO&O&O&O&O&O&O&O&O&O&O&O&O&", &rows, &s.H, &s.beta,
                          optional_buffer, &prod, optional_buffer, &ua, buffer, &ub,
                          optional_buffer, &dh, optional_buffer, &dy, optional_buffer, &dc, buffer,
                          &act, buffer, &tanh_c, buffer, &c_prev, buffer, &dgates, buffer, &dc_out,
                          buffer, &ints, buffer, &units))
        return NULL;
    if (!check_ready() || !sizes_ok("p_lstm_step_backward", rows, s.H)) return NULL;
    if ((prod.kind < 0) != (ua.kind < 0)) {
        PyErr_SetString(PyExc_ValueError, "p_lstm_step_backward: prod and ua go together");
        return NULL;
    }
    const Py_ssize_t G = 4 * rows * s.H, R = rows * s.H;
    const char *const names[] = {"dh",     "dy",   "dc", "act", "tanh_c", "c_prev", "dgates",
                                 "dc_out", "prod", "ua", "ub",  "ints",   "units"};
    const buffer_t *const bufs[] = {&dh,     &dy,   &dc, &act, &tanh_c, &c_prev, &dgates,
                                    &dc_out, &prod, &ua, &ub,  &ints,   &units};
    const Py_ssize_t counts[] = {R, R, R, G, R, R, G, R, R, rows, s.H, G, rows};
    if (!buffers_hold("p_lstm_step_backward", 8, names, bufs, counts, act.kind) ||
        !buffers_hold("p_lstm_step_backward", 5, names + 8, bufs + 8, counts + 8, KIND_F64))
        return NULL;
    s.kind = act.kind, s.prod = F64_OR_NULL(prod), s.ua = F64_OR_NULL(ua), s.ub = F64(ub);
    s.dh = dh.data, s.dy = dy.data, s.dc = dc.data, s.act = act.data, s.tanh_c = tanh_c.data;
    s.c_prev = c_prev.data, s.dgates = dgates.data, s.dc_out = dc_out.data;
    s.ints = F64(ints), s.units = F64(units);
    Py_BEGIN_ALLOW_THREADS
    parallel_for(rows, rows * s.H * 8, lstm_step_back_range, &s);
    Py_END_ALLOW_THREADS
    return step_done(&s);
}

static PyMethodDef methods[] = {
    {"p_lstm_cell", KEYWORDS(p_lstm_cell), "Portable mode: one LSTM step, forward."},
    {"p_lstm_cell_backward", KEYWORDS(p_lstm_cell_backward),
     "Portable mode: one LSTM step, backward."},
    {"p_lstm_step", p_lstm_step, METH_VARARGS,
     "Portable mode: one LSTM step forward from its integer product, the next hidden state cut."},
    {"p_lstm_step_backward", p_lstm_step_backward, METH_VARARGS,
     "Portable mode: one LSTM step backward from its integer product, the gates' gradients cut."},
    {NULL, NULL, 0, NULL},
};

int bind_portable_recurrent(PyObject *module) { return PyModule_AddFunctions(module, methods); }
