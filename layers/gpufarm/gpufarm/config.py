"""Settings: from the environment locally, topped up from Secrets Manager / SSM in Lambda (the deployment's
secrets are read by gpufarm.adapters.aws.load_settings).

In Lambda each secret key is its own Secrets Manager secret, `<GPUFARM_SECRETS_NAME>/<key>`, and each function
reads only the keys its GPUFARM_SECRET_KEYS names: the template grants it exactly those (docs/security.md, "What
each function may read"). A key the function was not given is absent, and asking for it names the key and the
function.

A deployment that names something that is not there (a secret, an SSM parameter, a key of the secret) raises
ConfigurationMissing with the NAME of what is missing, never a value; each function logs that one line and
answers its caller without detail (HTTP 500 on the Function URLs).
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr

from gpufarm.core.kernel.errors import GpufarmError, NotFound

# The deployment's secret keys (each the secret `<GPUFARM_SECRETS_NAME>/<key>` in Secrets Manager) and the settings
# they fill.
SECRET_KEYS = {
    "datadog_api_key": "datadog_api_key",
    "datadog_app_key": "datadog_app_key",
    "slack_bot_token": "slack_bot_token",
    "slack_signing_secret": "slack_signing_secret",
    "webhook_secret": "webhook_secret",
    "profile_link_secret": "profile_link_secret",
    "upload_token_secret": "upload_token_secret",
    # Only during a rotation of the link key: the key before it, still accepted when a link is checked.
    "profile_link_secret_previous": "profile_link_secret_previous",
}


class ConfigurationError(GpufarmError):
    """A required setting is missing or unusable; operators must fix the deployment (the message names it)."""


class ConfigurationMissing(ConfigurationError, NotFound):
    """A secret, SSM parameter, secret key or file the deployment names does not exist (or may not be read)."""


# A field reads GPUFARM_<FIELD NAME>, or the variables its validation_alias lists (first one set wins).
ENV_PREFIX = "GPUFARM_"


class Settings(BaseModel):
    """Everything gpufarm reads from its environment; secrets are SecretStr so they never print.

    A plain pydantic model that reads os.environ itself: pydantic-settings would do the same for these scalar
    fields, but its import (asyncio, its dotenv, cloud and CLI sources) added 10-50 ms to every cold start of the
    Slack ingress (benchmarks/ingress.py). Keyword arguments override the environment.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True, validate_default=True)

    datadog_host: str | None = Field(default=None, description="Full API base URL; overrides DD_SITE")
    datadog_site: str = Field(default="datadoghq.com", validation_alias=AliasChoices("GPUFARM_DATADOG_SITE", "DD_SITE"))
    datadog_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("GPUFARM_DATADOG_API_KEY", "DD_API_KEY")
    )
    datadog_app_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("GPUFARM_DATADOG_APP_KEY", "DD_APP_KEY", "DD_APPLICATION_KEY")
    )
    slack_api_url: str = "https://slack.com/api/"
    slack_bot_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("GPUFARM_SLACK_BOT_TOKEN", "SLACK_BOT_TOKEN")
    )
    slack_signing_secret: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("GPUFARM_SLACK_SIGNING_SECRET", "SLACK_SIGNING_SECRET")
    )
    webhook_secret: SecretStr | None = None
    # Profiler runs: the bucket, the page function's URL, and the key that signs page links (gpufarm.profiling).
    profile_bucket: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    profile_pages_url: str | None = Field(default=None, pattern=r"^https?://[^\s]{1,500}$")
    profile_link_secret: SecretStr | None = None
    # The profile upload function's URL (the stack's ProfileUploadUrl): what `gpufarm profile upload` calls with an
    # upload token, and what `gpufarm doctor` knocks on.
    api_url: str | None = Field(default=None, pattern=r"^https?://[^\s]{1,500}$")
    # Signs the per-lease upload tokens `/gpu profile-token` gives (gpufarm.core.kernel.upload_token).
    upload_token_secret: SecretStr | None = None
    profile_link_secret_previous: SecretStr | None = None
    # Where the clouds' list prices last read are cached: s3://<bucket>/<key> or a file (gpufarm.adapters.price_cache);
    # unset: only the farm file's written prices.
    price_cache: str | None = Field(default=None, min_length=1, max_length=600)
    profile_link_days: int = Field(
        default=30, ge=1, le=365, description="The longest a page link lives (run links and dashboard iframes)"
    )
    secrets_name: str | None = Field(
        default=None, description="Prefix of the Secrets Manager secrets holding the keys above (<prefix>/<key>)"
    )
    secret_keys: str | None = Field(
        default=None,
        pattern=r"^[a-z_]{1,40}(,[a-z_]{1,40}){0,8}$",
        description="The secret keys this function reads (comma-separated); in Lambda, exactly those its role may",
    )
    farm_config: str | None = Field(default=None, description="Path of the farm (quota/pool) YAML file")
    farm_config_parameter: str | None = Field(default=None, description="SSM parameter holding the farm YAML")
    operators_usergroup: str | None = None
    operators_channel: str | None = None
    worker_function: str | None = None
    public_url: str | None = Field(
        default=None, description="Base URL of the links messages carry; default the Datadog app of the site"
    )
    incident_type: str = Field(
        default="GPU allocation",
        min_length=1,
        max_length=100,
        description="Name of gpufarm's own incident type (made by `gpufarm datadog apply`; its incidents only)",
    )
    incident_type_id: str | None = Field(
        default=None, description="Id of that incident type; when set, no lookup by name per container"
    )
    http_timeout: float = Field(default=10.0, gt=0, le=120)
    max_retries: int = Field(default=3, ge=0, le=10)

    def __init__(self, /, **values: Any) -> None:
        super().__init__(**{**_from_environment(type(self)), **values})

    def datadog_base_url(self) -> str:
        """Where the Datadog client sends requests."""
        if self.datadog_host:
            return self.datadog_host.rstrip("/")
        return f"https://api.{self.datadog_site}"

    def with_secrets(self, secrets: dict[str, Any]) -> Settings:
        """Fill unset secret settings from the secret keys read (key -> value)."""
        updates: dict[str, Any] = {}
        for key, attr in SECRET_KEYS.items():
            if getattr(self, attr) is None and secrets.get(key):
                updates[attr] = SecretStr(str(secrets[key]))
        return self.model_copy(update=updates)

    def declared_secret_keys(self) -> tuple[str, ...] | None:
        """The secret keys GPUFARM_SECRET_KEYS names (None when unset); ConfigurationError for a key gpufarm has
        not got, naming it."""
        if self.secret_keys is None:
            return None
        keys = tuple(dict.fromkeys(self.secret_keys.split(",")))
        unknown = [k for k in keys if k not in SECRET_KEYS]
        if unknown:
            raise ConfigurationError(f"GPUFARM_SECRET_KEYS names '{unknown[0]}', which is not a gpufarm secret key")
        return keys

    def require(self, attr: str) -> str:
        """The value of a secret setting; ConfigurationMissing naming where it should come from otherwise."""
        value: SecretStr | None = getattr(self, attr)
        if value is not None and value.get_secret_value():
            return value.get_secret_value()
        if self.secrets_name and attr in SECRET_KEYS.values():
            key = next(k for k, a in SECRET_KEYS.items() if a == attr)
            declared = self.declared_secret_keys()
            if declared is None and running_in_lambda():
                declared = ()  # in Lambda a function reads only the keys it declares
            if declared is not None and key not in declared:
                raise ConfigurationMissing(
                    f"{function_name()} is not given the secret key '{key}' (its GPUFARM_SECRET_KEYS and the "
                    "policy granting them in template.yaml)"
                )
            raise ConfigurationMissing(f"secret {secret_name(self.secrets_name, key)} (Secrets Manager) does not exist")
        raise ConfigurationMissing(f"GPUFARM_{attr.upper()} is not set")


def _from_environment(model: type[BaseModel]) -> dict[str, str]:
    """Each field's value from the environment (names compared case-insensitively), keyed by field name."""
    environ = {name.upper(): value for name, value in os.environ.items()}
    values: dict[str, str] = {}
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            candidates = [choice for choice in alias.choices if isinstance(choice, str)]
        else:
            candidates = [alias] if isinstance(alias, str) else [ENV_PREFIX + name]
        for candidate in candidates:
            if candidate.upper() in environ:
                values[name] = environ[candidate.upper()]
                break
    return values


def secret_name(prefix: str, key: str) -> str:
    """The Secrets Manager secret holding one key of the deployment: `<prefix>/<key>`."""
    return f"{prefix.rstrip('/')}/{key}"


def function_name() -> str:
    """This Lambda function's name (AWS_LAMBDA_FUNCTION_NAME), or "this process" outside Lambda."""
    return os.environ.get("AWS_LAMBDA_FUNCTION_NAME") or "this process"


def running_in_lambda() -> bool:
    """True inside AWS Lambda."""
    return "AWS_LAMBDA_FUNCTION_NAME" in os.environ
