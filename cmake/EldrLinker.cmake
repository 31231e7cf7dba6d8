# The linker: LLVM's lld when the machine has it (deploy/install-deps.sh installs it). It links
# the hundred-odd test programs faster than GNU ld (one relink of integration_cluster_test by hand,
# on a loaded machine: 1.5 s against 2.8 s; not a benchmark of the repo), and linking was about a
# tenth of a clean build's compile time in CI's ninja log, which CI's budget feels.
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
