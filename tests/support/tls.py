"""Test certificates made with the openssl command line (a CA, a server and a client certificate)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path) -> dict[str, Path]:
    files = {
        name: directory / f"{name}.pem"
        for name in ("ca", "ca-key", "server", "server-key", "client", "client-key")
    }
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=waltz-test-ca",
            "-keyout", str(files["ca-key"]), "-out", str(files["ca"]))  # fmt: skip
    ext = directory / "san.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        csr = directory / f"{name}.csr"
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", str(files[f"{name}-key"]), "-out", str(csr))  # fmt: skip
        openssl("x509", "-req", "-in", str(csr), "-CA", str(files["ca"]), "-CAkey", str(files["ca-key"]),
                "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(files[name]))  # fmt: skip
    return files
