"""The mmfeed client as a Python package, for a trainer's virtual environment:

    python3 -m venv --system-site-packages venv      # numpy and torch from Debian
    venv/bin/pip install --no-build-isolation ./client/python
    venv/bin/pip wheel --no-build-isolation --no-deps -w dist ./client/python

Builds the extension (mmfeed._mmfeed) from the sources the CMake target _mmfeed links: the
module and the libraries mmfeed_client, mmfeed_shm and mmfeed_base, whose sources are read from
CMakeLists.txt (one list); nothing of the daemon. Needs a C++20 compiler and the headers
of pybind11 (pybind11-dev), fmt (libfmt-dev) and nlohmann-json (nlohmann-json3-dev), as
scripts/setup.sh installs them; pybind11's headers are found through its Python package when
that is installed, else in /usr/include. The version is the CMake project's.
"""
import pathlib
import re

from setuptools import Extension, setup

try:  # pybind11's Python package knows where its headers are; Debian's pybind11-dev alone does not
    import pybind11
    PYBIND11 = [pybind11.get_include()]
except ImportError:
    PYBIND11 = []

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent


CMAKE = (ROOT / "CMakeLists.txt").read_text()


def library_sources(name):
    """The sources CMakeLists.txt gives the static library `name`: the one list of them."""
    return re.search(rf"add_library\({name} STATIC([^)]*)\)", CMAKE).group(1).split()


SOURCES = ["client/python/mmfeed_module.cc",
           *(s for lib in ("mmfeed_client", "mmfeed_shm", "mmfeed_base") for s in library_sources(lib))]
VERSION = re.search(r"project\(mmfeed VERSION ([0-9.]+)", CMAKE).group(1)

setup(
    name="mmfeed",
    version=VERSION,
    description="The client of mmfeedd, the node's multimodal data-loading daemon: batches from "
                "shared-memory rings, zero-copy, for numpy and PyTorch",
    python_requires=">=3.9",
    packages=["mmfeed"],
    package_data={"mmfeed": ["py.typed", "*.pyi"]},
    install_requires=["numpy"],
    ext_modules=[Extension("mmfeed._mmfeed", [str(ROOT / s) for s in SOURCES], include_dirs=[str(ROOT), *PYBIND11],
                           libraries=["fmt"], language="c++",
                           extra_compile_args=["-std=c++20", "-O2", "-fvisibility=hidden"])],
    zip_safe=False,
)
