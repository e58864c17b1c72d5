/* internal.h — what the library's own files share; not installed, not public: the base
 * helpers (errors, bf16, the seeded generator) and the CPU references' internals. */
#ifndef MJ_INTERNAL_H
#define MJ_INTERNAL_H

#include "base.h"
#include "ref/ref.h"

#endif /* MJ_INTERNAL_H */
