"""Settings: from the environment locally, topped up from Secrets Manager / SSM in Lambda."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

# Keys of the JSON secret in Secrets Manager (GPUFARM_SECRETS_NAME) and the settings they fill.
SECRET_KEYS = {
    "datadog_api_key": "datadog_api_key",
    "datadog_app_key": "datadog_app_key",
    "slack_bot_token": "slack_bot_token",
    "slack_signing_secret": "slack_signing_secret",
    "webhook_secret": "webhook_secret",
}


class Settings(BaseSettings):
    """Everything gpufarm reads from its environment; secrets are SecretStr so they never print."""

    model_config = SettingsConfigDict(env_prefix="GPUFARM_", extra="ignore", populate_by_name=True)

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
    secrets_name: str | None = Field(default=None, description="Secrets Manager secret holding the keys above")
    farm_config: str | None = Field(default=None, description="Path of the farm (quota/pool) YAML file")
    farm_config_parameter: str | None = Field(default=None, description="SSM parameter holding the farm YAML")
    operators_usergroup: str | None = None
    operators_channel: str | None = None
    worker_function: str | None = None
    public_url: str | None = Field(default=None, description="Base URL Datadog webhooks call (Function URLs)")
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

    def datadog_base_url(self) -> str:
        """Where the Datadog client sends requests."""
        if self.datadog_host:
            return self.datadog_host.rstrip("/")
        return f"https://api.{self.datadog_site}"

    def with_secrets(self, secrets: dict[str, Any]) -> Settings:
        """Fill unset secret settings from a Secrets Manager JSON document."""
        updates: dict[str, Any] = {}
        for key, attr in SECRET_KEYS.items():
            if getattr(self, attr) is None and secrets.get(key):
                updates[attr] = SecretStr(str(secrets[key]))
        return self.model_copy(update=updates)


def load_settings() -> Settings:
    """Build settings from the environment, then Secrets Manager when GPUFARM_SECRETS_NAME is set."""
    settings = Settings()
    if settings.secrets_name:
        from aws_lambda_powertools.utilities import parameters

        secret = parameters.get_secret(settings.secrets_name, transform="json", max_age=300)
        if isinstance(secret, dict):
            settings = settings.with_secrets(secret)
    return settings


@lru_cache(maxsize=1)
def cached_settings() -> Settings:
    """Settings built once per process (a Lambda container reuses them across invocations)."""
    return load_settings()


def running_in_lambda() -> bool:
    """True inside AWS Lambda."""
    return "AWS_LAMBDA_FUNCTION_NAME" in os.environ
