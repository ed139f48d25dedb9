"""The site's two generated references, built from the code at every `mkdocs build`, so they cannot
drift from it: the configuration (from `serve_app.settings.Settings`) and the HTTP API (from the
OpenAPI document of the app an Ingress replica serves, built in-process with no store behind it).

MkDocs runs this file as a hook (mkdocs.yml `hooks:`): a page that holds a marker line gets the
generated markdown in its place, and the OpenAPI document is added to the site as `api/openapi.json`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, SecretStr

SETTINGS_MARKER = "<!-- generated: settings -->"
OPENAPI_MARKER = "<!-- generated: openapi -->"
OPENAPI_PATH = "api/openapi.json"


@dataclass(frozen=True)
class SettingRow:
    name: str
    env: list[str]
    type: str
    default: str
    constraints: str
    description: str


def _type_name(annotation: Any) -> str:
    if get_origin(annotation) is Literal:
        return " | ".join(repr(arg) for arg in get_args(annotation))
    if annotation is SecretStr:
        return "secret str"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"{annotation.__name__} (JSON object)"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default(field) -> str:
    value = field.get_default(call_default_factory=True)
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return json.dumps(value)


def _constraints(field) -> str:
    words = []
    for item in field.metadata:
        for bound, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(item, bound, None) is not None:
                words.append(f"{sign} {getattr(item, bound)}")
        if getattr(item, "pattern", None):
            words.append(f"matches `{item.pattern}`")
    return ", ".join(words)


def _env_names(name: str, field, prefix: str) -> list[str]:
    """What pydantic-settings reads: the aliases when a field has them, else prefix + name (any case)."""
    alias = field.validation_alias
    names = [str(choice) for choice in alias.choices] if alias is not None and hasattr(alias, "choices") else []
    if not names:
        names = [prefix + name]
    seen, env = set(), []
    for choice in names:
        if choice == name and alias is not None:  # the field's own name: the key of Serve `args`, not the environment
            continue
        if choice.upper() not in seen:
            seen.add(choice.upper())
            env.append(choice.upper())
    return env


def settings_rows() -> list[SettingRow]:
    from serve_app.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    return [
        SettingRow(
            name=name,
            env=_env_names(name, field, prefix),
            type=_type_name(field.annotation),
            default=_default(field),
            constraints=_constraints(field),
            description=" ".join((field.description or "").split()),
        )
        for name, field in Settings.model_fields.items()
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def settings_markdown() -> str:
    lines = [
        "| setting | environment | type | default | description |",
        "|---|---|---|---|---|",
    ]
    for row in settings_rows():
        kind = f"{row.type}" + (f", {row.constraints}" if row.constraints else "")
        lines.append(
            f'| <a id="{row.name}"></a>`{row.name}` | {"<br>".join(f"`{e}`" for e in row.env)} | {_cell(kind)} '
            f"| `{_cell(row.default)}` | {_cell(row.description)} |"
        )
    return "\n".join(lines)


async def _never(*_args):
    raise RuntimeError("the OpenAPI document is built without stores")


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    """The document a replica serves at /openapi.json, from the app built in-process (no store, no Ray)."""
    from serve_app.api.http import create_http_app
    from serve_app.services.dependencies import Dependencies
    from serve_app.settings import Settings

    deps = Dependencies(settings=Settings(), stores=None, embed_one=_never, embed_documents=_never, compact_now=_never)
    return create_http_app(deps).openapi()


def _schema_name(schema: dict[str, Any] | None) -> str:
    if not schema:
        return ""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{_anchor(name)})"
    if schema.get("type") == "array" and "items" in schema:
        return f"array of {_schema_name(schema['items'])}"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_schema_name(s) for s in schema[key])
    return f"`{schema.get('type', 'object')}`"


def _anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _json_body(content: dict[str, Any] | None) -> str:
    if not content:
        return ""
    media = next(iter(content.values()))
    return _schema_name(media.get("schema"))


def openapi_markdown() -> str:
    doc = openapi_document()
    out: list[str] = []
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            tag = (op.get("tags") or ["other"])[0]
            by_tag.setdefault(tag, []).append((path, method, op))
    for tag, ops in by_tag.items():
        out.append(f"## {tag}\n")
        for path, method, op in ops:
            out.append(f"### `{method.upper()} {path}`\n")
            if op.get("summary"):
                out.append(f"**{op['summary']}**\n")
            if op.get("description"):
                out.append(op["description"].strip() + "\n")
            params = op.get("parameters") or []
            if params:
                out.append("| parameter | in | type | required | description |\n|---|---|---|---|---|")
                for p in params:
                    desc = " ".join((p.get("description") or p.get("schema", {}).get("description") or "").split())
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {_cell(_schema_name(p.get('schema')))} | "
                        f"{'yes' if p.get('required') else 'no'} | {_cell(desc)} |"
                    )
                out.append("")
            body = op.get("requestBody")
            if body:
                out.append(f"Request body: {_json_body(body.get('content'))}\n")
            responses = op.get("responses") or {}
            if responses:
                out.append("| status | meaning | body |\n|---|---|---|")
                for status, resp in responses.items():
                    out.append(f"| {status} | {_cell(resp.get('description', ''))} | {_json_body(resp.get('content'))} |")
                out.append("")
    out.append("## Schemas\n")
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        out.append(f"### `{name}` {{ #{_anchor(name)} }}\n")
        if schema.get("description"):
            out.append(" ".join(schema["description"].split()) + "\n")
        props = schema.get("properties") or {}
        if props:
            required = set(schema.get("required") or [])
            out.append("| field | type | required | description |\n|---|---|---|---|")
            for field, prop in props.items():
                desc = " ".join((prop.get("description") or "").split())
                out.append(
                    f"| `{field}` | {_cell(_schema_name(prop))} | {'yes' if field in required else 'no'} | {_cell(desc)} |"
                )
            out.append("")
        elif "enum" in schema:
            out.append("One of: " + ", ".join(f"`{v}`" for v in schema["enum"]) + "\n")
    return "\n".join(out)


# MkDocs hook events -------------------------------------------------------------------------------


def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, OPENAPI_PATH, content=json.dumps(openapi_document(), indent=2, sort_keys=False) + "\n"))
    return files


def on_page_markdown(markdown: str, page, config, files):
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, settings_markdown())
    if OPENAPI_MARKER in markdown:
        markdown = markdown.replace(OPENAPI_MARKER, openapi_markdown())
    return markdown
