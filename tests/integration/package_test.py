#!/usr/bin/python3
"""Integration test of the Debian package (cmake/EldrPackage.cmake) against the files that name
its paths: the systemd units (deploy/systemd) and the Docker image (deploy/docker).

    package_test.py --build-dir BUILD --source-dir SRC --cpack CPACK   # 0 passes, 77 = skipped

It runs `cpack -G DEB` on the already-built BUILD (into a temporary folder: the build dir is
left as it was; nothing is compiled) and checks:
  - dpkg-deb -I: Package eldr, Version = CMake's project(VERSION) (core/base/version.hpp's),
    Architecture = dpkg's, Maintainer, Description, Depends naming the Debian packages of the
    shared libraries the programs link (the Dockerfile's runtime packages among them) and the
    Python modules' packages;
  - dpkg-deb -c: every program of tools/ at /usr/bin; every absolute path the units' Exec lines
    run, the units' Documentation= file and the sysusers file their comments name; every file
    the Dockerfile's `cmake --install ... --component C` lines put in the image (installed here
    from BUILD the same way), at the same path; the Dockerfile ENTRYPOINT script's exec target;
  - the unpacked package works from where it is: every program's --help, eldr-node
    --check-config of its embedded default, and the Python launchers eldr-record --help and
    eldr-proxy --help (modules from the package only, run away from the source tree).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

BUILD = SRC = CPACK = None
PROGRAMS = ["eldr-node", "eldrctl", "eldr-fit", "eldr-sim", "eldr-loadgen", "eldr-sigcache"]
PY_PROGRAMS = ["eldr-record", "eldr-proxy"]


def run(argv, timeout=120, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, **kw)


def project_version():
    text = Path(os.path.join(SRC, "CMakeLists.txt")).read_text()
    m = re.search(r"project\(eldr VERSION (\d+\.\d+\.\d+)", text)
    assert m, "no project(eldr VERSION x.y.z) in CMakeLists.txt"
    return m.group(1)


def provides(package):
    """The virtual packages a Debian package provides (apt-cache, else dpkg), as names."""
    r = run(["apt-cache", "show", "--no-all-versions", package]) if shutil.which("apt-cache") \
        else None
    if r is None or r.returncode != 0 or not r.stdout.strip():
        r = run(["dpkg-query", "-W", "-f=Provides: ${Provides}\n", package])
    out = set()
    for line in r.stdout.splitlines():
        if line.startswith("Provides:"):
            out |= {x.strip().split()[0] for x in line[len("Provides:"):].split(",") if x.strip()}
    return out


def unit_exec_paths(unit_text):
    """Absolute program paths of a unit's Exec* lines (prefixes like - @ : + ! dropped)."""
    out = []
    for line in unit_text.splitlines():
        key, _, value = line.partition("=")
        if key.strip().startswith("Exec") and value.strip():
            out.append(value.strip().lstrip("-@:+!").split()[0])
    return out


def dockerfile_runs(text):
    """The RUN instructions with continuation lines joined, comment lines dropped."""
    runs, pending = [], None
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if pending is None:
            if not line.startswith("RUN "):
                continue
            pending = line[4:]
        else:
            pending += " " + line.strip()
        if pending.rstrip().endswith("\\"):
            pending = pending.rstrip()[:-1]
            continue
        runs.append(pending)
        pending = None
    return runs


class PackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="eldr-deb-test-")
        out = os.path.join(cls.tmp.name, "out")
        r = run([CPACK, "-G", "DEB", "--config", os.path.join(BUILD, "CPackConfig.cmake"),
                 "-B", out], timeout=600)
        if r.returncode != 0:
            raise AssertionError(f"cpack -G DEB failed:\n{r.stdout}\n{r.stderr}")
        debs = glob.glob(os.path.join(out, "*.deb"))
        if len(debs) != 1:
            raise AssertionError(f"expected one .deb in {out}: {debs}\n{r.stdout}")
        cls.deb = debs[0]
        r = run(["dpkg-deb", "-c", cls.deb])
        assert r.returncode == 0, r.stderr
        # "drwxr-xr-x root/root 0 2026-01-01 00:00 ./usr/bin/" -> "/usr/bin"; links keep "-> x".
        cls.contents = {}
        for line in r.stdout.splitlines():
            fields = line.split(None, 5)
            path = fields[5].split(" -> ")[0]
            cls.contents[path.lstrip(".").rstrip("/")] = fields[0]
        r = run(["dpkg-deb", "-I", cls.deb])
        assert r.returncode == 0, r.stderr
        cls.info = r.stdout
        cls.fields = dict(re.findall(r"^ ([A-Z][A-Za-z-]+): (.*)$", r.stdout, re.M))
        cls.root = os.path.join(cls.tmp.name, "root")
        r = run(["dpkg-deb", "-x", cls.deb, cls.root])
        assert r.returncode == 0, r.stderr

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_postinst_creates_the_user_the_units_run_as(self):
        # The package's own postinst, run as dpkg runs it for an install into another root
        # (DPKG_ROOT), twice (an upgrade configures again): it must create the system user and
        # group "eldr" with the units' home, once.
        if not shutil.which("systemd-sysusers"):
            self.fail("systemd-sysusers is missing (Debian's systemd package): the postinst needs it")
        control = os.path.join(self.tmp.name, "control")
        r = run(["dpkg-deb", "-e", self.deb, control])
        self.assertEqual(r.returncode, 0, r.stderr)
        postinst = os.path.join(control, "postinst")
        self.assertTrue(os.access(postinst, os.X_OK), "the package's postinst is not executable")
        root = os.path.join(self.tmp.name, "postinst-root")
        shutil.copytree(self.root, root, symlinks=True)
        os.makedirs(os.path.join(root, "etc"), exist_ok=True)
        env = dict(os.environ, DPKG_ROOT=root)
        for attempt in range(2):
            r = subprocess.run(["sh", postinst, "configure", ""], env=env, capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(r.returncode, 0, f"run {attempt}: {r.stderr}")
            self.assertNotIn("could not create", r.stderr)
        passwd = [l.split(":") for l in Path(root, "etc", "passwd").read_text().splitlines()]
        users = [u for u in passwd if u[0] == "eldr"]
        self.assertEqual(len(users), 1, passwd)
        uid, home = int(users[0][2]), users[0][5]
        self.assertLess(uid, 1000, "not a system user")
        unit = Path(SRC, "deploy", "systemd", "eldr-node.service").read_text()
        self.assertIn("User=eldr", unit)
        self.assertEqual(home, "/var/lib/eldr")
        groups = [g.split(":")[0] for g in Path(root, "etc", "group").read_text().splitlines()]
        self.assertEqual(groups.count("eldr"), 1, groups)

    def assert_in_package(self, path, why):
        self.assertIn(path, self.contents, f"{path} ({why}) is not in {os.path.basename(self.deb)}")

    def test_control_fields(self):
        f = self.fields
        self.assertEqual(f.get("Package"), "eldr")
        self.assertEqual(f.get("Version"), project_version())
        arch = run(["dpkg", "--print-architecture"]).stdout.strip()
        self.assertEqual(f.get("Architecture"), arch)
        self.assertRegex(f.get("Maintainer", ""), r"\S+ <[^@\s]+@[^>\s]+>")
        self.assertIn("expert-locality", f.get("Description", ""))
        self.assertIn("eldr-node", self.info, "the long description names the programs")
        depends = {d.strip().split()[0] for d in f.get("Depends", "").split(",") if d.strip()}
        # dpkg-shlibdeps found the shared libraries: those the Docker image installs for
        # eldr-node and eldrctl, and libc.
        docker = Path(os.path.join(SRC, "deploy", "docker", "Dockerfile")).read_text()
        runtime = docker[docker.rindex("FROM "):]
        m = re.search(r"apt-get install((?:\s+\\?\s*[^\s&;|\\]+)+)", runtime)
        self.assertIsNotNone(m, "no apt-get install in the Dockerfile's runtime stage")
        image_pkgs = [p for p in m.group(1).replace("\\", " ").split() if not p.startswith("-")]
        self.assertTrue(image_pkgs)
        for p in image_pkgs + ["libc6", "libstdc++6"]:
            # shlibdeps may name a virtual package the image's one provides (libspdlog1.10
            # provides libspdlog1.10-fmt9).
            names = {p} | provides(p)
            self.assertTrue(names & depends, f"Depends lacks {p}: {f.get('Depends')}")
        for p in ["python3", "python3-zmq", "python3-msgpack", "python3-aiohttp"]:
            self.assertIn(p, depends, f"Depends lacks {p}")

    def test_programs(self):
        for p in PROGRAMS + PY_PROGRAMS:
            self.assert_in_package("/usr/bin/" + p, "a program")
            self.assertTrue(self.contents["/usr/bin/" + p].startswith("-rwxr-xr-x"),
                            f"/usr/bin/{p}: {self.contents['/usr/bin/' + p]}")

    def test_systemd_units_paths(self):
        units = sorted(glob.glob(os.path.join(SRC, "deploy", "systemd", "*.service")))
        self.assertTrue(units)
        for unit in units:
            name = os.path.basename(unit)
            self.assert_in_package("/usr/lib/systemd/system/" + name, "a systemd unit")
            text = Path(unit).read_text()
            execs = unit_exec_paths(text)
            # A unit runs the program it is named after (eldr-node@.service: eldr-node).
            self.assertIn("/usr/bin/" + name.split("@")[0].split(".")[0], execs, name)
            for path in execs:
                self.assert_in_package(path, f"{name} Exec line")
            for doc in re.findall(r"^Documentation=file://(\S+)$", text, re.M):
                self.assert_in_package(doc, f"{name} Documentation=")
            for sysusers in re.findall(r"(/usr/lib/sysusers\.d/\S+)", text):
                self.assert_in_package(sysusers, f"{name}'s install comment")
        self.assert_in_package("/usr/share/doc/eldr/eldr-node.example.toml", "example config")

    def test_docker_image_paths(self):
        docker = Path(os.path.join(SRC, "deploy", "docker", "Dockerfile")).read_text()
        installs = []
        for r in dockerfile_runs(docker):
            installs += re.findall(r"cmake --install /build --prefix /out(\S+)((?: --\S+(?: \S+)?)*)",
                                   r)
        self.assertTrue(installs, "the Dockerfile should install with cmake --install")
        for prefix, opts in installs:
            comp = re.search(r"--component (\S+)", opts)
            self.assertIsNotNone(comp, f"cmake --install --prefix /out{prefix}: no --component")
            dest = os.path.join(self.tmp.name, "docker")
            r = run(["cmake", "--install", BUILD, "--prefix", dest + prefix, "--component",
                     comp.group(1)])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            files = [os.path.join(d, n)[len(dest):] for d, _, ns in os.walk(dest) for n in ns]
            self.assertTrue(files, f"component {comp.group(1)} installs nothing")
            for path in files:
                self.assert_in_package(path, f"Docker image, component {comp.group(1)}")
            shutil.rmtree(dest)
        entry = Path(os.path.join(SRC, "deploy", "docker", "entrypoint.sh")).read_text()
        targets = re.findall(r"exec (/usr/\S+)", entry)
        self.assertTrue(targets, "entrypoint.sh execs no /usr path")
        for t in targets:
            self.assert_in_package(t, "the Docker entrypoint's exec")

    def test_python_modules_and_cmake_package(self):
        for m in ["eldr_client.py", "eldr_client_aio.py", "eldr_trace.py", "eldr_proxy.py",
                  "eldr_record/__init__.py"]:
            self.assert_in_package("/usr/lib/python3/dist-packages/" + m, "a Python module")
        for f in ["eldrConfig.cmake", "eldrConfigVersion.cmake", "eldr-targets.cmake"]:
            self.assert_in_package("/usr/lib/cmake/eldr/" + f, "find_package(eldr)")
        self.assert_in_package("/usr/include/eldr/cluster/zmq/client.hpp", "the C++ client header")

    def test_proxy_finds_its_compiled_counts_conversion(self):
        lib = "/usr/lib/python3/dist-packages/libeldr_counts_native.so"
        self.assert_in_package(lib, "eldr-proxy's compiled counts conversion")
        # The unpacked eldr_proxy_native loads it from beside itself (no $ELDR_COUNTS_NATIVE).
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "ELDR_COUNTS_NATIVE")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPATH"] = os.path.join(self.root, "usr", "lib", "python3", "dist-packages")
        code = ("import eldr_proxy_native as n; native, note = n.load(); "
                "print(note); raise SystemExit(0 if native else 1)")
        r = run([sys.executable, "-c", code], env=env, cwd=self.tmp.name)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(os.path.join(self.root, lib.lstrip("/")), r.stdout)

    def test_unpacked_programs_run(self):
        bindir = os.path.join(self.root, "usr", "bin")
        for p in PROGRAMS:
            r = run([os.path.join(bindir, p), "--help"])
            self.assertEqual(r.returncode, 0, f"{p} --help: {r.stderr}")
            self.assertIn(p, r.stdout, p)
        # The stripped node validates its embedded default (data dir ./eldr-data, here tmp).
        r = run([os.path.join(bindir, "eldr-node"), "--check-config"], cwd=self.tmp.name)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        for p in PY_PROGRAMS:
            # Run away from the source tree: the modules must come from the package.
            r = run([os.path.join(bindir, p), "--help"], env=env, cwd=self.tmp.name)
            self.assertEqual(r.returncode, 0, f"{p} --help: {r.stderr}")
            self.assertIn("usage", r.stdout.lower(), p)


def main():
    global BUILD, SRC, CPACK
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--cpack", default="cpack")
    args, rest = parser.parse_known_args()
    BUILD, SRC, CPACK = os.path.abspath(args.build_dir), os.path.abspath(args.source_dir), args.cpack
    missing = [p for p in PROGRAMS
               if not os.access(os.path.join(BUILD, "tools", p, p), os.X_OK)]
    if missing:
        print(f"SKIP: not built: {' '.join(missing)} (cpack installs every program)",
              file=sys.stderr)
        return 77
    for tool in ("dpkg-deb", "dpkg-shlibdeps", "file"):
        if not shutil.which(tool):
            print(f"SKIP: {tool} is missing (deploy/install-deps.sh installs it)", file=sys.stderr)
            return 77
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
