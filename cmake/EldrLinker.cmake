# The linker: LLVM's lld when the machine has it (deploy/install-deps.sh installs it). It links
# the hundred-odd test programs about twice as fast as GNU ld (integration_cluster_test: 1.5 s
# against 2.8 s), and linking is a fifth of a clean build's compile time, which CI's budget feels.
# ELDR_LINKER="" keeps the compiler's default linker.
include(CheckLinkerFlag)
set(ELDR_LINKER "lld" CACHE STRING "Linker passed as -fuse-ld= when it works (empty: the default)")
if(ELDR_LINKER)
  check_linker_flag(CXX "-fuse-ld=${ELDR_LINKER}" ELDR_LINKER_WORKS_${ELDR_LINKER})
  if(ELDR_LINKER_WORKS_${ELDR_LINKER})
    add_link_options("-fuse-ld=${ELDR_LINKER}")
  else()
    message(STATUS "eldr: -fuse-ld=${ELDR_LINKER} does not work here; the default linker links")
  endif()
endif()
