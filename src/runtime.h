/* Runtime: the process-wide shim state (configuration, engine, CUDA backend)
 * and its lifecycle: load, fork, exit. The interposition layer calls in here. */
#ifndef PINSHIM_RUNTIME_H
#define PINSHIM_RUNTIME_H

#include "engine.h"
#include "options.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PINSHIM_INTERNAL __attribute__((visibility("hidden")))

/* Depth of the shim's own calls into the CUDA runtime and dlopen on this
 * thread: calls made meanwhile go straight to the real functions. */
extern __thread int runtime_guard_depth __attribute__((tls_model("initial-exec")));

static inline bool runtime_guarded(void)
{
    return runtime_guard_depth != 0;
}
static inline void runtime_guard_enter(void)
{
    runtime_guard_depth++;
}
static inline void runtime_guard_leave(void)
{
    runtime_guard_depth--;
}

extern struct engine runtime_engine PINSHIM_INTERNAL;
/* The engine's free gate (struct engine_free_view), kept in a variable of its
 * own: free compares against it without first forming the engine's address. */
extern uintptr_t runtime_free_gate PINSHIM_INTERNAL;
/* Where free and realloc learn a block's end (enum block_extent_source): set
 * once by the interposition layer at the first lock that may register, read
 * on the hot path. runtime_block_extent_state: 0 not chosen, 1 being chosen,
 * 2 chosen (a fork child whose parent was choosing starts again at 0). */
extern int runtime_block_extent_source;
extern int runtime_block_extent_state;
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

/* Counts an mlockall (logged once at info level) and remembers its flags when
 * it succeeded; runtime_note_munlockall forgets them. */
void runtime_note_mlockall(int flags, int result);
void runtime_note_munlockall(int result);

/* The live record (runtime_live.c): made at the process's first lock call,
 * which runtime_count_lock_call counts (one relaxed load after that). */
extern int runtime_live_state;
void runtime_live_record_start(void);
void runtime_live_record_exiting(void);
/* At a clean end (ended_by "exit" or "_exit"); statistics_kept: the JSON
 * statistics file was written. */
void runtime_live_record_finish(const char *ended_by, bool statistics_kept);
void runtime_live_record_after_fork_child(void);
bool runtime_is_fork_child(void);

/* Makes the live record at the process's first lock call (mlock, mlock2,
 * MAP_LOCKED, mlockall, a lock made by CUDA itself); one relaxed load after. */
static inline void runtime_live_record_start_once(void)
{
    if (__builtin_expect(__atomic_load_n(&runtime_live_state, __ATOMIC_RELAXED) == 0, 0))
        runtime_live_record_start();
}

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

/* Locked ranges wait for the program's CUDA context (PINSHIM_CONTEXT=program):
 * at most every 10 ms, a shim call checks whether a CUDA driver is loaded now
 * and, if so, wakes the registration thread to look for a context. One load
 * when nothing waits. */
void runtime_notice_cuda_slow(void);
static inline void runtime_notice_cuda(void)
{
    if (__builtin_expect(engine_has_pending(&runtime_engine), 0))
        runtime_notice_cuda_slow();
}

#endif
