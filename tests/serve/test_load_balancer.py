"""The nginx load balancer of docs/serve.md ("Several machines" -> "Behind a standard load balancer"), run as a
user deploys it: the ```nginx block is read from the doc (never copied here), given only the substitutions a
user must make (the replicas' addresses, the listen port, the certificate files), wrapped into a full
nginx.conf in a tmp dir and run as the current user in front of two real ``rewardkit serve`` replicas.

TLS is kept: a self-signed certificate for 127.0.0.1 made with ``openssl``; the client trusts it through
``SSL_CERT_FILE`` (httpx reads it; ``RemoteReward`` has no CA option of its own), as docs/serve.md says.
Needs the ``nginx`` and ``openssl`` executables (``.ci/install-system-deps.sh`` installs nginx); skips without.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from rewardkit import load_reward  # noqa: E402
from rewardkit.serve.client import RemoteReward  # noqa: E402
from rewardkit.serve.server import ServerConfig, serve_in_thread  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "serve.md"
# Debian puts nginx in /usr/sbin, which is not on a non-root user's PATH
NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin:/sbin")
OPENSSL = shutil.which("openssl")

pytestmark = [
    pytest.mark.skipif(NGINX is None, reason="the nginx executable is not installed (.ci/install-system-deps.sh "
                                             "installs it); the documented load balancer cannot be run"),
    pytest.mark.skipif(OPENSSL is None, reason="the openssl executable is not installed: no certificate for the "
                                               "documented `listen 443 ssl`"),
]


def documented_nginx_block() -> str:
    """The one ```nginx fenced block of docs/serve.md, dedented."""
    blocks = re.findall(r"^([ \t]*)```nginx\n(.*?)^[ \t]*```", DOC.read_text(), flags=re.M | re.S)
    assert len(blocks) == 1, f"docs/serve.md should have exactly one ```nginx block, found {len(blocks)}"
    return textwrap.dedent(blocks[0][1])


def substitute(block: str, replacements: dict[str, str]) -> str:
    """Replace each documented placeholder, each exactly once (a changed doc fails here, loudly)."""
    for old, new in replacements.items():
        assert block.count(old) == 1, f"the documented nginx block should contain {old!r} once"
        block = block.replace(old, new)
    return block


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def self_signed_cert(tmp: Path) -> tuple[Path, Path]:
    crt, key = tmp / "rewards.crt", tmp / "rewards.key"
    subprocess.run([OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True)
    return crt, key


def nginx_conf(tmp: Path, server_block: str) -> Path:
    """A whole nginx.conf around the documented block: everything under ``tmp``, workers as the current user."""
    for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / d).mkdir()
    user = ""
    if os.geteuid() == 0:  # a root master would run its workers as `nobody`, who cannot write tmp's temp dirs
        user = f"user {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name};\n"
    conf = tmp / "nginx.conf"
    conf.write_text(
        f"{user}worker_processes 1;\npid {tmp}/nginx.pid;\nerror_log {tmp}/error.log warn;\n"
        "events { worker_connections 64; }\n"
        "http {\n"
        "    log_format passes '$request_uri $status \"$upstream_addr\" \"$upstream_status\"';\n"
        f"    access_log {tmp}/access.log passes;\n"
        + "".join(f"    {d}_temp_path {tmp}/{d};\n" for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        + textwrap.indent(server_block, "    ") + "\n}\n")
    return conf


def wait_listening(proc: subprocess.Popen, port: int, errlog: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited with {proc.returncode}: {proc.stderr.read()}\n"
                               f"{errlog.read_text() if errlog.exists() else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nginx did not listen on 127.0.0.1:{port} within {timeout} s")


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def addr(handle) -> str:
    return handle.url.removeprefix("http://")


def passes(tmp: Path) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """Per proxied POST /score, in order: the upstreams nginx tried and what each answered (the access log)."""
    out = []
    for line in (tmp / "access.log").read_text().splitlines():
        uri, _status, upstreams, statuses = re.fullmatch(r'(\S+) (\d+) "([^"]*)" "([^"]*)"', line).groups()
        if uri == "/score" and upstreams != "-":
            out.append((tuple(upstreams.split(", ")), tuple(statuses.split(", "))))
    return out


def requests_served(url: str) -> int:
    return RemoteReward(url=url).server_info()["stats"]["requests"]


def refused_status(port: int, cert: Path, content_length: int) -> bytes:
    """The status line nginx answers to a POST /score announcing ``content_length`` bytes (none sent)."""
    import ssl

    ctx = ssl.create_default_context(cafile=str(cert))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(f"POST /score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {content_length}\r\n\r\n".encode())
        return s.recv(4096).split(b"\r\n", 1)[0]


def test_documented_nginx_load_balancer_serves_both_replicas(tiny_clip_dir, tmp_path, monkeypatch):
    """Through the documented nginx block: (a) scores equal the in-process ones bit for bit, binary and JSON
    wire; (b) both replicas take requests; (c) with one replica stopped every request still succeeds
    (`proxy_next_upstream error`); (d) a body over `client_max_body_size` (the replicas' own default limit) is
    refused by nginx with 413 before any replica sees it; (e) a replica at its `--max-in-flight` (503) is passed
    over (`http_503 non_idempotent`). The access log (`$upstream_addr`, `$upstream_status`) shows which replicas
    nginx tried for each request. About 1 s after the session's tiny CLIP checkpoint: not marked slow."""
    local_reward = load_reward("clipscore", model=str(tiny_clip_dir))
    cfg = ServerConfig(max_wait_ms=1.0, max_in_flight=1)  # the same options on both replicas
    a = serve_in_thread(load_reward("clipscore", model=str(tiny_clip_dir)), cfg)
    b = serve_in_thread(load_reward("clipscore", model=str(tiny_clip_dir)), cfg)
    proc = None
    try:
        crt, key = self_signed_cert(tmp_path)
        port = free_port()
        block = substitute(documented_nginx_block(), {
            "10.0.0.1:8000": addr(a),
            "10.0.0.2:8000": addr(b),
            "listen 443 ssl;": f"listen 127.0.0.1:{port} ssl;",
            "/etc/nginx/rewards.crt": str(crt),
            "/etc/nginx/rewards.key": str(key),
        })
        conf = nginx_conf(tmp_path, block)
        subprocess.run([NGINX, "-t", "-q", "-p", str(tmp_path), "-e", str(tmp_path / "error.log"), "-c", str(conf)],
                       check=True, capture_output=True)
        proc = subprocess.Popen([NGINX, "-p", str(tmp_path), "-e", str(tmp_path / "error.log"), "-c", str(conf),
                                 "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_listening(proc, port, tmp_path / "error.log")
        monkeypatch.setenv("SSL_CERT_FILE", str(crt))  # the client trusts the proxy's certificate
        url = f"https://127.0.0.1:{port}"

        x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
        prompts = ["a cat", "a dog"]
        local = local_reward(x, prompts).scores
        before = (requests_served(a.url), requests_served(b.url))
        # (a) the same numbers through the proxy, on both wires
        for wire in ("binary", "json"):
            remote = RemoteReward(url=url, wire=wire, timeout=10.0, max_retries=0)
            for _ in range(3):
                assert torch.equal(remote(x, prompts).scores, local)
        # (b) least_conn with one request at a time alternates: both replicas scored
        after = (requests_served(a.url), requests_served(b.url))
        served = (after[0] - before[0], after[1] - before[1])
        assert sum(served) == 6 and min(served) >= 1, served

        # (d) nginx refuses a body over client_max_body_size from its Content-Length: no replica sees it
        limit = int(re.search(r"client_max_body_size (\d+)m;", block).group(1)) * 2**20
        assert limit == cfg.max_body_bytes  # "the same body limit as --max-body-mb" (its default)
        assert refused_status(port, crt, limit + 1).startswith(b"HTTP/1.1 413")
        assert (requests_served(a.url), requests_served(b.url)) == after
        seen = len(passes(tmp_path))
        remote = RemoteReward(url=url, timeout=10.0, max_retries=0)

        # (e) replica a full (503 at --max-in-flight 1, held by a request whose body never comes): nginx passes
        # the POST on to b (`http_503 non_idempotent`; a 503 sent before the body is read may reach nginx as a
        # broken pipe: `error`). Two requests, one per replica: a's one failure stays under its max_fails=2.
        with socket.create_connection(("127.0.0.1", port_of(a.url)), timeout=5) as hold:
            hold.sendall(b"POST /score HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n")
            deadline = time.monotonic() + 5
            while httpx.post(a.url + "/score", json={}, timeout=5).status_code != 503:  # until a is full
                assert time.monotonic() < deadline, "the held request never filled replica a"
                time.sleep(0.01)
            b_before = requests_served(b.url)
            for _ in range(2):
                assert torch.equal(remote(x, prompts).scores, local)
            assert requests_served(b.url) - b_before == 2
        log = passes(tmp_path)[seen:]
        passed_on = [(up, "passed on" if st[0] in ("502", "503") and st[1:] == ("200",) else st) for up, st in log]
        assert sorted(passed_on) == sorted([((addr(a), addr(b)), "passed on"), ((addr(b),), ("200",))]), log
        seen += len(log)

        # (c) replica b gone: nginx passes each request on to a (max_retries=0: no client retry)
        a_before = requests_served(a.url)
        b.stop()
        for _ in range(4):
            assert torch.equal(remote(x, prompts).scores, local)
        assert requests_served(a.url) - a_before == 4
        log = passes(tmp_path)[seen:]
        assert len(log) == 4 and ((addr(b), addr(a)), ("502", "200")) in log, log
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for h in (a, b):
            h.stop()
