"""Sessions the server issues, and the keys a canary judges by, so that no client can steer a canary.

A client-chosen `session_id` is a label: anyone can send any label, so it can neither pick a canary arm nor claim
another session's answers. The server issues each session itself: a random id, signed with a server secret
(`<id>.<signature>`), returned by /ask (body field `session` and the `rag_session` cookie) and sent back with later
/ask, /feedback and /events requests. A token that does not verify is ignored (the request gets a new session).

From the same secret:
- the arm key of a session (rag.rollout.state.assign_arm hashes it with the candidate's version): knowing a version
  and an id does not tell a client which arm a session will get;
- the client key: a keyed hash of where the request came from (the peer address, or the header a trusted proxy
  sets, ServeSettings.client_header). rag.rollout.evidence bounds what one client can add to a canary by it,
  however many sessions that client opens. The address itself is never stored.

Replicas share the secret (RAG_SESSION_SECRET, or the key file in the data dir they share), so a session keeps its
arm and its identity on every replica.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

COOKIE = "rag_session"
SECRET_ENV = "RAG_SESSION_SECRET"
MIN_SECRET_CHARS = 16


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class Session:
    session_id: str  # the server's id of the session: what the feedback store records as client_session
    token: str  # what the client sends back: the id and its signature
    new: bool  # issued by this request (the client sent no valid token)


class SessionKeys:
    """Issues and verifies session tokens and derives the keys a canary judges by, from one server secret."""

    def __init__(self, secret: bytes | str):
        secret = secret.encode("utf-8") if isinstance(secret, str) else secret
        if len(secret) < MIN_SECRET_CHARS:
            raise ValueError(f"a session secret needs at least {MIN_SECRET_CHARS} bytes (set {SECRET_ENV})")
        self._secret = secret

    @classmethod
    def random(cls) -> SessionKeys:
        """Keys of one process only (tests, a single server without a data dir): sessions do not survive a restart."""
        return cls(secrets.token_bytes(32))

    @classmethod
    def for_data_dir(cls, root: Path | str) -> SessionKeys:
        """RAG_SESSION_SECRET when set; else the key file `<root>/serving/session.key`, created once (readable by its
        owner only), so that every replica over the same data dir issues and accepts the same sessions."""
        if os.environ.get(SECRET_ENV):
            return cls(os.environ[SECRET_ENV])
        path = Path(root) / "serving" / "session.key"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                # O_EXCL: of replicas starting together, one writes the key and the others read it.
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as out:
                    out.write(secrets.token_urlsafe(32))
                    out.flush()
                    os.fsync(out.fileno())
        secret = path.read_text().strip()
        if len(secret) < MIN_SECRET_CHARS:
            raise ValueError(
                f"the session key file {path} is empty or too short (a replica may be writing it): delete it and "
                f"restart, or set {SECRET_ENV}"
            )
        return cls(secret)

    def _mac(self, purpose: str, value: str) -> bytes:
        return hmac.new(self._secret, f"{purpose}\x1f{value}".encode("utf-8"), hashlib.sha256).digest()

    def issue(self) -> Session:
        session_id = _b64(secrets.token_bytes(16))
        return Session(session_id, f"{session_id}.{_b64(self._mac('session', session_id)[:16])}", new=True)

    def verify(self, token: str | None) -> str | None:
        """The session id of a token this server (or a replica with the same secret) issued; None otherwise."""
        if not token or token.count(".") != 1 or len(token) > 128:
            return None
        session_id, signature = token.split(".")
        expected = _b64(self._mac("session", session_id)[:16])
        return session_id if session_id and hmac.compare_digest(signature, expected) else None

    def session(self, token: str | None) -> Session:
        """The session a request belongs to: the one its token names, or a new one."""
        session_id = self.verify(token)
        return Session(session_id, token, new=False) if session_id else self.issue()

    def arm_key(self, session_id: str) -> str:
        """What a canary's arm is drawn from: secret to clients, so neither a session id nor a version predicts it."""
        return self._mac("arm", session_id).hex()

    def client_key(self, client: str) -> str:
        """A client's identity for rag.rollout.evidence's per-client bounds: the same for every session it opens."""
        return self._mac("client", client).hex()[:32]
