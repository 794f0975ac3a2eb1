/* Portable mode's counter-based generator (twice.portable.arithmetic.philox):

   p_uniform  Philox-4x32-10 uniforms in [0, 1) (float64), element i from counter i / 2
   p_normal   Box-Muller normals (float64) from those uniforms */

#include "functions.h"

#define M0 0xD2511F53u
#define M1 0xCD9E8D57u
#define W0 0x9E3779B9u
#define W1 0xBB67AE85u

static inline void philox(uint64_t counter, uint64_t key, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)c0 * M0, p1 = (uint64_t)c2 * M1;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += W0;
        k1 += W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

static void uniforms(uint64_t key, Py_ssize_t count, double *out) {
    const double scale = pow2(-53);
    for (Py_ssize_t g = 0; 2 * g < count; g++) {
        uint32_t w[4];
        philox((uint64_t)g, key, w);
        uint64_t first = ((uint64_t)w[0] << 21) ^ (w[1] >> 11);
        uint64_t second = ((uint64_t)w[2] << 21) ^ (w[3] >> 11);
        out[2 * g] = (double)first * scale;
        if (2 * g + 1 < count) out[2 * g + 1] = (double)second * scale;
    }
}

/* p_uniform(key, out): out's count float64 uniforms, as philox.uniform. */
static PyObject *p_uniform(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"key", "out", NULL};
    unsigned long long key;
    buffer_t out;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KO&", kw, &key, buffer, &out)) return NULL;
    if (!buffer_holds("p_uniform", "out", &out, out.count, KIND_F64)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    uniforms(key, out.count, F64(out));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* p_normal(key, out, scratch): out's count float64 normals, as philox.normal; scratch holds
   2 * ceil(count / 2) doubles. */
static PyObject *p_normal(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"key", "out", "scratch", NULL};
    unsigned long long key;
    buffer_t ob, sb;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KO&O&", kw, &key, buffer, &ob, buffer, &sb))
        return NULL;
    if (!check_ready()) return NULL;
    const Py_ssize_t count = ob.count, pairs = (count + 1) / 2;
    if (!buffer_holds("p_normal", "out", &ob, count, KIND_F64) ||
        !buffer_holds("p_normal", "scratch", &sb, 2 * pairs, KIND_F64))
        return NULL;
    double *out = F64(ob), *u = F64(sb);
    Py_BEGIN_ALLOW_THREADS
    uniforms(key, 2 * pairs, u);
    for (Py_ssize_t i = 0; i < pairs; i++) {
        double radius = sqrt(f_log(1.0 - u[2 * i]) * -2.0);
        double v = u[2 * i + 1] * 4.0;
        double quarter = floor(v);
        double angle = (v - quarter) * HALF_PI;
        double z = angle * angle;
        double s = angle * horner(&SIN, z), c = horner(&COS, z);
        int64_t q = ((int64_t)quarter) % 4;
        double sin_v = q == 0 ? s : q == 1 ? c : q == 2 ? -s : -c;
        double cos_v = q == 0 ? c : q == 1 ? -s : q == 2 ? -c : s;
        out[2 * i] = radius * cos_v;
        if (2 * i + 1 < count) out[2 * i + 1] = radius * sin_v;
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"p_uniform", KEYWORDS(p_uniform), "Portable mode: Philox uniforms."},
    {"p_normal", KEYWORDS(p_normal), "Portable mode: Philox normals (Box-Muller)."},
    {NULL, NULL, 0, NULL},
};

int bind_portable_random(PyObject *module) { return PyModule_AddFunctions(module, methods); }
