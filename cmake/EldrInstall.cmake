# What `cmake --install` puts where (docs/operations.md, "Installing"), by component:
#   node     bin/eldr-node, bin/eldrctl                                (the Docker image's part)
#   tools    bin/eldr-fit, eldr-sim, eldr-loadgen, eldr-sigcache
#   python   lib/python3/dist-packages/ (eldr-client, eldr-record, eldr-proxy as plain modules,
#            and libeldr_counts_native.so beside them, which eldr_proxy_native.py loads) and
#            their launchers bin/eldr-record, bin/eldr-proxy
#   systemd  lib/systemd/system/eldr-node{,@}.service, eldr-proxy@.service, lib/sysusers.d/eldr.conf
#   doc      share/doc/eldr/ (README.md, docs/*.md, eldr-node.example.toml)
#   dev      include/eldr/, lib/libeldr_{core,client}.a, lib/cmake/eldr/ (find_package(eldr))
# With CMAKE_INSTALL_PREFIX=/usr the paths are the ones deploy/systemd and deploy/docker name
# (/usr/bin/eldr-node, /usr/share/doc/eldr/...); cmake/EldrPackage.cmake makes the .deb of them.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

foreach(program IN ITEMS eldr-node eldrctl)
  if(TARGET ${program})
    install(TARGETS ${program} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT node)
  endif()
endforeach()
foreach(program IN ITEMS eldr-fit eldr-sim eldr-loadgen eldr-sigcache)
  if(TARGET ${program})
    install(TARGETS ${program} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
  endif()
endforeach()

# Python: Debian's system Python reads /usr/lib/python3/dist-packages; the launchers also add
# their own prefix's folder, so that an install under another prefix runs as it is.
set(ELDR_PYTHON_DIR "lib/python3/dist-packages"
    CACHE STRING "where the Python modules go, relative to the prefix")
file(GLOB eldr_client_py ${PROJECT_SOURCE_DIR}/cluster/python/eldr_*.py)
file(GLOB eldr_proxy_py ${PROJECT_SOURCE_DIR}/tools/eldr-proxy/eldr_proxy*.py)
file(GLOB eldr_record_py ${PROJECT_SOURCE_DIR}/tools/eldr-record/eldr_record/*.py)
install(FILES ${eldr_client_py} ${eldr_proxy_py} DESTINATION ${ELDR_PYTHON_DIR} COMPONENT python)
install(FILES ${eldr_record_py} DESTINATION ${ELDR_PYTHON_DIR}/eldr_record COMPONENT python)
# eldr-proxy's compiled counts conversion, beside eldr_proxy_native.py, which looks for it there.
if(TARGET eldr_counts_native)
  install(TARGETS eldr_counts_native LIBRARY DESTINATION ${ELDR_PYTHON_DIR} COMPONENT python)
endif()
file(RELATIVE_PATH ELDR_BIN_TO_PYTHON "/p/${CMAKE_INSTALL_BINDIR}" "/p/${ELDR_PYTHON_DIR}")
foreach(script IN ITEMS eldr_record eldr_proxy)
  string(REPLACE "_" "-" ELDR_LAUNCHER_NAME ${script})
  set(ELDR_LAUNCHER_MODULE ${script})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/python-launcher.in
                 ${PROJECT_BINARY_DIR}/launchers/${ELDR_LAUNCHER_NAME} @ONLY)
  install(PROGRAMS ${PROJECT_BINARY_DIR}/launchers/${ELDR_LAUNCHER_NAME}
          DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT python)
endforeach()

# systemd: units and the system user (deploy/systemd/*.service name /usr/bin/eldr-node).
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/eldr-node.service
              ${PROJECT_SOURCE_DIR}/deploy/systemd/eldr-node@.service
              ${PROJECT_SOURCE_DIR}/deploy/systemd/eldr-proxy@.service
        DESTINATION lib/systemd/system COMPONENT systemd)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/eldr.sysusers.conf DESTINATION lib/sysusers.d
        RENAME eldr.conf COMPONENT systemd)

# Documentation, flat (the units' Documentation= is file:///usr/share/doc/eldr/configuration.md),
# with the example configuration beside it.
file(GLOB eldr_docs ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/BENCHMARKS.md ${eldr_docs}
              ${PROJECT_SOURCE_DIR}/deploy/eldr-node.example.toml
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT doc)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/evaluation DESTINATION ${CMAKE_INSTALL_DOCDIR}
        COMPONENT doc)

# The C++ client library: find_package(eldr CONFIG REQUIRED), then link eldr::client.
if(TARGET eldr_client)
  # Headers keep their folders under include/eldr/, so that an include line reads the same in
  # the tree and installed. core/sim/ (the simulation sub-library) is not part of the client.
  file(GLOB_RECURSE eldr_core_headers RELATIVE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/core/*.hpp)
  list(FILTER eldr_core_headers EXCLUDE REGEX "^core/sim/")
  foreach(header IN LISTS eldr_core_headers ELDR_CLIENT_HEADERS)
    cmake_path(ABSOLUTE_PATH header BASE_DIRECTORY ${PROJECT_SOURCE_DIR})
    cmake_path(RELATIVE_PATH header BASE_DIRECTORY ${PROJECT_SOURCE_DIR} OUTPUT_VARIABLE header_rel)
    cmake_path(GET header_rel PARENT_PATH header_dir)
    install(FILES ${header}
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/eldr/${header_dir} COMPONENT dev)
  endforeach()
  install(TARGETS eldr_core eldr_client EXPORT eldr-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
  set(ELDR_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/eldr)
  install(EXPORT eldr-targets NAMESPACE eldr:: DESTINATION ${ELDR_CMAKE_DIR} COMPONENT dev)
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/eldrConfig.cmake.in
                                ${PROJECT_BINARY_DIR}/eldrConfig.cmake
                                INSTALL_DESTINATION ${ELDR_CMAKE_DIR})
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/eldrConfigVersion.cmake
                                   COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/eldrConfig.cmake ${PROJECT_BINARY_DIR}/eldrConfigVersion.cmake
          DESTINATION ${ELDR_CMAKE_DIR} COMPONENT dev)
endif()
