"""Test certificates made at test time (a throw-away CA and a server certificate for
127.0.0.1/localhost) and the client contexts that trust them."""

import datetime
import ipaddress
import os
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Certs:
    """A CA, and a server key and certificate it signed, as PEM files in C{directory}.

    @ivar ca: path of the CA certificate (what clients trust).
    @ivar cert: path of the server certificate.
    @ivar key: path of the server's private key.
    """

    def __init__(self, directory):
        now = datetime.datetime.now(datetime.timezone.utc)
        start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (x509.CertificateBuilder().subject_name(_name("mqserver test CA"))
              .issuer_name(_name("mqserver test CA")).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(start)
              .not_valid_after(end)
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        san = x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                           x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        cert = (x509.CertificateBuilder().subject_name(_name("localhost"))
                .issuer_name(ca.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(start)
                .not_valid_after(end).add_extension(san, critical=False)
                .sign(ca_key, hashes.SHA256()))
        os.makedirs(directory, exist_ok=True)
        self.ca = os.path.join(directory, "ca.pem")
        self.cert = os.path.join(directory, "server.pem")
        self.key = os.path.join(directory, "server.key")
        for path, data in ((self.ca, ca.public_bytes(serialization.Encoding.PEM)),
                           (self.cert, cert.public_bytes(serialization.Encoding.PEM)),
                           (self.key, _pem_key(key))):
            with open(path, "wb") as f:
                f.write(data)

    def endpoint(self, port=0):
        """A Twisted ssl: server endpoint string on 127.0.0.1."""
        return (f"ssl:{port}:interface=127.0.0.1:privateKey={self.key}:certKey={self.cert}")

    def client_context(self):
        """An SSLContext that trusts only the test CA and checks the host name."""
        return ssl.create_default_context(cafile=self.ca)
