/* fake_hip: see fake_hip.h for what it models and where each rule comes
 * from. No allocation (the shim under test interposes the allocator):
 * per-thread state is initial-exec TLS, tables live in fake_pins. */
#define __HIP_PLATFORM_AMD__
#include <hip/hip_runtime_api.h>
#include <hsa/hsa.h>

#include "fake_hip.h"
#include "fake_pins.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_STREAMS = 64, MEMCPY_DEVICE_TO_DEVICE_NO_CU = 1024 };

static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static int version_major = 6, version_minor = 2;
static int device_count = 1;

static pthread_once_t start_once = PTHREAD_ONCE_INIT;
static bool started;

static _Thread_local hipError_t last_error __attribute__((tls_model("initial-exec")));
static _Thread_local int current_device __attribute__((tls_model("initial-exec")));

/* Streams from hipStreamCreate: the handle is the address of a slot. */
static pthread_mutex_t stream_lock = PTHREAD_MUTEX_INITIALIZER;
static bool stream_used[MAX_STREAMS];
static char stream_objects[MAX_STREAMS];

static void load_config(void)
{
    const char *version = getenv("FAKE_HIP_VERSION");
    if (version != NULL && *version) {
        char *end;
        version_major = (int)strtol(version, &end, 10);
        version_minor = *end == '.' ? (int)strtol(end + 1, NULL, 10) : 0;
    }
    const char *devices = getenv("FAKE_HIP_DEVICES");
    if (devices != NULL && *devices)
        device_count = atoi(devices);
    fake_pins_configure(hipErrorOutOfMemory);
}

static bool version_at_least(int major, int minor)
{
    return version_major > major || (version_major == major && version_minor >= minor);
}

/* hip::init, at the first call: starts the HSA runtime below (which, with
 * no device, fails and stays closed: fake_hsa.c). */
static void start(void)
{
    hsa_init();
    started = true;
}

/* HIP_INIT_API: starts the runtime; with no device every call answers the
 * failed start: hipErrorNoDevice from ROCm 6, hipErrorInvalidDevice (101)
 * before (ROCm 5.2.3 with no AMD GPU, run here: hipInit 101,
 * hipHostRegister 101; hipGetDeviceCount 100, below). */
static hipError_t enter(enum fake_hip_call kind, const void *caller)
{
    pthread_once(&config_once, load_config);
    pthread_once(&start_once, start);
    fake_pins_count_call(kind, caller);
    if (device_count <= 0)
        return version_at_least(6, 0) ? hipErrorNoDevice : hipErrorInvalidDevice;
    return hipSuccess;
}

/* ---- stream capture (hip_graph.cpp, hip_internal.hpp) ---- */

static hipError_t finish(hipError_t result);

/* Captures in progress: stream, the mode it began in, the thread that
 * began it, whether a refused call invalidated it. */
enum { MAX_CAPTURES = 16 };
static struct capture {
    bool used, invalidated;
    hipStream_t stream;
    int mode;
    const void *thread;
} captures[MAX_CAPTURES];
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t capture_refusals;
static _Thread_local int thread_capture_mode __attribute__((tls_model("initial-exec")));
static _Thread_local char thread_marker __attribute__((tls_model("initial-exec")));

/* CHECK_STREAM_CAPTURE_SUPPORTED, by version. Up to 5.1 the capture list
 * is the thread's own (thread_local g_captureStreams) and only a capture
 * not in the relaxed mode counts. 5.2 to 6.1: a thread in the global or
 * thread-local mode is refused while it captures itself (not relaxed), one
 * in the global mode also while any thread captures in the global mode
 * (g_captureStreams). From 6.2 the same, and the refused call marks those
 * captures invalidated (SetCaptureStatus). hipErrorStreamCaptureUnsupported. */
static hipError_t capture_check(void)
{
    hipError_t error = hipSuccess;
    pthread_mutex_lock(&capture_lock);
    bool since_5_2 = version_at_least(5, 2);
    for (int i = 0; i < MAX_CAPTURES; i++) {
        struct capture *c = &captures[i];
        if (!c->used || c->mode == hipStreamCaptureModeRelaxed)
            continue;
        bool own = c->thread == &thread_marker;
        bool blocks;
        if (!since_5_2)
            blocks = own;
        else if (thread_capture_mode == hipStreamCaptureModeRelaxed)
            blocks = false;
        else
            blocks = own || (thread_capture_mode == hipStreamCaptureModeGlobal &&
                             c->mode == hipStreamCaptureModeGlobal);
        if (blocks) {
            error = hipErrorStreamCaptureUnsupported;
            if (version_at_least(6, 2))
                c->invalidated = true;
        }
    }
    if (error != hipSuccess)
        capture_refusals++;
    pthread_mutex_unlock(&capture_lock);
    return error;
}

FAKE_EXPORT hipError_t hipThreadExchangeStreamCaptureMode(hipStreamCaptureMode *mode)
{
    hipError_t error = enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    if (error == hipSuccess &&
        (mode == NULL || *mode < hipStreamCaptureModeGlobal || *mode > hipStreamCaptureModeRelaxed))
        error = hipErrorInvalidValue;
    if (error == hipSuccess) {
        int previous = thread_capture_mode;
        thread_capture_mode = *mode;
        *mode = (hipStreamCaptureMode)previous;
    }
    return finish(error);
}

static bool stream_valid(hipStream_t stream);

FAKE_EXPORT hipError_t hipStreamBeginCapture(hipStream_t stream, hipStreamCaptureMode mode)
{
    hipError_t error = enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    if (error == hipSuccess && (stream == NULL || !stream_valid(stream)))
        error = stream == NULL ? hipErrorStreamCaptureUnsupported : hipErrorContextIsDestroyed;
    if (error == hipSuccess &&
        (mode < hipStreamCaptureModeGlobal || mode > hipStreamCaptureModeRelaxed))
        error = hipErrorInvalidValue;
    pthread_mutex_lock(&capture_lock);
    struct capture *slot = NULL;
    for (int i = 0; error == hipSuccess && i < MAX_CAPTURES; i++) {
        if (captures[i].used && captures[i].stream == stream)
            error = hipErrorIllegalState;
        else if (!captures[i].used && slot == NULL)
            slot = &captures[i];
    }
    if (error == hipSuccess && slot == NULL)
        error = hipErrorOutOfMemory;
    if (error == hipSuccess)
        *slot = (struct capture){
            .used = true, .stream = stream, .mode = mode, .thread = &thread_marker};
    pthread_mutex_unlock(&capture_lock);
    return finish(error);
}

/* An invalidated capture ends with hipErrorStreamCaptureInvalidated and no
 * graph (hipStreamEndCapture_common); any other ends with a graph (here any
 * non-NULL handle). */
FAKE_EXPORT hipError_t hipStreamEndCapture(hipStream_t stream, hipGraph_t *graph)
{
    hipError_t error = enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    if (error == hipSuccess && graph == NULL)
        error = hipErrorInvalidValue;
    pthread_mutex_lock(&capture_lock);
    struct capture *capture = NULL;
    for (int i = 0; error == hipSuccess && i < MAX_CAPTURES; i++)
        if (captures[i].used && captures[i].stream == stream)
            capture = &captures[i];
    if (error == hipSuccess && capture == NULL)
        error = hipErrorIllegalState;
    if (error == hipSuccess && capture->mode != hipStreamCaptureModeRelaxed &&
        capture->thread != &thread_marker)
        error = hipErrorStreamCaptureWrongThread;
    if (error == hipSuccess) {
        error = capture->invalidated ? hipErrorStreamCaptureInvalidated : hipSuccess;
        *graph = error == hipSuccess ? (hipGraph_t)(void *)capture : NULL;
        capture->used = false;
    }
    pthread_mutex_unlock(&capture_lock);
    return finish(error);
}

FAKE_EXPORT uint64_t fake_hip_capture_refusals(void)
{
    pthread_mutex_lock(&capture_lock);
    uint64_t refusals = capture_refusals;
    pthread_mutex_unlock(&capture_lock);
    return refusals;
}

/* HIP_RETURN: the thread's last error (see fake_hip.h). */
static hipError_t finish(hipError_t result)
{
    if (!version_at_least(7, 0) || result != hipSuccess)
        last_error = result;
    return result;
}

static bool is_device_address(uintptr_t address)
{
    struct fake_device_block block;
    fake_pins_lock();
    bool found = fake_device_find(address, &block);
    fake_pins_unlock();
    return found;
}

FAKE_EXPORT hipError_t hipInit(unsigned int flags)
{
    hipError_t error = enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    if (error == hipSuccess && flags != 0)
        error = hipErrorInvalidValue;
    return finish(error);
}

FAKE_EXPORT hipError_t hipRuntimeGetVersion(int *version)
{
    enter(FAKE_HIP_CALL_RUNTIME_GET_VERSION, FAKE_CALLER()); /* never fails for that */
    if (version == NULL)
        return finish(hipErrorInvalidValue);
    *version = version_major * 10000000 + version_minor * 100000;
    return finish(hipSuccess);
}

FAKE_EXPORT hipError_t hipDriverGetVersion(int *version)
{
    enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    if (version == NULL)
        return finish(hipErrorInvalidValue);
    *version = version_major * 10000000 + version_minor * 100000;
    return finish(hipSuccess);
}

FAKE_EXPORT hipError_t hipGetDeviceCount(int *count)
{
    hipError_t error = enter(FAKE_HIP_CALL_GET_DEVICE_COUNT, FAKE_CALLER());
    if (error != hipSuccess && device_count <= 0 && count != NULL) {
        *count = 0; /* ROCm 5.2.3 with no GPU: hipErrorNoDevice and 0 */
        return finish(hipErrorNoDevice);
    }
    if (error != hipSuccess)
        return finish(error);
    if (count == NULL)
        return finish(hipErrorInvalidValue);
    *count = device_count;
    return finish(device_count > 0 ? hipSuccess : hipErrorNoDevice);
}

FAKE_EXPORT hipError_t hipSetDevice(int device)
{
    hipError_t error = enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    if (error == hipSuccess && (device < 0 || device >= device_count))
        error = hipErrorInvalidDevice;
    if (error == hipSuccess)
        current_device = device;
    return finish(error);
}

FAKE_EXPORT hipError_t hipGetDevice(int *device)
{
    hipError_t error = enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    if (error == hipSuccess && device == NULL)
        error = hipErrorInvalidValue;
    if (error == hipSuccess)
        *device = current_device;
    return finish(error);
}

FAKE_EXPORT hipError_t hipDeviceSynchronize(void)
{
    return finish(enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER()));
}

FAKE_EXPORT hipError_t hipMalloc(void **pointer, size_t size)
{
    hipError_t error = enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    if (error == hipSuccess)
        error = capture_check();
    if (error == hipSuccess && pointer == NULL)
        error = hipErrorInvalidValue;
    if (error != hipSuccess)
        return finish(error);
    if (size == 0) { /* ihipMalloc */
        *pointer = NULL;
        return finish(hipSuccess);
    }
    fake_pins_lock();
    uintptr_t base = fake_device_alloc(size);
    fake_pins_unlock();
    if (base == 0)
        return finish(hipErrorOutOfMemory);
    *pointer = (void *)base;
    return finish(hipSuccess);
}

FAKE_EXPORT hipError_t hipFree(void *pointer)
{
    hipError_t error = enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    if (error == hipSuccess)
        error = capture_check();
    if (error != hipSuccess || pointer == NULL)
        return finish(error);
    fake_pins_lock();
    error = fake_device_free((uintptr_t)pointer) ? hipSuccess : hipErrorInvalidValue;
    fake_pins_unlock();
    return finish(error);
}

/* ihipHostRegister's argument checks for the version modelled. */
static hipError_t check_register_arguments(const void *pointer, size_t size, unsigned flags)
{
    if (pointer == NULL)
        return hipErrorInvalidValue;
    if (version_at_least(5, 3) && size == 0)
        return hipErrorInvalidValue;
    if (version_at_least(7, 0))
        return flags & ~(0x1u | 0x2u | 0x4u | 0x8u | 0x80000000u) ? hipErrorInvalidValue
                                                                  : hipSuccess;
    if (version_at_least(5, 4) && flags > 15)
        return hipErrorInvalidValue;
    return hipSuccess;
}

FAKE_EXPORT hipError_t hipHostRegister(void *pointer, size_t size, unsigned int flags)
{
    hipError_t error = enter(FAKE_HIP_CALL_HOST_REGISTER, FAKE_CALLER());
    uintptr_t base = (uintptr_t)pointer;
    if (error == hipSuccess)
        error = capture_check();
    if (error == hipSuccess)
        error = check_register_arguments(pointer, size, flags);
    /* KFD pins a userptr for writing (amdgpu_amdkfd_gpuvm.c init_user_pages
     * sets no AMDGPU_GEM_USERPTR_READONLY), whatever the flags: HIP has no
     * read-only registration (0x8 is ignored, or coarse-grained). */
    bool pinnable = error == hipSuccess && size != 0 && fake_pins_pinnable(base, size, true);
    fake_pins_lock();
    if (error == hipSuccess && fake_pins_injected_failure(false, (int *)&error)) {
        /* injected: error holds FAKE_GPU_FAIL_ERROR */
    } else if (error == hipSuccess && version_at_least(7, 3) &&
               fake_pins_overlapping(base, size, &(size_t){0}) >= 0) {
        error = hipErrorHostMemoryAlreadyRegistered;
    } else if (error == hipSuccess && !pinnable) {
        error = version_at_least(5, 3) ? hipErrorInvalidValue : hipErrorOutOfMemory;
    }
    struct fake_pins_timed timed = {0, 0, 0};
    if (error == hipSuccess) {
        size_t overlapping = 0;
        long same = fake_pins_containing(base);
        fake_pins_overlapping(base, size, &overlapping);
        if (overlapping != 0)
            fake_pins_violation(FAKE_GPU_VIOLATION_REGISTER_OVERLAP, base, size);
        fake_pins_check_register(base, size);
        if (same >= 0 && fake_pins_at(same)->base == base && !version_at_least(5, 2)) {
            /* MemObjMap::AddMemObj up to 5.1: guarantee(false, ...) aborts. */
            fake_pins_unlock();
            static const char message[] = "fake_hip: Memobj map already has an entry for ptr "
                                          "(a second hipHostRegister at the same base)\n";
            ssize_t ignored = write(2, message, sizeof(message) - 1);
            (void)ignored;
            abort();
        }
        if (same < 0 || fake_pins_at(same)->base != base) {
            long at;
            timed = fake_pins_insert_timed(base, size, flags, 0, &at);
            if (at < 0)
                error = hipErrorOutOfMemory;
        } /* else: the same base again, the new object is lost (AddMemObj) */
    }
    fake_pins_unlock();
    fake_pins_finish_timed(timed, false);
    fake_pins_lock();
    fake_pins_log_register(base, size, flags, error);
    fake_pins_unlock();
    return finish(error);
}

FAKE_EXPORT hipError_t hipHostUnregister(void *pointer)
{
    hipError_t error = enter(FAKE_HIP_CALL_HOST_UNREGISTER, FAKE_CALLER());
    uintptr_t base = (uintptr_t)pointer;
    if (error == hipSuccess)
        error = capture_check();
    if (error == hipSuccess && pointer == NULL && version_at_least(5, 6))
        error = hipErrorInvalidValue;
    fake_pins_lock();
    long at = error == hipSuccess ? fake_pins_containing(base) : -1;
    if (error == hipSuccess && fake_pins_injected_failure(true, (int *)&error)) {
        /* injected */
    } else if (error == hipSuccess && at < 0) {
        error = hipErrorHostMemoryNotRegistered;
    } else if (error == hipSuccess && fake_pins_at(at)->base != base) {
        /* MemObjMap::RemoveMemObj erases by exact key: guarantee() aborts. */
        fake_pins_unlock();
        static const char message[] = "fake_hip: Memobj map does not have ptr (hipHostUnregister "
                                      "of an address inside a registration, not its base)\n";
        ssize_t ignored = write(2, message, sizeof(message) - 1);
        (void)ignored;
        abort();
    }
    struct fake_pins_timed timed = {0, 0, 0};
    if (error == hipSuccess)
        timed = fake_pins_remove_timed(at);
    fake_pins_unlock();
    fake_pins_finish_timed(timed, true); /* SyncAllStreams, and the unpin */
    fake_pins_lock();
    fake_pins_log_unregister(base, error);
    fake_pins_unlock();
    return finish(error);
}

FAKE_EXPORT hipError_t hipPointerGetAttributes(hipPointerAttribute_t *attributes, const void *ptr)
{
    hipError_t error = enter(FAKE_HIP_CALL_POINTER_GET_ATTRIBUTES, FAKE_CALLER());
    if (error == hipSuccess && attributes == NULL)
        error = hipErrorInvalidValue;
    if (error == hipSuccess && ptr == NULL && !version_at_least(7, 0))
        error = hipErrorInvalidValue;
    if (error != hipSuccess)
        return finish(error);
    memset(attributes, 0, sizeof(*attributes));
    bool modern = version_at_least(6, 0);
    uintptr_t address = (uintptr_t)ptr;
    fake_pins_lock();
    long at = ptr != NULL ? fake_pins_containing(address) : -1;
    bool registered = at >= 0 && fake_pins_at(at)->state != FAKE_PINS_REGISTERING;
    unsigned flags = registered ? fake_pins_at(at)->flags : 0;
    fake_pins_unlock();
    if (registered) {
        /* hipMemoryTypeHost: 0 in ROCm 5 (memoryType), 1 from 6 (type). */
        attributes->memoryType = (enum hipMemoryType)(modern ? 1 : 0);
        attributes->hostPointer = (void *)ptr;
        attributes->devicePointer = (void *)ptr;
        attributes->allocationFlags = flags;
        attributes->device = current_device;
    } else if (ptr != NULL && is_device_address(address)) {
        attributes->memoryType = (enum hipMemoryType)(modern ? 2 : 1);
        attributes->devicePointer = (void *)ptr;
        attributes->device = current_device;
    } else if (modern) {
        attributes->memoryType = (enum hipMemoryType)0; /* hipMemoryTypeUnregistered */
        attributes->device = -2;                        /* hipInvalidDeviceId */
    } else {
        error = hipErrorInvalidValue;
    }
    return finish(error);
}

/* ---- streams (hip_stream.cpp) ---- */

/* hip::isValid: NULL and hipStreamPerThread always, else a live stream. */
static bool stream_valid(hipStream_t stream)
{
    if (stream == NULL || stream == hipStreamPerThread)
        return true;
    bool valid = false;
    pthread_mutex_lock(&stream_lock);
    for (size_t i = 0; i < MAX_STREAMS && !valid; i++)
        valid = stream_used[i] && (void *)stream == (void *)&stream_objects[i];
    pthread_mutex_unlock(&stream_lock);
    return valid;
}

FAKE_EXPORT hipError_t hipStreamCreate(hipStream_t *stream)
{
    hipError_t error = enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    if (error == hipSuccess && stream == NULL)
        error = hipErrorInvalidValue;
    if (error != hipSuccess)
        return finish(error);
    error = hipErrorOutOfMemory; /* the double's limit: MAX_STREAMS live streams */
    pthread_mutex_lock(&stream_lock);
    for (size_t i = 0; i < MAX_STREAMS && error != hipSuccess; i++) {
        if (stream_used[i])
            continue;
        stream_used[i] = true;
        *stream = (hipStream_t)(void *)&stream_objects[i];
        error = hipSuccess;
    }
    pthread_mutex_unlock(&stream_lock);
    return finish(error);
}

FAKE_EXPORT hipError_t hipStreamDestroy(hipStream_t stream)
{
    hipError_t error = enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    if (error != hipSuccess)
        return finish(error);
    if (stream == NULL)
        return finish(hipErrorInvalidHandle);
    if (stream == hipStreamPerThread)
        return finish(hipErrorInvalidResourceHandle);
    if (!stream_valid(stream))
        return finish(hipErrorContextIsDestroyed);
    pthread_mutex_lock(&stream_lock);
    for (size_t i = 0; i < MAX_STREAMS; i++)
        if ((void *)stream == (void *)&stream_objects[i])
            stream_used[i] = false;
    pthread_mutex_unlock(&stream_lock);
    return finish(hipSuccess);
}

/* Every copy is done before its call returns: nothing to wait for. */
FAKE_EXPORT hipError_t hipStreamSynchronize(hipStream_t stream)
{
    hipError_t error = enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    if (error == hipSuccess && !stream_valid(stream))
        error = hipErrorContextIsDestroyed;
    return finish(error);
}

/* ---- copies (hip_memory.cpp: ihipMemcpy, ihipMemcpy_validate) ---- */

/* What getMemoryObject finds at an address: a registration or a hipMalloc
 * block holding it (the one with the greatest base at or below: FindMemObj),
 * or nothing (pageable host memory: no arena object without HMM). */
struct copy_end {
    enum { END_PAGEABLE, END_REGISTERED, END_DEVICE } kind;
    size_t remaining;     /* getSize() - offset */
    unsigned char *bytes; /* where the double reads or writes them */
};

static struct copy_end copy_end_at(const void *pointer)
{
    uintptr_t address = (uintptr_t)pointer;
    struct fake_device_block block;
    if (fake_device_find(address, &block))
        return (struct copy_end){END_DEVICE, block.size - (address - block.base),
                                 block.backing + (address - block.base)};
    long at = fake_pins_containing(address);
    if (at >= 0 && fake_pins_at(at)->state != FAKE_PINS_REGISTERING) {
        struct fake_pins_entry *entry = fake_pins_at(at);
        return (struct copy_end){END_REGISTERED, entry->size - (address - entry->base),
                                 (unsigned char *)pointer};
    }
    return (struct copy_end){END_PAGEABLE, 0, (unsigned char *)pointer};
}

/* ihipMemcpy from the validation on, for the version modelled (fake_hip.h);
 * counts the copy. */
static hipError_t copy(void *dst, const void *src, size_t size, hipMemcpyKind kind)
{
    if (size == 0)
        return hipSuccess; /* "Skip if nothing needs writing", before any check */
    hipError_t error = hipSuccess;
    unsigned kind_value = (unsigned)kind;
    if (dst == NULL || src == NULL)
        error = hipErrorInvalidValue;
    else if (version_at_least(6, 1) && kind_value > hipMemcpyDefault &&
             kind_value != MEMCPY_DEVICE_TO_DEVICE_NO_CU)
        error = hipErrorInvalidMemcpyDirection;
    fake_pins_lock();
    if (error != hipSuccess) {
        fake_pins_count_copy(FAKE_GPU_COPY_REFUSED, size);
        fake_pins_unlock();
        return error;
    }
    struct copy_end from = copy_end_at(src), to = copy_end_at(dst);
    bool host_only = from.kind == END_PAGEABLE && to.kind == END_PAGEABLE;
    if ((from.kind != END_PAGEABLE && size > from.remaining) ||
        (to.kind != END_PAGEABLE && size > to.remaining))
        error = hipErrorInvalidValue; /* the range leaves what its start is in */
    else if (host_only && kind_value != hipMemcpyHostToHost && kind_value != hipMemcpyDefault)
        error = hipErrorInvalidValue; /* IsHtoHMemcpyValid (XNACK off) */
    if (error != hipSuccess) {
        fake_pins_count_copy(FAKE_GPU_COPY_REFUSED, size);
    } else if (src == dst && kind_value == hipMemcpyDefault && version_at_least(5, 3)) {
        /* the early return: nothing moves, nothing counted */
    } else {
        memmove(to.bytes, from.bytes, size);
        enum fake_gpu_copy_outcome outcome = FAKE_GPU_COPY_PINNED;
        if (host_only)
            outcome = FAKE_GPU_COPY_HOST;
        else if (from.kind == END_PAGEABLE || to.kind == END_PAGEABLE)
            outcome = FAKE_GPU_COPY_STAGED;
        else if (from.kind == END_DEVICE && to.kind == END_DEVICE)
            outcome = FAKE_GPU_COPY_DEVICE;
        fake_pins_count_copy(outcome, size);
    }
    fake_pins_unlock();
    return error;
}

FAKE_EXPORT hipError_t hipMemcpy(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind)
{
    hipError_t error = enter(FAKE_HIP_CALL_MEMCPY, FAKE_CALLER());
    if (error != hipSuccess)
        return finish(error);
    return finish(copy(dst, src, sizeBytes, kind));
}

/* hipMemcpyAsync_common: the direction (from 6.1), the stream, then
 * ihipMemcpy as hipMemcpy's; done before it returns, as the double does all. */
FAKE_EXPORT hipError_t hipMemcpyAsync(void *dst, const void *src, size_t sizeBytes,
                                      hipMemcpyKind kind, hipStream_t stream)
{
    hipError_t error = enter(FAKE_HIP_CALL_MEMCPY, FAKE_CALLER());
    unsigned kind_value = (unsigned)kind;
    if (error == hipSuccess && version_at_least(6, 1) && kind_value > hipMemcpyDefault &&
        kind_value != MEMCPY_DEVICE_TO_DEVICE_NO_CU)
        error = hipErrorInvalidMemcpyDirection;
    else if (error == hipSuccess && !stream_valid(stream))
        error = hipErrorContextIsDestroyed;
    if (error != hipSuccess) {
        fake_pins_lock();
        fake_pins_count_copy(FAKE_GPU_COPY_REFUSED, sizeBytes);
        fake_pins_unlock();
        return finish(error);
    }
    return finish(copy(dst, src, sizeBytes, kind));
}

FAKE_EXPORT hipError_t hipGetLastError(void)
{
    enter(FAKE_HIP_CALL_GET_LAST_ERROR, FAKE_CALLER());
    hipError_t error = last_error;
    last_error = hipSuccess;
    return error;
}

FAKE_EXPORT hipError_t hipPeekAtLastError(void)
{
    enter(FAKE_HIP_CALL_OTHER, FAKE_CALLER());
    return last_error;
}

static const char *name_of(hipError_t error)
{
    switch ((int)error) {
    case hipSuccess:
        return "hipSuccess";
    case hipErrorInvalidValue:
        return "hipErrorInvalidValue";
    case hipErrorOutOfMemory:
        return "hipErrorOutOfMemory";
    case hipErrorNotInitialized:
        return "hipErrorNotInitialized";
    case hipErrorDeinitialized:
        return "hipErrorDeinitialized";
    case hipErrorNoDevice:
        return "hipErrorNoDevice";
    case hipErrorInvalidDevice:
        return "hipErrorInvalidDevice";
    case hipErrorHostMemoryAlreadyRegistered:
        return "hipErrorHostMemoryAlreadyRegistered";
    case hipErrorHostMemoryNotRegistered:
        return "hipErrorHostMemoryNotRegistered";
    case hipErrorInvalidMemcpyDirection:
        return "hipErrorInvalidMemcpyDirection";
    case hipErrorInvalidHandle:
        return "hipErrorInvalidHandle";
    case hipErrorContextIsDestroyed:
        return "hipErrorContextIsDestroyed";
    default:
        return "hipErrorUnknown";
    }
}

/* No HIP_INIT_API: these start nothing. */
FAKE_EXPORT const char *hipGetErrorName(hipError_t error)
{
    return name_of(error);
}

/* 5.2's returns the name too (hip_error.cpp); later ones a sentence. */
FAKE_EXPORT const char *hipGetErrorString(hipError_t error)
{
    return name_of(error);
}

FAKE_EXPORT int fake_hip_started(void)
{
    return started;
}
