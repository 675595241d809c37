/* What the Level Zero backend takes from the interposed zeInit
 * (ze_interpose.c), beside the vendor seam. */
#ifndef PINSHIM_ZE_BACKEND_H
#define PINSHIM_ZE_BACKEND_H

#include <stdbool.h>

/* The program's zeInit succeeded: Level Zero is started. */
void ze_backend_note_started(void);

/* The program's zeInit failed with code: unless it had succeeded before,
 * the backend calls Level Zero no more (ze_backend.c says why). */
void ze_backend_note_start_failed(int code);

/* Whether driver (the driver's own handle, as the import functions take
 * it) is the one the shim imports on: a program's import on another driver
 * is none of the shim's business. Looks for the shim's driver once the
 * program's start was seen; called with the reentrancy guard held. */
bool ze_backend_is_shim_driver(const void *driver);

#endif
