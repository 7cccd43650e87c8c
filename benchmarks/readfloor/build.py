"""Build (once per interpreter) and import the read-floor helper.

    from readfloor.build import load; readfloor = load()

It is compiled with setuptools into benchmarks/readfloor/build/<interpreter
tag>/, next to its source, the first time a benchmark asks for it; None when
no compiler is available (the benchmarks then leave the floor out).
"""

import glob
import importlib.util
import os
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))


def load():
    tag = sys.implementation.cache_tag + "-" + sysconfig.get_platform()
    build_dir = os.path.join(HERE, "build", tag)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    path = os.path.join(build_dir, "readfloor" + suffix)
    source = os.path.join(HERE, "readfloor.c")
    ext = os.path.join(os.path.dirname(os.path.dirname(HERE)), "ext")
    # spanpack's own in-place readers, proven by its own layout probes, and its
    # msgpack writers: the floor reads and writes as spanpack could at best.
    shared = [os.path.join(ext, name) for name in ("layout_probes.c", "outbuf.c")]
    newest = max(os.path.getmtime(f) for f in [source, *shared, *glob.glob(os.path.join(ext, "*.h"))])
    if not os.path.exists(path) or os.path.getmtime(path) < newest:
        try:
            from setuptools import Distribution, Extension

            dist = Distribution({"ext_modules": [Extension("readfloor", [source, *shared], include_dirs=[ext],
                                                           extra_compile_args=["-O3", "-std=gnu11"])]})
            command = dist.get_command_obj("build_ext")
            command.build_lib = build_dir
            command.build_temp = os.path.join(build_dir, "tmp")
            command.ensure_finalized()
            command.run()
        except Exception as error:  # no compiler, no headers
            print("read floor not built: %s" % error, file=sys.stderr)
            return None
    spec = importlib.util.spec_from_file_location("readfloor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
