# Warnings (errors by default) and sanitizers for every eldr target.
add_compile_options(-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
                    -Wcast-align -Wunused -Woverloaded-virtual
                    -Wimplicit-fallthrough)
if(ELDR_WERROR)
  add_compile_options(-Werror)
endif()
# GCC 12 at -O3 reports -Wrestrict inside libstdc++'s own string concatenation (GCC bug 105329,
# fixed in GCC 13): a false positive in code that is not ours. Off there, not just demoted: as a
# warning it printed eight screens of libstdc++ internals into a new user's first command
# (deploy/quickstart.sh's Release build on Debian 12).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  add_compile_options(-Wno-restrict)
endif()
if(ELDR_SANITIZE)
  add_compile_options(-fsanitize=${ELDR_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${ELDR_SANITIZE})
endif()
