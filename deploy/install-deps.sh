#!/usr/bin/env bash
# Installs, from Debian 12's packages, whatever eldr needs that this machine does not have yet.
# Idempotent and quick when everything is present: it asks dpkg first and calls apt only for
# what is missing. Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  # toolchain
  g++ cmake ninja-build make pkg-config git clang clang-format libclang-rt-14-dev lld
  # libraries (see ../shared/reference/toolchain-notes.md for what each is for)
  libcaf-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev librocksdb-dev libspdlog-dev libfmt-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libgtest-dev libbenchmark-dev
  # OpenSSL's headers (actors/tls_error_queue.cpp) and its CLI (the TLS tests' certificates)
  libssl-dev openssl
  # HTTP client for scraping vLLM's /metrics (the load monitor)
  libcpp-httplib-dev
  # Python peers used by integration tests and the Python client (Debian's /usr/bin/python3)
  python3 python3-zmq python3-msgpack python3-numpy python3-yaml
  # eldr-proxy, eldr-record and the fake vLLM engines of the tests (asyncio HTTP)
  python3-aiohttp
  # eldr-proxy: vLLM's sha256_cbor prefix-caching block hash (the same CBOR library vLLM uses)
  python3-cbor2
  # eldr-proxy's HTTP client to the vLLM instances parses their answers with it (http-parser)
  python3-httptools
  # installing the Python packages offline (pyproject.toml, README "Python packages"): a venv
  # with --system-site-packages, pip --no-build-isolation with Debian's setuptools and wheel
  python3-venv python3-pip python3-setuptools python3-wheel
  # plots
  gnuplot-nox
  # the operator page's test and screenshot (tests/integration/py/operator_page_test.py)
  chromium
  # cpack -G DEB (cmake/EldrPackage.cmake): dpkg-shlibdeps for Depends, file to find the programs
  dpkg-dev file
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
