# Warnings (errors by default) and sanitizers for every eldr target.
add_compile_options(-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
                    -Wcast-align -Wunused -Woverloaded-virtual
                    -Wimplicit-fallthrough)
if(ELDR_WERROR)
  add_compile_options(-Werror)
endif()
if(ELDR_SANITIZE)
  add_compile_options(-fsanitize=${ELDR_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${ELDR_SANITIZE})
endif()
