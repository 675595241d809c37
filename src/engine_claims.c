/* Claims and operations: every entry point claims the pages it will touch,
 * and claims on overlapping pages wait for each other, so no two operations
 * interleave on a page. An operation begins holding the engine's mutex,
 * drops it around each real call and backend call, and ends by dropping its
 * claim. */
#include "engine_internal.h"
#include "trace.h"

#include <errno.h>

bool engine_ranges_overlap(uintptr_t a_start, uintptr_t a_end, uintptr_t b_start, uintptr_t b_end)
{
    return a_start < b_end && b_start < a_end;
}

static bool claims_conflict_locked(const struct engine *engine, const uintptr_t *starts,
                                   const uintptr_t *ends, unsigned count, int ignore_slot)
{
    uint64_t taken = engine->claims_taken;
    if (ignore_slot >= 0)
        taken &= ~((uint64_t)1 << ignore_slot);
    for (; taken != 0; taken &= taken - 1) {
        const struct engine_claim *claim = &engine->claims[__builtin_ctzll(taken)];
        for (unsigned i = 0; i < claim->count; i++)
            for (unsigned j = 0; j < count; j++)
                if (engine_ranges_overlap(claim->start[i], claim->end[i], starts[j], ends[j]))
                    return true;
    }
    return false;
}

/* The call the calling thread's operation serves ("mlock", "free"), for the
 * NVTX ranges of the registrations it makes (initial-exec: no allocation
 * at a thread's first access). */
static __thread const char *thread_cause __attribute__((tls_model("initial-exec")));

const char *engine_thread_cause(void)
{
    return thread_cause;
}

/* Ends an NVTX range begun with the mutex held, dropping it for the call. */
static void trace_end_unlocked(struct engine *engine, bool traced)
{
    if (!traced)
        return;
    pthread_mutex_unlock(&engine->mutex);
    trace_end(true);
    pthread_mutex_lock(&engine->mutex);
}

/* Waits until no other operation claims any page of the ranges, then claims
 * them (widened to the whole runs around their ends when extend is set). Returns false, with
 * nothing claimed, at shut-down when give_up_at_shutdown is set. */
bool engine_claim_locked(struct engine_op *op, const uintptr_t *starts, const uintptr_t *ends,
                         unsigned count, bool extend, bool give_up_at_shutdown)
{
    struct engine *engine = op->engine;
    bool traced = false;      /* an NVTX range spans the wait, once it waits */
    bool trace_asked = false; /* asked once: no tool answers false every time */
    for (;;) {
        if (give_up_at_shutdown && engine->shut_down) {
            trace_end_unlocked(engine, traced);
            return false;
        }
        uintptr_t wanted_start[2], wanted_end[2];
        for (unsigned i = 0; i < count; i++) {
            wanted_start[i] = starts[i];
            wanted_end[i] = ends[i];
            if (extend)
                engine_extend_to_runs_locked(engine, &wanted_start[i], &wanted_end[i]);
        }
        uint64_t taken = engine->claims_taken;
        int free_slot = taken == UINT64_MAX ? -1 : __builtin_ctzll(~taken);
        if (free_slot >= 0 &&
            !claims_conflict_locked(engine, wanted_start, wanted_end, count, -1)) {
            struct engine_claim *claim = &engine->claims[free_slot];
            for (unsigned i = 0; i < count; i++) {
                claim->start[i] = wanted_start[i];
                claim->end[i] = wanted_end[i];
            }
            claim->count = count;
            engine->claims_taken |= (uint64_t)1 << free_slot;
            op->slot = free_slot;
            trace_end_unlocked(engine, traced);
            return true;
        }
        if (!trace_asked && trace_enabled()) {
            /* The range starts before the wait; the mutex is dropped for it
             * (a tool may call back into the shim), so look again first. */
            uint64_t bytes = 0;
            for (unsigned i = 0; i < count; i++)
                bytes += ends[i] - starts[i];
            trace_asked = true;
            pthread_mutex_unlock(&engine->mutex);
            traced = trace_begin("wait for another registration over", bytes, thread_cause);
            pthread_mutex_lock(&engine->mutex);
            continue;
        }
        pthread_cond_wait(&engine->changed, &engine->mutex);
    }
}

/* Adds [start, end) to the op's claim when no other operation claims any of
 * it; never waits (the op already holds pages). False when it cannot. */
bool engine_claim_more_locked(struct engine_op *op, uintptr_t start, uintptr_t end)
{
    struct engine *engine = op->engine;
    struct engine_claim *claim = &engine->claims[op->slot];
    if (claim->count >= 2 || claims_conflict_locked(engine, &start, &end, 1, op->slot))
        return false;
    claim->start[claim->count] = start;
    claim->end[claim->count] = end;
    claim->count++;
    return true;
}

bool engine_op_claims(const struct engine_op *op, uintptr_t start, uintptr_t end)
{
    if (op->slot < 0)
        return false;
    const struct engine_claim *claim = &op->engine->claims[op->slot];
    for (unsigned i = 0; i < claim->count; i++)
        if (claim->start[i] <= start && end <= claim->end[i])
            return true;
    return false;
}

void engine_drop_claim_locked(struct engine_op *op)
{
    struct engine *engine = op->engine;
    engine->claims[op->slot].count = 0;
    engine->claims_taken &= ~((uint64_t)1 << op->slot);
    op->slot = -1;
    pthread_cond_broadcast(&engine->changed);
}

/* ---- operations: begin and end ---- */

/* Cancellation is off for the whole operation: the engine waits on condition
 * variables (cancellation points that free and munlock must not have), and a
 * thread cancelled there would die holding the mutex or a claim. */
void engine_op_begin(struct engine_op *op, struct engine *engine, const char *cause)
{
    thread_cause = cause;
    op->engine = engine;
    op->slot = -1;
    op->start_worker = false;
    op->program_errno = errno;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &op->cancel_state);
    pthread_mutex_lock(&engine->mutex);
}

void engine_op_end(struct engine_op *op)
{
    struct engine *engine = op->engine;
    if (op->slot >= 0)
        engine_drop_claim_locked(op);
    pthread_mutex_unlock(&engine->mutex);
    if (op->start_worker && engine->backend->wake_worker != NULL)
        engine->backend->wake_worker(engine->backend->context);
    int ignored;
    pthread_setcancelstate(op->cancel_state, &ignored);
    thread_cause = NULL;
}

/* Runs the real call with the mutex dropped and the program's errno in place;
 * returns its result and leaves its errno in *call_errno. */
long engine_op_run(struct engine_op *op, const struct engine_call *call, int *call_errno)
{
    pthread_mutex_unlock(&op->engine->mutex);
    errno = op->program_errno;
    long result = call->run(call->arguments);
    *call_errno = errno;
    pthread_mutex_lock(&op->engine->mutex);
    return result;
}

/* Work for the registration thread was added: wake it, or have the op start
 * one once it has dropped the mutex. */
void engine_want_worker_locked(struct engine_op *op)
{
    struct engine *engine = op->engine;
    if (engine->worker_active) {
        pthread_cond_broadcast(&engine->changed);
        return;
    }
    engine->worker_active = true;
    op->start_worker = true;
}
