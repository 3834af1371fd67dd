"""A Kafka client certificate (mutual TLS) reaches every client: kafka-python by file names,
aiokafka and Faust by the TLS context, which presents it in a real handshake."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from gpuwatch.config import SettingsError, load_settings
from schemas.settings import KafkaSettings
from streams.faust.clients import aiokafka_options, credentials

HOME = {"HOME": "/home/someone"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for "localhost" and its key: the client's certificate, the
    server's, and the CA each side trusts, all in one."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make a certificate with")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "tls.crt", folder / "tls.key"
    done = subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return cert, key


def mutual_tls(cert: Path, key: Path, **fields: object) -> KafkaSettings:
    given: dict[str, object] = {"security_protocol": "SSL"} | fields
    return KafkaSettings.model_validate(
        given | {"ssl_cafile": cert, "ssl_certfile": cert, "ssl_keyfile": key}
    )


def client_certificate_seen(client: ssl.SSLContext, cert: Path, key: Path) -> object:
    """The subject of the certificate a server that requires one got from `client`, over a
    handshake in memory."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(cert), str(key))
    server.load_verify_locations(str(cert))
    server.verify_mode = ssl.CERT_REQUIRED
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_end = client.wrap_bio(to_client, to_server, server_hostname="localhost")
    server_end = server.wrap_bio(to_server, to_client, server_side=True)
    ended = {id(client_end): False, id(server_end): False}
    for _ in range(10):  # a TLS 1.3 handshake with a client certificate takes two rounds
        for end in (client_end, server_end):
            try:
                end.do_handshake()
                ended[id(end)] = True
            except ssl.SSLWantReadError:
                pass
        if all(ended.values()):
            break
    assert all(ended.values()), "the handshake did not end"
    peer = server_end.getpeercert()
    assert peer is not None
    return peer["subject"]


def test_the_tls_context_presents_the_client_certificate(pair: tuple[Path, Path]) -> None:
    cert, key = pair
    context = mutual_tls(cert, key).ssl_context()
    assert context is not None
    assert client_certificate_seen(context, cert, key) == ((("commonName", "localhost"),),)


def test_without_a_client_certificate_the_server_refuses(pair: tuple[Path, Path]) -> None:
    """The handshake above fails when the context has no certificate to present."""
    cert, key = pair
    context = KafkaSettings(security_protocol="SSL", ssl_cafile=cert).ssl_context()
    assert context is not None
    with pytest.raises(ssl.SSLError):
        client_certificate_seen(context, cert, key)


def test_faust_and_aiokafka_get_the_context_with_the_certificate(pair: tuple[Path, Path]) -> None:
    cert, key = pair
    kafka = mutual_tls(cert, key)
    options = aiokafka_options(kafka)
    # aiokafka takes no file names: an unknown keyword would fail its constructor.
    assert not {"ssl_cafile", "ssl_certfile", "ssl_keyfile"} & set(options)
    assert options["security_protocol"] == "SSL"
    assert client_certificate_seen(options["ssl_context"], cert, key)
    faust_credentials = credentials(kafka)
    assert client_certificate_seen(faust_credentials.context, cert, key)
    sasl = mutual_tls(cert, key, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512")
    assert client_certificate_seen(credentials(sasl).ssl_context, cert, key)


def test_kafka_python_gets_the_files_from_the_environment(pair: tuple[Path, Path]) -> None:
    cert, key = pair
    env = {
        **HOME,
        "GPUWATCH_KAFKA_SECURITY_PROTOCOL": "SSL",
        "GPUWATCH_KAFKA_SSL_CAFILE": str(cert),
        "GPUWATCH_KAFKA_SSL_CERTFILE": str(cert),
        "GPUWATCH_KAFKA_SSL_KEYFILE": str(key),
    }
    options = load_settings(env=env).kafka.client_options()
    assert (options["ssl_cafile"], options["ssl_certfile"], options["ssl_keyfile"]) == (
        str(cert),
        str(cert),
        str(key),
    )
    assert "ssl_certfile" not in KafkaSettings(security_protocol="SSL").client_options()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GPUWATCH_KAFKA_SECURITY_PROTOCOL": "SSL", "GPUWATCH_KAFKA_SSL_CERTFILE": "/c.crt"},
         "GPUWATCH_KAFKA_SSL_CERTFILE and GPUWATCH_KAFKA_SSL_KEYFILE go together"),
        ({"GPUWATCH_KAFKA_SSL_CERTFILE": "/c.crt", "GPUWATCH_KAFKA_SSL_KEYFILE": "/c.key"},
         "needs GPUWATCH_KAFKA_SECURITY_PROTOCOL SSL or SASL_SSL, not PLAINTEXT"),
    ],
    ids=["no-key", "plaintext"],
)  # fmt: skip
def test_a_half_or_unused_client_certificate_is_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(env={**HOME, **env})
