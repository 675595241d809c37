/* CUDA loader: finds and opens a CUDA runtime at run time with dlopen/dlsym.
 * The shim never links against CUDA. Callers hold the reentrancy guard: dlopen
 * and the runtime's own start-up allocate and map memory. */
#ifndef PINSHIM_CUDA_LOADER_H
#define PINSHIM_CUDA_LOADER_H

#include <stdbool.h>
#include <stddef.h>

typedef int (*cuda_host_register_fn)(void *ptr, size_t size, unsigned int flags);
typedef int (*cuda_host_unregister_fn)(void *ptr);
typedef int (*cuda_get_last_error_fn)(void);
typedef const char *(*cuda_get_error_text_fn)(int error);
typedef int (*cuda_get_device_count_fn)(int *count);
typedef int (*cuda_get_device_fn)(int *device);
typedef int (*cuda_set_device_fn)(int device);
typedef int (*cuda_device_get_attribute_fn)(int *value, int attribute, int device);

/* One runtime the search looked at, and why it was not used. */
struct cuda_runtime_try {
    char name[160];
    char result[160];
};
#define CUDA_RUNTIME_MAX_TRIES 8

struct cuda_runtime {
    cuda_host_register_fn host_register;
    cuda_host_unregister_fn host_unregister;
    cuda_get_last_error_fn get_last_error;             /* optional */
    cuda_get_error_text_fn get_error_name;             /* optional */
    cuda_get_error_text_fn get_error_string;           /* optional */
    cuda_get_device_count_fn get_device_count;         /* optional */
    cuda_get_device_fn get_device;                     /* optional */
    cuda_set_device_fn set_device;                     /* optional */
    cuda_device_get_attribute_fn device_get_attribute; /* optional */
    int (*exchange_capture_mode)(int *mode);           /* optional: 10.1 on */
    void *handle;
    bool loaded;              /* the required symbols resolved */
    bool usable;              /* loaded, and a driver and a device answered */
    bool shared_with_program; /* the program had already loaded it */
    char path[1024];          /* file that was loaded */
    char error[512];          /* why it is not usable */
    struct cuda_runtime_try tries[CUDA_RUNTIME_MAX_TRIES]; /* rejected before this one */
    size_t try_count;
};

/* Candidate sonames, tried with RTLD_NOLOAD first, then loaded, in this order. */
extern const char *const cuda_runtime_sonames[];

/* Opens requested (path or soname) when not empty, else searches: a runtime
 * the program already loaded, then each soname in turn. A runtime that loads
 * but answers cudaGetDeviceCount with an error (a CUDA 13 runtime on an older
 * driver, say) is noted in tries and the search goes on to the next. On
 * failure, runtime->error says why; the caller logs it. */
bool cuda_runtime_load(struct cuda_runtime *runtime, const char *requested);

/* Reads and so clears the calling thread's last runtime error. */
void cuda_runtime_clear_last_error(const struct cuda_runtime *runtime);

/* A name for error: the runtime's when it has one, else a built-in table. */
const char *cuda_error_name(const struct cuda_runtime *runtime, int error);

#endif
