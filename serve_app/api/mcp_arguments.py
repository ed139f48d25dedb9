"""Flat MCP tool arguments from the REST API's request models.

A model calls `add_memory(user_id, text)`, not `add_memory(user_id, memory={"text": ...})`: a host shows
the model each argument, and a request object nested under one is where models go wrong. The fields,
their limits and descriptions stay the REST model's, and the model is built from them on every call,
so its own rules run exactly as they do for a REST body.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field, ValidationError
from pydantic.fields import FieldInfo

Tool = Callable[..., Awaitable[Any]]


def flattened(parameter: str, model: type[BaseModel]) -> Callable[[Tool], Tool]:
    """The tool takes `model`'s fields as arguments of their own in place of its `parameter`.

    The MCP SDK builds a tool's input schema from its signature, so the signature is what changes."""

    def flatten(tool: Tool) -> Tool:
        signature = inspect.signature(tool, eval_str=True)
        names = list(signature.parameters)
        if parameter not in names or set(names) & set(model.model_fields):
            raise TypeError(f"{tool.__name__}: cannot put {model.__name__}'s fields in place of {parameter!r}")
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in signature.parameters.values() if p.name != parameter]
        at = names.index(parameter)
        parameters = own[:at] + [_argument(name, field) for name, field in model.model_fields.items()] + own[at:]

        @functools.wraps(tool)
        async def flat(**arguments: Any) -> Any:
            fields = {name: arguments.pop(name) for name in model.model_fields if name in arguments}
            try:
                request = model.model_validate(fields)
            except ValidationError as exc:
                raise ToolError(f"422: {exc}") from exc
            return await tool(**arguments, **{parameter: request})

        flat.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        flat.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": signature.return_annotation}
        del flat.__wrapped__  # type: ignore[attr-defined]  # nothing may unwrap back to the nested signature
        return flat

    return flatten


def _argument(name: str, field: FieldInfo) -> inspect.Parameter:
    """One field as a keyword argument: its type, limits, validators and description; its default."""
    if not field.description:
        raise TypeError(f"field {name!r} has no description: the model calling the tool reads only that")
    annotation = Annotated[(field.annotation, *field.metadata, Field(description=field.description))]
    default = inspect.Parameter.empty if field.is_required() else field.get_default(call_default_factory=True)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
