"""The deployment's secret keys in Secrets Manager, as an operator writes them: one secret per key,
`<prefix>/<key>` (gpufarm.config.secret_name), so IAM can grant each function exactly the keys it reads.

Only operators' commands use this (`gpufarm secrets put`, `gpufarm secrets rotate-link-key`); the functions read
their keys through Parameter Store (gpufarm.adapters.aws.read_secrets). A value never appears in an error, a log
line or a return other than `value`'s. Each call is retried by botocore within the settings' bounds; what still
fails is an UpstreamError naming the secret and AWS's error code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufarm.adapters.aws import _LazyClient
from gpufarm.config import SECRET_KEYS, ConfigurationMissing, Settings, secret_name
from gpufarm.core.kernel.errors import UpstreamError, ValidationFailed

CREATED = "created"
UPDATED = "updated"


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, Mapping) else None
    return str(error.get("Code")) if isinstance(error, Mapping) and error.get("Code") else type(exc).__name__


class SecretStore:
    """The secrets `<prefix>/<key>` of one deployment."""

    def __init__(self, settings: Settings, prefix: str, *, client: Any = None) -> None:
        if not prefix.strip("/"):
            raise ValidationFailed("prefix", "the secrets' prefix (GPUFARM_SECRETS_NAME) is empty")
        self.prefix = prefix
        self._client = _LazyClient("secretsmanager", settings, client)

    def name(self, key: str) -> str:
        """The secret that holds `key`."""
        if key not in SECRET_KEYS:
            raise ValidationFailed("key", f"{key[:60]!r} is not a gpufarm secret key")
        return secret_name(self.prefix, key)

    def value(self, key: str) -> str | None:
        """The key's current value, or None when its secret does not exist."""
        from botocore.exceptions import BotoCoreError, ClientError

        name = self.name(key)
        try:
            answer = self._client.get().get_secret_value(SecretId=name)
        except ClientError as exc:
            if _code(exc) == "ResourceNotFoundException":
                return None
            raise UpstreamError(f"reading secret {name} failed: {_code(exc)}") from None
        except BotoCoreError as exc:
            raise UpstreamError(f"reading secret {name} failed: {type(exc).__name__}") from None
        text = answer.get("SecretString")
        if not isinstance(text, str):
            raise ConfigurationMissing(f"secret {name} holds no text")
        return text

    def put(self, key: str, value: str) -> str:
        """Write the key's value: a new secret (CREATED), or a new current version of the existing one (UPDATED)."""
        from botocore.exceptions import BotoCoreError, ClientError

        name = self.name(key)
        try:
            done = self._create_or_update(name, value)
        except ClientError as exc:
            raise UpstreamError(f"writing secret {name} failed: {_code(exc)}") from None
        except BotoCoreError as exc:
            raise UpstreamError(f"writing secret {name} failed: {type(exc).__name__}") from None
        return done

    def _create_or_update(self, name: str, value: str) -> str:
        from botocore.exceptions import ClientError

        try:
            self._client.get().create_secret(Name=name, SecretString=value)
        except ClientError as exc:
            if _code(exc) != "ResourceExistsException":
                raise
        else:
            return CREATED
        self._client.get().put_secret_value(SecretId=name, SecretString=value)
        return UPDATED
