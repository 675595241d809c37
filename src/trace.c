#include "trace.h"

#include "log.h"
#include "reentry_guard.h"

#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdio.h>

static bool enabled;
static nvtxDomainHandle_t domain;
static pthread_once_t domain_once = PTHREAD_ONCE_INIT;

static void create_domain(void)
{
    /* The first NVTX call: NVTX reads NVTX_INJECTION64_PATH and, when it
     * names a tool, loads it. */
    domain = nvtxDomainCreateA("pinshim");
}

void trace_configure(bool on)
{
    enabled = on;
}

bool trace_enabled(void)
{
    return enabled;
}

bool trace_begin(const char *what, uint64_t bytes, const char *cause)
{
    if (!enabled)
        return false;
    reentry_guard_enter();
    pthread_once(&domain_once, create_domain);
    /* No tool took ranges (NVTX set its push to NULL at its first call):
     * nothing to format or call. The field is NVTX's own, in its header. */
    if (NVTX_VERSIONED_IDENTIFIER(nvtxGlobals).nvtxDomainRangePushEx_impl_fnptr == NULL) {
        reentry_guard_leave();
        return false;
    }
    char size[32], message[128];
    log_format_bytes(bytes, size, sizeof(size));
    snprintf(message, sizeof(message), "%s %s (%s)", what, size, cause != NULL ? cause : "?");
    nvtxEventAttributes_t attributes = {0};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attributes.message.ascii = message;
    nvtxDomainRangePushEx(domain, &attributes);
    reentry_guard_leave();
    return true;
}

void trace_end(bool started)
{
    if (!started)
        return;
    reentry_guard_enter();
    nvtxDomainRangePop(domain);
    reentry_guard_leave();
}
