/* twice._native's trace-line family: one validator and the two loops that use it.

   record_valid  whether a line is a valid record in canonical form (the language is described
           at RECORD_KEYS below; core/records.py holds the Python side).

   same_lines  the trace comparison's fast path (store.tracescan): walks two traces' lines in step,
           while each pair is equal apart from its "time" and each line ends with the canonical
           `"step":N` (then `,"time":T`) and `}`, its step above the last, and each line is a
           valid record in canonical form (record_valid); stops at the first line that is not
           so, for the Python code to parse and judge. tracescan's Python walk does the same (a
           test holds the two together).

   series  each valid canonical trace line's step, loss (the first, where backward ran several
           times), learning rate (the first group's) and gradient norm, with which of them the
           line holds, for plots of long runs (store.traceseries): one pass, every line
           validated; stops at the first line that is not so, for the Python code to parse and
           judge. */

#include "native.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The body of a trace line (all but its time) and its step: 0 when the line does not end in
   `"step":N}` or `"step":N,"time":T}` (the canonical order: keys sorted, "time" last). */
static int line_body(const char *line, const char *end, const char **body_end,
                     unsigned long long *step) {
    const char *close = end - 1; /* at the '}' before the newline */
    if (close <= line || *close != '}' || *line != '{') return 0;
    const char *p = close;
    while (p > line && (isdigit((unsigned char)p[-1]) || p[-1] == '.' || p[-1] == '-' ||
                        p[-1] == '+' || p[-1] == 'e' || p[-1] == 'E'))
        p--;
    const char *body = close;
    if (p - line >= 8 && memcmp(p - 8, ",\"time\":", 8) == 0) body = p - 8;
    const char *q = body;
    while (q > line && isdigit((unsigned char)q[-1])) q--;
    if (q == body || body - q > 19 || q - line < 7 || memcmp(q - 7, "\"step\":", 7) != 0) return 0;
    if (body - q > 1 && *q == '0') return 0; /* a leading zero is not JSON */
    unsigned long long value = 0;
    for (const char *d = q; d < body; d++) value = value * 10 + (unsigned long long)(*d - '0');
    if (value > 0x7FFFFFFFFFFFFFFFULL) return 0;
    *body_end = body;
    *step = value;
    return 1;
}

/* ---- record_valid: a canonical trace line whose every field is valid (records.py's language) ----
   Accepts only the exact bytes record_line writes for a valid StepRecord: keys sorted, compact,
   each value of its field's form (a digest: 32 lowercase hex digits; a float: float_bits' text; a
   map: names of printable ASCII, sorted, to digests). Anything else returns 0 and goes to the
   Python reader, which parses it whole and accepts it or names the fault: this language is a
   subset of what StepRecord.from_json accepts (tests/unit/store/test_tracescan.py checks it on
   generated lines). params_before, written once per trace, always takes the Python path. */
enum { V_DIGEST, V_MAP, V_FLOAT, V_LOSS, V_LIST, V_BOOL, V_STEP, V_TIME };
static const struct {
    const char *name;
    int kind;
    int evidence;
} RECORD_KEYS[] = {
    {"batch", V_DIGEST, 1},      {"grad_digests", V_MAP, 1}, {"grad_norm", V_FLOAT, 1},
    {"grads", V_DIGEST, 1},      {"loss", V_LOSS, 1},        {"lr", V_LIST, 1},
    {"param_digests", V_MAP, 1}, {"params", V_DIGEST, 1},    {"params_full", V_DIGEST, 1},
    {"rng", V_MAP, 1},           {"skipped", V_BOOL, 1},     {"step", V_STEP, 0},
    {"time", V_TIME, 0},
};
#define RECORD_KEY_COUNT (sizeof RECORD_KEYS / sizeof RECORD_KEYS[0])

static int is_lower_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
static int is_digit_char(char c) { return c >= '0' && c <= '9'; }

static const char *hex_run(const char *p, const char *end, int least, int most) {
    int n = 0;
    while (p < end && n < most && is_lower_hex(*p)) p++, n++;
    return n >= least && !(p < end && is_lower_hex(*p)) ? p : NULL;
}
static const char *digit_run(const char *p, const char *end, int least, int most) {
    int n = 0;
    while (p < end && n < most && is_digit_char(*p)) p++, n++;
    return n >= least && !(p < end && is_digit_char(*p)) ? p : NULL;
}
static const char *lit(const char *p, const char *end, const char *text) {
    size_t n = strlen(text);
    return (size_t)(end - p) >= n && memcmp(p, text, n) == 0 ? p + n : NULL;
}
static const char *v_digest(const char *p, const char *end) {
    if (!(p = lit(p, end, "\""))) return NULL;
    if (!(p = hex_run(p, end, 32, 32))) return NULL;
    return lit(p, end, "\"");
}
/* "-?0x[01].h{1,13}p[+-]d{1,4}" | "-?inf" | "nan:h{16}" */
static const char *v_float(const char *p, const char *end) {
    const char *q;
    if (!(p = lit(p, end, "\""))) return NULL;
    if ((q = lit(p, end, "nan:"))) {
        p = hex_run(q, end, 16, 16);
    } else {
        if (p < end && *p == '-') p++;
        if ((q = lit(p, end, "inf"))) {
            p = q;
        } else {
            if (!(p = lit(p, end, "0x")) || p >= end || (*p != '0' && *p != '1')) return NULL;
            p++;
            if (!(p = lit(p, end, ".")) || !(p = hex_run(p, end, 1, 13))) return NULL;
            if (!(p = lit(p, end, "p")) || p >= end || (*p != '+' && *p != '-')) return NULL;
            /* an exponent a double has: float.hex writes +1023 at most, -1022 at least (subnormals
               as 0x0.…p-1022); "0x1.0p+9999" is no float, and would overflow where it is read */
            int negative = *p == '-';
            const char *digits = p + 1;
            if (!(p = digit_run(digits, end, 1, 4))) return NULL;
            int exponent = 0;
            for (const char *d = digits; d < p; d++) exponent = exponent * 10 + (*d - '0');
            if (exponent > (negative ? 1022 : 1023)) return NULL;
        }
    }
    return p ? lit(p, end, "\"") : NULL;
}
static const char *v_list(const char *p, const char *end) {
    if (!(p = lit(p, end, "["))) return NULL;
    for (;;) {
        if (!(p = v_float(p, end))) return NULL;
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        return lit(p, end, "]");
    }
}
static const char *v_map(const char *p, const char *end) {
    const char *last = NULL;
    size_t last_len = 0;
    if (!(p = lit(p, end, "{"))) return NULL;
    for (;;) {
        if (!(p = lit(p, end, "\""))) return NULL;
        const char *name = p;
        while (p < end && *p >= 0x20 && *p <= 0x7e && *p != '"' && *p != '\\') p++;
        size_t len = (size_t)(p - name);
        if (len == 0 || len > 512) return NULL;
        if (last) { /* strictly ascending, as sorted keys are: no duplicates */
            int order = memcmp(last, name, len < last_len ? len : last_len);
            if (order > 0 || (order == 0 && last_len >= len)) return NULL;
        }
        last = name, last_len = len;
        if (!(p = lit(p, end, "\":")) || !(p = v_digest(p, end))) return NULL;
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        return lit(p, end, "}");
    }
}
static const char *v_step(const char *p, const char *end) {
    const char *q = digit_run(p, end, 1, 19);
    if (!q || (q - p > 1 && *p == '0')) return NULL;
    unsigned long long value = 0;
    for (const char *d = p; d < q; d++) value = value * 10 + (unsigned long long)(*d - '0');
    return value <= 0x7FFFFFFFFFFFFFFFULL ? q : NULL;
}
/* A finite number of seconds, at least 0: d+(.d+)?([eE][+-]?d{1,2})?, no leading zero. */
static const char *v_time(const char *p, const char *end) {
    const char *q = digit_run(p, end, 1, 20);
    if (!q || (q - p > 1 && *p == '0')) return NULL;
    if (q < end && *q == '.' && !(q = digit_run(q + 1, end, 1, 20))) return NULL;
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-')) q++;
        q = digit_run(q, end, 1, 2);
    }
    return q;
}
static const char *v_value(int kind, const char *p, const char *end) {
    switch (kind) {
    case V_DIGEST: return v_digest(p, end);
    case V_MAP: return v_map(p, end);
    case V_FLOAT: return v_float(p, end);
    case V_LOSS: return p < end && *p == '[' ? v_list(p, end) : v_float(p, end);
    case V_LIST: return v_list(p, end);
    case V_BOOL: {
        const char *q = lit(p, end, "true");
        return q ? q : lit(p, end, "false");
    }
    case V_STEP: return v_step(p, end);
    case V_TIME: return v_time(p, end);
    }
    return NULL;
}

/* 1 when [line, newline) is a canonical line of a valid record (see above), else 0. */
static int record_valid(const char *line, const char *newline) {
    const char *p = line, *end = newline;
    size_t next = 0; /* keys come in RECORD_KEYS' (sorted) order, each at most once */
    int evidence = 0, step = 0;
    if (!(p = lit(p, end, "{"))) return 0;
    for (;;) {
        if (!(p = lit(p, end, "\""))) return 0;
        size_t key = next;
        while (key < RECORD_KEY_COUNT) {
            const char *q = lit(p, end, RECORD_KEYS[key].name);
            if (q && q < end && *q == '"') break;
            key++;
        }
        if (key == RECORD_KEY_COUNT) return 0;
        p += strlen(RECORD_KEYS[key].name);
        if (!(p = lit(p, end, "\":")) || !(p = v_value(RECORD_KEYS[key].kind, p, end))) return 0;
        evidence |= RECORD_KEYS[key].evidence;
        step |= RECORD_KEYS[key].kind == V_STEP;
        next = key + 1;
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        return p + 1 == end && *p == '}' && evidence && step;
    }
}

/* 1 when [tail, newline) is a valid line's tail after its body: `}` or `,"time":T}`. */
static int tail_valid(const char *tail, const char *newline) {
    const char *p = tail;
    if ((p = lit(tail, newline, ",\"time\":")) && !(p = v_time(p, newline))) return 0;
    if (!p) p = tail;
    return p + 1 == newline && *p == '}';
}

static PyObject *record_valid_py(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer line;
    if (!PyArg_ParseTuple(args, "y*", &line)) return NULL;
    const char *base = line.buf;
    int ok = line.len > 0 && base[line.len - 1] == '\n' && record_valid(base, base + line.len - 1);
    PyBuffer_Release(&line);
    return PyBool_FromLong(ok);
}

static PyObject *same_lines(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer a, b;
    Py_ssize_t at_a, at_b;
    long long last_a, last_b, limit;
    if (!PyArg_ParseTuple(args, "y*y*nnLLL", &a, &b, &at_a, &at_b, &last_a, &last_b, &limit))
        return NULL;
    const char *base_a = a.buf, *base_b = b.buf;
    const char *pa = base_a + at_a, *pb = base_b + at_b;
    const char *end_a = base_a + a.len, *end_b = base_b + b.len;
    long long last = last_a > last_b ? last_a : last_b, lines = 0;
    if (at_a < 0 || at_b < 0 || at_a > a.len || at_b > b.len) {
        PyBuffer_Release(&a);
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "a position is outside its buffer");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS /* the buffers are held: a report walks other traces meanwhile */
    for (;;) {
        const char *na = memchr(pa, '\n', (size_t)(end_a - pa));
        const char *nb = memchr(pb, '\n', (size_t)(end_b - pb));
        if (!na || !nb) break;
        const char *body_a, *body_b;
        unsigned long long step_a, step_b;
        if (!line_body(pa, na, &body_a, &step_a) || !line_body(pb, nb, &body_b, &step_b)) break;
        if (step_a != step_b || (long long)step_a <= last || (long long)step_a >= limit) break;
        if (body_a - pa != body_b - pb || memcmp(pa, pb, (size_t)(body_a - pa)) != 0) break;
        /* Every line is validated, not only compared: equal damage in both must not pass. The
           bodies are equal, so A's whole line and B's tail validate both. */
        if (!record_valid(pa, na) || !tail_valid(body_b, nb)) break;
        last = (long long)step_a;
        lines++;
        pa = na + 1;
        pb = nb + 1;
    }
    Py_END_ALLOW_THREADS
    PyObject *result =
        Py_BuildValue("LnnL", lines, (Py_ssize_t)(pa - base_a), (Py_ssize_t)(pb - base_b), last);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return result;
}

/* The values of the top-level keys SERIES_KEYS in a canonical line, in one scan (strings hold no
   escapes: record_valid checked): found[k] is NULL where the line has no key k. A tensor named
   "loss" inside a digest map is not the loss. */
static const char *SERIES_KEYS[] = {"loss", "lr", "grad_norm"};
#define SERIES_COUNT 3

static void top_values(const char *p, const char *end, const char *found[SERIES_COUNT]) {
    int depth = 0;
    for (int k = 0; k < SERIES_COUNT; k++) found[k] = NULL;
    for (const char *c = p; c < end; c++) {
        if (*c == '"') {
            const char *close = memchr(c + 1, '"', (size_t)(end - c - 1));
            if (!close) return;
            if (depth == 1 && close + 1 < end && close[1] == ':') {
                size_t n = (size_t)(close - c - 1);
                for (int k = 0; k < SERIES_COUNT; k++)
                    if (strlen(SERIES_KEYS[k]) == n && memcmp(c + 1, SERIES_KEYS[k], n) == 0)
                        found[k] = close + 2;
            }
            c = close;
        } else if (*c == '{' || *c == '[') {
            depth++;
        } else if (*c == '}' || *c == ']') {
            depth--;
        }
    }
}

/* A float field's first value ("0x1.8p+0", "-inf", "nan:<bits>"; a list's first item): 1 and
   the value, 0 where the line has none. */
static int text_float(const char *v, const char *end, double *out) {
    if (!v) return 0;
    if (v < end && *v == '[') v++;
    if (v >= end || *v != '"') return 0;
    v++;
    const char *close = memchr(v, '"', (size_t)(end - v));
    if (!close || close - v > 60 || close == v) return 0;
    char text[64];
    memcpy(text, v, (size_t)(close - v));
    text[close - v] = 0;
    if (strncmp(text, "nan", 3) == 0) {
        *out = NAN;
        return 1;
    }
    char *stop;
    *out = strtod(text, &stop);
    return stop != text && *stop == 0;
}

static PyObject *series(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer data;
    Py_ssize_t at;
    long long last;
    if (!PyArg_ParseTuple(args, "y*nL", &data, &at, &last)) return NULL;
    const char *base = data.buf, *p = base + (at < 0 ? 0 : at), *end = base + data.len;
    Py_ssize_t capacity = 0;
    for (const char *c = p; c < end && (c = memchr(c, '\n', (size_t)(end - c))); c++) capacity++;
    PyObject *steps = PyBytes_FromStringAndSize(NULL, capacity * 8);
    PyObject *values = PyBytes_FromStringAndSize(NULL, capacity * 8 * SERIES_COUNT);
    PyObject *present = PyBytes_FromStringAndSize(NULL, capacity * SERIES_COUNT);
    if (!steps || !values || !present) {
        Py_XDECREF(steps);
        Py_XDECREF(values);
        Py_XDECREF(present);
        PyBuffer_Release(&data);
        return NULL;
    }
    long long *step_out = (long long *)PyBytes_AS_STRING(steps);
    double *value_out = (double *)PyBytes_AS_STRING(values);
    char *present_out = PyBytes_AS_STRING(present);
    Py_ssize_t count = 0;
    Py_BEGIN_ALLOW_THREADS /* the buffer is held: two traces' series run side by side */
    for (;;) {
        const char *newline = memchr(p, '\n', (size_t)(end - p));
        if (!newline) break;
        const char *body;
        unsigned long long step;
        if (!line_body(p, newline, &body, &step) || (long long)step <= last ||
            !record_valid(p, newline))
            break;
        step_out[count] = (long long)step;
        const char *found[SERIES_COUNT];
        top_values(p, body, found);
        for (int k = 0; k < SERIES_COUNT; k++) {
            double value = NAN;
            int held = text_float(found[k], body, &value);
            value_out[k * capacity + count] = held ? value : NAN;
            present_out[k * capacity + count] = (char)held;
        }
        count++;
        last = (long long)step;
        p = newline + 1;
    }
    Py_END_ALLOW_THREADS
    PyObject *result =
        Py_BuildValue("(y#y#y#nnL)", PyBytes_AS_STRING(steps), count * 8, PyBytes_AS_STRING(values),
                      capacity * 8 * SERIES_COUNT, PyBytes_AS_STRING(present),
                      capacity * SERIES_COUNT, count, (Py_ssize_t)(p - base), last);
    Py_DECREF(steps);
    Py_DECREF(values);
    Py_DECREF(present);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef records_methods[] = {
    {"series", series, METH_VARARGS,
     "Steps, losses, learning rates and gradient norms of valid canonical trace lines "
     "(see store.traceseries)."},
    {"record_valid", record_valid_py, METH_VARARGS,
     "Whether a trace line (with its newline) is a canonical, valid record."},
    {"same_lines", same_lines, METH_VARARGS,
     "Equal trace lines of two buffers, walked in step (see store.tracescan)."},
    {NULL, NULL, 0, NULL},
};

int bind_records(PyObject *module) { return PyModule_AddFunctions(module, records_methods); }
