/* Loaded objects: what the process has loaded, read from the dynamic
 * loader's own list (dl_iterate_phdr) with no system call, and kept until a
 * load or an unload can have changed it (the loader counts both).
 *
 * Two questions are asked on the shim's lock, unlock and map paths: is a GPU
 * runtime loaded (dlopen(..., RTLD_NOLOAD) would answer it by searching
 * every library directory, each time, when it is not), and was a call made
 * from a GPU vendor's own libraries (a driver or a runtime, which must never
 * be called back from inside their own stack). */
#ifndef PINSHIM_LOADED_OBJECTS_H
#define PINSHIM_LOADED_OBJECTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The libraries the vendors look for, by file name. */
enum loaded_library {
    LOADED_CUDA_DRIVER, /* libcuda.so* */
    LOADED_HIP_RUNTIME, /* libamdhip64.so* */
    LOADED_HSA_RUNTIME, /* libhsa-runtime64.so* (under HIP) */
    LOADED_ZE_LOADER,   /* libze_loader.so* (Level Zero) */
    LOADED_LIBRARY_COUNT
};

/* Whether which is loaded; when it is and path is given, its file name as
 * the loader keeps it (a dlopen of that name with RTLD_NOLOAD finds it
 * without a search; empty when it was too long to keep). */
bool loaded_objects_find(enum loaded_library which, char *path, size_t path_size);

/* Whether address lies in the code of a GPU vendor's own library: a driver
 * or runtime of NVIDIA's (libcuda.so*, *cudart*, libnvidia-*), AMD's
 * (libamdhip64*, libhsa-runtime64*, libhsakmt*) or Intel's Level Zero
 * (libze_loader*, libze_intel_gpu*, libze_*_layer*). */
bool loaded_objects_in_gpu_runtime(uintptr_t address);

/* Whether a file name (a path or a soname) is that of such a library, and
 * of which (LOADED_LIBRARY_COUNT: one of the others in the list). */
bool loaded_objects_is_gpu_runtime_name(const char *name);
bool loaded_objects_is_library_name(const char *name, enum loaded_library which);

/* In a fork child: the lock a parent's thread held is free again. */
void loaded_objects_after_fork(void);

#endif
