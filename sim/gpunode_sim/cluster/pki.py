"""Certificates of a simulated cluster: its CA, serving certificates and client identities.

What kubeadm makes for a real cluster, small: one CA signs the API server's
serving certificate, the client certificates of the components and users (the
user is the CN, the groups are O), each node's kubelet client (``system:node:NAME``
in ``system:nodes``, as the Node authorizer expects) and kubelet serving
certificate; plus the service-account signing key. EC P-256 keys: fast to make.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common: str, groups: tuple[str, ...] = ()) -> x509.Name:
    return x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


class Authority:
    """A CA in a folder: ``ca.crt``/``ca.key``, made on first use and reused after."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.pair = Pair(folder / "ca.crt", folder / "ca.key")
        if not (self.pair.cert.exists() and self.pair.key.exists()):
            key = ec.generate_private_key(ec.SECP256R1())
            now = datetime.datetime.now(datetime.UTC)
            name = _name("gpunode-sim-ca")
            cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                    .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                    .not_valid_after(now + 10 * VALIDITY)
                    .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                    .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                 content_commitment=False, key_encipherment=False,
                                                 data_encipherment=False, key_agreement=False, encipher_only=False,
                                                 decipher_only=False), critical=True)
                    .sign(key, hashes.SHA256()))
            _write_key(key, self.pair.key)
            self.pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.cert = x509.load_pem_x509_certificate(self.pair.cert.read_bytes())
        self.key = serialization.load_pem_private_key(self.pair.key.read_bytes(), None)

    def issue(self, stem: str, common: str, groups: tuple[str, ...] = (), *, server: bool = False,
              ips: tuple[str, ...] = (), dns: tuple[str, ...] = (), expired: bool = False) -> Pair:
        """A certificate and key as ``stem.crt``/``stem.key``; kept when it exists (and is not to be expired)."""
        pair = Pair(self.folder / f"{stem}.crt", self.folder / f"{stem}.key")
        if pair.cert.exists() and pair.key.exists():
            return pair
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        start, end = ((now - 2 * VALIDITY, now - VALIDITY) if expired else
                      (now - datetime.timedelta(hours=1), now + VALIDITY))
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (x509.CertificateBuilder().subject_name(_name(common, groups)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if ips or dns:
            names = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips] + [x509.DNSName(d) for d in dns]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        _write_key(key, pair.key)
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return pair

    def signing_key(self, stem: str) -> Pair:
        """A bare key pair (``stem.key``, ``stem.pub``): the service-account token signer."""
        pair = Pair(self.folder / f"{stem}.pub", self.folder / f"{stem}.key")
        if not pair.key.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            _write_key(key, pair.key)
            pair.cert.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                serialization.PublicFormat.SubjectPublicKeyInfo))
        return pair
