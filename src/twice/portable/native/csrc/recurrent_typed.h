/* recurrent.c's LSTM cell and step for one dtype: recurrent.c includes this file once per type,
   with T (float or double) and TYPED(name) (name_float or name_double) defined. Every operation
   but the gates' functions is one IEEE operation in T, in recurrent.py's order. */

/* Forward, rows [lo, hi): gates = (hg + bias) + gx (bias may be absent); act = sigmoid, sigmoid,
   tanh, sigmoid of the four blocks of the gates; c_out = f c + i g; tanh_c = tanh(c_out);
   h = o tanh_c. */
CLONED
static void TYPED(lstm_forward)(Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t H, const T *hg,
                                const T *bias, const T *gx, const T *c, T *act, T *c_out, T *tanh_c,
                                T *h) {
    double v[CHUNK], w[CHUNK];
    for (Py_ssize_t r = lo; r < hi; r++) {
        const T *hr = hg + r * 4 * H, *gr = gx + r * 4 * H, *cr = c + r * H;
        T *ar = act + r * 4 * H;
        for (int block = 0; block < 4; block++)
            for (Py_ssize_t j0 = 0; j0 < H; j0 += CHUNK) {
                const Py_ssize_t len = H - j0 < CHUNK ? H - j0 : CHUNK, at = block * H + j0;
                if (bias)
                    for (Py_ssize_t j = 0; j < len; j++) {
                        T g = hr[at + j] + bias[at + j];
                        g = g + gr[at + j];
                        v[j] = (double)g;
                    }
                else
                    for (Py_ssize_t j = 0; j < len; j++) {
                        T g = hr[at + j] + gr[at + j];
                        v[j] = (double)g;
                    }
                if (block == 2)
                    tanh_chunk(v, w, len);
                else
                    sigmoid_chunk(v, w, len);
                for (Py_ssize_t j = 0; j < len; j++) ar[at + j] = (T)w[j];
            }
        const T *i = ar, *f = ar + H, *g = ar + 2 * H, *o = ar + 3 * H;
        T *cn = c_out + r * H, *tc = tanh_c + r * H, *hn = h + r * H;
        for (Py_ssize_t j0 = 0; j0 < H; j0 += CHUNK) {
            const Py_ssize_t len = H - j0 < CHUNK ? H - j0 : CHUNK;
            for (Py_ssize_t j = 0; j < len; j++) {
                const T kept = f[j0 + j] * cr[j0 + j], added = i[j0 + j] * g[j0 + j];
                const T cell = kept + added;
                cn[j0 + j] = cell;
                v[j] = (double)cell;
            }
            tanh_chunk(v, w, len);
            for (Py_ssize_t j = 0; j < len; j++) {
                const T t = (T)w[j];
                tc[j0 + j] = t;
                hn[j0 + j] = o[j0 + j] * t;
            }
        }
    }
}

/* Backward, rows [lo, hi): dh = dy + dh_in (either may be absent: 0 when both are); the gates'
   gradients (autograd's formulas: sigmoid's grad (1 - y) y and tanh's grad (1 - y y) in float64,
   rounded once) into dgates, and the previous cell's gradient, f dc, into dc_out. */
CLONED
static void TYPED(lstm_backward)(Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t H, const T *dy,
                                 const T *dh_in, const T *dc_in, const T *act, const T *tanh_c,
                                 const T *c_prev, T *dgates, T *dc_out) {
    for (Py_ssize_t r = lo; r < hi; r++) {
        const T *ar = act + r * 4 * H, *tc = tanh_c + r * H, *cp = c_prev + r * H;
        const T *i = ar, *f = ar + H, *g = ar + 2 * H, *o = ar + 3 * H;
        T *dg = dgates + r * 4 * H, *dco = dc_out + r * H;
        for (Py_ssize_t j = 0; j < H; j++) {
            const Py_ssize_t at = r * H + j;
            T dh = dy ? dy[at] : (T)0;
            if (dh_in) dh = dy ? dh + dh_in[at] : dh_in[at];
            const T d_o = dh * tc[j], d_tc = dh * o[j];
            const double t64 = (double)tc[j];
            T dc = (T)((double)d_tc * (1.0 - t64 * t64));
            if (dc_in) dc = dc + dc_in[at];
            const T d_f = dc * cp[j], d_i = dc * g[j], d_g = dc * i[j];
            dco[j] = dc * f[j];
            const double i64 = (double)i[j], f64 = (double)f[j], g64 = (double)g[j];
            const double o64 = (double)o[j];
            dg[j] = (T)((double)d_i * ((1.0 - i64) * i64));
            dg[H + j] = (T)((double)d_f * ((1.0 - f64) * f64));
            dg[2 * H + j] = (T)((double)d_g * (1.0 - g64 * g64));
            dg[3 * H + j] = (T)((double)d_o * ((1.0 - o64) * o64));
        }
    }
}

/* p_lstm_step's rows [lo, hi): the product scaled and rounded (p_scale's), the cell forward, and
   h cut into integers on each row's unit (p_split's axis 0); buf holds (hi - lo) 4H values.
   Returns 0 where the cut met a value not finite. */
static int TYPED(lstm_step)(const lstm_step_ctx *s, Py_ssize_t lo, Py_ssize_t hi, T *buf) {
    const Py_ssize_t H = s->H, G = 4 * H, n = hi - lo;
    int ok = 1;
    double blo, bhi; /* scale_by's first branch, a row at a time where it holds */
    unit_bounds(s->ub, G, &blo, &bhi);
    for (Py_ssize_t r = 0; r < n; r++) {
        const double a = s->ua[lo + r], *pr = s->prod + (lo + r) * G;
        if (in_band(a, blo, bhi))
            for (Py_ssize_t j = 0; j < G; j++) buf[r * G + j] = (T)((pr[j] + 0.0) * (a * s->ub[j]));
        else
            for (Py_ssize_t j = 0; j < G; j++)
                buf[r * G + j] = (T)scale_by(pr[j] + 0.0, a, s->ub[j]);
    }
    TYPED(lstm_forward)(0, n, H, buf, (const T *)s->bias, (const T *)s->gx + lo * G,
                        (const T *)s->c + lo * H, (T *)s->act_out + lo * G, (T *)s->c_out + lo * H,
                        (T *)s->tanh_out + lo * H, (T *)s->h_out + lo * H);
    for (Py_ssize_t r = lo; r < hi; r++)
        ok &= TYPED(split_block)((const T *)s->h_out + r * H, 1, H, H, s->beta, 0, 0,
                                 s->ints + r * H, s->units + r, buf);
    return ok;
}

/* p_lstm_step_backward's rows [lo, hi): the incoming hidden gradient (the product scaled and
   rounded, where there is one, else dh), the cell backward, and the gates' gradients cut. */
static int TYPED(lstm_step_back)(const lstm_step_ctx *s, Py_ssize_t lo, Py_ssize_t hi, T *buf) {
    const Py_ssize_t H = s->H, G = 4 * H, n = hi - lo;
    const T *dh = s->dh ? (const T *)s->dh + lo * H : NULL;
    int ok = 1;
    if (s->prod) {
        double blo, bhi;
        unit_bounds(s->ub, H, &blo, &bhi);
        for (Py_ssize_t r = 0; r < n; r++) {
            const double a = s->ua[lo + r], *pr = s->prod + (lo + r) * H;
            if (in_band(a, blo, bhi))
                for (Py_ssize_t j = 0; j < H; j++)
                    buf[r * H + j] = (T)((pr[j] + 0.0) * (a * s->ub[j]));
            else
                for (Py_ssize_t j = 0; j < H; j++)
                    buf[r * H + j] = (T)scale_by(pr[j] + 0.0, a, s->ub[j]);
        }
        dh = buf;
    }
    TYPED(lstm_backward)(0, n, H, s->dy ? (const T *)s->dy + lo * H : NULL, dh,
                         s->dc ? (const T *)s->dc + lo * H : NULL, (const T *)s->act + lo * G,
                         (const T *)s->tanh_c + lo * H, (const T *)s->c_prev + lo * H,
                         (T *)s->dgates + lo * G, (T *)s->dc_out + lo * H);
    for (Py_ssize_t r = lo; r < hi; r++)
        ok &= TYPED(split_block)((const T *)s->dgates + r * G, 1, G, G, s->beta, 0, 0,
                                 s->ints + r * G, s->units + r, buf);
    return ok;
}
