/* What the interposition layer's files share (interpose.c and
 * interpose_delete.c); nothing else includes this. */
#ifndef PINSHIM_INTERPOSE_INTERNAL_H
#define PINSHIM_INTERPOSE_INTERNAL_H

/* free's checks and release for the block at ptr, with the call that frees
 * it given (run(arguments)): run straight away when the block holds no
 * registered page, else inside the engine's release, after the pages are
 * unregistered. */
void interpose_release_block(void *ptr, long (*run)(void *), void *arguments);

/* The shim's free, for a delete whose next definition cannot be found. */
void interpose_free(void *ptr);

#endif
