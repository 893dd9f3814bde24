"""Tool schemas and the compact text the model sees about them: hints, the quick index, search fields.

Everything here is pure (no I/O) and deterministic, so a catalog built twice from the same tools
renders the same bytes. Schemas are plain JSON Schema dicts; the ones built from Python functions
come from msgspec (a pydantic model in an annotation from its own ``model_json_schema``) and are
made self-contained (``$ref`` inlined) so hints can be rendered from them. The same annotations
make the call: `Parameters` converts a JSON input to them and says what is wrong when it cannot.

**Closed** schemas. An output hint promises the model the exact shape of a result, so it is only
rendered for a *closed* schema: every object level lists all of its keys
(``additionalProperties: false``), and every other level is a primitive, an enum/const, or an
array/tuple/union of closed things. ``dict[str, Any]``, ``Record``-like maps, ``{}``, unresolved or
recursive references and ``allOf`` are open. Schemas built from a return annotation close every
object that comes from a msgspec ``Struct``, dataclass, attrs class, pydantic model or
``TypedDict``: the encoders emit exactly the declared fields of the first four (a model through
``model_dump(mode="json")``), and for a ``TypedDict`` (a plain dict at run time) it is the host's
promise, enforced by :func:`compile_output_validator`. A type that explicitly sets
``additionalProperties`` (``Meta(extra_json_schema=...)``, a model's ``extra="allow"``) keeps it.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import fastjsonschema
import msgspec

from .errors import ToolDefinitionError

__all__ = [
    "MAX_DESCRIPTION_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_SCHEMA_BYTES",
    "FunctionSchemas",
    "Parameters",
    "array_of",
    "bounded_schema",
    "bounded_text",
    "compile_input_validator",
    "compile_output_validator",
    "describe_function",
    "inline_refs",
    "input_hint",
    "json_default",
    "output_hint",
    "quick_index",
    "schema_properties",
    "schema_required",
    "schemas_from_function",
    "search_fields",
    "tuple_form",
    "type_union",
]

JsonSchema = dict[str, Any]

#: Nesting deeper than this renders as ``unknown`` (and is open): hints never recurse without bound.
_MAX_DEPTH = 32
#: ``$ref`` expansions per schema; a diamond of references would otherwise inline exponentially.
_MAX_REF_EXPANSIONS = 1000
_MAX_SEARCH_FIELDS = 64
_MAX_SEARCH_FIELD_CHARS = 200
_MAX_ERROR_CHARS = 300

#: Catalog text per tool. Every run's catalog crosses to its worker in one frame, so one tool's
#: 70 MB description would fail every exec of the ``CodeMode``: text is cut (with a marker) and
#: a schema over its bounds is left out (see :func:`bounded_schema`) when the tool is defined.
MAX_DESCRIPTION_CHARS = 8192
MAX_LABEL_CHARS = 200
MAX_SCHEMA_BYTES = 256 << 10
#: JSON nesting of one schema: the worker parses the catalog with a nesting limit of 128, and a
#: schema sits 4 levels down in it.
MAX_SCHEMA_DEPTH = 64
#: An untrusted (MCP, client) schema is compiled into a host-side input check only when it is at
#: most this big: compiling generates and compiles Python, ~15 µs per schema byte measured here
#: (a 2.5 KB schema 40 ms, 16 KiB 240 ms), once per tool, on the thread of its first call.
_MAX_CHECKED_SCHEMA_BYTES = 16 << 10

_ELLIPSIS = "…"
_FOLDED = "{ … }"
#: An object that takes any keys (no ``properties``, no closed or typed ``additionalProperties``).
_OPEN = "{ ... }"
#: Object levels an input hint shows at most: deeper ones fold to ``{ … }`` even when they fit
#: (a hint reads at a glance; ``tools.describe`` has the rest).
_MAX_HINT_LEVELS = 3
#: A JSON literal (``const``, an ``enum`` value) renders as a TypeScript literal type this many
#: levels deep, with at most this many items or keys per level.
_MAX_LITERAL_DEPTH = 3
_MAX_LITERAL_ITEMS = 8
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
#: Item types that read unambiguously with a ``[]`` suffix; anything else is written ``Array<T>``.
_SIMPLE_TYPE = re.compile(r"[A-Za-z]+(?:\[\])*")
_INDEX = re.compile(r"[0-9]{1,9}")

# JSON Schema keywords whose values are subschemas, by shape (drafts 07 and 2020-12).
_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SCHEMA_SINGLE = (
    "items",
    "additionalItems",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_PRIMITIVES = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null"}


# ---- schemas from Python functions -----------------------------------------------------------------


class FunctionSchemas(typing.NamedTuple):
    """What a tool function's signature says: its schemas and how an input becomes its call."""

    input_schema: JsonSchema
    output_schema: JsonSchema | None
    #: None when the signature cannot be read (the input is passed as it is).
    parameters: Parameters | None = None


def schemas_from_function(fn: Callable[..., Any]) -> tuple[JsonSchema, JsonSchema | None]:
    """``(input schema, output schema or None)`` for a tool function (see :func:`describe_function`)."""
    described = describe_function(fn)
    return described.input_schema, described.output_schema


def describe_function(fn: Callable[..., Any], *, context_type: type | None = None) -> FunctionSchemas:
    """The input and output schemas of a tool function, both without ``$ref``, and its `Parameters`.

    The input is a closed object of the parameters (open when the function takes ``*args`` or
    ``**kwargs``); parameters without a default are required. Annotations are read with
    ``get_type_hints(include_extras=True)``, so ``Annotated[T, msgspec.Meta(description=...)]``
    documents a parameter. A pydantic model (anywhere in an annotation) is described by its own
    ``model_json_schema``. Anything msgspec cannot describe (no annotation, a custom class,
    unresolvable forward references) becomes ``{}``: an honest "any" beats refusing the tool. The
    output is None when the return annotation is missing, ``Any`` or indescribable. A parameter
    annotated with ``context_type`` (or ``context_type | None``) is left out of the input: the
    call fills it in (see ``Parameters.context``).
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: accept any arguments
        return FunctionSchemas({"type": "object", "additionalProperties": True}, None)
    hints = _type_hints(fn)
    context = _context_parameter(signature, hints, context_type)
    params = [p for p in signature.parameters.values() if p.name != context]
    positional = None
    if params and params[0].kind is params[0].VAR_POSITIONAL:
        positional = ""
    elif params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        positional = params[0].name
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    rename: dict[str, str] = {}
    bound: list[_Param] = []
    variadic = False
    for index, param in enumerate(params):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            variadic = True
            continue
        # Synthetic attribute names sidestep names a Struct cannot hold (``__x``); rename restores them.
        attr = f"p{index}"
        rename[attr] = param.name
        annotation, default, fill = _pydantic_field(hints.get(param.name, Any), param.default)
        annotation = _describable(annotation)
        bound.append(_Param(param.name, attr, annotation, default is param.empty, param.kind, default, fill))
        if default is param.empty:
            fields.append((attr, annotation))
        elif default is None or isinstance(default, (str, int, float, bool)):
            fields.append((attr, annotation, default))  # a JSON scalar: shown as the schema default
        else:
            # Other defaults may be mutable or not JSON; the struct is only built to check an
            # input, then dropped, so an unused factory marks the field optional without putting
            # the value in the schema.
            fields.append((attr, annotation, msgspec.field(default_factory=object)))
    struct = msgspec.defstruct("Input", fields, kw_only=True, forbid_unknown_fields=not variadic, rename=rename)
    (root,), components = msgspec.json.schema_components([struct], schema_hook=_input_schema_hook)
    input_schema = inline_refs({**root, "$defs": components})
    input_schema.pop("title", None)  # the synthetic struct's name says nothing about the tool
    if variadic:
        input_schema["additionalProperties"] = True
    parameters = Parameters(struct, tuple(bound), positional, variadic, context)
    returns = hints.get("return", Any)
    if returns is Any:
        return FunctionSchemas(input_schema, None, parameters)
    try:
        (root,), components = msgspec.json.schema_components([returns], schema_hook=_output_schema_hook)
    except (TypeError, ValueError):
        return FunctionSchemas(input_schema, None, parameters)
    for component in components.values():
        if component.get("type") == "object":
            component.setdefault("additionalProperties", False)  # see "Closed" in the module docstring
    output_schema = inline_refs({**root, "$defs": components})
    return FunctionSchemas(input_schema, output_schema or None, parameters)


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The annotations of ``fn`` (a function, method, partial or callable object), or ``{}``."""
    target: Any = fn
    if isinstance(fn, functools.partial):
        target = fn.func
    elif not inspect.isroutine(fn):
        target = type(fn).__call__
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception:  # annotations are arbitrary code (bad forward refs, typos): treat as absent
        return {}


def _context_parameter(signature: inspect.Signature, hints: dict[str, Any], context_type: type | None) -> str | None:
    """The parameter annotated with ``context_type`` (bare, ``Annotated`` or ``| None``), if any.
    Raises ``ToolDefinitionError`` for two of them or one that cannot be passed by keyword."""
    if context_type is None:
        return None
    found = [p for p in signature.parameters.values() if _is_type(hints.get(p.name), context_type)]
    if not found:
        return None
    if len(found) > 1:
        raise ToolDefinitionError(f"only one parameter may take the {context_type.__name__}")
    param = found[0]
    if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
        raise ToolDefinitionError(f"the {context_type.__name__} parameter {param.name} must be passable by keyword")
    return param.name


def _is_type(annotation: Any, wanted: type) -> bool:
    """``annotation`` is ``wanted``, ``Annotated[wanted, ...]`` or ``wanted | None``."""
    if annotation is wanted:
        return True
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _is_type(args[0], wanted)
    if origin in (typing.Union, getattr(types, "UnionType", None)):
        members = [arg for arg in args if arg is not type(None)]
        return len(members) == 1 and members[0] is wanted
    return False


def _pydantic_model(cls: Any) -> bool:
    """``cls`` is a pydantic (2.x) model class (pydantic is never imported here: a tool that uses
    one has imported it already)."""
    pydantic = sys.modules.get("pydantic")
    if pydantic is None or not isinstance(cls, type) or not issubclass(cls, pydantic.BaseModel):
        return False
    return hasattr(cls, "model_validate")  # (a 1.x model is any other class: its JSON as is)


def _pydantic_field(annotation: Any, default: Any) -> tuple[Any, Any, Callable[[], Any] | None]:
    """``(annotation, default, fill)`` of a parameter that pydantic's own metadata describes
    (``Annotated[int, Field(ge=1, description=...)]``, ``= Field(5, ...)``, ``annotated_types``
    bounds): a type that pydantic alone checks and describes (`_Adapted`), the default a
    ``Field`` holds, and what makes it for a call that leaves the argument out (the function's
    own default is the ``Field`` itself); any other parameter as it is, with no ``fill``."""
    pydantic = sys.modules.get("pydantic")
    if pydantic is None:
        return annotation, default, None
    fill = None
    if isinstance(default, pydantic.fields.FieldInfo):
        annotation = typing.Annotated[annotation, default]
        if default.is_required():
            default = inspect.Parameter.empty
        else:
            fill = functools.partial(default.get_default, call_default_factory=True)
            default = fill()
    metadata = typing.get_args(annotation)[1:] if typing.get_origin(annotation) is typing.Annotated else ()
    if not any(type(item).__module__.split(".")[0] in ("pydantic", "annotated_types") for item in metadata):
        return annotation, default, fill
    try:
        adapter = pydantic.TypeAdapter(annotation)
    except Exception:  # (pydantic cannot build it: msgspec's reading, metadata ignored)
        return annotation, default, fill
    return type("Validated", (_Adapted,), {"adapter": adapter}), default, fill


class _AnyInstance(type):
    """msgspec checks that its ``dec_hook`` returns an instance of the type asked for; what an
    `_Adapted` type's adapter returns (an ``int``, a list) counts as one."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return True


class _Adapted(metaclass=_AnyInstance):
    """A parameter type that a pydantic ``TypeAdapter`` (``adapter``) checks and describes."""

    adapter: Any


def _input_schema_hook(cls: type) -> JsonSchema:
    """msgspec ``schema_hook``: a pydantic model's (or `_Adapted` type's) own schema; any other
    type msgspec cannot describe gets none, and msgspec refuses it (see `_describable`)."""
    if isinstance(cls, type) and issubclass(cls, _Adapted):
        return inline_refs(cls.adapter.json_schema())
    if not _pydantic_model(cls):
        return {}
    try:
        return inline_refs(cls.model_json_schema())  # type: ignore[attr-defined]
    except Exception:  # (a model with a field pydantic cannot describe)
        return {}


def _output_schema_hook(cls: type) -> JsonSchema:
    """`_input_schema_hook` for a result: the model's serialization schema, every object in it
    closed unless it says otherwise (``model_dump`` emits exactly the declared fields, and a
    model with ``extra="allow"`` says ``additionalProperties: true``)."""
    if not _pydantic_model(cls):
        return {}
    try:
        schema: JsonSchema = cls.model_json_schema(mode="serialization")  # type: ignore[attr-defined]
    except Exception:
        return {}
    for node in (schema, *schema.get("$defs", {}).values()):
        if isinstance(node, dict) and node.get("type") == "object" and "properties" in node:
            node.setdefault("additionalProperties", False)
    return inline_refs(schema)


def _describable(annotation: Any) -> Any:
    """``annotation`` if msgspec can describe it, pydantic through `_input_schema_hook`, else
    ``Any`` (unions of str-likes; a custom class anywhere in it: the hook gives it no schema, so
    it takes its JSON as it is, and `_from_json` never meets it)."""
    try:
        msgspec.json.schema_components([annotation], schema_hook=_input_schema_hook)
    except (TypeError, ValueError):
        return Any
    return annotation


def json_default(value: Any) -> Any:
    """msgspec ``enc_hook`` for results: a pydantic model as ``model_dump(mode="json")``."""
    if _pydantic_model(type(value)):
        return value.model_dump(mode="json")
    raise TypeError(f"Encoding objects of type {type(value).__name__} is unsupported")


def _from_json(cls: type, value: Any) -> Any:
    """msgspec ``dec_hook``: a pydantic model (or `_Adapted` type) validates its own input (its
    ``ValidationError`` becomes the conversion's cause). No other type reaches it (see `_describable`)."""
    if _pydantic_model(cls):
        return cls.model_validate(value)  # type: ignore[attr-defined]
    if isinstance(cls, type) and issubclass(cls, _Adapted):
        return cls.adapter.validate_python(value)
    raise TypeError(f"cannot convert to {cls.__name__}")


# ---- calls from inputs --------------------------------------------------------------------------


class _Param(typing.NamedTuple):
    name: str
    attr: str
    annotation: Any
    required: bool
    kind: Any
    default: Any
    #: Makes the argument when the input leaves it out (None: the function's own default).
    fill: Callable[[], Any] | None = None


#: Problems one invalid input's message lists at most, and characters of a value it quotes.
_MAX_PROBLEMS = 5
_PREVIEW_CHARS = 40


#: A tool function's arguments for one call: ``(args, kwargs)``.
BoundCall = tuple[tuple[Any, ...], dict[str, Any]]


class Parameters:
    """How a tool function is called with a JSON input: each argument converted to its
    annotation (a dataclass, msgspec ``Struct`` or pydantic model arrives as an instance),
    keyword arguments by name, positional-only ones in order, keys that only ``**kwargs`` takes
    as they are. An input that is not an object is the first parameter's value (any value, as
    it is, for ``*args``). ``context`` names the parameter the caller fills in itself (not in
    the input).
    """

    __slots__ = ("_names", "_open", "_params", "_positional", "_struct", "context")

    def __init__(
        self,
        struct: type | None,
        params: tuple[_Param, ...],
        positional: str | None,
        open_: bool,
        context: str | None,
    ) -> None:
        self._struct = struct
        self._params = params
        self._positional = positional
        self._open = open_
        self._names = frozenset(p.name for p in params)
        self.context = context

    @classmethod
    def raw(cls, context: str | None) -> Parameters:
        """An input passed as it is (a tool with an explicit input schema), ``context`` filled in."""
        return cls(None, (), None, True, context)

    @property
    def converts(self) -> bool:
        """Whether inputs are converted to the annotations (not passed as they are)."""
        return self._struct is not None

    def bind(self, value: Any) -> BoundCall | str:
        """``(args, kwargs)`` for the function, or what is wrong with ``value``: up to five
        problems as ``<path>: <problem>`` from ``$`` (``$.a: expected int, got str "1"``),
        each quoting at most 40 characters of the value given."""
        if self._struct is None:
            return ((), dict(value)) if isinstance(value, dict) else ((value,), {})
        if not isinstance(value, dict) and self._positional is not None:
            if not self._positional:
                return (value,), {}  # (``*args`` takes any value)
            value = {self._positional: value}
        try:
            converted: Any = msgspec.convert(value, self._struct, dec_hook=_from_json)
        except msgspec.ValidationError as e:
            return self._problems(value, e)
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        waiting: list[Any] = []  # positional-only defaults before a later positional-only argument
        for param in self._params:
            given = param.name in value
            if given:
                argument = getattr(converted, param.attr)
            elif param.fill is not None:
                given, argument = True, param.fill()
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                if given:
                    positional.extend(waiting)
                    waiting = []
                    positional.append(argument)
                else:
                    waiting.append(param.default)
            elif given:
                keywords[param.name] = argument
        if self._open:
            keywords.update((k, v) for k, v in value.items() if k not in self._names)
        return tuple(positional), keywords

    def _problems(self, value: Any, error: msgspec.ValidationError) -> str:
        """Every problem with ``value`` found one parameter at a time (the struct's conversion
        stops at the first), or ``error``'s alone."""
        found: list[str] = []
        if isinstance(value, dict):
            missing = [p.name for p in self._params if p.required and p.name not in value]
            if missing:
                found.append(f"$: object missing required field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
            if not self._open:
                unknown = [k for k in value if k not in self._names]
                if unknown:
                    found.append(
                        f"$: object contains unknown field{'s' if len(unknown) > 1 else ''} {_listed(unknown)}"
                    )
            for param in self._params:
                if param.name in value and len(found) <= _MAX_PROBLEMS:
                    try:
                        msgspec.convert(value[param.name], param.annotation, dec_hook=_from_json)
                    except msgspec.ValidationError as e:
                        found.extend(_conversion_problems(e, value[param.name], f"$.{param.name}"))
        if not found:
            found = _conversion_problems(error, value, "$")
        return _joined(found)


def _listed(names: list[str]) -> str:
    """Keys of a guest object, each quoted and bounded, at most five."""
    shown = ", ".join(json.dumps(_clip(name, _PREVIEW_CHARS), ensure_ascii=False) for name in names[:_MAX_PROBLEMS])
    return shown + (f" (and {len(names) - _MAX_PROBLEMS} more)" if len(names) > _MAX_PROBLEMS else "")


def _joined(problems: list[str]) -> str:
    shown = [_clip(problem, _MAX_ERROR_CHARS) for problem in problems[:_MAX_PROBLEMS]]
    more = len(problems) - len(shown)
    return "; ".join(shown) + (f" (and {more} more)" if more > 0 else "")


_AT = re.compile(r"^(.*) - at `(\$[^`]*)`$", re.S)
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+|\.\.\.)\]")


def _conversion_problems(error: msgspec.ValidationError, value: Any, base: str) -> list[str]:
    """``error`` as ``<path>: <problem>`` lines, its path under ``base``; a pydantic model's
    errors (its ``ValidationError``, the cause) one line each."""
    text = str(error)
    match = _AT.match(text)
    text, path = (match.group(1), match.group(2)) if match else (text, "$")
    at = base + path[1:]
    cause = error.__cause__
    if cause is not None and type(cause).__name__ == "ValidationError" and hasattr(cause, "errors"):
        return [_pydantic_problem(at, item) for item in cause.errors(include_url=False)]
    given = _at_path(value, path)
    if text.startswith("Invalid enum value"):
        return [f"{at}: is not one of the allowed values, got {_preview(given)}"]
    if text.startswith(_UNKNOWN_FIELD) and text.endswith("`"):
        key = text[len(_UNKNOWN_FIELD) : -1]
        return [f"{at}: object contains unknown field {json.dumps(_clip(key, _PREVIEW_CHARS), ensure_ascii=False)}"]
    problem = _lower_first(text.replace("`", ""))
    if ", got " in problem and given is not _ABSENT:
        problem = f"{problem.partition(', got ')[0]}, got {_preview(given)}"
    return [f"{at}: {problem}"]


def _pydantic_problem(at: str, item: Mapping[str, Any]) -> str:
    path = at
    for part in item.get("loc", ()):
        path += f"[{part}]" if isinstance(part, int) else f".{_clip(str(part), _PREVIEW_CHARS)}"
    problem = _lower_first(str(item.get("msg", "is invalid")))
    if item.get("type") not in ("missing", "extra_forbidden") and "input" in item:
        problem += f", got {_preview(item['input'])}"
    return f"{path}: {problem}"


_ABSENT: Any = object()
_UNKNOWN_FIELD = "Object contains unknown field `"


def _at_path(value: Any, path: str) -> Any:
    """The part of ``value`` a msgspec error path (``$.a[0]``) names, or ``_ABSENT``."""
    for match in _STEP.finditer(path):
        key, index = match.groups()
        if key is not None and isinstance(value, dict) and key in value:
            value = value[key]
        elif index is not None and index.isdigit() and isinstance(value, (list, tuple)) and int(index) < len(value):
            value = value[int(index)]
        else:
            return _ABSENT
    return value


def _preview(value: Any) -> str:
    """What a guest gave, for a message: its JSON type and, for a scalar, at most 40 characters of it."""
    if value is _ABSENT:
        return "nothing"
    kind = _json_type(value)
    if isinstance(value, str):
        shown = json.dumps(_clip(value, _PREVIEW_CHARS), ensure_ascii=False)
        return f"{kind} {shown}" + (f" ({len(value)} characters)" if len(value) > _PREVIEW_CHARS else "")
    if isinstance(value, (bool, int, float)):
        return f"{kind} {_clip(json.dumps(value), _PREVIEW_CHARS)}"
    return kind


# ---- $ref inlining ------------------------------------------------------------------------------


def inline_refs(schema: JsonSchema) -> JsonSchema:
    """A copy of ``schema`` with local ``$ref``s replaced by their targets and ``$defs`` dropped.

    Keywords beside a ``$ref`` override the target's (a field's description beats its type's
    docstring). A reference met again inside its own expansion (recursion), one that does not
    resolve, one that is not local, or one past the expansion budget is left as its sibling
    keywords alone, usually ``{}``: "any", which also makes the schema open.
    """
    budget = [_MAX_REF_EXPANSIONS]

    def walk(node: Any, active: frozenset[str], depth: int) -> Any:
        if not isinstance(node, dict):
            return node
        if depth > _MAX_DEPTH:
            return {}
        node = {k: v for k, v in node.items() if k not in ("$defs", "definitions")}
        ref = node.pop("$ref", None)
        if isinstance(ref, str) and ref not in active and budget[0] > 0:
            target = _resolve_pointer(schema, ref)
            if isinstance(target, dict):
                budget[0] -= 1
                return walk({**target, **node}, active | {ref}, depth + 1)
        return _map_children(node, lambda child: walk(child, active, depth + 1))

    result = walk(schema, frozenset(), 0)
    return result if isinstance(result, dict) else {}


def _resolve_pointer(root: JsonSchema, ref: str) -> Any:
    """The value a local ``#/json/pointer`` reference names, or None."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for raw in ref[1:].split("/")[1:]:
        part = re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), raw)
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _map_children(node: JsonSchema, fn: Callable[[Any], Any]) -> JsonSchema:
    """A copy of ``node`` with ``fn`` applied to each direct subschema (keyword-aware, so a
    property *named* like a keyword is never mistaken for one)."""
    out = dict(node)
    for key in _SCHEMA_MAPS:
        value = out.get(key)
        if isinstance(value, dict):
            out[key] = {name: fn(child) for name, child in value.items()}
    for key in _SCHEMA_LISTS:
        value = out.get(key)
        if isinstance(value, list):
            out[key] = [fn(child) for child in value]
    for key in _SCHEMA_SINGLE:
        value = out.get(key)
        if isinstance(value, dict):
            out[key] = fn(value)
    return out


# ---- rendering ----------------------------------------------------------------------------------


def input_hint(schema: JsonSchema | None, *, max_chars: int = 160) -> str:
    """A TypeScript-style signature of a tool's input, at most ``max_chars`` long.

    Objects nested deeper than three levels fold to ``{ … }``; an object that takes any keys is
    ``{ ... }``; ``const`` and ``enum`` values are TypeScript literal types (``"r" | "w"``,
    ``{ kind: "file" }``). Too long, it degrades step by step: nested objects beyond two levels,
    then beyond one, fold to ``{ … }``; then the top-level object keeps the fields that fit,
    required ones first, ending in ``; … }``; a last resort cuts the text and ends it with ``…``.
    """
    node = inline_refs(schema) if isinstance(schema, dict) else schema
    text = ""
    for keep in (_MAX_HINT_LEVELS, 2, 1):
        text = _render(node, keep, 0)
        if len(text) <= max_chars:
            return text
    if isinstance(node, dict) and _is_plain_object(node):
        fitted = _fit_fields(node, max_chars)
        if fitted is not None:
            return fitted
    return _clip(text, max_chars)


def output_hint(schema: JsonSchema | None, *, max_chars: int = 200) -> str | None:
    """The rendered output type when ``schema`` is closed and fits in ``max_chars``; else None.

    Never abbreviated: a partial shape would read as the whole promise, so the caller shows ``?``.
    """
    if not isinstance(schema, dict):
        return None
    node = inline_refs(schema)
    if not _closed(node, 0):
        return None
    text = _render(node, _MAX_DEPTH, 0)
    return text if len(text) <= max_chars else None


def _render(node: Any, keep: int, depth: int) -> str:
    """``node`` as a TypeScript type; objects more than ``keep`` levels down fold to ``{ … }``."""
    if node is False:
        return "never"
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return "unknown"
    if "const" in node:
        return _literal(node["const"])
    enum = node.get("enum")
    if isinstance(enum, list):
        return type_union([_literal(value) for value in enum])
    for key in ("anyOf", "oneOf"):
        members = node.get(key)
        if isinstance(members, list) and members:
            return type_union([_render(member, keep, depth + 1) for member in members])
    members = node.get("allOf")
    if isinstance(members, list) and members:
        parts = [_render(member, keep, depth + 1) for member in members]
        return " & ".join(f"({part})" if " | " in part else part for part in parts)
    kinds = _types(node)
    return type_union([_render_type(node, kind, keep, depth) for kind in kinds]) if kinds else "unknown"


def _render_type(node: JsonSchema, kind: str, keep: int, depth: int) -> str:
    if kind == "object":
        return _render_object(node, keep, depth)
    if kind == "array":
        return _render_array(node, keep, depth)
    return _PRIMITIVES.get(kind, "unknown")


def _render_object(node: JsonSchema, keep: int, depth: int) -> str:
    properties = schema_properties(node)
    extra = node.get("additionalProperties")
    if not properties:
        if extra is False:
            return "{}"
        if not isinstance(extra, dict) or not extra:
            return _OPEN
        return f"Record<string, {_render(extra, keep, depth + 1)}>"
    if keep <= 0:
        return _FOLDED
    required = schema_required(node)
    fields = [_field(name, sub, name in required, keep - 1, depth + 1) for name, sub in properties.items()]
    if extra is True or isinstance(extra, dict):  # only an explicit opening: JSON Schema's default is noise
        value = _render(extra, keep - 1, depth + 1) if isinstance(extra, dict) else "unknown"
        fields.append(f"[key: string]: {value}")
    return "{ " + "; ".join(fields) + " }"


def tuple_form(node: Mapping[str, Any]) -> tuple[list[Any], Any] | None:
    """An array schema's tuple form as ``(members, rest)`` (``rest`` False: nothing after the
    members), from ``prefixItems`` or draft-07's list ``items``; None for a plain array."""
    items = node.get("items")
    prefix = node.get("prefixItems")
    if isinstance(prefix, list):
        return prefix, items if "items" in node else True
    if isinstance(items, list):  # draft-07 tuple form
        return items, node.get("additionalItems", True)
    return None


def _render_array(node: JsonSchema, keep: int, depth: int) -> str:
    form = tuple_form(node)
    if form is None:
        items = node.get("items")
        if items is False:
            return "[]"
        return array_of(_render(items, keep, depth + 1) if isinstance(items, dict) else "unknown")
    prefix, rest = form
    parts = [_render(item, keep, depth + 1) for item in prefix]
    if rest is not False:
        parts.append("..." + array_of(_render(rest, keep, depth + 1) if isinstance(rest, dict) else "unknown"))
    return "[" + ", ".join(parts) + "]"


def _field(name: str, schema: Any, required: bool, keep: int, depth: int) -> str:
    return f"{_key(name)}{'' if required else '?'}: {_render(schema, keep, depth)}"


def _key(name: str) -> str:
    """An object key as TypeScript writes it: bare when it is an identifier, else quoted."""
    return name if _IDENT.fullmatch(name) else json.dumps(name)


def _fit_fields(node: JsonSchema, max_chars: int) -> str | None:
    """The top-level object with nested objects folded and only the fields that fit (required
    first, then optional, each in schema order), marked incomplete by a trailing ``…``."""
    properties = schema_properties(node)
    required = schema_required(node)
    order = [name for name in properties if name in required] + [name for name in properties if name not in required]
    chosen: list[str] = []
    for name in order:
        field = _field(name, properties[name], name in required, 0, 1)
        if len("{ " + "; ".join([*chosen, field, _ELLIPSIS]) + " }") <= max_chars:
            chosen.append(field)
    text = "{ " + "; ".join([*chosen, _ELLIPSIS]) + " }"
    return text if len(text) <= max_chars else None


def _is_plain_object(node: JsonSchema) -> bool:
    """Whether ``node`` renders as an object literal with fields (so fields can be dropped)."""
    combinators = ("const", "enum", "anyOf", "oneOf", "allOf")
    return not any(key in node for key in combinators) and _types(node) == ["object"] and bool(schema_properties(node))


def _types(node: JsonSchema) -> list[str]:
    """The JSON types ``node`` allows, inferred from its keywords when ``type`` is absent."""
    declared = node.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return list(dict.fromkeys(kind for kind in declared if isinstance(kind, str)))
    if any(key in node for key in ("properties", "additionalProperties", "required")):
        return ["object"]
    if "items" in node or "prefixItems" in node:
        return ["array"]
    return []


def schema_properties(node: Mapping[str, Any]) -> dict[str, Any]:
    """A schema node's ``properties`` by name ({} when absent or not an object)."""
    properties = node.get("properties")
    return {str(name): sub for name, sub in properties.items()} if isinstance(properties, Mapping) else {}


def schema_required(node: Mapping[str, Any]) -> set[str]:
    """A schema node's ``required`` names (strings only)."""
    required = node.get("required")
    return {name for name in required if isinstance(name, str)} if isinstance(required, list) else set()


def type_union(parts: list[str]) -> str:
    """A TypeScript union of ``parts`` (deduplicated; ``unknown`` absorbs the rest)."""
    unique = list(dict.fromkeys(parts))
    if not unique:
        return "never"
    return "unknown" if "unknown" in unique else " | ".join(unique)


def array_of(item: str) -> str:
    """``string[]`` for a simple item type, else ``Array<…>``: the grouping of an item that is an
    object or a union stays with it."""
    return f"{item}[]" if _SIMPLE_TYPE.fullmatch(item) else f"Array<{item}>"


def _clip(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars``, the cut marked by a final ``…``."""
    if len(text) <= max_chars:
        return text
    return text[: max_chars - 1] + _ELLIPSIS if max_chars > 0 else ""


def _literal(value: Any, depth: int = 0) -> str:
    """A JSON value as a TypeScript literal type: ``"r"``, ``-1``, ``true``, ``null``,
    ``{ kind: "file"; n: 1 }``, ``[1, "a"]``; bounded in depth and width (``{ … }``,
    ``unknown[]``, ``...unknown[]``). Strings use ASCII-only escapes, so a hint stays on one line
    whatever the schema holds (e.g. U+2028)."""
    if isinstance(value, dict):
        if not value:
            return "{}"
        if depth >= _MAX_LITERAL_DEPTH:
            return _FOLDED
        fields = [f"{_key(str(k))}: {_literal(v, depth + 1)}" for k, v in list(value.items())[:_MAX_LITERAL_ITEMS]]
        return "{ " + "; ".join(fields + ([_ELLIPSIS] if len(value) > _MAX_LITERAL_ITEMS else [])) + " }"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        if depth >= _MAX_LITERAL_DEPTH:
            return "unknown[]"
        items = [_literal(v, depth + 1) for v in value[:_MAX_LITERAL_ITEMS]]
        return "[" + ", ".join(items + (["...unknown[]"] if len(value) > _MAX_LITERAL_ITEMS else [])) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return "number"  # not JSON, and no TypeScript literal type
    if value is None or isinstance(value, (bool, int, float, str)):
        return json.dumps(value)
    return json.dumps(str(value))  # a Python default msgspec let through (an Enum member...)


def _closed(node: Any, depth: int) -> bool:
    """Whether ``node`` fixes the whole shape of a value (see "Closed" in the module docstring).

    Checks keywords in the same precedence as :func:`_render`, so a closed schema never renders
    ``unknown``.
    """
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return False
    if "const" in node or isinstance(node.get("enum"), list):
        return True
    for key in ("anyOf", "oneOf"):
        members = node.get(key)
        if isinstance(members, list) and members:
            return all(_closed(member, depth + 1) for member in members)
    if "allOf" in node:
        return False  # closed objects intersect to nothing useful; keep the promise simple
    kinds = _types(node)
    return bool(kinds) and all(_closed_type(node, kind, depth) for kind in kinds)


def _closed_type(node: JsonSchema, kind: str, depth: int) -> bool:
    if kind in _PRIMITIVES:
        return True
    if kind == "object":
        return (
            node.get("additionalProperties") is False
            and "patternProperties" not in node
            and all(_closed(sub, depth + 1) for sub in schema_properties(node).values())
        )
    if kind == "array":
        items = node.get("items")
        prefix = node.get("prefixItems")
        if isinstance(prefix, list):
            rest = items if "items" in node else True
        elif isinstance(items, list):
            prefix, rest = items, node.get("additionalItems", True)
        else:
            return items is False or _closed(items, depth + 1)
        closed_rest = rest is False or _closed(rest, depth + 1)
        return closed_rest and all(_closed(item, depth + 1) for item in prefix)
    return False


# ---- the quick index ----------------------------------------------------------------------------


def quick_index(entries: Iterable[Mapping[str, Any]], *, max_chars: int = 4000) -> str:
    """The bounded tool list for the ``exec`` description: ``- <id> <input> -> <output or ?>``.

    ``input`` and ``output`` are the rendered hints. Tools with a declared output come first (the
    model can chain them without probing), then the rest, each group by id; MCP and client tools
    are left to ``tools.search`` (their schemas are untrusted, MCP ones often large). Descriptions are never
    included: they are untrusted prose and the costliest part. Lines stop before ``max_chars``
    would be exceeded, and a footer counts the tools left out that ``tools.search`` can find.
    """
    searchable = [entry for entry in entries if entry.get("source") != "mcp"]
    # The spec lists exact host/plugin ids only: client tools (untrusted schemas) stay behind
    # `tools.search`/`ALL_TOOLS` with the overflow, and are counted in the footer.
    listed = sorted(
        (entry for entry in searchable if entry.get("source") != "client"),
        key=lambda entry: (entry.get("output") is None, str(entry.get("id"))),
    )
    lines = [
        f"- {entry.get('id')} {entry.get('input') or 'unknown'} -> {entry.get('output') or '?'}" for entry in listed
    ]

    def render(shown: int) -> str:
        omitted = len(searchable) - shown
        footer = [f"(+{omitted} more: use tools.search(...) or ALL_TOOLS)"] if omitted else []
        return "\n".join([*lines[:shown], *footer])

    best = render(0)
    body = -1  # length of "\n".join(lines[:shown]), counting the separator before the next line
    for shown, line in enumerate(lines, start=1):
        body += len(line) + 1
        if body > max_chars:
            break
        text = render(shown)
        if len(text) <= max_chars:
            best = text
    return _clip(best, max_chars)


# ---- search -------------------------------------------------------------------------------------


def search_fields(input_schema: JsonSchema | None, output_schema: JsonSchema | None) -> list[str]:
    """Trusted text to index for ``tools.search``: property names and descriptions.

    Walks the input schema and, when it is closed, the output schema (an open one describes data
    the host does not vouch for), depth first in schema order; deduplicated and capped at
    64 strings of at most 200 characters so one tool cannot flood the index.
    """
    found: dict[str, None] = {}
    if isinstance(input_schema, dict):
        _collect(inline_refs(input_schema), found, 0)
    if isinstance(output_schema, dict):
        output = inline_refs(output_schema)
        if _closed(output, 0):
            _collect(output, found, 0)
    return list(found)[:_MAX_SEARCH_FIELDS]


def _collect(node: Any, found: dict[str, None], depth: int) -> None:
    if not isinstance(node, dict) or depth > _MAX_DEPTH or len(found) >= _MAX_SEARCH_FIELDS:
        return
    _add_field(found, node.get("description"))
    for name, sub in schema_properties(node).items():
        _add_field(found, name)
        _collect(sub, found, depth + 1)
    for child in _children(node, skip="properties"):
        _collect(child, found, depth + 1)


def _add_field(found: dict[str, None], text: Any) -> None:
    if isinstance(text, str) and text.strip():
        found.setdefault(text.strip()[:_MAX_SEARCH_FIELD_CHARS], None)


def _children(node: JsonSchema, *, skip: str) -> Iterator[Any]:
    """The direct subschemas of ``node`` in keyword order, except those under ``skip``."""
    for key in _SCHEMA_MAPS:
        value = node.get(key)
        if key != skip and isinstance(value, dict):
            yield from value.values()
    for key in _SCHEMA_LISTS:
        value = node.get(key)
        if isinstance(value, list):
            yield from value
    for key in _SCHEMA_SINGLE:
        value = node.get(key)
        if isinstance(value, dict):
            yield value


# ---- output validation --------------------------------------------------------------------------


class _NoRemoteRefs(Mapping[str, Callable[[str], Any]]):
    """fastjsonschema fetches a ``$ref`` URI with urllib unless a handler claims its scheme; this
    claims every scheme and refuses, so compiling a schema never touches the network."""

    def __getitem__(self, scheme: str) -> Callable[[str], Any]:
        return _refuse_remote

    def __contains__(self, scheme: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _refuse_remote(uri: str) -> Any:
    raise fastjsonschema.JsonSchemaDefinitionException(f"remote $ref {uri!r} is not allowed")


def compile_output_validator(schema: JsonSchema) -> Callable[[Any], str | None]:
    """A validator for a tool's JSON-decoded result: None when valid, else a short message.

    Compiled once, when the tool is registered. Messages name the failing location and rule but
    never quote the value (results can hold secrets and the message reaches the model): keys that
    the schema does not declare show as ``*``. ``format`` is not enforced (an annotation in JSON
    Schema 2020-12, which msgspec targets), and ``prefixItems`` is translated for
    fastjsonschema's draft 7. Raises :class:`ToolDefinitionError` if the schema cannot be compiled.
    """
    try:
        draft7 = _to_draft7(schema)
        validate = fastjsonschema.compile(draft7, handlers=_NoRemoteRefs(), use_default=False, use_formats=False)
    except Exception as e:  # a code generator over arbitrary input: any failure means a bad schema
        raise ToolDefinitionError(f"invalid output schema: {e}") from e
    declared = set(_declared_names(schema, 0))

    def check(value: Any) -> str | None:
        try:
            validate(value)
        except fastjsonschema.JsonSchemaValueException as e:
            return _error_message(e, declared)
        return None

    return check


def _to_draft7(node: Any) -> Any:
    """2020-12 tuples (``prefixItems`` + ``items``) as draft 7 (``items`` list + ``additionalItems``)."""
    if not isinstance(node, dict):
        return node
    out = _map_children(node, _to_draft7)
    prefix = out.pop("prefixItems", None)
    if isinstance(prefix, list):
        rest = out.pop("items", None)
        out["items"] = prefix
        if rest is not None:
            out["additionalItems"] = rest
    return out


def _declared_names(node: Any, depth: int) -> Iterator[str]:
    """Every property name the schema declares: the only keys safe to show in an error path."""
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return
    yield from schema_properties(node)
    yield from schema_required(node)
    for child in _children(node, skip=""):
        yield from _declared_names(child, depth + 1)


def _rule_problem(rule: str | None, definition: Any) -> str:
    """What a value breaks, for the rules an output check and an input check word alike."""
    if rule in ("enum", "const"):
        return "is not one of the declared values"
    if rule in ("anyOf", "oneOf"):
        return "does not match the allowed shapes"
    if isinstance(definition, (int, float, str)) and not isinstance(definition, bool):
        return f"violates {rule} {definition}"  # a bound from the schema, never from the value
    return f"violates {rule}" if rule else "is invalid"


def _error_message(error: fastjsonschema.JsonSchemaValueException, declared: set[str]) -> str:
    path = "data"
    for part in error.path[1:]:
        if _INDEX.fullmatch(part):
            path += f"[{part}]"
        else:
            path += "." + (part if part in declared else "*")
    rule, definition = error.rule, error.rule_definition
    if rule == "type":
        kinds = definition if isinstance(definition, list) else [definition]
        problem = "must be " + " or ".join(str(kind) for kind in kinds)
    elif rule == "required":
        present = error.value if isinstance(error.value, dict) else {}
        missing = [name for name in definition or [] if name not in present]
        problem = "is missing required properties " + ", ".join(str(name) for name in missing)
    elif rule == "additionalProperties":
        problem = "has properties the schema does not declare"
    else:
        problem = _rule_problem(rule, definition)
    return _clip(f"{path} {problem}", _MAX_ERROR_CHARS)


# ---- input validation ---------------------------------------------------------------------------


def compile_input_validator(
    schema: JsonSchema | None = None,
    *,
    input_type: type | None = None,
    positional: str | None = None,
    trusted: bool = True,
) -> Callable[[Any], str | None] | None:
    """A check of a tool's JSON-decoded input: None when valid, else ``<path>: <problem>``, the
    path from ``$`` (``$.n: expected int, got str``). The guest made the input, so the message
    may quote its keys.

    ``input_type`` (a function's parameters as a msgspec struct) is checked by conversion, so the
    type hints themselves decide (``Annotated`` constraints included); an input that is not an
    object is the tool's first argument (see ``FunctionSchemas.positional``) and is checked as
    that parameter. Otherwise ``schema`` is
    compiled with fastjsonschema: a trusted (host) schema now, raising
    :class:`ToolDefinitionError` if it cannot be compiled; an untrusted (MCP, client) one on
    first use, and only if it is at most 16 KiB, has no ``patternProperties`` and compiles: its
    ``pattern``s are dropped (a server's regular expression must not let a guest's string stall
    the host), and a schema that cannot be used gets no host-side check (its server validates).
    None when there is nothing to check with.
    """
    if input_type is not None:
        return functools.partial(_convert_check, input_type, positional)
    if not isinstance(schema, dict):
        return None
    if trusted:
        validate = _compile_input_schema(schema)
        return functools.partial(_schema_check, validate)
    return _LazyInputCheck(schema)


def _convert_check(input_type: type, positional: str | None, value: Any) -> str | None:
    if not isinstance(value, dict) and positional is not None:
        if not positional:
            return None  # (``*args`` takes any value)
        value = {positional: value}
    try:
        msgspec.convert(value, input_type)
    except msgspec.ValidationError as e:
        return _joined(_conversion_problems(e, value, "$"))
    return None


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _compile_input_schema(schema: JsonSchema, *, strip_patterns: bool = False) -> Callable[[Any], Any]:
    draft7 = _to_draft7(_without_patterns(schema) if strip_patterns else schema)
    try:
        return fastjsonschema.compile(draft7, handlers=_NoRemoteRefs(), use_default=False, use_formats=False)
    except Exception as e:  # a code generator over arbitrary input: any failure means a bad schema
        raise ToolDefinitionError(f"invalid input schema: {e}") from e


def _schema_check(validate: Callable[[Any], Any], value: Any) -> str | None:
    try:
        validate(value)
    except fastjsonschema.JsonSchemaValueException as e:
        return _input_problem(e)
    return None


class _LazyInputCheck:
    """An untrusted schema's check, compiled on first use (an MCP server may list hundreds of
    tools a run never calls); a schema that cannot be used checks nothing."""

    def __init__(self, schema: JsonSchema) -> None:
        self._schema: JsonSchema | None = schema
        self._validate: Callable[[Any], Any] | None = None

    def __call__(self, value: Any) -> str | None:
        schema = self._schema
        if schema is not None:
            # (Two threads may compile it at once: the same result, one kept.)
            self._validate = _untrusted_validator(schema)
            self._schema = None
        validate = self._validate
        return None if validate is None else _schema_check(validate, value)


def _untrusted_validator(schema: JsonSchema) -> Callable[[Any], Any] | None:
    try:
        size = len(msgspec.json.encode(schema))
    except Exception:  # (bounded_schema lets only JSON through; this is the last line)
        return None
    if size > _MAX_CHECKED_SCHEMA_BYTES or _has_key(schema, "patternProperties", 0):
        return None
    try:
        return _compile_input_schema(schema, strip_patterns=True)
    except ToolDefinitionError:
        return None


def _without_patterns(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    out = _map_children(node, _without_patterns)
    out.pop("pattern", None)
    return out


def _has_key(node: Any, key: str, depth: int) -> bool:
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return False
    return key in node or any(_has_key(child, key, depth + 1) for child in _children(node, skip=""))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    for kinds, name in ((int, "int"), (float, "float"), (str, "str"), (dict, "object"), ((list, tuple), "array")):
        if isinstance(value, kinds):
            return name
    return type(value).__name__


def _input_problem(error: fastjsonschema.JsonSchemaValueException) -> str:
    """``<path>: <problem>`` for an input (the guest's own keys may show)."""
    path = "$"
    for part in error.path[1:]:
        path += f"[{part}]" if _INDEX.fullmatch(part) else f".{part}"
    rule, definition = error.rule, error.rule_definition
    if rule == "type":
        kinds = definition if isinstance(definition, list) else [definition]
        problem = f"expected {' or '.join(str(kind) for kind in kinds)}, got {_preview(error.value)}"
    elif rule == "required":
        present = error.value if isinstance(error.value, dict) else {}
        missing = [str(name) for name in definition or [] if name not in present]
        problem = "object missing required field " + ", ".join(missing)
    elif rule == "additionalProperties":
        problem = "object has fields the schema does not declare"
    else:
        problem = _rule_problem(rule, definition)
    return _clip(f"{path}: {problem}", _MAX_ERROR_CHARS)


# ---- bounds on catalog text ---------------------------------------------------------------------


def bounded_text(text: str, max_chars: int) -> str:
    """``text`` cut to at most ``max_chars``, the cut marked with how much was left out."""
    if len(text) <= max_chars:
        return text
    marker = f"… [{len(text) - max_chars} more characters cut]"
    return text[: max(0, max_chars - len(marker))] + marker


def bounded_schema(schema: JsonSchema | None) -> tuple[JsonSchema | None, str | None]:
    """``(schema, None)`` if ``schema`` fits the catalog (JSON, at most 256 KiB and 64 levels
    deep), else ``(a stand-in that accepts anything and says why, why)``."""
    if not isinstance(schema, dict):
        return schema, None
    try:
        size = len(msgspec.json.encode(schema))
    except Exception as e:  # a value msgspec cannot encode, or one nested past the interpreter's limit
        why = f"it is not JSON ({type(e).__name__})"
    else:
        if size > MAX_SCHEMA_BYTES:
            why = f"it is {size} bytes, over the {MAX_SCHEMA_BYTES}-byte limit"
        elif _nested_deeper(schema, MAX_SCHEMA_DEPTH):
            why = f"it is nested deeper than {MAX_SCHEMA_DEPTH} levels"
        else:
            return schema, None
    return {"description": f"(schema left out of the catalog: {why})"}, why


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests deeper than ``limit`` (iterative: any depth is safe)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, (list, tuple)) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
