/* exact.c's loops for one element type: exact.c includes this file once per type, with T (float
   or double), U (the unsigned integer of T's bits), INF (U's pattern of infinity) and TYPED(name)
   (name_float or name_double) defined. */

/* The columns' units (u) from their largest magnitudes over `rows` rows of stride ld, taken on
   the bit patterns with the sign cleared (integer maxima: exact in any order, so the bits do not
   depend on the vector lanes); top is scratch for `cols` bit patterns. Returns the largest
   pattern seen (INF or above: a value not finite). */
STAGE U TYPED(column_units)(const T *x, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t ld, int beta,
                            U *top, double *u) {
    U worst = 0;
    for (Py_ssize_t j = 0; j < cols; j++) top[j] = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const T *xr = x + r * ld;
#pragma GCC ivdep
        for (Py_ssize_t j = 0; j < cols; j++) {
            U b = TYPED(bits)(xr[j]);
            top[j] = b > top[j] ? b : top[j];
        }
    }
    for (Py_ssize_t j = 0; j < cols; j++) {
        worst = top[j] > worst ? top[j] : worst;
        u[j] = unit_of(top[j] >= INF ? 0.0 : TYPED(magnitude)(top[j]), beta);
    }
    return worst;
}

/* One (rows x cols) block of p_split (see portable.h): every row (axis 0) or column (axis 1)
   gets the unit 2**(e - beta), 2**e bounding its largest magnitude, and its values become the
   integers round(x / unit) (x times the unit's inverse: the same, as the unit is a power of
   two). Cloned per instruction set for speed alone. Returns 0 where a value is not finite. */
CLONED
int TYPED(split_block)(const T *x, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t ld, int beta,
                       int axis, int given, double *out, double *u, void *scratch) {
    U worst = 0, *top = (U *)scratch;
    double *inv = (double *)scratch + cols;
    if (axis == 0) {
        for (Py_ssize_t r = 0; r < rows; r++) {
            const T *xr = x + r * ld;
            double *orow = out + r * ld;
            if (!given) {
                U m = 0;
                for (Py_ssize_t j = 0; j < cols; j++) {
                    U b = TYPED(bits)(xr[j]);
                    m = b > m ? b : m;
                }
                worst = m > worst ? m : worst;
                u[r] = unit_of(m >= INF ? 0.0 : TYPED(magnitude)(m), beta);
            }
            const double s = 1.0 / u[r];
#pragma GCC ivdep
            for (Py_ssize_t j = 0; j < cols; j++) orow[j] = round_even((double)xr[j] * s);
        }
        return worst < INF;
    }
    worst = TYPED(column_units)(x, rows, cols, ld, beta, top, u);
    for (Py_ssize_t j = 0; j < cols; j++) inv[j] = 1.0 / u[j];
    for (Py_ssize_t r = 0; r < rows; r++) {
        const T *xr = x + r * ld;
        double *orow = out + r * ld;
#pragma GCC ivdep
        for (Py_ssize_t j = 0; j < cols; j++) orow[j] = round_even((double)xr[j] * inv[j]);
    }
    return worst < INF;
}

/* Columns [lo, hi) of p_colsum: the columns' largest magnitudes as integer maxima of sign-cleared
   bit patterns (column_units), then each row's integers added onto the columns' accumulators, a
   loop across the columns the compiler vectorises (each column's sum is of integers below 2**53,
   exact in any order). scratch: 4 (hi - lo) doubles. Returns 0 where a value is not finite. */
CLONED
static int TYPED(colsum_block)(const T *x, Py_ssize_t rows, Py_ssize_t lo, Py_ssize_t hi,
                               Py_ssize_t ld, int beta, double *out, void *scratch) {
    const Py_ssize_t n = hi - lo;
    double *inv = (double *)scratch + n, *acc = inv + n, *unit = acc + n;
    const U worst = TYPED(column_units)(x + lo, rows, n, ld, beta, (U *)scratch, unit);
    for (Py_ssize_t j = 0; j < n; j++) {
        inv[j] = 1.0 / unit[j];
        acc[j] = 0.0;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        const T *xr = x + r * ld + lo;
#pragma GCC ivdep
        for (Py_ssize_t j = 0; j < n; j++) acc[j] += round_even((double)xr[j] * inv[j]);
    }
    for (Py_ssize_t j = 0; j < n; j++) out[lo + j] = acc[j] * unit[j];
    return worst < INF;
}

/* p_compound's n elements in T, one IEEE operation after another. ivdep: no element depends on
   another (an output may be its own first operand, in place). */
CLONED
static void TYPED(compound_loops)(int fn, Py_ssize_t n, const T *x, const T *y, const T *z,
                                  double value, T *o) {
    const T v = (T)value, w1 = (T)(1.0 - value);
    switch (fn) {
    case 0:
#pragma GCC ivdep
        for (Py_ssize_t i = 0; i < n; i++) {
            T t = y[i] * v;
            t = t * z[i];
            o[i] = x[i] + t;
        }
        break;
    case 1:
#pragma GCC ivdep
        for (Py_ssize_t i = 0; i < n; i++) {
            T t = y[i] * v;
            t = t / z[i];
            o[i] = x[i] + t;
        }
        break;
    case 2:
#pragma GCC ivdep
        for (Py_ssize_t i = 0; i < n; i++) {
            T t = y[i] * v;
            o[i] = x[i] + t;
        }
        break;
    default:
        if (fabs(value) < 0.5) {
#pragma GCC ivdep
            for (Py_ssize_t i = 0; i < n; i++) {
                T d = y[i] - x[i];
                d = d * v;
                o[i] = x[i] + d;
            }
        } else {
#pragma GCC ivdep
            for (Py_ssize_t i = 0; i < n; i++) {
                T d = y[i] - x[i];
                d = d * w1;
                o[i] = y[i] - d;
            }
        }
    }
}
