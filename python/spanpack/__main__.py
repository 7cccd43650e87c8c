"""``python -m spanpack <command>``.

Options:
    --version    print spanpack's version and exit

Commands:
    bench    compare spanpack with ddtrace, msgpack, ormsgpack and msgspec on
             built-in sample traces (``python -m spanpack bench --help``)
"""

import argparse
import sys


def main(argv=None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="python -m spanpack",
                                     description="spanpack command line tools")
    parser.add_argument("--version", action="version", version="spanpack " + __version__)
    commands = parser.add_subparsers(dest="command", metavar="command")
    bench_parser = commands.add_parser("bench", help="benchmark spanpack against its peers")

    from . import bench

    bench.build_parser(bench_parser)
    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench.main(args=args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
