#include "reentry_guard.h"

__thread int reentry_guard_depth __attribute__((tls_model("initial-exec")));
