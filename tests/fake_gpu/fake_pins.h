/* fake_pins: what the HIP and Level Zero test doubles share (tests/fake_hip,
 * tests/fake_ze), compiled into each: the table of host registrations (or
 * imports) a vendor's calls make, the invariant checks the CUDA double
 * makes too (every registered page locked and mapped when registered and
 * when unregistered, no page in two registrations), injected failures and
 * latency, calls counted per calling object, the event log, and the
 * query API the tests use, the same for every vendor (fake_gpu_*).
 *
 * Nothing here allocates: the shim under test interposes the allocator, so
 * the table lives in memory from a raw mmap system call and log lines are
 * formatted without stdio (fake_line.h).
 *
 * Environment (read once, at the first call):
 *   FAKE_GPU_FAIL_REGISTER_EVERY=N    register calls N, 2N, ... fail without effect
 *   FAKE_GPU_FAIL_UNREGISTER_EVERY=N  the same for unregister calls
 *   FAKE_GPU_FAIL_ERROR=E             their code (default: the vendor's out of memory)
 *   FAKE_GPU_REGISTER_SECONDS_PER_GIB=S    simulated time per GiB (default 0)
 *   FAKE_GPU_UNREGISTER_SECONDS_PER_GIB=S
 *   FAKE_GPU_CHECK=0                  skip the invariant checks
 *   FAKE_GPU_LOG=path                 register/unregister/violation lines in the
 *                                     format of FAKE_CUDART_LOG (fake_cudart.h),
 *                                     which tests/support/fake_log.c reads
 *
 * Copies (hipMemcpy(Async), zeCommandListAppendMemoryCopy): each vendor's
 * double decides by its vendor's rule (fake_hip.h, fake_ze.h) whether each
 * host end of a copy goes through a registration (an import) or is staged,
 * moves the bytes (device memory below has real backing), and counts the
 * copy here by outcome (enum fake_gpu_copy_outcome, fake_gpu_copy_count). */
#ifndef FAKE_PINS_H
#define FAKE_PINS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Built with -fvisibility=hidden: only what is marked so is exported;
 * noinline keeps __builtin_return_address(0) the caller's. */
#define FAKE_EXPORT __attribute__((visibility("default"), noinline))
#define FAKE_CALLER() __builtin_extract_return_addr(__builtin_return_address(0))

enum fake_pins_state {
    FAKE_PINS_LIVE,
    FAKE_PINS_REGISTERING, /* a call sleeping its simulated latency */
    FAKE_PINS_UNREGISTERING,
};

/* Broken invariants, numbered and named as the CUDA double's. */
enum fake_gpu_violation {
    FAKE_GPU_VIOLATION_REGISTER_UNMAPPED,     /* "register_unmapped" */
    FAKE_GPU_VIOLATION_REGISTER_NOT_LOCKED,   /* "register_not_locked" */
    FAKE_GPU_VIOLATION_PAGE_SHARED,           /* "page_shared" */
    FAKE_GPU_VIOLATION_UNREGISTER_UNMAPPED,   /* "unregister_unmapped" */
    FAKE_GPU_VIOLATION_UNREGISTER_NOT_LOCKED, /* "unregister_not_locked" */
    /* Vendors that accept a registration over registered memory without a
     * word (HIP before ROCm 7, Level Zero's import that covers another): the
     * double records it, for the tests to tell. */
    FAKE_GPU_VIOLATION_REGISTER_OVERLAP, /* "register_overlap" */
    /* A driver's function given the loader's handle for the driver (Level
     * Zero: the driver would read the loader's object as its own). */
    FAKE_GPU_VIOLATION_LOADER_HANDLE, /* "loader_handle" */
    /* An entry point that crashes the real library when called too early
     * (Level Zero loaders from 1.15.7: any call but zeDriverGet before
     * zeInit). */
    FAKE_GPU_VIOLATION_TOO_EARLY, /* "too_early" */
    FAKE_GPU_VIOLATION_KIND_COUNT
};

/* What became of a copy call, as fake_gpu_copy_count counts it. A copy of
 * 0 bytes that succeeds, and HIP's copy of an address onto itself with
 * hipMemcpyDefault, move nothing and count nowhere. */
enum fake_gpu_copy_outcome {
    /* Every end in host memory went through a registration (HIP) or an
     * import (Level Zero) that holds the whole range: the pinned path. */
    FAKE_GPU_COPY_PINNED,
    /* At least one end in host memory is pageable for the vendor (in no
     * registration or import, or leaving it where the vendor then stages):
     * staged or pinned for the copy only, never refused for that. */
    FAKE_GPU_COPY_STAGED,
    /* The call answered an error; nothing moved. */
    FAKE_GPU_COPY_REFUSED,
    /* Host to host by the CPU, no device involved (HIP: neither end known). */
    FAKE_GPU_COPY_HOST,
    /* Device memory to device memory. */
    FAKE_GPU_COPY_DEVICE,
    FAKE_GPU_COPY_OUTCOME_COUNT
};

struct fake_gpu_range {
    uintptr_t base;
    size_t size;
};

struct fake_pins_entry {
    uintptr_t base;
    size_t size;
    uint64_t id;    /* never reused: a sleeping call finds its own entry again */
    uintptr_t tag;  /* the vendor's: the driver an import belongs to */
    unsigned flags; /* as the call received them */
    uint8_t state;  /* enum fake_pins_state */
};

#define FAKE_PINS_MAX_CALL_KINDS 32
#define FAKE_PINS_CAPACITY 65536

/* The state lock: every table function below wants it held. */
void fake_pins_lock(void);
void fake_pins_unlock(void);

/* Configuration (FAKE_GPU_*); out_of_memory is the vendor's code for an
 * injected failure when FAKE_GPU_FAIL_ERROR is unset. */
void fake_pins_configure(int out_of_memory);
bool fake_pins_checking(void);

/* The table, sorted by base. Indexes are valid until the next insert or
 * remove. */
long fake_pins_containing(uintptr_t address);
/* The first entry overlapping [base, base + size), or -1; *count gets how many. */
long fake_pins_overlapping(uintptr_t base, size_t size, size_t *count);
struct fake_pins_entry *fake_pins_at(long index);
long fake_pins_find_id(uint64_t id);
/* -1 when the table is full. */
long fake_pins_insert(uintptr_t base, size_t size, unsigned flags, uintptr_t tag, uint8_t state);
void fake_pins_remove(long index);
size_t fake_pins_count(void);

/* The checks of a registration about to be made or undone (when checking). */
void fake_pins_check_register(uintptr_t base, size_t size);
void fake_pins_check_unregister(uintptr_t base, size_t size);

/* Whether every page of the range is mapped with read access (what any pin
 * of user pages needs) and, for_write, with write access too (a pin for
 * writing; call without the lock: it reads /proc/self/maps). */
bool fake_pins_pinnable(uintptr_t base, size_t size, bool for_write);

/* Whether this register (or unregister) call is one FAKE_GPU_FAIL_* picks;
 * *error gets the code. */
bool fake_pins_injected_failure(bool unregister, int *error);

/* The simulated time of a call on size bytes; sleeps it (the lock released
 * by the caller around the sleep). */
double fake_pins_latency(size_t size, bool unregister);

/* A registration or an unregistration that takes the simulated latency:
 * begun with the lock held, finished after it is dropped (the sleep, then
 * the entry made LIVE or removed, unless fake_gpu_reset came between). */
struct fake_pins_timed {
    uint64_t id; /* 0: nothing to finish */
    double seconds;
    uint64_t epoch;
};
/* Inserts (fake_pins_insert) REGISTERING when the register latency is
 * above 0, else LIVE; *at is the entry's index, -1 when the table is full. */
struct fake_pins_timed fake_pins_insert_timed(uintptr_t base, size_t size, unsigned flags,
                                              uintptr_t tag, long *at);
/* Checks the entry at index at for unregistration and removes it, at once or
 * (latency) once finished. */
struct fake_pins_timed fake_pins_remove_timed(long at);
/* Without the lock. */
void fake_pins_finish_timed(struct fake_pins_timed timed, bool removal);
void fake_pins_sleep(double seconds);
/* Moves on at every reset: a sleeping call whose epoch changed forgets its entry. */
uint64_t fake_pins_epoch(void);

/* Counts an entry point's call by the object that made it (call without
 * the lock: dladdr takes the loader's). */
void fake_pins_count_call(int kind, const void *caller);

/* An invariant broken or a vendor's trap walked into (lock held). */
void fake_pins_violation(enum fake_gpu_violation kind, uintptr_t base, size_t size);

/* Counts a copy call by its outcome, bytes the size it asked for (lock held). */
void fake_pins_count_copy(enum fake_gpu_copy_outcome outcome, size_t bytes);

/* Device memory, for the copies: blocks with backing from a raw mmap system
 * call, at addresses that no host mapping has (non-canonical, above 2^48),
 * handed out upwards without gaps, so a range can run from one block into
 * the next. The table wants the state lock held, like the one above. */
#define FAKE_DEVICE_CAPACITY 256
struct fake_device_block {
    uintptr_t base;
    size_t size;            /* as asked: the block's end for lookups */
    unsigned char *backing; /* size bytes (rounded up to pages), 0-filled */
};
/* A new block of size bytes (size > 0); its base, or 0 when the table is
 * full or the mapping failed. */
uintptr_t fake_device_alloc(size_t size);
/* Frees the block at base (its base only): false when there is none. */
bool fake_device_free(uintptr_t base);
/* The block holding address (base <= address < base + size): true and
 * *block; false when none. */
bool fake_device_find(uintptr_t address, struct fake_device_block *block);

/* Log lines (FAKE_GPU_LOG). */
void fake_pins_log_register(uintptr_t base, size_t size, unsigned flags, int error);
void fake_pins_log_unregister(uintptr_t base, int error);

/* The query API every vendor's double exports (the tests find it with dlsym):
 *   size_t fake_gpu_snapshot(struct fake_gpu_range *out, size_t max)  live, by base
 *   size_t fake_gpu_live_count(void)
 *   size_t fake_gpu_violation_count(void), fake_gpu_violation_count_of(int kind)
 *   uint64_t fake_gpu_call_count(int kind)
 *   uint64_t fake_gpu_call_count_by(int kind, const char *object_substring)
 *   void fake_gpu_reset(void)               forgets registrations, counts, violations
 *   void fake_gpu_set_fail_every(unsigned reg, unsigned unreg, int error)
 *   void fake_gpu_set_check(int on)
 *   uint64_t fake_gpu_copy_count(int outcome)   copy calls with that
 *                                  enum fake_gpu_copy_outcome (0 out of range)
 *   uint64_t fake_gpu_copy_bytes(int outcome)   the bytes those calls asked for
 * The call kinds are the vendor's (fake_hip.h, fake_ze.h). fake_gpu_reset
 * zeroes the copy counts too; device memory stays. */

#endif
