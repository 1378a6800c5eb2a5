"""Sessions the server issues (rag.serving.sessions): a token verifies only with the secret that signed it, replicas
over one data dir share the secret, and what a canary keys on cannot be derived from anything a client sees."""

import os
import stat

import pytest

from rag.rollout import assign_arm
from rag.serving.sessions import SECRET_ENV, SessionKeys


def test_tokens_verify_only_with_the_secret_that_signed_them():
    keys, other = SessionKeys("one secret of sixteen+"), SessionKeys("another secret, 16+")
    issued = keys.issue()
    assert issued.new and keys.verify(issued.token) == issued.session_id
    session_id, signature = issued.token.split(".")
    assert other.verify(issued.token) is None  # another server's token
    assert keys.verify(f"{session_id}x.{signature}") is None  # a session id that was not signed
    other_char = "B" if signature.endswith("A") else "A"
    assert keys.verify(f"{session_id}.{signature[:-1]}{other_char}") is None
    for junk in (None, "", "no-dot", "a.b.c", "." * 200, "victim"):
        assert keys.verify(junk) is None
    again = keys.session(issued.token)
    assert (again.session_id, again.new) == (issued.session_id, False)
    assert keys.session("forged.token").new  # not verified: a new session
    assert keys.issue().session_id != issued.session_id


def test_the_arm_key_and_client_key_are_secret_to_clients():
    keys, other = SessionKeys("one secret of sixteen+"), SessionKeys("another secret, 16+")
    session_id = keys.issue().session_id
    # Knowing the session id (it is in the token) and the candidate's version is not enough to know the arm.
    assert keys.arm_key(session_id) != other.arm_key(session_id) != session_id
    arms = {assign_arm(SessionKeys(f"secret number {i:04d}").arm_key(session_id), 0.5, "v2") for i in range(40)}
    assert arms == {"production", "canary"}
    assert keys.client_key("peer:1.2.3.4") == keys.client_key("peer:1.2.3.4") != keys.client_key("peer:1.2.3.5")
    assert "1.2.3.4" not in keys.client_key("peer:1.2.3.4")  # the address itself is never stored


def test_replicas_over_one_data_dir_share_the_secret(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    first, second = SessionKeys.for_data_dir(tmp_path), SessionKeys.for_data_dir(tmp_path)
    token = first.issue().token
    assert second.verify(token) is not None
    key_file = tmp_path / "serving" / "session.key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    monkeypatch.setenv(SECRET_ENV, "a secret set for every replica")
    assert SessionKeys.for_data_dir(tmp_path).verify(token) is None  # the variable wins over the file
    with pytest.raises(ValueError, match="at least 16"):
        SessionKeys("short")
    monkeypatch.delenv(SECRET_ENV)
    key_file.write_text("")
    with pytest.raises(ValueError, match="delete it and restart"):
        SessionKeys.for_data_dir(tmp_path)
