#!/usr/bin/python3
"""Integration test of the installed C++ client library: `cmake --install BUILD --prefix TMP
--component dev`, then a project outside the tree (tests/integration/client_package/) configured
with find_package(eldr CONFIG REQUIRED) against TMP, built under eldr's own warning flags
(cmake/EldrWarnings.cmake, -Werror), and run against a real eldr-node.

    client_package_test.py --build-dir BUILD --source-dir SRC    # 0 passes, 77 = skipped

The consumer compiles README.md's C++ client snippet verbatim: the ```cpp block between the
markers <!-- cpp-client-snippet:begin --> and <!-- cpp-client-snippet:end -->, so the README
cannot drift from what compiles. Nothing of BUILD is rebuilt; the consumer is small.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "py"))
import eldr_testing  # noqa: E402

BUILD = SRC = None
BEGIN = "<!-- cpp-client-snippet:begin -->"
END = "<!-- cpp-client-snippet:end -->"


def run(argv, timeout=300, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, **kw)


def readme_snippet():
    text = Path(os.path.join(SRC, "README.md")).read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "README.md: snippet markers"
    block = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    m = re.fullmatch(r"\s*```cpp\n(.*?)```\s*", block, re.S)
    assert m, "README.md: the markers must enclose exactly one ```cpp block"
    return m.group(1)


class ClientPackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="eldr-client-pkg-")
        cls.prefix = os.path.join(cls.tmp.name, "prefix")
        r = run(["cmake", "--install", BUILD, "--prefix", cls.prefix, "--component", "dev"])
        if r.returncode != 0:
            raise AssertionError(f"cmake --install failed:\n{r.stdout}\n{r.stderr}")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_installed_files_are_relocatable(self):
        cmake_dir = os.path.join(self.prefix, "lib", "cmake", "eldr")
        for name in ("eldrConfig.cmake", "eldrConfigVersion.cmake", "eldr-targets.cmake"):
            self.assertTrue(os.path.isfile(os.path.join(cmake_dir, name)), name)
        for name in os.listdir(cmake_dir):
            text = Path(os.path.join(cmake_dir, name)).read_text()
            for tree in (os.path.realpath(BUILD), os.path.realpath(SRC)):
                self.assertNotIn(tree, text, f"{name} names the build or source tree")
        self.assertTrue(os.path.isfile(os.path.join(self.prefix, "include", "eldr", "cluster",
                                                    "zmq", "client.hpp")))
        # Every header an installed header includes is installed too.
        inc = os.path.join(self.prefix, "include", "eldr")
        for d, _, names in os.walk(inc):
            for n in names:
                for dep in re.findall(r'^#include "([^"]+)"', Path(os.path.join(d, n)).read_text(),
                                      re.M):
                    self.assertTrue(os.path.isfile(os.path.join(inc, dep)),
                                    f"{os.path.join(d, n)} includes {dep}, not installed")

    def test_readme_snippet_builds_and_the_consumer_routes(self):
        src = os.path.join(self.tmp.name, "consumer")
        shutil.copytree(os.path.join(SRC, "tests", "integration", "client_package"), src)
        with open(os.path.join(src, "readme_snippet.inc"), "w") as f:
            f.write(readme_snippet())
        build = os.path.join(self.tmp.name, "consumer-build")
        configure = ["cmake", "-S", src, "-B", build, f"-DCMAKE_PREFIX_PATH={self.prefix}",
                     f"-DELDR_WARNINGS={os.path.join(SRC, 'cmake', 'EldrWarnings.cmake')}",
                     "-DCMAKE_BUILD_TYPE=RelWithDebInfo"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        r = run(configure)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = run(["cmake", "--build", build])
        # -Werror: a warning in the README's snippet fails here, with the compiler's words.
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("warning:", r.stdout + r.stderr)
        consumer = os.path.join(build, "consumer")

        node = os.path.join(BUILD, "tools", "eldr-node", "eldr-node")
        if not os.access(node, os.X_OK):
            self.skipTest("eldr-node is not built: the consumer built, not run")
        proc = subprocess.Popen(
            eldr_testing.loopback_node_argv(node, os.path.join(self.tmp.name, "data"), metrics=""),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            stdin=subprocess.DEVNULL)
        try:
            ready = eldr_testing.ready_from_lines(proc.stdout)  # its log comes first
            self.assertIn("route", ready, "eldr-node did not start")
            r = run([consumer, ready["route"], ready["worker"]], timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("routed consumer-1 to worker 0 at tcp://10.0.0.3:5600", r.stdout)
        finally:
            eldr_testing.stop_process(proc, timeout=30)
            proc.stdout.close()
        self.assertEqual(proc.returncode, 0)


def main():
    global BUILD, SRC
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--source-dir", required=True)
    args, rest = parser.parse_known_args()
    BUILD, SRC = os.path.abspath(args.build_dir), os.path.abspath(args.source_dir)
    for lib in ("core/libeldr_core.a", "cluster/libeldr_client.a"):
        if not os.path.isfile(os.path.join(BUILD, lib)):
            print(f"SKIP: {lib} is not built", file=sys.stderr)
            return 77
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
