/* A stand-in for the CUDA runtime (libcudart.so.12), for machines without a GPU.
 *
 * It lets examples/train_ddp.py --sim-cuda show, on a CPU, what a rank of a
 * real NCCL job looks like when a collective never completes: the Python
 * thread does not block inside the collective (NCCL only enqueues a kernel on
 * a CUDA stream) but runs on to the next synchronisation point (loss.item(),
 * torch.cuda.synchronize(), an event wait) and busy-waits there, inside
 * libcudart, at ~100% of a core.  py-spy --native then shows, as on a GPU node,
 *
 *     cudaStreamSynchronize (.../libcudart.so.12)
 *     ffi_call (...libffi...)
 *     ...
 *     train (.../train_ddp.py:NNN)
 *
 * The "device" is one worker pthread per stream that runs the stream's work in
 * stream order: host functions enqueued with cudaLaunchHostFunc (the only
 * kind of work there is).  Entry points, names and C signatures are those of
 * the CUDA runtime API (https://docs.nvidia.com/cuda/cuda-runtime-api/):
 *
 *   cudaStreamCreate, cudaStreamDestroy, cudaLaunchHostFunc,
 *   cudaStreamSynchronize, cudaStreamQuery, cudaDeviceSynchronize,
 *   cudaEventCreate, cudaEventRecord, cudaEventQuery, cudaEventSynchronize,
 *   cudaEventDestroy, cudaMemcpy, cudaGetErrorString
 *
 * Semantics kept from the API documentation:
 *   - work on a stream runs in the order it was enqueued;
 *   - cudaStreamSynchronize waits for all work enqueued on the stream before
 *     the call; cudaDeviceSynchronize for all work on all streams; an event
 *     captures the work enqueued on its stream before cudaEventRecord, and
 *     cudaEventSynchronize/Query on a never-recorded event succeed at once;
 *   - cudaStreamQuery/cudaEventQuery return cudaSuccess when that work is
 *     done, cudaErrorNotReady (600) when not;
 *   - the waits spin (cudaDeviceScheduleSpin, the default when there are no
 *     more active CUDA contexts than cores): a loop of atomic loads, no sleep,
 *     no yield, so a waiting thread is "active" and burns a core;
 *   - cudaMemcpy is synchronous with the legacy default stream, so it first
 *     waits for all work on all streams, then copies (all memory is host
 *     memory here, whatever the cudaMemcpyKind);
 *   - cudaStreamDestroy returns at once; work still pending runs to the end.
 * Simplified: the NULL stream (0, the legacy default stream) is one more
 * stream, created on first use; it does not order itself against the others.
 * As in CUDA, a host function must not call CUDA API functions (a
 * synchronisation on its own stream from it would never return).
 *
 * Every spin loop is written out in the exported function itself (no helper
 * that the compiler may or may not inline), so the innermost native frame of
 * a waiting thread is the CUDA entry point's own name.
 *
 * Build: cc -O1 -shared -fPIC -pthread -o libcudart.so.12 cudart_stub.c
 */

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
};
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                      cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
typedef void (*cudaHostFn_t)(void *userData);

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

struct task {
    cudaHostFn_t fn;
    void *arg;
    struct task *next;
};

/* A stream: a FIFO of host functions and the worker thread that runs them.
 * `enqueued` counts the work ever enqueued, `done` the work completed; work
 * number n is complete when done >= n.  Streams are never freed (a destroyed
 * one's worker exits once its queue is empty), so an event recorded on a
 * stream stays valid after cudaStreamDestroy, as in CUDA. */
typedef struct CUstream_st {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct task *head, *tail;
    uint64_t enqueued, done; /* read with atomic loads by the waiters */
    int destroyed;
    struct CUstream_st *next_stream;
} *cudaStream_t;

typedef struct CUevent_st {
    cudaStream_t stream; /* NULL: never recorded */
    uint64_t ticket;     /* the stream's work count when it was recorded */
} *cudaEvent_t;

static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static cudaStream_t streams; /* every stream ever created, newest first */
static cudaStream_t legacy_default;

static void *worker(void *arg)
{
    cudaStream_t s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->destroyed)
            pthread_cond_wait(&s->cv, &s->mu);
        struct task *t = s->head;
        if (!t)
            break; /* destroyed and drained */
        pthread_mutex_unlock(&s->mu);
        t->fn(t->arg);
        pthread_mutex_lock(&s->mu);
        s->head = t->next;
        if (!s->head)
            s->tail = NULL;
        free(t);
        STORE(&s->done, LOAD(&s->done) + 1);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static cudaError_t new_stream(cudaStream_t *out)
{
    cudaStream_t s = calloc(1, sizeof *s);
    if (!s)
        return cudaErrorMemoryAllocation;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&th, &attr, worker, s);
    pthread_attr_destroy(&attr);
    if (err) {
        free(s);
        return cudaErrorMemoryAllocation;
    }
    pthread_mutex_lock(&streams_mu);
    s->next_stream = streams;
    streams = s;
    pthread_mutex_unlock(&streams_mu);
    *out = s;
    return cudaSuccess;
}

static pthread_once_t legacy_once = PTHREAD_ONCE_INIT;

static void create_legacy_default(void)
{
    if (new_stream(&legacy_default) != cudaSuccess)
        legacy_default = NULL;
}

/* The stream a handle names: 0 is the legacy default stream. */
static cudaStream_t resolve(cudaStream_t s)
{
    if (s)
        return s;
    pthread_once(&legacy_once, create_legacy_default);
    return legacy_default;
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    if (!pStream)
        return cudaErrorInvalidValue;
    return new_stream(pStream);
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (!stream)
        return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&stream->mu);
    stream->destroyed = 1;
    pthread_cond_signal(&stream->cv);
    pthread_mutex_unlock(&stream->mu);
    return cudaSuccess;
}

EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    if (!fn)
        return cudaErrorInvalidValue;
    cudaStream_t s = resolve(stream);
    if (!s)
        return cudaErrorMemoryAllocation;
    struct task *t = malloc(sizeof *t);
    if (!t)
        return cudaErrorMemoryAllocation;
    t->fn = fn;
    t->arg = userData;
    t->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->destroyed) {
        pthread_mutex_unlock(&s->mu);
        free(t);
        return cudaErrorInvalidResourceHandle;
    }
    if (s->tail)
        s->tail->next = t;
    else
        s->head = t;
    s->tail = t;
    STORE(&s->enqueued, s->enqueued + 1);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    cudaStream_t s = resolve(stream);
    if (!s)
        return cudaErrorMemoryAllocation;
    uint64_t target = LOAD(&s->enqueued);
    while (LOAD(&s->done) < target)
        ; /* spin, as CUDA's default wait does */
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    cudaStream_t s = resolve(stream);
    if (!s)
        return cudaErrorMemoryAllocation;
    return LOAD(&s->done) >= LOAD(&s->enqueued) ? cudaSuccess : cudaErrorNotReady;
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    /* each stream's work count now; streams created later are not waited for */
    pthread_mutex_lock(&streams_mu);
    cudaStream_t first = streams;
    pthread_mutex_unlock(&streams_mu);
    for (cudaStream_t s = first; s; s = s->next_stream) {
        uint64_t target = LOAD(&s->enqueued);
        while (LOAD(&s->done) < target)
            ; /* spin */
    }
    return cudaSuccess;
}

EXPORT cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    if (!event)
        return cudaErrorInvalidValue;
    *event = calloc(1, sizeof **event);
    return *event ? cudaSuccess : cudaErrorMemoryAllocation;
}

EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    if (!event)
        return cudaErrorInvalidResourceHandle;
    cudaStream_t s = resolve(stream);
    if (!s)
        return cudaErrorMemoryAllocation;
    event->ticket = LOAD(&s->enqueued);
    STORE(&event->stream, s);
    return cudaSuccess;
}

EXPORT cudaError_t cudaEventQuery(cudaEvent_t event)
{
    if (!event)
        return cudaErrorInvalidResourceHandle;
    cudaStream_t s = LOAD(&event->stream);
    return !s || LOAD(&s->done) >= event->ticket ? cudaSuccess : cudaErrorNotReady;
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    if (!event)
        return cudaErrorInvalidResourceHandle;
    cudaStream_t s = LOAD(&event->stream);
    if (!s)
        return cudaSuccess; /* never recorded */
    uint64_t target = event->ticket;
    while (LOAD(&s->done) < target)
        ; /* spin */
    return cudaSuccess;
}

EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    if (!event)
        return cudaErrorInvalidResourceHandle;
    free(event); /* (CUDA lets pending work complete first; nothing here refers to it) */
    return cudaSuccess;
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    if ((unsigned)kind > cudaMemcpyDefault || (count && (!dst || !src)))
        return cudaErrorInvalidValue;
    /* the legacy default stream: after all work enqueued on any stream */
    pthread_mutex_lock(&streams_mu);
    cudaStream_t first = streams;
    pthread_mutex_unlock(&streams_mu);
    for (cudaStream_t s = first; s; s = s->next_stream) {
        uint64_t target = LOAD(&s->enqueued);
        while (LOAD(&s->done) < target)
            ; /* spin */
    }
    memmove(dst, src, count);
    return cudaSuccess;
}

EXPORT const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    default: return "unrecognized error code";
    }
}
