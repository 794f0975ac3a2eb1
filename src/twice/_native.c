/* twice's compiled part (optional: twice falls back to Python where it was not built, with the
   same results bit for bit). Two functions, each replacing a loop that ran many small Python
   steps per training step or per sample:

   fetch   twice.data's seeded per-sample fetch (data.samples.SeededSamples._fetch): per sample, put each
           global RNG in the sample's state, fetch dataset[index], and check that the sample read
           only the words made fresh. It makes the same states as sample_rng.py does in NumPy (a
           test holds the two together, sample for sample): counter c of sample i under key k is
           SplitMix64's output for k + i * 1024 * golden + c * golden (mod 2^64); an RNG's state
           is its template's head, the seed (counter 0) where it has one, then its first fresh
           words, two per value, low half first, written at the addresses sample_rng.py confirmed.

   hash    the step trace's digests of many buffers in one call (digests.digest_many): each is
           XXH3-128 of a framed head, the bytes at an address, and an optional tail, exactly as
           the xxhash package computes it for the same bytes; with, for float32 and float64
           buffers, the L2 norm, accumulated in double in a fixed order (32 running sums,
           element i into sum i mod 32, then added pairwise) in the same pass, so each gradient
           is read once. digests.lanes_norm computes the same bits in NumPy.

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
           judge.

   xxHash is vendored as a header (vendor/xxhash, BSD 2-Clause), compiled inline into this module. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <ctype.h>

#define XXH_STATIC_LINKING_ONLY  /* XXH3_state_t */
#include "xxhash.h"
#ifdef TWICE_XXH_DISPATCH  /* x86: the widest vector unit the CPU has, chosen at run time (setup.py) */
#include "xxh_x86dispatch.h"
#define HASH_UPDATE XXH3_128bits_update_dispatch
#else
#define HASH_UPDATE XXH3_128bits_update
#endif

#define MT_WORDS 624
#define GOLDEN 0x9E3779B97F4A7C15ULL
#define SAMPLE_COUNTERS 1024ULL

typedef struct {
    char *target;
    const char *data;
    Py_ssize_t size;
} block_t;

typedef struct {
    char *target;          /* the RNG's memory */
    block_t head;          /* the template's bytes before the words (position 0, seed slot) */
    Py_ssize_t seed_at;    /* where the 64-bit seed goes in the head, or -1 */
    Py_ssize_t words_at;   /* where the words start */
    const uint64_t *counters;  /* counter * golden: the seed's first where there is one, then the pairs' */
    Py_ssize_t n_counters;
    Py_ssize_t fresh_bytes;    /* 4 * fresh words */
    block_t *constants;    /* written before every sample */
    Py_ssize_t n_constants;
    int checked;           /* 0: all 624 words are fresh, nothing to check */
    const char *position;
    const char *tail;
    uint64_t expected;
    long words;
    long needed;
} rng_t;

static inline uint64_t finish(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static int read_block(PyObject *item, block_t *out) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
        PyErr_SetString(PyExc_TypeError, "(address, bytes) expected");
        return -1;
    }
    out->target = PyLong_AsVoidPtr(PyTuple_GET_ITEM(item, 0));
    out->data = PyBytes_AS_STRING(PyTuple_GET_ITEM(item, 1));
    out->size = PyBytes_GET_SIZE(PyTuple_GET_ITEM(item, 1));
    return PyErr_Occurred() ? -1 : 0;
}

static int read_blocks(PyObject *items, block_t **out, Py_ssize_t *count) {
    if (!PyTuple_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "a tuple of (address, bytes) expected");
        return -1;
    }
    *count = PyTuple_GET_SIZE(items);
    *out = PyMem_Calloc(*count + 1, sizeof(block_t));
    if (!*out) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *count; i++)
        if (read_block(PyTuple_GET_ITEM(items, i), *out + i) < 0)
            return -1;
    return 0;
}

/* One RNG: (address, head bytes, seed_at, words_at, counters as bytes, fresh bytes, constants,
   batch constants, check) where check is None or (position address, tail address, expected
   tail, fresh words). The batch constants are written now, once. */
static int read_rng(PyObject *spec, rng_t *rng) {
    PyObject *head, *counters, *constants, *batch, *check;
    Py_ssize_t n_batch;
    block_t *batch_blocks = NULL;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 9) {
        PyErr_SetString(PyExc_TypeError, "an RNG spec is a 9-tuple");
        return -1;
    }
    rng->target = PyLong_AsVoidPtr(PyTuple_GET_ITEM(spec, 0));
    head = PyTuple_GET_ITEM(spec, 1);
    rng->seed_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 2));
    rng->words_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 3));
    counters = PyTuple_GET_ITEM(spec, 4);
    rng->fresh_bytes = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 5));
    constants = PyTuple_GET_ITEM(spec, 6);
    batch = PyTuple_GET_ITEM(spec, 7);
    check = PyTuple_GET_ITEM(spec, 8);
    if (PyErr_Occurred())
        return -1;
    if (!PyBytes_Check(head) || !PyBytes_Check(counters) || PyBytes_GET_SIZE(counters) % 8) {
        PyErr_SetString(PyExc_TypeError, "head and counters must be bytes (counters: uint64s)");
        return -1;
    }
    rng->head.target = rng->target;
    rng->head.data = PyBytes_AS_STRING(head);
    rng->head.size = PyBytes_GET_SIZE(head);
    rng->counters = (const uint64_t *)PyBytes_AS_STRING(counters);
    rng->n_counters = PyBytes_GET_SIZE(counters) / 8;
    Py_ssize_t pairs = rng->n_counters - (rng->seed_at >= 0);
    if (rng->fresh_bytes < 0 || rng->fresh_bytes > 8 * pairs || rng->fresh_bytes > 4 * MT_WORDS ||
        (rng->seed_at >= 0 && rng->seed_at + 8 > rng->head.size) || rng->head.size > rng->words_at) {
        PyErr_SetString(PyExc_ValueError, "an RNG spec's sizes do not fit together");
        return -1;
    }
    if (read_blocks(constants, &rng->constants, &rng->n_constants) < 0)
        return -1;
    if (read_blocks(batch, &batch_blocks, &n_batch) < 0) {
        PyMem_Free(batch_blocks);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n_batch; i++)
        memcpy(batch_blocks[i].target, batch_blocks[i].data, (size_t)batch_blocks[i].size);
    PyMem_Free(batch_blocks);
    if (check == Py_None)
        return 0;
    if (!PyTuple_Check(check) || PyTuple_GET_SIZE(check) != 4) {
        PyErr_SetString(PyExc_TypeError, "a check is (position, tail, expected, words)");
        return -1;
    }
    rng->checked = 1;
    rng->position = PyLong_AsVoidPtr(PyTuple_GET_ITEM(check, 0));
    rng->tail = PyLong_AsVoidPtr(PyTuple_GET_ITEM(check, 1));
    rng->expected = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(check, 2));
    rng->words = PyLong_AsLong(PyTuple_GET_ITEM(check, 3));
    return PyErr_Occurred() ? -1 : 0;
}

static void put(const rng_t *rng, uint64_t base) {
    uint64_t value;
    Py_ssize_t i = 0;
    memcpy(rng->target, rng->head.data, (size_t)rng->head.size);
    if (rng->seed_at >= 0) {
        value = finish(base + rng->counters[0]);
        memcpy(rng->target + rng->seed_at, &value, 8);
        i = 1;
    }
    char *words = rng->target + rng->words_at;
    for (Py_ssize_t written = 0; written < rng->fresh_bytes; i++, written += 8) {
        value = finish(base + rng->counters[i]);
        Py_ssize_t size = rng->fresh_bytes - written < 8 ? rng->fresh_bytes - written : 8;
        memcpy(words + written, &value, (size_t)size);  /* little-endian: the low word first */
    }
    for (Py_ssize_t c = 0; c < rng->n_constants; c++)
        memcpy(rng->constants[c].target, rng->constants[c].data, (size_t)rng->constants[c].size);
}

static void check(rng_t *rng) {
    uint32_t position;
    uint64_t tail;
    if (!rng->checked)
        return;
    memcpy(&position, rng->position, sizeof position);
    memcpy(&tail, rng->tail, sizeof tail);
    if ((long)position > rng->words || tail != rng->expected) {
        /* read past the fresh words (it needs its position), or regenerated the block (all of them) */
        long needed = (long)position > rng->words ? (long)position : MT_WORDS;
        if (needed > rng->needed)
            rng->needed = needed;
    }
}

static int as_u64(PyObject *value, uint64_t *out) {
    PyObject *index = PyNumber_Index(value);
    if (!index)
        return -1;
    *out = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    return PyErr_Occurred() ? -1 : 0;
}

/* fetch(dataset, keys, stream_keys, rngs, cleared) -> (samples, needed)

   keys: a list of (stream, index) pairs, each fetched as dataset[index];
   stream_keys: the epoch's key for every sample (an int), or a list of one per sample;
   rngs: a tuple of RNG specs (see read_rng);
   cleared: (object, attribute name) pairs, set to None before every sample (Python's cached Gaussian);
   needed: per RNG, 0 where every sample fitted, else the most fresh words a sample needed. */
static PyObject *fetch(PyObject *module, PyObject *args) {
    PyObject *dataset, *keys, *stream_keys, *rng_specs, *cleared;
    (void)module;
    if (!PyArg_ParseTuple(args, "OO!OO!O!", &dataset, &PyList_Type, &keys, &stream_keys, &PyTuple_Type, &rng_specs,
                          &PyTuple_Type, &cleared))
        return NULL;
    Py_ssize_t rows = PyList_GET_SIZE(keys), n_rngs = PyTuple_GET_SIZE(rng_specs), n_cleared = PyTuple_GET_SIZE(cleared);
    for (Py_ssize_t i = 0; i < n_cleared; i++) {
        PyObject *pair = PyTuple_GET_ITEM(cleared, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "cleared: (object, attribute name) pairs expected");
            return NULL;
        }
    }
    int per_sample = PyList_Check(stream_keys);
    uint64_t shared_key = 0;
    if (per_sample ? PyList_GET_SIZE(stream_keys) != rows : as_u64(stream_keys, &shared_key) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "one stream key per sample expected");
        return NULL;
    }
    rng_t *rngs = PyMem_Calloc(n_rngs + 1, sizeof(rng_t));
    PyObject *samples = NULL, *result = NULL, *needed = NULL;
    if (!rngs)
        return PyErr_NoMemory();
    for (Py_ssize_t r = 0; r < n_rngs; r++)
        if (read_rng(PyTuple_GET_ITEM(rng_specs, r), rngs + r) < 0)
            goto done;
    samples = PyList_New(rows);
    if (!samples)
        goto done;
    for (Py_ssize_t row = 0; row < rows; row++) {
        PyObject *key = PyList_GET_ITEM(keys, row);
        uint64_t index, stream = shared_key;
        if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 2) {
            PyErr_SetString(PyExc_TypeError, "keys: (stream, index) pairs expected");
            goto done;
        }
        if (as_u64(PyTuple_GET_ITEM(key, 1), &index) < 0)
            goto done;
        if (per_sample && as_u64(PyList_GET_ITEM(stream_keys, row), &stream) < 0)
            goto done;
        uint64_t base = stream + index * (SAMPLE_COUNTERS * GOLDEN);
        for (Py_ssize_t r = 0; r < n_rngs; r++)
            put(rngs + r, base);
        for (Py_ssize_t i = 0; i < n_cleared; i++) {
            PyObject *pair = PyTuple_GET_ITEM(cleared, i);
            if (PyObject_SetAttr(PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1), Py_None) < 0)
                goto done;
        }
        PyObject *sample = PyObject_GetItem(dataset, PyTuple_GET_ITEM(key, 1));
        if (!sample)
            goto done;  /* the caller puts the RNGs back and lets the error through */
        PyList_SET_ITEM(samples, row, sample);
        for (Py_ssize_t r = 0; r < n_rngs; r++)
            check(rngs + r);
    }
    needed = PyTuple_New(n_rngs);
    if (!needed)
        goto done;
    for (Py_ssize_t r = 0; r < n_rngs; r++) {
        PyObject *value = PyLong_FromLong(rngs[r].needed);
        if (!value)
            goto done;
        PyTuple_SET_ITEM(needed, r, value);
    }
    result = PyTuple_Pack(2, samples, needed);
done:
    Py_XDECREF(samples);
    Py_XDECREF(needed);
    for (Py_ssize_t r = 0; r < n_rngs; r++)
        PyMem_Free(rngs[r].constants);
    PyMem_Free(rngs);
    return result;
}

#define HASH_CHUNK (1 << 15)  /* bytes hashed, then summed, while in the L1 cache (a multiple of LANES * 8) */

#define LANES 32  /* running sums: enough independent additions to keep the vector units busy */

/* Sums of squares of float32 or float64 values into LANES running sums, element i into sum i mod
   LANES (the caller passes whole multiples of LANES elements but for the last piece).
   Compiled twice on x86 with GCC or Clang, for the baseline and for AVX2, chosen at run time: the
   same operations in the same order (no fused multiply-add: setup.py passes -ffp-contract=off),
   so the same bits, twice as many lanes a step. */
#define ADD_SQUARES_BODY                                                                            \
    double acc[LANES];                                                                                  \
    memcpy(acc, sums, sizeof acc); /* in registers for the loop */                                  \
    Py_ssize_t i = 0;                                                                               \
    if (kind == 1) {                                                                                \
        const float *x = (const float *)data;                                                       \
        for (; i + LANES <= count; i += LANES)                                                      \
            for (int k = 0; k < LANES; k++)                                                         \
                acc[k] += (double)x[i + k] * (double)x[i + k]; /* exact: at most 48 significant bits */ \
        for (; i < count; i++)                                                                      \
            acc[i % LANES] += (double)x[i] * (double)x[i];                                          \
    } else {                                                                                        \
        const double *x = (const double *)data;                                                     \
        for (; i + LANES <= count; i += LANES)                                                      \
            for (int k = 0; k < LANES; k++)                                                         \
                acc[k] += x[i + k] * x[i + k];                                                      \
        for (; i < count; i++)                                                                      \
            acc[i % LANES] += x[i] * x[i];                                                          \
    }                                                                                               \
    memcpy(sums, acc, sizeof acc);

static void add_squares_base(const char *data, Py_ssize_t count, int kind, double sums[LANES]) {
    ADD_SQUARES_BODY
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) static void add_squares_avx2(const char *data, Py_ssize_t count, int kind,
                                                              double sums[LANES]) {
    ADD_SQUARES_BODY
}

/* float32 only: the square of a float32 is exact in double (at most 48 significant bits), so a
   fused multiply-add rounds once where the multiply and add round once too: the same bits, in half
   the operations. Not for NaNs, whose payloads the two may pass on differently: hash() redoes a
   tensor whose sums hold a NaN without it. */
__attribute__((target("avx2,fma"))) static void add_squares_fused(const char *data, Py_ssize_t count,
                                                                   double sums[LANES]) {
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
static int add_squares(const char *data, Py_ssize_t count, int kind, double sums[LANES], int fused) {
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
static int add_squares(const char *data, Py_ssize_t count, int kind, double sums[LANES], int fused) {
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
        PyErr_SetString(PyExc_TypeError, "hash() takes a list of (head, address, size, kind, tail)");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(items);
    PyObject *digests = PyList_New(count), *norms = PyList_New(count);
    XXH3_state_t *state = XXH3_createState();
    if (!digests || !norms || !state) {
        if (!state)
            PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t n = 0; n < count; n++) {
        PyObject *item = PyList_GET_ITEM(items, n);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 5 || !PyBytes_Check(PyTuple_GET_ITEM(item, 0))) {
            PyErr_SetString(PyExc_TypeError, "an item is (head: bytes, address, size, kind, tail: bytes or None)");
            goto fail;
        }
        PyObject *head = PyTuple_GET_ITEM(item, 0), *tail = PyTuple_GET_ITEM(item, 4);
        const char *data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(item, 1));
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 2));
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(item, 3));
        if (PyErr_Occurred())
            goto fail;
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
            if (kind)  /* HASH_CHUNK is a multiple of 64 bytes */
                fused = add_squares(data + at, piece / width, (int)kind, sums, 1);
        }
        if (fused) {
            int nan = 0;
            for (int k = 0; k < LANES; k++)
                nan |= isnan(sums[k]);
            if (nan) {  /* rare: again, unfused */
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
        if (!digest)
            goto fail;
        PyList_SET_ITEM(digests, n, digest);
        PyObject *norm;
        if (kind) {
            for (int width = LANES / 2; width >= 1; width /= 2)  /* the sums added pairwise: 32, 16, ..., 1 */
                for (int k = 0; k < width; k++)
                    sums[k] = sums[2 * k] + sums[2 * k + 1];
            norm = PyFloat_FromDouble(sqrt(sums[0]));
            if (!norm)
                goto fail;
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
    if (state)
        XXH3_freeState(state);
    Py_XDECREF(digests);
    Py_XDECREF(norms);
    return NULL;
}

/* The body of a trace line (all but its time) and its step: 0 when the line does not end in
   `"step":N}` or `"step":N,"time":T}` (the canonical order: keys sorted, "time" last). */
static int line_body(const char *line, const char *end, const char **body_end, unsigned long long *step) {
    const char *close = end - 1; /* at the '}' before the newline */
    if (close <= line || *close != '}' || *line != '{')
        return 0;
    const char *p = close;
    while (p > line && (isdigit((unsigned char)p[-1]) || p[-1] == '.' || p[-1] == '-' || p[-1] == '+' ||
                        p[-1] == 'e' || p[-1] == 'E'))
        p--;
    const char *body = close;
    if (p - line >= 8 && memcmp(p - 8, ",\"time\":", 8) == 0)
        body = p - 8;
    const char *q = body;
    while (q > line && isdigit((unsigned char)q[-1]))
        q--;
    if (q == body || body - q > 19 || q - line < 7 || memcmp(q - 7, "\"step\":", 7) != 0)
        return 0;
    if (body - q > 1 && *q == '0')
        return 0; /* a leading zero is not JSON */
    unsigned long long value = 0;
    for (const char *d = q; d < body; d++)
        value = value * 10 + (unsigned long long)(*d - '0');
    if (value > 0x7FFFFFFFFFFFFFFFULL)
        return 0;
    *body_end = body;
    *step = value;
    return 1;
}

/* ---- record_valid: a canonical trace line whose every field is valid (records.py's language) ----
   Accepts only the exact bytes record_line writes for a valid StepRecord: keys sorted, compact,
   each value of its field's form (a digest: 32 lowercase hex digits; a float: float_bits' text; a
   map: names of printable ASCII, sorted, to digests). Anything else returns 0 and goes to the
   Python reader, which parses it whole and accepts it or names the fault: this language is a
   subset of what StepRecord.from_json accepts (tests/unit/store/test_tracescan.py checks it on generated
   lines). params_before, written once per trace, always takes the Python path. */
enum { V_DIGEST, V_MAP, V_FLOAT, V_LOSS, V_LIST, V_BOOL, V_STEP, V_TIME };
static const struct { const char *name; int kind; int evidence; } RECORD_KEYS[] = {
    {"batch", V_DIGEST, 1}, {"grad_digests", V_MAP, 1}, {"grad_norm", V_FLOAT, 1},
    {"grads", V_DIGEST, 1}, {"loss", V_LOSS, 1}, {"lr", V_LIST, 1}, {"param_digests", V_MAP, 1},
    {"params", V_DIGEST, 1}, {"params_full", V_DIGEST, 1}, {"rng", V_MAP, 1},
    {"skipped", V_BOOL, 1}, {"step", V_STEP, 0}, {"time", V_TIME, 0},
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
        if (p < end && *p == ',') { p++; continue; }
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
        if (p < end && *p == ',') { p++; continue; }
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
    case V_BOOL: { const char *q = lit(p, end, "true"); return q ? q : lit(p, end, "false"); }
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
        if (p < end && *p == ',') { p++; continue; }
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
    if (!PyArg_ParseTuple(args, "y*", &line))
        return NULL;
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
    Py_BEGIN_ALLOW_THREADS  /* the buffers are held: a report walks other traces meanwhile */
    for (;;) {
        const char *na = memchr(pa, '\n', (size_t)(end_a - pa)), *nb = memchr(pb, '\n', (size_t)(end_b - pb));
        if (!na || !nb)
            break;
        const char *body_a, *body_b;
        unsigned long long step_a, step_b;
        if (!line_body(pa, na, &body_a, &step_a) || !line_body(pb, nb, &body_b, &step_b))
            break;
        if (step_a != step_b || (long long)step_a <= last || (long long)step_a >= limit)
            break;
        if (body_a - pa != body_b - pb || memcmp(pa, pb, (size_t)(body_a - pa)) != 0)
            break;
        /* Every line is validated, not only compared: equal damage in both must not pass. The
           bodies are equal, so A's whole line and B's tail validate both. */
        if (!record_valid(pa, na) || !tail_valid(body_b, nb))
            break;
        last = (long long)step_a;
        lines++;
        pa = na + 1;
        pb = nb + 1;
    }
    Py_END_ALLOW_THREADS
    PyObject *result = Py_BuildValue("LnnL", lines, (Py_ssize_t)(pa - base_a), (Py_ssize_t)(pb - base_b), last);
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
    for (int k = 0; k < SERIES_COUNT; k++)
        found[k] = NULL;
    for (const char *c = p; c < end; c++) {
        if (*c == '"') {
            const char *close = memchr(c + 1, '"', (size_t)(end - c - 1));
            if (!close)
                return;
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
    if (!v)
        return 0;
    if (v < end && *v == '[')
        v++;
    if (v >= end || *v != '"')
        return 0;
    v++;
    const char *close = memchr(v, '"', (size_t)(end - v));
    if (!close || close - v > 60 || close == v)
        return 0;
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
    if (!PyArg_ParseTuple(args, "y*nL", &data, &at, &last))
        return NULL;
    const char *base = data.buf, *p = base + (at < 0 ? 0 : at), *end = base + data.len;
    Py_ssize_t capacity = 0;
    for (const char *c = p; c < end && (c = memchr(c, '\n', (size_t)(end - c))); c++)
        capacity++;
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
    Py_BEGIN_ALLOW_THREADS  /* the buffer is held: two traces' series run side by side */
    for (;;) {
        const char *newline = memchr(p, '\n', (size_t)(end - p));
        if (!newline)
            break;
        const char *body;
        unsigned long long step;
        if (!line_body(p, newline, &body, &step) || (long long)step <= last || !record_valid(p, newline))
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
    PyObject *result = Py_BuildValue("(y#y#y#nnL)", PyBytes_AS_STRING(steps), count * 8,
                                     PyBytes_AS_STRING(values), capacity * 8 * SERIES_COUNT,
                                     PyBytes_AS_STRING(present), capacity * SERIES_COUNT, count,
                                     (Py_ssize_t)(p - base), last);
    Py_DECREF(steps);
    Py_DECREF(values);
    Py_DECREF(present);
    PyBuffer_Release(&data);
    return result;
}

/* Portable mode's kernels live in _portable.c (see there). */
PyObject *p_init(PyObject *, PyObject *);
PyObject *p_kernels(PyObject *, PyObject *);
PyObject *p_unary(PyObject *, PyObject *, PyObject *);
PyObject *p_binary(PyObject *, PyObject *, PyObject *);
PyObject *p_split(PyObject *, PyObject *, PyObject *);
PyObject *p_rowsum(PyObject *, PyObject *, PyObject *);
PyObject *p_uniform(PyObject *, PyObject *, PyObject *);
PyObject *p_normal(PyObject *, PyObject *, PyObject *);
PyObject *p_scale(PyObject *, PyObject *, PyObject *);
PyObject *p_compound(PyObject *, PyObject *, PyObject *);
PyObject *p_chansum(PyObject *, PyObject *, PyObject *);
PyObject *p_chanmap(PyObject *, PyObject *, PyObject *);
PyObject *p_bnsums(PyObject *, PyObject *, PyObject *);
PyObject *p_lnfwd(PyObject *, PyObject *, PyObject *);
PyObject *p_colsum(PyObject *, PyObject *, PyObject *);
PyObject *p_keep_memory(PyObject *, PyObject *);
PyObject *p_threads(PyObject *, PyObject *, PyObject *);
PyObject *p_lnbwd(PyObject *, PyObject *, PyObject *);
PyObject *p_lstm_cell(PyObject *, PyObject *, PyObject *);
PyObject *p_unfold(PyObject *, PyObject *, PyObject *);
PyObject *p_fold_scale(PyObject *, PyObject *, PyObject *);
PyObject *p_conv_forward(PyObject *, PyObject *, PyObject *);
PyObject *p_conv_weight_grad(PyObject *, PyObject *, PyObject *);
PyObject *p_lstm_step(PyObject *, PyObject *);
PyObject *p_lstm_step_backward(PyObject *, PyObject *);
PyObject *p_lstm_cell_backward(PyObject *, PyObject *, PyObject *);

static PyMethodDef methods[] = {
    {"p_init", p_init, METH_VARARGS, "Portable mode: the coefficients of the elementwise functions."},
    {"p_kernels", p_kernels, METH_NOARGS, "Portable mode: the kernels' names, in code order."},
    {"p_unary", (PyCFunction)(void (*)(void))p_unary, METH_VARARGS | METH_KEYWORDS, "Portable mode: an elementwise function of a buffer."},
    {"p_binary", (PyCFunction)(void (*)(void))p_binary, METH_VARARGS | METH_KEYWORDS, "Portable mode: a backward of GELU/SiLU, or softplus."},
    {"p_split", (PyCFunction)(void (*)(void))p_split, METH_VARARGS | METH_KEYWORDS, "Portable mode: rows as integers on their power-of-two unit."},
    {"p_rowsum", (PyCFunction)(void (*)(void))p_rowsum, METH_VARARGS | METH_KEYWORDS, "Portable mode: exact row sums."},
    {"p_uniform", (PyCFunction)(void (*)(void))p_uniform, METH_VARARGS | METH_KEYWORDS, "Portable mode: Philox uniforms."},
    {"p_normal", (PyCFunction)(void (*)(void))p_normal, METH_VARARGS | METH_KEYWORDS, "Portable mode: Philox normals (Box-Muller)."},
    {"p_scale", (PyCFunction)(void (*)(void))p_scale, METH_VARARGS | METH_KEYWORDS, "Portable mode: an integer product scaled, plus a bias, rounded once."},
    {"p_chansum", (PyCFunction)(void (*)(void))p_chansum, METH_VARARGS | METH_KEYWORDS, "Portable mode: batch norm's exact per-channel sums."},
    {"p_colsum", (PyCFunction)(void (*)(void))p_colsum, METH_VARARGS | METH_KEYWORDS, "Portable mode: exact column sums (one slice)."},
    {"p_keep_memory", p_keep_memory, METH_NOARGS, "Portable mode: glibc malloc keeps freed memory for reuse."},
    {"p_threads", (PyCFunction)(void (*)(void))p_threads, METH_VARARGS | METH_KEYWORDS, "Portable mode: the threads (torch's OpenMP workers) the kernels may use."},
    {"p_lnfwd", (PyCFunction)(void (*)(void))p_lnfwd, METH_VARARGS | METH_KEYWORDS, "Portable mode: layer norm over rows (float32 precision)."},
    {"p_lnbwd", (PyCFunction)(void (*)(void))p_lnbwd, METH_VARARGS | METH_KEYWORDS, "Portable mode: layer norm's backward (float32 precision)."},
    {"p_bnsums", (PyCFunction)(void (*)(void))p_bnsums, METH_VARARGS | METH_KEYWORDS, "Portable mode: batch norm's four backward sums at once."},
    {"p_chanmap", (PyCFunction)(void (*)(void))p_chanmap, METH_VARARGS | METH_KEYWORDS, "Portable mode: batch norm's per-element formulas."},
    {"p_compound", (PyCFunction)(void (*)(void))p_compound, METH_VARARGS | METH_KEYWORDS, "Portable mode: addcmul/addcdiv/add-alpha/lerp, one rounding each."},
    {"p_unfold", (PyCFunction)(void (*)(void))p_unfold, METH_VARARGS | METH_KEYWORDS, "Portable mode: a convolution's input windows as integers on their rows' given grid."},
    {"p_fold_scale", (PyCFunction)(void (*)(void))p_fold_scale, METH_VARARGS | METH_KEYWORDS, "Portable mode: integer columns folded onto the input, scaled, rounded once."},
    {"p_conv_forward", (PyCFunction)(void (*)(void))p_conv_forward, METH_VARARGS | METH_KEYWORDS, "Portable mode: a convolution's forward, columns unfolded panel by panel in cache."},
    {"p_conv_weight_grad", (PyCFunction)(void (*)(void))p_conv_weight_grad, METH_VARARGS | METH_KEYWORDS, "Portable mode: a convolution's weight gradient as exact integer sums, in cache."},
    {"p_lstm_step", p_lstm_step, METH_VARARGS, "Portable mode: one LSTM step forward from its integer product, the next hidden state cut."},
    {"p_lstm_step_backward", p_lstm_step_backward, METH_VARARGS, "Portable mode: one LSTM step backward from its integer product, the gates' gradients cut."},
    {"p_lstm_cell", (PyCFunction)(void (*)(void))p_lstm_cell, METH_VARARGS | METH_KEYWORDS, "Portable mode: one LSTM step, forward."},
    {"p_lstm_cell_backward", (PyCFunction)(void (*)(void))p_lstm_cell_backward, METH_VARARGS | METH_KEYWORDS, "Portable mode: one LSTM step, backward."},
    {"fetch", fetch, METH_VARARGS, "twice.data's seeded per-sample fetch (see data.py and sample_rng.py)."},
    {"hash", hash, METH_O, "XXH3-128 digests (and float norms) of many buffers (see digests.digest_many)."},
    {"series", series, METH_VARARGS, "Steps, losses, learning rates and gradient norms of valid canonical trace lines (see store.traceseries)."},
    {"record_valid", record_valid_py, METH_VARARGS, "Whether a trace line (with its newline) is a canonical, valid record."},
    {"same_lines", same_lines, METH_VARARGS, "Equal trace lines of two buffers, walked in step (see store.tracescan)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "twice._native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    return PyModule_Create(&module);
}
