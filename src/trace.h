/* NVTX ranges (issue 29): each registration and unregistration the shim
 * makes, and each wait of a program's call for one, is a range in the NVTX
 * domain "pinshim", on the thread that does it, so that Nsight Systems shows
 * what a gap in a thread's row was. The NVTX v3 headers are header-only: no
 * library is linked, and NVTX loads a tool only when NVTX_INJECTION64_PATH
 * names one; without one a range costs a load and a compare (nothing is
 * formatted).
 * The headers are kept in third_party/nvtx3. Turned off (PINSHIM_NVTX=0,
 * secure-execution mode), every call here does nothing.
 *
 * Call without the engine's mutex held: a tool may allocate, map or free
 * memory, which the shim's own definitions see. Ranges are made with the
 * reentrancy guard held, so those calls go straight to the real functions. */
#ifndef PINSHIM_TRACE_H
#define PINSHIM_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Once, at load: whether ranges are made at all. */
void trace_configure(bool on);
bool trace_enabled(void);

/* Starts a range "<what> <size> (<cause>)" ("register 8.0 MiB (mlock)") on
 * the calling thread; returns whether one was started, to pass to
 * trace_end. */
bool trace_begin(const char *what, uint64_t bytes, const char *cause);
void trace_end(bool started);

#endif
