/* twice's compiled part, the module twice._native (optional: twice falls back to Python where it
   was not built, with the same results bit for bit): its init, which binds each family's entry
   points. The families, one a file, each replacing a loop that ran many small Python steps per
   training step, per sample or per trace line:

   csrc/fetch.c    fetch: twice.data's seeded per-sample fetch
   csrc/hashing.c  hash: the step trace's digests (and float norms) of many buffers in one call
   csrc/records.c  record_valid, same_lines, series: trace lines validated, compared and read
   portable/native/csrc/  p_*: portable mode's kernels, one family a file (see portable.h) */

#include "csrc/native.h"

#include "portable/native/csrc/portable.h"

/* Every entry point is bound by its family (bind_* in PyInit__native). */
static PyMethodDef methods[] = {
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "twice._native", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *self = PyModule_Create(&module);
    if (!self) return NULL;
    /* each family of csrc/ and of portable/native/csrc/ adds its own entry points */
    if (bind_fetch(self) < 0 || bind_hashing(self) < 0 || bind_records(self) < 0 ||
        bind_portable_threads(self) < 0 || bind_portable_unary(self) < 0 ||
        bind_portable_exact(self) < 0 || bind_portable_norms(self) < 0 ||
        bind_portable_conv(self) < 0 || bind_portable_recurrent(self) < 0 ||
        bind_portable_random(self) < 0 || bind_portable_ordered(self) < 0 ||
        bind_portable_optim(self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return self;
}
