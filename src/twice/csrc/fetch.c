/* twice._native's fetch: twice.data's seeded per-sample fetch (data.samples.SeededSamples._fetch)
   in one C loop. Per sample, it puts each global RNG in the sample's state, fetches
   dataset[index], and checks that the sample read only the words made fresh. It makes the same
   states as rng/sample.py does in NumPy (a test holds the two together, sample for sample):
   counter c of sample i under key k is SplitMix64's output for k + i * 1024 * golden + c * golden
   (mod 2^64); an RNG's state is its template's head, the seed (counter 0) where it has one, then
   its first fresh words, two per value, low half first, written at the addresses rng/sample.py
   confirmed. */

#include "native.h"

#include <stdint.h>
#include <string.h>

#define MT_WORDS 624
#define GOLDEN 0x9E3779B97F4A7C15ULL
#define SAMPLE_COUNTERS 1024ULL

typedef struct {
    char *target;
    const char *data;
    Py_ssize_t size;
} block_t;

typedef struct {
    char *target;        /* the RNG's memory */
    block_t head;        /* the template's bytes before the words (position 0, seed slot) */
    Py_ssize_t seed_at;  /* where the 64-bit seed goes in the head, or -1 */
    Py_ssize_t words_at; /* where the words start */
    /* counter * golden: the seed's first where there is one, then the pairs' */
    const uint64_t *counters;
    Py_ssize_t n_counters;
    Py_ssize_t fresh_bytes; /* 4 * fresh words */
    block_t *constants;     /* written before every sample */
    Py_ssize_t n_constants;
    int checked; /* 0: all 624 words are fresh, nothing to check */
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
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
        !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
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
        if (read_block(PyTuple_GET_ITEM(items, i), *out + i) < 0) return -1;
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
    if (PyErr_Occurred()) return -1;
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
        (rng->seed_at >= 0 && rng->seed_at + 8 > rng->head.size) ||
        rng->head.size > rng->words_at) {
        PyErr_SetString(PyExc_ValueError, "an RNG spec's sizes do not fit together");
        return -1;
    }
    if (read_blocks(constants, &rng->constants, &rng->n_constants) < 0) return -1;
    if (read_blocks(batch, &batch_blocks, &n_batch) < 0) {
        PyMem_Free(batch_blocks);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n_batch; i++)
        memcpy(batch_blocks[i].target, batch_blocks[i].data, (size_t)batch_blocks[i].size);
    PyMem_Free(batch_blocks);
    if (check == Py_None) return 0;
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
        memcpy(words + written, &value, (size_t)size); /* little-endian: the low word first */
    }
    for (Py_ssize_t c = 0; c < rng->n_constants; c++)
        memcpy(rng->constants[c].target, rng->constants[c].data, (size_t)rng->constants[c].size);
}

static void check(rng_t *rng) {
    uint32_t position;
    uint64_t tail;
    if (!rng->checked) return;
    memcpy(&position, rng->position, sizeof position);
    memcpy(&tail, rng->tail, sizeof tail);
    if ((long)position > rng->words || tail != rng->expected) {
        /* read past the fresh words (it needs its position), or regenerated the block (all of
           them) */
        long needed = (long)position > rng->words ? (long)position : MT_WORDS;
        if (needed > rng->needed) rng->needed = needed;
    }
}

static int as_u64(PyObject *value, uint64_t *out) {
    PyObject *index = PyNumber_Index(value);
    if (!index) return -1;
    *out = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    return PyErr_Occurred() ? -1 : 0;
}

/* fetch(dataset, keys, stream_keys, rngs, cleared) -> (samples, needed)

   keys: a list of (stream, index) pairs, each fetched as dataset[index];
   stream_keys: the epoch's key for every sample (an int), or a list of one per sample;
   rngs: a tuple of RNG specs (see read_rng);
   cleared: (object, attribute name) pairs, set to None before every sample (Python's cached
   Gaussian);
   needed: per RNG, 0 where every sample fitted, else the most fresh words a sample needed. */
static PyObject *fetch(PyObject *module, PyObject *args) {
    PyObject *dataset, *keys, *stream_keys, *rng_specs, *cleared;
    (void)module;
    if (!PyArg_ParseTuple(args, "OO!OO!O!", &dataset, &PyList_Type, &keys, &stream_keys,
                          &PyTuple_Type, &rng_specs, &PyTuple_Type, &cleared))
        return NULL;
    Py_ssize_t rows = PyList_GET_SIZE(keys), n_rngs = PyTuple_GET_SIZE(rng_specs);
    Py_ssize_t n_cleared = PyTuple_GET_SIZE(cleared);
    for (Py_ssize_t i = 0; i < n_cleared; i++) {
        PyObject *pair = PyTuple_GET_ITEM(cleared, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(pair, 1))) {
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
    if (!rngs) return PyErr_NoMemory();
    for (Py_ssize_t r = 0; r < n_rngs; r++)
        if (read_rng(PyTuple_GET_ITEM(rng_specs, r), rngs + r) < 0) goto done;
    samples = PyList_New(rows);
    if (!samples) goto done;
    for (Py_ssize_t row = 0; row < rows; row++) {
        PyObject *key = PyList_GET_ITEM(keys, row);
        uint64_t index, stream = shared_key;
        if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 2) {
            PyErr_SetString(PyExc_TypeError, "keys: (stream, index) pairs expected");
            goto done;
        }
        if (as_u64(PyTuple_GET_ITEM(key, 1), &index) < 0) goto done;
        if (per_sample && as_u64(PyList_GET_ITEM(stream_keys, row), &stream) < 0) goto done;
        uint64_t base = stream + index * (SAMPLE_COUNTERS * GOLDEN);
        for (Py_ssize_t r = 0; r < n_rngs; r++) put(rngs + r, base);
        for (Py_ssize_t i = 0; i < n_cleared; i++) {
            PyObject *pair = PyTuple_GET_ITEM(cleared, i);
            if (PyObject_SetAttr(PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1), Py_None) < 0)
                goto done;
        }
        PyObject *sample = PyObject_GetItem(dataset, PyTuple_GET_ITEM(key, 1));
        if (!sample) goto done; /* the caller puts the RNGs back and lets the error through */
        PyList_SET_ITEM(samples, row, sample);
        for (Py_ssize_t r = 0; r < n_rngs; r++) check(rngs + r);
    }
    needed = PyTuple_New(n_rngs);
    if (!needed) goto done;
    for (Py_ssize_t r = 0; r < n_rngs; r++) {
        PyObject *value = PyLong_FromLong(rngs[r].needed);
        if (!value) goto done;
        PyTuple_SET_ITEM(needed, r, value);
    }
    result = PyTuple_Pack(2, samples, needed);
done:
    Py_XDECREF(samples);
    Py_XDECREF(needed);
    for (Py_ssize_t r = 0; r < n_rngs; r++) PyMem_Free(rngs[r].constants);
    PyMem_Free(rngs);
    return result;
}

static PyMethodDef fetch_methods[] = {
    {"fetch", fetch, METH_VARARGS,
     "twice.data's seeded per-sample fetch (see data/samples.py and rng/sample.py)."},
    {NULL, NULL, 0, NULL},
};

int bind_fetch(PyObject *module) { return PyModule_AddFunctions(module, fetch_methods); }
