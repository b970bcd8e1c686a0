"""Builds the PyTorch binding (python/attn2d/_C*.so) with CMake, the project's only build entry.

`pip install -e . --no-build-isolation` runs this with the venv's torch, whose CMake package
(torch.utils.cmake_prefix_path) supplies the compile and link flags.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        import torch

        # A fixed build folder keeps rebuilds incremental across `pip install -e .` runs.
        build_dir = ROOT / "build" / "torch"
        build_dir.mkdir(parents=True, exist_ok=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(
            [
                "cmake", "-S", str(ROOT), "-B", str(build_dir),
                "-DCMAKE_BUILD_TYPE=Release",
                "-DATTN2D_BUILD_TORCH=ON",
                "-DATTN2D_BUILD_TESTS=OFF",
                f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                f"-DPython_EXECUTABLE={sys.executable}",
            ],
            check=True,
        )
        subprocess.run(
            ["cmake", "--build", str(build_dir), "--target", "attn2d_python", "-j", jobs],
            check=True,
        )
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        # Copy then rename: a process that has the old library loaded keeps its file intact.
        staging = target.with_name(target.name + ".tmp")
        shutil.copyfile(build_dir / "_attn2d_python.so", staging)
        os.replace(staging, target)


setup(ext_modules=[CMakeExtension("attn2d._C")], cmdclass={"build_ext": CMakeBuild})
