"""Builds the loom backend (loom_torch) against the torch of the Python that
runs pip, and links it to Loom's libnccl.so.2:

    pip install --no-build-isolation ./bindings/torch

--no-build-isolation: the extension must be compiled against the torch
already installed (a build in isolation would download another). Loom's
library is looked for in $LOOM_HOME/lib (an install prefix, with
$LOOM_HOME/include), else in $LOOM_BUILD_DIR, else in the repository's
build/ directory; the extension records that path and loads the library
from it when imported (LOOM_NCCL_LIB overrides it; loom_api.h says why it
does not link to libnccl.so.2).

SPDX-License-Identifier: Apache-2.0
"""

import os

from setuptools import setup

from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _loom_dirs():
    home = os.environ.get("LOOM_HOME")
    if home:
        return os.path.join(home, "lib"), os.path.join(home, "include")
    build = os.environ.get("LOOM_BUILD_DIR", os.path.join(REPO, "build"))
    return os.path.abspath(build), os.path.join(REPO, "include")


LIB_DIR, INCLUDE_DIR = _loom_dirs()
LIB = os.path.join(LIB_DIR, "libnccl.so.2")
if not os.path.exists(LIB):
    raise SystemExit(f"loom_torch: no Loom library at {LIB}: build Loom first (README), or set LOOM_BUILD_DIR "
                     "to its build directory or LOOM_HOME to where it is installed")
if not os.path.exists(os.path.join(INCLUDE_DIR, "loom.h")):
    raise SystemExit(f"loom_torch: no loom.h in {INCLUDE_DIR}: set LOOM_HOME to Loom's install prefix")

setup(
    name="loom_torch",
    version="0.1.0",
    description="Loom as a torch.distributed backend on CPU tensors",
    packages=["loom_torch"],
    ext_modules=[
        CppExtension(
            "loom_torch._C",
            ["loom_torch.cpp"],
            include_dirs=[INCLUDE_DIR],
            define_macros=[("LOOM_TORCH_LIB_PATH", '"' + os.path.realpath(LIB) + '"')],
            extra_compile_args=["-std=c++20", "-fvisibility=hidden"],
            libraries=["dl"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
)
