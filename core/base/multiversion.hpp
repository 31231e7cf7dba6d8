// multiversion: ELDR_MULTIVERSION marks a hot kernel to be compiled twice, for x86-64-v3 (AVX2
// and FMA together) and for the baseline, with the loader picking the clone the CPU supports.
//
// Sanitizer runtimes start after ifunc resolvers would run, and clang lacks target_clones on
// this toolchain, so those builds use the baseline only.
#pragma once

#if defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define ELDR_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ELDR_MULTIVERSION
#endif
