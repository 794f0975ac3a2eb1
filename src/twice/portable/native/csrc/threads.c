/* Portable mode's threads and memory: parallel_for (the work split every family uses), p_threads
   (how many threads it may use) and p_keep_memory (glibc's malloc keeps freed memory).

   The threads are torch's own OpenMP workers: a second pool beside them would wait for cores
   their spinning holds. The OpenMP runtime torch loaded (libgomp, or Intel's, which exports the
   same entry points) is found at run time with RTLD_NOLOAD, so the extension links no OpenMP of
   its own; where none is loaded the kernels run on the calling thread. p_threads sets how many
   (the Python side passes torch's count); a call with less than GRAIN elements per thread uses
   fewer. */

#include "portable.h"

#include <dlfcn.h>
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <xmmintrin.h>
#define FP_MODE 1 /* MXCSR: flush-to-zero, denormals-are-zero, rounding */
#endif
#ifdef __GLIBC__
#include <malloc.h>
#endif

#define MAX_THREADS 256
#define GRAIN 32768

static int n_threads = 1;
static void (*gomp_parallel)(void (*)(void *), void *, unsigned, unsigned) = NULL;
static int (*omp_thread_num)(void) = NULL;
static int (*omp_team_size)(void) = NULL;

typedef struct {
    range_fn fn;
    void *ctx;
    Py_ssize_t n;
    unsigned mode; /* the calling thread's floating-point mode */
} team_job;

/* Each worker computes in the calling thread's floating-point mode: the mode is per thread
   (torch.set_flush_denormal sets the caller's alone), and a worker that kept denormals where
   the caller flushes them would make a result depend on which thread computed it. */
static void team_body(void *p) {
    const team_job *job = (const team_job *)p;
    const Py_ssize_t team = omp_team_size(), t = omp_thread_num();
    const Py_ssize_t size = (job->n + team - 1) / team, lo = t * size;
    const Py_ssize_t hi = lo + size < job->n ? lo + size : job->n;
#ifdef FP_MODE
    const unsigned own = _mm_getcsr();
    _mm_setcsr((own & 0x3F) | (job->mode & ~0x3Fu)); /* the caller's controls, our own flags */
#endif
    if (lo < hi) job->fn(job->ctx, lo, hi);
#ifdef FP_MODE
    _mm_setcsr(own);
#endif
}

void parallel_for(Py_ssize_t n, Py_ssize_t work, range_fn fn, void *ctx) {
    Py_ssize_t threads = n_threads;
    if (threads > work / GRAIN) threads = work / GRAIN;
    if (threads > n) threads = n;
    if (threads <= 1 || !gomp_parallel) {
        fn(ctx, 0, n);
        return;
    }
    team_job job = {fn, ctx, n, 0};
#ifdef FP_MODE
    job.mode = _mm_getcsr();
#endif
    gomp_parallel(team_body, &job, (unsigned)threads, 0);
}

/* p_threads(threads): the threads the kernels may use from now on; returns whether an OpenMP
   runtime was found to run them. */
static PyObject *p_threads(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"threads", NULL};
    int n;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i", kw, &n)) return NULL;
    if (!gomp_parallel) {
        const char *names[] = {"libgomp.so.1", "libiomp5.so", "libomp.so", NULL};
        for (int i = 0; names[i] && !gomp_parallel; i++) {
            void *h = dlopen(names[i], RTLD_NOLOAD | RTLD_LAZY);
            if (!h) continue;
            void *par = dlsym(h, "GOMP_parallel"), *num = dlsym(h, "omp_get_thread_num"),
                 *team = dlsym(h, "omp_get_num_threads");
            if (par && num && team) {
                omp_thread_num = (int (*)(void))num;
                omp_team_size = (int (*)(void))team;
                gomp_parallel = (void (*)(void (*)(void *), void *, unsigned, unsigned))par;
            }
        }
    }
    n_threads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
    return PyBool_FromLong(gomp_parallel != NULL);
}

/* p_keep_memory(): glibc's malloc gives each large block (above a threshold that it raises
   only after a free) fresh pages from the system and returns freed memory at the heap's top;
   portable mode's float64 temporaries, several megabytes each on every call, then spend more
   time in page faults than in arithmetic. This keeps blocks up to 32 MiB on the heap and freed
   memory there for reuse, as a caching allocator does. Returns whether it applied (glibc only). */
static PyObject *p_keep_memory(PyObject *module, PyObject *args) {
#ifdef __GLIBC__
    int ok =
        mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) && mallopt(M_TRIM_THRESHOLD, 512 * 1024 * 1024);
    return PyBool_FromLong(ok);
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"p_threads", KEYWORDS(p_threads),
     "Portable mode: the threads (torch's OpenMP workers) the kernels may use."},
    {"p_keep_memory", p_keep_memory, METH_NOARGS,
     "Portable mode: glibc malloc keeps freed memory for reuse."},
    {NULL, NULL, 0, NULL},
};

int bind_portable_threads(PyObject *module) { return PyModule_AddFunctions(module, methods); }
