"""The C types and functions have real signatures (their docstrings carry
text signatures), and those agree with the type stub, parameter by parameter.

The stub (python/spanpack/_spanpack.pyi) is parsed, not imported, so the names
and kinds compared are exactly what is written there.
"""

import ast
import inspect
import pathlib
import pydoc
import re
import sys

import pytest

import spanpack
from spanpack import _spanpack

STUB = pathlib.Path(spanpack.__file__).with_name("_spanpack.pyi")


def _stub_definitions():
    """{"packb": FunctionDef, "Packer": {"__init__": FunctionDef, ...}, ...}"""
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            found[node.name] = {item.name: item for item in node.body if isinstance(item, ast.FunctionDef)}
    return found


STUBS = _stub_definitions()


def _stub_parameters(function, drop_self):
    """(name, kind) of each parameter the stub declares, as inspect names kinds."""
    args = function.args
    params = [(a.arg, inspect.Parameter.POSITIONAL_ONLY) for a in args.posonlyargs]
    params += [(a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in args.args]
    if args.vararg:
        params.append((args.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
    params += [(a.arg, inspect.Parameter.KEYWORD_ONLY) for a in args.kwonlyargs]
    if args.kwarg:
        params.append((args.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    return params[1:] if drop_self else params


def _signature(obj):
    """inspect.signature(obj); CPython 3.9 has none for the C types (from
    3.10 on a heap type's signature comes from its doc)."""
    try:
        return inspect.signature(obj)
    except ValueError:
        if sys.version_info < (3, 10) and isinstance(obj, type):
            pytest.skip("CPython 3.9 gives C heap types no signature: inspect.signature raises and help() shows none")
        raise


def _runtime_parameters(obj, drop_self):
    params = [(p.name, p.kind) for p in _signature(obj).parameters.values()]
    return params[1:] if drop_self else params


def _is_property(function):
    return any(isinstance(d, ast.Name) and d.id == "property" for d in function.decorator_list)


def _cases():
    """(id, runtime object, stub function, whether the runtime signature has self)."""
    cases = []
    for name, stub in STUBS.items():
        runtime = getattr(_spanpack, name)
        if isinstance(stub, ast.FunctionDef):
            cases.append((name, runtime, stub, False))
            continue
        for method_name, method in stub.items():
            if method_name == "__init__":
                # the class itself is what gets called
                cases.append((name, runtime, method, False))
            elif not method_name.startswith("__") and not _is_property(method):
                cases.append(("%s.%s" % (name, method_name), getattr(runtime, method_name), method, True))
    return cases


CASES = _cases()


def test_every_stubbed_callable_is_checked():
    names = {case[0] for case in CASES}
    assert {"packb", "Packer", "Packer.pack", "Packer.pack_ext_type", "TraceEncoder", "TraceEncoder.put"} <= names
    assert len(CASES) >= 16


@pytest.mark.parametrize("name, runtime, stub, has_self", CASES, ids=[case[0] for case in CASES])
def test_signature_matches_stub(name, runtime, stub, has_self):
    # the stub's __init__ lists self; the class's own signature does not
    drop_stub_self = has_self or stub.name == "__init__"
    assert _runtime_parameters(runtime, has_self) == _stub_parameters(stub, drop_stub_self)


# TraceMsgPackEncoder's own keyword-only options: the v1.0 payload fields.
V10_PAYLOAD_OPTIONS = ("language_name", "language_version", "tracer_version", "runtime_id", "env",
                       "hostname", "app_version", "container_id", "payload_attributes")


def test_python_subclass_has_the_encoder_signature():
    expected = _stub_parameters(STUBS["TraceEncoder"]["__init__"], True)
    expected += [(name, inspect.Parameter.KEYWORD_ONLY) for name in V10_PAYLOAD_OPTIONS]
    assert _runtime_parameters(spanpack.TraceMsgPackEncoder, False) == expected
    encoder = spanpack.TraceMsgPackEncoder(**{"version": "v0.5", "max_size": 1 << 20})
    assert encoder.version == "v0.5"


def test_signature_defaults_are_the_real_defaults():
    signature = _signature(spanpack.Packer)
    assert {name: p.default for name, p in signature.parameters.items()} == {
        "default": None,
        "use_single_float": False,
        "autoreset": True,
        "use_bin_type": True,
        "strict_types": False,
        "datetime": False,
        "unicode_errors": None,
        "buf_size": None,
    }
    # calling with every default spelled out is the same as calling with none
    spelled_out = {name: p.default for name, p in signature.parameters.items()}
    assert spanpack.Packer(**spelled_out).pack([1, "a", b"b", 1.5]) == spanpack.Packer().pack([1, "a", b"b", 1.5])
    encoder_defaults = {
        name: p.default
        for name, p in inspect.signature(spanpack.TraceMsgPackEncoder).parameters.items()
    }
    plain, spelled = spanpack.TraceMsgPackEncoder(), spanpack.TraceMsgPackEncoder(**encoder_defaults)
    assert (spelled.version, spelled.max_size, spelled.max_item_size) == (
        plain.version,
        plain.max_size,
        plain.max_item_size,
    )


def _rendered_signature(text, name):
    """The parameter list pydoc printed after `name` at the start of a line:
    on one line, or (pydoc from 3.13 on, when it is long) one parameter per
    line, with the class body's " |  " margins removed."""
    lines = "\n".join(re.sub(r"^[ |]*", "", line) for line in text.splitlines())
    found = re.search(r"(?m)^%s\(" % re.escape(name), lines)
    assert found, "help() shows no %s(...) line:\n%s" % (name, text[:2000])
    start, depth = found.end() - 1, 0
    for end in range(start, len(lines)):
        depth += {"(": 1, ")": -1}.get(lines[end], 0)
        if depth == 0:
            return lines[start : end + 1]
    raise AssertionError("unbalanced parameter list after %s( in help():\n%s" % (name, lines[start:]))


def _parameters(parameter_list):
    """A parameter list as Python parses it: layout, line breaks and a
    trailing comma do not count, nor whether an annotation is quoted (a
    module with `from __future__ import annotations` has string annotations,
    which pydoc from 3.14 on prints unquoted)."""
    arguments = ast.parse("def f%s: pass" % parameter_list).body[0].args
    for node in ast.walk(arguments):
        if isinstance(node, ast.arg) and isinstance(node.annotation, ast.Constant) and isinstance(node.annotation.value, str):
            node.annotation = ast.parse(node.annotation.value, mode="eval").body
    return ast.dump(arguments)


@pytest.mark.parametrize(
    "obj",
    [spanpack.Packer, spanpack.packb, spanpack.TraceMsgPackEncoder, _spanpack.TraceEncoder],
    ids=lambda o: o.__name__,
)
def test_help_shows_real_parameters(obj):
    signature = _signature(obj)
    assert "args" not in signature.parameters and "kwargs" not in signature.parameters
    # help() shows the call with its real parameters (the generic slot
    # wrappers such as __init__ still list *args, as for every C type)
    text = pydoc.render_doc(obj, renderer=pydoc.plaintext)
    assert _parameters(_rendered_signature(text, obj.__name__)) == _parameters(str(signature))


def test_rendered_signature_reads_both_layouts():
    one_line = "class P(builtins.object)\n |  P(a, /, b=None, *, c=(1, 2))\n |  \n |  doc\n"
    per_line = "class P(builtins.object)\n |  P(\n |      a,\n |      /,\n |      b=None,\n |      *,\n |      c=(1, 2)\n |  )\n"
    assert _rendered_signature(one_line, "P") == "(a, /, b=None, *, c=(1, 2))"
    assert _parameters(_rendered_signature(per_line, "P")) == _parameters("(a, /, b=None, *, c=(1, 2))")
    assert _parameters("(a, b=None)") != _parameters("(a, *, b=None)")
    assert _parameters("(a: 'Optional[int]' = None)") == _parameters("(a: Optional[int] = None)")
    assert _parameters("(a: 'Optional[int]' = None)") != _parameters("(a: Optional[str] = None)")
