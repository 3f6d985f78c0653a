"""Configuration loading shared by every service: a YAML file plus ``WALTZ_*`` environment variables.

Keys in the YAML file are Waltz's dotted names (``storage.port``, ``storage.admin.port``, ...),
written flat (``storage.port: 55280``) or nested (``storage: {port: 55280}``). Environment
variables override the file; each setting's variable is listed in ``docs/configuration.md``.
Precedence: explicit keyword arguments > environment > file > defaults.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

import yaml
from pydantic import BeforeValidator, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from waltz.errors import ConfigurationError
from waltz.logs import IGNORED_VARIABLES_LOGGER

__all__ = ["Port", "WaltzSettings", "flatten_keys", "load_settings"]

log = logging.getLogger(__name__)
#: Shown whatever the log level (:func:`waltz.logs.configure_logging`).
ignored_variables_log = logging.getLogger(IGNORED_VARIABLES_LOGGER)

S = TypeVar("S", bound="WaltzSettings")


def _whole_number(value: Any) -> Any:
    """Refuse what pydantic would make a port of by rounding or truth: a boolean (``yes`` in YAML
    is true, which is 1) and a decimal (``1.0``), as a number or as text."""
    if isinstance(value, bool | float) or (
        isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value) is None and value.strip()
    ):
        raise ValueError(
            "a port is a whole number (digits alone), not a boolean (yes, no, true, false) nor a decimal"
        )
    return value


#: A port setting: an integer as written, never a boolean or a decimal taken as one (the range is
#: each field's own: ``Field(ge=0, le=65535)``; docs/configuration.md).
Port = Annotated[int, BeforeValidator(_whole_number)]


#: Dotted keys a configuration file may expand to at most (YAML aliases can multiply them).
MAX_FLATTENED_KEYS = 10_000


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping of a configuration file gives the same key twice (docs/configuration.md): YAML
    would keep the last one without a word."""

    def __init__(self, key: str, first: yaml.Mark | None, second: yaml.Mark | None) -> None:
        super().__init__(problem=f"the key {key} is given twice", problem_mark=second)
        self.key = key
        self.lines = tuple(mark.line + 1 for mark in (first, second) if mark is not None)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (merged keys, ``<<``, may be
    overridden as YAML allows)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark | None] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                given = key in seen
            except TypeError:  # an unhashable key: the base constructor says so
                continue
            if given:
                raise DuplicateKeyError(str(key), seen[key], key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def flatten_keys(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings into dotted keys: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``.

    Raises:
        ConfigurationError: a mapping contains itself (a YAML alias to an enclosing node), the
            keys expand past :data:`MAX_FLATTENED_KEYS` (aliases of aliases), or two keys name
            the same dotted key (``storage.port`` and ``storage: {port: ...}``).
    """
    flat: dict[str, Any] = {}
    _flatten_into(flat, data, prefix, ())
    return flat


def _flatten_into(
    flat: dict[str, Any], data: Mapping[str, Any], prefix: str, enclosing: tuple[int, ...]
) -> None:
    if id(data) in enclosing:
        raise ConfigurationError(
            f"the value of {prefix.rstrip('.') or 'the file'} contains itself (a YAML alias)"
        )
    enclosing = (*enclosing, id(data))
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            _flatten_into(flat, value, name + ".", enclosing)
        else:
            if name in flat:
                raise ConfigurationError(f"the key {name} is given twice (dotted and nested): keep one")
            flat[name] = value
            if len(flat) > MAX_FLATTENED_KEYS:
                raise ConfigurationError(f"more than {MAX_FLATTENED_KEYS} keys (YAML aliases of aliases?)")


class _MappingSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


class WaltzSettings(BaseSettings):
    """Base class of the services' settings.

    Subclasses set ``model_config = SettingsConfigDict(env_prefix="WALTZ_<SERVICE>_")`` and map
    each Waltz dotted key to a field name in ``KEYS``.
    """

    #: Errors name the setting, never its value: a value may be a credential. Infinity and NaN are
    #: no setting's value: a timeout, an interval or a limit of either breaks the arithmetic on it.
    model_config = SettingsConfigDict(hide_input_in_errors=True, allow_inf_nan=False)

    KEYS: ClassVar[dict[str, str]] = {}
    #: Prefixes of the environment variables that belong to this class alone (``WALTZ_STORAGE_``):
    #: a variable under one of them that names no field, but nearly one, is said to be ignored.
    ENV_GROUPS: ClassVar[tuple[str, ...]] = ()
    _file_values: ClassVar[dict[str, Any]] = {}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _MappingSource(settings_cls, dict(cls._file_values))

    def __init__(self, **values: Any) -> None:
        """Validate the settings; a setting that is missing is named with where to give it.

        Raises:
            pydantic.ValidationError: a value is invalid or missing. A missing one's message names
                its environment variable and file key, and a set variable that nearly spells it.
        """
        try:
            super().__init__(**values)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False)
            if not errors or any(error.get("type") != "missing" for error in errors):
                raise
            cls = type(self)
            details = [
                InitErrorDetails(
                    type=PydanticCustomError(
                        "missing", "{hint}", {"hint": _where_to_set(cls, str(error["loc"][0]), os.environ)}
                    ),
                    loc=error["loc"],
                    input={},
                )
                for error in errors
            ]
            raise ValidationError.from_exception_data(cls.__name__, details, hide_input=True) from None

    @model_validator(mode="before")
    @classmethod
    def _only_known_names(cls, data: Any) -> Any:
        """Refuse a name that is no field, saying which field was meant (and warn of environment
        variables that nearly name one: :func:`_warn_of_misspelt_variables`).

        Python code names a setting by its field (``client_auto_mount``), a file by its dotted key
        (``client.autoMount``): docs/configuration.md lists both. A keyword given as the key, or
        without the field's prefix, gets the field named in the error.
        """
        _warn_of_misspelt_variables(cls, os.environ)
        if not isinstance(data, Mapping):
            return data
        unknown = [name for name in data if name not in cls.model_fields]
        if unknown:
            raise ValueError("; ".join(cls._hint(str(name)) for name in unknown))
        return data

    @classmethod
    def file_key(cls, field: str) -> str | None:
        """The dotted key of ``field`` in a YAML file (``KEYS``), or None when it has none."""
        return next((key for key, name in cls.KEYS.items() if name == field), None)

    @classmethod
    def env_variable(cls, field: str) -> str:
        """The environment variable of ``field`` (``WALTZ_CLIENT_AUTO_MOUNT``)."""
        return (str(cls.model_config.get("env_prefix") or "") + field).upper()

    @classmethod
    def _hint(cls, name: str) -> str:
        field = cls.KEYS.get(name)
        if field is None:
            suffixed = [f for f in cls.model_fields if f.endswith("_" + name)]
            close = suffixed or difflib.get_close_matches(name, list(cls.model_fields), n=3, cutoff=0.6)
            if len(close) == 1:
                field = close[0]
            elif close:
                return f"{cls.__name__} has no setting {name!r}; did you mean one of {', '.join(close)}?"
        if field is None:
            return f"{cls.__name__} has no setting {name!r}; docs/configuration.md lists its fields"
        key = cls.file_key(field)
        known_as = f" (the key {key} in a file)" if key else ""
        return f"{cls.__name__} has no setting {name!r}; did you mean {field}{known_as}?"


def load_settings(cls: type[S], path: Path | str | None = None, **overrides: Any) -> S:
    """Load settings from an optional YAML file, the environment and explicit overrides.

    Args:
        cls: the settings class.
        path: a YAML file with Waltz dotted keys (a path or a string), or None.
        overrides: field values that win over everything else (e.g. from command-line options);
            None values are ignored.

    Raises:
        ConfigurationError: the file cannot be read, holds unknown keys, or a value is invalid.
    """
    file_values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            loaded = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
        except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: not UTF-8
            raise ConfigurationError(f"cannot read configuration file {path}: {_yaml_problem(exc)}") from exc
        if not isinstance(loaded, Mapping):
            raise ConfigurationError(
                f"configuration file {path} must be YAML holding a mapping of keys to values "
                "(lines such as 'storage.port: 55280'), not key=value lines nor TOML tables"
            )
        try:
            flat = flatten_keys(loaded)
        except ConfigurationError as exc:
            raise ConfigurationError(f"configuration file {path}: {exc}") from exc
        unknown = []
        for key, value in flat.items():
            field = cls.KEYS.get(key)
            if field is None:
                unknown.append(key)
            else:
                file_values[field] = value
        if unknown:
            named = ", ".join(_with_a_guess(key, cls.KEYS) for key in sorted(unknown))
            raise ConfigurationError(
                f"unknown keys in {path}: {named}; known keys: {', '.join(sorted(cls.KEYS))}"
            )
    loader = type(cls.__name__, (cls,), {"_file_values": file_values})
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        settings = loader(**given)
    except ValidationError as exc:
        sources = _sources(cls, given, os.environ, file_values, path)
        if path is None:
            read = ""
        elif _only_from(exc, sources, f"the file {path}"):
            read = f" in {path}"
        else:  # named, not blamed: each line says where its value came from
            read = f" (read from {path}, the environment and the options)"
        raise ConfigurationError(f"invalid configuration{read}:\n{_explained(cls, exc, sources)}") from exc
    except SettingsError as exc:  # a list or mapping from the environment that is not JSON
        raise ConfigurationError(_unparsed_variable(cls, exc)) from exc
    return cls.model_validate(settings.model_dump())


def _yaml_problem(exc: BaseException) -> str:
    """What is wrong with a configuration file, and where, without quoting its text: PyYAML's own
    message shows the offending line, which may hold a credential (docs/configuration.md)."""
    if isinstance(exc, DuplicateKeyError):
        lines = " and ".join(str(line) for line in exc.lines)
        return f"the key {exc.key} is given twice (lines {lines}): keep one"
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc)  # the file's absence, a directory, bytes that are not UTF-8: no contents
    parts = []
    for said, mark in ((exc.context, exc.context_mark), (exc.problem, exc.problem_mark)):
        if said:
            parts.append(f"{said} (line {mark.line + 1}, column {mark.column + 1})" if mark else said)
    return f"not valid YAML: {'; '.join(parts) or 'a syntax error'}"


def _unparsed_variable(cls: type[S], exc: SettingsError) -> str:
    """The error of an environment variable that pydantic-settings could not decode as JSON (a
    list setting), naming the variable, never its value."""
    match = re.search(r'field "([^"]+)"', str(exc))
    field = match.group(1) if match else ""
    if field not in cls.model_fields:
        return f"invalid configuration: {exc}"
    return (
        f"invalid configuration: the environment variable {cls.env_variable(field)} must be JSON, "
        f"as docs/configuration.md shows (a list is written [0, 1]); {field} could not be read from it"
    )


def _with_a_guess(key: str, known: Mapping[str, str]) -> str:
    """``key``, followed by the known key it nearly names, if one (``client.ssl.cafile (did you
    mean client.ssl.caFile?)``)."""
    by_lower = {name.lower(): name for name in known}
    close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.8)
    return f"{key} (did you mean {by_lower[close[0]]}?)" if close else key


#: (settings class name, variable) pairs already warned of: once per process, however many times
#: the settings are built.
_warned_variables: set[tuple[str, str]] = set()


def _warn_of_misspelt_variables(cls: type[WaltzSettings], environ: Mapping[str, str]) -> None:
    """Log a warning, once per process, for each variable under the class's
    :attr:`~WaltzSettings.ENV_GROUPS` that names no setting but nearly names one
    (``WALTZ_STORAGE_SSL_CERT_FILE`` for ``WALTZ_STORAGE_TLS_CERT_FILE``): it is ignored, and a
    TLS file ignored may mean plaintext. The commands show it whatever their log level
    (:data:`waltz.logs.IGNORED_VARIABLES_LOGGER`)."""
    if not cls.ENV_GROUPS:
        return
    known = [cls.env_variable(field) for field in cls.model_fields]
    for name in sorted(environ):
        if not name.startswith(cls.ENV_GROUPS) or name in known or (cls.__name__, name) in _warned_variables:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        if close:
            _warned_variables.add((cls.__name__, name))
            ignored_variables_log.warning(
                "the environment variable %s is no setting of %s and is ignored; did you mean %s? "
                "(docs/configuration.md lists them)",
                name,
                cls.__name__,
                close[0],
            )


def _where_to_set(cls: type[WaltzSettings], field: str, environ: Mapping[str, str]) -> str:
    """Where a missing setting is given: its environment variable, its key in a file, and a set
    variable that nearly spells the first (``WALTZ_ZOOKEPER_CONNECT_STRING``)."""
    variable = cls.env_variable(field)
    key = cls.file_key(field)
    ways = [f"the environment variable {variable}"] + ([f"{key} in a configuration file"] if key else [])
    text = f"not set: give {' or '.join(ways)}, or the argument {field}="
    close = difflib.get_close_matches(
        variable, [name for name in environ if name.startswith("WALTZ_")], n=1, cutoff=0.85
    )
    if close and close[0] != variable:
        text += f" ({close[0]} is set: a misspelling of {variable}?)"
    if field in ("zookeeper_connect_string", "cluster_root"):
        text += "; `waltz up` prints both variables of a local cluster"
    return text


def _sources(
    cls: type[S],
    given: Mapping[str, Any],
    environ: Mapping[str, str],
    file_values: Mapping[str, Any],
    path: Path | None,
) -> dict[str, str]:
    """Where each set field's value came from, by precedence (docs/configuration.md): a command's
    option or argument, then the environment variable, then the file."""
    variables = {name.upper() for name in environ}
    sources: dict[str, str] = {}
    for field in cls.model_fields:
        variable = cls.env_variable(field)
        if field in given:
            sources[field] = "a command option or argument"
        elif variable in variables:
            sources[field] = f"the environment variable {variable}"
        elif field in file_values and path is not None:
            sources[field] = f"the file {path}"
    return sources


def _only_from(exc: ValidationError, sources: Mapping[str, str], source: str) -> bool:
    """Whether every problem of ``exc`` is of a value that came from ``source``."""
    fields = [str(error["loc"][0]) if error.get("loc") else "" for error in exc.errors(include_url=False)]
    return bool(fields) and all(sources.get(field) == source for field in fields)


def _explained(cls: type[S], exc: ValidationError, sources: Mapping[str, str] | None = None) -> str:
    """One line per problem of ``exc``, each naming the setting's field, its key in a file and its
    environment variable (a missing setting says where to set it), and where the value came from
    (``sources``: field -> an option, a variable or the file), never the value."""
    sources = sources or {}
    lines = []
    for error in exc.errors(include_url=False, include_input=False):
        location = error.get("loc") or ()
        field = str(location[0]) if location else ""
        key = cls.file_key(field)
        ways = [f"{key} in a --config file"] if key else []
        if field in cls.model_fields:
            ways.append(f"the environment variable {cls.env_variable(field)}")
        where = ", ".join(ways)
        if error.get("type") == "missing":
            lines.append(f"- {field} is not set: give {where or 'it'}, or the command's option for it")
        else:
            named = f"{field} ({where})" if where else (field or cls.__name__)
            source = f" (set by {sources[field]})" if field in sources else ""
            lines.append(f"- {named}: {error.get('msg', 'invalid')}{source}")
    return "\n".join(lines) if lines else str(exc)
