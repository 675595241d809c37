/* What the interposition layer's files share (interpose.c,
 * interpose_delete.c and each vendor's interposed registration calls:
 * src/cuda/cuda_interpose.c, src/hip/hip_interpose.c,
 * src/ze/ze_interpose.c); nothing else includes this. */
#ifndef PINSHIM_INTERPOSE_INTERNAL_H
#define PINSHIM_INTERPOSE_INTERNAL_H

#include <stddef.h>

/* free's checks and release for the block at ptr, with the call that frees
 * it given (run(arguments)): run straight away when the block holds no
 * registered page, else inside the engine's release, after the pages are
 * unregistered. */
void interpose_release_block(void *ptr, long (*run)(void *), void *arguments);

/* The shim's free, for a delete whose next definition cannot be found. */
void interpose_free(void *ptr);

/* The definition of name that the caller would reach without the shim (own:
 * the shim's): the next in the global scope, else in the caller's own
 * dependencies (a library loaded RTLD_LOCAL with its runtime, as PyTorch's
 * are), else in a library loaded under one of sonames (NULL-terminated).
 * Loads nothing; caches the last answers per caller object. NULL when there
 * is none. */
void *interpose_next_symbol(const char *name, const void *own, const void *caller,
                            const char *const *sonames);

/* A program's own registration call of a vendor whose calls are shaped as
 * CUDA's (register(ptr, size, flags), unregister(ptr)): CUDA and HIP
 * (src/program_registration.c). The engine hands its registration over or
 * gives its pages up, then next runs; the result is next's, or success
 * when the engine made no call. */
struct vendor;
typedef int (*program_host_register_fn)(void *, size_t, unsigned int);
typedef int (*program_host_unregister_fn)(void *);
struct program_host_calls {
    const struct vendor *vendor;
    const char *register_name, *unregister_name; /* "cudaHostRegister", ... */
    long success;                                /* the vendor's success code */
};
int program_host_register(const struct program_host_calls *calls, program_host_register_fn next,
                          void *ptr, size_t size, unsigned int flags);
int program_host_unregister(const struct program_host_calls *calls, program_host_unregister_fn next,
                            void *ptr);

#endif
