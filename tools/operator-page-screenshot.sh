#!/bin/sh
# Re-makes docs/img/operator-page.png: the operator page of a live eldr-node under eldr-loadgen
# traffic, in Debian's headless chromium at 1400x1000 (docs/operations.md, "The operator page").
# The node, the loadgen and the checks are the integration test's
# (tests/integration/py/operator_page_test.py); the picture is taken once its checks pass.
#
#   tools/operator-page-screenshot.sh [BUILD_DIR]      (default: build)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-"$here/build"}
exec /usr/bin/python3 "$here/tests/integration/py/operator_page_test.py" --build-dir "$build" \
  --screenshot "$here/docs/img/operator-page.png" --no-cluster
