/* One GPU vendor's host-memory registration, behind the accelerator layer
 * (accelerator.h): CUDA (src/cuda/), HIP (src/hip/), Level Zero (src/ze/).
 * Each vendor translates its own codes into the engine's outcomes and keeps
 * its state to itself; vendors never call each other, the accelerator layer
 * or the process's runtime module. The accelerator layer calls them with the
 * reentrancy guard held: a runtime may allocate, map and lock memory.
 *
 * Two modes (PINSHIM_CONTEXT). Program mode: the vendor uses only a runtime
 * the program itself loaded and started, and never starts one (started()
 * asks the one question that does not start it). Create mode: create()
 * loads the runtime and starts it, for programs that never use a GPU. */
#ifndef PINSHIM_VENDOR_H
#define PINSHIM_VENDOR_H

#include "engine.h"
#include "loaded_objects.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vendor_settings {
    bool create_mode;
    /* Create mode: the device to register on (-1: the locking thread's). */
    int device;
    /* Create mode: the runtime library asked for (a path or soname), or
     * NULL to search the vendor's usual names. */
    const char *library;
    /* PINSHIM_VENDOR names this vendor (not auto): the user chose it. */
    bool chosen;
};

/* What the program has done with the vendor's runtime, as far as can be
 * told without starting it. */
enum vendor_state {
    VENDOR_ABSENT,      /* not loaded in the process */
    VENDOR_NOT_STARTED, /* loaded, not started (yet) */
    VENDOR_STARTED,     /* started by the program: registrations may be made */
    VENDOR_GONE,        /* torn down (exit): nothing more may be made */
};

#define VENDOR_MAX_TRIES 8

/* What the stats say of the vendor (filled in by describe()). */
struct vendor_description {
    const char *library;       /* the runtime or driver used, NULL when none was */
    bool shared_with_program;  /* create mode: the program had loaded it too */
    const char *error;         /* why none could be used, NULL when fine or never needed */
    uint64_t contexts_created; /* create mode: by the shim's calls, as far as can be told */
    size_t try_count;          /* create mode: libraries passed over, and why */
    struct {
        const char *name;
        const char *result;
    } tries[VENDOR_MAX_TRIES];
};

struct vendor {
    const char *name;  /* as PINSHIM_VENDOR names it: "cuda", "hip", "ze" */
    const char *title; /* for people: "CUDA", "HIP", "Level Zero" */
    void (*configure)(const struct vendor_settings *settings);
    /* Program mode: the vendor's runtime as the program left it (a lookup in
     * the loader's list, then, when loaded, the question that starts
     * nothing). */
    enum vendor_state (*state)(void);
    /* Create mode: loads and starts the runtime, once; false (why filled in)
     * when none is usable. */
    bool (*create)(char *why, size_t why_size);
    /* Where a registration of memory locked by the calling thread goes (see
     * engine_backend.choose_place); called once state() said STARTED, or in
     * create mode after create(). */
    enum engine_choice (*choose_place)(bool from_worker, const struct range_place *hint,
                                       struct range_place *place);
    /* The place a registration call the program makes now on this thread
     * goes to; false when it cannot be told. */
    bool (*thread_place)(struct range_place *place);
    struct engine_result (*register_range)(struct range_place *place, void *base, size_t length);
    struct engine_result (*unregister_range)(const struct range_place *place, void *base,
                                             size_t length);
    /* Whether place's device takes read-only registrations; asked once per device. */
    bool (*read_only_supported)(const struct range_place *place);
    /* Optional: the NUMA node nearest place's device (-1: unknown); asked
     * once per device. NULL for a vendor whose registrations serve every
     * device (HIP, Level Zero): none of them is the one to be near. */
    int (*device_numa_node)(const struct range_place *place);
    /* The name of one of the vendor's codes, or NULL. */
    const char *(*code_name)(int code);
    /* The calls register_range and unregister_range make, for messages and stats. */
    const char *(*call_name)(bool unregister);
    /* Whether the program started the runtime, from what the vendor has
     * seen: asked in a fork handler, where calling the runtime could wait
     * for a lock its own fork handler holds. */
    bool (*seen_started)(void);
    /* The library whose presence at a fork says the parent may have started
     * the runtime (loaded_objects.h; the parent's fork handler asks). */
    enum loaded_library fork_library;
    /* Optional: in a fork child whose parent had fork_library loaded,
     * whether the parent had started the runtime, read from the state the
     * child inherited, with no lock taken and no system call; NULL: the
     * library's presence says so. A child never calls a runtime its parent
     * started: the runtimes do not work across fork. */
    bool (*started_before_fork)(void);
    /* In a fork child: locks a parent's thread held are free again. */
    void (*after_fork_child)(void);
    /* The process is exiting: the program's libraries' destructors have run
     * (the shim's run last), so the runtime may be torn down. A vendor whose
     * runtime cannot say so safely answers ENGINE_UNLOADING from here on
     * without calling it: the kernel drops every pin with the process. */
    void (*process_exiting)(void);
    void (*describe)(struct vendor_description *out);
};

extern const struct vendor cuda_vendor;
extern const struct vendor hip_vendor;
extern const struct vendor ze_vendor;

#endif
