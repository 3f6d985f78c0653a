"""Configuration that cannot be read gives one clear line naming the setting or the place in the
file, never a traceback nor a configured value (docs/configuration.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from waltz.cli.main import app
from waltz.config import WaltzSettings, load_settings
from waltz.console.config import ConsoleConfig
from waltz.errors import ConfigurationError
from waltz.services.server.config import ServerConfig
from waltz.services.storage.config import StorageConfig

SECRET = "S3cretPassw0rd"


def test_a_yaml_syntax_error_says_where_without_quoting_the_line(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(f'zookeeper.connectString: 127.0.0.1:2181\nzookeeper.auth.digest: "waltz-op:{SECRET}\n')
    with pytest.raises(ConfigurationError) as caught:
        load_settings(ServerConfig, config)
    message = str(caught.value)
    assert SECRET not in message and "waltz-op" not in message
    assert "not valid YAML" in message
    assert "quoted scalar (line 2, column 24)" in message
    assert "unexpected end of stream (line 3, column 1)" in message

    result = CliRunner().invoke(app, ["storage", "start", "--config", str(config)])
    assert result.exit_code == 2
    assert SECRET not in result.output and "Traceback" not in result.output


def test_a_file_that_is_not_yaml_is_said_to_need_yaml(tmp_path: Path) -> None:
    config = tmp_path / "storage.properties"
    config.write_text("storage.port=55280\n")  # YAML reads it as one string, not a mapping
    with pytest.raises(ConfigurationError, match=r"must be YAML .*'storage\.port: 55280'"):
        load_settings(StorageConfig, config)
    config.write_text("[storage]\nport = 55280\n")
    with pytest.raises(ConfigurationError, match=r"not valid YAML: .*\(line 2, column 1\)"):
        load_settings(StorageConfig, config)


@pytest.mark.parametrize(
    ("cls", "variable", "field"),
    [
        (ServerConfig, "WALTZ_SERVER_PREFERRED_PARTITIONS", "server_preferred_partitions"),
        (ConsoleConfig, "WALTZ_CONSOLE_METRICS", "console_metrics"),
    ],
)
def test_a_list_variable_that_is_not_json_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, cls: type, variable: str, field: str
) -> None:
    monkeypatch.setenv("WALTZ_ZOOKEEPER_CONNECT_STRING", "127.0.0.1:2181")
    monkeypatch.setenv("WALTZ_CLUSTER_ROOT", "/waltz")
    monkeypatch.setenv("WALTZ_SERVER_INSECURE", "true")  # the documented value is then accepted
    monkeypatch.setenv(variable, f"1,{SECRET}")
    with pytest.raises(ConfigurationError) as caught:
        load_settings(cls)
    message = str(caught.value)
    assert f"the environment variable {variable} must be JSON" in message
    assert field in message and SECRET not in message
    monkeypatch.setenv(variable, "[0, 1]" if cls is ServerConfig else '["http://127.0.0.1:1/metrics"]')
    load_settings(cls)  # the documented form is read


def test_an_unknown_log_level_is_one_line_and_status_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "node"
    start = ["storage", "start", "--directory", str(directory), "--log-level", "bogus"]
    result = CliRunner().invoke(app, start)
    assert result.exit_code == 2
    assert "unknown log level 'bogus'" in result.output and "Traceback" not in result.output
    assert not directory.exists()  # nothing was started

    monkeypatch.setenv("WALTZ_LOG_LEVEL", "loud")
    result = CliRunner().invoke(app, ["cluster", "list", "--zookeeper", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert "unknown log level 'loud'" in result.output and "Traceback" not in result.output

    server = subprocess.run(
        [sys.executable, "-m", "waltz.services.server", "--log-level", "nope", "--zookeeper", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert server.returncode == 2
    assert server.stderr.strip().splitlines() == [
        "error: unknown log level 'nope' (from --log-level or WALTZ_LOG_LEVEL); "
        "use one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
    ]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity"])
def test_infinity_and_nan_are_refused_for_every_number(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """``ge=0`` lets infinity through: the storage node then failed at start with a traceback."""
    monkeypatch.setenv("WALTZ_STORAGE_RETENTION_KEEP_SECONDS", value)
    with pytest.raises(ConfigurationError, match=r"retention_keep_seconds .*finite number"):
        load_settings(StorageConfig, directory="/d", insecure=True)
    monkeypatch.delenv("WALTZ_STORAGE_RETENTION_KEEP_SECONDS")
    monkeypatch.setenv("WALTZ_STORAGE_RETENTION_CHECK_INTERVAL", value)
    with pytest.raises(ConfigurationError, match=r"retention_check_interval .*finite number"):
        load_settings(StorageConfig, directory="/d", insecure=True)


def test_an_invalid_value_is_said_to_come_from_where_it_was_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is blamed only for what it set: a value from the environment names its variable,
    one from a command's option says so (docs/configuration.md, precedence)."""
    path = tmp_path / "prec.yaml"
    path.write_text(f"storage.directory: {tmp_path / 'node'}\nstorage.insecure: true\n")
    monkeypatch.setenv("WALTZ_STORAGE_ADMIN_PORT", "70000")
    with pytest.raises(ConfigurationError) as raised:
        load_settings(StorageConfig, path)
    message = str(raised.value)
    assert message.startswith(f"invalid configuration (read from {path}, the environment and the options):\n")
    assert f"in {path}" not in message, message
    assert "admin_port" in message and "(set by the environment variable WALTZ_STORAGE_ADMIN_PORT)" in message
    monkeypatch.delenv("WALTZ_STORAGE_ADMIN_PORT")

    with pytest.raises(ConfigurationError) as raised:
        load_settings(StorageConfig, path, port=70000)
    message = str(raised.value)
    assert f"in {path}" not in message and "(set by a command option or argument)" in message, message

    path.write_text(f"storage.directory: {tmp_path / 'node'}\nstorage.insecure: true\nstorage.port: 70000\n")
    with pytest.raises(ConfigurationError) as raised:
        load_settings(StorageConfig, path)
    message = str(raised.value)
    assert message.startswith(f"invalid configuration in {path}:\n"), message
    assert f"(set by the file {path})" in message


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("storage.port: 55280\nstorage.port: 55290\n", "the key storage.port is given twice (lines 2 and 3)"),
        ("storage:\n  port: 55280\n  port: 55290\n", "the key port is given twice (lines 3 and 4)"),
        (
            "storage.port: 55280\nstorage:\n  port: 55290\n",
            "the key storage.port is given twice (dotted and nested)",
        ),
    ],
)
def test_a_key_given_twice_is_refused_in_one_line_naming_it(tmp_path: Path, text: str, said: str) -> None:
    """YAML keeps the last of two equal keys without a word; which one an operator meant is not
    known, so neither is taken (docs/configuration.md)."""
    path = tmp_path / "storage.yaml"
    path.write_text(f"storage.directory: {tmp_path / 'node'}\n{text}")
    with pytest.raises(ConfigurationError) as raised:
        load_settings(StorageConfig, path, insecure=True)
    message = str(raised.value)
    assert said in message and "\n" not in message, message
    assert "55290" not in message  # never a value: it may be a credential


@pytest.mark.parametrize("written", ["yes", "true", "1.0", "'1.0'", "55280.0"])
@pytest.mark.parametrize("key", ["storage.port", "storage.admin.port", "storage.metrics.port"])
def test_a_port_is_a_whole_number_not_a_boolean_nor_a_decimal(tmp_path: Path, key: str, written: str) -> None:
    """``storage.port: yes`` is YAML's true, which pydantic took for port 1, and ``1.0`` port 1
    (docs/configuration.md)."""
    path = tmp_path / "storage.yaml"
    path.write_text(f"storage.directory: {tmp_path / 'node'}\nstorage.insecure: true\n{key}: {written}\n")
    with pytest.raises(ConfigurationError, match=f"{key} .*a port is a whole number"):
        load_settings(StorageConfig, path)


@pytest.mark.parametrize("value", ["1.0", "true"])
def test_a_port_variable_is_a_whole_number(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    server = {"zookeeper_connect_string": "z:2181", "cluster_root": "/w", "server_insecure": True}
    cases: list[tuple[str, type[WaltzSettings], dict[str, object]]] = [
        ("WALTZ_SERVER_PORT", ServerConfig, server),
        ("WALTZ_SERVER_METRICS_PORT", ServerConfig, server),
        ("WALTZ_CONSOLE_PORT", ConsoleConfig, {}),
    ]
    for variable, settings_class, needed in cases:
        monkeypatch.setenv(variable, value)
        with pytest.raises(ConfigurationError, match=f"{variable}.*a port is a whole number"):
            load_settings(settings_class, **needed)
        monkeypatch.delenv(variable)
    assert load_settings(StorageConfig, directory="/d", insecure=True, port="55290").port == 55290


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("WALTZ_SERVER_LOCK_TABLE_SIZE", str(1 << 32), "less than or equal to 16777216"),
        ("WALTZ_SERVER_LOCK_TABLE_HASH_COUNT", "200000", "less than or equal to 16"),
    ],
)
def test_a_lock_table_too_large_to_allocate_or_to_check_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, said: str
) -> None:
    """A table of 2**32 slots was taken and allocated (32 GiB) when a partition opened; 200,000 slots
    per lock made each append's check read that many slots on the event loop."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as raised:
        load_settings(
            ServerConfig, zookeeper_connect_string="127.0.0.1:2181", cluster_root="/w", server_insecure=True
        )
    message = str(raised.value)
    assert said in message and f"(set by the environment variable {variable})" in message, message
    monkeypatch.setenv(variable, "16" if "HASH" in variable else str(1 << 24))
    load_settings(
        ServerConfig, zookeeper_connect_string="127.0.0.1:2181", cluster_root="/w", server_insecure=True
    )
