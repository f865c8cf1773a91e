"""A local CA and one certificate signed by it, for ``snapstream up --tls`` (the ``cryptography``
library; nothing leaves the machine). The certificate names every host the cluster listens on
and serves both ends of every connection: services and stores present it as servers, services
as clients (mutual TLS between router, prefill and decode)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from snapstream.client.tls import TlsConfig

VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class ClusterCerts:
    ca: Path  # the CA certificate every member and client trusts
    cert: Path
    key: Path  # mode 0600

    def client(self) -> TlsConfig:
        """A client of the cluster's services: trusts the CA, presents the certificate (which
        the internal services' mutual TLS asks for)."""
        return TlsConfig(root_certificates=self.ca, certificate_chain=self.cert,
                         private_key=self.key)

    def flags(self) -> tuple[str, ...]:
        """The ``--tls-*`` flags of a service serving and calling with these files."""
        return ("--tls-cert", str(self.cert), "--tls-key", str(self.key), "--tls-ca",
                str(self.ca))


def make_cluster_certs(directory: Path, hosts: tuple[str, ...]) -> ClusterCerts:
    """Writes ``ca.pem``, ``cluster.pem`` and ``cluster-key.pem`` into ``directory``; the
    certificate is valid for ``hosts`` (names or IP addresses) for 30 days."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "snapstream local CA")])
    ca = (_builder(ca_name, ca_name, ca_key.public_key(), now)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(**_usage(key_cert_sign=True, crl_sign=True)),
                         critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "snapstream cluster")]),
                     ca_name, key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.KeyUsage(**_usage(digital_signature=True,
                                                  key_agreement=True)), critical=True)
            .sign(ca_key, hashes.SHA256()))
    certs = ClusterCerts(directory / "ca.pem", directory / "cluster.pem",
                         directory / "cluster-key.pem")
    certs.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    certs.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    certs.key.touch(mode=0o600)
    certs.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                            serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    return certs


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
             now: datetime.datetime) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY))


def _usage(**enabled: bool) -> dict[str, bool]:
    names = ("digital_signature", "content_commitment", "key_encipherment",
             "data_encipherment", "key_agreement", "key_cert_sign", "crl_sign",
             "encipher_only", "decipher_only")
    return {name: enabled.get(name, False) for name in names}


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)
