/* Runtime: the process-wide shim state (configuration, engine, CUDA backend)
 * and its lifecycle: load, fork, exit. The interposition layer calls in here. */
#ifndef PINSHIM_RUNTIME_H
#define PINSHIM_RUNTIME_H

#include "engine.h"
#include "huge_pages.h"
#include "live_process.h"
#include "options.h"
#include "reentry_guard.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PINSHIM_INTERNAL __attribute__((visibility("hidden")))

extern struct engine runtime_engine PINSHIM_INTERNAL;
/* The engine's free gate (struct engine_free_view), kept in a variable of its
 * own: free compares against it without first forming the engine's address. */
extern uintptr_t runtime_free_gate PINSHIM_INTERNAL;
/* Where the program's mappings begin and end (mapping_bounds.h): noted by
 * the interposed mmap, munmap and mremap from the first call, before the
 * shim's set-up, and read by the engine. */
extern struct mapping_bounds runtime_mapping_bounds PINSHIM_INTERNAL;
/* Whether mlockall(MCL_FUTURE) without MCL_ONFAULT is in effect: every new
 * mapping is then locked and faulted in at once. */
bool runtime_future_mappings_locked(void);
extern struct pinshim_config runtime_config;
extern uintptr_t runtime_page_size;

/* Loads the configuration and sets up the engine once; cheap after the first call. */
void runtime_ensure_initialized(void);
bool runtime_is_initialized(void);

/* The smallest posix_memalign size that gets page rounding, or SIZE_MAX when
 * registration is off; never below RUNTIME_SMALLEST_ROUNDING_THRESHOLD. */
#define RUNTIME_SMALLEST_ROUNDING_THRESHOLD ((size_t)65536)
size_t runtime_rounding_threshold(void);

/* Huge pages for memory about to be locked (PINSHIM_HUGEPAGES, huge_pages.h),
 * set up with the rest. The lock's real call is wrapped: before it, the
 * range's empty PMD-aligned chunks may be advised (faults_in: a plain lock,
 * not MLOCK_ONFAULT); after it, the page sizes it got are counted. Both keep
 * errno. */
extern struct huge_pages runtime_huge_pages PINSHIM_INTERNAL;
void runtime_huge_pages_before_lock(uintptr_t addr, size_t length, bool faults_in,
                                    struct huge_pages_lock *lock);
void runtime_huge_pages_after_lock(const struct huge_pages_lock *lock, bool locked);
/* The alignment of a large aligned allocation (size already rounded for
 * locking): the PMD size while huge pages are advised, counted. */
size_t runtime_huge_pages_alignment(size_t alignment, size_t size);

/* Counts an mlockall (logged once at info level) and remembers its flags when
 * it succeeded; runtime_note_munlockall forgets them. */
void runtime_note_mlockall(int flags, int result);
void runtime_note_munlockall(int result);

/* The live record (live_process.h): made at the process's first lock call
 * (mlock, mlock2, MAP_LOCKED, mlockall, a lock made by a runtime itself);
 * one relaxed load after. */
void runtime_live_record_start(void);
static inline void runtime_live_record_start_once(void)
{
    if (__builtin_expect(__atomic_load_n(&live_process_state, __ATOMIC_RELAXED) == 0, 0))
        runtime_live_record_start();
}
bool runtime_is_fork_child(void);

/* Counts a lock call and, at the first, makes the live record. */
static inline void runtime_count_lock_call(void)
{
    engine_count(&engine_stats(&runtime_engine)->lock_calls);
    runtime_live_record_start_once();
}

/* _exit, _Exit: the process ends now, without exit handlers or destructors.
 * Writes the statistics as exit would (registrations still held count as
 * live at exit; they are not unregistered: the kernel drops every pin with
 * the process, and _exit asked for no clean-up). Not in a vfork child (it
 * shares the parent's memory) nor when the shim's lock is held. */
void runtime_before_immediate_exit(void);

/* Locked ranges wait for the program to start its GPU runtime
 * (PINSHIM_CONTEXT=program): at most every 10 ms, a shim call checks whether
 * a runtime is loaded now and, if so, wakes the registration thread to look
 * for a context. One load when nothing waits. */
void runtime_notice_gpu_slow(void);
static inline void runtime_notice_gpu(void)
{
    if (__builtin_expect(engine_has_pending(&runtime_engine), 0))
        runtime_notice_gpu_slow();
}

#endif
