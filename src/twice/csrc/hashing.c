/* twice._native's hash: the step trace's digests of many buffers in one call
   (digests.digest_many). Each is XXH3-128 of a framed head, the bytes at an address, and an
   optional tail, exactly as the xxhash package computes it for the same bytes; with, for float32
   and float64 buffers, the L2 norm, accumulated in double in a fixed order (32 running sums,
   element i into sum i mod 32, then added pairwise) in the same pass, so each gradient is read
   once. digests.lanes_norm computes the same bits in NumPy.

   xxHash is vendored (vendor/xxhash, BSD 2-Clause) and compiled into this module (setup.py). */

#include "native.h"

#include <math.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t */
#include "xxhash.h"
#ifdef TWICE_XXH_DISPATCH /* x86: the widest vector unit the CPU has, chosen at run time */
#include "xxh_x86dispatch.h"
#define HASH_UPDATE XXH3_128bits_update_dispatch
#else
#define HASH_UPDATE XXH3_128bits_update
#endif

/* bytes hashed, then summed, while in the L1 cache (a multiple of LANES * 8) */
#define HASH_CHUNK (1 << 15)

#define LANES 32 /* running sums: enough independent additions to keep the vector units busy */

/* Sums of squares of float32 or float64 values into LANES running sums, element i into sum i mod
   LANES (the caller passes whole multiples of LANES elements but for the last piece).
   Compiled twice on x86 with GCC or Clang, for the baseline and for AVX2, chosen at run time: the
   same operations in the same order (no fused multiply-add: setup.py passes -ffp-contract=off),
   so the same bits, twice as many lanes a step. */
#define ADD_SQUARES_BODY                                                                           \
    double acc[LANES];                                                                             \
    memcpy(acc, sums, sizeof acc); /* in registers for the loop */                                 \
    Py_ssize_t i = 0;                                                                              \
    if (kind == 1) {                                                                               \
        const float *x = (const float *)data;                                                      \
        for (; i + LANES <= count; i += LANES)                                                     \
            for (int k = 0; k < LANES; k++) /* exact: at most 48 significant bits */               \
                acc[k] += (double)x[i + k] * (double)x[i + k];                                     \
        for (; i < count; i++) acc[i % LANES] += (double)x[i] * (double)x[i];                      \
    } else {                                                                                       \
        const double *x = (const double *)data;                                                    \
        for (; i + LANES <= count; i += LANES)                                                     \
            for (int k = 0; k < LANES; k++) acc[k] += x[i + k] * x[i + k];                         \
        for (; i < count; i++) acc[i % LANES] += x[i] * x[i];                                      \
    }                                                                                              \
    memcpy(sums, acc, sizeof acc);

static void add_squares_base(const char *data, Py_ssize_t count, int kind, double sums[LANES]) {
    ADD_SQUARES_BODY
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) static void add_squares_avx2(const char *data, Py_ssize_t count,
                                                             int kind, double sums[LANES]) {
    ADD_SQUARES_BODY
}

/* float32 only: the square of a float32 is exact in double (at most 48 significant bits), so a
   fused multiply-add rounds once where the multiply and add round once too: the same bits, in half
   the operations. Not for NaNs, whose payloads the two may pass on differently: hash() redoes a
   tensor whose sums hold a NaN without it. */
__attribute__((target("avx2,fma"))) static void
add_squares_fused(const char *data, Py_ssize_t count, double sums[LANES]) {
    double acc[LANES];
    memcpy(acc, sums, sizeof acc);
    const float *x = (const float *)data;
    Py_ssize_t i = 0;
    for (; i + LANES <= count; i += LANES)
        for (int k = 0; k < LANES; k++)
            acc[k] = __builtin_fma((double)x[i + k], (double)x[i + k], acc[k]);
    for (; i < count; i++)
        acc[i % LANES] = __builtin_fma((double)x[i], (double)x[i], acc[i % LANES]);
    memcpy(sums, acc, sizeof acc);
}

/* fused: may it take the fused path (float32 on a CPU with FMA)? Returns whether it did. */
static int add_squares(const char *data, Py_ssize_t count, int kind, double sums[LANES],
                       int fused) {
    static int avx2 = -1, fma = -1;
    if (avx2 < 0) {
        avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
        fma = avx2 && __builtin_cpu_supports("fma") ? 1 : 0;
    }
    if (fused && kind == 1 && fma) {
        add_squares_fused(data, count, sums);
        return 1;
    }
    if (avx2)
        add_squares_avx2(data, count, kind, sums);
    else
        add_squares_base(data, count, kind, sums);
    return 0;
}
#else
static int add_squares(const char *data, Py_ssize_t count, int kind, double sums[LANES],
                       int fused) {
    (void)fused;
    add_squares_base(data, count, kind, sums);
    return 0;
}
#endif

static const char HEX[] = "0123456789abcdef";

/* hash(items) -> (digests, norms)

   items: a list of (head: bytes, address: int, size: int, kind: int, tail: bytes or None);
   kind 1 or 2: the bytes are float32 or float64 values, and their L2 norm is returned too;
   digests: per item the XXH3-128 hex digest of head + the size bytes at address + tail (what
   xxhash.xxh3_128(head).update(...).hexdigest() gives); norms: per item a float, or None. */
static PyObject *hash(PyObject *module, PyObject *items) {
    (void)module;
    if (!PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError,
                        "hash() takes a list of (head, address, size, kind, tail)");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(items);
    PyObject *digests = PyList_New(count), *norms = PyList_New(count);
    XXH3_state_t *state = XXH3_createState();
    if (!digests || !norms || !state) {
        if (!state) PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t n = 0; n < count; n++) {
        PyObject *item = PyList_GET_ITEM(items, n);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 5 ||
            !PyBytes_Check(PyTuple_GET_ITEM(item, 0))) {
            PyErr_SetString(PyExc_TypeError,
                            "an item is (head: bytes, address, size, kind, tail: bytes or None)");
            goto fail;
        }
        PyObject *head = PyTuple_GET_ITEM(item, 0), *tail = PyTuple_GET_ITEM(item, 4);
        const char *data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(item, 1));
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 2));
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(item, 3));
        if (PyErr_Occurred()) goto fail;
        Py_ssize_t width = kind == 1 ? 4 : kind == 2 ? 8 : 1;
        if (size < 0 || (size && !data) || (kind != 0 && kind != 1 && kind != 2) || size % width ||
            (tail != Py_None && !PyBytes_Check(tail))) {
            PyErr_SetString(PyExc_ValueError, "an item's address, size, kind or tail is not valid");
            goto fail;
        }
        double sums[LANES] = {0};
        int fused = 0;
        XXH3_128bits_reset(state);
        HASH_UPDATE(state, PyBytes_AS_STRING(head), (size_t)PyBytes_GET_SIZE(head));
        for (Py_ssize_t at = 0; at < size; at += HASH_CHUNK) {
            Py_ssize_t piece = size - at < HASH_CHUNK ? size - at : HASH_CHUNK;
            HASH_UPDATE(state, data + at, (size_t)piece);
            if (kind) /* HASH_CHUNK is a multiple of 64 bytes */
                fused = add_squares(data + at, piece / width, (int)kind, sums, 1);
        }
        if (fused) {
            int nan = 0;
            for (int k = 0; k < LANES; k++) nan |= isnan(sums[k]);
            if (nan) { /* rare: again, unfused */
                memset(sums, 0, sizeof sums);
                for (Py_ssize_t at = 0; at < size; at += HASH_CHUNK) {
                    Py_ssize_t piece = size - at < HASH_CHUNK ? size - at : HASH_CHUNK;
                    add_squares(data + at, piece / width, (int)kind, sums, 0);
                }
            }
        }
        if (tail != Py_None)
            HASH_UPDATE(state, PyBytes_AS_STRING(tail), (size_t)PyBytes_GET_SIZE(tail));
        XXH128_canonical_t canonical;
        XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state));
        char text[32];
        for (int i = 0; i < 16; i++) {
            text[2 * i] = HEX[canonical.digest[i] >> 4];
            text[2 * i + 1] = HEX[canonical.digest[i] & 15];
        }
        PyObject *digest = PyUnicode_FromStringAndSize(text, 32);
        if (!digest) goto fail;
        PyList_SET_ITEM(digests, n, digest);
        PyObject *norm;
        if (kind) {
            /* the sums added pairwise: 32, 16, ..., 1 */
            for (int width = LANES / 2; width >= 1; width /= 2)
                for (int k = 0; k < width; k++) sums[k] = sums[2 * k] + sums[2 * k + 1];
            norm = PyFloat_FromDouble(sqrt(sums[0]));
            if (!norm) goto fail;
        } else {
            norm = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(norms, n, norm);
    }
    XXH3_freeState(state);
    PyObject *result = PyTuple_Pack(2, digests, norms);
    Py_DECREF(digests);
    Py_DECREF(norms);
    return result;
fail:
    if (state) XXH3_freeState(state);
    Py_XDECREF(digests);
    Py_XDECREF(norms);
    return NULL;
}

static PyMethodDef hashing_methods[] = {
    {"hash", hash, METH_O,
     "XXH3-128 digests (and float norms) of many buffers (see digests.digest_many)."},
    {NULL, NULL, 0, NULL},
};

int bind_hashing(PyObject *module) { return PyModule_AddFunctions(module, hashing_methods); }
