/* The engine tests' mock backends answer in codes of their own (CUDA's
 * numbers, so that messages read naturally) and turn them into the engine's
 * outcomes, as a vendor's backend does (src/vendor.h). */
#ifndef PINSHIM_TEST_MOCK_CODES_H
#define PINSHIM_TEST_MOCK_CODES_H

#include "engine.h"

enum { MOCK_OK = 0, MOCK_ALREADY_REGISTERED = 712, MOCK_NOT_REGISTERED = 713 };

static inline struct engine_result mock_result(int code)
{
    switch (code) {
    case MOCK_OK:
        return engine_result_of(ENGINE_OK, 0);
    case MOCK_ALREADY_REGISTERED:
        return engine_result_of(ENGINE_ALREADY_REGISTERED, code);
    case MOCK_NOT_REGISTERED:
        return engine_result_of(ENGINE_NOT_REGISTERED, code);
    default:
        return engine_result_of(ENGINE_FAILED, code);
    }
}

#endif
