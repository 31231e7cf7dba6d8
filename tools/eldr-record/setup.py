# Build output goes to a temporary folder, not into the source tree (see cluster/python/setup.py).
import atexit
import shutil
import tempfile

from setuptools import setup

scratch = tempfile.mkdtemp(prefix="eldr-build-")
atexit.register(shutil.rmtree, scratch, True)
setup(options={"build": {"build_base": scratch}, "egg_info": {"egg_base": scratch}})
