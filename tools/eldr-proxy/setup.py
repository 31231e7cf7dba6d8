# Lists the modules (pyproject.toml holds everything else): every *.py of this folder but this
# file and the benchmark and test scripts, so a module added here is packaged without editing
# anything. Build output goes to a temporary folder, not into the source tree (see
# cluster/python/setup.py).
import atexit
import pathlib
import shutil
import tempfile

from setuptools import setup

here = pathlib.Path(__file__).resolve().parent
modules = sorted(p.stem for p in here.glob("*.py")
                 if p.stem != "setup" and not p.stem.startswith(("bench_", "test_")))
scratch = tempfile.mkdtemp(prefix="eldr-build-")
atexit.register(shutil.rmtree, scratch, True)
setup(py_modules=modules,
      options={"build": {"build_base": scratch}, "egg_info": {"egg_base": scratch}})
