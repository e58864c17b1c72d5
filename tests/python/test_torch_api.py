"""The torch API python/moejit/experts.py calls for its custom op moejit::experts, against real
torch 2.14.1's source (the torch sglang 0.5.23 pins; its wheel's .py and .pyi files from PyPI,
engine_sources.py; torch itself is not installed here), read with ast: every call the binding
makes to torch.library (custom_op and the decorator it returns, CustomOpDef.register_fake, a
Library's __init__ / define / impl, torch.ops.<ns>.<op>) and torch.empty in the fake kernel
binds to the real signature (names, positional-only and keyword-only parameters); the kinds and
dispatch keys it names exist; the schema torch infers from the op's annotations is one the
binding's types allow; and the torch stand-in of conftest.py, on which the other tests run the
op, has the same signatures and schema types. Without the sources (and the network to fetch
them) the tests fail."""
import ast
import inspect
import os

import pytest

from conftest import REPO, _infer_schema, make_fake_torch
from engine_sources import sources

EXPERTS = os.path.join(REPO, "python", "moejit", "experts.py")
P = inspect.Parameter


@pytest.fixture(scope="module")
def th():
    return sources("torch")


def parse(path):
    with open(path) as f:
        return ast.parse(f.read(), path)


def module_path(root, module):
    base = os.path.join(root, *module.split("."))
    return base + ".py" if os.path.exists(base + ".py") else os.path.join(base, "__init__.py")


def is_overload(fn):
    return any(getattr(d, "id", getattr(d, "attr", None)) == "overload" for d in fn.decorator_list)


def resolve(root, module, name):
    """The top-level node that gives module `module` its `name` (the implementation where
    there are @overload stubs), following `from X import name`."""
    tree = parse(module_path(root, module))
    found = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name and
             not (isinstance(n, ast.FunctionDef) and is_overload(n))]
    found += [n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign)) and
              name in [t.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                       if isinstance(t, ast.Name)]]
    if found:
        return found[-1]
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and any((a.asname or a.name) == name and a.name == name for a in n.names):
            return resolve(root, n.module, name)
    raise AssertionError("%s has no %s" % (module, name))


def overloads(root, module, name):
    """Every top-level def of `name` in a module or stub (.pyi), overloads included."""
    tree = parse(os.path.join(root, *module.split("/")))
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]


def method(cls, name):
    fns = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name and not is_overload(n)]
    assert fns, "%s has no method %s" % (cls.name, name)
    return fns[-1]


class Source:
    """A default that is not a literal, compared by its source text."""

    def __init__(self, text):
        self.text = text

    def __eq__(self, other):
        return isinstance(other, Source) and other.text == self.text

    def __repr__(self):
        return self.text


def value(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return Source(ast.unparse(node))


def signature(fn, drop_self=False):
    """inspect.Signature of a def's ast: names, kinds, defaults (no annotations)."""
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    params = [P(x.arg, P.POSITIONAL_ONLY if i < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD,
                default=P.empty if d is None else value(d)) for i, (x, d) in enumerate(zip(pos, defaults))]
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL))
    params += [P(x.arg, P.KEYWORD_ONLY, default=P.empty if d is None else value(d))
               for x, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params[1:] if drop_self else params)


def shape(sig):
    """(name, kind, default) of each parameter: what two signatures must share."""
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def stand_in(fn, drop_self=False):
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    return inspect.Signature([p.replace(annotation=P.empty) for p in (params[1:] if drop_self else params)])


def binds(sig, call):
    """Whether an ast Call's arguments bind to sig (placeholders for the values)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise AssertionError("a *args / **kwargs call cannot be checked: %s" % ast.unparse(call))
    try:
        sig.bind(*range(len(call.args)), **{k.arg: 0 for k in call.keywords})
        return True
    except TypeError:
        return False


def calls(tree, attr, on=None):
    """The calls X.attr(...) in tree (X a Name `on` when given)."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
            n.func.attr == attr and (on is None or getattr(n.func.value, "id", None) == on)]


def function(tree, name):
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.fixture(scope="module")
def ours():
    return parse(EXPERTS)


# ---- torch.library.custom_op (torch >= 2.4) --------------------------------------------------------

def test_custom_op(th, ours):
    lib = parse(module_path(th, "torch.library"))
    names = next(ast.literal_eval(n.value) for n in lib.body if isinstance(n, ast.Assign) and
                 getattr(n.targets[0], "id", None) == "__all__")
    assert {"custom_op", "Library", "infer_schema"} <= set(names), "torch.library exports them (hasattr finds them)"
    real = resolve(th, "torch.library", "custom_op")
    sig = signature(real)
    assert [p.name for p in sig.parameters.values() if p.kind == P.POSITIONAL_ONLY] == ["name", "fn"]
    assert sig.parameters["mutates_args"].kind == P.KEYWORD_ONLY and sig.parameters["mutates_args"].default is P.empty
    mine = calls(ours, "custom_op", on="tl")
    assert len(mine) == 1 and binds(sig, mine[0])
    assert [k.arg for k in mine[0].keywords] == ["mutates_args"] and ast.literal_eval(mine[0].keywords[0].value) == ()
    assert mine[0].args[0].value == "moejit::experts"
    # called without fn, custom_op returns the decorator `inner`, which takes the function
    ret_inner = [n for n in real.body if isinstance(n, ast.If) and ast.unparse(n.test) == "fn is None" and
                 isinstance(n.body[0], ast.Return) and getattr(n.body[0].value, "id", None) == "inner"]
    assert ret_inner, "custom_op(name, mutates_args=...) returns a decorator"
    inner = function(real, "inner")
    assert len(inner.args.args) == 1 and not inner.args.kwonlyargs
    # ... which returns a CustomOpDef, whose register_fake the binding calls with its fake kernel
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "CustomOpDef" for n in ast.walk(inner))
    cod = resolve(th, "torch._library.custom_ops", "CustomOpDef")
    rf = signature(method(cod, "register_fake"), drop_self=True)
    assert shape(rf) == [("fn", P.POSITIONAL_ONLY, P.empty)]
    mine_rf = calls(function(ours, "torch_op"), "register_fake")
    assert len(mine_rf) == 1 and binds(rf, mine_rf[0]) and mine_rf[0].args[0].id == "_op_fake"
    assert "return fn" in ast.unparse(method(cod, "register_fake"))


def test_schema_from_annotations(th, ours):
    """custom_op infers the schema from the op function's annotations (infer_schema): only
    positional-or-keyword and keyword-only parameters, every one annotated with a supported
    type; string annotations would be evaluated in the function's module globals, where
    experts.py has no torch (it is imported in torch_op): so no `from __future__ import
    annotations` there. The fake and the real kernels take the op's parameters."""
    inf = parse(module_path(th, "torch._library.infer_schema"))
    assert "from torch import device, dtype, Tensor, types" in ast.unparse(inf)
    data = function(inf, "get_supported_param_types").body[0].value
    param_types = {ast.unparse(e.elts[0]): e.elts[1].value for e in data.elts}
    ret = next(n.value for n in inf.body if isinstance(n, ast.Assign) and
               getattr(n.targets[0], "id", None) == "SUPPORTED_RETURN_TYPES")
    return_types = {ast.unparse(k): v.value for k, v in zip(ret.keys, ret.values)}
    supported = function(inf, "supported_param")
    assert {a.attr for a in ast.walk(supported) if isinstance(a, ast.Attribute)} >= {"POSITIONAL_OR_KEYWORD",
                                                                                       "KEYWORD_ONLY"}
    assert "pf_globals = prototype_function.__globals__" in ast.unparse(function(inf, "infer_schema"))
    assert not [n for n in ast.walk(ours) if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    op = function(function(ours, "_typed_impl"), "experts")
    assert not op.args.posonlyargs and not op.args.vararg and not op.args.kwarg
    anns = [ast.unparse(a.annotation) for a in op.args.args]
    assert anns == ["torch.Tensor"] * 3 + ["int"]
    schema = [param_types[a.replace("torch.", "")] for a in anns]
    assert schema == ["Tensor", "Tensor", "Tensor", "SymInt"]
    assert return_types[ast.unparse(op.returns).replace("torch.", "")] == "Tensor"
    names = [a.arg for a in op.args.args]
    for fn in ("_op_fake", "_op_impl"):
        assert [a.arg for a in function(ours, fn).args.args] == names, fn
    # the stand-in infers the same schema with the same table
    t = make_fake_torch()
    ns = {}
    exec(compile(ast.Module(body=[function(ours, "_typed_impl")], type_ignores=[]), EXPERTS, "exec"), ns)
    assert _infer_schema(t, ns["_typed_impl"](t)) == "(%s) -> Tensor" % ", ".join(
        "%s %s" % (s, n) for s, n in zip(schema, names))
    for py, want in ((int, "SymInt"), (float, "float"), (bool, "bool"), (str, "str")):
        assert param_types[py.__name__] == want

        def f(x):
            pass
        f.__annotations__ = {"x": py, "return": t.Tensor}
        assert _infer_schema(t, f) == "(%s x) -> Tensor" % want


# ---- the Library path (torch before 2.4) and torch.ops ---------------------------------------------

def test_library(th, ours):
    lib = resolve(th, "torch.library", "Library")
    init = method(lib, "__init__")
    kinds = next(ast.literal_eval(n.test.comparators[0]) for n in ast.walk(init) if isinstance(n, ast.If) and
                 isinstance(n.test, ast.Compare) and ast.unparse(n.test.left) == "kind" and
                 isinstance(n.test.ops[0], ast.NotIn))
    reserved = ast.literal_eval(resolve(th, "torch.library", "_reserved_namespaces").value)
    tp = function(ours, "torch_op")
    (new,) = calls(tp, "Library", on="tl")
    assert binds(signature(init, drop_self=True), new)
    ns, kind = (ast.literal_eval(a) for a in new.args)
    assert kind in kinds and ns not in reserved
    (define,) = calls(tp, "define", on="L")
    assert binds(signature(method(lib, "define"), drop_self=True), define)
    schema = ast.literal_eval(define.args[0])
    op = function(function(ours, "_typed_impl"), "experts")
    assert schema == "experts(%s) -> Tensor" % ", ".join(
        "%s %s" % ("Tensor" if ast.unparse(a.annotation) == "torch.Tensor" else "int", a.arg) for a in op.args.args)
    impl_sig = signature(method(lib, "impl"), drop_self=True)
    keys = set()
    for c in calls(tp, "impl", on="L"):
        assert binds(impl_sig, c) and ast.literal_eval(c.args[0]) == "experts"
        k = c.args[2]
        if isinstance(k, ast.Constant):
            keys.add(k.value)
        else:   # for key in (...): L.impl("experts", fn, key)
            loop = next(n for n in ast.walk(tp) if isinstance(n, ast.For) and getattr(n.target, "id", None) == k.id)
            keys |= set(ast.literal_eval(loop.iter))
    assert keys == {"CPU", "CUDA", "Meta", "AutogradMeta"}
    dk = next(n for n in parse(os.path.join(th, "torch", "_C", "__init__.pyi")).body
              if isinstance(n, ast.ClassDef) and n.name == "DispatchKey")
    members = {t.id for n in dk.body if isinstance(n, ast.Assign) for t in n.targets}
    assert keys <= members
    # torch.ops.moejit.experts: torch.ops is _Ops(), whose attributes are _OpNamespaces, whose are ops
    assert ast.unparse(resolve(th, "torch", "ops").value) == "_Ops()"
    for cls, arg in (("_Ops", "name"), ("_OpNamespace", "op_name")):
        ga = method(resolve(th, "torch._ops", cls), "__getattr__")
        assert [a.arg for a in ga.args.args] == ["self", arg], cls
    assert "torch.ops.moejit.experts" in ast.unparse(tp)
    assert any(isinstance(n, ast.ImportFrom) and n.module == "torch._tensor" and
               [a.name for a in n.names] == ["Tensor"] for n in parse(module_path(th, "torch")).body)


def test_empty_in_the_fake_kernel(th, ours):
    """_op_fake's torch.empty(shape tuple, dtype=, device=) binds to one of torch.empty's
    overloads (torch/_C/_VariableFunctions.pyi), and the stand-in's empty to the same one."""
    (call,) = calls(function(ours, "_op_fake"), "empty", on="torch")
    ovl = [signature(f) for f in overloads(th, "torch/_C/_VariableFunctions.pyi", "empty")]
    assert len(ovl) >= 2
    fits = [s for s in ovl if binds(s, call) and "size" in s.parameters and
            s.parameters["size"].kind == P.POSITIONAL_OR_KEYWORD]
    assert len(fits) == 1
    real = {p[0]: p for p in shape(fits[0])}
    mine = shape(stand_in(make_fake_torch().empty))
    assert [p[0] for p in mine] == ["size", "dtype", "device"]
    for p in mine:
        assert real[p[0]] == p, p
    assert all(p.default is not P.empty for p in fits[0].parameters.values() if p.name not in {"size"})


# ---- the stand-in's torch.library ---------------------------------------------------------------

def test_stand_in_signatures(th):
    """conftest.py's torch.library has real torch 2.14.1's signatures: custom_op,
    CustomOpDef.register_fake, Library(...), define, impl; its kinds are torch's."""
    t = make_fake_torch()
    cod = resolve(th, "torch._library.custom_ops", "CustomOpDef")
    lib = resolve(th, "torch.library", "Library")
    pairs = [("custom_op", signature(resolve(th, "torch.library", "custom_op")), stand_in(t.library.custom_op)),
             ("register_fake", signature(method(cod, "register_fake"), drop_self=True),
              stand_in(t.library.CustomOpDef.register_fake, drop_self=True))]
    for name in ("__init__", "define", "impl"):
        pairs.append(("Library." + name, signature(method(lib, name), drop_self=True),
                      stand_in(getattr(t.library.Library, name), drop_self=True)))
    for name, real, mine in pairs:
        assert shape(mine) == shape(real), "%s: torch %s, the stand-in %s" % (name, real, mine)
    init = method(lib, "__init__")
    kinds = next(ast.literal_eval(n.test.comparators[0]) for n in ast.walk(init) if isinstance(n, ast.If) and
                 isinstance(n.test, ast.Compare) and ast.unparse(n.test.left) == "kind")
    for k in kinds:
        t.library.Library("moejit_test", k)
    with pytest.raises(ValueError, match="Unsupported kind"):
        t.library.Library("moejit_test", "DEFINE")
