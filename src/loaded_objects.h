/* Loaded objects: what the process has loaded, read from the dynamic
 * loader's own list (dl_iterate_phdr) with no system call, and kept until a
 * load or an unload can have changed it (the loader counts both).
 *
 * Two questions are asked on the shim's lock, unlock and map paths: is a
 * CUDA driver loaded (dlopen("libcuda.so.1", RTLD_NOLOAD) would answer it by
 * searching every library directory, each time, when it is not), and was a
 * call made from NVIDIA's own libraries (the driver or a runtime, which must
 * never be called back from inside their own stack). */
#ifndef PINSHIM_LOADED_OBJECTS_H
#define PINSHIM_LOADED_OBJECTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether a CUDA driver (libcuda.so*) is loaded; when it is and path is
 * given, its file name as the loader keeps it (a dlopen of that name with
 * RTLD_NOLOAD finds it without a search). */
bool loaded_objects_cuda_driver(char *path, size_t path_size);

/* Whether address lies in the code of a CUDA library: the driver
 * (libcuda.so*), a runtime (*cudart*) or another of the driver's own
 * libraries (libnvidia-*). */
bool loaded_objects_in_cuda_library(uintptr_t address);

/* Whether a file name (a path or a soname) is that of a CUDA library as
 * above, and of the driver. */
bool loaded_objects_is_cuda_library_name(const char *name);
bool loaded_objects_is_cuda_driver_name(const char *name);

/* In a fork child: the lock a parent's thread held is free again. */
void loaded_objects_after_fork(void);

#endif
