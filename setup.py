"""Builds kvlog's four C extensions; everything else about the package is in setup.cfg."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvlog.compaction._kernels",
            sources=["kvlog/compaction/_kernels.c"],
            extra_compile_args=["-O3", "-std=c11"],
        ),
        Extension(
            "kvlog.log._writebuffer",
            sources=["kvlog/log/_writebuffer.c"],
            extra_compile_args=["-O3", "-std=c11"],
        ),
        Extension(
            "kvlog.format._columns",
            sources=["kvlog/format/_columns.c"],
            depends=["kvlog/_key_order.h", "kvlog/_crc32c.h"],
            extra_compile_args=["-O3", "-std=c11"],
        ),
        Extension(
            "kvlog.index._runs",
            sources=["kvlog/index/_runs.c"],
            depends=["kvlog/_key_order.h", "kvlog/_crc32c.h"],
            extra_compile_args=["-O3", "-std=c11"],
        ),
    ]
)
