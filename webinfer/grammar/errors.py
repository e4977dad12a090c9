"""The grammar engine's error type: a bad schema, regex or grammar in a request (an HTTP 400 naming the field)."""

from __future__ import annotations

from ..errors import InvalidRequestError


class GrammarError(InvalidRequestError):
    """A schema, regular expression or EBNF/GBNF grammar that cannot be compiled. `param` says where (e.g.
    "response_format.json_schema.schema.properties.age.minimum"), `problem` what is wrong or unsupported."""
