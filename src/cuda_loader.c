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
    record_path(runtime, name);
    return true;
}

static bool open_runtime(struct cuda_runtime *runtime, const char *requested)
{
    if (requested != NULL && requested[0] != '\0') {
        runtime->handle = dlopen(requested, RTLD_NOW | RTLD_LOCAL);
        if (runtime->handle == NULL) {
            const char *why = dlerror();
            snprintf(runtime->error, sizeof(runtime->error),
                     "cannot load PINSHIM_CUDART=%.200s: %.250s", requested,
                     why ? why : "unknown error");
            return false;
        }
        return resolve_symbols(runtime, requested);
    }
    /* A runtime the program already loaded (even RTLD_LOCAL, as PyTorch does) is
     * shared, so the program and the shim see one set of registrations. */
    for (int i = 0; cuda_runtime_sonames[i] != NULL; i++) {
        runtime->handle = dlopen(cuda_runtime_sonames[i], RTLD_NOW | RTLD_NOLOAD);
        if (runtime->handle != NULL) {
            runtime->shared_with_program = true;
            return resolve_symbols(runtime, cuda_runtime_sonames[i]);
        }
    }
    for (int i = 0; cuda_runtime_sonames[i] != NULL; i++) {
        runtime->handle = dlopen(cuda_runtime_sonames[i], RTLD_NOW | RTLD_LOCAL);
        if (runtime->handle != NULL)
            return resolve_symbols(runtime, cuda_runtime_sonames[i]);
    }
    snprintf(runtime->error, sizeof(runtime->error),
             "no CUDA runtime found (tried libcudart.so.13, .12, .11 and libcudart.so)");
    return false;
}

bool cuda_runtime_load(struct cuda_runtime *runtime, const char *requested)
{
    memset(runtime, 0, sizeof(*runtime));
    if (!open_runtime(runtime, requested))
        return false;
    runtime->loaded = true;
    if (runtime->get_device_count != NULL) {
        int count = 0;
        int error = runtime->get_device_count(&count);
        if (error != 0) {
            cuda_runtime_clear_last_error(runtime);
            snprintf(runtime->error, sizeof(runtime->error), "%.400s reports %s (%d)%s",
                     runtime->path, cuda_error_name(runtime, error), error,
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
    }
    runtime->usable = true;
    return true;
}
