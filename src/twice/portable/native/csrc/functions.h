/* twice's own elementwise functions (twice.portable.arithmetic.elementwise), one value at a time
   (f_*) and a chunk at a time in stages (*_chunk), shared by unary.c, recurrent.c (the LSTM's
   gates) and random.c (Box-Muller). The polynomial coefficients and constants are not spelled
   here: p_init (unary.c) receives them from coefficients.py, the one place they are written. */

#ifndef TWICE_FUNCTIONS_H
#define TWICE_FUNCTIONS_H

#include "portable.h"

#define MAXC 40

typedef struct {
    double c[MAXC];
    int n;
} poly_t;

/* Set once by p_init (unary.c); check_ready says whether it ran (else a RuntimeError). */
extern poly_t EXP, ATANH, ERF, ERFCX, SIN, COS, EXPM1;
extern double LN2_HI, LN2_LO, INV_LN2, SQRT_HALF, TWO_OVER_SQRT_PI, HALF_PI, EXPM1_SMALL;
extern double GELU_K, GELU_C, GELU_3C, INV_SQRT_2PI;
int check_ready(void);

static inline double horner(const poly_t *p, double t) {
    double acc = p->c[p->n - 1];
    for (int i = p->n - 2; i >= 0; i--) {
        acc = acc * t;
        acc = acc + p->c[i];
    }
    return acc;
}

static inline int64_t floor_half(int64_t k) { return k >= 0 ? k / 2 : -((-k + 1) / 2); }

static inline double f_exp(double x) {
    if (x < -746.0)
        x = -746.0;
    else if (x > 710.0)
        x = 710.0;
    double k = round_even(x * INV_LN2); /* |x * INV_LN2| < 1077 */
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

/* IEEE: correctly rounded */
static inline double f_sqrt(double x) { return (x < 0 || isnan(x)) ? NAN : sqrt(x); }

static inline double f_softplus(double x, double beta, double threshold) {
    double bx = x * beta;
    return bx > threshold ? x : f_log1p(f_exp(bx)) / beta;
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
    for (Py_ssize_t j = 0; j < len; j++) y[j] = fabs(x[j]) < EXPM1_SMALL ? x[j] * p[j] : y[j] - 1.0;
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

#endif
