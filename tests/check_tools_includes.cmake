# check_tools_includes.cmake — the command (tools/) is a client of the library's public
# header and of runtime/moejit_private.h, nothing else: every #include of a file of TOOLS_DIR
# must be "moejit.h", "moejit_private.h", a header of TOOLS_DIR itself, or a system header
# (<...>) that is not one of the library's own headers. The command is compiled with the
# internal include directories (the private header needs them), so this is what keeps it to
# its interface. Fails (a FATAL_ERROR naming each file:line) on any other include.
#   cmake -DTOOLS_DIR=tools [-DSOURCE_DIR=.] -P tests/check_tools_includes.cmake
cmake_minimum_required(VERSION 3.20)
if(NOT TOOLS_DIR)
  message(FATAL_ERROR "usage: cmake -DTOOLS_DIR=DIR [-DSOURCE_DIR=DIR] -P check_tools_includes.cmake")
endif()
if(NOT SOURCE_DIR)
  get_filename_component(SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
endif()
# The library's include roots: a name found under one of them is a library header, however
# it is spelled ("jit.h", <jit.h>, "cuda/cudalibs.h"); the generated ones are named here.
set(roots base gen cache runtime include)
set(generated mj_kernels.h mj_registry.h mj_test_registry.h)
set(allowed moejit.h moejit_private.h)

file(GLOB files "${TOOLS_DIR}/*.c" "${TOOLS_DIR}/*.h")
if(NOT files)
  message(FATAL_ERROR "${TOOLS_DIR}: no .c or .h files to check")
endif()
set(bad "")
set(n_includes 0)
foreach(f ${files})
  get_filename_component(fname "${f}" NAME)
  file(READ "${f}" text)
  file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*([\"<])([^\">]+)[\">]")
      continue()
    endif()
    set(quote "${CMAKE_MATCH_1}")
    set(name "${CMAKE_MATCH_2}")
    # Its line number: the newlines before it, plus one.
    string(FIND "${text}" "${line}" at)
    string(SUBSTRING "${text}" 0 ${at} before)
    string(REGEX MATCHALL "\n" newlines "${before}")
    list(LENGTH newlines lineno)
    math(EXPR lineno "${lineno} + 1")
    math(EXPR n_includes "${n_includes} + 1")
    if(name IN_LIST allowed)
      continue()
    endif()
    if(quote STREQUAL "\"" AND NOT name MATCHES "/" AND EXISTS "${TOOLS_DIR}/${name}")
      continue() # a header of tools/ itself
    endif()
    set(library FALSE)
    if(name IN_LIST generated)
      set(library TRUE)
    endif()
    foreach(root ${roots})
      if(EXISTS "${SOURCE_DIR}/${root}/${name}")
        set(library TRUE)
      endif()
    endforeach()
    if(quote STREQUAL "<" AND NOT library)
      continue() # a system header
    endif()
    string(APPEND bad "\n  ${fname}:${lineno} includes ${quote}${name}${quote}")
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "tools/ reaches the library through moejit.h and moejit_private.h only "
                      "(runtime/moejit_private.h lists what it may use; add a declaration or an include "
                      "there, with its reason, instead):${bad}")
endif()
list(LENGTH files n_files)
message(STATUS "${n_files} files of ${TOOLS_DIR}, ${n_includes} includes: moejit.h, moejit_private.h, "
               "their own headers and system headers only")
