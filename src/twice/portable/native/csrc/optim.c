/* Portable mode's optimizer step in one pass (twice.portable.native.optim):

   p_adam  one parameter's step of torch's single-tensor Adam and AdamW, every element through
           the operations portable mode runs for that function one operation at a time (the
           compound kernels' spelling, exact.c; sqrt as unary.c's; torch's own IEEE multiply,
           divide and add by a scalar, the scalar first rounded to the tensor's dtype), so the
           two give the same bits. It saves the eight or so dispatches a parameter costs. */

#include "portable.h"

typedef struct {
    int kind, decay; /* decay: 0 none, 1 decoupled (AdamW), 2 added to the gradient */
    double decay_value, lerp_weight, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step;
    char *param, *exp_avg, *exp_avg_sq;
    const char *grad;
} adam_ctx;

/* Elements [0, n) of one parameter in T. The steps, as `_single_tensor_adam` calls them:
   param *= 1 - lr wd (decoupled) or grad = grad + param * wd
   (add with alpha); exp_avg.lerp_(grad, 1 - beta1) (torch's two-sided formula);
   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2);
   denom = sqrt(exp_avg_sq) / bc2_sqrt + eps; param.addcdiv_(exp_avg, denom, value=-step_size). */
#define ADAM_LOOP(T, SQRT, NAME)                                                                   \
    CLONED static void NAME(const adam_ctx *c, Py_ssize_t lo, Py_ssize_t hi) {                     \
        T *p = (T *)c->param, *m = (T *)c->exp_avg, *v = (T *)c->exp_avg_sq;                       \
        const T *g = (const T *)c->grad;                                                           \
        const T wd = (T)c->decay_value, lw = (T)c->lerp_weight, lw1 = (T)(1.0 - c->lerp_weight);   \
        const T b2 = (T)c->beta2, ob2 = (T)c->one_minus_beta2, bc = (T)c->bc2_sqrt;                \
        const T eps = (T)c->eps, step = (T)c->neg_step;                                            \
        const int low = fabs(c->lerp_weight) < 0.5, decay = c->decay;                              \
        _Pragma("GCC ivdep") for (Py_ssize_t i = lo; i < hi; i++) {                                \
            T gi = g[i], pi = p[i];                                                                \
            if (decay == 1) {                                                                      \
                pi = pi * wd;                                                                      \
            } else if (decay == 2) {                                                               \
                T t = pi * wd;                                                                     \
                gi = gi + t;                                                                       \
            }                                                                                      \
            T mi = m[i], d = gi - mi;                                                              \
            if (low) {                                                                             \
                d = d * lw;                                                                        \
                mi = mi + d;                                                                       \
            } else {                                                                               \
                d = d * lw1;                                                                       \
                mi = gi - d;                                                                       \
            }                                                                                      \
            T vi = v[i] * b2, t = gi * ob2;                                                        \
            t = t * gi;                                                                            \
            vi = vi + t;                                                                           \
            T den = (vi < 0 || vi != vi) ? (T)NAN : SQRT(vi);                                      \
            den = den / bc;                                                                        \
            den = den + eps;                                                                       \
            T u = mi * step;                                                                       \
            u = u / den;                                                                           \
            p[i] = pi + u;                                                                         \
            m[i] = mi;                                                                             \
            v[i] = vi;                                                                             \
        }                                                                                          \
    }

ADAM_LOOP(float, sqrtf, adam_float)
ADAM_LOOP(double, sqrt, adam_double)

static void adam_range(void *p, Py_ssize_t lo, Py_ssize_t hi) {
    const adam_ctx *c = (const adam_ctx *)p;
    if (c->kind)
        adam_double(c, lo, hi);
    else
        adam_float(c, lo, hi);
}

/* p_adam(param, grad, exp_avg, exp_avg_sq, decay, decay_value, lerp_weight, beta2,
   one_minus_beta2, bc2_sqrt, eps, neg_step): param, exp_avg and exp_avg_sq updated in place;
   every buffer of one dtype and param's count, none overlapping another. decay_value is
   1 - lr * weight_decay (decay 1) or weight_decay (decay 2). */
static PyObject *p_adam(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"param",       "grad",        "exp_avg", "exp_avg_sq",      "decay",
                         "decay_value", "lerp_weight", "beta2",   "one_minus_beta2", "bc2_sqrt",
                         "eps",         "neg_step",    NULL};
    buffer_t param, grad, exp_avg, exp_avg_sq;
    adam_ctx c;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&O&O&iddddddd", kw, buffer, &param, buffer,
                                     &grad, buffer, &exp_avg, buffer, &exp_avg_sq, &c.decay,
                                     &c.decay_value, &c.lerp_weight, &c.beta2, &c.one_minus_beta2,
                                     &c.bc2_sqrt, &c.eps, &c.neg_step))
        return NULL;
    const Py_ssize_t n = param.count;
    if (!buffer_holds("p_adam", "param", &param, n, ANY_KIND) ||
        !buffer_holds("p_adam", "grad", &grad, n, param.kind) ||
        !buffer_holds("p_adam", "exp_avg", &exp_avg, n, param.kind) ||
        !buffer_holds("p_adam", "exp_avg_sq", &exp_avg_sq, n, param.kind))
        return NULL;
    if (c.decay < 0 || c.decay > 2) {
        PyErr_SetString(PyExc_ValueError, "p_adam: decay is 0, 1 or 2");
        return NULL;
    }
    c.kind = param.kind;
    c.param = param.data, c.exp_avg = exp_avg.data, c.exp_avg_sq = exp_avg_sq.data;
    c.grad = grad.data;
    Py_BEGIN_ALLOW_THREADS
    parallel_for(n, 4 * n, adam_range, &c);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"p_adam", KEYWORDS(p_adam), "Portable mode: one parameter's Adam step in one pass."},
    {NULL, NULL, 0, NULL},
};

int bind_portable_optim(PyObject *module) { return PyModule_AddFunctions(module, methods); }
