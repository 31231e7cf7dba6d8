#!/usr/bin/python3
"""Integration test of the Python packaging: the documented offline install (README.md, "Python
packages") into a fresh venv that sees Debian's packages, then the modules and console scripts
used from that venv, away from the source tree.

    python_packaging_test.py          # exit 0 when it passes

What it runs is the README's command, with the venv's pip:
    python3 -m venv --system-site-packages VENV
    VENV/bin/pip install --no-index --no-build-isolation ./cluster/python ./tools/eldr-record
        ./tools/eldr-proxy       (once tools/eldr-proxy/eldr_proxy.py exists)
Machine-wide pip settings (PIP_* variables, pip.conf) are ignored, so the result does not depend
on this machine's configuration. Needs Debian's python3-venv, python3-pip, python3-setuptools,
python3-wheel (deploy/install-deps.sh).
"""
import glob
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLIENT = os.path.join(ROOT, "cluster", "python")
TOOLS = [os.path.join(ROOT, "tools", name) for name in ("eldr-record", "eldr-proxy")]


def clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env.pop("PYTHONPATH", None)
    return env


def build_leftovers():
    """Build output pip/setuptools could leave in the source folders."""
    found = []
    for folder in [CLIENT] + TOOLS:
        for pattern in ("build", "dist", "*.egg-info", "__pycache__", "*/__pycache__"):
            found += glob.glob(os.path.join(folder, pattern))
    return sorted(found)


class PackagingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmpdir = tempfile.TemporaryDirectory(prefix="eldr-pkg-test-")
        cls.venv = os.path.join(cls.tmpdir.name, "venv")
        cls.before = build_leftovers()
        r = subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", cls.venv],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise AssertionError("python3 -m venv failed (is python3-venv installed? "
                                 "deploy/install-deps.sh):\n" + r.stderr)
        # A tool is installed once its code is there (tools/eldr-proxy's packaging may come
        # before its code: then it is left out rather than installed empty).
        cls.packages = [CLIENT] + [t for t in TOOLS if os.path.exists(
            os.path.join(t, os.path.basename(t).replace("-", "_") + os.extsep + "py")) or
            os.path.isdir(os.path.join(t, os.path.basename(t).replace("-", "_")))]
        cls.install = subprocess.run(
            [os.path.join(cls.venv, "bin", "pip"), "install", "--no-index",
             "--no-build-isolation"] + cls.packages,
            capture_output=True, text=True, timeout=600, cwd=cls.tmpdir.name, env=clean_env())

    @classmethod
    def tearDownClass(cls):
        cls.tmpdir.cleanup()

    def venv_python(self, code):
        return subprocess.run([os.path.join(self.venv, "bin", "python"), "-c", code],
                              capture_output=True, text=True, timeout=120,
                              cwd=self.tmpdir.name, env=clean_env())

    def test_every_package_has_the_projects_version(self):
        """One version: CMake's project(VERSION) (core/base/version.hpp) is every package's."""
        with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
            cmake = re.search(r"project\(eldr VERSION ([0-9.]+)", f.read()).group(1)
        for folder in [CLIENT] + TOOLS:
            with open(os.path.join(folder, "pyproject.toml")) as f:
                got = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
            self.assertEqual(got, cmake, folder)

    def test_install_succeeds_offline_and_leaves_the_tree_clean(self):
        self.assertEqual(self.install.returncode, 0,
                         self.install.stdout + self.install.stderr)
        self.assertIn("Successfully installed", self.install.stdout)
        self.assertEqual(build_leftovers(), self.before)

    def test_every_client_module_is_installed(self):
        """Every eldr_*.py of cluster/python, including ones added later, comes from the venv."""
        self.assertEqual(self.install.returncode, 0, self.install.stderr)
        modules = sorted(os.path.basename(p)[:-3]
                         for p in glob.glob(os.path.join(CLIENT, "eldr_*.py")))
        self.assertIn("eldr_client", modules)
        self.assertIn("eldr_trace", modules)
        code = ("import importlib\n"
                "for m in %r + ['eldr_record']:\n"
                "    print(m, importlib.import_module(m).__file__)\n" % modules)
        r = self.venv_python(code)
        self.assertEqual(r.returncode, 0, r.stderr)
        site = os.path.join(self.venv, "lib")
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), len(modules) + 1)
        for line in lines:
            name, path = line.split(" ", 1)
            self.assertTrue(path.startswith(site), "%s imported from %s, not the venv"
                            % (name, path))

    def test_console_scripts(self):
        self.assertEqual(self.install.returncode, 0, self.install.stderr)
        scripts = [os.path.basename(p) for p in self.packages if p != CLIENT]
        self.assertIn("eldr-record", scripts)
        for script in scripts:
            r = subprocess.run([os.path.join(self.venv, "bin", script), "--help"],
                               capture_output=True, text=True, timeout=120,
                               cwd=self.tmpdir.name, env=clean_env())
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("usage: %s" % script, r.stdout)


if __name__ == "__main__":
    unittest.main()
