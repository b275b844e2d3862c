"""Settings: from the environment locally, topped up from Secrets Manager / SSM in Lambda (the deployment's
secrets are read by gpufarm.adapters.aws.load_settings).

In Lambda each secret key is its own Secrets Manager secret, `<GPUFARM_SECRETS_NAME>/<key>`, and each function
reads only the keys its GPUFARM_SECRET_KEYS names: the template grants it exactly those (docs/security.md, "What
each function may read"). A key the function was not given is absent, and asking for it names the key and the
function.

A deployment that names something that is not there (a secret, an SSM parameter, a key of the secret) raises
ConfigurationMissing with the NAME of what is missing, never a value; each function logs that one line and
answers its caller without detail (HTTP 500 on the Function URLs). A value out of its bounds raises
SettingInvalid naming the variable and the bound, never the value.

Settings are read by the plain checks below, not a pydantic model: every gpufarm process reads them, and the
model (its validators built at import, pydantic's machinery loaded by its first model) was 80 ms of CPU and
15 MB more at each cold start of the Slack ingress and of `gpufarm report` (docs/design.md, "Settings without
pydantic"; benchmarks/RESULTS.md). The fields, their variables and their bounds are one table (FIELDS).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

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


class SettingInvalid(ConfigurationError, ValueError):
    """A setting's value is not of its kind or outside its bounds; the message names the setting and the bound,
    never the value."""


# A field reads GPUFARM_<FIELD NAME>, or the variables its `variables` list (first one set wins).
ENV_PREFIX = "GPUFARM_"
# The longest number a numeric setting is read from (each has a range well inside it): int() never sees more.
MAX_NUMBER_CHARS = 32


class SecretStr:
    """A secret setting's value: prints as asterisks, read with get_secret_value()."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        """The secret itself."""
        return self._value

    def __repr__(self) -> str:
        return f"SecretStr('{self}')"

    def __str__(self) -> str:
        return "**********" if self._value else ""

    def __len__(self) -> int:
        return len(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretStr) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: its kind (str, SecretStr, int or float), default, variables and bounds."""

    name: str
    kind: type = str
    default: Any = None
    aliases: tuple[str, ...] = ()
    pattern: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    description: str = ""

    @property
    def variables(self) -> tuple[str, ...]:
        """The environment variables it is read from, the first set one winning."""
        return self.aliases or (ENV_PREFIX + self.name.upper(),)

    def check(self, value: Any) -> Any:
        """The value as this setting holds it; SettingInvalid naming the setting otherwise."""
        if value is None:
            if self.default is not None:
                raise self._invalid("must be set")
            return None
        if self.kind is SecretStr:
            return self._secret(value)
        if self.kind is str:
            return self._text(value)
        return self._number(value)

    def _secret(self, value: Any) -> SecretStr:
        if isinstance(value, str):
            return SecretStr(value)
        reveal = getattr(value, "get_secret_value", None)
        if callable(reveal) and isinstance(text := reveal(), str):
            return SecretStr(text)
        raise self._invalid("must be a string")

    def _text(self, value: Any) -> str:
        if not isinstance(value, str):
            raise self._invalid("must be a string")
        if self.min_length is not None and len(value) < self.min_length:
            raise self._invalid(f"must have at least {self.min_length} characters")
        if self.max_length is not None and len(value) > self.max_length:
            raise self._invalid(f"must have at most {self.max_length} characters")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise self._invalid(f"must match {self.pattern}")
        return value

    def _number(self, value: Any) -> int | float:
        number = self._parse(value)
        if self.ge is not None and not number >= self.ge:
            raise self._invalid(f"must be at least {self.ge:g}")
        if self.gt is not None and not number > self.gt:
            raise self._invalid(f"must be greater than {self.gt:g}")
        if self.le is not None and not number <= self.le:
            raise self._invalid(f"must be at most {self.le:g}")
        return number

    def _parse(self, value: Any) -> int | float:
        whole = self.kind is int
        if isinstance(value, bool):
            raise self._invalid("must be a number")
        if isinstance(value, int):
            return value if whole else float(value)
        if isinstance(value, float):
            if not whole:
                return value
            if math.isfinite(value) and value.is_integer():
                return int(value)
            raise self._invalid("must be a whole number")
        if isinstance(value, str) and len(text := value.strip()) <= MAX_NUMBER_CHARS:
            try:
                return int(text) if whole else float(text)
            except ValueError:
                pass
        raise self._invalid("must be a whole number" if whole else "must be a number")

    def _invalid(self, problem: str) -> SettingInvalid:
        return SettingInvalid(f"setting {self.name} ({self.variables[0]}): {problem}")


_URL = r"^https?://[^\s]{1,500}$"
FIELDS: Mapping[str, Setting] = {
    s.name: s
    for s in (
        Setting("datadog_host", description="Full API base URL; overrides DD_SITE"),
        Setting("datadog_site", default="datadoghq.com", aliases=("GPUFARM_DATADOG_SITE", "DD_SITE")),
        Setting("datadog_api_key", SecretStr, aliases=("GPUFARM_DATADOG_API_KEY", "DD_API_KEY")),
        Setting("datadog_app_key", SecretStr, aliases=("GPUFARM_DATADOG_APP_KEY", "DD_APP_KEY", "DD_APPLICATION_KEY")),
        Setting("slack_api_url", default="https://slack.com/api/"),
        Setting("slack_bot_token", SecretStr, aliases=("GPUFARM_SLACK_BOT_TOKEN", "SLACK_BOT_TOKEN")),
        Setting("slack_signing_secret", SecretStr, aliases=("GPUFARM_SLACK_SIGNING_SECRET", "SLACK_SIGNING_SECRET")),
        Setting("webhook_secret", SecretStr),
        # Profiler runs: the bucket, the page function's URL, and the key that signs page links (gpufarm.profiling).
        Setting("profile_bucket", pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"),
        Setting("profile_pages_url", pattern=_URL),
        Setting("profile_link_secret", SecretStr),
        # The profile upload function's URL (the stack's ProfileUploadUrl): what `gpufarm profile upload` calls
        # with an upload token, and what `gpufarm doctor` knocks on.
        Setting("api_url", pattern=_URL),
        # Signs the per-lease upload tokens `/gpu profile-token` gives (gpufarm.core.kernel.upload_token).
        Setting("upload_token_secret", SecretStr),
        Setting("profile_link_secret_previous", SecretStr),
        # Where the clouds' list prices last read are cached: s3://<bucket>/<key> or a file
        # (gpufarm.adapters.price_cache); unset: only the farm file's written prices.
        Setting("price_cache", min_length=1, max_length=600),
        Setting(
            "profile_link_days",
            int,
            default=30,
            ge=1,
            le=365,
            description="The longest a page link lives (run links and dashboard iframes)",
        ),
        Setting(
            "secrets_name", description="Prefix of the Secrets Manager secrets holding the keys above (<prefix>/<key>)"
        ),
        Setting(
            "secret_keys",
            pattern=r"^[a-z_]{1,40}(,[a-z_]{1,40}){0,8}$",
            description="The secret keys this function reads (comma-separated); in Lambda, exactly those its role may",
        ),
        Setting("farm_config", description="Path of the farm (quota/pool) YAML file"),
        Setting("farm_config_parameter", description="SSM parameter holding the farm YAML"),
        Setting("operators_usergroup"),
        Setting("operators_channel"),
        Setting("worker_function"),
        Setting("public_url", description="Base URL of the links messages carry; default the Datadog app of the site"),
        Setting(
            "incident_type",
            default="GPU allocation",
            min_length=1,
            max_length=100,
            description="Name of gpufarm's own incident type (made by `gpufarm datadog apply`; its incidents only)",
        ),
        Setting("incident_type_id", description="Id of that incident type; when set, no lookup by name per container"),
        Setting("http_timeout", float, default=10.0, gt=0, le=120),
        Setting("max_retries", int, default=3, ge=0, le=10),
    )
}


class Settings:
    """Everything gpufarm reads from its environment; secrets are SecretStr so they never print.

    Each value is checked against its Setting (FIELDS) when read; keyword arguments override the environment, and
    names that are not settings are ignored.
    """

    FIELDS: ClassVar[Mapping[str, Setting]] = FIELDS
    __slots__ = tuple(FIELDS)

    datadog_host: str | None
    datadog_site: str
    datadog_api_key: SecretStr | None
    datadog_app_key: SecretStr | None
    slack_api_url: str
    slack_bot_token: SecretStr | None
    slack_signing_secret: SecretStr | None
    webhook_secret: SecretStr | None
    profile_bucket: str | None
    profile_pages_url: str | None
    profile_link_secret: SecretStr | None
    api_url: str | None
    upload_token_secret: SecretStr | None
    profile_link_secret_previous: SecretStr | None
    price_cache: str | None
    profile_link_days: int
    secrets_name: str | None
    secret_keys: str | None
    farm_config: str | None
    farm_config_parameter: str | None
    operators_usergroup: str | None
    operators_channel: str | None
    worker_function: str | None
    public_url: str | None
    incident_type: str
    incident_type_id: str | None
    http_timeout: float
    max_retries: int

    def __init__(self, /, **values: Any) -> None:
        given = {**_from_environment(), **values}
        for name, setting in FIELDS.items():
            setattr(self, name, setting.check(given.get(name, setting.default)))

    def replace(self, **updates: Any) -> Settings:
        """A copy with these settings changed, each checked as when read (names that are not settings: TypeError)."""
        unknown = sorted(set(updates) - set(FIELDS))
        if unknown:
            raise TypeError(f"'{unknown[0]}' is not a setting")
        copy = object.__new__(Settings)
        for name, setting in FIELDS.items():
            setattr(copy, name, setting.check(updates[name]) if name in updates else getattr(self, name))
        return copy

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and all(getattr(self, n) == getattr(other, n) for n in FIELDS)

    __hash__ = None  # type: ignore[assignment] # mutable, like the values it holds

    def __repr__(self) -> str:
        return "Settings(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in FIELDS) + ")"

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
        return self.replace(**updates)

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


def _from_environment() -> dict[str, str]:
    """Each setting's value from the environment (names compared case-insensitively), keyed by setting name."""
    environ = {name.upper(): value for name, value in os.environ.items()}
    values: dict[str, str] = {}
    for name, setting in FIELDS.items():
        for variable in setting.variables:
            if variable.upper() in environ:
                values[name] = environ[variable.upper()]
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
