"""Build the one C extension, spanpack._spanpack, from every source in ext/.

SPANPACK_CFLAGS / SPANPACK_LDFLAGS add compiler and linker flags (the tox
sanitizer and lint environments use them); SPANPACK_DEBUG=1 builds -O0 -g.
"""
import glob
import os
import shlex
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# -fvisibility=hidden: only PyInit__spanpack (PyMODINIT_FUNC) is exported, so
# calls between ext/'s files bind inside the library instead of through its
# PLT (1,487 PLT call sites instead of 2,188 with gcc 12), and a function
# defined in the file that calls it may be inlined (no semantic
# interposition).  Debian's interpreters link extensions with
# -Wl,-Bsymbolic-functions, which does the binding part; pyenv's do not.
compile_args = ["-std=gnu11", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
                "-fvisibility=hidden"]
if os.environ.get("SPANPACK_DEBUG"):
    compile_args += ["-O0", "-g3", "-UNDEBUG"]
else:
    compile_args += ["-O3"]
user_compile_args = shlex.split(os.environ.get("SPANPACK_CFLAGS", ""))
user_link_args = shlex.split(os.environ.get("SPANPACK_LDFLAGS", ""))

# Passed where the compiler takes them (an empty file compiled with each):
# - -fno-wrapv-pointer: CPython 3.12+ gives extensions -fno-strict-overflow,
#   which to gcc also means -fwrapv-pointer, so `p + n` may wrap to NULL and
#   gcc keeps a NULL test after each PyUnicode_DATA or &array[i] it cannot
#   otherwise drop: 313 instructions a one-span v1.0 put() on 3.14, none on
#   3.11 (whose -fwrapv leaves pointers alone).  ext/ does no pointer
#   arithmetic that overflows (tox -e sanitize: UBSan's pointer-overflow).
# - -mmemset-strategy / -mmemcpy-strategy (gcc on x86-64): a memset or memcpy
#   of a size gcc knows or can bound, up to 256 bytes, as vector moves, larger
#   or unknown ones through libc; never `rep stos` / `rep movs`, which gcc 12
#   at -O3 chooses for such sizes (a span's values cleared before they are
#   read, 120 bytes a span) and whose start-up costs tens of cycles each time
#   (docs/speed-3.11.md: perf profiles of CPython 3.11 built with gcc 12).
OPTIONAL_COMPILE_ARGS = [
    "-fno-wrapv-pointer",
    "-mmemset-strategy=vector_loop:256:noalign,libcall:-1:noalign",
    "-mmemcpy-strategy=vector_loop:256:noalign,libcall:-1:noalign",
]


class BuildExt(build_ext):
    def compiler_accepts(self, flag):
        if self.compiler.compiler_type != "unix":
            return False
        with tempfile.TemporaryDirectory(prefix="spanpack-flag-") as temp:
            source = os.path.join(temp, "empty.c")
            with open(source, "w") as f:
                f.write("int spanpack_flag_check;\n")
            try:
                self.compiler.compile([source], output_dir=temp, extra_postargs=[flag, "-Werror"])
            except Exception:  # CompileError, or the compiler missing altogether
                return False
        return True

    def build_extensions(self):
        accepted = [flag for flag in OPTIONAL_COMPILE_ARGS if self.compiler_accepts(flag)]
        for extension in self.extensions:
            extension.extra_compile_args = compile_args + accepted + user_compile_args
        super().build_extensions()


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            "spanpack._spanpack",
            sources=sorted(glob.glob("ext/*.c")),
            depends=sorted(glob.glob("ext/*.h")),
            include_dirs=["ext"],
            extra_compile_args=compile_args + user_compile_args,
            extra_link_args=user_link_args,
        )
    ],
)
