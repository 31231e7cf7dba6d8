# The Debian package: `cd build && cpack -G DEB` makes eldr_VERSION_ARCH.deb of everything
# `cmake --install` puts under /usr (cmake/EldrInstall.cmake). The version is the project's one
# (project(VERSION), core/base/version.hpp); Depends comes from dpkg-shlibdeps on the programs, plus
# the Debian packages the Python tools and the client library's CMake package need.
set(CPACK_PACKAGE_NAME eldr)
set(CPACK_PACKAGE_VENDOR "eldr")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "expert-locality request router for disaggregated Mixture-of-Experts serving")
set(CPACK_PACKAGE_DESCRIPTION
    "eldr routes each LLM request to the MoE decode worker whose expert centroid best matches\n\
the request's expert signature (ELDR, ACM ATC 2026). This package holds the router node\n\
(eldr-node) and its systemd units, the operator CLI (eldrctl), the offline tools (eldr-fit,\n\
eldr-sim, eldr-loadgen, eldr-sigcache), the Python clients and tools (eldr-record,\n\
eldr-proxy), the C++ client library with its CMake package (find_package(eldr)) and the\n\
documentation.")
set(CPACK_PACKAGE_CONTACT "eldr maintainers <maintainers@users.noreply.a-seed-edd15937.example>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES TRUE) # RelWithDebInfo programs are ~10x their stripped size
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Not found by shlibdeps: the Python tools' modules (README "Python packages") and what the
# installed eldr::client CMake package finds (cmake/eldrConfig.cmake.in).
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "python3 (>= 3.11), python3-zmq, python3-msgpack, python3-numpy, python3-aiohttp, python3-cbor2, python3-httptools")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "libzmq3-dev, cppzmq-dev, nlohmann-json3-dev, gnuplot-nox")
# The system user of the units (deploy/systemd/eldr.sysusers.conf), made at install.
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/deploy/debian/postinst)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
include(CPack)
