# The extension certattn._core, compiled from src/certattn_core.cpp and the headers in
# ../include (Eigen and xsimd from Debian's libeigen3-dev and libxsimd-dev). Kernels are
# chosen at run time (function-level target attributes): no -march flag.
import os

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup

here = os.path.dirname(os.path.abspath(__file__))
include = os.path.normpath(os.path.join(here, "..", "include"))
if not os.path.isdir(os.path.join(include, "certattn")):
    raise RuntimeError(f"certattn headers not found at {include}: build from a checkout (pip install ./python)")

setup(ext_modules=[Pybind11Extension(
    "certattn._core", ["src/certattn_core.cpp"], cxx_std=20,
    include_dirs=[include, "/usr/include/eigen3"],
    extra_compile_args=["-O3", "-DNDEBUG"], extra_link_args=["-pthread"])])
