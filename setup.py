"""Build the one C extension, spanpack._spanpack, from every source in ext/.

SPANPACK_CFLAGS / SPANPACK_LDFLAGS add compiler and linker flags (the tox
sanitizer and lint environments use them); SPANPACK_DEBUG=1 builds -O0 -g.
"""
import glob
import os
import shlex

from setuptools import Extension, setup

extra_compile_args = ["-std=gnu11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"]
extra_link_args = []
if os.environ.get("SPANPACK_DEBUG"):
    extra_compile_args += ["-O0", "-g3", "-UNDEBUG"]
else:
    extra_compile_args += ["-O3"]
extra_compile_args += shlex.split(os.environ.get("SPANPACK_CFLAGS", ""))
extra_link_args += shlex.split(os.environ.get("SPANPACK_LDFLAGS", ""))

setup(
    ext_modules=[
        Extension(
            "spanpack._spanpack",
            sources=sorted(glob.glob("ext/*.c")),
            depends=sorted(glob.glob("ext/*.h")),
            include_dirs=["ext"],
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
        )
    ],
)
