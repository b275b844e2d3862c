"""The settings' plain checks (gpufarm.config): each setting's kind and bounds, named in the error, never the value."""

from __future__ import annotations

import pytest

from gpufarm.config import FIELDS, ConfigurationError, SecretStr, SettingInvalid, Settings


@pytest.mark.parametrize(
    ("values", "named", "bound"),
    [
        ({"max_retries": "11"}, "max_retries", "at most 10"),
        ({"max_retries": -1}, "max_retries", "at least 0"),
        ({"max_retries": "two"}, "max_retries", "whole number"),
        ({"max_retries": 1.5}, "max_retries", "whole number"),
        ({"max_retries": True}, "max_retries", "a number"),
        ({"http_timeout": "0"}, "http_timeout", "greater than 0"),
        ({"http_timeout": "nan"}, "http_timeout", "greater than 0"),
        ({"http_timeout": "inf"}, "http_timeout", "at most 120"),
        ({"profile_link_days": "9" * 33}, "profile_link_days", "whole number"),
        ({"profile_bucket": "Not_A_Bucket"}, "profile_bucket", "must match"),
        ({"profile_pages_url": "https://pages.example\n"}, "profile_pages_url", "must match"),
        ({"secret_keys": "datadog_api_key;rm"}, "secret_keys", "must match"),
        ({"incident_type": ""}, "incident_type", "at least 1"),
        ({"incident_type": "x" * 101}, "incident_type", "at most 100"),
        ({"incident_type": None}, "incident_type", "must be set"),
        ({"worker_function": 7}, "worker_function", "a string"),
        ({"slack_bot_token": 7}, "slack_bot_token", "a string"),
    ],
)
def test_a_value_outside_its_bounds_is_refused_naming_the_setting(
    values: dict[str, object], named: str, bound: str
) -> None:
    with pytest.raises(SettingInvalid) as refused:
        Settings(**values)
    text = str(refused.value)
    assert named in text and bound in text
    assert isinstance(refused.value, ConfigurationError) and isinstance(refused.value, ValueError)


def test_the_error_names_the_variable_and_never_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFARM_PROFILE_BUCKET", "Secret-Looking_Value")
    with pytest.raises(SettingInvalid) as refused:
        Settings()
    assert "GPUFARM_PROFILE_BUCKET" in str(refused.value)
    assert "Secret-Looking_Value" not in str(refused.value)


def test_values_are_read_as_their_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFARM_HTTP_TIMEOUT", " 2.5 ")
    monkeypatch.setenv("GPUFARM_PROFILE_LINK_DAYS", "7")
    monkeypatch.setenv("DD_APPLICATION_KEY", "app-key-value")
    monkeypatch.delenv("GPUFARM_DATADOG_APP_KEY", raising=False)
    monkeypatch.delenv("DD_APP_KEY", raising=False)
    settings = Settings(max_retries=2.0)
    assert (settings.http_timeout, settings.profile_link_days, settings.max_retries) == (2.5, 7, 2)
    assert isinstance(settings.max_retries, int) and isinstance(settings.http_timeout, float)
    assert settings.datadog_app_key == SecretStr("app-key-value")
    assert Settings(not_a_setting="ignored").incident_type == "GPU allocation"


def test_secrets_never_print_and_any_secret_value_is_taken() -> None:
    class Foreign:  # another library's secret wrapper: what get_secret_value gives is kept
        def get_secret_value(self) -> str:
            return "from-another-wrapper"

    settings = Settings(slack_bot_token="xoxb-visible-nowhere", webhook_secret=Foreign())
    assert "xoxb-visible-nowhere" not in repr(settings) and "xoxb-visible-nowhere" not in str(settings)
    assert repr(settings.slack_bot_token) == "SecretStr('**********')" and str(SecretStr("")) == ""
    assert settings.require("slack_bot_token") == "xoxb-visible-nowhere"
    assert settings.require("webhook_secret") == "from-another-wrapper"


def test_replace_checks_what_it_changes_and_keeps_the_rest() -> None:
    settings = Settings(worker_function="worker", max_retries=1)
    changed = settings.replace(max_retries=0, datadog_host="http://127.0.0.1:9")
    assert (changed.max_retries, changed.worker_function, changed.datadog_host) == (0, "worker", "http://127.0.0.1:9")
    assert settings.max_retries == 1 and changed != settings and settings.replace() == settings
    with pytest.raises(SettingInvalid, match="max_retries"):
        settings.replace(max_retries=11)
    with pytest.raises(TypeError, match="not_a_setting"):
        settings.replace(not_a_setting=1)


def test_every_setting_reads_its_own_variable_or_its_aliases() -> None:
    variables = [v for setting in FIELDS.values() for v in setting.variables]
    assert len(variables) == len(set(variables))
    assert FIELDS["datadog_api_key"].variables == ("GPUFARM_DATADOG_API_KEY", "DD_API_KEY")
    assert FIELDS["worker_function"].variables == ("GPUFARM_WORKER_FUNCTION",)
    assert tuple(FIELDS) == Settings.__slots__
