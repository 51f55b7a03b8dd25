"""Spec files and YAML from strangers: a size cap, no anchors or aliases, a nesting limit,
safe tags only; exponent numbers (`5e11`) read as floats."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from nas_service.spec.fields import MAX_SPEC_BYTES, MAX_YAML_DEPTH, SpecError
from nas_service.spec.model import JobSpec, parse_spec


# -- YAML -------------------------------------------------------------------------------------
class _Refused(yaml.YAMLError):
    def __init__(self, reason: str, mark: Any) -> None:
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        super().__init__(reason + where)
        self.reason = reason + where


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors and aliases (a few hundred bytes of nested
    aliases expand to gigabytes once serialised: "billion laughs") and with a nesting limit
    (the composer recurses)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused("YAML anchors and aliases are not accepted", event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(f"YAML nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# YAML 1.1 reads `5e11` (no dot) as a string; specs write budgets that way, so floats in
# exponent form without a dot resolve as floats, as YAML 1.2 and JSON read them.
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml_text(text: str, source: str = "spec", field: str = "spec") -> Any:
    """Parse a YAML (or JSON) document from a stranger: at most `MAX_SPEC_BYTES` (refused
    before parsing), no anchors or aliases, at most `MAX_YAML_DEPTH` levels deep, safe tags
    only. `source` names the text in messages. Raises `SpecError` on `field`."""
    size = len(text) if len(text) > MAX_SPEC_BYTES else len(text.encode("utf-8", "replace"))
    if size > MAX_SPEC_BYTES:
        raise SpecError(
            [(field, f"{source} is over the limit of {MAX_SPEC_BYTES} bytes for a {field} file")]
        )
    loader: _SpecLoader | None = None
    try:
        loader = _SpecLoader(text)  # its reader refuses control characters at once
        return loader.get_single_data()
    except _Refused as exc:
        raise SpecError([(field, exc.reason)]) from None
    except yaml.YAMLError as exc:
        raise SpecError([(field, f"{source} is not valid YAML: {exc}")]) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        raise SpecError([(field, f"{source} is not a usable {field} file: {exc}")]) from None
    finally:
        if loader is not None:
            loader.dispose()


class SpecFileError(SpecError):
    """A file that cannot be read at all (missing, not a regular file, unreadable): the path
    given is wrong, not the fields in it."""


def read_yaml_mapping(path: str | Path, field: str = "spec") -> dict[str, Any]:
    """The mapping of a YAML (or JSON) file from a stranger, read with `load_yaml_text`'s
    bounds (no more than `MAX_SPEC_BYTES` + 1 bytes are read). Only a regular file is read:
    it is opened without blocking (a FIFO returns at once) and its descriptor's type checked
    before any read, so a FIFO, a device or a folder is refused at once (`SpecFileError`).
    Raises `SpecError` on `field` (a job spec's "spec", the CLI's architecture file's
    "arch")."""
    p = Path(path)
    shown = repr(str(p))
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SpecFileError([(field, f"file {shown} does not exist")]) from None
    except OSError as exc:
        raise SpecFileError([(field, f"cannot read {shown}: {exc.strerror or exc}")]) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SpecFileError([(field, f"{shown} is not a regular file")])
    try:
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecFileError([(field, f"cannot read {shown}: {exc.strerror or exc}")]) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(
            [(field, f"{shown} is over the limit of {MAX_SPEC_BYTES} bytes for a {field} file")]
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([(field, f"cannot read {shown}: {exc}")]) from None
    data = load_yaml_text(text, shown, field)
    if not isinstance(data, dict):
        raise SpecError([(field, f"{shown} must hold a mapping of fields")])
    return data


def read_spec_data(path: str | Path) -> dict[str, Any]:
    """The mapping of a YAML (or JSON) job spec file (`read_yaml_mapping`, field "spec")."""
    return read_yaml_mapping(path, "spec")


def load_spec(path: str | Path) -> JobSpec:
    """Read a YAML (or JSON) job spec file (`read_spec_data`) and validate it."""
    return parse_spec(read_spec_data(path))
