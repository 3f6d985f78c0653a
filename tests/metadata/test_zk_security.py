"""The ZooKeeper security settings: where the credential comes from, and what a malformed one says
(docs/design/zookeeper.md "Security")."""

from __future__ import annotations

from pathlib import Path

import pytest

from waltz.admin.config import ClusterAdminConfig
from waltz.client.config import WaltzClientConfig
from waltz.config import load_settings
from waltz.errors import ConfigurationError
from waltz.metadata.zk_security import ZooKeeperSecurity, security_from_environment
from waltz.services.server.config import ServerConfig


def test_the_credential_comes_from_a_file_named_in_the_yaml_file_and_never_shows_in_a_repr(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "digest"
    secret.write_text("waltz:pa55word\n")
    yaml = tmp_path / "server.yaml"
    yaml.write_text(
        f"zookeeper: {{connectString: 'zk:2181', auth: {{digestFile: '{secret}'}}}}\ncluster.root: /w\n"
        "server.insecure: true\n"
    )
    config = load_settings(ServerConfig, yaml)
    security = config.zookeeper_security()
    assert security.digest == "waltz:pa55word" and security.user == "waltz"
    assert security.kazoo_options()["auth_data"] == [("digest", "waltz:pa55word")]
    assert "pa55word" not in repr(security) and "pa55word" not in security.describe()


def test_the_credential_and_tls_files_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WALTZ_ZOOKEEPER_AUTH_DIGEST", "ops:s3cret")
    monkeypatch.setenv("WALTZ_ZOOKEEPER_SSL_CA_FILE", str(tmp_path / "ca.pem"))
    client = WaltzClientConfig(zookeeper_connect_string="zk:2281", cluster_root="/w")
    assert "s3cret" not in repr(client)
    for security in (client.zookeeper_security(), security_from_environment()):
        assert security.digest == "ops:s3cret" and security.tls
        options = security.kazoo_options()
        assert options["use_ssl"] and options["ca"] == str(tmp_path / "ca.pem")
        assert options["default_acl"] == ZooKeeperSecurity("ops:s3cret").acl()


@pytest.mark.parametrize("digest", ["no-colon", ":password", "user:", "a user:password"])
def test_a_malformed_credential_says_what_to_set(digest: str) -> None:
    with pytest.raises(ConfigurationError, match=r"user:password.*WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE"):
        ClusterAdminConfig(zookeeper_auth_digest=digest).zookeeper_security()  # type: ignore[arg-type]


def test_the_credential_is_set_once_and_certificate_files_go_together(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        load_settings(
            ClusterAdminConfig, None, zookeeper_auth_digest="a:b", zookeeper_auth_digest_file=tmp_path / "d"
        )
    with pytest.raises(ConfigurationError, match="set together"):
        load_settings(ClusterAdminConfig, None, zookeeper_ssl_cert_file=tmp_path / "c.pem")
    with pytest.raises(ConfigurationError, match="cannot read the ZooKeeper digest file"):
        ClusterAdminConfig(zookeeper_auth_digest_file=tmp_path / "missing").zookeeper_security()


def test_a_generated_credential_is_written_for_its_owner_only(tmp_path: Path) -> None:
    security = ZooKeeperSecurity.generate()
    path = tmp_path / "digest"
    security.write_digest_file(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert ZooKeeperSecurity.read_digest_file(path) == security.digest
    assert ZooKeeperSecurity.generate().digest != security.digest
