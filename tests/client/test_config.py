"""Client configuration: code, YAML and WALTZ_* variables."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from waltz import WaltzClientConfig
from waltz.config import load_settings
from waltz.errors import ConfigurationError
from waltz.local.certificates import make_cluster_certificates


def test_yaml_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "client.yaml"
    path.write_text(
        "zookeeper:\n  connectString: 127.0.0.1:2181\n  sessionTimeout: 5\n"
        "cluster.root: /waltz/c1\n"
        "client:\n  autoMount: false\n  maxConcurrentTransactions: 10\n  longWaitThreshold: 0.5\n"
    )
    monkeypatch.setenv("WALTZ_CLIENT_MAX_CONCURRENT_TRANSACTIONS", "20")
    config = load_settings(WaltzClientConfig, path)
    assert config.zookeeper_connect_string == "127.0.0.1:2181"
    assert config.zookeeper_session_timeout == 5
    assert config.cluster_root == "/waltz/c1"
    assert config.client_auto_mount is False
    assert config.client_max_concurrent_transactions == 20  # the environment wins over the file
    assert config.client_long_wait_threshold == 0.5
    assert config.tls() is None


def test_the_entity_batcher_s_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "client.yaml"
    path.write_text(
        "zookeeper.connectString: 127.0.0.1:2181\ncluster.root: /waltz/c1\n"
        "client:\n  batchLinger: 0.004\n  batchMaxInFlightAlone: 1\n"
    )
    config = load_settings(WaltzClientConfig, path)
    assert (config.client_batch_linger, config.client_batch_max_in_flight_alone) == (0.004, 1)
    monkeypatch.setenv("WALTZ_CLIENT_BATCH_LINGER", "0.01")
    monkeypatch.setenv("WALTZ_CLIENT_BATCH_MAX_IN_FLIGHT_ALONE", "0")
    config = load_settings(WaltzClientConfig, path)
    assert (config.client_batch_linger, config.client_batch_max_in_flight_alone) == (0.01, 0)
    monkeypatch.setenv("WALTZ_CLIENT_BATCH_LINGER", "2")  # a second between batches: a mistake
    with pytest.raises(ConfigurationError, match="WALTZ_CLIENT_BATCH_LINGER"):
        load_settings(WaltzClientConfig, path)


def test_defaults_from_code() -> None:
    config = WaltzClientConfig(zookeeper_connect_string="zk:2181", cluster_root="/w")
    assert config.client_auto_mount is True
    assert config.client_max_concurrent_transactions == 4000


def test_tls_files(tmp_path: Path) -> None:
    files = make_cluster_certificates(tmp_path)
    config = WaltzClientConfig(
        zookeeper_connect_string="zk:2181",
        cluster_root="/w",
        client_tls_ca_file=files.ca_file,
        client_tls_cert_file=files.cert_file("client"),
        client_tls_key_file=files.key_file("client"),
    )
    tls = config.tls()
    assert tls is not None and tls.ca_file == files.ca_file
    # A file that is not there is named before any server is tried (docs/operations.md, "Certificates").
    missing = config.model_copy(update={"client_tls_ca_file": tmp_path / "ca-missing.pem"})
    with pytest.raises(
        ConfigurationError, match=r"client.ssl.caFile \(WALTZ_CLIENT_TLS_CA_FILE\) .*: no such"
    ):
        missing.tls()


def test_bad_values_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "client.yaml"
    path.write_text("zookeeper.connectString: z\ncluster.root: /w\nclient.maxConcurrentTransactions: 0\n")
    with pytest.raises(ConfigurationError, match="client_max_concurrent_transactions"):
        load_settings(WaltzClientConfig, path)
    # Servers accept messages of 32 MiB: a client allowed more would lose its connection to every
    # append above it, again and again, instead of failing that one transaction.
    path.write_text("zookeeper.connectString: z\ncluster.root: /w\nclient.maxMessageBytes: 67108864\n")
    with pytest.raises(ConfigurationError, match=r"(?s)client_max_message_bytes.*33554432"):
        load_settings(WaltzClientConfig, path)
    path.write_text("zookeeper.connectString: z\ncluster.root: /w\nclient.bogus: 1\n")
    with pytest.raises(ConfigurationError, match=r"unknown keys.*client\.bogus"):
        load_settings(WaltzClientConfig, path)
    path.write_text("zookeeper.connectString: z\ncluster.root: /w\nclient.tls.cafile: ca.pem\n")
    with pytest.raises(
        ConfigurationError, match=r"client\.tls\.cafile \(did you mean client\.ssl\.caFile\?\)"
    ):
        load_settings(WaltzClientConfig, path)
    with pytest.raises(ConfigurationError, match="set together"):
        load_settings(WaltzClientConfig, None, zookeeper_connect_string="z", cluster_root="/w",
                      client_tls_cert_file=tmp_path / "c.pem")  # fmt: skip


def test_settings_built_in_code_name_a_missing_one_s_variable_and_a_near_miss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``WaltzClientConfig()`` as an application builds it, with the connect string's variable
    misspelt: the error names the variable, the file key, and the variable that is set instead
    (still a pydantic ValidationError, as before)."""
    for name in ("WALTZ_ZOOKEEPER_CONNECT_STRING", "WALTZ_CLUSTER_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WALTZ_ZOOKEPER_CONNECT_STRING", "127.0.0.1:2181")
    with pytest.raises(ValidationError) as raised:
        WaltzClientConfig(cluster_root="/w")
    message = str(raised.value)
    assert (
        "zookeeper_connect_string\n  not set: give the environment variable WALTZ_ZOOKEEPER_CONNECT_STRING"
        in message
    )
    assert "zookeeper.connectString in a configuration file" in message
    assert "WALTZ_ZOOKEPER_CONNECT_STRING is set: a misspelling of WALTZ_ZOOKEEPER_CONNECT_STRING?" in message
    assert "127.0.0.1:2181" not in message and "cluster_root" not in message
    with pytest.raises(ValidationError, match=r"client_max_concurrent_transactions"):  # others as before
        WaltzClientConfig(
            zookeeper_connect_string="z", cluster_root="/w", client_max_concurrent_transactions=0
        )


def test_missing_settings_are_named_with_where_to_set_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """No connect string and no root: one line each, naming the file key and the environment
    variable, and no dump of the validator's internals."""
    for name in ("WALTZ_ZOOKEEPER_CONNECT_STRING", "WALTZ_CLUSTER_ROOT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigurationError) as raised:
        load_settings(WaltzClientConfig)
    message = str(raised.value)
    assert (
        "- zookeeper_connect_string is not set: give zookeeper.connectString in a --config file, "
        "the environment variable WALTZ_ZOOKEEPER_CONNECT_STRING" in message
    ), message
    assert (
        "- cluster_root is not set: give cluster.root in a --config file, "
        "the environment variable WALTZ_CLUSTER_ROOT" in message
    ), message
    assert "errors.pydantic.dev" not in message and "type=missing" not in message


@pytest.mark.parametrize("name", ["auto_mount", "client.autoMount", "autoMount"])
def test_a_wrong_name_in_code_is_refused_naming_the_field_and_its_key(name: str) -> None:
    hint = r"no setting .*did you mean client_auto_mount \(the key client\.autoMount"
    with pytest.raises(ValueError, match=hint):
        WaltzClientConfig(zookeeper_connect_string="zk:2181", cluster_root="/w", **{name: False})


def test_an_invalid_value_is_not_echoed_in_the_error() -> None:
    """A value may be a credential: the error names the setting only."""
    with pytest.raises(ValueError) as raised:
        WaltzClientConfig(
            zookeeper_connect_string="zk:2181",
            cluster_root="/w",
            zookeeper_auth_digest="waltz:s3cret-value",
            client_max_apply_batch_size="not-a-number",
        )
    assert "client_max_apply_batch_size" in str(raised.value)
    assert "s3cret-value" not in str(raised.value)


def test_a_misspelt_variable_of_a_setting_is_said_to_be_ignored_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``WALTZ_CLIENT_SSL_CA_FILE`` (the key client.ssl.caFile suggests it) sets nothing, and a CA
    file ignored means a client that speaks plaintext: building the settings in code, as an
    application does, says so once and names ``WALTZ_CLIENT_TLS_CA_FILE``. A variable far from
    every setting is left alone."""
    monkeypatch.setenv("WALTZ_CLIENT_SSL_CA_FILE", "/etc/waltz/ca.pem")
    monkeypatch.setenv("WALTZ_CLIENT_WHOLLY_UNRELATED_THING", "1")
    caplog.set_level("WARNING", logger="waltz.config")
    for _ in range(2):
        config = WaltzClientConfig(zookeeper_connect_string="127.0.0.1:2181", cluster_root="/w")
        assert config.tls() is None
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "WALTZ_CLIENT_SSL_CA_FILE is no setting of WaltzClientConfig and is ignored" in warned[0]
    assert "did you mean WALTZ_CLIENT_TLS_CA_FILE?" in warned[0]


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("client.readYourWritesTimeout", "client_read_your_writes_timeout"),
        ("client.transactionDataTimeout", "client_transaction_data_timeout"),
        ("client.longWaitThreshold", "client_long_wait_threshold"),
        ("zookeeper.sessionTimeout", "zookeeper_session_timeout"),
    ],
)
def test_a_timeout_beyond_a_day_is_refused_naming_its_key_and_where_it_was_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, field: str
) -> None:
    """A timeout of 1e300 s would be taken, and then overflow the waits it bounds (a submit raised
    OverflowError and kept its concurrency slot): the client's timeouts are at most a day."""
    assert WaltzClientConfig(zookeeper_connect_string="z", cluster_root="/w", **{field: 86_400})
    with pytest.raises(ValidationError, match=rf"(?s){field}.*86400"):
        WaltzClientConfig(zookeeper_connect_string="z", cluster_root="/w", **{field: 1e300})
    path = tmp_path / "client.yaml"
    path.write_text(f"zookeeper.connectString: z\ncluster.root: /w\n{key}: 1e300\n")
    with pytest.raises(ConfigurationError, match=rf"(?s){path.name}.*{field}.*86400"):
        load_settings(WaltzClientConfig, path)
    path.write_text("zookeeper.connectString: z\ncluster.root: /w\n")
    variable = f"WALTZ_{field.upper()}"
    monkeypatch.setenv(variable, "1e300")
    with pytest.raises(ConfigurationError, match=rf"(?s){variable}.*86400"):
        load_settings(WaltzClientConfig, path)
