/* cmd_violation.c — a command file that includes an internal header of the library
 * directly: the ctest test tools_includes_violation checks that tests/check_tools_includes.cmake
 * names it (line 4). */
#include "jit.h"
#include "moejit_private.h"

#include <stdio.h>
