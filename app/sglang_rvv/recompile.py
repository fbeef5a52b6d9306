"""A function's own source compiled again with some of its expressions changed.

:func:`sglang_rvv.fused.rebound` reaches what a function looks up by name. An operator (``a + b``)
or an attribute read is no name: changing those takes the source. :func:`recompiled` parses the
function's source, checks that it compiles to the code that runs (the file on disk is what was
imported, and nothing wraps or decorates it), applies the given AST transformers, and compiles the
result over a copy of the function's globals with extra names. Anything else (no source, a
closure, a decorator, another code) gives None, and the caller keeps the function as it is.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Callable, Iterable


class ChildModules(ast.NodeTransformer):
    """``self.<child>`` read as ``self._modules["<child>"]`` for the named child modules.

    ``nn.Module`` keeps its children in ``_modules``, so reading one as an attribute misses the
    instance's dict and runs ``Module.__getattr__``, a Python frame of some 45 bytecodes (a few
    thousand instructions on the board's in-order core), for every child call of every step. The
    dict read is always the live child: a child replaced by ``setattr`` is in ``_modules``, one
    deleted raises (a KeyError where torch raises an AttributeError).
    """

    def __init__(self, children: Iterable[str]):
        self.children, self.count = frozenset(children), 0

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if (isinstance(node.ctx, ast.Load) and node.attr in self.children and isinstance(node.value, ast.Name)
                and node.value.id == "self"):
            self.count += 1
            modules = ast.Attribute(ast.Name("self", ast.Load()), "_modules", ast.Load())
            return ast.copy_location(ast.Subscript(modules, ast.Constant(node.attr), ast.Load()), node)
        return node


def child_names(module: object) -> frozenset[str]:
    """The children of ``module`` (an ``nn.Module``) that :class:`ChildModules` may read from
    ``_modules``: all of them but a name its class defines (a property, say), which an attribute
    read finds before ``_modules``."""
    cls = type(module)
    return frozenset(name for name in module._modules if not hasattr(cls, name))


class Calls(ast.NodeTransformer):
    """``<left> + <right>`` of two names, or ``<obj>.<method>(...)``, made ``<callee>(...)`` with the
    same operands (the object first); counts them."""

    def __init__(self, callee: str, *, add: tuple[str, str] | None = None, method: tuple[str, str] | None = None):
        self.callee, self.add, self.method, self.count = callee, add, method, 0

    def _call(self, node: ast.AST, args: list[ast.expr], keywords: list[ast.keyword]) -> ast.AST:
        self.count += 1
        return ast.copy_location(ast.Call(ast.Name(self.callee, ast.Load()), args, keywords), node)

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if (self.add is not None and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Name)
                and isinstance(node.right, ast.Name) and (node.left.id, node.right.id) == self.add):
            return self._call(node, [node.left, node.right], [])
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if (self.method is not None and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and (func.value.id, func.attr) == self.method):
            return self._call(node, [func.value, *node.args], node.keywords)
        return node


def _code_of(module: types.CodeType, qualname: str, line: int) -> types.CodeType | None:
    """The code object of the function ``qualname`` defined at ``line`` in a compiled module."""
    for const in module.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_qualname == qualname and const.co_firstlineno == line:
                return const
            found = _code_of(const, qualname, line)
            if found is not None:
                return found
    return None


def recompiled(function: Callable, transformers: Iterable[ast.NodeTransformer],
               names: dict[str, object]) -> types.FunctionType | None:
    """``function`` compiled again from its source with ``transformers`` applied, over a copy of
    its globals with ``names`` added; None where its source cannot be trusted to be its code.

    The whole file is compiled, not the function alone: how a function's code reads a name depends
    on the module around it (3.11 calls a method of an imported name without LOAD_METHOD). Nothing
    of the file runs: the function is made from its code object."""
    code = getattr(function, "__code__", None)
    if code is None or code.co_freevars:  # a closure or super(): not a plain function of its module
        return None
    try:
        with open(code.co_filename, encoding="utf-8") as source:
            tree = ast.parse(source.read(), code.co_filename)
    except (OSError, SyntaxError, ValueError):
        return None
    definition = next((node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                       and node.name == code.co_name and node.lineno == code.co_firstlineno), None)
    if definition is None or definition.decorator_list:
        return None
    same = _code_of(compile(tree, code.co_filename, "exec"), code.co_qualname, code.co_firstlineno)
    if same is None or (same.co_code, same.co_names, same.co_consts) != (code.co_code, code.co_names, code.co_consts):
        return None  # the file on disk is not what was imported
    for transformer in transformers:
        transformer.visit(definition)
    ast.fix_missing_locations(tree)
    changed_code = _code_of(compile(tree, code.co_filename, "exec"), code.co_qualname, code.co_firstlineno)
    changed = types.FunctionType(changed_code, {**function.__globals__, **names}, function.__name__,
                                 function.__defaults__, None)
    changed.__kwdefaults__ = function.__kwdefaults__
    changed.__qualname__ = function.__qualname__
    return changed
