/* pinshim public API.
 *
 * When libpinshim.so is preloaded, a program may look these functions up with
 * dlsym(RTLD_DEFAULT, "pinshim_...") without linking against the shim. All of
 * them are async-signal-unsafe but thread-safe, and none allocates through
 * the interposed allocator functions.
 */
#ifndef PINSHIM_H
#define PINSHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PINSHIM_VERSION_MAJOR 0
#define PINSHIM_VERSION_MINOR 2
#define PINSHIM_VERSION_PATCH 0
#define PINSHIM_VERSION_STRING "0.3.0"

#if defined(__GNUC__)
#define PINSHIM_API __attribute__((visibility("default")))
#else
#define PINSHIM_API
#endif

/* A copy of the shim's counters. Fields are only ever appended; callers pass
 * sizeof(struct pinshim_counters) so an older program keeps working with a
 * newer shim. */
struct pinshim_counters {
    uint64_t register_ok;                 /* cudaHostRegister calls that succeeded */
    uint64_t register_failed;             /* ... that failed (712 excluded) */
    uint64_t register_already_registered; /* answered 712: not the shim's range */
    uint64_t register_skipped_small;      /* locks below PINSHIM_MIN_BYTES */
    uint64_t register_bytes;              /* bytes successfully registered */
    uint64_t register_nanoseconds;        /* time spent inside cudaHostRegister */
    uint64_t unregister_ok;               /* cudaHostUnregister calls that succeeded */
    uint64_t unregister_failed;
    uint64_t unregister_munlock;     /* unregistrations caused by munlock/munlockall */
    uint64_t unregister_free;        /* ... by free */
    uint64_t unregister_realloc;     /* ... by realloc/reallocarray */
    uint64_t unregister_munmap;      /* ... by munmap */
    uint64_t unregister_mremap;      /* ... by mremap */
    uint64_t unregister_mmap_fixed;  /* ... by mmap(MAP_FIXED) over a registration */
    uint64_t unregister_exit;        /* ... at process exit */
    uint64_t unregister_nanoseconds; /* time spent inside cudaHostUnregister */
    uint64_t live_ranges;            /* registrations held right now */
    uint64_t live_bytes;
    uint64_t peak_bytes;
    uint64_t mlockall_calls; /* passed through, never registered */
    uint64_t lock_calls;     /* mlock/mlock2/mmap(MAP_LOCKED) seen */
    uint64_t unlock_calls;   /* munlock/munlockall seen */
    /* Since 0.2.0: */
    uint64_t unregister_program;    /* given up because the program registered the pages itself */
    uint64_t program_registrations; /* the program's own cudaHostRegister calls that succeeded */
    uint64_t pending_ranges;        /* locked ranges waiting for the program's CUDA context now */
    uint64_t pending_bytes;
    uint64_t queued_ranges; /* locked ranges waiting for the registration thread now */
    /* Since 0.3.0: */
    uint64_t unregister_mprotect; /* read-only registrations made again writable by mprotect */
    /* Since 0.4.0: */
    uint64_t unregister_join; /* undone to register a run again whole (it grew or joined) */
    uint64_t held_ranges;     /* locked ranges tracked and not registered now (run too small,
                                 or holding pages no registration may cover) */
    uint64_t held_bytes;
};

/* The shim's version string ("0.3.0"). */
PINSHIM_API const char *pinshim_version(void);

/* 1 if ptr lies inside a range the shim registered with CUDA, else 0. */
PINSHIM_API int pinshim_is_registered(const void *ptr);

/* Copies min(size, sizeof(struct pinshim_counters)) bytes of the current
 * counters to out. Returns the number of bytes copied, 0 if out is NULL. */
PINSHIM_API size_t pinshim_get_counters(struct pinshim_counters *out, size_t size);

/* Waits until the shim's registration thread has registered every range
 * locked so far that can be registered now (PINSHIM_ASYNC=on registers in
 * the background: a program that needs its buffers pinned before it goes on
 * calls this). Ranges waiting for the program's CUDA context
 * (PINSHIM_CONTEXT=program) are looked at once more first, so a context the
 * program has just made is used. Returns the number of locked ranges still
 * waiting for a context, which it does not wait for. Since 0.2.0. */
PINSHIM_API size_t pinshim_drain(void);

#ifdef __cplusplus
}
#endif

#endif /* PINSHIM_H */
