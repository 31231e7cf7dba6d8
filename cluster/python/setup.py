# Lists the modules (pyproject.toml holds everything else): every eldr_*.py here. Build output
# goes to a temporary folder, not into the source tree, so a pip install leaves no build/ or
# *.egg-info behind (and no stale copy of a deleted module can be packaged from one).
import atexit
import pathlib
import shutil
import tempfile

from setuptools import setup

here = pathlib.Path(__file__).resolve().parent
scratch = tempfile.mkdtemp(prefix="eldr-build-")
atexit.register(shutil.rmtree, scratch, True)
setup(py_modules=sorted(p.stem for p in here.glob("eldr_*.py")),
      options={"build": {"build_base": scratch}, "egg_info": {"egg_base": scratch}})
