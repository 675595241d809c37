#include "cuda_loader.h"

#include "pinshim_config.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#if PINSHIM_HAVE_CUDA_HEADERS
#include <cuda_runtime_api.h>
/* Check that the signatures the shim calls through match the Toolkit's. The
 * enum cudaError_t has the size of int, and the shim reads it as an int. */
_Static_assert(sizeof(cudaError_t) == sizeof(int), "cudaError_t must be int-sized");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cudaHostRegister),
                                            cudaError_t (*)(void *, size_t, unsigned int)),
               "cudaHostRegister signature changed");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cudaHostUnregister),
                                            cudaError_t (*)(void *)),
               "cudaHostUnregister signature changed");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cudaGetLastError), cudaError_t (*)(void)),
               "cudaGetLastError signature changed");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cudaGetErrorName),
                                            const char *(*)(cudaError_t)),
               "cudaGetErrorName signature changed");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cudaGetDeviceCount),
                                            cudaError_t (*)(int *)),
               "cudaGetDeviceCount signature changed");
_Static_assert(cudaErrorHostMemoryAlreadyRegistered == 712 &&
                   cudaErrorHostMemoryNotRegistered == 713 && cudaErrorCudartUnloading == 4 &&
                   cudaErrorInsufficientDriver == 35 && cudaErrorNoDevice == 100,
               "CUDA error values changed");
_Static_assert(cudaHostRegisterPortable == 1 && cudaHostRegisterMapped == 2 &&
                   cudaHostRegisterReadOnly == 8,
               "cudaHostRegister flag values changed");
#endif

const char *const cuda_runtime_sonames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11",
                                            "libcudart.so", NULL};

static const struct {
    int code;
    const char *name;
} known_errors[] = {
    {0, "cudaSuccess"},
    {1, "cudaErrorInvalidValue"},
    {2, "cudaErrorMemoryAllocation"},
    {3, "cudaErrorInitializationError"},
    {4, "cudaErrorCudartUnloading"},
    {34, "cudaErrorStubLibrary"},
    {35, "cudaErrorInsufficientDriver"},
    {100, "cudaErrorNoDevice"},
    {712, "cudaErrorHostMemoryAlreadyRegistered"},
    {713, "cudaErrorHostMemoryNotRegistered"},
    {800, "cudaErrorNotPermitted"},
    {801, "cudaErrorNotSupported"},
    {999, "cudaErrorUnknown"},
};

const char *cuda_error_name(const struct cuda_runtime *runtime, int error)
{
    for (size_t i = 0; i < sizeof(known_errors) / sizeof(*known_errors); i++)
        if (known_errors[i].code == error)
            return known_errors[i].name;
    if (runtime != NULL && runtime->get_error_name != NULL) {
        const char *name = runtime->get_error_name(error);
        if (name != NULL && strncmp(name, "cuda", 4) == 0)
            return name;
    }
    return "cudaErrorUnrecognized";
}

void cuda_runtime_clear_last_error(const struct cuda_runtime *runtime)
{
    if (runtime->get_last_error != NULL)
        (void)runtime->get_last_error();
}

static void *resolve(void *handle, const char *name)
{
    dlerror();
    return dlsym(handle, name);
}

static void record_path(struct cuda_runtime *runtime, const char *fallback)
{
    Dl_info info;
    if (dladdr((void *)runtime->host_register, &info) && info.dli_fname != NULL &&
        info.dli_fname[0] != '\0')
        snprintf(runtime->path, sizeof(runtime->path), "%s", info.dli_fname);
    else
        snprintf(runtime->path, sizeof(runtime->path), "%s", fallback);
}

static bool resolve_symbols(struct cuda_runtime *runtime, const char *name)
{
    runtime->host_register = (cuda_host_register_fn)resolve(runtime->handle, "cudaHostRegister");
    runtime->host_unregister =
        (cuda_host_unregister_fn)resolve(runtime->handle, "cudaHostUnregister");
    if (runtime->host_register == NULL || runtime->host_unregister == NULL) {
        snprintf(runtime->error, sizeof(runtime->error),
                 "%.400s does not export cudaHostRegister and cudaHostUnregister", name);
        return false;
    }
    runtime->get_last_error = (cuda_get_last_error_fn)resolve(runtime->handle, "cudaGetLastError");
    runtime->get_error_name = (cuda_get_error_text_fn)resolve(runtime->handle, "cudaGetErrorName");
    runtime->get_error_string =
        (cuda_get_error_text_fn)resolve(runtime->handle, "cudaGetErrorString");
    runtime->get_device_count =
        (cuda_get_device_count_fn)resolve(runtime->handle, "cudaGetDeviceCount");
    runtime->get_device = (cuda_get_device_fn)resolve(runtime->handle, "cudaGetDevice");
    runtime->set_device = (cuda_set_device_fn)resolve(runtime->handle, "cudaSetDevice");
    runtime->device_get_attribute =
        (cuda_device_get_attribute_fn)resolve(runtime->handle, "cudaDeviceGetAttribute");
    *(void **)&runtime->exchange_capture_mode =
        resolve(runtime->handle, "cudaThreadExchangeStreamCaptureMode");
    record_path(runtime, name);
    return true;
}

/* Whether the runtime answers with a device; else writes why to runtime->error. */
static bool runtime_has_device(struct cuda_runtime *runtime)
{
    if (runtime->get_device_count == NULL)
        return true;
    int count = 0;
    int error = runtime->get_device_count(&count);
    if (error != 0) {
        cuda_runtime_clear_last_error(runtime);
        snprintf(runtime->error, sizeof(runtime->error), "%.400s reports %s (%d)%s", runtime->path,
                 cuda_error_name(runtime, error), error,
                 error == 35    ? ": no usable NVIDIA driver"
                 : error == 100 ? ": no CUDA device"
                                : "");
        return false;
    }
    if (count <= 0) {
        snprintf(runtime->error, sizeof(runtime->error), "%.400s reports no CUDA device",
                 runtime->path);
        return false;
    }
    return true;
}

static void note_try(struct cuda_runtime *runtime, const char *name)
{
    if (runtime->try_count >= CUDA_RUNTIME_MAX_TRIES)
        return;
    struct cuda_runtime_try *entry = &runtime->tries[runtime->try_count++];
    snprintf(entry->name, sizeof(entry->name), "%.159s", runtime->path[0] ? runtime->path : name);
    snprintf(entry->result, sizeof(entry->result), "%.159s", runtime->error);
}

/* Tries handle (opened as name): usable, or noted and left for the next. */
static bool try_runtime(struct cuda_runtime *runtime, void *handle, const char *name, bool shared)
{
    runtime->handle = handle;
    runtime->path[0] = '\0';
    runtime->error[0] = '\0';
    runtime->shared_with_program = shared;
    if (resolve_symbols(runtime, name) && runtime_has_device(runtime)) {
        runtime->loaded = true;
        runtime->usable = true;
        return true;
    }
    note_try(runtime, name);
    /* Not closed: its initialisation may have registered exit handlers. */
    return false;
}

bool cuda_runtime_load(struct cuda_runtime *runtime, const char *requested)
{
    memset(runtime, 0, sizeof(*runtime));
    if (requested != NULL && requested[0] != '\0') {
        void *handle = dlopen(requested, RTLD_NOW | RTLD_LOCAL);
        if (handle == NULL) {
            const char *why = dlerror();
            snprintf(runtime->error, sizeof(runtime->error),
                     "cannot load PINSHIM_CUDART=%.200s: %.250s", requested,
                     why ? why : "unknown error");
            return false;
        }
        /* The user named it: no search if it is unusable. */
        if (try_runtime(runtime, handle, requested, false))
            return true;
        runtime->loaded = runtime->host_register != NULL;
        return false;
    }
    /* A runtime the program already loaded (even RTLD_LOCAL, as PyTorch does)
     * comes first, so the program and the shim share one set of
     * registrations; then each soname that loads, until one has a device. */
    bool tried[sizeof(cuda_runtime_sonames) / sizeof(*cuda_runtime_sonames)] = {false};
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; cuda_runtime_sonames[i] != NULL; i++) {
            if (tried[i])
                continue;
            int mode = pass == 0 ? RTLD_NOW | RTLD_NOLOAD : RTLD_NOW | RTLD_LOCAL;
            void *handle = dlopen(cuda_runtime_sonames[i], mode);
            if (handle == NULL)
                continue;
            tried[i] = true;
            if (try_runtime(runtime, handle, cuda_runtime_sonames[i], pass == 0))
                return true;
        }
    }
    if (runtime->try_count == 0) {
        snprintf(runtime->error, sizeof(runtime->error),
                 "no CUDA runtime found (tried libcudart.so.13, .12, .11 and libcudart.so)");
    } else {
        struct cuda_runtime_try last = runtime->tries[runtime->try_count - 1];
        snprintf(runtime->error, sizeof(runtime->error), "%.300s%s", last.result,
                 runtime->try_count > 1 ? " (and no other runtime found was usable)" : "");
    }
    runtime->loaded = false;
    return false;
}
