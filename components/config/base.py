"""What every part of the stack's model shares: its base class and its error."""

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

# The serving project's config namespace: its keys are `kimipd:KEY` in a stack file.
CONFIG_NAMESPACE = "kimipd"


class ConfigError(ValueError):
    """A stack configuration that must not be deployed; the message says what to change."""


class Model(BaseModel):
    # camelCase keys in the stack file, snake_case attributes; a misspelt key is an error.
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
    )
