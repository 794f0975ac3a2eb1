/* conv.c's loops for one element type of the input: conv.c includes this file once per type,
   with T (float or double), U (the unsigned integer of T's bits), INF (U's pattern of infinity)
   and TYPED(name) (name_float or name_double) defined. */

/* For input rows [lo, hi) of (n, h), each position's largest magnitude over the channels
   [c0, c0 + cc) as a sign-cleared bit pattern (integer maxima, as in exact.c's split). */
static void TYPED(unfold_top)(const T *x, const conv_geom *g, Py_ssize_t c0, Py_ssize_t cc, U *top,
                              Py_ssize_t lo, Py_ssize_t hi) {
    for (Py_ssize_t r = lo; r < hi; r++) {
        const Py_ssize_t n = r / g->h, y = r % g->h;
        U *t = top + r * g->w;
        for (Py_ssize_t v = 0; v < g->w; v++) t[v] = 0;
        for (Py_ssize_t c = c0; c < c0 + cc; c++) {
            const T *row = x + ((n * g->c + c) * g->h + y) * g->w;
            for (Py_ssize_t v = 0; v < g->w; v++) {
                U b = TYPED(bits)(row[v]);
                t[v] = b > t[v] ? b : t[v];
            }
        }
    }
}

/* For output rows [lo, hi) of (n, ho), each column's unit from the largest pattern over its
   window (padding reads 0), and its inverse; returns the largest pattern. */
static U TYPED(unfold_units)(const U *top, const conv_geom *g, int beta, double *u, double *inv,
                             Py_ssize_t lo, Py_ssize_t hi) {
    U worst = 0;
    for (Py_ssize_t r = lo; r < hi; r++) {
        const Py_ssize_t n = r / g->ho, oy = r % g->ho;
        for (Py_ssize_t ox = 0; ox < g->wo; ox++) {
            U m = 0;
            for (Py_ssize_t i = 0; i < g->kh; i++) {
                const Py_ssize_t iy = oy * g->sh - g->ph + i * g->dh;
                if (iy < 0 || iy >= g->h) continue;
                const U *t = top + (n * g->h + iy) * g->w;
                for (Py_ssize_t j = 0; j < g->kw; j++) {
                    const Py_ssize_t ix = ox * g->sw - g->pw + j * g->dw;
                    if (ix >= 0 && ix < g->w && t[ix] > m) m = t[ix];
                }
            }
            worst = m > worst ? m : worst;
            const double unit = unit_of(m >= INF ? 0.0 : TYPED(magnitude)(m), beta);
            u[r * g->wo + ox] = unit, inv[r * g->wo + ox] = 1.0 / unit;
        }
    }
    return worst;
}

/* One output row (sample n, row oy) of unfold's row for channel c, offset (i, j), the columns
   [xlo, xhi) inside the input (`inside`), as the integers round(x * rinv). */
STAGE void TYPED(window_row)(const T *x, const conv_geom *g, Py_ssize_t n, Py_ssize_t c,
                             Py_ssize_t i, Py_ssize_t j, Py_ssize_t oy, Py_ssize_t xlo,
                             Py_ssize_t xhi, double rinv, double *o) {
    const Py_ssize_t iy = oy * g->sh - g->ph + i * g->dh;
    if (iy < 0 || iy >= g->h) {
        for (Py_ssize_t ox = 0; ox < g->wo; ox++) o[ox] = 0.0;
        return;
    }
    const T *src = x + ((n * g->c + c) * g->h + iy) * g->w + j * g->dw - g->pw;
    for (Py_ssize_t ox = 0; ox < xlo; ox++) o[ox] = 0.0;
    for (Py_ssize_t ox = xhi; ox < g->wo; ox++) o[ox] = 0.0;
    if (g->sw == 1) {
#pragma GCC ivdep
        for (Py_ssize_t ox = xlo; ox < xhi; ox++) o[ox] = round_even((double)src[ox] * rinv);
    } else {
        for (Py_ssize_t ox = xlo; ox < xhi; ox++)
            o[ox] = round_even((double)src[ox * g->sw] * rinv);
    }
}

/* unfold's rows [lo, hi) (channel c0 + r / (kh kw), offset i, j) as the integers
   round(x / unit) on the row's unit (inv per row). */
CLONED
static void TYPED(unfold_rows)(const T *x, const conv_geom *g, Py_ssize_t c0, const double *inv,
                               double *ints, Py_ssize_t lo, Py_ssize_t hi) {
    const Py_ssize_t kk = g->kh * g->kw, cols = g->n * g->ho * g->wo;
    for (Py_ssize_t r = lo; r < hi; r++) {
        const Py_ssize_t c = c0 + r / kk, i = (r % kk) / g->kw, j = r % g->kw;
        Py_ssize_t xlo, xhi;
        inside(g->wo, g->sw, g->pw, j * g->dw, g->w, &xlo, &xhi);
        for (Py_ssize_t n = 0; n < g->n; n++)
            for (Py_ssize_t oy = 0; oy < g->ho; oy++)
                TYPED(window_row)(x, g, n, c, i, j, oy, xlo, xhi, inv[r],
                                  ints + r * cols + (n * g->ho + oy) * g->wo);
    }
}

/* The panel's integers, k-major: bp[k * PANEL + q] for its column q (sample nq[q], output row
   oyq[q], column oxq[q]; count columns, the rest zero), zero where the window reads padding:
   unfold's values cut as p_split cuts them. `row`: the columns are one run of an output row,
   packed offset by offset (each offset's columns inside the input found once, its channels
   one strided loop); otherwise column by column. */
CLONED
static void TYPED(pack_panel)(const T *x, const conv_geom *g, Py_ssize_t c0, Py_ssize_t cc,
                              const Py_ssize_t *nq, const Py_ssize_t *oyq, const Py_ssize_t *oxq,
                              Py_ssize_t count, int row, const double *inv, double *bp) {
    const Py_ssize_t kk = g->kh * g->kw, plane = g->h * g->w;
    double iv[PANEL]; /* a copy no store can alias: the full runs then vectorise */
    for (int q = 0; q < PANEL; q++) iv[q] = inv[q];
    if (row) {
        for (Py_ssize_t i = 0; i < g->kh; i++) {
            const Py_ssize_t iy = oyq[0] * g->sh - g->ph + i * g->dh;
            const int inside_y = iy >= 0 && iy < g->h;
            for (Py_ssize_t j = 0; j < g->kw; j++) {
                /* the columns q in [lo, hi) read inside the input: ix0 + q sw in [0, w) */
                const Py_ssize_t ix0 = oxq[0] * g->sw - g->pw + j * g->dw;
                Py_ssize_t lo = ix0 >= 0 ? 0 : (-ix0 + g->sw - 1) / g->sw;
                Py_ssize_t hi = ix0 > g->w - 1 ? 0 : (g->w - 1 - ix0) / g->sw + 1;
                if (hi > count) hi = count;
                if (!inside_y) hi = 0;
                if (lo > hi) lo = hi;
                const T *src = x + ((nq[0] * g->c + c0) * g->h + (inside_y ? iy : 0)) * g->w;
                for (Py_ssize_t c = 0; c < cc; c++, src += plane) {
                    double *restrict dst = bp + (c * kk + i * g->kw + j) * PANEL;
                    if (lo == 0 && hi == PANEL && g->sw == 1) {
                        run_d run;
                        TYPED(load8)(src + ix0, &run);
                        round_run(&run, iv, dst);
                        continue;
                    }
                    for (Py_ssize_t q = 0; q < lo; q++) dst[q] = 0.0;
                    for (Py_ssize_t q = lo; q < hi; q++)
                        dst[q] = round_even((double)src[ix0 + q * g->sw] * iv[q]);
                    for (Py_ssize_t q = hi; q < PANEL; q++) dst[q] = 0.0;
                }
            }
        }
        return;
    }
    for (Py_ssize_t c = 0; c < cc; c++)
        for (Py_ssize_t i = 0; i < g->kh; i++)
            for (Py_ssize_t j = 0; j < g->kw; j++) {
                double *dst = bp + ((c * g->kh + i) * g->kw + j) * PANEL;
                for (int q = 0; q < PANEL; q++) {
                    const Py_ssize_t y = oyq[q] * g->sh - g->ph + i * g->dh;
                    const Py_ssize_t v = oxq[q] * g->sw - g->pw + j * g->dw;
                    const int in = q < count && y >= 0 && y < g->h && v >= 0 && v < g->w;
                    const Py_ssize_t at = ((nq[q] * g->c + c0 + c) * g->h + y) * g->w + v;
                    dst[q] = in ? round_even((double)x[at] * inv[q]) : 0.0;
                }
            }
}

/* xq[k][q]: the window value of row k at position q of the rows [row0, row0 + rows), on row k's
   unit (zero where the window reads padding): p_unfold's integers, position-major. */
CLONED
static void TYPED(packw)(const T *x, const conv_geom *g, Py_ssize_t K, Py_ssize_t row0,
                         Py_ssize_t rows, Py_ssize_t P, const double *inv, double *xq) {
    for (Py_ssize_t k = 0; k < K; k++) {
        const Py_ssize_t c = k / (g->kh * g->kw), i = (k / g->kw) % g->kh, j = k % g->kw;
        Py_ssize_t xlo, xhi;
        inside(g->wo, g->sw, g->pw, j * g->dw, g->w, &xlo, &xhi);
        Py_ssize_t n = row0 / g->ho, oy = row0 % g->ho; /* stepped, not divided, per row */
        for (Py_ssize_t r = 0; r < rows; r++) {
            TYPED(window_row)(x, g, n, c, i, j, oy, xlo, xhi, inv[k], xq + k * P + r * g->wo);
            if (++oy == g->ho) oy = 0, n++;
        }
    }
}
