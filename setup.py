"""Builds kvlog's one C extension; everything else about the package is in setup.cfg."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvlog.compaction._kernels",
            sources=["kvlog/compaction/_kernels.c"],
            extra_compile_args=["-O3", "-std=c11"],
        )
    ]
)
