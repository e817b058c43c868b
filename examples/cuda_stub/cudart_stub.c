/* A stand-in for the CUDA runtime (libcudart.so.12), for machines without a GPU.
 *
 * It lets examples/train_ddp.py --sim-cuda show, on a CPU, what a rank of a
 * real NCCL job looks like when a collective never completes: the Python
 * thread does not block inside the collective (NCCL only enqueues a kernel on
 * a CUDA stream) but runs on to the next synchronisation point (loss.item(),
 * torch.cuda.synchronize(), an event wait) and waits there, inside libcudart.
 * py-spy --native then shows, as on a GPU node,
 *
 *     cudaStreamSynchronize (.../libcudart.so.12)
 *     ffi_call (...libffi...)
 *     ...
 *     train (.../train_ddp.py:NNN)
 *
 * The "device" is one worker pthread per stream that runs the stream's work in
 * stream order: host functions enqueued with cudaLaunchHostFunc (the only
 * kind of work there is; the stand-in's own "kernels" below are host
 * functions that keep the device busy).  Entry points, names, C signatures,
 * flag values and error codes are those of the CUDA runtime API
 * (https://docs.nvidia.com/cuda/cuda-runtime-api/):
 *
 *   device:  cudaGetDeviceCount, cudaSetDevice, cudaGetDevice,
 *            cudaSetDeviceFlags, cudaGetDeviceFlags, cudaDeviceSynchronize
 *   streams: cudaStreamCreate, cudaStreamDestroy, cudaLaunchHostFunc,
 *            cudaStreamSynchronize, cudaStreamQuery
 *   events:  cudaEventCreate, cudaEventCreateWithFlags, cudaEventRecord,
 *            cudaEventQuery, cudaEventSynchronize, cudaEventDestroy
 *   memory:  cudaMemcpy, cudaHostRegister, cudaHostUnregister
 *   errors:  cudaGetErrorString
 *
 * Semantics kept from the API documentation:
 *   - work on a stream runs in the order it was enqueued;
 *   - cudaStreamSynchronize waits for all work enqueued on the stream before
 *     the call; cudaDeviceSynchronize for all work on all streams of the
 *     current device; an event captures the work enqueued on its stream before
 *     cudaEventRecord, and cudaEventSynchronize/Query on a never-recorded event
 *     succeed at once;
 *   - cudaStreamQuery/cudaEventQuery return cudaSuccess when that work is
 *     done, cudaErrorNotReady (600) when not;
 *   - how a host thread waits for the device (cudaSetDeviceFlags, for the
 *     current device; streams belong to the device current when they were
 *     created):
 *       cudaDeviceScheduleSpin: "actively spin when waiting for results from
 *         the device": a loop of atomic loads, no sleep, no yield, so a
 *         waiting thread is "active" and burns a core;
 *       cudaDeviceScheduleYield: "yield its thread when waiting": the same
 *         loop with sched_yield();
 *       cudaDeviceScheduleBlockingSync: "block the CPU thread on a
 *         synchronization primitive when waiting for the device to finish
 *         work": the thread sleeps on a pthread condition variable that the
 *         stream's worker signals when work completes (py-spy: idle, inside
 *         pthread_cond_wait);
 *       cudaDeviceScheduleAuto (the default): "if C > P [active contexts,
 *         logical processors] yield, otherwise spin": one context here, so
 *         spin;
 *     and an event created with cudaEventBlockingSync (cudaEventCreateWithFlags;
 *     torch.cuda.Event(blocking=True)) makes cudaEventSynchronize on it block
 *     ("will block until the event actually completes"), whatever the
 *     device's flags;
 *   - cudaMemcpy is synchronous with the legacy default stream, so it first
 *     waits for all work on all streams, then copies (all memory is host
 *     memory here, whatever the cudaMemcpyKind);
 *   - cudaStreamDestroy returns at once; work still pending runs to the end.
 *
 * The driver's lock.  The CUDA driver serialises changes to its state with a
 * lock of its own, and runs host functions on its own thread: a host function
 * "must not make any CUDA API calls", and a Python host function (numba's
 * Stream.add_callback, CuPy's launch_host_func) runs "while holding the CUDA
 * driver lock in a CUDA driver managed thread" and then needs the GIL (NVIDIA,
 * numba-cuda#317).  A thread that holds the GIL and calls into the driver
 * without releasing it then deadlocks against it; in the field it shows
 * innermost as pthread_rwlock_wrlock inside cuEventDestroy_v2, inside
 * cudaEventDestroy (torch.cuda.Event's destructor kept the GIL until
 * pytorch#119393; cudaHostUnregister, pytorch#132520).  Here the lock is one
 * pthread rwlock, driver_lock:
 *   - the stream workers hold it shared while they run a host function (host
 *     functions of different streams still run side by side);
 *   - the calls that change the driver's state take it exclusively:
 *     cudaSetDevice, cudaSetDeviceFlags, cudaEventDestroy, cudaHostRegister,
 *     cudaHostUnregister.  They block (pthread_rwlock_wrlock, py-spy: idle)
 *     while a host function runs.
 *   The waits and the other calls do not take it.  (Simplified: the real
 *   driver takes its lock in more calls than these.)
 *
 * Simplified otherwise: the NULL stream (0, the legacy default stream) is one
 * more stream, created on first use on the device current then; it does not
 * order itself against the others.  As in CUDA, a host function must not call
 * CUDA API functions (a synchronisation on its own stream from it would never
 * return; cudaEventDestroy from it would wait for its own lock).
 *
 * Every wait loop and every take of the driver's lock is written out in the
 * exported function itself (the WAIT_DONE macro; no helper that the compiler
 * may or may not inline), so the library's frame of a waiting thread is the
 * CUDA entry point's own name: the innermost frame when it spins, the caller
 * of libc's pthread_cond_wait / sched_yield / pthread_rwlock_wrlock otherwise.
 *
 * Build: cc -O1 -shared -fPIC -pthread -fvisibility=hidden -o libcudart.so.12 cudart_stub.c
 */

#define _GNU_SOURCE /* SCHED_IDLE */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
};
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                      cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
typedef void (*cudaHostFn_t)(void *userData);

/* cudaSetDeviceFlags (driver_types.h) */
#define cudaDeviceScheduleAuto 0x00
#define cudaDeviceScheduleSpin 0x01
#define cudaDeviceScheduleYield 0x02
#define cudaDeviceScheduleBlockingSync 0x04
#define cudaDeviceScheduleMask 0x07
#define cudaDeviceMapHost 0x08
#define cudaDeviceMask 0xff
/* cudaEventCreateWithFlags */
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaEventInterprocess 0x04
/* cudaHostRegister: Default 0, Portable 1, Mapped 2, IoMemory 4, ReadOnly 8 */
#define cudaHostRegisterAll 0x0f

#define DEVICES 8 /* what cudaGetDeviceCount says: an 8-GPU node */

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
    pthread_cond_t work_cv; /* the worker sleeps here while the queue is empty */
    pthread_cond_t done_cv; /* blocking-sync waiters sleep here; broadcast when work completes */
    struct task *head, *tail;
    uint64_t enqueued, done; /* changed under mu; read with atomic loads by the spinning waiters */
    int destroyed;
    int device; /* the device current when it was created */
    struct CUstream_st *next_stream;
} *cudaStream_t;

typedef struct CUevent_st {
    cudaStream_t stream; /* NULL: never recorded */
    uint64_t ticket;     /* the stream's work count when it was recorded */
    unsigned flags;      /* cudaEventCreateWithFlags */
} *cudaEvent_t;

static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static cudaStream_t streams; /* every stream ever created, newest first */
static cudaStream_t legacy_default;

/* The driver's lock (see the top of this file). */
static pthread_rwlock_t driver_lock = PTHREAD_RWLOCK_INITIALIZER;

/* Per-device scheduling flags (cudaSetDeviceFlags) and each host thread's current
 * device (cudaSetDevice: "Sets device as the current device for the calling host
 * thread"; 0 until set). */
static unsigned device_flags[DEVICES];
static __thread int current_device;

/* Host memory registered with cudaHostRegister (changed with driver_lock held exclusively). */
struct registration {
    char *ptr;
    size_t size;
    struct registration *next;
};
static struct registration *registered;

/* How a host thread waits for work on a stream of `device`, for an event created with
 * `event_flags` (0 for the other waits). */
enum wait_how { SPIN, YIELD, BLOCK };

static enum wait_how how_to_wait(int device, unsigned event_flags)
{
    if (event_flags & cudaEventBlockingSync)
        return BLOCK;
    switch (LOAD(&device_flags[device]) & cudaDeviceScheduleMask) {
    case cudaDeviceScheduleBlockingSync:
        return BLOCK;
    case cudaDeviceScheduleYield:
        return YIELD;
    default: /* cudaDeviceScheduleSpin, and cudaDeviceScheduleAuto with one context */
        return SPIN;
    }
}

/* Wait until stream `s` has completed work number `target`, as `how` says.  A macro,
 * so that the loop is in the exported function that uses it (see the top). */
#define WAIT_DONE(s, target, how)                                                  \
    do {                                                                           \
        enum wait_how how_ = (how);                                                \
        if (how_ == BLOCK) { /* sleep until the worker says work completed */      \
            pthread_mutex_lock(&(s)->mu);                                          \
            while ((s)->done < (target))                                           \
                pthread_cond_wait(&(s)->done_cv, &(s)->mu);                        \
            pthread_mutex_unlock(&(s)->mu);                                        \
        } else if (how_ == YIELD) {                                                \
            while (LOAD(&(s)->done) < (target))                                    \
                sched_yield();                                                     \
        } else {                                                                   \
            while (LOAD(&(s)->done) < (target))                                    \
                ; /* spin */                                                       \
        }                                                                          \
    } while (0)

static void *worker(void *arg)
{
    cudaStream_t s = arg;
#ifdef SCHED_IDLE
    /* A GPU's kernels take no host CPU: the device thread runs only on a core no host thread
     * wants (SCHED_IDLE), and stays runnable, as busy as its kernels keep it, while it waits for
     * one (sched_yield alone still took a core from other processes' work).  Lowering a thread's
     * own policy needs no privilege; where it is refused the device runs as before. */
    struct sched_param idle = {0};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
#endif
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->destroyed)
            pthread_cond_wait(&s->work_cv, &s->mu);
        struct task *t = s->head;
        if (!t)
            break; /* destroyed and drained */
        pthread_mutex_unlock(&s->mu);
        /* the driver runs a host function with its lock held (shared) */
        pthread_rwlock_rdlock(&driver_lock);
        t->fn(t->arg);
        pthread_rwlock_unlock(&driver_lock);
        pthread_mutex_lock(&s->mu);
        s->head = t->next;
        if (!s->head)
            s->tail = NULL;
        free(t);
        STORE(&s->done, s->done + 1);
        pthread_cond_broadcast(&s->done_cv);
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
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    s->device = current_device;
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

/* ---------------------------------------------------------------- device management */

EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return cudaErrorInvalidValue;
    *count = DEVICES;
    return cudaSuccess;
}

/* "Sets device as the current device for the calling host thread. Valid device id's
 * are 0 to (cudaGetDeviceCount() - 1). [...] This function will also immediately
 * initialize the runtime state on the primary context": driver state, under its lock. */
EXPORT cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= DEVICES)
        return cudaErrorInvalidDevice;
    pthread_rwlock_wrlock(&driver_lock);
    current_device = device;
    pthread_rwlock_unlock(&driver_lock);
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return cudaErrorInvalidValue;
    *device = current_device;
    return cudaSuccess;
}

/* "Records flags as the flags for the current device. If the current device has been
 * set and that device has already been initialized, the previous flags are
 * overwritten."  One of the cudaDeviceSchedule* values, ORed with cudaDeviceMapHost,
 * cudaDeviceLmemResizeToMax (0x10), cudaDeviceSyncMemops (0x80) (kept, no effect here). */
EXPORT cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
    unsigned sched = flags & cudaDeviceScheduleMask;
    if ((flags & ~(unsigned)cudaDeviceMask) ||
        (sched != cudaDeviceScheduleAuto && sched != cudaDeviceScheduleSpin &&
         sched != cudaDeviceScheduleYield && sched != cudaDeviceScheduleBlockingSync))
        return cudaErrorInvalidValue;
    pthread_rwlock_wrlock(&driver_lock);
    STORE(&device_flags[current_device], flags);
    pthread_rwlock_unlock(&driver_lock);
    return cudaSuccess;
}

/* "Returns in flags the flags for the current device. [...] Flags returned by this
 * function may specifically include cudaDeviceMapHost even though it is not accepted
 * by cudaSetDeviceFlags because it is implicit in runtime API flags." */
EXPORT cudaError_t cudaGetDeviceFlags(unsigned int *flags)
{
    if (!flags)
        return cudaErrorInvalidValue;
    *flags = LOAD(&device_flags[current_device]) | cudaDeviceMapHost;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    /* each stream's work count now; streams created later are not waited for */
    int device = current_device;
    enum wait_how how = how_to_wait(device, 0);
    pthread_mutex_lock(&streams_mu);
    cudaStream_t first = streams;
    pthread_mutex_unlock(&streams_mu);
    for (cudaStream_t s = first; s; s = s->next_stream) {
        if (s->device != device)
            continue;
        uint64_t target = LOAD(&s->enqueued);
        WAIT_DONE(s, target, how);
    }
    return cudaSuccess;
}

/* ---------------------------------------------------------------- streams */

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
    pthread_cond_signal(&stream->work_cv);
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
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    cudaStream_t s = resolve(stream);
    if (!s)
        return cudaErrorMemoryAllocation;
    uint64_t target = LOAD(&s->enqueued);
    WAIT_DONE(s, target, how_to_wait(s->device, 0));
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    cudaStream_t s = resolve(stream);
    if (!s)
        return cudaErrorMemoryAllocation;
    return LOAD(&s->done) >= LOAD(&s->enqueued) ? cudaSuccess : cudaErrorNotReady;
}

/* ---------------------------------------------------------------- events */

/* cudaEventDefault (0), cudaEventBlockingSync, cudaEventDisableTiming, cudaEventInterprocess:
 * "cudaEventInterprocess must be specified along with cudaEventDisableTiming". */
EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (!event || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess)) ||
        ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)))
        return cudaErrorInvalidValue;
    *event = calloc(1, sizeof **event);
    if (!*event)
        return cudaErrorMemoryAllocation;
    (*event)->flags = flags;
    return cudaSuccess;
}

EXPORT cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, 0);
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

/* "Waiting for an event that was created with the cudaEventBlockingSync flag will cause
 * the calling CPU thread to block until the event has been completed by the device. If
 * the cudaEventBlockingSync flag has not been set, then the CPU thread will busy-wait"
 * (here: as the device's cudaDeviceSchedule* flag says, spinning by default). */
EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    if (!event)
        return cudaErrorInvalidResourceHandle;
    cudaStream_t s = LOAD(&event->stream);
    if (!s)
        return cudaSuccess; /* never recorded */
    uint64_t target = event->ticket;
    WAIT_DONE(s, target, how_to_wait(s->device, event->flags));
    return cudaSuccess;
}

/* Frees the event's driver resources: under the driver's lock (see the top). */
EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    if (!event)
        return cudaErrorInvalidResourceHandle;
    pthread_rwlock_wrlock(&driver_lock);
    free(event); /* (CUDA lets pending work complete first; nothing here refers to it) */
    pthread_rwlock_unlock(&driver_lock);
    return cudaSuccess;
}

/* ---------------------------------------------------------------- memory */

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
        WAIT_DONE(s, target, how_to_wait(s->device, 0));
    }
    memmove(dst, src, count);
    return cudaSuccess;
}

/* "Page-locks the memory range specified by ptr and size and maps it for the
 * device(s)": nothing to lock here; the range is remembered, under the driver's lock.
 * cudaErrorHostMemoryAlreadyRegistered when it overlaps a registered range. */
EXPORT cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    if (!ptr || !size || (flags & ~(unsigned)cudaHostRegisterAll))
        return cudaErrorInvalidValue;
    struct registration *r = malloc(sizeof *r);
    if (!r)
        return cudaErrorMemoryAllocation;
    r->ptr = ptr;
    r->size = size;
    cudaError_t err = cudaSuccess;
    pthread_rwlock_wrlock(&driver_lock);
    for (struct registration *o = registered; o; o = o->next)
        if (r->ptr < o->ptr + o->size && o->ptr < r->ptr + r->size)
            err = cudaErrorHostMemoryAlreadyRegistered;
    if (err == cudaSuccess) {
        r->next = registered;
        registered = r;
    }
    pthread_rwlock_unlock(&driver_lock);
    if (err != cudaSuccess)
        free(r);
    return err;
}

/* "Unmaps the memory range whose base address is specified by ptr, and makes it
 * pageable again. The base address must be the same one specified to
 * cudaHostRegister()": cudaErrorHostMemoryNotRegistered otherwise. */
EXPORT cudaError_t cudaHostUnregister(void *ptr)
{
    if (!ptr)
        return cudaErrorInvalidValue;
    struct registration *gone = NULL;
    pthread_rwlock_wrlock(&driver_lock);
    for (struct registration **p = &registered; *p; p = &(*p)->next)
        if ((*p)->ptr == ptr) {
            gone = *p;
            *p = gone->next;
            break;
        }
    pthread_rwlock_unlock(&driver_lock);
    free(gone);
    return gone ? cudaSuccess : cudaErrorHostMemoryNotRegistered;
}

/* ---------------------------------------------------------------- errors */

EXPORT const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    default: return "unrecognized error code";
    }
}

/* ---------------------------------------------------------------- the stand-in's "kernels"
 *
 * Not CUDA API: the device code of the stand-in, host functions (cudaHostFn_t) for
 * cudaLaunchHostFunc that keep the device busy, as a kernel keeps a GPU busy.  The
 * device is the stream's worker thread, and busy means runnable: it loops on
 * sched_yield(), so it wants a core (ddptop --gpu sim reads a rank's runnable time as
 * its GPU's utilisation) but, an idle-class thread (see worker), gets one only where no
 * other thread wants it.  They run in C, without the GIL.
 */

/* A kernel that runs for (uintptr_t)userData nanoseconds (passed by value). */
EXPORT void simKernelRun(void *userData)
{
    uint64_t ns = (uintptr_t)userData;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    uint64_t end = (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec + ns;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec >= end)
            break;
        sched_yield();
    }
}

/* A kernel that runs until the int at userData is non-zero, as an NCCL kernel spins
 * until its peers' data has come (never, when a peer never comes). */
EXPORT void simKernelWaitFlag(void *userData)
{
    const int *flag = userData;
    while (!LOAD(flag))
        sched_yield();
}
