"""The etcd3 name resolve over TLS (server verified with a CA, client certificate) with etcd's user authentication,
against a real etcd started for this module with certificates made here."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rlkit.nameresolve import NameResolveError
from rlkit.nameresolve.etcd import Etcd3NameResolve, EtcdTls
from tests.unit.nameresolve.test_nameresolve import _free_ports, poll_until

PASSWORD = "s3cret-pw"
TOKEN_TTL = 2  # etcd's --auth-token-ttl (s): short, so a test sees a token expire


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(d: Path) -> EtcdTls:
    """A CA, a server certificate for 127.0.0.1 and a client certificate signed by it (EC keys: fast)."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=rlkit-test-ca",
             cwd=d)
    # etcd's JSON gateway dials etcd's gRPC side with the server certificate as its client certificate: both uses
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (d / f"{name}.ext").write_text(ext + "\n")
        # etcd's gateway refuses a client certificate with a CommonName (it cannot map it to a user): none here
        subject = "/CN=rlkit-server" if name == "server" else "/O=rlkit-client"
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext", cwd=d)
    return EtcdTls(cacert=str(d / "ca.crt"), cert=str(d / "client.crt"), key=str(d / "client.key"))


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EtcdTls]]:
    """An etcd serving https only, requiring a client certificate, with auth enabled (user root)."""
    exe = shutil.which("etcd")
    if exe is None:
        pytest.fail("etcd is not installed: run scripts/dev-env.sh (apt-get install -y etcd-server)")
    d = tmp_path_factory.mktemp("etcd-tls")
    tls = _certificates(d)
    client, peer = _free_ports(2)
    url = f"https://127.0.0.1:{client}"
    cmd = [
        exe, "--name", "s", "--data-dir", str(d / "data"), "--listen-client-urls", url, "--advertise-client-urls", url,
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"s=http://127.0.0.1:{peer}", "--cert-file", str(d / "server.crt"),
        "--key-file", str(d / "server.key"), "--client-cert-auth", "--trusted-ca-file", tls.cacert,
        "--auth-token", "simple", "--auth-token-ttl", str(TOKEN_TTL),
    ]  # fmt: skip
    with open(d / "etcd.log", "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
    admin = httpx.Client(base_url=url, verify=tls.context(), trust_env=False, timeout=5)

    def healthy() -> bool:
        assert proc.poll() is None, (d / "etcd.log").read_text()[-2000:]
        try:
            return admin.get("/health").json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False

    try:
        poll_until(healthy, timeout=30, interval=0.1)
        for path, body in (("/v3/auth/role/add", {"name": "root"}),
                           ("/v3/auth/user/add", {"name": "root", "password": PASSWORD}),
                           ("/v3/auth/user/grant", {"user": "root", "role": "root"}), ("/v3/auth/enable", {})):
            admin.post(path, json=body).raise_for_status()
        yield url, tls
    finally:
        admin.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_tls_and_user_auth_work_and_survive_token_expiry(secure_etcd: tuple[str, EtcdTls]) -> None:
    url, tls = secure_etcd
    addr = url.removeprefix("https://")
    with Etcd3NameResolve(addr, "exp", "tls", tls=tls, user="root", password=PASSWORD, ttl=5.0,
                          heartbeat_interval=1.0) as nr:
        assert nr.url == url  # a CA given: https without spelling it out
        nr.add("servers/0", "value", keepalive=True)
        assert nr.get("servers/0") == "value"
    with Etcd3NameResolve(addr, "exp", "tls", tls=tls, user="root", password=PASSWORD) as nr:
        nr.add("static", "forever")
        authenticated: list[float] = []
        login = nr._gw._authenticate

        def counted_login() -> None:
            authenticated.append(time.monotonic())
            login()

        nr._gw._authenticate = counted_login  # type: ignore[method-assign]
        time.sleep(TOKEN_TTL + 1.5)  # an unused simple token expires: the next call must log in again, once
        assert nr.list_subtree("") == {"static": "forever"}
        assert len(authenticated) == 1
        nr.clear_subtree("")


@pytest.mark.parametrize("what", ["no user", "wrong password", "no CA", "no client certificate"])
def test_missing_or_wrong_credentials_fail_with_a_clear_error(secure_etcd: tuple[str, EtcdTls], what: str) -> None:
    url, tls = secure_etcd
    kwargs: dict[str, object] = {"tls": tls, "user": "root", "password": PASSWORD}
    expected = {"no user": "user name is empty.*set cluster.name_resolve.etcd3_user and .ETCDCTL_PASSWORD",
                "wrong password": "refused user 'root'.*ETCDCTL_PASSWORD",
                "no CA": "cannot reach etcd", "no client certificate": "cannot reach etcd"}[what]
    if what == "no user":
        kwargs["user"] = ""
    elif what == "wrong password":
        kwargs["password"] = "wrong"
    elif what == "no CA":
        kwargs["tls"] = EtcdTls(cert=tls.cert, key=tls.key)
    else:
        kwargs["tls"] = EtcdTls(cacert=tls.cacert)
    nr = Etcd3NameResolve(url, "exp", "bad", **kwargs)  # type: ignore[arg-type]
    try:
        with pytest.raises(NameResolveError, match=expected):
            nr.get("servers/0")
    finally:
        nr.close()
