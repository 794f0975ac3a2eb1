/* twice's compiled part, the module twice._native (optional: twice falls back to Python where it
   was not built, with the same results bit for bit): its init, which binds each family's entry
   points. The families, one a file, each replacing a loop that ran many small Python steps per
   training step, per sample or per trace line:

   csrc/fetch.c    fetch: twice.data's seeded per-sample fetch
   csrc/hashing.c  hash: the step trace's digests (and float norms) of many buffers in one call
   csrc/records.c  record_valid, same_lines, series: trace lines validated, compared and read
   p_*             portable mode's kernels (bound below) */

#include "csrc/native.h"

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
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "twice._native", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *self = PyModule_Create(&module);
    if (!self)
        return NULL;
    /* each family of csrc/ adds its own entry points */
    if (bind_fetch(self) < 0 || bind_hashing(self) < 0 || bind_records(self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return self;
}
